"""Tests of the relation-aware GAT global reranker against a NumPy loop reference."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import jraph
import numpy as np
import pytest

from logrerank_jax.errors import ConfigError, DataError
from logrerank_jax.graph.build import GraphBuildConfig, build_sentence_graph
from logrerank_jax.models import graph_reranker as gr

TINY = gr.GraphRerankerConfig(d_enc=12, d_model=8, num_layers=2, num_heads=2, num_edge_types=8,
                              relation_dim=4, ffn_dim=16, mlp_hidden=6, dropout=0.1)


def make_graph(num_nodes, edges_per_query, valid_per_query, k=1):
  """Return a C3-layout GraphsTuple from per-query local (sender, receiver, type, cos) lists.

  Extra entries (s, r, t, cos, False) are masked edges that still take a sorted slot.
  """
  num_q = len(edges_per_query)
  slots = (num_nodes - 1) + 2 * k * num_nodes
  senders, receivers, types, masks, coss = [], [], [], [], []
  for q, edges in enumerate(edges_per_query):
    edges = [e if len(e) == 5 else (*e, True) for e in edges]
    assert len(edges) <= slots
    edges = sorted(edges, key=lambda e: (e[1], e[0]))
    pad = (num_nodes - 1, num_nodes - 1, 0, 0.0, False)
    edges = edges + [pad] * (slots - len(edges))
    off = q * num_nodes
    senders += [off + e[0] for e in edges]
    receivers += [off + e[1] for e in edges]
    types += [e[2] for e in edges]
    coss += [e[3] for e in edges]
    masks += [e[4] for e in edges]
  node_mask = np.zeros(num_q * num_nodes, bool)
  for q, valid in enumerate(valid_per_query):
    node_mask[q * num_nodes: q * num_nodes + valid] = True
  return jraph.GraphsTuple(
      nodes={"mask": jnp.asarray(node_mask)},
      edges={"type": jnp.asarray(types, jnp.int32), "mask": jnp.asarray(masks, bool),
             "cos": jnp.asarray(coss, jnp.float32)},
      senders=jnp.asarray(senders, jnp.int32), receivers=jnp.asarray(receivers, jnp.int32),
      n_node=jnp.full((num_q,), num_nodes, jnp.int32), n_edge=jnp.full((num_q,), slots, jnp.int32),
      globals=None)


# Query 0: passage A = nodes 0-2, passage B = nodes 3-4, node 5 isolated, N = 7 (node 6 padding).
# Query 1: 3 valid nodes with one adjacency and a similarity pair; the rest padding.
N = 7
EDGES = [
    [(0, 1, 0, 0.9), (1, 2, 3, 0.8), (3, 4, 6, 0.7), (0, 3, 7, 0.8), (3, 0, 7, 0.8), (2, 4, 7, 0.77),
     (4, 2, 7, 0.77), (1, 4, 7, 0.76), (4, 1, 7, 0.76)],
    [(0, 1, 1, 0.5), (1, 2, 7, 0.9), (2, 1, 7, 0.9)],
]
VALID = [6, 3]


def make_inputs(cfg, num_nodes_total, seed=0):
  """Return random (h, role_probs, z_local) for `num_nodes_total` nodes."""
  rng = np.random.default_rng(seed)
  h = rng.normal(size=(num_nodes_total, cfg.d_enc)).astype(np.float32)
  logits = rng.normal(size=(num_nodes_total, 3))
  role_probs = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).astype(np.float32)
  z = rng.uniform(size=(num_nodes_total,)).astype(np.float32)
  return jnp.asarray(h), jnp.asarray(role_probs), jnp.asarray(z)


@functools.lru_cache(maxsize=None)
def jitted(cfg):
  """Return a cached jitted `apply` of GraphReranker(cfg); eager op-by-op runs are slow on CPU."""
  return jax.jit(gr.GraphReranker(cfg).apply, static_argnames=("deterministic",))


def run(cfg, params, *args, **kwargs):
  """Apply GraphReranker(cfg) through the cached jit."""
  return jitted(cfg)({"params": params}, *args, **kwargs)


def init_params(cfg, seed=1):
  """Return random params of GraphReranker(cfg), every leaf random (LayerNorm scales/biases too).

  Drawn with NumPy on the `param_shapes` tree: cheaper than a compiled `init` on a busy CPU, and
  non-trivial LayerNorm/bias values make the reference comparison test them as well.
  """
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(
      lambda s: jnp.asarray(rng.normal(scale=0.5, size=s.shape), jnp.float32), gr.param_shapes(cfg))


# ----------------------------------------------------------------------------- NumPy reference


def np_layer_norm(x, p, eps):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def np_gelu(x):
  return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def np_dense(x, p):
  return x @ p["kernel"] + p.get("bias", 0.0)


def reference_forward(params, cfg, h, role_probs, z, graph):
  """Per-receiver, per-head loops over valid in-edges in float64 (no segment ops)."""
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  node_mask = np.asarray(graph.nodes["mask"])
  senders, receivers = np.asarray(graph.senders), np.asarray(graph.receivers)
  types = np.asarray(graph.edges["type"]) if cfg.use_edge_types else np.zeros_like(senders)
  emask = np.asarray(graph.edges["mask"])
  h = np.where(node_mask[:, None], np.asarray(h, np.float64), 0.0)
  r = np.where(node_mask[:, None], np.asarray(role_probs, np.float64), 0.0)
  z = np.where(node_mask, np.asarray(z, np.float64), 0.0)
  ni = p["node_init"]
  x = np_layer_norm(np_dense(h, ni["phi_h"]) + np_dense(r, ni["phi_r"]) + np_dense(z[:, None], ni["phi_z"]),
                    ni["norm"], cfg.layer_norm_eps)
  n, heads, dh = x.shape[0], cfg.num_heads, cfg.head_dim
  for i in range(cfg.num_layers):
    lp = p[f"layers_{i}"]
    a = lp["attn"]
    target = x @ a["W_v"]["kernel"]
    msg = np.zeros_like(x)
    for v in range(n):
      edges = [e for e in range(len(senders)) if receivers[e] == v and emask[e]
               and node_mask[senders[e]] and node_mask[v]]
      for hd in range(heads):
        sl = slice(hd * dh, (hd + 1) * dh)
        scores, values = [], []
        for e in edges:
          src = (x[senders[e]] @ a["W_rel"][types[e]])
          cat = np.concatenate([target[v, sl], src[sl], a["rel_emb"][types[e]]])
          s = a["att"][hd] @ cat
          scores.append(s if s > 0 else cfg.negative_slope * s)
          values.append(src[sl])
        if edges:
          w = np.exp(np.array(scores) - max(scores))
          w /= w.sum()
          msg[v, sl] = (w[:, None] * np.array(values)).sum(0)
    x = np_layer_norm(x + np_dense(msg, a["W_o"]), lp["attn_norm"], cfg.layer_norm_eps)
    f = np_dense(np_gelu(np_dense(x, lp["ffn"]["Wi"])), lp["ffn"]["Wo"])
    x = np_layer_norm(x + f, lp["ffn_norm"], cfg.layer_norm_eps)
  sc = p["scorer"]
  logits = np_dense(np_gelu(np_dense(x, sc["hidden"])), sc["out"])[:, 0]
  return np.where(node_mask, logits, 0.0)


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize(
    "overrides",
    [dict(num_layers=1), dict(num_layers=2), dict(num_layers=2, use_edge_types=False),
     dict(num_layers=1, num_heads=1)],
    ids=["one_layer", "two_layers", "no_edge_types", "one_head"])
def test_matches_numpy_reference(overrides):
  cfg = dataclasses.replace(TINY, **overrides)
  graph = make_graph(N, EDGES, VALID)
  inputs = make_inputs(cfg, 2 * N)
  params = init_params(cfg)
  out = run(cfg, params, *inputs, graph)
  ref = reference_forward(params, cfg, *inputs, graph)
  assert out.dtype == jnp.float32 and out.shape == (2 * N,)
  err = float(np.max(np.abs(np.asarray(out, np.float64) - ref)))
  print(f"max abs err vs NumPy reference ({'/'.join(f'{k}={v}' for k, v in overrides.items())}): {err:.2e}")
  # float32 vs float64 reference: logits |l| <= ~0.3 here; each of the ~6 rounded stages per layer
  # (projections K <= 32, attention softmax, FFN, norms) adds a few eps (1.19e-7) of O(1)
  # activations: ~4 eps x 12 stages ~ 6e-6 < 1e-5 derived; measured <= 2.1e-7 on every ISA.
  assert err < 1e-5


def test_jit_equals_no_jit():
  graph = make_graph(N, EDGES, VALID)
  inputs = make_inputs(TINY, 2 * N)
  params = init_params(TINY)
  model = gr.GraphReranker(TINY)
  eager = model.apply({"params": params}, *inputs, graph)
  compiled = run(TINY, params, *inputs, graph)
  # jit vs eager: two float32 evaluation orders of logits |l| <= ~0.3 (not bit-exact); measured
  # 1.2e-7 with the default, AVX2 and SSE4.2 kernels, 1e-6 is 8x that.
  np.testing.assert_allclose(np.asarray(compiled), np.asarray(eager), rtol=0, atol=1e-6)


def test_padding_never_changes_valid_outputs():
  """Extra garbage padding nodes, masked edges and a padding graph leave valid logits unchanged."""
  base_graph = make_graph(N, EDGES, VALID)
  inputs = make_inputs(TINY, 2 * N)
  params = init_params(TINY)
  base = np.asarray(run(TINY, params, *inputs, base_graph))

  n2 = N + 3  # three more padding nodes per query, then one all-padding query block
  garbage = [(6, 0, 7, 5.0, False), (8, 2, 3, -1.0, False), (0, 9, 2, 0.1, False),  # into/out of padding
             (4, 0, 5, 0.3, False), (2, 1, 6, 0.2, False)]  # masked edges between valid nodes
  edges2 = [EDGES[0] + garbage, EDGES[1] + [(7, 1, 4, 0.0, False)], [(0, 1, 2, 0.5, False)]]
  graph2 = make_graph(n2, edges2, VALID + [0], k=1)
  rng = np.random.default_rng(7)
  h, r, z = (np.asarray(a) for a in inputs)
  h2 = rng.normal(scale=1e3, size=(3 * n2, TINY.d_enc)).astype(np.float32)
  r2 = rng.normal(scale=1e3, size=(3 * n2, 3)).astype(np.float32)
  z2 = rng.normal(scale=1e3, size=(3 * n2,)).astype(np.float32)
  h2[6, 0], h2[n2 + 5, 1], z2[2 * n2 + 1] = np.nan, np.inf, -np.inf  # padding may hold anything
  old_idx = np.concatenate([np.arange(VALID[q]) + q * N for q in range(2)])
  new_idx = np.concatenate([np.arange(VALID[q]) + q * n2 for q in range(2)])
  h2[new_idx], r2[new_idx], z2[new_idx] = h[old_idx], r[old_idx], z[old_idx]
  out2 = np.asarray(run(TINY, params, jnp.asarray(h2), jnp.asarray(r2), jnp.asarray(z2), graph2))
  # Other padded shapes compile to another program (float32 reassociation, like jit vs eager
  # above); measured 0 on every ISA, 1e-6 is the jit-vs-eager bound.
  np.testing.assert_allclose(out2[new_idx], base[old_idx], rtol=0, atol=1e-6)
  pad = np.setdiff1d(np.arange(3 * n2), new_idx)
  np.testing.assert_array_equal(out2[pad], 0.0)


def test_isolated_node_is_finite_and_equals_single_node_graph():
  """Node 5 of query 0 has no edge: its logit must equal that of a one-node graph."""
  graph = make_graph(N, EDGES, VALID)
  inputs = make_inputs(TINY, 2 * N)
  params = init_params(TINY)
  out = run(TINY, params, *inputs, graph)
  assert bool(jnp.all(jnp.isfinite(out)))
  single = make_graph(1, [[]], [1], k=1)
  alone = run(TINY, params, *(a[5:6] for a in inputs), single)
  # Another shape, another program: measured 3e-8 on every ISA; 1e-6 as for jit vs eager.
  np.testing.assert_allclose(np.asarray(alone)[0], np.asarray(out)[5], rtol=0, atol=1e-6)


def test_gradients_finite_with_isolated_nodes_and_garbage_padding():
  graph = make_graph(N, EDGES, VALID)
  h, r, z = make_inputs(TINY, 2 * N)
  h = h.at[6].set(jnp.inf).at[13].set(jnp.nan)  # padding nodes of both queries
  params = init_params(TINY)
  model = gr.GraphReranker(TINY)

  def loss(p):
    return jnp.sum(model.apply({"params": p}, h, r, z, graph) ** 2)

  value, grads = jax.jit(jax.value_and_grad(loss))(params)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(grads))
  assert np.isfinite(float(value)) and float(value) > 0
  # Padding features must get no gradient path: phi_h's kernel gradient is finite and nonzero.
  assert float(jnp.abs(grads["node_init"]["phi_h"]["kernel"]).sum()) > 0


def expected_param_count(cfg):
  """Closed-form parameter count of the architecture in the module docstring."""
  d, t = cfg.d_model, cfg.num_relations
  init = (cfg.d_enc + 3 + 1) * d + 3 * d + 2 * d
  attn = d * d + t * d * d + t * cfg.relation_dim + cfg.num_heads * (2 * cfg.head_dim + cfg.relation_dim)
  attn += d * d + d
  ffn = d * cfg.ffn_dim + cfg.ffn_dim + cfg.ffn_dim * d + d
  layer = attn + ffn + 4 * d
  scorer = d * cfg.mlp_hidden + cfg.mlp_hidden + cfg.mlp_hidden + 1
  return init + cfg.num_layers * layer + scorer


def test_paper_config_param_count():
  cfg = gr.GraphRerankerConfig()
  assert (cfg.d_model, cfg.num_layers, cfg.num_heads, cfg.num_edge_types, cfg.d_enc) == (256, 2, 4, 8, 768)
  count = gr.param_count(cfg)
  print(f"paper global reranker params: {count:,} ({100 * (count / 2.67e6 - 1):+.2f} % vs 2.67M)")
  assert count == expected_param_count(cfg)
  assert abs(count / 2.67e6 - 1) < 0.02


def test_use_edge_types_false_changes_only_relation_params():
  cfg = gr.GraphRerankerConfig()
  ablated = dataclasses.replace(cfg, use_edge_types=False)
  full, one = gr.param_shapes(cfg), gr.param_shapes(ablated)
  flat_full = {jax.tree_util.keystr(k): v.shape for k, v in jax.tree_util.tree_leaves_with_path(full)}
  flat_one = {jax.tree_util.keystr(k): v.shape for k, v in jax.tree_util.tree_leaves_with_path(one)}
  assert flat_full.keys() == flat_one.keys()
  changed = sorted(k for k in flat_full if flat_full[k] != flat_one[k])
  assert changed == sorted(f"['layers_{i}']['attn']['{n}']" for i in range(2) for n in ("W_rel", "rel_emb"))
  for k in changed:
    assert flat_full[k][0] == 8 and flat_one[k][0] == 1 and flat_full[k][1:] == flat_one[k][1:]
  saved = gr.param_count(cfg) - gr.param_count(ablated)
  assert saved == cfg.num_layers * 7 * (cfg.d_model ** 2 + cfg.relation_dim)


@pytest.mark.parametrize("use_edge_types", [True, False], ids=["typed", "untyped"])
def test_edge_types_matter_only_when_used(use_edge_types):
  cfg = dataclasses.replace(TINY, use_edge_types=use_edge_types)
  graph = make_graph(N, EDGES, VALID)
  inputs = make_inputs(cfg, 2 * N)
  params = init_params(cfg)
  out = run(cfg, params, *inputs, graph)
  shuffled = graph._replace(edges={**graph.edges, "type": (graph.edges["type"] + 3) % 8})
  out2 = run(cfg, params, *inputs, shuffled)
  diff = float(jnp.max(jnp.abs(out - out2)))
  if use_edge_types:
    assert diff > 1e-3
  else:
    assert diff == 0.0


def test_dropout_only_when_not_deterministic():
  graph = make_graph(N, EDGES, VALID)
  inputs = make_inputs(TINY, 2 * N)
  params = init_params(TINY)
  det = run(TINY, params, *inputs, graph, deterministic=True)
  d1 = run(TINY, params, *inputs, graph, deterministic=False, rngs={"dropout": jax.random.PRNGKey(1)})
  d1b = run(TINY, params, *inputs, graph, deterministic=False, rngs={"dropout": jax.random.PRNGKey(1)})
  d2 = run(TINY, params, *inputs, graph, deterministic=False, rngs={"dropout": jax.random.PRNGKey(2)})
  assert float(jnp.max(jnp.abs(d1 - det))) > 1e-3
  assert float(jnp.max(jnp.abs(d1 - d2))) > 1e-3
  np.testing.assert_array_equal(np.asarray(d1), np.asarray(d1b))


def test_bf16_compute_keeps_float32_scores():
  cfg16 = dataclasses.replace(TINY, dtype=jnp.bfloat16)
  graph = make_graph(N, EDGES, VALID)
  inputs = make_inputs(TINY, 2 * N)
  params = init_params(TINY)
  out32 = run(TINY, params, *inputs, graph)
  out16 = run(cfg16, params, *inputs, graph)
  assert out16.dtype == jnp.float32
  err = float(jnp.max(jnp.abs(out16 - out32)))
  scale = float(jnp.max(jnp.abs(out32)))
  print(f"bf16 vs f32 max abs err {err:.3e} (max |logit| {scale:.3f})")
  assert bool(jnp.all(jnp.isfinite(out16)))
  # bf16 (u = 2^-9 relative per rounding), ~6 roundings per layer x 2 layers adding up:
  # <= 12 u ~ 2.3e-2 of max(scale, 1); 0.1 leaves 4x on that; measured 2.9e-3 (34x).
  assert err < 0.1 * max(scale, 1.0)


def test_unsorted_receivers_with_receivers_sorted_false():
  """Edges in a shuffled order give the same logits when the config says they are unsorted."""
  cfg = dataclasses.replace(TINY, receivers_sorted=False)
  graph = make_graph(N, EDGES, VALID)
  inputs = make_inputs(TINY, 2 * N)
  params = init_params(TINY)
  perm = np.random.default_rng(11).permutation(graph.senders.shape[0])
  shuffled = graph._replace(senders=graph.senders[perm], receivers=graph.receivers[perm],
                            edges={k: v[perm] for k, v in graph.edges.items()})
  assert np.any(np.diff(np.asarray(shuffled.receivers)) < 0)
  np.testing.assert_allclose(np.asarray(run(cfg, params, *inputs, shuffled)),
                             np.asarray(run(TINY, params, *inputs, graph)), rtol=0, atol=1e-6)
  # (Shuffled edges change the segment-sum order: float32 reassociation; measured 0, 1e-6 as
  # for jit vs eager.)


def test_dtype_names_normalise():
  assert dataclasses.replace(TINY, dtype="bfloat16") == dataclasses.replace(TINY, dtype=jnp.bfloat16)
  assert dataclasses.replace(TINY, dtype="bfloat16").dtype == jnp.dtype(jnp.bfloat16)


def test_masked_segment_softmax_matches_jraph_on_valid_edges():
  rng = np.random.default_rng(3)
  receivers = jnp.asarray([0, 0, 0, 1, 1, 3, 3, 3], jnp.int32)
  logits = jnp.asarray(rng.normal(size=(8, 2)), jnp.float32)
  mask = jnp.asarray([True, True, False, True, True, False, False, True])
  got = gr.masked_segment_softmax(logits, mask, receivers, 4, indices_are_sorted=True)
  keep = np.flatnonzero(np.asarray(mask))
  want = jraph.segment_softmax(logits[keep], receivers[keep], num_segments=4)
  # Probabilities in [0, 1], <= 3 terms per segment: a few eps (1.19e-7) each; measured 0.
  np.testing.assert_allclose(np.asarray(got)[keep], np.asarray(want), rtol=0, atol=1e-6)
  np.testing.assert_array_equal(np.asarray(got)[~np.asarray(mask)], 0.0)
  # node 3: one valid edge, exp(0) / exp(0) = 1 exactly in float32 (measured 0); 1e-7 < 1 eps.
  np.testing.assert_allclose(np.asarray(got)[7], 1.0, atol=1e-7)


def test_runs_on_built_sentence_graph():
  """End to end on the C3 builder's output, jitted, with edge types and similarity edges."""
  rng = np.random.default_rng(5)
  q, n = 2, 6
  base = rng.normal(size=(3, TINY.d_enc))
  h = base[rng.integers(0, 3, size=q * n)] + 0.05 * rng.normal(size=(q * n, TINY.d_enc))
  role_probs = np.eye(3)[rng.integers(0, 3, size=q * n)] * 0.8 + 0.2 / 3
  z = rng.uniform(0.4, 0.6, size=q * n)
  pids = np.array([[0, 0, 0, 1, 1, 2], [0, 0, 1, 1, -1, -1]], np.int32)
  mask = pids >= 0
  graph = build_sentence_graph(jnp.asarray(h.reshape(q, n, -1), jnp.float32),
                               jnp.asarray(role_probs.reshape(q, n, 3), jnp.float32),
                               jnp.asarray(z.reshape(q, n), jnp.float32), jnp.asarray(pids),
                               jnp.asarray(mask), GraphBuildConfig(k=2, tau_sim=0.5, delta=0.5))
  inputs = (jnp.asarray(h, jnp.float32), jnp.asarray(role_probs, jnp.float32), jnp.asarray(z, jnp.float32))
  params = init_params(TINY)
  out = run(TINY, params, *inputs, graph)
  ref = reference_forward(params, TINY, *inputs, graph)
  assert int(jnp.sum(graph.edges["mask"] & (graph.edges["type"] == 7))) > 0
  # float32 vs float64 reference, derived as in test_matches_numpy_reference (1e-5);
  # measured 1.0e-7 on every ISA.
  np.testing.assert_allclose(np.asarray(out, np.float64), ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "overrides", [dict(d_model=10, num_heads=4), dict(num_layers=0), dict(dropout=1.0), dict(dtype="nope")],
    ids=["heads_not_dividing", "zero_layers", "dropout_one", "bad_dtype"])
