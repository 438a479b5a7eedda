"""The dense prior of the local logit (`LocalScorerConfig.dense_prior`, NOT in the paper): off by
default, exactly MLP + w * cos(h_q, h_s) when on, finite gradients at padding spans, saved and
loaded with the model config (old configs without the field load as the paper's)."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from logrerank_jax.data.packing import PackingConfig, QueryInput, pack_queries
from logrerank_jax.data.tokenization import train_wordpiece_tokenizer
from logrerank_jax.errors import ConfigError
from logrerank_jax.models import config_io
from logrerank_jax.models.local_scorer import LocalScorer, LocalScorerConfig
from logrerank_jax.models.log_reranker import LoGConfig

PACK = PackingConfig(row_len=96, row_buckets=(4,), span_buckets=(32,), node_buckets=(16,),
                     query_buckets=(2,), max_query_tokens=24)
ARGS = ("input_ids", "attention_mask", "segment_ids", "position_ids", "span_ids", "span_kind",
        "span_query")


@pytest.fixture(scope="module")
def setup(scifact_records):
  texts = [r["input"] for r in scifact_records] + [c["text"] for r in scifact_records
                                                   for c in r["gold_ctx"]]
  tok = train_wordpiece_tokenizer(texts, vocab_size=800)
  base = LoGConfig.tiny(vocab_size=len(tok)).local_scorer_config
  q = QueryInput(scifact_records[0]["input"],
                 [[scifact_records[1]["input"], scifact_records[2]["input"]],
                  [scifact_records[0]["input"]]])
  batch, _ = pack_queries([q], tok, PACK)
  args = [jnp.asarray(getattr(batch, k)) for k in ARGS]
  return base, args


def test_off_by_default_and_exactly_added_when_on(setup):
  base, args = setup
  assert base.dense_prior == 0.0 and not base.use_dense_prior
  on = dataclasses.replace(base, dense_prior=7.5)
  # Jitted: one XLA program per call instead of one per eager op (compile time is this file's cost).
  p_off = jax.jit(LocalScorer(base).init)(jax.random.PRNGKey(0), *args)["params"]
  p_on = jax.jit(LocalScorer(on).init)(jax.random.PRNGKey(0), *args)["params"]
  assert "dense_prior_scale" not in p_off and float(p_on["dense_prior_scale"][0]) == 7.5
  shared = {k: v for k, v in p_on.items() if k != "dense_prior_scale"}
  out_off = jax.jit(LocalScorer(base).apply)({"params": shared}, *args)
  out_on = jax.jit(LocalScorer(on).apply)({"params": p_on}, *args)
  h, hq, m = (np.asarray(out_on[k], np.float64) for k in ("h", "h_query", "span_mask"))
  cos = np.sum(h * hq, -1) / np.maximum(np.linalg.norm(h, axis=-1) * np.linalg.norm(hq, axis=-1),
                                        1e-6)
  want = np.asarray(out_off["local_logit"], np.float64) + 7.5 * cos * m
  # float32 head and cosine vs float64 NumPy on O(10) logits: ~1e-6 relative (a few eps of
  # 1.19e-7 per op); 1e-5 absolute bounds it.
  np.testing.assert_allclose(np.asarray(out_on["local_logit"]), want, atol=1e-5)
  assert np.any(m > 0) and np.any(m == 0)  # sentence spans and padding/query spans both present


def test_gradients_are_finite_with_zero_padding_spans(setup):
  base, args = setup
  cfg = dataclasses.replace(base, dense_prior=5.0)
  params = jax.jit(LocalScorer(cfg).init)(jax.random.PRNGKey(1), *args)["params"]
  grads = jax.jit(jax.grad(lambda p: jnp.sum(LocalScorer(cfg).apply({"params": p}, *args)["local_logit"])))(
      params)
  leaves = jax.tree_util.tree_leaves(grads)
  assert all(np.all(np.isfinite(np.asarray(g))) for g in leaves)
  assert float(jnp.abs(grads["dense_prior_scale"][0])) > 0


def test_config_round_trip_and_old_configs(setup):
  base, _ = setup
  cfg = dataclasses.replace(LoGConfig.tiny(vocab_size=800),
                            local=dataclasses.replace(base, dense_prior=20.0))
  d = config_io.log_config_to_dict(cfg)
  assert config_io.log_config_from_dict(json.loads(json.dumps(d))).local.dense_prior == 20.0
  del d["log_config"]["local"]["dense_prior"]  # a model saved before the field existed
  assert config_io.log_config_from_dict(d).local.dense_prior == 0.0
  with pytest.raises(ConfigError, match="dense_prior"):
    LocalScorerConfig(encoder=base.encoder, dense_prior=-1.0)
