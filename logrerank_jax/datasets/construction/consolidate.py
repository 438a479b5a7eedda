"""Turn annotator responses into validated training records, reporting every defect by id.

Per instance (ids are the request custom_ids, see `requests.py`):
  1. its passage-ranking response is parsed leniently; without one the
     instance is dropped;
  2. each passage's sentence-ranking response is parsed; units flagged as
     fragments, units with fewer than `min_words` words (empty included),
     units not found in the passage text (after whitespace collapsing) and
     repeated units are removed; the kept units take the passage's own text
     span, so every sentence is faithful by construction;
  3. sentence ranks become a strict permutation 1..M by (annotated rank,
     original position); passage ranks 1..P by (annotated rank, score desc,
     original position); a missing or invalid rank sorts after every valid
     one; passages without kept units are dropped before renumbering;
  4. roles come from a `RoleAnnotator`.
A defect that is repaired (duplicate ranks, repaired JSON, ...) is reported and
the data kept; one that cannot be (unparseable JSON, missing response) is
reported and the affected unit, passage or instance dropped. Nothing vanishes
without a defect line.
"""

import collections
import dataclasses
import json
import math
import os
from typing import Any, Optional, Sequence

from logrerank_jax.data import records as records_lib
from logrerank_jax.datasets.construction import requests as requests_lib
from logrerank_jax.datasets.construction.extract import Instance
from logrerank_jax.datasets.construction.extract import iter_jsonl
from logrerank_jax.datasets.construction.lenient_json import loads_lenient
from logrerank_jax.datasets.construction.roles import RoleAnnotator
from logrerank_jax.datasets.construction.stats import ConstructionStats
from logrerank_jax.errors import DataError

# Defect kinds, in report order.
DEFECT_KINDS = (
    "malformed_response_line",  # a responses line is not JSON
    "unknown_custom_id",        # custom_id of no prepared request
    "duplicate_response",       # a custom_id answered twice (the first is used)
    "failed_request",           # the response carries an error / non-200 status
    "malformed_envelope",       # no choices[0].message.content
    "missing_response",         # a prepared request has no response
    "unparseable_response",     # content is not JSON even after repairs
    "json_repaired",            # content parsed after named repairs
    "bad_schema",               # parsed JSON lacks "units" / "passages" lists
    "unknown_ref",              # passage entry names a reference the instance lacks
    "duplicate_ref",            # passage entry repeats a reference (the first is used)
    "missing_passage_entry",    # a candidate has no passage entry (ranked last)
    "missing_rank",             # a unit / passage entry has no rank
    "invalid_rank",             # rank is not an integer >= 1
    "duplicate_rank",           # two units / passages share a rank
    "invalid_score",            # score is not an integer 1..5
    "malformed_unit",           # a unit is not an object with a "text" string
    "fragment",                 # unit flagged as a fragment (removed)
    "short_unit",               # unit with fewer than min_words words (removed)
    "unit_not_in_passage",      # unit text not found in its passage (removed)
    "duplicate_unit",           # unit repeats an already kept span (removed)
    "unit_out_of_order",        # unit found before the previous one (kept, reordered)
    "role_missing",             # the role source failed (passage dropped)
    "passage_dropped",          # passage left without units
    "instance_dropped",         # instance left without passages
)


@dataclasses.dataclass(frozen=True)
class Defect:
  """One problem found while consolidating: its kind, the id it concerns, and a one-line detail."""
  kind: str
  id: str
  detail: str

  def to_json(self) -> dict[str, str]:
    """Return the defect as a JSON-ready dict."""
    return {"kind": self.kind, "id": self.id, "detail": self.detail}


@dataclasses.dataclass(frozen=True)
class ConsolidateOptions:
  """Filtering settings."""
  min_words: int = 4  # a unit with fewer whitespace-separated words is "very short"


@dataclasses.dataclass
class ConsolidationResult:
  """Records in instance order, every defect, and the statistics."""
  records: list[records_lib.TrainingRecord]
  defects: list[Defect]
  stats: ConstructionStats

  def defect_counts(self) -> dict[str, int]:
    """Return the number of defects per kind (kinds with none omitted)."""
    c = collections.Counter(d.kind for d in self.defects)
    return {k: c[k] for k in DEFECT_KINDS if c[k]}


