"""The node features the global stage reads: one list (`log_reranker.GLOBAL_FEATURE_KEYS`) for
the serving path and the training feature cache, and the cache never feeding a missing one as
zeros."""

import logging
import pathlib

import jax
import numpy as np
import pytest

from logrerank_jax.errors import DataError
from logrerank_jax.models import log_reranker as lr
from logrerank_jax.engine import device as engine
from logrerank_jax.training import feature_cache as fc

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_local():
  """(cfg, {"local": params}, example batch) of the tiny model's local stage."""
  cfg = lr.LoGConfig.tiny()
  batch = lr.example_batch()
  return cfg, lr.init_stage_params(cfg, "local", batch, jax.random.PRNGKey(0)), batch


def test_serving_and_cache_carry_the_one_key_list(tiny_local, monkeypatch):
  """Both paths give the global stage exactly GLOBAL_FEATURE_KEYS; the serving path reads the
  list when it runs, so a key added there (as local_logit was for residual_local) reaches it."""
  cfg, params, batch = tiny_local
  assert set(lr.GLOBAL_FEATURE_KEYS) <= set(lr.LOCAL_NODE_KEYS)
  assert set(fc.local_features(cfg, params["local"], batch)) == set(lr.GLOBAL_FEATURE_KEYS)
  assert set(engine.local_forward(params, batch, cfg)) == set(lr.GLOBAL_FEATURE_KEYS)
  monkeypatch.setattr(lr, "GLOBAL_FEATURE_KEYS", ("h", "local_logit", "intent_probs"))
  assert set(engine.local_forward(params, batch, cfg)) == {"h", "local_logit", "intent_probs"}


def _cached_item(m=3, d=4, seed=0):
  """One query's cached features and labels (`CACHED_KEYS`), `m` nodes of width `d`."""
  rng = np.random.default_rng(seed)
  return {"h": rng.normal(size=(m, d)).astype(np.float32),
          "role_probs": np.full((m, 3), 1 / 3, np.float32),
          "local_score": rng.uniform(size=m).astype(np.float32),
          "local_logit": rng.normal(size=m).astype(np.float32),
          "node_passage": np.arange(m, dtype=np.int32), "sentence_rank": np.ones(m, np.int32),
          "passage_rank": np.arange(1, m + 1, dtype=np.int32)}


def test_feature_batch_refuses_an_item_without_a_key():
  """A cached query without local_logit is an error naming the key and the query, not a zero
  local logit under a residual model's GAT."""
  items = [_cached_item(seed=0), _cached_item(seed=1)]
  b = fc.feature_batch(items, 2, 5, ["q0", "q1"])
  np.testing.assert_array_equal(b["local_logit"][1, :3], items[1]["local_logit"])
  del items[1]["local_logit"]
  with pytest.raises(DataError, match=r"^cached features of query 'q1' lack 'local_logit'; "
                                      r"delete the feature cache"):
    fc.feature_batch(items, 2, 5, ["q0", "q1"])
  with pytest.raises(DataError, match="query #1 of this batch lack 'local_logit'"):
    fc.feature_batch(items, 2, 5)


def test_a_cache_written_before_a_key_existed_is_recomputed(tmp_path, caplog):
  """A cache file with the right fingerprint but without local_logit (written before the
  global stage read it) is recomputed and rewritten, with a warning, never read back."""
  path, fingerprint = str(tmp_path / "train-p0.npz"), "fp"
  items = [_cached_item(m=3, seed=0), _cached_item(m=2, seed=1)]
  old = {k: np.concatenate([it[k] for it in items]) for k in items[0] if k != "local_logit"}
  np.savez(path, fingerprint=np.asarray(fingerprint), offsets=np.asarray([0, 3, 5]), **old)
  calls = []

  def compute():
    calls.append(1)
    return items

  with caplog.at_level(logging.WARNING, logger=fc.__name__):
    got, hit = fc.load_or_compute_features(path, fingerprint, compute)
  assert (hit, len(calls)) == (False, 1) and "lacks local_logit" in caplog.text
  # Rewritten with every key: the next run reads it back.
  again, hit = fc.load_or_compute_features(path, fingerprint, compute)
  assert (hit, len(calls)) == (True, 1)
  for a, b in zip(again, items):
    np.testing.assert_array_equal(a["local_logit"], b["local_logit"])


def test_engine_features_are_the_whole_query_packing_features(train_six):
  """The global stage's training features come from the inference engine
  (`fc.engine_features`: calls filled across queries in fine row buckets, the path evaluation
  and serving take). For the same units they are the training packer's whole-query forward
  (`fc.compute_features`, the path they replaced): the same nodes in the same order with the
  same labels, and the same features up to float rounding. Short rows and a short query cut
  make passages span windows."""
  from logrerank_jax.data.records import validate_training_file
  from logrerank_jax.data.tokenization import load_tokenizer
  from logrerank_jax.training import data as data_lib
  from logrerank_jax.training import stages
  from logrerank_jax.training.config_files import load_config_module
  config = load_config_module(str(ROOT / "configs" / "local_stage.py")).get_config("tiny")
  config.max_seq_len, config.max_query_tokens = 96, 12
  tok = load_tokenizer(str(train_six / "tok"))
  units = data_lib.query_units(validate_training_file(str(train_six / "train.jsonl"))[0])
  cfg = stages.build_model_config(config, len(tok))
  params = lr.init_stage_params(cfg, "local", lr.example_batch(), jax.random.PRNGKey(3))["local"]
  got = fc.engine_features(cfg, params, units, tok, config.max_seq_len, config.max_query_tokens)
  want = fc.compute_features(cfg, params, units, tok,
                             stages.forward_packing(stages.packing_config(config, cfg)), 4)
  assert len(got) == len(want) == len(units) == 6
  windowed = 0
  for g, w, u in zip(got, want, units):
    assert set(g) == set(w) == set(fc.CACHED_KEYS)
    assert len(g["local_score"]) == sum(len(p) for p in u.query.passages)
    for k in ("node_passage", "sentence_rank", "passage_rank"):
      np.testing.assert_array_equal(g[k], w[k], err_msg=f"{u.qid} {k}")
      assert g[k].dtype == w[k].dtype, k
    for k in ("h", "role_probs", "local_score", "local_logit"):
      assert g[k].dtype == np.float32 and g[k].shape == w[k].shape, k
      # One sequence's arithmetic in two packings (other rows, other batch shapes): float32
      # rounding of differently blocked matmuls; measured: h equal, the rest <= 6e-8 (1 ulp
      # of values < 1), so 1e-6 holds with margin on other CPUs' kernels.
      np.testing.assert_allclose(g[k], w[k], rtol=1e-5, atol=1e-6, err_msg=f"{u.qid} {k}")
    windowed += sum(len(tok(" ".join(p))["input_ids"]) > config.max_seq_len
                    for p in u.query.passages)
  assert windowed > 0  # passages longer than a row: cut into windows on both paths
