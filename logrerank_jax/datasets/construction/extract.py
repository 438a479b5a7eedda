"""Parse OpenScholar-style training instances into question, answer and candidate passages.

The public OpenScholar training data (`OpenScholar/OS_Train_Data`) stores one
chat-format instance per row: `{"dataset": str, "id": str, "messages":
[{"role": "user", "content": ...}, {"role": "assistant", "content": ...}]}`.
For the retrieval-augmented QA subsets the user turn holds an instruction, a
reference list and the question, and the assistant turn the cited answer:

  <instruction>
  References:
  [0] Title: <title> Text: <text>
  [1] <text>                      (title-less references have no "Title:")
  Question: <question>
  Answer:                         (optional trailing marker)

Answers cite references as "[k]" and may be wrapped in
"[Response_Start] ... [Response_End]". The structured form used by OpenScholar's
inference code, `{"id", "input"|"question", "output"|"answer", "ctxs":
[{"title", "text"}]}`, is accepted too (with an optional "dataset").

Subsets: an instance's `dataset` name picks its subset through `SubsetRule`
(default: a name containing "single" is the single-paper QA subset, "multi"
the multi-paper QA subset); every other dataset is counted and skipped.
"""

import collections
import dataclasses
import json
import os
import re
from typing import Any, Iterator, Optional, Sequence

from logrerank_jax.data.jsonl import read_json_lines
from logrerank_jax.errors import DataError

SINGLE = "single_paper"
MULTI = "multi_paper"
# A reference line: "[k] Title: T Text: X" or "[k] X".
_REF_LINE = re.compile(r"^\[(\d+)\]\s*(.*)$")
_TITLED = re.compile(r"^Title:\s*(.*?)\s+Text:\s*(.*)$", re.DOTALL)
_CITATION = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")
_QUESTION_MARK = re.compile(r"^\s*(?:Question|Input)\s*:\s*", re.IGNORECASE | re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Passage:
  """One candidate passage: its index in the instance's reference list, title and text."""
  ref: int
  title: str
  text: str


@dataclasses.dataclass(frozen=True)
class Instance:
  """One QA instance with its candidate passages in reference-list order."""
  id: str
  dataset: str
  subset: str                  # SINGLE or MULTI
  question: str
  answer: str
  passages: tuple[Passage, ...]
  cited: tuple[int, ...]       # reference indices the answer cites, ascending

  def passage_id(self, ref: int) -> str:
    """Return the training-record id of reference `ref` of this instance."""
    return f"{self.id}:{ref}"

  def to_json(self) -> dict[str, Any]:
    """Return the instance as a JSON-ready dict (the `instances.jsonl` line)."""
    return {"id": self.id, "dataset": self.dataset, "subset": self.subset,
            "question": self.question, "answer": self.answer, "cited": list(self.cited),
            "passages": [{"ref": p.ref, "title": p.title, "text": p.text} for p in self.passages]}

  @classmethod
  def from_json(cls, obj: dict[str, Any], where: str = "instance") -> "Instance":
    """Rebuild an instance written by `to_json`."""
    try:
      return cls(id=obj["id"], dataset=obj["dataset"], subset=obj["subset"],
                 question=obj["question"], answer=obj["answer"], cited=tuple(obj["cited"]),
                 passages=tuple(Passage(ref=p["ref"], title=p["title"], text=p["text"])
                                for p in obj["passages"]))
    except (KeyError, TypeError) as e:
      raise DataError(f"{where}: not an extracted instance (bad or missing field {e})") from None


@dataclasses.dataclass(frozen=True)
class SubsetRule:
  """Map a `dataset` name to SINGLE, MULTI or None (skipped) by case-insensitive substrings."""
  single: tuple[str, ...] = ("single",)
  multi: tuple[str, ...] = ("multi",)

  def subset(self, dataset: str) -> Optional[str]:
    """Return the subset of `dataset`, or None when it is neither QA subset."""
    name = dataset.lower()
    is_single = any(s.lower() in name for s in self.single)
    is_multi = any(s.lower() in name for s in self.multi)
    if is_single and is_multi:
      raise DataError(f"dataset name {dataset!r} matches both the single- and multi-paper rules")
    return SINGLE if is_single else MULTI if is_multi else None


@dataclasses.dataclass
class ExtractReport:
  """Counts of what extraction read, kept and skipped, and every defect by id."""
  lines: int = 0
  kept: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  skipped_datasets: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  passages: int = 0
  defects: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)  # (kind, id, detail)

  def to_json(self) -> dict[str, Any]:
    """Return the report as a JSON-ready dict."""
    return {"lines": self.lines, "instances": sum(self.kept.values()),
            "single_paper": self.kept[SINGLE], "multi_paper": self.kept[MULTI],
            "passages": self.passages, "skipped_datasets": dict(self.skipped_datasets),
            "defects": [{"kind": k, "id": i, "detail": d} for k, i, d in self.defects]}


