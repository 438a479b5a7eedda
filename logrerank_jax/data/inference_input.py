"""Read and validate OpenScholar / ScholarQABench style inference input.

Accepted record (one JSON object per line):

    {"input" | "question" | "query": str,
     "ctxs" | "passages": [{"title": str (optional), "text": str, ...} | str, ...],
     ...any other fields, kept untouched...}

The first present of `input`, `question`, `query` is the query, and `ctxs` wins over
`passages`. A passage is an object with a `text` (extra fields pass through untouched) or a
plain string (its text). Each passage's `text` is split into sentences with
`logrerank_jax.data.sentences.split_sentences` (exact character offsets into `text`; the
title is not scored), and pieces of under three words (") (", "Fig. 2", a bare citation: PDF
text split at every period) join a neighbouring sentence (`sentences.merge_fragments`).

Nothing about a query is lost to one bad passage: a passage whose text is unusable (NaN, null,
a number, an object, empty or whitespace only, or no `text` at all) is kept with zero
sentences and its reason in `InferencePassage.skipped` (e.g. "text is NaN"); the other
passages are reranked (a title that is not a string also skips its passage). What makes a whole record a `DataError` (naming the line and field) is
what leaves nothing to rerank: a line that is not a JSON object, a missing or empty query, no
passage list or an empty one. `read_inference_file` returns the error in the record's place so
the caller can report it and carry on with the rest of the file.
"""

import dataclasses
import json
import math
from typing import Any, Optional, Union

from logrerank_jax.data.sentences import Sentence, merge_fragments, split_sentences
from logrerank_jax.errors import DataError

QUERY_KEYS = ("input", "question", "query")
PASSAGE_KEYS = ("ctxs", "passages")


@dataclasses.dataclass(frozen=True)
class InferencePassage:
  """One candidate passage: its title, text and sentences (offsets into `text`)."""
  title: str
  text: str
  sentences: tuple[Sentence, ...]
  passage_id: Optional[str]  # the input's `id` field as a string, if any
  skipped: Optional[str] = None  # why the passage cannot be scored (None: it is usable)


@dataclasses.dataclass(frozen=True)
class InferenceRecord:
  """One query with its candidate passages, plus the raw input object it came from."""
  query: str
  passages: tuple[InferencePassage, ...]
  passage_key: str          # "ctxs" or "passages": where the input kept them
  raw: dict                 # the parsed input object, unchanged
  record_id: Optional[str]  # the input's `id` field as a string, if any

  @property
  def sentence_texts(self) -> list[list[str]]:
    """Sentence strings per passage (what the packer takes)."""
    return [[s.text for s in p.sentences] for p in self.passages]

  @property
  def skipped(self) -> list[tuple[int, str]]:
    """(passage index, reason) of every passage that could not be scored."""
    return [(i, p.skipped) for i, p in enumerate(self.passages) if p.skipped is not None]


@dataclasses.dataclass(frozen=True)
class InputLine:
  """One non-blank input line: the parsed record, or the error that stopped it."""
  line: int                                   # 1-based line number in the file
  raw: Optional[Any]                          # parsed JSON value (None if the JSON was bad)
  record: Union[InferenceRecord, DataError]


def _type_name(x: Any) -> str:
  """Name a value's type for messages, calling NaN out (it is a float in JSON)."""
  if isinstance(x, float) and math.isnan(x):
    return "NaN"
  return "null" if x is None else type(x).__name__


def _optional_id(value: Any) -> Optional[str]:
  """Return an `id` field as a string (ints are accepted), None when absent."""
  if value is None or isinstance(value, bool):
    return None
  if isinstance(value, (str, int)):
    return str(value)
  return None