def test_bad_config_raises_config_error(overrides):
  with pytest.raises(ConfigError):
    dataclasses.replace(TINY, **overrides)


def test_wrong_input_shape_raises_data_error():
  graph = make_graph(N, EDGES, VALID)
  h, r, z = make_inputs(TINY, 2 * N)
  with pytest.raises(DataError, match="h has shape"):
    gr.GraphReranker(TINY).init(jax.random.PRNGKey(0), h[:, :5], r, z, graph)
  with pytest.raises(DataError, match="z_local"):
    gr.GraphReranker(TINY).init(jax.random.PRNGKey(0), h, r, z[:-1], graph)


def test_residual_local_adds_local_logit_and_starts_at_it():
  """residual_local (NOT in the paper): logit = l_local + MLP_global(x_L), output layer zero-init."""
  cfg = dataclasses.replace(TINY, residual_local=True)
  graph = make_graph(N, EDGES, VALID)
  h, roles, z = make_inputs(cfg, 2 * N)
  local_logit = jnp.asarray(np.random.default_rng(3).normal(scale=5.0, size=(2 * N,)), jnp.float32)
  mask = np.asarray(graph.nodes["mask"])
  # Same params, with and without the residual: the outputs differ by exactly l_local (valid
  # nodes) - one float32 addition of O(5) values, <= 1 ulp(8) = 9.5e-7; bound 2e-6.
  params = init_params(TINY)
  plain = np.asarray(run(TINY, params, h, roles, z, graph))
  resid = np.asarray(run(cfg, params, h, roles, z, graph, local_logit=local_logit))
  np.testing.assert_allclose(resid, np.where(mask, plain + np.asarray(local_logit), 0.0), atol=2e-6)
  # Flax init: the scorer's output layer is zero, so the global logit is the local logit exactly.
  init = gr.GraphReranker(cfg).init(jax.random.PRNGKey(0), h, roles, z, graph,
                                    local_logit=local_logit)["params"]
  assert not np.any(np.asarray(init["scorer"]["out"]["kernel"]))
  at_init = np.asarray(run(cfg, init, h, roles, z, graph, local_logit=local_logit))
  np.testing.assert_array_equal(at_init, np.where(mask, np.asarray(local_logit), 0.0))
  # ... and it can still learn: the output kernel gets a non-zero gradient at init.
  grad = jax.grad(lambda p: jnp.sum(jitted(cfg)({"params": p}, h, roles, z, graph,
                                                local_logit=local_logit) ** 2))(init)
  assert np.any(np.abs(np.asarray(grad["scorer"]["out"]["kernel"])) > 0)
  # The paper's model keeps a random output layer.
  plain_init = gr.GraphReranker(TINY).init(jax.random.PRNGKey(0), h, roles, z, graph)["params"]
  assert np.any(np.asarray(plain_init["scorer"]["out"]["kernel"]))
  with pytest.raises(DataError, match="residual_local needs local_logit"):
    run(cfg, params, h, roles, z, graph)


