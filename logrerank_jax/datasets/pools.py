"""Deterministic evaluation pools for ScholarQABench single-paper files (gold + BM25 negatives).

Construction (no randomness, so the same file always gives the same pools):
  1. Corpus: the gold passages of ALL records of the file, deduplicated by
     (title, text) in first-occurrence order; unique passage i gets id "p{i}".
     (SciFact reuses one abstract as the gold of several claims: without the
     dedup such an abstract could be a "negative" of a query it answers.)
  2. BM25 (`logrerank_jax.datasets.bm25`, k1 = 1.5, b = 0.75) over "title text" of
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

from logrerank_jax.datasets.bm25 import BM25Index
from logrerank_jax.data.sentences import split_sentence_texts
from logrerank_jax.errors import ConfigError


def build_eval_pools(records: Sequence[dict], pool_size: int = 50,
                     limit: Optional[int] = None) -> tuple[list[dict], dict[str, set]]:
  """Build BM25 evaluation pools from `read_scholarqabench` records.

  Args:
    records: output of `logrerank_jax.datasets.scholarqabench.read_scholarqabench`.
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


def chunk_passages(text: str, sentences_per_chunk: int) -> list[str]:
  """Cut a text into consecutive chunks of `sentences_per_chunk` sentences (the last may be
  shorter; a last chunk of one sentence joins the one before), sentences from
  `split_sentence_texts`, joined with one space."""
  sents = split_sentence_texts(text)
  chunks = [sents[i:i + sentences_per_chunk] for i in range(0, len(sents), sentences_per_chunk)]
  if len(chunks) > 1 and len(chunks[-1]) == 1 and sentences_per_chunk > 1:
    tail = chunks.pop()
    chunks[-1] = chunks[-1] + tail
  return [" ".join(c) for c in chunks]


def build_chunk_pools(records: Sequence[dict], query_indices: Sequence[int],
                      sentences_per_chunk: int = 3, pool_size: int = 50
                      ) -> tuple[list[dict], dict[str, set], list[dict]]:
  """Snippet-sized evaluation pools from a single-paper file (SciFact): passages are chunks of
  a few sentences of the gold abstracts, as ScholarQA-CS's evidence snippets are excerpts.

  Construction (deterministic): the file's gold abstracts, deduplicated by (title, text) in
  first-occurrence order, are cut into chunks (`chunk_passages`); chunk j of abstract i has id
  "c{i}:{j}". A query's gold is every chunk of its gold abstract(s) (weak: the chunks of the
  paper the claim is about, not the sentences that support it); its negatives are the BM25
  top chunks (over all chunks, title not indexed: a snippet has none) of other abstracts; the
  pool is in decreasing BM25 order, ties by corpus position.

  Args:
    records: `read_scholarqabench` output.
    query_indices: the queries to build pools for (0-based record indices), in output order.
    sentences_per_chunk: sentences per chunk.
    pool_size: passages per pool.

  Returns:
    (id-only pools {"id", "input", "ctx_ids"}, qrels, corpus [{"id", "title": "", "text"}]).
  """
  if sentences_per_chunk < 1 or pool_size < 1:
    raise ConfigError("sentences_per_chunk and pool_size must be >= 1")
  abstract_of: dict[tuple[str, str], int] = {}
  chunks_of: list[list[int]] = []
  corpus: list[dict] = []
  gold_of = []
  for rec in records:
    gold = []
    for p in rec["gold"]:
      key = (p["title"], p["text"])
      if key not in abstract_of:
        abstract_of[key] = len(chunks_of)
        ids = []
        for j, text in enumerate(chunk_passages(p["text"], sentences_per_chunk)):
          ids.append(len(corpus))
          corpus.append({"id": f"c{abstract_of[key]}:{j}", "title": "", "text": text})
        chunks_of.append(ids)
      gold += [c for c in chunks_of[abstract_of[key]] if c not in gold]
    gold_of.append(gold)
  bm25 = BM25Index([c["text"] for c in corpus])
  pools, qrels = [], {}
  for qi in query_indices:
    rec, gold = records[qi], gold_of[qi]
    if len(gold) >= pool_size:
      raise ConfigError(f"query {rec['qid']} has {len(gold)} gold chunks, pool_size={pool_size}")
    scores = bm25.scores(rec["query"])
    negatives = bm25.top_k(rec["query"], pool_size - len(gold), exclude=gold)
    members = sorted(gold + negatives, key=lambda i: (-scores[i], i))
    pools.append({"id": rec["qid"], "input": rec["query"],
                  "ctx_ids": [corpus[i]["id"] for i in members]})
    qrels[rec["qid"]] = {corpus[i]["id"] for i in gold}
  return pools, qrels, corpus
