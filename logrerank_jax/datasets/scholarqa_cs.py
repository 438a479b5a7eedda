"""50-passage evaluation pools from ScholarQA-CS (`scholarqa_cs_test_configs_snippets.json`).

ScholarQA-CS is ScholarQABench's multi-paper synthesis set: 110 computer-science questions,
each with expert rubric items and, under the items, the evidence snippets an expert answer
should draw on. As in the paper's ScholarQABench-Rerank, a question's evidence snippets are its
pseudo-gold passages. The construction (no randomness; the same file gives the same pools):

  1. Question: `initial_prompt` (equal to `metric_config.config.question` in the file); its
     id is the record's `case_id`.
  2. Snippets: every string of `metric_config.config.other_properties[*].evidence`, in file
     order (items in rubric order, the most important first), whitespace collapsed to single
     spaces (the words are unchanged). A question's snippets are deduplicated by that text.
  3. Gold cap: a question's first `max_gold` (default 25) snippets in that order are its gold;
     the rest of its own snippets are left out of its pool entirely (relevant, so never a
     negative; left out, so every pool keeps at least pool_size - max_gold negatives).
     Without a cap the 39-snippet questions would hold 78 % gold.
  4. Corpus: every distinct snippet of the file, in first-occurrence order; snippet k has id
     "cs:k". A snippet under two questions is one passage, gold for both.
  5. Negatives: BM25 (`datasets.bm25`, k1 = 1.5, b = 0.75) over the corpus, the top
     (pool_size - gold) snippets for the question that are not its own (so other questions'
     evidence), ties to the lower index.
  6. Pool order: all members by decreasing corpus BM25 score, ties by ascending index: the pool
     is the first-stage ranking of a BM25 retriever over the whole corpus (the gold is placed
     where that retriever puts it, never first by construction).

Use: evaluation only. The project never trains on these questions or selects checkpoints on
them; the pools measure whether a recipe trained on other data generalises (README).
"""

import dataclasses
import json
import os
from typing import Optional, Sequence

from logrerank_jax.datasets.bm25 import BM25Index
from logrerank_jax.errors import ConfigError, DataError

DEFAULT_MAX_GOLD = 25
DEFAULT_POOL_SIZE = 50


@dataclasses.dataclass(frozen=True)
class CsQuestion:
  """One ScholarQA-CS question and its deduplicated evidence snippets, in rubric order."""
  qid: str
  question: str
  snippets: tuple


def _clean(text: str) -> str:
  """Collapse runs of whitespace to one space and strip the ends (words unchanged)."""
  return " ".join(text.split())


def read_scholarqa_cs(path: str | os.PathLike) -> list[CsQuestion]:
  """Read the ScholarQA-CS test configs (a JSON list, not JSONL) into questions with snippets.

  Raises:
    DataError: unreadable JSON, or a record, question, item or snippet of the wrong shape
      (the message names the record index and the field).
  """
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, ValueError) as e:
    raise DataError(f"{path}: cannot read ScholarQA-CS configs ({e})") from None
  if not isinstance(data, list) or not data:
    raise DataError(f"{path}: expected a non-empty JSON list of test configs")
  out, seen = [], set()
  for i, rec in enumerate(data):
    where = f"{path}: record {i}"
    if not isinstance(rec, dict):
      raise DataError(f"{where}: expected an object, got {type(rec).__name__}")
    qid, question = rec.get("case_id"), rec.get("initial_prompt")
    if not isinstance(qid, str) or not qid:
      raise DataError(f"{where}: 'case_id' must be a non-empty string")
    if qid in seen:
      raise DataError(f"{where}: case_id {qid!r} repeats an earlier record's")
    seen.add(qid)
    if not isinstance(question, str) or not question.strip():
      raise DataError(f"{where}: 'initial_prompt' must be a non-empty string")
    items = ((rec.get("metric_config") or {}).get("config") or {}).get("other_properties")
    if not isinstance(items, list):
      raise DataError(f"{where}: metric_config.config.other_properties must be a list")
    snippets = []
    for j, item in enumerate(items):
      if not isinstance(item, dict):
        raise DataError(f"{where}: other_properties[{j}] must be an object")
      evidence = item.get("evidence")
      if evidence is None:
        evidence = []  # an item without evidence (the file's README: some have none)
      if not isinstance(evidence, list):
        raise DataError(f"{where}: other_properties[{j}].evidence must be a list")
      for k, s in enumerate(evidence):
        if not isinstance(s, str) or not s.strip():
          raise DataError(f"{where}: other_properties[{j}].evidence[{k}] must be a non-empty "
                          "string")
        s = _clean(s)
        if s not in snippets:
          snippets.append(s)
    if not snippets:
      raise DataError(f"{where}: question {qid!r} has no evidence snippet")
    out.append(CsQuestion(qid=qid, question=question.strip(), snippets=tuple(snippets)))
  return out


