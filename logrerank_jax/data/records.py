"""Training records: the JSONL schema of one training query, its dataclasses and validator.

One line of a training file is one query (full description in `docs/DATA.md`):

  {"id": str, "question": str,
   "passages": [{"id": str, "title": str, "rank": int,
                 "sentences": [{"text": str, "rank": int,
                                "role": [p_background, p_method, p_result]}]}]}

Rules (the checks of the paper's Appendix B):
  * every field above is present, has that type and no other key appears;
    `id`, `question` and sentence `text` are non-empty (not whitespace-only)
    strings; `title` may be empty; ranks are ints (not bools, not floats);
  * passage ranks of a query are a complete permutation of 1..P (1 = best),
    sentence ranks of a passage a complete permutation of 1..M (1 = best);
  * a query has >= 1 passage and every passage >= 1 sentence;
  * a role is 3 finite, non-negative numbers summing to 1 within `ROLE_SUM_TOL`;
  * query ids are unique within a file, passage ids unique within a query;
  * each line is UTF-8 and one JSON object. Whitespace-only lines are ignored.
"""

import dataclasses
import json
import math
import os
from typing import Any, Optional

from logrerank_jax.errors import DataError
from logrerank_jax.schema import NUM_ROLES

ROLE_SUM_TOL = 1e-4
# Violation classes, in the order the report lists them.
VIOLATIONS = (
    "non_utf8",          # the line's bytes are not UTF-8
    "malformed_json",    # the line is not one JSON value
    "missing_field",     # a required key is absent
    "unknown_field",     # a key outside the schema (catches typos such as "sentence")
    "wrong_type",        # a value has the wrong JSON type (NaN/None/number/dict for a text, ...)
    "empty_text",        # id / question / sentence text is "" or whitespace only
    "no_passages",       # "passages" is an empty list
    "no_sentences",      # a passage has an empty "sentences" list
    "rank_not_permutation",  # ranks are not exactly 1..n
    "role_not_simplex",  # role is not 3 finite non-negative numbers summing to 1
    "duplicate_id",      # a query id repeats in the file or a passage id within a query
)
_MAX_ERRORS_IN_MESSAGE = 5


@dataclasses.dataclass(frozen=True)
class TrainingSentence:
  """One sentence with its rank in the passage (1 = best) and role distribution."""
  text: str
  rank: int
  role: tuple[float, float, float]


@dataclasses.dataclass(frozen=True)
class TrainingPassage:
  """One passage with its rank among the query's passages (1 = best)."""
  id: str
  title: str
  rank: int
  sentences: tuple[TrainingSentence, ...]


@dataclasses.dataclass(frozen=True)
class TrainingRecord:
  """One training query with its ranked passages."""
  id: str
  question: str
  passages: tuple[TrainingPassage, ...]

  def to_json(self) -> dict[str, Any]:
    """Return the record as the JSON-ready dict of the schema."""
    return {
        "id": self.id,
        "question": self.question,
        "passages": [{
            "id": p.id,
            "title": p.title,
            "rank": p.rank,
            "sentences": [{"text": s.text, "rank": s.rank, "role": list(s.role)}
                          for s in p.sentences],
        } for p in self.passages],
    }


@dataclasses.dataclass
class ValidationReport:
  """What `validate_training_file` saw: line counts, violation counts, every error."""
  path: str
  n_lines: int = 0            # non-blank lines read
  n_records: int = 0          # valid records returned
  n_invalid: int = 0          # lines rejected
  counts: dict[str, int] = dataclasses.field(
      default_factory=lambda: {v: 0 for v in VIOLATIONS})  # lines with >= 1 violation of a class
  # One "file:line: reason" per bad line.
  errors: list[str] = dataclasses.field(default_factory=list)


class _Problems:
  """Collects (violation class, message) pairs for one record."""

  def __init__(self):
    self.items: list[tuple[str, str]] = []

  def add(self, kind: str, msg: str):
    self.items.append((kind, msg))


def _type_name(x: Any) -> str:
  """Name a JSON value's type the way a record author would read it."""
  if x is None:
    return "null"
  if isinstance(x, float) and not math.isfinite(x):
    return repr(x)  # nan / inf: parsed from the non-standard NaN/Infinity literals
  return {bool: "bool", int: "number", float: "number", str: "string", list: "list",
          dict: "object"}.get(type(x), type(x).__name__)


def _check_keys(obj: dict, required: tuple[str, ...], where: str, probs: _Problems) -> bool:
  """Report missing and unknown keys; return whether all required keys are present."""
  ok = True
  for k in required:
    if k not in obj:
      probs.add("missing_field", f"{where}: missing field {k!r}")
      ok = False
  for k in obj:
    if k not in required:
      probs.add("unknown_field", f"{where}: unknown field {k!r}")
  return ok


def _check_text(obj: dict, key: str, where: str, probs: _Problems, allow_empty: bool = False):
  """Check that obj[key] is a string (non-empty unless `allow_empty`)."""
  v = obj.get(key)
  if not isinstance(v, str):
    probs.add("wrong_type", f"{where}.{key}: expected a string, got {_type_name(v)}")
  elif not allow_empty and not v.strip():
    probs.add("empty_text", f"{where}.{key}: empty string")