def test_log_reranker_leaves_the_local_logit_check_to_the_gat():
  """LoGReranker.global_logits hands features['local_logit'] (or None) to GraphReranker, whose
  check alone refuses a residual_local model without it: one DataError naming local_logit, and
  `init` (which needs no logit values) works without one, as GraphReranker's own does."""
  from logrerank_jax.models.log_reranker import LoGConfig, LoGReranker
  tiny = LoGConfig.tiny()
  cfg = dataclasses.replace(tiny, graph_reranker=dataclasses.replace(tiny.graph_reranker,
                                                                     residual_local=True))
  q, n = 2, 5
  h, roles, z = make_inputs(cfg.graph_reranker, q * n)
  feats = {"h": h.reshape(q, n, -1), "role_probs": roles.reshape(q, n, -1),
           "local_score": z.reshape(q, n)}
  node_passage = jnp.asarray(np.repeat([[0, 0, 1, 1, -1]], q, axis=0), jnp.int32)
  node_mask = node_passage >= 0
  model = LoGReranker(cfg)
  params = model.init(jax.random.PRNGKey(0), feats, node_passage, node_mask,
                      method=LoGReranker.global_logits)["params"]
  with pytest.raises(DataError) as e:
    model.apply({"params": params}, feats, node_passage, node_mask,
                method=LoGReranker.global_logits)
  # The first line is the library's (JAX may append a note on traceback filtering below it).
  assert str(e.value).splitlines()[0] == ("GraphReranker: residual_local needs local_logit of "
                                          "shape (10,), got None")
  # With the logits, the zero-initialised correction leaves exactly the local logit.
  local_logit = jnp.asarray(np.random.default_rng(1).normal(size=(q, n)), jnp.float32)
  logit, _ = model.apply({"params": params}, dict(feats, local_logit=local_logit), node_passage,
                         node_mask, method=LoGReranker.global_logits)
  np.testing.assert_array_equal(np.asarray(logit), np.where(node_mask, local_logit, 0.0))
