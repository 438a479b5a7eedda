"""AdamW with linear warm-up and decay, weight-decay masking, gradient accumulation and
optional freezing of the lowest encoder layers (`config.freeze_encoder_layers`)."""

import math
import re

import jax
import optax


def total_optimizer_steps(num_micro_batches_per_epoch: int, epochs: int, accumulation: int) -> int:
  """Return how many optimizer updates a run makes (micro-batches are accumulated).

  Args:
    num_micro_batches_per_epoch: global micro-batches in one epoch.
    epochs: number of epochs.
    accumulation: micro-batches per optimizer update (`optax.MultiSteps`).

  Returns:
    The number of optimizer updates, at least 1.
  """
  return max(1, math.ceil(num_micro_batches_per_epoch * epochs / accumulation))


def warmup_linear_decay(peak_lr: float, total_steps: int, warmup_fraction: float) -> optax.Schedule:
  """Return a schedule rising linearly to `peak_lr`, then decaying linearly to 0.

  Args:
    peak_lr: learning rate at the end of warm-up.
    total_steps: optimizer updates in the whole run.
    warmup_fraction: share of `total_steps` spent warming up (the paper: 0.06).

  Returns:
    An optax schedule over optimizer-update counts.
  """
  warmup = max(1, int(round(total_steps * warmup_fraction)))
  decay = max(1, total_steps - warmup)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak_lr, warmup), optax.linear_schedule(peak_lr, 0.0, decay)],
      boundaries=[warmup])


def _decay_mask(params):
  # Biases and norm scales (1-D) are not decayed, as in the usual BERT recipe.
  return jax.tree_util.tree_map(lambda p: p.ndim > 1, params)


_LAYER = re.compile(r"^layers_(\d+)$")


def _path_names(path):
  """The key names along a params tree path (dict keys and attribute names alike)."""
  return [getattr(k, "key", getattr(k, "name", str(k))) for k in path]


def frozen_mask(params, num_layers: int):
  """Return a bool tree, True for the params that `freeze_encoder_layers=num_layers` freezes.

  Frozen: the encoder's embeddings and its layers 0..num_layers-1, wherever an encoder sits in
  the tree (LoG: `local/encoder/...`; the passage cross-encoder: `bert/...`). Heads, the pooler,
  the GAT and the upper layers train. 0 freezes nothing.
  """
  def frozen(path, _):
    names = _path_names(path)
    for i, n in enumerate(names):
      if n in ("encoder", "bert") and i + 1 < len(names):
        child = names[i + 1]
        m = _LAYER.match(child)
        return child == "embeddings" or (m is not None and int(m.group(1)) < num_layers)
    return False
  return jax.tree_util.tree_map_with_path(frozen, params)


def encoder_mask(params):
  """Return a bool tree, True for the params of a pretrained encoder (`encoder/...` in LoG,
  `bert/...` in the passage cross-encoder); False for the heads, the pooler, the GAT and the
  dense prior's scale, which start from scratch (or from one number) and get `head_lr`."""
  def inside(path, _):
    names = _path_names(path)
    return any(n in ("encoder", "bert") for n in names[:-1])
  return jax.tree_util.tree_map_with_path(inside, params)


def role_head_mask(params):
  """Return a bool tree, True for the role head's params (`role_mlp/...`, eq 3)."""
  return jax.tree_util.tree_map_with_path(lambda path, _: "role_mlp" in _path_names(path)[:-1],
                                          params)


def _group_labels(tree, role_lr: float):
  """'encoder', 'role' (only when `role_lr`) or 'head' per leaf of `tree`."""
  enc = encoder_mask(tree)
  role = role_head_mask(tree) if role_lr else jax.tree_util.tree_map(lambda _: False, tree)
  return jax.tree_util.tree_map(lambda e, r: "encoder" if e else ("role" if r else "head"),
                                enc, role)


