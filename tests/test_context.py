"""Known-answer tests of the structured context units (eq 17-18) on hand-built C3 graphs."""

import jax.numpy as jnp
import jraph
import numpy as np
import pytest

from logrerank_jax.graph.context import build_context
from logrerank_jax.errors import ConfigError, DataError
from logrerank_jax.graph.build import GraphBuildConfig, build_sentence_graph


def make_graph(num_nodes, edges_per_query, valid_per_query, k=1):
  """Return a C3-layout GraphsTuple from per-query local (sender, receiver, type, cos[, mask]) tuples."""
  slots = (num_nodes - 1) + 2 * k * num_nodes
  cols = {"s": [], "r": [], "t": [], "c": [], "m": []}
  for q, edges in enumerate(edges_per_query):
    edges = sorted((e if len(e) == 5 else (*e, True) for e in edges), key=lambda e: (e[1], e[0]))
    edges += [(num_nodes - 1, num_nodes - 1, 0, 0.0, False)] * (slots - len(edges))
    for s, r, t, c, m in edges:
      cols["s"].append(q * num_nodes + s)
      cols["r"].append(q * num_nodes + r)
      cols["t"].append(t)
      cols["c"].append(c)
      cols["m"].append(m)
  node_mask = np.zeros((len(edges_per_query), num_nodes), bool)
  for q, valid in enumerate(valid_per_query):
    node_mask[q, :valid] = True
  num_q = len(edges_per_query)
  return jraph.GraphsTuple(
      nodes={"mask": node_mask.reshape(-1)},
      edges={"type": np.asarray(cols["t"], np.int32), "mask": np.asarray(cols["m"], bool),
             "cos": np.asarray(cols["c"], np.float32)},
      senders=np.asarray(cols["s"], np.int32), receivers=np.asarray(cols["r"], np.int32),
      n_node=np.full(num_q, num_nodes, np.int32), n_edge=np.full(num_q, slots, np.int32), globals=None)


def sim(u, v, c):
  """Return both directions of a similarity edge u <-> v (type 7) with cosine c."""
  return [(u, v, 7, c), (v, u, 7, c)]


# Passages: A = nodes 0-2, B = nodes 3-4, C = nodes 5-6; node 7 is padding.
N = 8
EDGES = ([(0, 1, 0, 0.6), (1, 2, 3, 0.5), (3, 4, 0, 0.4), (5, 6, 5, 0.3)]
         + sim(1, 3, 0.9) + sim(1, 5, 0.8) + sim(1, 6, 0.85) + sim(2, 4, 0.95))
SCORES = np.array([0.1, 0.9, 0.5, 0.5, 0.3, 0.2, 0.7, 99.0], np.float32)  # padding node scores highest
ROLE_PROBS = np.array([[0.2, 0.4, 0.4], [0.5, 0.3, 0.2], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4],
                       [0.0, 1.0, 0.0], [0.6, 0.2, 0.2], [0.1, 0.8, 0.1], [1.0, 0.0, 0.0]], np.float32)


def graph_one():
  """Return the one-query graph of EDGES (7 valid nodes, node 7 padding)."""
  return make_graph(N, [EDGES], [7], k=2)


