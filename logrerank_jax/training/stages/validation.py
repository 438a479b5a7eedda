"""Validation metrics shared by the stages: the relevant passages of training-record units, and
the passage ranking that per-sentence scores induce."""

from typing import Dict, List, Optional

import numpy as np

from logrerank_jax.evaluation import rerank_metrics
from logrerank_jax.ranking import passage_order, passage_scores
from logrerank_jax.results.calibration import scored_passage_logits


def unit_qrels(units) -> Dict[str, set]:
  """{qid: relevant passage ids} of training-record units: each query's rank-1 passage."""
  return {u.qid: {u.passage_ids[p] for p in range(len(u.passage_ids)) if u.passage_rank[p] == 1}
          for u in units}


def validation_passage_logits(units, node_scores: List[np.ndarray], qrels: Dict[str, set]):
  """(logits, labels): every scored passage's best-sentence score and whether `qrels` lists it,
  over the judged queries (`results.calibration.scored_passage_logits`, as the engine's
  `engine.calibration.passage_logits`)."""
  zs, ys = [], []
  for u, scores in zip(units, node_scores):
    if u.qid not in qrels:
      continue
    node_passage = [p for p, sentences in enumerate(u.query.passages) for _ in sentences]
    z, y = scored_passage_logits(node_passage, scores,
                                 [pid in qrels[u.qid] for pid in u.passage_ids])
    zs.append(z)
    ys.append(y)
  if not zs:
    return np.zeros(0), np.zeros(0, bool)
  return np.concatenate(zs), np.concatenate(ys)


def passage_metrics(units, node_scores: List[np.ndarray], qrels: Optional[Dict[str, set]] = None,
                    k: int = 10) -> Dict[str, float]:
  """Metrics of the passage ranking induced by sentence scores (`ranking.passage_scores`).

  The relevant passages are `qrels[qid]` (validation pools), by default each query's rank-1
  passage in the training record (`unit_qrels`).
  """
  run = {}
  for u, scores in zip(units, node_scores):
    node_passage = [p for p, sentences in enumerate(u.query.passages) for _ in sentences]
    best = passage_scores(node_passage, scores, len(u.passage_ids))
    run[u.qid] = [u.passage_ids[p] for p in passage_order(best)]
  return rerank_metrics(run, unit_qrels(units) if qrels is None else qrels, k=k)
