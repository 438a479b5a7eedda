"""Tests of the on-device sentence-graph builder against the loop-based NumPy reference."""

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from graph_reference import reference_cosine, reference_edges, reference_role
from logrerank_jax.errors import ConfigError, DataError
from logrerank_jax.graph import (NUM_EDGE_TYPES, SIMILARITY_EDGE_TYPE, GraphBuildConfig,
                                 build_sentence_graph,
                                 edge_slots_per_query, edge_type)

# float32 cosine feature vs float64 NumPy cosine (also jit vs eager): a dot product and two
# norms of d-dim O(1) vectors round to ~sqrt(d) eps relative (eps = 1.19e-7, d <= 32), |cos| <= 1:
# ~7e-7 worst; measured 1.2e-7 (8x) with the default XLA CPU kernels.
COS_ATOL = 1e-6


def make_inputs(seed, q=3, n=20, d=8, *, prototypes=0, masked_passage=False,
                masked_query=False, single_passage_query=False, tied_roles=True):
  """Return random C3 inputs: contiguous passages, padded tails with NaN garbage.

  Args:
    seed: RNG seed.
    q, n, d: queries, node slots per query, embedding width.
    prototypes: when > 0, every h is one of this many vectors (exact cosine ties).
    masked_passage: mask out every sentence of passage 1 of query 0.
    masked_query: mask out every node of the last query.
    single_passage_query: query 1 holds a single passage (no cross-passage neighbour).
    tied_roles: give some nodes exactly tied role probabilities.
  """
  rng = np.random.default_rng(seed)
  h = rng.normal(size=(q, n, d)).astype(np.float32)
  if prototypes:
    protos = rng.normal(size=(prototypes, d)).astype(np.float32)
    h = protos[rng.integers(0, prototypes, size=(q, n))]
  role_probs = rng.dirichlet(np.ones(3), size=(q, n)).astype(np.float32)
  if tied_roles:
    ties = rng.random((q, n)) < 0.15
    role_probs[ties] = np.array([0.25, 0.375, 0.375], np.float32)  # argmax tie -> role 1
  z = rng.random((q, n)).astype(np.float32)
  pids = np.full((q, n), -1, np.int32)
  mask = np.zeros((q, n), bool)
  for qi in range(q):
    used = int(rng.integers(n - 4, n + 1))  # a few padded slots at the end
    if single_passage_query and qi == 1:
      pids[qi, :used] = 0
    else:
      cuts = np.sort(rng.choice(np.arange(1, used), size=3, replace=False))
      pids[qi, :used] = np.searchsorted(cuts, np.arange(used), side="right")
    mask[qi, :used] = True
  if masked_passage:
    mask[0, pids[0] == 1] = False
  if masked_query:
    mask[-1] = False
  # Padded nodes hold garbage the builder must ignore.
  h = np.where(mask[..., None], h, np.nan).astype(np.float32)
  z = np.where(mask, z, np.float32(7.0))
  return h, role_probs, z, pids, mask


def graph_to_numpy(graph):
  """Return the GraphsTuple's arrays as NumPy."""
  return jax.tree_util.tree_map(np.asarray, graph)