def test_top_k_with_expansion_known_answer():
  units = build_context(SCORES, graph_one(), 3, role_probs=ROLE_PROBS)
  assert units == [[
      {"node": 1, "score": pytest.approx(0.9), "role": 0, "predecessor": 0, "successor": 2, "similar": [3, 6]},
      {"node": 6, "score": pytest.approx(0.7), "role": 1, "predecessor": 5, "successor": None, "similar": [1]},
      # nodes 2 and 3 tie at 0.5: the lower index wins
      {"node": 2, "score": pytest.approx(0.5), "role": 2, "predecessor": 1, "successor": None, "similar": [4]},
  ]]


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(use_adjacency_expansion=False),
         [(1, None, None, [3, 6]), (6, None, None, [1]), (2, None, None, [4])]),
        (dict(use_similarity_expansion=False),
         [(1, 0, 2, []), (6, 5, None, []), (2, 1, None, [])]),
        (dict(use_adjacency_expansion=False, use_similarity_expansion=False),
         [(1, None, None, []), (6, None, None, []), (2, None, None, [])]),
        (dict(num_similar=3), [(1, 0, 2, [3, 6, 5]), (6, 5, None, [1]), (2, 1, None, [4])]),
        (dict(num_similar=0), [(1, 0, 2, []), (6, 5, None, []), (2, 1, None, [])]),
    ],
    ids=["no_adjacency_expansion", "no_similarity_expansion", "no_expansion", "three_similar", "zero_similar"])
def test_expansion_ablations(kwargs, expected):
  units = build_context(SCORES, graph_one(), 3, **kwargs)[0]
  got = [(u["node"], u["predecessor"], u["successor"], u["similar"]) for u in units]
  assert got == expected
  assert all(u["role"] is None for u in units)  # no role_probs given


def test_flat_list_mode():
  units = build_context(SCORES, graph_one(), 4, role_probs=ROLE_PROBS, structured=False)[0]
  assert [u["node"] for u in units] == [1, 6, 2, 3]
  assert all(set(u) == {"node", "score", "role"} for u in units)
  assert [u["role"] for u in units] == [0, 1, 2, 2]


def test_fewer_valid_nodes_than_k():
  units = build_context(SCORES, graph_one(), 50, role_probs=ROLE_PROBS)[0]
  assert [u["node"] for u in units] == [1, 6, 2, 3, 4, 5, 0]  # padding node 7 never appears
  assert units[-1]["role"] == 1  # node 0's role tie (0.4, 0.4) goes to the lower role index
  assert units[3]["predecessor"] is None and units[3]["successor"] == 4


def test_all_ties_keep_node_order():
  units = build_context(np.zeros(N, np.float32), graph_one(), 5)[0]
  assert [u["node"] for u in units] == [0, 1, 2, 3, 4]


def test_multi_query_local_indices_and_layouts():
  """Query 1 reuses query 0's edges shifted by N; query 2 is an all-padding query."""
  edges1 = [(0, 1, 0, 0.5)] + sim(1, 2, 0.8) + sim(0, 2, 0.7)
  graph = make_graph(N, [EDGES, edges1, []], [7, 3, 0], k=2)
  scores = np.stack([SCORES, np.array([0.3, 0.1, 0.2, 9, 9, 9, 9, 9]), np.full(N, 5.0)]).astype(np.float32)
  flat = build_context(scores.reshape(-1), graph, 2)
  nested = build_context(jnp.asarray(scores), graph, 2)
  assert flat == nested
  assert [u["node"] for u in flat[0]] == [1, 6]
  assert flat[1] == [
      {"node": 0, "score": pytest.approx(0.3), "role": None, "predecessor": None, "successor": 1,
       "similar": [2]},
      {"node": 2, "score": pytest.approx(0.2), "role": None, "predecessor": None, "successor": None,
       "similar": [1, 0]},
  ]
  assert flat[2] == []


def test_untyped_graph_gives_same_context():
  """With use_edge_types=False every edge has type 0; edge kinds come from the structure."""
  untyped = [(s, r, 0, c) for s, r, _, c in EDGES]
  typed_units = build_context(SCORES, graph_one(), 7)
  untyped_units = build_context(SCORES, make_graph(N, [untyped], [7], k=2), 7)
  assert untyped_units == typed_units


def test_masked_and_padding_edges_are_ignored():
  garbage = [(0, 4, 7, 1.0, False), (4, 0, 7, 1.0, False), (1, 7, 7, 0.99), (7, 1, 7, 0.99),
             (6, 7, 0, 0.5)]  # masked edges, and valid-looking edges to the padding node 7
  noisy = make_graph(N, [EDGES + garbage], [7], k=2)
  assert build_context(SCORES, noisy, 7) == build_context(SCORES, graph_one(), 7)


