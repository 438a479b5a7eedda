"""Deterministic evaluation pools for ScholarQABench single-paper files (gold + BM25 negatives).

Construction (no randomness, so the same file always gives the same pools):
  1. Corpus: the gold passages of ALL records of the file, deduplicated by
     (title, text) in first-occurrence order; unique passage i gets id "p{i}".
     (SciFact reuses one abstract as the gold of several claims: without the
     dedup such an abstract could be a "negative" of a query it answers.)
  2. BM25 (`logrerank_jax.data.bm25`, k1 = 1.5, b = 0.75) over "title text" of
     the corpus.
  3. For each query: positives = its own gold passages; negatives = the
     top (pool_size - #positives) corpus passages by BM25 for the query text,
     excluding its positives (so negatives are other queries' gold contexts).
  4. Pool order: all members sorted by decreasing BM25 score, ties by
     ascending passage index -- the gold is NOT always first (that would leak
     the label to position-sensitive rerankers).
A corpus smaller than the pool size gives smaller pools.  `limit` keeps the
first `limit` queries but still draws negatives from the whole file.

Output records follow OpenScholar's inference format:
  {"id": qid, "input": query, "answer": answer,
   "ctxs": [{"id", "title", "text", "label": 0/1, "bm25": score}, ...]}
and qrels {qid: {gold passage ids}}.
"""

from typing import Optional, Sequence

from logrerank_jax.data.bm25 import BM25Index
from logrerank_jax.errors import ConfigError


def build_eval_pools(records: Sequence[dict], pool_size: int = 50,
                     limit: Optional[int] = None) -> tuple[list[dict], dict[str, set]]:
  """Build BM25 evaluation pools from `read_scholarqabench` records.

  Args:
    records: output of `logrerank_jax.data.scholarqabench.read_scholarqabench`.
    pool_size: candidates per query (positives included).
    limit: keep only the first `limit` queries (None: all).

  Returns:
    (pools, qrels): OpenScholar-style records and {qid: set of relevant passage ids}.

  Raises:
    ConfigError: pool_size < 1, limit < 0, or a query with more gold passages than pool_size.
  """
  if pool_size < 1:
    raise ConfigError(f"pool_size must be >= 1, got {pool_size}")
  if limit is not None and limit < 0:
    raise ConfigError(f"limit must be >= 0, got {limit}")
  corpus: list[dict] = []
  index_of: dict[tuple[str, str], int] = {}
  gold_of: list[list[int]] = []
  for rec in records:
    gold = []
    for p in rec["gold"]:
      key = (p["title"], p["text"])
      if key not in index_of:
        index_of[key] = len(corpus)
        corpus.append(p)
      if index_of[key] not in gold:
        gold.append(index_of[key])
    gold_of.append(gold)
  bm25 = BM25Index([f"{p['title']} {p['text']}".strip() for p in corpus])

  selected = records if limit is None else records[:limit]
  pools, qrels = [], {}
  for rec, gold in zip(selected, gold_of):
    if len(gold) > pool_size:
      raise ConfigError(f"query {rec['qid']} has {len(gold)} gold passages, more than pool_size={pool_size}")
    scores = bm25.scores(rec["query"])  # [D]
    negatives = bm25.top_k(rec["query"], pool_size - len(gold), exclude=gold)
    members = sorted(gold + negatives, key=lambda i: (-scores[i], i))
    gold_set = set(gold)
    ctxs = [{"id": f"p{i}", "title": corpus[i]["title"], "text": corpus[i]["text"],
             "label": int(i in gold_set), "bm25": float(scores[i])} for i in members]
    pools.append({"id": rec["qid"], "input": rec["query"], "answer": rec["answer"], "ctxs": ctxs})
    qrels[rec["qid"]] = {f"p{i}" for i in gold}
  return pools, qrels


def expand_pools(pool_records: Sequence[dict], corpus: Sequence[dict]) -> list[dict]:
  """Resolve id-only pools (`{"id", "input", "ctx_ids": [...]}`, as `tools/build_demo_data.py`
  ships them) into OpenScholar pools with full ctxs from `corpus` (`{"id", "title", "text"}`).

  Records that already carry `ctxs` pass through unchanged.

  Raises:
    ConfigError: a pool names a passage id the corpus lacks.
  """
  by_id = {str(c["id"]): c for c in corpus}
  out = []
  for rec in pool_records:
    if "ctx_ids" not in rec:
      out.append(rec)
      continue
    missing = [i for i in rec["ctx_ids"] if str(i) not in by_id]
    if missing:
      raise ConfigError(f"pool {rec.get('id')!r}: passage ids not in the corpus: {missing[:5]}")
    ctxs = [{"id": str(i), "title": by_id[str(i)].get("title", ""), "text": by_id[str(i)]["text"]}
            for i in rec["ctx_ids"]]
    out.append({k: v for k, v in rec.items() if k != "ctx_ids"} | {"ctxs": ctxs})
  return out