def check_graph_layout(graph, mask, cfg):
  """Assert C3's static layout: sizes, sorting, padding slots, per-query blocks."""
  q, n = mask.shape
  e_q = edge_slots_per_query(n, cfg.k)
  assert graph.senders.dtype == np.int32 and graph.receivers.dtype == np.int32
  assert graph.edges["type"].dtype == np.int32 and graph.edges["mask"].dtype == np.bool_
  assert graph.edges["cos"].dtype == np.float32
  assert graph.senders.shape == graph.receivers.shape == (q * e_q,)
  assert np.array_equal(graph.n_node, np.full(q, n)) and graph.n_node.dtype == np.int32
  assert np.array_equal(graph.n_edge, np.full(q, e_q)) and graph.n_edge.dtype == np.int32
  assert int(graph.n_edge.sum()) == graph.senders.shape[0]
  assert np.array_equal(graph.nodes["mask"], mask.reshape(-1))
  assert graph.globals is None
  assert np.all(np.diff(graph.receivers) >= 0)  # globally sorted receivers
  for qi in range(q):
    block = slice(qi * e_q, (qi + 1) * e_q)
    s, r = graph.senders[block], graph.receivers[block]
    valid = graph.edges["mask"][block]
    count = int(valid.sum())
    assert valid[:count].all() and not valid[count:].any()  # used slots first
    assert np.all(s[count:] == qi * n + n - 1) and np.all(r[count:] == qi * n + n - 1)
    pairs = list(zip(r[:count].tolist(), s[:count].tolist()))
    assert pairs == sorted(pairs) and len(set(pairs)) == count  # (receiver, sender), no dupes
    assert np.all((s >= qi * n) & (s < (qi + 1) * n))  # never across queries
    assert np.all((r >= qi * n) & (r < (qi + 1) * n))
  types = graph.edges["type"][graph.edges["mask"]]
  assert np.all((types >= 0) & (types < NUM_EDGE_TYPES))


def edge_dict(graph):
  """Return {(sender, receiver): type} over valid edges."""
  valid = graph.edges["mask"]
  return {(int(s), int(r)): int(t) for s, r, t in zip(
      graph.senders[valid], graph.receivers[valid], graph.edges["type"][valid])}


def check_cos_feature(graph, h):
  """Assert the cos feature equals the float64 NumPy cosine on every valid edge."""
  flat_h = h.reshape(-1, h.shape[-1])
  valid = graph.edges["mask"]
  for s, r, c in zip(graph.senders[valid], graph.receivers[valid], graph.edges["cos"][valid]):
    assert abs(float(c) - reference_cosine(flat_h[s], flat_h[r])) <= COS_ATOL


def kth_cosine_is_tied(h, role_probs, pids, mask, k, u):
  """Return True if u's k-th and (k+1)-th best same-role cross-passage cosines are equal."""
  role = reference_role(role_probs[u])
  cos = sorted((reference_cosine(h[u], h[v]) for v in range(len(mask))
                if mask[v] and pids[v] != pids[u] and reference_role(role_probs[v]) == role),
               reverse=True)
  return len(cos) > k and cos[k - 1] == cos[k]


