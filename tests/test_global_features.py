"""The node features the global stage reads: one list (`log_reranker.GLOBAL_FEATURE_KEYS`) for
the serving path and the training feature cache."""

import jax
import pytest

from logrerank_jax.models import log_reranker as lr
from logrerank_jax.serving import engine
from logrerank_jax.training import feature_cache as fc


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