def test_context_on_built_sentence_graph():
  """Units from a C3 builder graph agree with its edges: predecessor n-1 in-passage, similar by cos."""
  rng = np.random.default_rng(0)
  n, d = 10, 16
  centers = rng.normal(size=(2, d))
  h = centers[[0, 1, 0, 1, 0, 1, 0, 1, 0, 1]] + 0.1 * rng.normal(size=(n, d))
  pids = np.array([0, 0, 0, 1, 1, 1, 2, 2, 3, -1], np.int32)
  role_probs = np.tile([0.6, 0.3, 0.1], (n, 1))
  z = np.full(n, 0.5)
  graph = build_sentence_graph(jnp.asarray(h[None], jnp.float32), jnp.asarray(role_probs[None], jnp.float32),
                               jnp.asarray(z[None], jnp.float32), jnp.asarray(pids[None]),
                               jnp.asarray(pids[None] >= 0), GraphBuildConfig(k=3, tau_sim=0.5))
  scores = rng.uniform(size=n)
  units = build_context(scores, graph, 9)[0]
  assert [u["node"] for u in units] == sorted(range(9), key=lambda i: -scores[i])
  s, r = np.asarray(graph.senders), np.asarray(graph.receivers)
  m, c, t = np.asarray(graph.edges["mask"]), np.asarray(graph.edges["cos"]), np.asarray(graph.edges["type"])
  for u in units:
    v = u["node"]
    same_prev = v > 0 and pids[v - 1] == pids[v]
    assert u["predecessor"] == (v - 1 if same_prev else None)
    nbrs = {int(s[e]): float(c[e]) for e in np.flatnonzero(m & (r == v) & (t == 7))}
    want = sorted(nbrs, key=lambda x: (-nbrs[x], x))[:2]
    assert u["similar"] == want
    assert all(pids[x] != pids[v] for x in u["similar"])
  assert any(u["similar"] for u in units)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(K=0), ConfigError, "K must be"),
        (dict(K=2.5), ConfigError, "K must be"),
        (dict(num_similar=-1), ConfigError, "num_similar"),
        (dict(global_scores=np.zeros(5)), DataError, "global_scores has shape"),
        (dict(global_scores=np.where(np.arange(N) == 3, np.nan, SCORES)), DataError, "query 0 node 3"),
        (dict(role_probs=np.zeros((N, 2))), DataError, "role_probs has shape"),
    ],
    ids=["k_zero", "k_float", "negative_num_similar", "bad_score_shape", "nan_score", "bad_role_shape"])
def test_bad_input_raises(kwargs, error, match):
  args = dict(global_scores=SCORES, graph=graph_one(), K=3)
  args.update(kwargs)
  with pytest.raises(error, match=match):
    build_context(**args)


def test_nan_score_on_padding_node_is_fine():
  scores = SCORES.copy()
  scores[7] = np.nan
  assert [u["node"] for u in build_context(scores, graph_one(), 2)[0]] == [1, 6]


@pytest.mark.parametrize(
    "edges, match",
    [([(0, 2, 0, 0.5)], "neither"), ([(2, 1, 0, 0.5)], "neither")],
    ids=["skip_edge", "backward_one_way_edge"])
def test_malformed_edges_raise(edges, match):
  with pytest.raises(DataError, match=match):
    build_context(SCORES, make_graph(N, [edges], [7], k=2), 3)


def test_edge_crossing_queries_raises():
  graph = make_graph(N, [EDGES, []], [7, 3], k=2)
  senders = np.asarray(graph.senders).copy()
  senders[0] = N + 1  # query 0's first valid edge now starts in query 1
  with pytest.raises(DataError, match="crosses queries"):
    build_context(np.zeros(2 * N), graph._replace(senders=senders), 3)
