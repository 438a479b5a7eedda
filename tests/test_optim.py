"""The optimizer's parameter groups: a head learning rate apart from the encoder's, the L2-SP
anchor to the starting weights, and frozen layers (training/optim.py), by known answers."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from logrerank_jax.training import optim


def _params():
  ones = lambda *s: jnp.ones(s, jnp.float32)  # noqa: E731
  return {"local": {"encoder": {"embeddings": {"w": ones(2, 2)}, "layers_0": {"w": ones(2, 2)},
                                "layers_1": {"w": ones(2, 2)}},
                    "role_mlp": {"out": {"kernel": ones(2, 3), "bias": ones(3)}},
                    "dense_prior_scale": ones(1)}}


def test_encoder_mask_marks_only_the_encoder():
  mask = optim.encoder_mask(_params())
  assert jax.tree_util.tree_leaves(mask["local"]["encoder"]) == [True] * 3
  assert not any(jax.tree_util.tree_leaves(mask["local"]["role_mlp"]))
  assert mask["local"]["dense_prior_scale"] is False


def test_role_head_mask_marks_only_the_role_head():
  mask = optim.role_head_mask(_params())
  assert jax.tree_util.tree_leaves(mask["local"]["role_mlp"]) == [True, True]
  assert not any(jax.tree_util.tree_leaves(mask["local"]["encoder"]))
  assert mask["local"]["dense_prior_scale"] is False


@pytest.mark.parametrize("frozen_layers,role_lr", [(0, 0.0), (1, 0.0), (1, 1e-2)])
def test_head_learning_rate_known_answer(frozen_layers, role_lr):
  """A constant gradient makes Adam's bias-corrected step exactly lr_t * g / (|g| + eps) per leaf,
  so after n updates a leaf has moved by the schedule's sum, at its own group's peak rate."""
  params = _params()
  frozen = optim.frozen_mask(params, frozen_layers) if frozen_layers else None
  total, n, enc_lr, head_lr = 10, 6, 2e-5, 1e-3
  tx = optim.make_optimizer(enc_lr, total, warmup_fraction=0.2, weight_decay=0.0,
                            max_grad_norm=0.0, eps=1e-12, frozen=frozen, head_lr=head_lr,
                            role_lr=role_lr)
  state = tx.init(params)
  grads = jax.tree_util.tree_map(lambda p: jnp.full_like(p, 0.25), params)
  p = params
  for _ in range(n):
    updates, state = tx.update(grads, state, p)
    p = optax.apply_updates(p, updates)
  moved = lambda peak: sum(float(optim.warmup_linear_decay(peak, total, 0.2)(t)) for t in range(n))  # noqa: E731
  enc = p["local"]["encoder"]
  # float32 params near 1: a step of 2e-5 is resolved to about 6e-8 (its ulp), so compare
  # to 1e-6 (the encoder) and 1e-5 (the heads' 100x larger moves); a wrong group is 50x off.
  np.testing.assert_allclose(enc["layers_1"]["w"], 1.0 - moved(enc_lr), atol=1e-6)
  want0 = 1.0 if frozen_layers else 1.0 - moved(enc_lr)
  np.testing.assert_allclose(enc["layers_0"]["w"], want0, atol=1e-6)
  np.testing.assert_allclose(enc["embeddings"]["w"], want0, atol=1e-6)
  np.testing.assert_allclose(p["local"]["dense_prior_scale"], 1.0 - moved(head_lr), atol=1e-5)
  # The role head at its own rate when one is given (1e-2: 10x the head's, so a wrong group
  # is off by far more than 1e-4, float32's resolution of moves near 1 of this size).
  for leaf in jax.tree_util.tree_leaves(p["local"]["role_mlp"]):
    np.testing.assert_allclose(leaf, 1.0 - moved(role_lr or head_lr), atol=1e-4 if role_lr else 1e-5)


def test_anchor_adds_the_pull_to_the_start():
  """L2-SP: the gradient gains weight * (theta - theta_0), theta_0 the params at init."""
  start = {"a": jnp.array([1.0, -2.0]), "b": jnp.array([[0.5]])}
  tx = optim.anchor_to_start(0.3)
  state = tx.init(start)
  now = {"a": jnp.array([1.5, -1.0]), "b": jnp.array([[0.0]])}
  grads = {"a": jnp.array([0.1, 0.2]), "b": jnp.array([[-1.0]])}
  out, _ = tx.update(grads, state, now)
  np.testing.assert_allclose(out["a"], [0.1 + 0.3 * 0.5, 0.2 + 0.3 * 1.0], rtol=1e-6)
  np.testing.assert_allclose(out["b"], [[-1.0 + 0.3 * -0.5]], rtol=1e-6)


def test_anchor_only_on_the_encoder_in_the_optimizer():
  """With Adam off the picture (lr 0 for the heads is not possible, so compare two runs): the
  anchor changes the encoder's trajectory and leaves the heads' exactly as without it."""
  params = _params()
  def run(anchor):
    tx = optim.make_optimizer(1e-2, 4, warmup_fraction=0.25, weight_decay=0.0, max_grad_norm=0.0,
                              head_lr=1e-2, anchor_weight=anchor)
    state, p = tx.init(params), params
    for i in range(4):
      g = jax.tree_util.tree_map(lambda x: jnp.full_like(x, 0.1 * (-1) ** i), p)
      u, state = tx.update(g, state, p)
      p = optax.apply_updates(p, u)
    return p
  with_anchor, without = run(10.0), run(0.0)
  assert not np.allclose(with_anchor["local"]["encoder"]["layers_1"]["w"],
                         without["local"]["encoder"]["layers_1"]["w"])
  for a, b in zip(jax.tree_util.tree_leaves(with_anchor["local"]["role_mlp"]),
                  jax.tree_util.tree_leaves(without["local"]["role_mlp"])):
    np.testing.assert_array_equal(a, b)