def _content_of(obj: Any) -> tuple[Optional[str], Optional[str]]:
  """Return (message content, None) of a batch-output line, or (None, failure kind: detail)."""
  if obj.get("error"):
    return None, f"failed_request: {json.dumps(obj['error'])[:200]}"
  resp = obj.get("response")
  if not isinstance(resp, dict):
    return None, "malformed_envelope: no 'response' object"
  status = resp.get("status_code", 200)
  if status != 200:
    return None, f"failed_request: status_code {status}"
  try:
    content = resp["body"]["choices"][0]["message"]["content"]
  except (KeyError, IndexError, TypeError):
    return None, "malformed_envelope: no response.body.choices[0].message.content"
  if not isinstance(content, str):
    return None, "malformed_envelope: message content is not a string"
  return content, None


def read_responses(path: str | os.PathLike, defects: list[Defect]) -> dict[str, Optional[str]]:
  """Read batch-output JSONL into {custom_id: content or None (failed)}, reporting bad lines."""
  out: dict[str, Optional[str]] = {}
  for lineno, obj, err in iter_jsonl(path):
    where = f"{os.fspath(path)}:{lineno}"
    if err is not None or not isinstance(obj, dict):
      defects.append(Defect("malformed_response_line", f"line:{lineno}",
                            f"{where}: {err or 'not an object'}"))
      continue
    cid = obj.get("custom_id")
    try:
      requests_lib.parse_custom_id(cid)
    except DataError as e:
      defects.append(Defect("unknown_custom_id", str(cid), f"{where}: {e}"))
      continue
    if cid in out:
      defects.append(Defect("duplicate_response", cid,
                            f"{where}: answered again; the first answer is used"))
      continue
    content, failure = _content_of(obj)
    if failure is not None:
      kind, detail = failure.split(": ", 1)
      defects.append(Defect(kind, cid, f"{where}: {detail}"))
    out[cid] = content
  return out


def _rank_value(entry: dict, cid: str, what: str, defects: list[Defect]) -> float:
  """Return an entry's rank as a sort key (inf when missing or invalid), reporting why."""
  if "rank" not in entry or entry["rank"] is None:
    defects.append(Defect("missing_rank", cid, f"{what}: no rank"))
    return math.inf
  r = entry["rank"]
  if (isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r)
      or r != int(r) or r < 1):
    defects.append(Defect("invalid_rank", cid, f"{what}: rank {r!r} is not an integer >= 1"))
    return math.inf
  return float(r)


def _score_value(entry: dict, cid: str, what: str, defects: list[Defect]) -> Optional[int]:
  """Return an entry's 1..5 score, or None (reported) when missing or invalid."""
  s = entry.get("score")
  if (isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s)
      or s != int(s) or not 1 <= s <= 5):
    defects.append(Defect("invalid_score", cid, f"{what}: score {s!r} is not an integer 1..5"))
    return None
  return int(s)


def _report_duplicate_ranks(ranks: Sequence[float], labels: Sequence[str], cid: str,
                            defects: list[Defect]):
  """Report each rank value given to more than one entry."""
  groups = collections.defaultdict(list)
  for r, lab in zip(ranks, labels):
    if math.isfinite(r):
      groups[int(r)].append(lab)
  for r, labs in sorted(groups.items()):
    if len(labs) > 1:
      defects.append(Defect("duplicate_rank", cid, f"rank {r} given to {', '.join(labs)}"))


def _parse(content: Optional[str], cid: str, key: str, defects: list[Defect]) -> Optional[list]:
  """Parse a response's content and return its `key` list, or None (reported)."""
  if content is None:
    return None  # the failure is already reported by read_responses
  try:
    obj, repairs = loads_lenient(content)
  except DataError as e:
    defects.append(Defect("unparseable_response", cid, str(e)))
    return None
  if repairs:
    defects.append(Defect("json_repaired", cid, "repairs: " + ", ".join(repairs)))
  items = obj.get(key) if isinstance(obj, dict) else None
  if not isinstance(items, list):
    defects.append(Defect("bad_schema", cid, f"expected an object with a {key!r} list"))
    return None
  return items


