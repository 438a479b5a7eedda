"""From the engine's scores to typed results: `QueryScores` (one query's host-side scores, what
the engine returns) and `make_result` (its `RerankResult`, or a `RecordError`)."""

import dataclasses
from typing import Any, Optional

import numpy as np

from logrerank_jax.errors import DataError
from logrerank_jax.ranking import query_orders, run_file_passage_scores
from logrerank_jax.schema import ROLE_NAMES
from logrerank_jax.results.typed import (ContextUnit, PassageInfo, RankedSentence, RerankResult,
                                         Result, SentenceRef, finite, record_error)


@dataclasses.dataclass
class QueryScores:
  """Host-side scores of one query: per node arrays in passage order, plus its context units."""
  record: Any                 # the `data.inference_input.InferenceRecord` scored
  node_passage: np.ndarray    # int32 [n]
  node_sentence: np.ndarray   # int32 [n]
  local_score: np.ndarray     # float32 [n]
  global_score: Optional[np.ndarray]  # float32 [n]; None without a global stage
  final_score: np.ndarray     # float32 [n] (the global logit under the engine's "logit" score map)
  role_probs: np.ndarray      # float32 [n, 3]
  context: list               # build_context units (node indices)
  passage_info: list          # per passage: (num_windows, truncated sentences, empty sentences)
  query_truncated: bool = False  # the query was cut at `max_query_tokens`
  # float32 [n]: the local logit; local_score is the engine's score map of it (the sigmoid,
  # calibrated or not). Rankings by logit keep the order that float32 sigmoids round away (many
  # sentences of a sure passage read exactly 1.0).
  local_logit: Optional[np.ndarray] = None

  def passage_scores(self, which: str = "final") -> np.ndarray:
    """Best sentence score per passage ([P], `ranking.passage_scores`) of `which`: "final",
    "local" or "local_logit"; passages without sentences get a finite floor below every scored
    passage (`ranking.run_file_passage_scores`: -1 for sigmoid scores)."""
    scores = {"final": self.final_score, "local": self.local_score,
              "local_logit": self.local_logit}[which]
    if scores is None:
      raise ValueError(f"these scores hold no {which!r}")
    return run_file_passage_scores(self.node_passage, scores, len(self.record.passages))


def make_result(res: QueryScores, line: Optional[int] = None) -> Result:
  """Turn one query's scores into its typed result (or a `RecordError` on a non-finite score)."""
  rec = res.record

  def ref(n) -> Optional[SentenceRef]:
    if n is None:
      return None
    p, s = int(res.node_passage[n]), int(res.node_sentence[n])
    return SentenceRef(p, s, rec.passages[p].sentences[s].text)

  # A passage scores as its best sentence; passages without sentences come last.
  sentence_ranking, passage_ranking = query_orders(res.node_passage, res.final_score,
                                                   len(rec.passages))
  try:
    ranked = []
    for rank, n in enumerate(sentence_ranking, start=1):
      p, s = int(res.node_passage[n]), int(res.node_sentence[n])
      sent = rec.passages[p].sentences[s]
      ranked.append(RankedSentence(
          rank=rank, passage=p, sentence=s, start=sent.start, end=sent.end, text=sent.text,
          role_probs=tuple(finite(v) for v in res.role_probs[n]),
          local_score=finite(res.local_score[n]),
          global_score=None if res.global_score is None else finite(res.global_score[n]),
          score=finite(res.final_score[n]), truncated=s in res.passage_info[p][1]))
    context = []
    for unit in res.context:
      expanded = "similar" in unit
      context.append(ContextUnit(
          sentence=ref(unit["node"]), score=finite(unit["score"]),
          role=None if unit["role"] is None else ROLE_NAMES[unit["role"]],
          predecessor=ref(unit.get("predecessor")), successor=ref(unit.get("successor")),
          similar=tuple(ref(v) for v in unit["similar"]) if expanded else None))
  except DataError as e:
    return record_error(rec.raw, str(e), line)
  passages = tuple(PassageInfo(index=p, id=ps.passage_id, title=ps.title,
                               num_sentences=len(ps.sentences), num_windows=res.passage_info[p][0],
                               truncated_sentences=tuple(res.passage_info[p][1]),
                               empty_sentences=tuple(res.passage_info[p][2]),
                               skipped=ps.skipped)
                   for p, ps in enumerate(rec.passages))
  result = RerankResult(line=line, id=rec.record_id, query=rec.query,
                        query_truncated=res.query_truncated, ranked_sentences=tuple(ranked),
                        passage_ranking=tuple(passage_ranking), passages=passages,
                        context=tuple(context))
  try:
    result.graph  # pylint: disable=pointless-statement  (built now: a bad unit is this record's error)
  except DataError as e:
    return record_error(rec.raw, str(e), line)
  return result