def _is_int(v: Any) -> bool:
  """Return whether `v` is a JSON integer (bools are not ranks)."""
  return isinstance(v, int) and not isinstance(v, bool)


def _check_ranks(ranks: list, where: str, what: str, probs: _Problems):
  """Check that the int ranks in `ranks` form a complete permutation of 1..n."""
  if any(r is None for r in ranks):
    return  # the wrong-typed rank is already reported
  if sorted(ranks) != list(range(1, len(ranks) + 1)):
    probs.add("rank_not_permutation",
              f"{where}: {what} ranks {sorted(ranks)} are not a permutation of 1..{len(ranks)}")


def _check_role(v: Any, where: str, probs: _Problems):
  """Check that `v` is a distribution over the three roles."""
  if not isinstance(v, list):
    probs.add("wrong_type", f"{where}.role: expected a list of {NUM_ROLES} numbers, got {_type_name(v)}")
    return
  if len(v) != NUM_ROLES:
    probs.add("role_not_simplex", f"{where}.role: expected {NUM_ROLES} probabilities, got {len(v)}")
    return
  if not all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in v):
    probs.add("wrong_type", f"{where}.role: expected numbers, got {[_type_name(p) for p in v]}")
    return
  # Python ints can exceed the float range; float() of those raises OverflowError.
  try:
    vals = [float(p) for p in v]
  except OverflowError:
    probs.add("role_not_simplex", f"{where}.role: {v} has a value out of float range")
    return
  if not all(math.isfinite(p) for p in vals):
    probs.add("role_not_simplex", f"{where}.role: {v} is not finite")
  elif min(vals) < 0.0:
    probs.add("role_not_simplex", f"{where}.role: {v} has a negative probability")
  elif abs(math.fsum(vals) - 1.0) > ROLE_SUM_TOL:
    probs.add("role_not_simplex", f"{where}.role: {v} sums to {math.fsum(vals):.6g}, not 1")


def _check_sentence(s: Any, where: str, probs: _Problems) -> Optional[int]:
  """Check one sentence; return its rank when it is an int, else None."""
  if not isinstance(s, dict):
    probs.add("wrong_type", f"{where}: expected an object, got {_type_name(s)}")
    return None
  _check_keys(s, ("text", "rank", "role"), where, probs)
  if "text" in s:
    _check_text(s, "text", where, probs)
  if "role" in s:
    _check_role(s["role"], where, probs)
  rank = s.get("rank")
  if "rank" in s and not _is_int(rank):
    probs.add("wrong_type", f"{where}.rank: expected an integer, got {_type_name(rank)}")
  return rank if _is_int(rank) else None


def _check_passage(p: Any, where: str, probs: _Problems) -> Optional[int]:
  """Check one passage and its sentences; return its rank when it is an int, else None."""
  if not isinstance(p, dict):
    probs.add("wrong_type", f"{where}: expected an object, got {_type_name(p)}")
    return None
  _check_keys(p, ("id", "title", "rank", "sentences"), where, probs)
  if "id" in p:
    _check_text(p, "id", where, probs)
  if "title" in p:
    _check_text(p, "title", where, probs, allow_empty=True)
  rank = p.get("rank")
  if "rank" in p and not _is_int(rank):
    probs.add("wrong_type", f"{where}.rank: expected an integer, got {_type_name(rank)}")
  sents = p.get("sentences")
  if "sentences" in p:
    if not isinstance(sents, list):
      probs.add("wrong_type", f"{where}.sentences: expected a list, got {_type_name(sents)}")
    elif not sents:
      probs.add("no_sentences", f"{where}: passage has no sentences")
    else:
      ranks = [_check_sentence(s, f"{where}.sentences[{j}]", probs) for j, s in enumerate(sents)]
      _check_ranks(ranks, f"{where}.sentences", "sentence", probs)
  return rank if _is_int(rank) else None


def _record_problems(obj: Any) -> list[tuple[str, str]]:
  """Return every (violation class, message) of one parsed JSON value."""
  probs = _Problems()
  if not isinstance(obj, dict):
    probs.add("wrong_type", f"record: expected a JSON object, got {_type_name(obj)}")
    return probs.items
  _check_keys(obj, ("id", "question", "passages"), "record", probs)
  for key in ("id", "question"):
    if key in obj:
      _check_text(obj, key, "record", probs)
  passages = obj.get("passages")
  if "passages" in obj:
    if not isinstance(passages, list):
      probs.add("wrong_type", f"record.passages: expected a list, got {_type_name(passages)}")
    elif not passages:
      probs.add("no_passages", "record.passages: query has no passages")
    else:
      ranks = [_check_passage(p, f"passages[{i}]", probs) for i, p in enumerate(passages)]
      _check_ranks(ranks, "record.passages", "passage", probs)
      seen: dict[str, int] = {}
      for i, p in enumerate(passages):
        pid = p.get("id") if isinstance(p, dict) else None
        if isinstance(pid, str):
          if pid in seen:
            probs.add("duplicate_id",
                      f"passages[{i}].id: {pid!r} repeats passages[{seen[pid]}].id")
          else:
            seen[pid] = i
  return probs.items