def strip_response_markers(text: str) -> str:
  """Return an answer without "[Response_Start]/[Response_End]" wrappers or a trailing reference list."""
  if "[Response_Start]" in text:
    text = text.split("[Response_Start]", 1)[1]
  text = text.split("[Response_End]", 1)[0]
  # Some answers repeat the reference list after the text; it is not part of the answer.
  text = re.split(r"\n\s*References:\s*\n", text, maxsplit=1)[0]
  return text.strip()


def cited_refs(answer: str) -> tuple[int, ...]:
  """Return the sorted reference indices an answer cites as "[k]" or "[k, j]"."""
  out = set()
  for m in _CITATION.finditer(answer):
    out.update(int(x) for x in m.group(1).split(","))
  return tuple(sorted(out))


def parse_user_prompt(content: str, where: str) -> tuple[str, list[Passage]]:
  """Split an OpenScholar user turn into (question, passages).

  Raises:
    DataError: there is no "References:" list, no reference, no question, or a
      reference index repeats.
  """
  if "References:" not in content:
    raise DataError(f"{where}: user turn has no 'References:' list")
  refs_block = content.split("References:", 1)[1]
  m = None
  for m in _QUESTION_MARK.finditer(refs_block):
    pass  # the question is the last "Question:" line: reference texts may contain one
  if m is None:
    raise DataError(f"{where}: user turn has no 'Question:' after the references")
  question = re.sub(r"\n\s*Answer\s*:\s*$", "", refs_block[m.end():].strip()).strip()
  if not question:
    raise DataError(f"{where}: empty question")
  passages: list[Passage] = []
  for line in refs_block[:m.start()].splitlines():
    rm = _REF_LINE.match(line.strip())
    if rm is None:
      if line.strip() and passages:  # a reference text that spans lines
        last = passages[-1]
        passages[-1] = Passage(last.ref, last.title, f"{last.text}\n{line.strip()}")
      continue
    body = rm.group(2).strip()
    tm = _TITLED.match(body)
    title, text = (tm.group(1).strip(), tm.group(2).strip()) if tm else ("", body)
    passages.append(Passage(ref=int(rm.group(1)), title=title, text=text))
  if not passages:
    raise DataError(f"{where}: reference list is empty")
  refs = [p.ref for p in passages]
  dup = sorted({r for r in refs if refs.count(r) > 1})
  if dup:
    raise DataError(f"{where}: reference index repeats: {dup}")
  empty = [p.ref for p in passages if not p.text.strip()]
  if empty:
    raise DataError(f"{where}: references with empty text: {empty}")
  return question, passages