def anchor_to_start(weight: float) -> optax.GradientTransformation:
  """L2-SP (Li et al. 2018): add `weight * (theta - theta_0)` to the gradient, theta_0 the
  params at `init`: a pull back to the pretrained weights that grows with the distance moved,
  where weight decay pulls to zero. The start is part of the optimizer state (one more copy of
  the params it sees; wrap it in `optax.masked` for the encoder only), so a resumed run anchors to
  the same point."""
  def init_fn(params):
    return {"start": jax.tree_util.tree_map(lambda p: p, params)}

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("anchor_to_start needs the params")
    new = jax.tree_util.tree_map(lambda g, p, p0: g + weight * (p - p0), updates, params,
                                 state["start"])
    return new, state
  return optax.GradientTransformation(init_fn, update_fn)


def make_optimizer(peak_lr: float, total_steps: int, warmup_fraction: float = 0.06,
                   weight_decay: float = 0.01, accumulation: int = 1,
                   max_grad_norm: float = 1.0, b1: float = 0.9, b2: float = 0.999,
                   eps: float = 1e-8, frozen=None, head_lr: float = 0.0,
                   anchor_weight: float = 0.0,
                   role_lr: float = 0.0) -> optax.GradientTransformation:
  """Build the training optimizer: clipped AdamW on a warm-up/decay schedule, accumulated.

  Args:
    peak_lr: peak learning rate.
    total_steps: optimizer updates in the run (after accumulation).
    warmup_fraction: linear warm-up share of the run.
    weight_decay: decoupled weight decay on matrices (not on biases or norm scales).
    accumulation: micro-batches accumulated per update via `optax.MultiSteps` (1 = none).
    max_grad_norm: global-norm clipping of the (accumulated) gradient; 0 disables it.
    b1: Adam beta1.
    b2: Adam beta2.
    eps: Adam epsilon.
    frozen: optional bool tree (`frozen_mask`) of params that never change: their gradients
      are zeroed before anything else (so XLA drops their backward pass, and clipping,
      accumulation and Adam see zeros) and they get no update and no weight decay.
    head_lr: peak learning rate of the params outside `encoder` (heads, GAT), on the same
      schedule; 0 = `peak_lr` for all. A head that starts from random init needs far more than
      the pretrained encoder's 2e-5 to learn in a short run (NOT in the paper, which gives one).
    anchor_weight: > 0 adds the L2-SP pull `anchor_weight * (theta - theta_0)` to the encoder's
      gradients (`anchor_to_start`, `encoder_mask`), after clipping, before Adam.
    role_lr: peak learning rate of the role head alone (`role_head_mask`); 0 = `head_lr`. The
      role head only feeds the ranking through the roles it predicts, and on a short run it
      needs more steps' worth of movement than the local head, whose output starts at zero
      on the prior (NOT in the paper).

  Returns:
    An `optax.GradientTransformation` (a `MultiSteps` one when `accumulation > 1`).
  """
  def adamw(lr):
    return optax.adamw(warmup_linear_decay(lr, total_steps, warmup_fraction), b1=b1, b2=b2,
                       eps=eps, weight_decay=weight_decay, mask=_decay_mask)
  chain = []
  if max_grad_norm and max_grad_norm > 0:
    chain.append(optax.clip_by_global_norm(max_grad_norm))
  if anchor_weight:
    chain.append(optax.masked(anchor_to_start(anchor_weight), encoder_mask))
  if head_lr or role_lr:
    # One Adam per group: the encoder at peak_lr, the heads at head_lr, the role head at role_lr
    # (same schedule shape). Labels as a function of the tree it is given: inside the frozen
    # mask's multi_transform the frozen leaves are already masked out of it.
    groups = {"encoder": adamw(peak_lr), "head": adamw(head_lr or peak_lr)}
    if role_lr:
      groups["role"] = adamw(role_lr)
    chain.append(optax.multi_transform(groups, lambda tree: _group_labels(tree, role_lr)))
  else:
    chain.append(adamw(peak_lr))
  tx = optax.chain(*chain)
  if frozen is not None:
    # No update (and so no weight decay) for frozen leaves.
    tx = optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()},
                               jax.tree_util.tree_map(lambda f: "frozen" if f else "train", frozen))
  if accumulation > 1:
    tx = optax.MultiSteps(tx, every_k_schedule=accumulation)
  if frozen is not None:
    # Zero frozen gradients first: nothing downstream reads them, so their backward is dead code.
    tx = optax.chain(optax.masked(optax.set_to_zero(), frozen), tx)
  return tx
