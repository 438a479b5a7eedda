"""From sentence scores to a passage ranking: the one definition, used by training and serving.

A passage scores as its best sentence (the paper's induced passage ranking). Passages are
ordered by that score, best first, ties by input order; a passage with no scored sentence
(empty text, or skipped as unusable) scores `NO_SCORE` and comes after every scored passage,
in input order.
"""

from typing import List, Sequence, Tuple

import numpy as np

# Below any sigmoid score, and below any logit a real model produces for a real sentence.
NO_SCORE = -np.inf


def passage_scores(node_passage: Sequence[int], node_scores: Sequence[float],
                   num_passages: int) -> np.ndarray:
  """Best sentence score per passage.

  Args:
    node_passage: [n] passage index of each scored sentence.
    node_scores: [n] its score (any monotone score: sigmoid, logit).
    num_passages: P, the number of passages of the query.

  Returns:
    float64 [P]; `NO_SCORE` for a passage without a scored sentence.
  """
  out = np.full(int(num_passages), NO_SCORE, np.float64)
  p = np.asarray(node_passage, np.int64).reshape(-1)
  if p.size:
    np.maximum.at(out, p, np.asarray(node_scores, np.float64).reshape(-1))
  return out


def run_file_passage_scores(node_passage: Sequence[int], node_scores: Sequence[float],
                            num_passages: int) -> np.ndarray:
  """`passage_scores` with an unscored passage at a finite floor below every scored one, so run
  files can hold it: -1 for sigmoid scores (what `RerankResult.passage_scores` and the local
  stage's validation rank by), one below the lowest for logits, which can be below -1."""
  best = passage_scores(node_passage, node_scores, num_passages)
  scored = np.isfinite(best)
  floor = min(-1.0, float(best[scored].min()) - 1.0) if scored.any() else -1.0
  return np.where(scored, best, floor)


def passage_order(scores: Sequence[float]) -> List[int]:
  """Passage indices by decreasing score, ties (and unscored passages) in input order."""
  s = np.asarray(scores, np.float64)
  return np.lexsort((np.arange(len(s)), -s)).tolist()


def sentence_order(node_scores: Sequence[float]) -> List[int]:
  """Node indices by decreasing score, ties by node order (passage order, then sentence)."""
  s = np.asarray(node_scores, np.float64)
  return np.lexsort((np.arange(len(s)), -s)).tolist()


def query_orders(node_passage: Sequence[int], node_scores: Sequence[float],
                 num_passages: int) -> Tuple[List[int], List[int]]:
  """A query's two rankings from its sentence scores, at once: node indices best first
  (`sentence_order`), and passage indices best first by their best sentence with passages
  without sentences last (`passage_order` of `run_file_passage_scores`)."""
  return (sentence_order(node_scores),
          passage_order(run_file_passage_scores(node_passage, node_scores, num_passages)))