def parse_instance(obj: Any, rule: SubsetRule, where: str) -> Optional[Instance]:
  """Parse one input line; return None when its dataset is not a QA subset.

  Raises:
    DataError: the line is not a well-formed instance (the message names it).
  """
  if not isinstance(obj, dict):
    raise DataError(f"{where}: expected a JSON object")
  iid = obj.get("id")
  if not isinstance(iid, str) or not iid.strip():
    raise DataError(f"{where}: missing or empty string 'id'")
  dataset = obj.get("dataset", "")
  if not isinstance(dataset, str):
    raise DataError(f"{where}: 'dataset' must be a string")
  subset = rule.subset(dataset)
  if subset is None:
    return None
  if "messages" in obj:
    msgs = obj["messages"]
    if not isinstance(msgs, list) or not all(isinstance(x, dict) for x in msgs):
      raise DataError(f"{where}: 'messages' must be a list of objects")
    user = [x.get("content") for x in msgs if x.get("role") == "user"]
    asst = [x.get("content") for x in msgs if x.get("role") == "assistant"]
    if len(user) != 1 or len(asst) != 1 or not all(isinstance(x, str) for x in user + asst):
      raise DataError(f"{where}: expected exactly one user and one assistant turn with text")
    question, passages = parse_user_prompt(user[0], where)
    answer = strip_response_markers(asst[0])
  else:
    question = obj.get("input", obj.get("question"))
    answer = obj.get("output", obj.get("answer"))
    ctxs = obj.get("ctxs")
    if not isinstance(question, str) or not question.strip():
      raise DataError(f"{where}: missing question ('input' or 'question')")
    if not isinstance(answer, str):
      raise DataError(f"{where}: missing answer ('output' or 'answer')")
    if not isinstance(ctxs, list) or not ctxs:
      raise DataError(f"{where}: missing or empty 'ctxs'")
    passages = []
    for k, c in enumerate(ctxs):
      if not isinstance(c, dict) or not isinstance(c.get("text"), str) or not c["text"].strip():
        raise DataError(f"{where}: ctxs[{k}] has no text")
      passages.append(Passage(ref=k, title=str(c.get("title") or ""), text=c["text"].strip()))
    answer = strip_response_markers(answer)
    question = question.strip()
  if not answer:
    raise DataError(f"{where}: empty answer")
  refs = {p.ref for p in passages}
  cited = cited_refs(answer)
  unknown = [c for c in cited if c not in refs]
  if unknown:
    raise DataError(f"{where}: answer cites references {unknown} that are not in the list")
  return Instance(id=iid, dataset=dataset, subset=subset, question=question, answer=answer,
                  passages=tuple(passages), cited=cited)


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, Any, Optional[str]]]:
  """Yield (line number, parsed value or None, error or None) for each non-blank line."""
  for lineno, value, error in read_json_lines(path, lambda why: f"{path}: cannot read ({why})"):
    yield lineno, value, (None if error is None
                          else f"malformed JSON: {error.msg} at column {error.colno}")


def extract_instances(path: str | os.PathLike, rule: SubsetRule = SubsetRule()
                      ) -> tuple[list[Instance], ExtractReport]:
  """Read an OpenScholar-style JSONL file and keep its single- and multi-paper QA instances.

  Args:
    path: the input JSONL (OS_Train_Data rows or the structured `ctxs` form).
    rule: how a `dataset` name maps to a subset.

  Returns:
    (instances, report): the kept instances in file order; the report counts
    lines, kept instances per subset, skipped datasets, passages, and lists
    every malformed or duplicate instance as (kind, id, detail).
  """
  report = ExtractReport()
  out: list[Instance] = []
  seen: set[str] = set()
  for lineno, obj, err in iter_jsonl(path):
    report.lines += 1
    where = f"{os.fspath(path)}:{lineno}"
    iid = obj.get("id") if isinstance(obj, dict) and isinstance(obj.get("id"), str) else f"line:{lineno}"
    if err is not None:
      report.defects.append(("malformed_instance", iid, f"{where}: {err}"))
      continue
    try:
      inst = parse_instance(obj, rule, f"{where} ({iid})")
    except DataError as e:
      report.defects.append(("malformed_instance", iid, str(e)))
      continue
    if inst is None:
      report.skipped_datasets[obj.get("dataset", "")] += 1
      continue
    if inst.id in seen:
      report.defects.append(("duplicate_instance", inst.id, f"{where}: id repeats an earlier line"))
      continue
    seen.add(inst.id)
    report.kept[inst.subset] += 1
    report.passages += len(inst.passages)
    out.append(inst)
  return out, report


def write_instances(path: str | os.PathLike, instances: Sequence[Instance]):
  """Write instances as JSONL (the input of `prepare` and `consolidate`)."""
  with open(path, "w", encoding="utf-8") as f:
    for inst in instances:
      f.write(json.dumps(inst.to_json(), ensure_ascii=False) + "\n")


def read_instances(path: str | os.PathLike) -> list[Instance]:
  """Read instances written by `write_instances`.

  Raises:
    DataError: a line is malformed.
  """
  out = []
  for lineno, obj, err in iter_jsonl(path):
    where = f"{os.fspath(path)}:{lineno}"
    if err is not None:
      raise DataError(f"{where}: {err}")
    out.append(Instance.from_json(obj, where))
  return out
