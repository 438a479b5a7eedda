"""One full local -> graph -> global forward over real SciFact passages; configs and sizes."""

import dataclasses
import importlib.util
import pathlib

import jax
import numpy as np
import pytest

from logrerank_jax.data.packing import pack_for_model
from logrerank_jax.graph.context import log_context
from logrerank_jax.data.packing import PackingConfig, QueryInput
from logrerank_jax.data.sentences import split_sentences
from logrerank_jax.datasets.wordpiece import train_wordpiece_tokenizer
from logrerank_jax.errors import ConfigError
from logrerank_jax.models.log_reranker import (LoGConfig, count_params, device_batch, init_params, log_forward)

PACK = PackingConfig(row_len=256, row_buckets=(8, 16), span_buckets=(64, 128), node_buckets=(32,),
                     query_buckets=(2,), max_query_tokens=48)
TOOLS = pathlib.Path(__file__).resolve().parents[1] / "tools"


@pytest.fixture(scope="module")
def run(scifact_records):
  """Split, tokenise, pack and score two real queries (3 and 2 whole abstracts) in one jit call."""
  texts = [r["input"] for r in scifact_records]
  texts += [c["text"] for r in scifact_records for c in r["gold_ctx"]]
  tokenizer = train_wordpiece_tokenizer(texts, vocab_size=2000)
  passages = [[s.text for s in split_sentences(r["gold_ctx"][0]["text"])] for r in scifact_records]
  queries = [QueryInput(scifact_records[1]["input"], passages[1:4]),
             QueryInput(scifact_records[6]["input"], passages[6:8])]
  cfg = LoGConfig.tiny(vocab_size=len(tokenizer))
  batch, info = pack_for_model(queries, tokenizer, PACK, cfg.contextual_encoding)
  params = init_params(cfg, batch, jax.random.PRNGKey(13))
  forward = jax.jit(log_forward, static_argnames=("cfg", "deterministic", "freeze_local"))
  out = forward(params, device_batch(batch), cfg)
  return dict(queries=queries, cfg=cfg, batch=batch, info=info, params=params, out=out)


def test_every_sentence_gets_finite_scores(run):
  queries, batch, out = run["queries"], run["batch"], run["out"]
  n = batch.N
  mask = np.asarray(out["node_mask"])
  for key in ("local_logit", "local_score", "global_logit", "global_score", "final_score"):
    assert out[key].dtype == np.float32 and out[key].shape == (batch.Q * n,), key
  for qi, q in enumerate(queries):
    for pi, passage in enumerate(q.passages):
      assert passage, "real abstracts have sentences"
      for si in range(len(passage)):
        hit = np.flatnonzero((batch.node_passage[qi] == pi) & (batch.node_sentence[qi] == si))
        assert len(hit) == 1, (qi, pi, si)
        node = qi * n + hit[0]
        assert mask[node]
        for key in ("local_logit", "global_logit"):
          assert np.isfinite(float(out[key][node])), (key, qi, pi, si)
        for key in ("local_score", "global_score"):
          assert 0.0 < float(out[key][node]) < 1.0, (key, qi, pi, si)
        # float32 softmax of 3 roles: sum off by a few eps (1.19e-7); measured 1.2e-7 (8x).
        np.testing.assert_allclose(float(np.sum(out["role_probs"][node])), 1.0, atol=1e-6)
  assert int(mask.sum()) == sum(len(p) for q in queries for p in q.passages)
  # Padding nodes hold zeros, not garbage.
  assert not np.asarray(out["final_logit"])[~mask].any()
  assert not np.asarray(out["local_logit"])[~mask].any()


def test_windows_and_packing_were_exercised(run):
  """The real abstracts are long enough to need windows (each repeating the query)."""
  info, batch = run["info"], run["batch"]
  assert max(p.num_windows for q in info.passages for p in q) >= 2
  assert info.num_sequences > sum(len(q.passages) for q in run["queries"])
  assert int((batch.span_kind == 1).sum()) == info.num_sequences  # one query span per window
  assert 0.0 < info.padding_efficiency <= 1.0


