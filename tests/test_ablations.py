"""Every paper ablation switch changes exactly what it names, on one real tiny batch.

The model runs eagerly here (no jit): eager op compilations are shared across the ablated
configs, which keeps eleven configurations within the CPU budget.
"""

import dataclasses

import jax
import numpy as np
import pytest

from logrerank_jax.data.packing import pack_for_model
from logrerank_jax.graph.context import log_context
from logrerank_jax.data.packing import PackingConfig, QueryInput
from logrerank_jax.data.sentences import split_sentences
from logrerank_jax.datasets.wordpiece import train_wordpiece_tokenizer
from logrerank_jax.errors import ConfigError
from logrerank_jax.graph.build import GraphBuildConfig
from logrerank_jax.models.log_reranker import (ABLATIONS, LoGConfig, LoGReranker, ablation,
                                               count_params, device_batch,
                                               log_forward)

PACK = PackingConfig(row_len=192, row_buckets=(4, 8, 16), span_buckets=(64,), node_buckets=(16,),
                     query_buckets=(1,), max_query_tokens=32)
SIM = 7  # C3: similarity edge type


@pytest.fixture(scope="module")
def tokenizer(scifact_records):
  texts = [r["input"] for r in scifact_records]
  texts += [c["text"] for r in scifact_records for c in r["gold_ctx"]]
  return train_wordpiece_tokenizer(texts, vocab_size=2000)


@pytest.fixture(scope="module")
def queries(scifact_records):
  """One real claim with three real abstracts (first 4 sentences each) as its passages."""
  passages = [[s.text for s in split_sentences(r["gold_ctx"][0]["text"])][:4]
              for r in scifact_records[:3]]
  return [QueryInput(scifact_records[0]["input"], passages)]


@pytest.fixture(scope="module")
def base_cfg(tokenizer):
  # A random tiny encoder gives cosines well below the paper's 0.75; a lower threshold keeps
  # similarity edges in the base graph so that their ablations have something to remove.
  cfg = LoGConfig.tiny(vocab_size=len(tokenizer))
  return dataclasses.replace(cfg, graph=dataclasses.replace(cfg.graph, tau_sim=0.0, delta=0.5))


@pytest.fixture(scope="module")
def batch(queries, tokenizer, base_cfg):
  packed, _ = pack_for_model(queries, tokenizer, PACK, base_cfg.contextual_encoding)
  return packed


@pytest.fixture(scope="module")
def base(base_cfg, batch):
  params = LoGReranker(base_cfg).init(jax.random.PRNGKey(0), device_batch(batch))["params"]
  return params, log_forward(params, batch, base_cfg)


def _param_tree(cfg, batch):
  """The param tree `cfg`'s model initialises, as shapes (the tests that read only its structure
  need no compiled init)."""
  return jax.eval_shape(lambda k: LoGReranker(cfg).init(k, device_batch(batch))["params"],
                        jax.random.PRNGKey(0))


def _valid_edges(out, types=None):
  """Set of (sender, receiver, type) of the valid edges, optionally only of some types."""
  g = out["graph"]
  m = np.asarray(g.edges["mask"])
  s, r, t = (np.asarray(x)[m] for x in (g.senders, g.receivers, g.edges["type"]))
  return {(int(a), int(b), int(c)) for a, b, c in zip(s, r, t) if types is None or c in types}


def _pairs(edges):
  return {(s, r) for s, r, _ in edges}


def _assert_same(out, ref, keys):
  for k in keys:
    np.testing.assert_array_equal(np.asarray(out[k]), np.asarray(ref[k]), err_msg=k)


LOCAL_KEYS = ("h", "role_probs", "intent_probs", "local_logit", "local_score")
ADJ_TYPES = tuple(range(SIM))


def _ablated_params(params, cfg):
  """Base params restricted to the modules the ablated model has (checked against its init)."""
  local = dict(params["local"])
  if not cfg.use_role_head:
    local.pop("role_mlp")
  if not cfg.use_intent_head:
    local.pop("intent_mlp")
  out = {"local": local}
  if cfg.use_global:
    out["global"] = params["global"]
  return out


def test_base_batch_has_both_edge_kinds(base, batch):
  """Precondition: the base graph has adjacency and similarity edges to take away."""
  _, out = base
  assert _valid_edges(out, ADJ_TYPES) and _valid_edges(out, (SIM,))
  assert len(set(batch.node_passage[0][batch.node_mask[0]])) == 3


@pytest.mark.parametrize("name", sorted(ABLATIONS), ids=[n.replace("w/o ", "wo_").replace(" ", "_")
                                                          for n in sorted(ABLATIONS)])
