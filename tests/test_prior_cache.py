"""The split dense prior's pass on deduplicated segments (`serving.prior_cache`): the engine's
scores equal the in-graph pass's, each distinct query and passage window is encoded once, and
the cache follows the params."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from logrerank_bench.suites import init_log_params
from logrerank_jax import engine as inference
from logrerank_jax.data.inference_input import parse_inference_record
from logrerank_jax.data.packing import PackingConfig, QueryInput, pack_queries
from logrerank_jax.datasets.wordpiece import train_wordpiece_tokenizer
from logrerank_jax.errors import ConfigError
from logrerank_jax.models.encoders import bert as mbert
from logrerank_jax.models import log_reranker as lr
from logrerank_jax.models.local_scorer import split_query_passage
from logrerank_jax.engine.prior_cache import call_units

from test_inference import make_pools

# Rows of 128 tokens: SciFact abstracts need several windows, so a passage is cut into windows
# and each window is its own segment; coarse buckets keep the compiled shapes few.
PACKING = PackingConfig(row_len=128, max_query_tokens=24, row_buckets=(8, 16, 32),
                        span_buckets=(256, 512), node_buckets=(64, 128))
# (encoder family, pooling, passage [CLS]): the demo's prior, and the other pooling, layout and
# encoder family.
CASES = [("bert", "passage", True), ("modernbert", "sentence", False)]


@pytest.fixture(scope="module")
def records():
  """Real SciFact pools in which passages repeat across queries (as evaluation pools share
  BM25 negatives), and one query repeated with other passages."""
  pools = make_pools(pool_size=4, limit=4)[0]
  shared = pools[0]["ctxs"][1]
  recs = [dict(p, ctxs=p["ctxs"] + [shared]) if i else p for i, p in enumerate(pools)]
  recs.append(dict(pools[1], id="again", ctxs=pools[2]["ctxs"][:2]))
  return recs


@pytest.fixture(scope="module")
def tokenizer(records):
  texts = [r["input"] for r in records] + [c["text"] for r in records for c in r["ctxs"]]
  return train_wordpiece_tokenizer(texts, 600)


def _model(tokenizer, family, pooling, passage_cls, seed=0):
  cfg = lr.LoGConfig.tiny(vocab_size=len(tokenizer))
  local = cfg.local
  if family == "bert":  # token types: the prior's segments must use type 0
    local = dataclasses.replace(local, encoder=mbert.BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=128, type_vocab_size=2))
  local = dataclasses.replace(local, dense_prior=3.0, dense_prior_pooling=pooling,
                              dense_prior_passage_cls=passage_cls)
  cfg = dataclasses.replace(cfg, local=local)
  ex, _ = pack_queries([QueryInput("q", [["a b", "c"]])], tokenizer, PackingConfig(row_len=128))
  return init_log_params(cfg, ex, seed), cfg


def _rerankers(params, cfg, tokenizer):
  make = lambda segments: inference.Reranker(  # noqa: E731
      params, cfg, tokenizer, packing=PACKING, queries_per_batch=2, host_workers=0,
      prior_cache_segments=segments)
  return make(1000), make(0)


@pytest.fixture(scope="module")
def demo_case(tokenizer):
  """The demo's prior (CASES[0]): params, config, and a cached and an in-graph reranker (one
  set of compiled calls shared by the tests below)."""
  params, cfg = _model(tokenizer, *CASES[0])
  return (params, cfg) + _rerankers(params, cfg, tokenizer)


@pytest.mark.parametrize("family,pooling,passage_cls", CASES)
def test_cached_prior_equals_the_in_graph_pass(records, tokenizer, demo_case, family, pooling,
                                               passage_cls):
  if (family, pooling, passage_cls) == CASES[0]:
    params, cfg, cached, inline = demo_case
  else:
    params, cfg = _model(tokenizer, family, pooling, passage_cls)
    cached, inline = _rerankers(params, cfg, tokenizer)
  assert cached.engine.prior_cache is not None and inline.engine.prior_cache is None
  recs = [parse_inference_record(r, str(i)) for i, r in enumerate(records)]
  got, want = cached.score(recs), inline.score(recs)
  for g, w in zip(got, want):
    # The same float32 computation per segment, packed into other rows (other neighbours,
    # never attended; other matmul blockings): measured <= 6e-7 on O(1) logits (the demo's
    # MiniLM: 5e-7 on its 0-1 scores); 1e-5 bounds it with margin. The prior moves the
    # logits by w * cos, w = 3, so a wrong segment (a cosine off by ~0.1) fails by far.
    np.testing.assert_allclose(g.local_score, w.local_score, atol=1e-5)
    np.testing.assert_allclose(g.final_score, w.final_score, atol=1e-5)
    np.testing.assert_array_equal(g.node_passage, w.node_passage)
  # The prior moves the scores: without it they differ by far more than the bound above.
  no_prior = dataclasses.replace(cfg, local=dataclasses.replace(cfg.local, dense_prior=0.0))
  p0 = {"local": {k: v for k, v in params["local"].items() if k != "dense_prior_scale"},
        "global": params["global"]}
  base = inference.Reranker(p0, no_prior, tokenizer, packing=PACKING, queries_per_batch=2,
                            host_workers=0).score(recs)
  assert max(np.abs(b.local_score - w.local_score).max() for b, w in zip(base, want)) > 1e-3

  # Each distinct segment was encoded once: every sequence's two segments counted, the
  # distinct ones (by their tokens) encoded.
  stats = cached.stats()["prior"]
  jobs = cached.planner.local_jobs(recs)
  keys = [u.key for arrays, _ in jobs for u in call_units(arrays, passage_cls)]
  assert stats["segments"] == len(keys) and stats["encoded"] == len(set(keys)) < len(keys)
  # Scored again: nothing new to encode, the same scores bit for bit.
  again = cached.score(recs)
  assert cached.engine.prior_cache.stats["encoded"] == stats["encoded"]
  for a, g in zip(again, got):
    np.testing.assert_array_equal(a.local_score, g.local_score)


@pytest.mark.parametrize("passage_cls", [True, False])
def test_call_units_are_the_split_layouts_segments(records, demo_case, passage_cls):
  """`call_units` cuts a packed call into the segments `split_query_passage` makes of it: the
  same token ids and positions, segment by segment (known answer: the in-graph layout)."""
  rr = demo_case[3]  # packing does not depend on the layout: both are checked on its calls
  recs = [parse_inference_record(r, str(i)) for i, r in enumerate(records)]
  arrays, _ = rr.planner.local_jobs(recs)[0]
  ids2, seg2, pos2 = (np.asarray(a) for a in split_query_passage(
      *(jnp.asarray(arrays[k]) for k in ("input_ids", "span_ids", "span_kind", "segment_ids",
                                          "position_ids")), passage_cls))
  want = []
  for r in range(seg2.shape[0]):
    for s in np.unique(seg2[r][seg2[r] > 0]):
      at = seg2[r] == s
      want.append((ids2[r][at].tolist(), pos2[r][at].tolist()))
  got = [(u.ids.tolist(), u.positions.tolist()) for u in call_units(arrays, passage_cls)]
  assert got == want and len(got) > 10


def test_new_params_clear_the_cache(records, tokenizer, demo_case):
  """The cache holds one params' states: after `set_params` the scores are the new params'."""
  params, cfg, cached, inline = demo_case
  other, _ = _model(tokenizer, *CASES[0], seed=1)
  recs = [parse_inference_record(r, str(i)) for i, r in enumerate(records)]
  old = cached.score(recs)
  assert len(cached.engine.prior_cache) > 0
  try:
    for rr in (cached, inline):
      rr.engine.set_params(other)
    assert len(cached.engine.prior_cache) == 0
    new, want = cached.score(recs), inline.score(recs)
  finally:
    for rr in (cached, inline):
      rr.engine.set_params(params)
  for n, w, o in zip(new, want, old):
    np.testing.assert_allclose(n.local_score, w.local_score, atol=1e-5)  # bound as above
    assert np.abs(n.local_score - o.local_score).max() > 1e-3  # the params did change


def test_bad_cache_size_is_a_config_error(tokenizer, demo_case):
  params, cfg = demo_case[:2]
  with pytest.raises(ConfigError, match="prior_cache_segments"):
    inference.Reranker(params, cfg, tokenizer, packing=PACKING, prior_cache_segments=-1)


def test_precompile_covers_the_prior_calls(records, tokenizer, demo_case):
  """`precompile` compiles the prior's calls and the local calls that carry `prior_pooled`:
  scoring afterwards compiles nothing (a server's warm-up covers live traffic)."""
  params, cfg = demo_case[:2]
  # One row bucket that holds every passage of these records (a passage larger than every
  # bucket gets a grown shape, which no warm-up can list).
  one = PackingConfig(row_len=128, max_query_tokens=24, row_buckets=(32,), span_buckets=(512,),
                      node_buckets=(64, 128))
  rr = inference.Reranker(params, cfg, tokenizer, packing=one, queries_per_batch=2,
                          host_workers=0, prior_cache_segments=1000)
  compiled = rr.precompile()["xla_compilations"]
  rr.score([parse_inference_record(r, str(i)) for i, r in enumerate(records)])
  assert rr.engine.prior_cache.stats["prior_calls"] > 1
  assert rr.compile_stats()["xla_compilations"] == compiled
