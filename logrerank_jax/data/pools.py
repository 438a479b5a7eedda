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

import json
from typing import Mapping, Optional, Sequence

from logrerank_jax.data.bm25 import BM25Index
from logrerank_jax.data.sentences import split_sentence_texts
from logrerank_jax.errors import ConfigError, DataError


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


def expand_pools(pool_records: Sequence[dict],
                 corpus: Sequence[dict] | Mapping[str, dict]) -> list[dict]:
  """Resolve id-only pools (`{"id", "input", "ctx_ids": [...]}`, as `tools/build_demo_data.py`
  ships them) into OpenScholar pools with full ctxs from `corpus`: entries `{"id", "title",
  "text"}`, or `read_corpus`'s {id: entry}. Each pool as `resolve_pool` resolves it.

  Records that carry `ctxs` (and no `ctx_ids`) pass through unchanged.

  Raises:
    DataError: a corpus entry is not an object with an id, or an id repeats; a pool names a
      passage id the corpus lacks, or carries both `ctxs` and `ctx_ids` (names the pool).
  """
  by_id = corpus if isinstance(corpus, Mapping) else index_corpus(corpus)
  return [resolve_pool(rec, by_id, where=f"pool {n}")
          for n, rec in enumerate(pool_records, start=1)]


def _json_lines(path: str, what: str):
  """(line number, JSON value) of each non-blank line of `path`.

  Raises:
    DataError: the file cannot be read ("cannot read `what` ..."), or a line is not JSON (names
      the file and line).
  """
  try:
    f = open(path, encoding="utf-8")
  except OSError as e:
    raise DataError(f"cannot read {what} {path} ({e.strerror or e})") from None
  with f:
    for n, line in enumerate(f, start=1):
      if line.strip():
        try:
          value = json.loads(line)
        except ValueError as e:
          raise DataError(f"{path}:{n}: malformed JSON ({e})") from None
        yield n, value


def _index_by_id(located) -> dict[str, dict]:
  """{id as a string: entry} of (where, entry) pairs; `where` names an entry in its error."""
  by_id: dict[str, dict] = {}
  for where, entry in located:
    pid = entry.get("id") if isinstance(entry, dict) else None
    if isinstance(pid, bool) or not isinstance(pid, (str, int)):
      raise DataError(f"{where}: expected a JSON object with an 'id' (string or integer)")
    if str(pid) in by_id:
      raise DataError(f"{where}: passage id {str(pid)!r} repeats")
    by_id[str(pid)] = entry
  return by_id


def index_corpus(entries: Sequence[dict], source: str = "corpus") -> dict[str, dict]:
  """Corpus entries `{"id", "title", "text"}` as {id as a string: entry}, as `read_corpus`.

  Raises:
    DataError: an entry is not an object with an `id` (string or integer), or an id repeats
      (names `source` and the entry's position, from 1).
  """
  return _index_by_id((f"{source} entry {n}", e) for n, e in enumerate(entries, start=1))


def read_pool_file(path: str) -> list:
  """The JSON values of a pool file's non-blank lines (`expand_pools` and the pool readers
  check what they hold).

  Raises:
    DataError: the file cannot be read, or a line is not JSON (names the file and line).
  """
  return [value for _, value in _json_lines(path, "pools")]


def read_corpus(path: str) -> dict[str, dict]:
  """Read a passage corpus, JSONL `{"id", "title", "text"}`, into {id as a string: entry}.

  Raises:
    DataError: the file cannot be read, or a line is not a JSON object with an `id` (string or
      integer), or an id repeats (names the file and line).
  """
  return _index_by_id((f"{path}:{n}", e) for n, e in _json_lines(path, "corpus"))


def resolve_pool(rec: dict, by_id: Mapping[str, dict], where: str = "record") -> dict:
  """One id-only pool (`ctx_ids`) with its passages from a corpus (`read_corpus`); a record
  without `ctx_ids` is returned unchanged.

  Raises:
    DataError: `ctx_ids` is not a list, or names a passage the corpus lacks (names `where`, the
      record's id and the first missing passage id), or the record also carries `ctxs` (which
      of the two is the pool would be a guess).
  """
  if "ctx_ids" not in rec:
    return rec
  ids = rec["ctx_ids"]
  if not isinstance(ids, list):
    raise DataError(f"{where}: 'ctx_ids' must be a list of passage ids, got {type(ids).__name__}")
  if "ctxs" in rec:
    raise DataError(f"{where}: pool {rec.get('id')!r} has both 'ctxs' and 'ctx_ids'; give one")
  missing = [i for i in ids if str(i) not in by_id]
  if missing:
    raise DataError(f"{where}: pool {rec.get('id')!r}: passage id {str(missing[0])!r} is not in "
                    f"the corpus ({len(missing)} of its {len(ids)} ids missing)")
  # A corpus entry without a text gives a passage without one: the reader skips that passage
  # with its reason, as it skips any unusable passage.
  ctxs = [{"id": str(i), "title": by_id[str(i)].get("title", "")}
          | ({"text": by_id[str(i)]["text"]} if "text" in by_id[str(i)] else {}) for i in ids]
  return {k: v for k, v in rec.items() if k != "ctx_ids"} | {"ctxs": ctxs}


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
