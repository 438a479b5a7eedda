"""Orbax checkpoints: exact round trip, best-by-metric, shape mismatches named."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from logrerank_jax.errors import CheckpointError
from logrerank_jax.training import optim, step as step_lib
from logrerank_jax.training.checkpoints import Checkpointer


def _state(seed=0, width=4):
  rs = np.random.RandomState(seed)
  params = {"dense": {"kernel": jnp.asarray(rs.randn(3, width), jnp.float32)},
            "bias": jnp.asarray(rs.randn(width), jnp.float32)}
  tx = optim.make_optimizer(1e-3, total_steps=10, accumulation=2)
  return step_lib.create_train_state(params, tx, seed=13), tx


def test_round_trip_is_exact(tmp_path):
  state, tx = _state()
  # Take one optimizer step so the Adam moments and MultiSteps counters are non-trivial.
  grads = jax.tree_util.tree_map(jnp.ones_like, state.params)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  state = state.replace(step=state.step + 1, opt_state=opt_state)
  ckpt = Checkpointer(str(tmp_path))
  ckpt.save(1, state, {"epoch": 0, "batch_index": 7})
  fresh, _ = _state(seed=1)
  restored, meta = Checkpointer(str(tmp_path)).restore(fresh)
  assert meta == {"epoch": 0, "batch_index": 7}
  for a, b in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(restored)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_latest_and_best(tmp_path):
  state, _ = _state()
  ckpt = Checkpointer(str(tmp_path), max_to_keep=2, best_metric="ndcg@10")
  for step, score in [(1, 10.0), (2, 30.0), (3, 20.0)]:
    ckpt.save(step, state, {"step": step})
    ckpt.save_best(step, state, {"step": step}, {"ndcg@10": score})
  assert ckpt.latest_step() == 3
  _, meta = ckpt.restore(state, best=True)
  assert meta == {"step": 2}


def test_shape_mismatch_names_the_leaf(tmp_path):
  state, _ = _state(width=4)
  Checkpointer(str(tmp_path)).save(1, state, {})
  other, _ = _state(width=5)
  with pytest.raises(CheckpointError, match=r"kernel.*\(3, 4\) vs model \(3, 5\)"):
    Checkpointer(str(tmp_path)).restore(other)


def test_missing_checkpoint_is_an_error(tmp_path):
  state, _ = _state()
  with pytest.raises(CheckpointError, match="no checkpoint"):
    Checkpointer(str(tmp_path)).restore(state)
