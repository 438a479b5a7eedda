"""Plain NumPy/Python reference of the sentence-graph spec (contract C3), written with loops."""

import numpy as np

# Directed cross-role (src, dst) -> type, written out as a table rather than a formula.
_CROSS_ROLE_TYPE = {(0, 1): 1, (0, 2): 2, (1, 0): 3, (1, 2): 4, (2, 0): 5, (2, 1): 6}
_SIMILARITY_TYPE = 7


def reference_role(probs):
  """Return the index of the largest probability, the first one on ties."""
  best = 0
  for i in range(1, len(probs)):
    if probs[i] > probs[best]:
      best = i
  return best


def reference_cosine(a, b):
  """Return cos(a, b) in float64; 0 when either vector is zero."""
  a = np.asarray(a, np.float64)
  b = np.asarray(b, np.float64)
  na = np.sqrt(np.sum(a * a))
  nb = np.sqrt(np.sum(b * b))
  if na == 0.0 or nb == 0.0:
    return 0.0
  return float(np.sum(a * b) / (na * nb))


def reference_edges(h, role_probs, z_local, passage_ids, node_mask, *, k, tau_sim, delta,
                    use_adjacency=True, use_similarity=True, use_constraints=True,
                    use_edge_types=True):
  """Return {(sender, receiver): type} over flat node ids q * N + n, following the spec.

  Args:
    h, role_probs, z_local, passage_ids, node_mask: NumPy arrays shaped as in C3.
    k, tau_sim, delta, use_*: the GraphBuildConfig fields.

  Returns:
    Dict mapping each (sender, receiver) edge to its type.
  """
  num_queries, num_nodes = node_mask.shape
  edges = {}
  for q in range(num_queries):
    roles = [reference_role(role_probs[q, n]) for n in range(num_nodes)]
    base = q * num_nodes

    if use_adjacency:
      for u in range(num_nodes - 1):
        v = u + 1
        if node_mask[q, u] and node_mask[q, v] and passage_ids[q, u] == passage_ids[q, v]:
          if roles[u] == roles[v]:
            t = 0
          else:
            t = _CROSS_ROLE_TYPE[(roles[u], roles[v])]
          edges[(base + u, base + v)] = t if use_edge_types else 0

    if use_similarity:
      chosen = set()
      for u in range(num_nodes):
        if not node_mask[q, u]:
          continue
        candidates = []
        for v in range(num_nodes):
          if not node_mask[q, v] or passage_ids[q, v] == passage_ids[q, u]:
            continue
          c = reference_cosine(h[q, u], h[q, v])
          if use_constraints:
            if roles[v] != roles[u] or c < tau_sim:
              continue
            if abs(float(z_local[q, u]) - float(z_local[q, v])) > delta:
              continue
          candidates.append((c, v))
        # Highest cosine first; on equal cosine the lower node index first.
        candidates.sort(key=lambda cv: (-cv[0], cv[1]))
        for _, v in candidates[:k]:
          chosen.add((u, v))
          chosen.add((v, u))
      for u, v in chosen:
        edges[(base + u, base + v)] = _SIMILARITY_TYPE if use_edge_types else 0
  return edges
