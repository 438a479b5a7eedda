"""Reranking metrics (Recall / MAP / nDCG @k, the paper's definitions) and TREC run/qrels files.

Conventions (LoG-Reranker appendix; DESIGN.md section 7):
  * Gains are binary: a document is relevant iff it is in `qrels[qid]`.
  * G = number of relevant documents of a query; only queries of `qrels`
    with G >= 1 are averaged (macro average, every query weighs the same).
    Queries of `run` that are not in `qrels` are ignored.
  * A query of `qrels` missing from `run` (or with an empty ranking) scores 0.
  * Recall@k = (relevant documents in the top k) / G.
  * AP@k = sum_{i<=k} g_i * P(i) / min(G, k), with P(i) the precision of the
    top i.  (trec_eval's AP divides by G instead; the two differ when G > k.)
  * nDCG@k = DCG@k / IDCG@k with DCG@k = sum_{i<=k} g_i / log2(i + 1) and the
    ideal DCG of min(G, k) relevant documents at ranks 1..min(G, k).
  * All three are returned in percent (0-100).
  * A ranking that lists the same document twice is an error (`DataError`):
    deduplicating silently would change what was evaluated.

Run files are TREC format, `qid Q0 docid rank score tag`, written in order of
decreasing score with ties broken by ascending doc id (the same order
`ranking_from_scores` uses).  Qrels files are `qid 0 docid rel`; a document is
relevant iff rel > 0, and a query whose judgements are all 0 is kept with an
empty relevant set (so it is skipped by the metrics, not lost).
"""

import math
import os
from typing import Any, Hashable, Mapping, Sequence

from logrerank_jax.errors import DataError


def _check_run(run: Mapping[str, Sequence[str]]) -> None:
  """Raise DataError on a run that is not {qid: [docid, ...]} or repeats a doc id."""
  if not isinstance(run, Mapping):
    raise DataError(f"run must be a dict {{qid: [docid, ...]}}, got {type(run).__name__}")
  for qid, docs in run.items():
    if isinstance(docs, (str, bytes)) or not isinstance(docs, Sequence):
      raise DataError(f"run[{qid!r}] must be a list of doc ids, got {type(docs).__name__}")
    seen = set()
    for d in docs:
      if not isinstance(d, Hashable):
        raise DataError(f"run[{qid!r}] holds {d!r}, which is not a doc id")
      if d in seen:
        raise DataError(f"run[{qid!r}] lists doc id {d!r} twice")
      seen.add(d)


def query_metrics(ranking: Sequence[str], relevant: set, k: int = 10) -> dict[str, float]:
  """Return recall@k, ap@k and ndcg@k (fractions in [0, 1]) of one ranking.

  Args:
    ranking: doc ids, best first, no duplicates.
    relevant: the relevant doc ids (G = len(relevant) >= 1).
    k: cut-off.

  Returns:
    {"recall": r, "ap": ap, "ndcg": n}.
  """
  g_total = len(relevant)
  if g_total < 1:
    raise DataError("query_metrics needs at least one relevant document")
  hits = 0
  ap = 0.0
  dcg = 0.0
  for i, doc in enumerate(list(ranking)[:k], start=1):
    if doc in relevant:
      hits += 1
      ap += hits / i  # g_i * P(i)
      dcg += 1.0 / math.log2(i + 1)
  ideal = sum(1.0 / math.log2(i + 1) for i in range(1, min(g_total, k) + 1))
  return {"recall": hits / g_total, "ap": ap / min(g_total, k), "ndcg": dcg / ideal}


def rerank_metrics(run: Mapping[str, Sequence[str]], qrels: Mapping[str, set],
                   k: int = 10) -> dict[str, float]:
  """Macro-averaged Recall@k, MAP@k and nDCG@k in percent (conventions in the module docstring).

  Args:
    run: {qid: [docid, ...]} rankings, best first.
    qrels: {qid: set of relevant docids}.
    k: cut-off.

  Returns:
    {"recall@k": ..., "map@k": ..., "ndcg@k": ...} in percent.

  Raises:
    DataError: malformed inputs, a duplicate doc id in a ranking, or no query with G >= 1.
  """
  if not isinstance(k, int) or k < 1:
    raise DataError(f"k must be a positive int, got {k!r}")
  _check_run(run)
  if not isinstance(qrels, Mapping):
    raise DataError(f"qrels must be a dict {{qid: set of docids}}, got {type(qrels).__name__}")
  totals = {"recall": 0.0, "ap": 0.0, "ndcg": 0.0}
  n = 0
  for qid, rel in qrels.items():
    if isinstance(rel, (str, bytes)):
      raise DataError(f"qrels[{qid!r}] must be a set of doc ids, got a string")
    try:
      rel = set(rel)
    except TypeError:  # not iterable, or holds unhashable values
      raise DataError(f"qrels[{qid!r}] must be a set of doc ids, got {rel!r:.80}") from None
    if not rel:
      continue
    n += 1
    ranking = run.get(qid)
    if not ranking:
      continue  # missing query scores 0
    for name, v in query_metrics(ranking, rel, k).items():
      totals[name] += v
  if n == 0:
    raise DataError("qrels has no query with a relevant document; metrics are undefined")
  return {f"recall@{k}": 100.0 * totals["recall"] / n,
          f"map@{k}": 100.0 * totals["ap"] / n,
          f"ndcg@{k}": 100.0 * totals["ndcg"] / n}


def ranking_from_scores(scores: Mapping[str, float]) -> list[str]:
  """Return doc ids by decreasing score, ties broken by ascending doc id."""
  return [d for d, _ in sorted(scores.items(), key=lambda kv: (-float(kv[1]), kv[0]))]