def _build(obj: dict) -> TrainingRecord:
  """Build the dataclasses from an object that passed every check."""
  return TrainingRecord(
      id=obj["id"], question=obj["question"],
      passages=tuple(TrainingPassage(
          id=p["id"], title=p["title"], rank=p["rank"],
          sentences=tuple(TrainingSentence(
              text=s["text"], rank=s["rank"], role=tuple(float(x) for x in s["role"]))
              for s in p["sentences"]))
          for p in obj["passages"]))


def parse_training_record(obj: Any, where: str = "record") -> TrainingRecord:
  """Parse one decoded JSON value into a `TrainingRecord`.

  Args:
    obj: the value of one JSONL line.
    where: names the record in error messages (e.g. "train.jsonl:12").

  Returns:
    The validated record.

  Raises:
    DataError: `obj` breaks the schema; the message lists every problem found.
  """
  items = _record_problems(obj)
  if items:
    raise DataError(f"{where}: " + "; ".join(msg for _, msg in items))
  return _build(obj)


def _line_problems(raw: bytes) -> tuple[Any, list[tuple[str, str]]]:
  """Decode and check one line; return (parsed value or None, problems)."""
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    return None, [("non_utf8", f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})")]
  try:
    obj = json.loads(text)
  except (ValueError, RecursionError) as e:
    # ValueError beyond JSONDecodeError: an integer over Python's digit limit.
    reason = (e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply"
              if isinstance(e, RecursionError) else str(e).split(";")[0])
    col = f" at column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
    return None, [("malformed_json", f"malformed JSON: {reason}{col}")]
  try:
    return obj, _record_problems(obj)
  except RecursionError:
    return None, [("malformed_json", "malformed JSON: nested too deeply")]


def validate_training_file(path: str | os.PathLike, skip_invalid: bool = False
                           ) -> tuple[list[TrainingRecord], ValidationReport]:
  """Read and validate a training JSONL file, reporting every bad line by number.

  Args:
    path: the JSONL file, one training query per line.
    skip_invalid: when False (default) any bad line makes the call raise; when
      True bad lines are skipped and counted in the report.

  Returns:
    (records, report): the valid records in file order and the `ValidationReport`.

  Raises:
    DataError: the file cannot be read, or (unless `skip_invalid`) a line is
      invalid; the message counts the bad lines per class and quotes the first
      few as "file:line: reason". The exception carries `.report`.
  """
  path = os.fspath(path)
  report = ValidationReport(path=path)
  records: list[TrainingRecord] = []
  first_line_of_id: dict[str, int] = {}
  try:
    f = open(path, "rb")  # bytes: a non-UTF-8 line must be reported, not crash the decoder
  except OSError as e:
    raise DataError(f"{path}: cannot read training file ({e.strerror or e})") from None
  with f:
    for lineno, raw in enumerate(f, start=1):  # streamed: files may be large
      raw = raw.rstrip(b"\r\n")
      if not raw.strip():
        continue
      report.n_lines += 1
      obj, items = _line_problems(raw)
      if not items:
        qid = obj["id"]
        if qid in first_line_of_id:
          items = [("duplicate_id",
                    f"record.id: {qid!r} repeats the id of line {first_line_of_id[qid]}")]
        else:
          first_line_of_id[qid] = lineno
      if items:
        report.n_invalid += 1
        for kind in sorted({k for k, _ in items}, key=VIOLATIONS.index):
          report.counts[kind] += 1
        report.errors.append(f"{path}:{lineno}: " + "; ".join(msg for _, msg in items))
        continue
      records.append(_build(obj))
  report.n_records = len(records)
  if report.n_invalid and not skip_invalid:
    counts = ", ".join(f"{k}: {v}" for k, v in report.counts.items() if v)
    shown = " | ".join(report.errors[:_MAX_ERRORS_IN_MESSAGE])
    more = len(report.errors) - _MAX_ERRORS_IN_MESSAGE
    lines = ",".join(e[len(path) + 1:].split(":", 1)[0] for e in report.errors)
    err = DataError(
        f"{path}: {report.n_invalid} of {report.n_lines} lines invalid ({counts}); "
        f"bad lines: {lines}; first: {shown}" + (f" | ... and {more} more" if more > 0 else "")
        + " (pass skip_invalid=True to skip them)")
    err.report = report
    raise err
  return records, report


def write_training_file(path: str | os.PathLike, records: list[TrainingRecord]):
  """Write records as UTF-8 JSONL, one per line, after checking each against the schema."""
  with open(path, "w", encoding="utf-8") as f:
    for i, rec in enumerate(records):
      obj = rec.to_json()
      parse_training_record(obj, where=f"records[{i}] ({rec.id})")
      # Compact separators: the shipped demo data must stay small.
      f.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")