LOW = dict(k=3, tau_sim=0.2, delta=0.5)  # lowered threshold so random data has edges
CASES = {
    "random": (dict(), LOW),
    "duplicate_h_cosine_ties": (dict(prototypes=3), dict(k=2, tau_sim=0.0, delta=1.0)),
    "masked_passage": (dict(masked_passage=True), LOW),
    "fully_masked_query": (dict(masked_query=True), LOW),
    "no_eligible_neighbour": (dict(single_passage_query=True), dict(k=3, tau_sim=0.3, delta=0.1)),
    "k_larger_than_n": (dict(n=6, q=2), dict(k=8, tau_sim=0.0, delta=1.0)),
    "threshold_zero_k1": (dict(), dict(k=1, tau_sim=0.0, delta=1.0)),
    "no_adjacency": (dict(), dict(LOW, use_adjacency=False)),
    "no_similarity": (dict(), dict(LOW, use_similarity=False)),
    "no_constraints": (dict(), dict(LOW, use_constraints=False)),
    "no_edge_types": (dict(), dict(LOW, use_edge_types=False)),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_graph_matches_numpy_reference(case):
  input_kw, cfg_kw = CASES[case]
  cfg = GraphBuildConfig(**cfg_kw)
  h, role_probs, z, pids, mask = make_inputs(seed=len(case), **input_kw)
  graph = graph_to_numpy(build_sentence_graph(h, role_probs, z, pids, mask, cfg))
  check_graph_layout(graph, mask, cfg)
  got = edge_dict(graph)
  want = reference_edges(h, role_probs, z, pids, mask, **dataclasses.asdict(cfg))
  assert got == want
  check_cos_feature(graph, h)

  # The case must exercise what it names: edges exist, and the flagged features show up.
  kinds = collections.Counter(t for t in got.values())
  assert got, "no edges at all: the case tests nothing"
  n = mask.shape[1]
  same_passage = {e for e in got if pids.reshape(-1)[e[0]] == pids.reshape(-1)[e[1]]}
  cross_passage = set(got) - same_passage
  if cfg.use_adjacency:
    assert same_passage
  else:
    assert not same_passage
  if cfg.use_similarity:
    assert cross_passage
  else:
    assert not cross_passage
  if cfg.use_edge_types:
    assert (SIMILARITY_EDGE_TYPE in kinds) == cfg.use_similarity
    if cfg.use_adjacency:
      assert len(set(kinds) - {SIMILARITY_EDGE_TYPE}) >= 2  # several adjacency types
  else:
    assert set(kinds) == {0}
  if case == "fully_masked_query":
    assert not any(s // n == mask.shape[0] - 1 for s, _ in got)
  if case == "no_eligible_neighbour":
    assert not any(s // n == 1 and pids[1, s % n] != pids[1, r % n] for s, r in got)
  if case == "duplicate_h_cosine_ties":
    # Some source has a cosine tie straddling its k-th pick, so tie-breaking was decisive.
    assert any(kth_cosine_is_tied(h[qi], role_probs[qi], pids[qi], mask[qi], cfg.k, u)
               for qi in range(mask.shape[0]) for u in range(n) if mask[qi, u])
  if case == "no_constraints":
    # Without constraints every valid node with another valid passage gets k out-edges.
    out = collections.Counter(s for s, r in cross_passage)
    assert min(out.values()) >= cfg.k


def test_constraints_actually_prune():
  h, role_probs, z, pids, mask = make_inputs(seed=11)
  with_c = graph_to_numpy(build_sentence_graph(h, role_probs, z, pids, mask,
                                               GraphBuildConfig(**LOW)))
  without = graph_to_numpy(build_sentence_graph(
      h, role_probs, z, pids, mask, GraphBuildConfig(**LOW, use_constraints=False)))
  assert int(with_c.edges["mask"].sum()) < int(without.edges["mask"].sum())


def test_hand_built_graph():
  # Passage 0 = nodes 0, 1; passage 1 = nodes 2, 3; node 4 is padding.
  h = np.array([[[1, 0], [0, 1], [1, 0.1], [0, 1], [5, 5]]], np.float32)
  roles = np.eye(3, dtype=np.float32)[[0, 1, 0, 1, 2]][None]  # bg, method, bg, method
  z = np.array([[0.5, 0.5, 0.6, 0.9, 0.5]], np.float32)  # |z_1 - z_3| = 0.4 > delta
  pids = np.array([[0, 0, 1, 1, -1]], np.int32)
  mask = np.array([[True, True, True, True, False]])
  cfg = GraphBuildConfig(k=1, tau_sim=0.75, delta=0.25)
  graph = graph_to_numpy(build_sentence_graph(h, roles, z, pids, mask, cfg))
  e_q = 4 + 2 * 1 * 5
  assert graph.senders.shape == (e_q,)
  # Edges by hand: adjacency 0->1, 2->3 (bg->method: type 1); similarity 0<->2 (type 7);
  # 1<->3 fails the score gap. Sorted by (receiver, sender).
  np.testing.assert_array_equal(graph.senders[:4], [2, 0, 0, 2])
  np.testing.assert_array_equal(graph.receivers[:4], [0, 1, 2, 3])
  np.testing.assert_array_equal(graph.edges["type"][:4], [7, 1, 7, 1])
  np.testing.assert_array_equal(graph.edges["mask"], np.arange(e_q) < 4)
  np.testing.assert_array_equal(graph.senders[4:], 4)
  np.testing.assert_array_equal(graph.receivers[4:], 4)
  c02 = 1 / np.sqrt(1.01)
  np.testing.assert_allclose(graph.edges["cos"][:4], [c02, 0.0, c02, 0.1 / np.sqrt(1.01)],
                             atol=COS_ATOL)


def test_jit_matches_no_jit():
  h, role_probs, z, pids, mask = make_inputs(seed=5, q=2, n=12)
  cfg = GraphBuildConfig(**LOW)
  jitted = graph_to_numpy(build_sentence_graph(h, role_probs, z, pids, mask, cfg))
  with jax.disable_jit():
    eager = graph_to_numpy(build_sentence_graph(h, role_probs, z, pids, mask, cfg))
  assert int(jitted.edges["mask"].sum()) > 0
  for name in ("senders", "receivers", "n_node", "n_edge"):
    np.testing.assert_array_equal(getattr(jitted, name), getattr(eager, name))
  np.testing.assert_array_equal(jitted.edges["type"], eager.edges["type"])
  np.testing.assert_array_equal(jitted.edges["mask"], eager.edges["mask"])
  np.testing.assert_allclose(jitted.edges["cos"], eager.edges["cos"], atol=COS_ATOL, rtol=0)


def test_receivers_sorted_flag_is_safe_for_segment_ops():
  h, role_probs, z, pids, mask = make_inputs(seed=6, q=2, n=12)
  graph = build_sentence_graph(h, role_probs, z, pids, mask, GraphBuildConfig(**LOW))
  weights = graph.edges["mask"].astype(jnp.float32)
  in_degree = jax.ops.segment_sum(weights, graph.receivers, num_segments=2 * 12,
                                  indices_are_sorted=True)
  g = graph_to_numpy(graph)
  want = np.bincount(g.receivers[g.edges["mask"]], minlength=24)
  np.testing.assert_array_equal(np.asarray(in_degree), want)
  assert want.sum() > 0


@pytest.mark.parametrize("src", [0, 1, 2], ids=["src_background", "src_method", "src_result"])
def test_edge_type_table(src):
  table = {(0, 1): 1, (0, 2): 2, (1, 0): 3, (1, 2): 4, (2, 0): 5, (2, 1): 6}
  for dst in range(3):
    want = 0 if src == dst else table[(src, dst)]
    assert int(edge_type(src, dst)) == want
  got = edge_type(jnp.full(3, src), jnp.arange(3))  # elementwise on arrays too
  assert got.dtype == jnp.int32
  np.testing.assert_array_equal(got, [0 if src == d else table[(src, d)] for d in range(3)])


def test_role_ties_go_to_lower_index():
  assert reference_role([0.25, 0.375, 0.375]) == 1
  roles = np.array([[[0.25, 0.375, 0.375], [0.4, 0.4, 0.2]]], np.float32)
  # Adjacency 0 -> 1 typed (argmax 1, argmax 0) = edge_type(1, 0) = 3 with lower-index ties.
  graph = graph_to_numpy(build_sentence_graph(
      np.ones((1, 2, 2), np.float32), roles, np.zeros((1, 2), np.float32),
      np.zeros((1, 2), np.int32), np.ones((1, 2), bool), GraphBuildConfig()))
  assert edge_dict(graph) == {(0, 1): 3}


@pytest.mark.parametrize(
    "kwargs", [dict(k=0), dict(k=2.5), dict(tau_sim=1.5), dict(delta=-0.1),
               dict(use_edge_types=1)],
    ids=["k_zero", "k_float", "tau_out_of_range", "delta_negative", "flag_not_bool"])
def test_bad_config_raises_config_error(kwargs):
  with pytest.raises(ConfigError):
    GraphBuildConfig(**kwargs)


def test_bad_shapes_raise_data_error():
  h, role_probs, z, pids, mask = make_inputs(seed=0, q=2, n=8)
  with pytest.raises(DataError, match="z_local"):
    build_sentence_graph(h, role_probs, z[:, :5], pids, mask, GraphBuildConfig())
  with pytest.raises(DataError, match="role_probs"):
    build_sentence_graph(h, role_probs[..., :2], z, pids, mask, GraphBuildConfig())
