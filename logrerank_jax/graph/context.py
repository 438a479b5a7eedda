"""Structured context units over the sentence graph (paper eq 17-18).

Host-side NumPy formatting, called once per batch after the jitted model: it
reads global scores and the C3 `GraphsTuple` back from the device and builds
small Python dicts ready for JSON. The top-K selection is a lexsort over at most
a few hundred nodes per query, so it gains nothing from running inside jit.

A unit is `{"node", "score", "role", "predecessor", "successor", "similar"}`:
`node` is the query-local node index n (flat index q * N + n in the graph),
`score` the global score passed in (logit or sigmoid: the order is the same),
`role` the argmax of `role_probs` (ties to the lower index; None without
`role_probs`), `predecessor` / `successor` the in-passage neighbours along
adjacency edges (None when absent or with adjacency expansion off), `similar`
up to `num_similar` cross-passage neighbours over similarity edges, highest
cosine first, ties to the lower node index ([] with similarity expansion off).
The flat-list mode (ablation "w/o structured context") returns units with only
`node`, `score` and `role`.

Edge kinds are read from the graph structure so the same code serves graphs
built with and without edge types: C3 similarity edges always come in both
directions (type 7 when typed), adjacency edges only as u -> u + 1. An edge is a
similarity edge when its type is 7 or its reverse is also a valid edge; every
other valid edge must be an adjacency edge u -> u + 1.
"""

from typing import Optional

import numpy as np

from logrerank_jax.errors import ConfigError, DataError
from logrerank_jax.schema import SIMILARITY_EDGE_TYPE


def _graph_layout(graph):
  """Return (Q, N, node_mask [Q, N]) of a C3 graph; every query must have N node slots."""
  n_node = np.asarray(graph.n_node).reshape(-1)
  if n_node.size == 0:
    raise DataError("build_context: graph has no query (n_node is empty)")
  num_nodes = int(n_node[0])
  if np.any(n_node != num_nodes):
    raise DataError(f"build_context: graph.n_node must be equal per query (C3 layout), got {n_node.tolist()}")
  node_mask = np.asarray(graph.nodes["mask"], bool).reshape(-1)
  if node_mask.size != n_node.size * num_nodes:
    raise DataError(f"build_context: nodes['mask'] has {node_mask.size} entries, "
                    f"expected {n_node.size} x {num_nodes}")
  return n_node.size, num_nodes, node_mask.reshape(n_node.size, num_nodes)


def _per_query(array, name, num_q, num_nodes, trailing=()):
  """Return `array` as [Q, N, *trailing], accepting the flat [Q*N, ...] layout too."""
  a = np.asarray(array)
  if a.shape == (num_q * num_nodes, *trailing):
    return a.reshape(num_q, num_nodes, *trailing)
  if a.shape == (num_q, num_nodes, *trailing):
    return a
  raise DataError(f"build_context: {name} has shape {a.shape}, expected "
                  f"{(num_q * num_nodes, *trailing)} or {(num_q, num_nodes, *trailing)}")