def parse_inference_record(obj: Any, where: str = "record") -> InferenceRecord:
  """Validate one input object and split its passages into sentences.

  Args:
    obj: the parsed JSON value of one line.
    where: location used in error messages (e.g. "in.jsonl:3").

  Returns:
    The `InferenceRecord`.

  Raises:
    DataError: not an object, missing/empty query, no passages, or a passage whose title or
      text has the wrong type.
  """
  if not isinstance(obj, dict):
    raise DataError(f"{where}: expected a JSON object, got {_type_name(obj)}")
  qkey = next((k for k in QUERY_KEYS if k in obj), None)
  if qkey is None:
    raise DataError(f"{where}: missing query: no 'input', 'question' or 'query' field")
  query = obj[qkey]
  if not isinstance(query, str) or not query.strip():
    raise DataError(f"{where}: '{qkey}' must be a non-empty string, got {_type_name(query)}"
                    + (" (empty)" if isinstance(query, str) else ""))
  pkey = next((k for k in PASSAGE_KEYS if k in obj), None)
  if pkey is None:
    if "gold_ctx" in obj:
      raise DataError(f"{where}: no candidate passages ('ctxs' or 'passages'); this looks like a "
                      "ScholarQABench task file (it has 'gold_ctx'): build candidate pools from "
                      "it with `python tools/prepare_data.py --input FILE --output pools.jsonl "
                      "--qrels pools.qrels`, then rerank pools.jsonl")
    if "ctx_ids" in obj:
      raise DataError(f"{where}: passages given by id only ('ctx_ids'), without their texts: "
                      "rerank with the corpus that holds them (tools/rerank.py --corpus "
                      "corpus.jsonl; logrerank_jax.data.pool_files.resolve_pool)")
    raise DataError(f"{where}: no passages: no 'ctxs' or 'passages' field")
  ctxs = obj[pkey]
  if not isinstance(ctxs, list):
    raise DataError(f"{where}: '{pkey}' must be a list, got {_type_name(ctxs)}")
  if not ctxs:
    raise DataError(f"{where}: '{pkey}' is empty (zero passages)")
  passages = [_passage(ctx) for ctx in ctxs]
  return InferenceRecord(query=query, passages=tuple(passages), passage_key=pkey, raw=obj,
                         record_id=_optional_id(obj.get("id")))


def _passage(ctx: Any) -> InferencePassage:
  """One candidate passage; an unusable one is kept with zero sentences and its reason."""
  if isinstance(ctx, str):
    ctx = {"text": ctx}
  if not isinstance(ctx, dict):
    return InferencePassage("", "", (), None, skipped=f"passage is {_type_name(ctx)}, not an object")
  title = ctx.get("title")
  pid = _optional_id(ctx.get("id"))
  if title is not None and not isinstance(title, str):
    return InferencePassage("", "", (), pid, skipped=f"title is {_type_name(title)}, not a string")
  title = title or ""
  if "text" not in ctx:
    return InferencePassage(title, "", (), pid, skipped="no 'text' field")
  text = ctx["text"]
  if not isinstance(text, str):
    return InferencePassage(title, "", (), pid, skipped=f"text is {_type_name(text)}")
  if not text.strip():
    return InferencePassage(title, text, (), pid, skipped="text is empty")
  # Fragments of under three words (") (", "Fig. 2", a bare citation) join a neighbour.
  sentences = tuple(merge_fragments(text, split_sentences(text)))
  return InferencePassage(title=title, text=text, sentences=sentences,
                          passage_id=pid)


def parse_inference_line(line: str, lineno: int, where: str) -> InputLine:
  """Parse one JSONL line into an `InputLine` (errors are returned, not raised).

  Args:
    line: the line's text.
    lineno: its 1-based number.
    where: file name for messages.

  Returns:
    The `InputLine`.
  """
  at = f"{where}:{lineno}"
  try:
    # json accepts the NaN/Infinity literals as floats; validation then rejects them by name.
    raw = json.loads(line)
  except json.JSONDecodeError as e:
    return InputLine(lineno, None, DataError(f"{at}: malformed JSON ({e.msg} at column {e.colno})"))
  except (ValueError, RecursionError) as e:
    # An integer over Python's digit limit (ValueError) or nesting deeper than the stack.
    reason = "nested too deeply" if isinstance(e, RecursionError) else str(e).split(";")[0]
    return InputLine(lineno, None, DataError(f"{at}: malformed JSON ({reason})"))
  try:
    return InputLine(lineno, raw, parse_inference_record(raw, at))
  except DataError as e:
    return InputLine(lineno, raw, e)


def read_inference_file(path: str) -> list[InputLine]:
  """Read an inference JSONL file; blank lines are skipped, every other line gives one entry.

  Args:
    path: the JSONL file.

  Returns:
    One `InputLine` per non-blank line, in file order; bad lines carry a `DataError`.

  Raises:
    DataError: the file cannot be read.
  """
  try:
    with open(path, "rb") as f:  # bytes: a non-UTF-8 line is that record's error, not the file's
      lines = f.read().split(b"\n")
  except OSError as e:
    raise DataError(f"cannot read inference input {path}: {e}") from e
  out = []
  for n, raw in enumerate(lines, start=1):
    try:
      line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
      out.append(InputLine(n, None, DataError(
          f"{path}:{n}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})")))
      continue
    if line.strip():
      out.append(parse_inference_line(line, n, path))
  return out
