"""Typed sentence graph construction on device (paper eqs 8-10), static shapes, jit-able.

Each query's N padded nodes get a fixed block of E_q = (N - 1) + 2 * k * N edge slots:
at most N - 1 adjacency edges and at most 2 * k * N similarity edges (k per source,
plus their reverses). All edge decisions are made on a dense [N, N] matrix per query,
and compacting that matrix in receiver-major order yields edges already sorted by
(receiver, sender), so no separate sort is needed.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import jraph

from logrerank_jax.errors import ConfigError, DataError
from logrerank_jax.schema import (NUM_EDGE_TYPES, NUM_ROLES, SIMILARITY_EDGE_TYPE,
                                  adjacency_edge_type)

__all__ = ["GraphBuildConfig", "NUM_EDGE_TYPES", "SIMILARITY_EDGE_TYPE", "build_sentence_graph",
           "edge_type", "edge_slots_per_query"]

_NORM_EPS = 1e-12  # zero vectors get cosine 0 instead of NaN


@dataclasses.dataclass(frozen=True)
class GraphBuildConfig:
  """Sentence-graph hyper-parameters and ablation switches (hashable: a static jit argument).

  Attributes:
    k: similarity top-k per source node.
    tau_sim: cosine threshold for similarity edges.
    delta: largest allowed abs(z_u - z_v) for similarity edges.
    use_adjacency: False reproduces the ablation "w/o intra-passage edges".
    use_similarity: False reproduces the ablation "w/o cross-passage edges".
    use_constraints: False reproduces "w/o edge constraints": similarity edges are the
      top-k by cosine among valid nodes of other passages, with no role, threshold or
      score-gap condition.
    use_edge_types: False reproduces "w/o edge types": every edge gets type 0.
  """
  k: int = 8
  tau_sim: float = 0.75
  delta: float = 0.25
  use_adjacency: bool = True
  use_similarity: bool = True
  use_constraints: bool = True
  use_edge_types: bool = True

  def __post_init__(self):
    if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
      raise ConfigError(f"GraphBuildConfig.k must be an int >= 1, got {self.k!r}")
    if not -1.0 <= float(self.tau_sim) <= 1.0:
      raise ConfigError(f"GraphBuildConfig.tau_sim must be in [-1, 1], got {self.tau_sim!r}")
    if not float(self.delta) >= 0.0:
      raise ConfigError(f"GraphBuildConfig.delta must be >= 0, got {self.delta!r}")
    for name in ("use_adjacency", "use_similarity", "use_constraints", "use_edge_types"):
      if not isinstance(getattr(self, name), bool):
        raise ConfigError(f"GraphBuildConfig.{name} must be a bool, got {getattr(self, name)!r}")


def edge_slots_per_query(num_nodes, k):
  """Return E_q = (N - 1) + 2 * k * N, the edge slots reserved for one query of N nodes."""
  return (num_nodes - 1) + 2 * k * num_nodes


def edge_type(src_role, dst_role):
  """Return the adjacency edge type for (source role, target role); works elementwise.

  Same role -> 0; otherwise the directed cross-role pair (src, dst), src != dst, maps to
  1 + 2 * src + (dst if dst < src else dst - 1), i.e. 1..6.

  Args:
    src_role: int or int array of roles in {0, 1, 2}.
    dst_role: int or int array of roles in {0, 1, 2}, broadcastable with src_role.

  Returns:
    int32 array of types in [0, 6].
  """
  # The rule has one home (schema.py), shared with the typed results' context graph.
  return adjacency_edge_type(jnp.asarray(src_role, jnp.int32),
                             jnp.asarray(dst_role, jnp.int32)).astype(jnp.int32)


def _query_edges(h, roles, z, pids, mask, cfg):
  """Return (senders, receivers, type, valid, cos) [E_q] local to one query of N nodes."""
  n = h.shape[0]
  num_slots = edge_slots_per_query(n, cfg.k)
  norm = jnp.sqrt(jnp.sum(h * h, axis=-1, keepdims=True))  # [N, 1]
  unit = h / jnp.maximum(norm, _NORM_EPS)  # [N, d]
  # HIGHEST: on GPU/TPU the default f32 matmul may round through bf16/tf32, which would
  # move cosines across tau_sim and reorder top-k ties.
  cos = jnp.matmul(unit, unit.T, precision=jax.lax.Precision.HIGHEST)  # [N, N]
  idx = jnp.arange(n)
  pair_valid = mask[:, None] & mask[None, :]  # [N, N]

  # Adjacency: u -> u + 1 inside one passage; adj[u, v] True iff that edge exists.
  succ = jnp.roll(idx, -1)  # [N]
  adj_row = (mask & jnp.roll(mask, -1) & (pids == jnp.roll(pids, -1)) & (idx < n - 1))
  adj = (idx[None, :] == succ[:, None]) & adj_row[:, None]  # [N, N]
  if not cfg.use_adjacency:
    adj = jnp.zeros_like(adj)

  # Similarity: candidates per source row, top-k by cosine, then symmetrised.
  if cfg.use_similarity:
    cand = pair_valid & (pids[:, None] != pids[None, :])  # [N, N]
    if cfg.use_constraints:
      cand &= roles[:, None] == roles[None, :]
      cand &= cos >= cfg.tau_sim
      cand &= jnp.abs(z[:, None] - z[None, :]) <= cfg.delta
    k = min(cfg.k, n)
    # lax.top_k returns equal values lower index first, which is the specified tie rule.
    _, top = jax.lax.top_k(jnp.where(cand, cos, -jnp.inf), k)  # [N, k]
    chosen = jnp.take_along_axis(cand, top, axis=1)  # [N, k]; False for filler picks
    fwd = jnp.zeros((n, n), bool).at[idx[:, None], top].set(chosen)  # [N, N]
    sim = fwd | fwd.T
  else:
    sim = jnp.zeros((n, n), bool)

  if cfg.use_edge_types:
    types = jnp.where(sim, SIMILARITY_EDGE_TYPE, edge_type(roles[:, None], roles[None, :]))
  else:
    types = jnp.zeros((n, n), jnp.int32)
  exists = adj | sim  # [N, N]; disjoint: adjacency is intra-, similarity cross-passage

  # Receiver-major flattening: flat = r * N + s, so increasing flat index is (receiver, sender)
  # order; nonzero(size=...) keeps that order and fills the tail with the pad edge.
  pad = n * n - 1  # (N - 1) -> (N - 1)
  (flat,) = jnp.nonzero(exists.T.reshape(-1), size=num_slots, fill_value=pad)  # [E_q]
  count = jnp.sum(exists)
  valid = jnp.arange(num_slots) < count  # [E_q]
  receivers = (flat // n).astype(jnp.int32)
  senders = (flat % n).astype(jnp.int32)
  edge_types = jnp.where(valid, types[senders, receivers], 0).astype(jnp.int32)
  edge_cos = jnp.where(valid, cos[senders, receivers], 0.0).astype(jnp.float32)
  return senders, receivers, edge_types, valid, edge_cos


@functools.partial(jax.jit, static_argnames=("cfg",))
def build_sentence_graph(h, role_probs, z_local, passage_ids, node_mask, cfg):
  """Build the typed sentence graphs of Q queries as one flat, padded jraph.GraphsTuple.

  Adjacency edges go u -> u + 1 when both nodes are valid and in the same passage, typed by
  (argmax role of u, argmax role of u + 1) via `edge_type`. Similarity edges: for each
  valid source u, candidates v are valid, in another passage, share u's argmax role,
  have cos(h_u, h_v) >= tau_sim and abs(z_u - z_v) <= delta; the top k by cosine (ties to
  the lower index) are kept and the union with the reversed edges is taken (type 7).
  Roles are argmax(role_probs) with ties to the lower index. Edges never cross queries.

  Args:
    h: float [Q, N, d] sentence embeddings.
    role_probs: float [Q, N, 3] predicted role distributions.
    z_local: float [Q, N] local scores in [0, 1].
    passage_ids: int [Q, N] passage index per node; a passage's sentences are contiguous.
    node_mask: bool [Q, N], True for real nodes.
    cfg: GraphBuildConfig (static).

  Returns:
    jraph.GraphsTuple with node index q * N + n: n_node int32 [Q] (all N), n_edge int32 [Q]
    (all E_q = (N - 1) + 2kN), senders/receivers int32 [Q * E_q] sorted by (receiver, sender)
    within each query block (so receivers are globally sorted), unused slots pointing at
    q * N + N - 1 with mask False, edges = {"type" int32, "mask" bool, "cos" float32}
    [Q * E_q], nodes = {"mask" bool [Q * N]}, globals None.
  """
  if not isinstance(cfg, GraphBuildConfig):
    raise ConfigError(f"cfg must be a GraphBuildConfig, got {type(cfg).__name__}")
  if h.ndim != 3:
    raise DataError(f"h must be [Q, N, d], got shape {h.shape}")
  q, n, _ = h.shape
  expected = {"role_probs": (q, n, NUM_ROLES), "z_local": (q, n), "passage_ids": (q, n),
              "node_mask": (q, n)}
  for name, array in (("role_probs", role_probs), ("z_local", z_local),
                      ("passage_ids", passage_ids), ("node_mask", node_mask)):
    if tuple(array.shape) != expected[name]:
      raise DataError(f"{name} has shape {tuple(array.shape)}, expected {expected[name]}")
  if n < 1:
    raise DataError("build_sentence_graph needs N >= 1 node slots per query")

  mask = node_mask.astype(bool)  # [Q, N]
  # Padded nodes may hold garbage; neutralise it so it cannot leak NaN into cosines.
  h = jnp.where(mask[..., None], h.astype(jnp.float32), 0.0)  # [Q, N, d]
  z = jnp.where(mask, z_local.astype(jnp.float32), 0.0)  # [Q, N]
  roles = jnp.argmax(role_probs.astype(jnp.float32), axis=-1).astype(jnp.int32)  # [Q, N]
  pids = passage_ids.astype(jnp.int32)  # [Q, N]

  senders, receivers, types, valid, cos = jax.vmap(
      functools.partial(_query_edges, cfg=cfg))(h, roles, z, pids, mask)  # each [Q, E_q]
  offset = (jnp.arange(q, dtype=jnp.int32) * n)[:, None]  # [Q, 1]
  num_slots = edge_slots_per_query(n, cfg.k)
  return jraph.GraphsTuple(
      nodes={"mask": mask.reshape(-1)},
      edges={"type": types.reshape(-1), "mask": valid.reshape(-1), "cos": cos.reshape(-1)},
      senders=(senders + offset).reshape(-1),
      receivers=(receivers + offset).reshape(-1),
      globals=None,
      n_node=jnp.full((q,), n, jnp.int32),
      n_edge=jnp.full((q,), num_slots, jnp.int32))