def _neighbours(graph, num_q, num_nodes, node_mask):
  """Return per query (predecessor dict, successor dict, similarity {u: {v: cos}}) over valid edges."""
  senders = np.asarray(graph.senders).reshape(-1).astype(np.int64)  # [E]
  receivers = np.asarray(graph.receivers).reshape(-1).astype(np.int64)  # [E]
  types = np.asarray(graph.edges["type"]).reshape(-1)  # [E]
  cos = np.asarray(graph.edges["cos"], np.float64).reshape(-1)  # [E]
  flat_mask = node_mask.reshape(-1)
  valid = np.array(graph.edges["mask"], bool).reshape(-1)  # a copy: updated in place below
  in_range = (senders >= 0) & (senders < flat_mask.size) & (receivers >= 0) & (receivers < flat_mask.size)
  if np.any(valid & ~in_range):
    e = int(np.flatnonzero(valid & ~in_range)[0])
    raise DataError(f"build_context: valid edge {e} ({senders[e]} -> {receivers[e]}) points outside "
                    f"the {flat_mask.size} nodes")
  valid &= flat_mask[senders] & flat_mask[receivers]
  crossing = valid & (senders // num_nodes != receivers // num_nodes)
  if np.any(crossing):
    e = int(np.flatnonzero(crossing)[0])
    raise DataError(f"build_context: edge {e} ({senders[e]} -> {receivers[e]}) crosses queries")

  pairs = set(zip(senders[valid].tolist(), receivers[valid].tolist()))
  preds = [dict() for _ in range(num_q)]
  succs = [dict() for _ in range(num_q)]
  sims = [dict() for _ in range(num_q)]
  for e in np.flatnonzero(valid):
    s, r = int(senders[e]), int(receivers[e])
    q, u, v = s // num_nodes, s % num_nodes, r % num_nodes
    if types[e] == SIMILARITY_EDGE_TYPE or (r, s) in pairs:
      for a, b in ((u, v), (v, u)):
        nbrs = sims[q].setdefault(a, {})
        nbrs[b] = max(nbrs.get(b, -np.inf), cos[e])
    elif v == u + 1:
      succs[q][u] = v
      preds[q][v] = u
    else:
      raise DataError(f"build_context: edge {e} ({s} -> {r}) of type {int(types[e])} is neither "
                      "an adjacency edge u -> u+1 nor a two-way similarity edge")
  return preds, succs, sims


def build_context(global_scores, graph, K, use_adjacency_expansion=True, use_similarity_expansion=True,
                  num_similar=2, *, role_probs=None, structured=True) -> list:
  """Select the top-K nodes of each query and expand them into structured context units.

  Args:
    global_scores: [Q*N] or [Q, N] global logits or probabilities (numpy or jax).
    graph: C3 `jraph.GraphsTuple` (flat node index q * N + n) with `nodes["mask"]` and
      `edges["type"|"mask"|"cos"]`.
    K: number of units per query (fewer when a query has fewer valid nodes).
    use_adjacency_expansion: add in-passage predecessor/successor; False is the ablation
      "w/o adjacency expansion".
    use_similarity_expansion: add similar cross-passage nodes; False is the ablation
      "w/o similarity expansion".
    num_similar: most similar neighbours per unit (paper: 2).
    role_probs: optional [Q*N, 3] or [Q, N, 3] role distributions for the `role` field.
    structured: False returns the flat list (ablation "w/o structured context").

  Returns:
    One list per query of unit dicts (see the module docstring), highest score first, equal
    scores by lower node index; padding queries give [].
  """
  if isinstance(K, bool) or not isinstance(K, (int, np.integer)) or K < 1:
    raise ConfigError(f"build_context: K must be a positive int, got {K!r}")
  if isinstance(num_similar, bool) or not isinstance(num_similar, (int, np.integer)) or num_similar < 0:
    raise ConfigError(f"build_context: num_similar must be an int >= 0, got {num_similar!r}")
  num_q, num_nodes, node_mask = _graph_layout(graph)
  scores = _per_query(global_scores, "global_scores", num_q, num_nodes).astype(np.float64)  # [Q, N]
  bad = node_mask & ~np.isfinite(scores)
  if np.any(bad):
    q, n = (int(i) for i in np.argwhere(bad)[0])
    raise DataError(f"build_context: global score of query {q} node {n} is {scores[q, n]} (not finite)")
  roles: Optional[np.ndarray] = None
  if role_probs is not None:
    # np.argmax returns the first maximum: ties go to the lower role index.
    roles = np.argmax(_per_query(role_probs, "role_probs", num_q, num_nodes, (3,)), axis=-1)  # [Q, N]
  preds, succs, sims = _neighbours(graph, num_q, num_nodes, node_mask)

  contexts = []
  for q in range(num_q):
    valid = np.flatnonzero(node_mask[q])  # [V]
    # lexsort: last key is primary -> score descending, then node index ascending.
    order = valid[np.lexsort((valid, -scores[q, valid]))][:K]
    units = []
    for n in order.tolist():
      unit = {"node": n, "score": float(scores[q, n]), "role": None if roles is None else int(roles[q, n])}
      if structured:
        unit["predecessor"] = preds[q].get(n) if use_adjacency_expansion else None
        unit["successor"] = succs[q].get(n) if use_adjacency_expansion else None
        similar = []
        if use_similarity_expansion:
          nbrs = sims[q].get(n, {})
          similar = sorted(nbrs, key=lambda v: (-nbrs[v], v))[:num_similar]
        unit["similar"] = similar
      units.append(unit)
    contexts.append(units)
  return contexts


def log_context(outputs, cfg) -> list:
  """Build the structured context units (eq 17-18) of a forward's outputs, host-side.

  Ranks nodes by `final_score` (the global score; the local one under "w/o global") and applies
  the context switches of the model config (adjacency / similarity expansion, flat list).

  Args:
    outputs: `LoGReranker` outputs (device or host arrays) with `final_score`, `role_probs`
      and `graph`.
    cfg: the `LoGConfig` used for the forward (read for `context_k`, `num_similar` and the
      context switches only).

  Returns:
    One list of unit dicts per query slot, as `build_context` returns.
  """
  import jax  # pylint: disable=g-import-not-at-top  (tree_map over the GraphsTuple)

  graph = jax.tree_util.tree_map(np.asarray, outputs["graph"])
  return build_context(np.asarray(outputs["final_score"]), graph, cfg.context_k,
                       use_adjacency_expansion=cfg.use_adjacency_expansion,
                       use_similarity_expansion=cfg.use_similarity_expansion,
                       num_similar=cfg.num_similar, role_probs=np.asarray(outputs["role_probs"]),
                       structured=cfg.structured_context)
