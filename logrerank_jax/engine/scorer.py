"""One group of records through both stages: local calls, whole-graph global calls, scores.

`score_group` is the engine's unit of work. The Python API (`EngineCore.score`, which `Reranker`
inherits), the batch CLI and the HTTP server's batcher all score records through it, so a
request's scores do not depend on the door it came in by (only on float rounding of the shapes
it was packed into).
"""

from typing import List, Optional, Sequence, Tuple

import numpy as np

from logrerank_jax.data.inference_input import InferenceRecord
from logrerank_jax.graph.context import log_context
from logrerank_jax.results import QueryScores
from logrerank_jax.results.calibration import calibrated
from logrerank_jax.schema import NUM_ROLES
from logrerank_jax.engine.device import Engine
from logrerank_jax.engine.planner import Planner


def local_nodes(engine: Engine, planner: Planner, records: Sequence[InferenceRecord],
                jobs: Optional[list] = None) -> Tuple[List[List[tuple]], List[dict], List[bool]]:
  """The local stage of `score_group`: run the records' local calls and gather each record's
  sentence nodes.

  Returns:
    (nodes, windows, truncated_q): per record, its nodes `(passage, sentence, h, role_probs,
    local_score, local_logit)` in call order (`Planner.global_jobs` sorts them into passage
    order); per record {passage: (windows, truncated sentences, empty sentences)}; per record,
    whether its query was cut to the query token limit. The global stage's training features
    are these nodes too (`training.feature_cache.engine_features`), so it trains on exactly
    what inference feeds it.
  """
  nodes: List[List[tuple]] = [[] for _ in records]   # per record: (pi, si, h, roles, z, logit)
  if jobs is None:
    jobs = planner.local_jobs(records)
  # Host facts of the packing (passage windows, cut queries): known before the devices run.
  windows, truncated_q = planner.packed_passages(records, jobs)
  if engine.prior_cache is not None:
    jobs = engine.prior_cache.attach(engine, planner, jobs)
  for (part, arrays, info), out in engine.run_stacked("local", jobs):
    engine.tokens["real"] += info.real_tokens
    node_passage, node_mask = arrays["node_passage"], arrays["node_mask"]
    for slot, (ri, pis) in enumerate(part):
      for ni in np.flatnonzero(node_mask[slot]):
        # node n of a slot is its n-th sentence in passage order (packer contract)
        lp = int(node_passage[slot, ni])
        nodes[ri].append((pis[lp], out["h"][slot, ni], out["role_probs"][slot, ni],
                          float(out["local_score"][slot, ni]), float(out["local_logit"][slot, ni])))
  # Sentence index of each node: a passage's nodes are its sentences in order, all in one
  # slot (packer contract), so counting them per passage recovers the index.
  for ri in range(len(records)):
    fixed, seen = [], {}
    for pi, h, roles, z, logit in nodes[ri]:
      si = seen.get(pi, 0)
      seen[pi] = si + 1
      fixed.append((pi, si, h, roles, z, logit))
    nodes[ri] = fixed
  return nodes, windows, truncated_q


def score_group(engine: Engine, planner: Planner, records: Sequence[InferenceRecord],
                jobs: Optional[list] = None) -> List[QueryScores]:
  """Score records: the local stage over as few, nearly full calls as they need, then the global
  stage over each query's whole graph (never cut), `queries_per_batch` queries per call; calls
  of one shape run `num_devices` at a time.

  Args:
    engine: the device side.
    planner: the host side.
    records: parsed records.
    jobs: the records' `planner.local_jobs`, when a host worker has prepared them already.

  Returns:
    One `QueryScores` per record, in order.

  Raises:
    LogRerankError: the group cannot be scored (e.g. out of device memory).
  """
  nodes, windows, truncated_q = local_nodes(engine, planner, records, jobs)
  size = planner.queries_per_batch
  use_global = engine.cfg.use_global
  results: List[QueryScores] = []
  for (group, feats), out in engine.run_stacked("global", planner.global_jobs(nodes)):
    n = feats["node_mask"].shape[1]
    out = dict(out, role_probs=feats["role_probs"].reshape(size * n, NUM_ROLES))
    contexts = log_context(out, engine.cfg)
    final = out["final_score"].reshape(size, n)
    local = feats["local_score"]
    kind, a, b = engine.score_map
    if kind == "sigmoid" and (a, b) != (1.0, 0.0):
      # A calibrated model reports its local score through the same Platt map as its final one
      # (in float64, stored as float32): with the residual global stage (global logit = local logit
      # + the GAT's correction) the page's local -> global change then reads on one scale.
      local = calibrated(feats["local_logit"], a, b).astype(np.float32)
    for q, ri in enumerate(group):
      rec, k = records[ri], len(nodes[ri])
      empty_info = (0, [], [])
      results.append(QueryScores(
          record=rec, node_passage=feats["node_passage"][q, :k].copy(),
          node_sentence=np.asarray([t[1] for t in nodes[ri]], np.int32),
          local_score=local[q, :k].copy(),
          local_logit=feats["local_logit"][q, :k].copy(),
          global_score=final[q, :k].copy() if use_global else None,
          final_score=final[q, :k].copy(), role_probs=feats["role_probs"][q, :k].copy(),
          context=contexts[q],
          passage_info=[windows[ri].get(pi, empty_info) for pi in range(len(rec.passages))],
          query_truncated=truncated_q[ri]))
  return results