def test_graph_stays_within_queries_and_has_edges(run):
  g, n = run["out"]["graph"], run["batch"].N
  m = np.asarray(g.edges["mask"])
  s, r = np.asarray(g.senders)[m], np.asarray(g.receivers)[m]
  assert m.sum() > 0
  np.testing.assert_array_equal(s // n, r // n)
  assert np.all(np.diff(np.asarray(g.receivers)) >= 0)  # C3: receivers globally sorted


def test_jit_equals_no_jit(run):
  eager = log_forward(run["params"], run["batch"], run["cfg"])
  for key in ("local_logit", "global_logit", "role_probs", "intent_probs"):
    # jit vs eager: float32 reassociation through the encoder (~4 eps x depth x scale ~ 1e-5,
    # tests/test_modernbert_parity.py) then the GAT; measured 6.6e-7 on every ISA (15x).
    np.testing.assert_allclose(np.asarray(run["out"][key]), np.asarray(eager[key]), atol=1e-5,
                               err_msg=key)


def test_context_units_cover_top_k(run):
  contexts = log_context(run["out"], run["cfg"])
  assert len(contexts) == run["batch"].Q
  for qi, q in enumerate(run["queries"]):
    units = contexts[qi]
    assert len(units) == min(run["cfg"].context_k, sum(len(p) for p in q.passages))
    scores = [u["score"] for u in units]
    assert scores == sorted(scores, reverse=True)


def test_tiny_is_paper_with_smaller_sizes():
  """tiny() changes sizes only: switches, loss settings and graph thresholds are the paper's."""
  paper, tiny = LoGConfig.paper(), LoGConfig.tiny()
  for f in dataclasses.fields(LoGConfig):
    if f.name not in ("local", "graph", "graph_reranker", "context_k"):
      assert getattr(tiny, f.name) == getattr(paper, f.name), f.name
  assert (tiny.graph.tau_sim, tiny.graph.delta) == (paper.graph.tau_sim, paper.graph.delta)
  enc_t, enc_p = tiny.local.encoder, paper.local.encoder
  for name in ("hidden_activation", "norm_bias", "attention_bias", "mlp_bias",
               "global_rope_theta", "local_rope_theta", "classifier_pooling"):
    assert getattr(enc_t, name) == getattr(enc_p, name), name
  assert set(enc_t.layer_types) == {"full_attention", "sliding_attention"}
  assert tiny.local.dropout == paper.local.dropout == 0.1
  assert (paper.lambda_role, paper.tau, paper.graph.k) == (0.5, 1.0, 8)


@pytest.mark.parametrize("key,paper_count", [
    ("local", 149.85e6), ("global", 2.67e6), ("total", 152.52e6)], ids=["local", "global", "total"])
def test_paper_param_counts_match_table10(key, paper_count):
  counts = count_params(LoGConfig.paper())  # eval_shape: no allocation
  assert abs(counts[key] / paper_count - 1.0) <= 0.02, counts


def test_param_table_tool(capsys):
  spec = importlib.util.spec_from_file_location("param_table", TOOLS / "param_table.py")
  tool = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(tool)
  assert tool.main([]) == 0
  printed = capsys.readouterr().out
  assert "149,854,599" in printed and "global reranker" in printed
  assert tool.main(["--tolerance", "0.0001"]) == 1  # the global count is 0.19 % off


def test_mismatched_encoder_and_gat_widths_raise():
  paper = LoGConfig.paper()
  with pytest.raises(ConfigError, match="d_enc"):
    dataclasses.replace(paper, graph_reranker=dataclasses.replace(paper.graph_reranker, d_enc=32))


def test_dropout_is_keyed_and_freeze_local_stops_gradients(run):
  params, batch, cfg = run["params"], device_batch(run["batch"]), run["cfg"]
  mask = np.asarray(run["out"]["node_mask"])

  def loss(p, key, freeze):
    out = log_forward(p, batch, cfg, deterministic=False, rngs={"dropout": key},
                      freeze_local=freeze)
    return jax.numpy.sum(out["final_logit"]), out

  step = jax.jit(jax.grad(loss, has_aux=True), static_argnums=2)
  g_free, out_a = step(params, jax.random.PRNGKey(1), False)
  g_frozen, out_b = step(params, jax.random.PRNGKey(1), True)
  _, out_c = step(params, jax.random.PRNGKey(2), True)
  # Dropout is active (differs from the deterministic run), keyed (same key -> same mask; the
  # two programs differ only by stop_gradient, so outputs agree to float32 rounding: the
  # jit-vs-eager bound 1e-5 above; measured 4.8e-7 on every ISA).
  np.testing.assert_allclose(np.asarray(out_a["final_logit"]), np.asarray(out_b["final_logit"]),
                             atol=1e-5)
  assert np.abs(np.asarray(out_c["final_logit"]) - np.asarray(out_b["final_logit"]))[mask].max() > 0
  deterministic = np.asarray(run["out"]["final_logit"])
  assert np.abs(np.asarray(out_a["final_logit"]) - deterministic)[mask].max() > 0
  # Global stage: the local model gets exactly zero gradient; the GAT still learns.
  frozen_local = jax.tree_util.tree_leaves(g_frozen["local"])
  assert all(not np.asarray(x).any() for x in frozen_local)
  assert any(np.asarray(x).any() for x in jax.tree_util.tree_leaves(g_frozen["global"]))
  assert any(np.asarray(x).any() for x in jax.tree_util.tree_leaves(g_free["local"]))
