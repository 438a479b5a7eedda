"""Reader of ScholarQABench single-paper task files (SciFact, PubMedQA) into plain records.

Each JSONL line `{"input": str, "gold_ctx": [{"title", "text"}], "answer": str}`
becomes `{"qid", "query", "answer", "gold": [Passage, ...]}` where `qid` is the
0-based index of the record in the file (as a string) and a Passage is
`{"title": str, "text": str, "sections": [(label or None, paragraph), ...]}`.
PubMedQA's dict texts `{"contexts": [...], "labels": [...], ...}` become
`text` = paragraphs joined by "\n" with `sections` = (label, paragraph) pairs
(an empty label becomes None); plain string texts get `sections=[(None, text)]`.
A missing `answer` becomes None.  Anything else malformed raises `DataError`
naming the file and line.
"""

import json
from typing import Any

from logrerank_jax.errors import DataError


def _passage(ctx: Any, where: str) -> dict:
  """Convert one gold context to a Passage dict."""
  if not isinstance(ctx, dict):
    raise DataError(f"{where}: gold context must be an object, got {type(ctx).__name__}")
  title = ctx.get("title", "")
  if title is None:
    title = ""
  if not isinstance(title, str):
    raise DataError(f"{where}: title must be a string, got {type(title).__name__}")
  text = ctx.get("text")
  if isinstance(text, str):
    return {"title": title, "text": text, "sections": [(None, text)]}
  if isinstance(text, dict):
    paras = text.get("contexts")
    labels = text.get("labels", [None] * len(paras) if isinstance(paras, list) else None)
    if not isinstance(paras, list) or not all(isinstance(p, str) for p in paras):
      raise DataError(f"{where}: text.contexts must be a list of strings")
    if not isinstance(labels, list) or len(labels) != len(paras):
      raise DataError(f"{where}: text.labels must be a list as long as text.contexts ({len(paras)})")
    if not all(lab is None or isinstance(lab, str) for lab in labels):
      raise DataError(f"{where}: text.labels must hold strings")
    sections = [(lab or None, p) for lab, p in zip(labels, paras)]
    return {"title": title, "text": "\n".join(paras), "sections": sections}
  raise DataError(f"{where}: text must be a string or a {{'contexts', 'labels'}} object, "
                  f"got {type(text).__name__}")


def read_scholarqabench(path: str) -> list[dict]:
  """Read a ScholarQABench single-paper JSONL file.

  Args:
    path: e.g. `scifact_test.jsonl` or `pubmed_test.jsonl`.

  Returns:
    One record per non-empty line: {"qid", "query", "answer", "gold": [Passage, ...]}.

  Raises:
    DataError: unreadable JSON or a record without the expected fields (names file and line).
  """
  records = []
  try:
    f = open(path, "rb")  # bytes: a non-UTF-8 line is reported by number, not as a decoder crash
  except OSError as e:
    raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
  with f:
    for lineno, raw in enumerate(f, start=1):
      where = f"{path}:{lineno}"
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise DataError(f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
                        ) from None
      if not line.strip():
        continue
      try:
        rec = json.loads(line)
      except json.JSONDecodeError as e:
        raise DataError(f"{where}: invalid JSON ({e.msg})") from e
      except (ValueError, RecursionError) as e:
        # An integer over Python's digit limit, or nesting deeper than the stack.
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e).split(";")[0]
        raise DataError(f"{where}: invalid JSON ({reason})") from None
      if not isinstance(rec, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
      query = rec.get("input")
      if not isinstance(query, str) or not query.strip():
        raise DataError(f"{where}: missing or empty 'input' (the query)")
      gold = rec.get("gold_ctx")
      if not isinstance(gold, list) or not gold:
        raise DataError(f"{where}: 'gold_ctx' must be a non-empty list")
      answer = rec.get("answer")
      if answer is not None and not isinstance(answer, str):
        raise DataError(f"{where}: 'answer' must be a string")
      records.append({
          "qid": str(len(records)), "query": query, "answer": answer,
          "gold": [_passage(c, f"{where} gold_ctx[{i}]") for i, c in enumerate(gold)]})
  return records