class _NormalizedText:
  """A passage with whitespace runs collapsed, mapping positions back to the original."""

  def __init__(self, text: str):
    chars, index = [], []
    prev_space = True  # drops leading whitespace
    for i, ch in enumerate(text):
      if ch.isspace():
        if not prev_space:
          chars.append(" ")
          index.append(i)
        prev_space = True
      else:
        chars.append(ch)
        index.append(i)
        prev_space = False
    self.text = "".join(chars)
    self.index = index

  def find(self, needle: str, start: int) -> Optional[tuple[int, int]]:
    """Return the original [start, end) of the first match at or after normalised `start`."""
    k = self.text.find(needle, start)
    if k < 0:
      return None
    return k, k + len(needle)

  def original(self, nstart: int, nend: int) -> tuple[int, int]:
    """Map a normalised span to the original text."""
    return self.index[nstart], self.index[nend - 1] + 1


def _consolidate_passage(inst: Instance, ref: int, items: list, opts: ConsolidateOptions,
                         stats: ConstructionStats, defects: list[Defect]
                         ) -> list[tuple[int, int, int]]:
  """Filter and rank one passage's units; return kept (start, end, rank) in passage order."""
  cid = requests_lib.sentence_custom_id(inst.id, ref)
  passage = next(p for p in inst.passages if p.ref == ref)
  norm = _NormalizedText(passage.text)
  stats.units_before += len(items)
  kept: list[tuple[float, int, int, int]] = []  # (rank key, start, end, unit index)
  used: list[tuple[int, int]] = []
  cursor = 0
  raw_ranks, labels = [], []
  for j, u in enumerate(items):
    what = f"unit {j + 1}"
    if not isinstance(u, dict) or not isinstance(u.get("text"), str):
      defects.append(Defect("malformed_unit", cid, f"{what}: not an object with a 'text' string"))
      stats.removed["malformed"] += 1
      continue
    rank = _rank_value(u, cid, what, defects)
    raw_ranks.append(rank)
    labels.append(what)
    if "score" in u:
      _score_value(u, cid, what, defects)
    text = " ".join(u["text"].split())
    if u.get("fragment") is True:
      defects.append(Defect("fragment", cid, f"{what}: {text[:60]!r}"))
      stats.removed["fragment"] += 1
      continue
    if len(text.split()) < opts.min_words:
      defects.append(Defect("short_unit", cid, f"{what}: {text!r} has < {opts.min_words} words"))
      stats.removed["short"] += 1
      continue
    span = norm.find(text, cursor)
    out_of_order = False
    if span is None:
      span = norm.find(text, 0)
      out_of_order = span is not None
    if span is None:
      defects.append(Defect("unit_not_in_passage", cid,
                            f"{what}: {text[:60]!r} is not in the passage text"))
      stats.removed["unfaithful"] += 1
      continue
    if any(span[0] < e and s < span[1] for s, e in used):
      defects.append(Defect("duplicate_unit", cid, f"{what}: {text[:60]!r} repeats a kept unit"))
      stats.removed["duplicate"] += 1
      continue
    if out_of_order:
      defects.append(Defect("unit_out_of_order", cid,
                            f"{what}: appears earlier in the passage; reordered"))
    used.append(span)
    cursor = max(cursor, span[1])
    s, e = norm.original(*span)
    kept.append((rank, s, e, j))
  _report_duplicate_ranks(raw_ranks, labels, cid, defects)
  order = sorted(kept, key=lambda k: (k[0], k[1]))
  ranks = {k[1]: r for r, k in enumerate(order, start=1)}
  return sorted((s, e, ranks[s]) for _, s, e, _ in kept)


def _passage_order(inst: Instance, items: list, defects: list[Defect]) -> dict[int, tuple]:
  """Return {ref: sort key (rank, -score, position)} from a passage-ranking response."""
  cid = requests_lib.passage_custom_id(inst.id)
  position = {p.ref: i for i, p in enumerate(inst.passages)}
  keys: dict[int, tuple] = {}
  raw_ranks, labels = [], []
  for j, e in enumerate(items):
    ref = e.get("ref") if isinstance(e, dict) else None
    if isinstance(ref, bool) or not isinstance(ref, int) or ref not in position:
      defects.append(Defect("unknown_ref", cid, f"entry {j + 1}: ref {ref!r} is not a candidate"))
      continue
    if ref in keys:
      defects.append(Defect("duplicate_ref", cid,
                            f"entry {j + 1}: ref {ref} repeats; first entry used"))
      continue
    what = f"ref {ref}"
    rank = _rank_value(e, cid, what, defects)
    score = _score_value(e, cid, what, defects)
    raw_ranks.append(rank)
    labels.append(what)
    keys[ref] = (rank, -(score if score is not None else 0), position[ref])
  _report_duplicate_ranks(raw_ranks, labels, cid, defects)
  for p in inst.passages:
    if p.ref not in keys:
      defects.append(Defect("missing_passage_entry", cid, f"ref {p.ref} has no entry; ranked last"))
      keys[p.ref] = (math.inf, 0, position[p.ref])
  return keys