def test_ablation_flips_exactly_one_switch(base_cfg, name):
  cfg = ablation(base_cfg, name)
  diff = [f.name for f in dataclasses.fields(LoGConfig)
          if getattr(cfg, f.name) != getattr(base_cfg, f.name)]
  assert diff == [ABLATIONS[name][0]]
  assert ablation(base_cfg, name.upper().replace(" ", "  ")) == cfg  # case/spacing forgiven


def test_unknown_ablation_and_sub_config_switch_raise(base_cfg):
  with pytest.raises(ConfigError, match="w/o everything"):
    ablation(base_cfg, "w/o everything")
  with pytest.raises(ConfigError, match="use_similarity"):
    dataclasses.replace(base_cfg, graph=GraphBuildConfig(use_similarity=False))


def test_wo_role_head(base, base_cfg, batch):
  params, ref = base
  cfg = ablation(base_cfg, "w/o role head")
  p = _ablated_params(params, cfg)
  init = _param_tree(cfg, batch)
  assert "role_mlp" not in init["local"]
  assert jax.tree_util.tree_structure(init) == jax.tree_util.tree_structure(p)
  out = log_forward(p, batch, cfg)
  m = np.asarray(out["node_mask"])
  # softmax of equal (zero) logits: 1 / 3 rounded once in float32 (half an ulp, 1.5e-8; measured
  # 9.9e-9); 1e-7 is < 1 eps, so any real computation error fails.
  np.testing.assert_allclose(np.asarray(out["role_probs"])[m], 1 / 3, atol=1e-7)
  assert not np.asarray(out["role_logits"]).any()
  _assert_same(out, ref, ("h", "intent_probs"))
  # Predicted roles are all 0 (uniform -> lower index), so every adjacency edge is same-role.
  adj = _valid_edges(out, ADJ_TYPES)
  assert adj and {t for _, _, t in adj} == {0}
  assert _pairs(adj) == _pairs(_valid_edges(ref, ADJ_TYPES))
  assert cfg.role_loss_weight == 0.0 and base_cfg.role_loss_weight == 0.5


def test_wo_intent_head(base, base_cfg, batch):
  params, ref = base
  cfg = ablation(base_cfg, "w/o intent head")
  p = _ablated_params(params, cfg)
  init = _param_tree(cfg, batch)
  assert "intent_mlp" not in init["local"]
  assert jax.tree_util.tree_structure(init) == jax.tree_util.tree_structure(p)
  out = log_forward(p, batch, cfg)
  m = np.asarray(out["node_mask"])
  # As for the roles: one float32 rounding of 1 / 3 (measured 9.9e-9).
  np.testing.assert_allclose(np.asarray(out["intent_probs"])[m], 1 / 3, atol=1e-7)
  _assert_same(out, ref, ("h", "role_probs", "role_logits"))
  assert np.abs(np.asarray(out["local_logit"]) - np.asarray(ref["local_logit"]))[m].max() > 0


@pytest.mark.parametrize("name,kept,removed", [
    ("w/o intra-passage edges", (SIM,), ADJ_TYPES),
    ("w/o cross-passage edges", ADJ_TYPES, (SIM,)),
], ids=["wo_intra_passage_edges", "wo_cross_passage_edges"])
def test_wo_edge_kind(base, base_cfg, batch, name, kept, removed):
  params, ref = base
  cfg = ablation(base_cfg, name)
  out = log_forward(params, batch, cfg)
  _assert_same(out, ref, LOCAL_KEYS)
  assert not _valid_edges(out, removed)
  assert _valid_edges(out, kept) == _valid_edges(ref, kept)


def test_wo_edge_constraints(base, base_cfg, batch):
  params, ref = base
  cfg = ablation(base_cfg, "w/o edge constraints")
  out = log_forward(params, batch, cfg)
  _assert_same(out, ref, LOCAL_KEYS)
  assert _valid_edges(out, ADJ_TYPES) == _valid_edges(ref, ADJ_TYPES)
  # Unconstrained: every node keeps its top-k cosine neighbours among all other-passage nodes.
  sim = _pairs(_valid_edges(out, (SIM,)))
  pid = np.asarray(batch.node_passage).reshape(-1)
  valid = np.flatnonzero(np.asarray(batch.node_mask).reshape(-1))
  for u in valid:
    cands = int(np.sum(pid[valid] != pid[u]))
    out_deg = len({v for s, v in sim if s == u})
    assert out_deg >= min(cfg.graph.k, cands), (u, out_deg, cands)
    assert all(pid[v] != pid[u] for s, v in sim if s == u)