def run_from_scores(scores: Mapping[str, Mapping[str, float]]) -> dict[str, list[str]]:
  """Turn {qid: {docid: score}} into rankings {qid: [docid, ...]}."""
  return {qid: ranking_from_scores(s) for qid, s in scores.items()}


def _check_id(value, what: str) -> str:
  """Return `value` if it is a non-empty id without whitespace, else raise DataError."""
  if not isinstance(value, str) or not value or any(c.isspace() for c in value):
    raise DataError(f"{what} {value!r} must be a non-empty string without whitespace (TREC format)")
  return value


def write_trec_run(path: str, scores: Mapping[str, Mapping[str, float]], tag: str = "logrerank") -> None:
  """Write a TREC run file `qid Q0 docid rank score tag`.

  Args:
    path: output file.
    scores: {qid: {docid: score}}; each query's docs are written by decreasing score
      (ties: ascending doc id), ranks starting at 1.
    tag: run name (no whitespace).
  """
  _check_id(tag, "run tag")
  lines = []
  for qid, s in scores.items():
    _check_id(qid, "query id")
    for rank, doc in enumerate(ranking_from_scores(s), start=1):
      _check_id(doc, f"doc id of query {qid!r}:")
      score = float(s[doc])
      if not math.isfinite(score):
        raise DataError(f"score of query {qid!r} doc {doc!r} is {score}")
      lines.append(f"{qid} Q0 {doc} {rank} {score!r} {tag}\n")
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(lines)


def _text_lines(path: str):
  """Yield (line number, text) of the non-blank lines of a UTF-8 file, as DataError on bad bytes."""
  try:
    f = open(path, "rb")
  except OSError as e:
    raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
  with f:
    for lineno, raw in enumerate(f, start=1):
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise DataError(f"{path}:{lineno}: not UTF-8 (byte 0x{raw[e.start]:02x} at column "
                        f"{e.start + 1})") from None
      if line.strip():
        yield lineno, line


def read_trec_run(path: str) -> dict[str, dict[str, float]]:
  """Read a TREC run file into {qid: {docid: score}} (ranks are recomputed from scores).

  Raises:
    DataError: a malformed line or a doc listed twice for one query, naming file and line.
  """
  out: dict[str, dict[str, float]] = {}
  for lineno, line in _text_lines(path):
    parts = line.split()
    if len(parts) != 6:
      raise DataError(f"{path}:{lineno}: expected 'qid Q0 docid rank score tag', got {line.strip()!r}")
    qid, _, doc, _, score, _ = parts
    try:
      value = float(score)
    except ValueError as e:
      raise DataError(f"{path}:{lineno}: score {score!r} is not a number") from e
    if not math.isfinite(value):
      # A NaN score has no place in a ranking (sorting by it is undefined).
      raise DataError(f"{path}:{lineno}: score {score!r} is not finite")
    docs = out.setdefault(qid, {})
    if doc in docs:
      raise DataError(f"{path}:{lineno}: doc {doc!r} listed twice for query {qid!r}")
    docs[doc] = value
  return out


def write_qrels(path: str, qrels: Mapping[str, set]) -> None:
  """Write binary qrels `qid 0 docid 1`, queries and docs in sorted order."""
  lines = []
  for qid in sorted(qrels):
    _check_id(qid, "query id")
    for doc in sorted(qrels[qid]):
      _check_id(doc, f"doc id of query {qid!r}:")
      lines.append(f"{qid} 0 {doc} 1\n")
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(lines)


def read_qrels(path: str) -> dict[str, set]:
  """Read a qrels file `qid iter docid rel` into {qid: set of docids with rel > 0}.

  Raises:
    DataError: a malformed line, naming file and line.
  """
  out: dict[str, set] = {}
  for lineno, line in _text_lines(path):
    parts = line.split()
    if len(parts) != 4:
      raise DataError(f"{path}:{lineno}: expected 'qid 0 docid rel', got {line.strip()!r}")
    qid, _, doc, rel = parts
    try:
      rel_value = float(rel)
    except ValueError as e:
      raise DataError(f"{path}:{lineno}: relevance {rel!r} is not a number") from e
    if not math.isfinite(rel_value):
      raise DataError(f"{path}:{lineno}: relevance {rel!r} is not finite")
    docs = out.setdefault(qid, set())
    if rel_value > 0:
      docs.add(doc)
  return out


# ----------------------------------------------------------------------------- role head

def role_confusion(gold: Sequence[int], pred: Sequence[int], num_classes: int) -> list[list[int]]:
  """Confusion matrix `m[g][p]`: how many items of gold class g were predicted p."""
  if len(gold) != len(pred):
    raise ValueError(f"role_confusion: {len(gold)} gold labels but {len(pred)} predictions")
  m = [[0] * num_classes for _ in range(num_classes)]
  for g, p in zip(gold, pred):
    m[int(g)][int(p)] += 1
  return m


def classification_report(confusion: Sequence[Sequence[int]]) -> dict[str, Any]:
  """Per-class precision, recall and F1, their macro mean and accuracy, from a confusion matrix
  (`role_confusion`). A class never predicted has precision 0; never present, recall 0 (and is
  still one of the classes macro-F1 averages over, as scikit-learn's `f1_score(average="macro")`
  with `labels` given)."""
  n = len(confusion)
  total = sum(sum(row) for row in confusion)
  per_class = []
  for c in range(n):
    tp = confusion[c][c]
    predicted = sum(confusion[g][c] for g in range(n))
    present = sum(confusion[c])
    p = tp / predicted if predicted else 0.0
    r = tp / present if present else 0.0
    per_class.append({"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0,
                      "support": present})
  return {"per_class": per_class, "macro_f1": sum(c["f1"] for c in per_class) / n,
          "accuracy": sum(confusion[c][c] for c in range(n)) / total if total else 0.0,
          "n": total}