def consolidate(instances: Sequence[Instance], responses: dict[str, Optional[str]],
                annotator: RoleAnnotator, opts: ConsolidateOptions = ConsolidateOptions(),
                defects: Optional[list[Defect]] = None) -> ConsolidationResult:
  """Consolidate responses into training records (see the module docstring).

  Args:
    instances: the extracted instances the requests were built from.
    responses: {custom_id: content or None} from `read_responses`.
    annotator: the role source.
    opts: filtering settings.
    defects: defects found earlier (e.g. by `read_responses`), extended in place.

  Returns:
    The records (each checked against the training schema), all defects and the statistics.
  """
  defects = defects if defects is not None else []
  stats = ConstructionStats(instances_extracted=len(instances))
  expected: set[str] = set()
  records = []
  subsets = {}
  for inst in instances:
    pcid = requests_lib.passage_custom_id(inst.id)
    scids = {p.ref: requests_lib.sentence_custom_id(inst.id, p.ref) for p in inst.passages}
    expected.add(pcid)
    expected.update(scids.values())
    for cid in [pcid] + list(scids.values()):
      if cid not in responses:
        defects.append(Defect("missing_response", cid, "no response for this request"))
    items = _parse(responses.get(pcid), pcid, "passages", defects)
    if items is None:
      defects.append(Defect("instance_dropped", inst.id, "no usable passage-ranking response"))
      continue
    pkeys = _passage_order(inst, items, defects)
    kept_passages = []
    for p in inst.passages:
      pid = inst.passage_id(p.ref)
      units = _parse(responses.get(scids[p.ref]), scids[p.ref], "units", defects)
      if units is None:
        defects.append(Defect("passage_dropped", pid, "no usable sentence-ranking response"))
        continue
      spans = _consolidate_passage(inst, p.ref, units, opts, stats, defects)
      if not spans:
        defects.append(Defect("passage_dropped", pid, "no unit left after filtering"))
        continue
      try:
        roles = annotator.annotate(pid, p.title, p.text, [(s, e) for s, e, _ in spans])
      except DataError as e:
        defects.append(Defect("role_missing", pid, str(e)))
        stats.removed["no_role"] += len(spans)
        defects.append(Defect("passage_dropped", pid, "no role for its sentences"))
        continue
      sentences = tuple(records_lib.TrainingSentence(text=p.text[s:e], rank=r, role=tuple(role))
                        for (s, e, r), role in zip(spans, roles))
      kept_passages.append((pkeys[p.ref], pid, p.title, sentences))
    if not kept_passages:
      defects.append(Defect("instance_dropped", inst.id, "no passage left"))
      continue
    order = sorted(kept_passages, key=lambda k: k[0])
    prank = {k[1]: r for r, k in enumerate(order, start=1)}
    rec = records_lib.TrainingRecord(
        id=inst.id, question=inst.question,
        passages=tuple(records_lib.TrainingPassage(id=pid, title=title, rank=prank[pid],
                                                   sentences=sents)
                       for _, pid, title, sents in kept_passages))
    records_lib.parse_training_record(rec.to_json(), where=f"consolidated {inst.id}")
    records.append(rec)
    subsets[inst.id] = inst.subset
  known = {i.id for i in instances}
  for cid in responses:
    if cid not in expected:
      _, iid, _ = requests_lib.parse_custom_id(cid)
      why = "no such instance" if iid not in known else "no such reference"
      defects.append(Defect("unknown_custom_id", cid, f"response matches no request ({why})"))
  stats.add_records(records, subsets)
  return ConsolidationResult(records=records, defects=defects, stats=stats)


def write_defects(path: str | os.PathLike, defects: Sequence[Defect]):
  """Write one JSON object per defect."""
  with open(path, "w", encoding="utf-8") as f:
    for d in defects:
      f.write(json.dumps(d.to_json(), ensure_ascii=False) + "\n")