def test_wo_edge_types(base, base_cfg, batch):
  params, ref = base
  cfg = ablation(base_cfg, "w/o edge types")
  assert cfg.graph_build_config.use_edge_types is False
  assert cfg.graph_reranker_config.use_edge_types is False
  p = LoGReranker(cfg).init(jax.random.PRNGKey(0), device_batch(batch))["params"]
  p = {"local": params["local"], "global": p["global"]}
  out = log_forward(p, batch, cfg)
  _assert_same(out, ref, LOCAL_KEYS)
  edges = _valid_edges(out)
  assert edges and {t for _, _, t in edges} == {0}
  assert _pairs(edges) == _pairs(_valid_edges(ref))
  n_abl, n_base = count_params(cfg), count_params(base_cfg)
  assert n_abl["local"] == n_base["local"] and n_abl["global"] < n_base["global"]
  assert np.isfinite(np.asarray(out["final_logit"])).all()


def test_wo_global(base, base_cfg, batch):
  params, ref = base
  cfg = ablation(base_cfg, "w/o global")
  init = _param_tree(cfg, batch)
  assert set(init) == {"local"}
  out = log_forward({"local": params["local"]}, batch, cfg)
  _assert_same(out, ref, LOCAL_KEYS)
  np.testing.assert_array_equal(np.asarray(out["final_logit"]), np.asarray(ref["local_logit"]))
  np.testing.assert_array_equal(np.asarray(out["final_score"]), np.asarray(ref["local_score"]))
  assert "global_logit" not in out
  assert _valid_edges(out) == _valid_edges(ref)  # the graph is still built for the context
  # The full model's final score is the global one, which differs from the local one.
  assert not np.array_equal(np.asarray(ref["final_logit"]), np.asarray(ref["local_logit"]))


def test_wo_contextual_encoding(base, base_cfg, batch, queries, tokenizer):
  params, ref = base
  cfg = ablation(base_cfg, "w/o contextual encoding")
  iso, _ = pack_for_model(queries, tokenizer, PACK, cfg.contextual_encoding)
  # Same graph layout and passage structure...
  for key in ("node_passage", "node_sentence", "node_mask"):
    np.testing.assert_array_equal(getattr(iso, key), getattr(batch, key), err_msg=key)
  # ...but one sequence per sentence: [CLS] q [SEP] s [SEP], holding exactly one sentence span.
  n_sent = int(batch.node_mask.sum())
  seqs = {(int(r), int(iso.segment_ids[r, c])) for r, c in zip(*np.nonzero(iso.segment_ids))}
  assert len(seqs) == n_sent
  q_len = int(np.sum(iso.span_ids == 1))
  for r, seg in seqs:
    sel = iso.segment_ids[r] == seg
    spans = set(iso.span_ids[r][sel]) - {0}
    kinds = sorted(int(iso.span_kind[s]) for s in spans)
    assert kinds == [1, 2]
    sent = [s for s in spans if iso.span_kind[s] == 2][0]
    assert sel.sum() == q_len + int(np.sum(iso.span_ids == sent)) + 3
  out = log_forward(params, iso, cfg)
  m = np.asarray(out["node_mask"])
  assert np.isfinite(np.asarray(out["final_score"])[m]).all()
  assert np.abs(np.asarray(out["local_logit"]) - np.asarray(ref["local_logit"]))[m].max() > 0


@pytest.mark.parametrize("name,check", [
    ("w/o adjacency expansion",
     lambda u, ref: u["predecessor"] is None and u["successor"] is None
     and u["similar"] == ref["similar"]),
    ("w/o similarity expansion",
     lambda u, ref: u["similar"] == [] and u["predecessor"] == ref["predecessor"]
     and u["successor"] == ref["successor"]),
    ("w/o structured context",
     lambda u, ref: set(u) == {"node", "score", "role"}),
], ids=["wo_adjacency_expansion", "wo_similarity_expansion", "wo_structured_context"])
def test_context_switches(base, base_cfg, name, check):
  _, ref = base
  cfg = ablation(base_cfg, name)
  units = log_context(ref, cfg)[0]  # context switches need no new forward
  ref_units = log_context(ref, base_cfg)[0]
  assert len(units) == len(ref_units) == base_cfg.context_k
  # Same top-K nodes in the same order; only the expansion named by the switch is gone.
  assert [u["node"] for u in units] == [u["node"] for u in ref_units]
  for u, r in zip(units, ref_units):
    assert check(u, r), (u, r)
  # The base context really has what the switch removes.
  if name == "w/o adjacency expansion":
    assert any(r["predecessor"] is not None or r["successor"] is not None for r in ref_units)
  if name == "w/o similarity expansion":
    assert any(r["similar"] for r in ref_units)


def test_context_ranks_by_final_score(base, base_cfg):
  _, ref = base
  units = log_context(ref, base_cfg)[0]
  m = np.asarray(ref["node_mask"])
  final = np.asarray(ref["final_score"])
  top = np.argsort(-np.where(m, final, -np.inf), kind="stable")[:base_cfg.context_k]
  assert [u["node"] for u in units] == top.tolist()