def build_cs_pools(questions: Sequence[CsQuestion], pool_size: int = DEFAULT_POOL_SIZE,
                   max_gold: int = DEFAULT_MAX_GOLD
                   ) -> tuple[list[dict], dict[str, set], list[dict], dict]:
  """Build the evaluation pools (module docstring).

  Args:
    questions: `read_scholarqa_cs` output.
    pool_size: passages per pool.
    max_gold: gold snippets kept per question (rubric order).

  Returns:
    (pools, qrels, corpus, stats): id-only pools `{"id", "input", "ctx_ids"}` in first-stage
    order, qrels {qid: gold ids}, the corpus `[{"id", "title": "", "text"}]` of every snippet,
    and counts for the manifest.

  Raises:
    ConfigError: max_gold < 1 or pool_size <= max_gold (a pool must hold negatives).
  """
  if max_gold < 1 or pool_size <= max_gold:
    raise ConfigError(f"need 1 <= max_gold < pool_size, got max_gold={max_gold}, "
                      f"pool_size={pool_size}")
  index_of: dict[str, int] = {}
  texts: list[str] = []
  own_of = []
  for q in questions:
    own = []
    for s in q.snippets:
      if s not in index_of:
        index_of[s] = len(texts)
        texts.append(s)
      own.append(index_of[s])
    own_of.append(own)
  bm25 = BM25Index(texts)
  pools, qrels = [], {}
  capped = 0
  for q, own in zip(questions, own_of):
    gold = own[:max_gold]
    capped += len(own) - len(gold)
    scores = bm25.scores(q.question)
    negatives = bm25.top_k(q.question, pool_size - len(gold), exclude=own)
    members = sorted(gold + negatives, key=lambda i: (-scores[i], i))
    pools.append({"id": q.qid, "input": q.question, "ctx_ids": [f"cs:{i}" for i in members]})
    qrels[q.qid] = {f"cs:{i}" for i in gold}
  corpus = [{"id": f"cs:{i}", "title": "", "text": t} for i, t in enumerate(texts)]
  gold_counts = [len(qrels[q.qid]) for q in questions]
  stats = {"questions": len(questions), "corpus_snippets": len(texts),
           "snippets_per_question": sum(len(q.snippets) for q in questions),
           "gold_per_question": {"min": min(gold_counts), "max": max(gold_counts),
                                 "mean": round(sum(gold_counts) / len(gold_counts), 3)},
           "questions_capped": sum(len(o) > max_gold for o in own_of),
           "snippets_left_out_by_cap": capped}
  return pools, qrels, corpus, stats


def first_stage_rank_of_gold(pools: Sequence[dict], qrels: dict) -> Optional[float]:
  """Mean pool position (1-based) of each question's best-placed gold passage (a sanity
  figure for the manifest: how hard the first stage already makes the pools)."""
  firsts = [next(i for i, c in enumerate(p["ctx_ids"], 1) if c in qrels[p["id"]])
            for p in pools if qrels.get(p["id"])]
  return round(sum(firsts) / len(firsts), 3) if firsts else None
