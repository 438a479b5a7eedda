"""`Stage`: what the training loop (`trainer.py`) calls on every stage, and what the stages share.

The loop sets `num_shards`, then calls `micro_batch_groups`, `micro_batches` (and reads
`cache_info`), `init_params`, `loss`, `make_eval`, and at the end `export_params` and `save`;
it never asks which stage it runs. A stage sets, in its constructor, `config`, `tokenizer`,
`cfg` (its model config) and, through `_take_units` and `_take_distill`, the settings every stage
reads alike: `shape_buckets`, `units` (teacher scores attached), `distill_weight`,
`distill_temperature` and `cache_info`.
"""

import abc
from typing import Any, Callable, Dict, Tuple

from logrerank_jax.training import data as data_lib
from logrerank_jax.training.stages.distill import distill_settings, with_teacher


class Stage(abc.ABC):
  """One training stage: its model config, data, init, loss, eval and export."""
  name = ""
  num_shards = 1  # set by the loop before `micro_batches`

  def _take_units(self, config, units) -> None:
    """`config.shape_buckets` and the training `units`, with the teacher scores of
    `config.teacher_file` attached (`distill.with_teacher`)."""
    self.shape_buckets = bool(config.get("shape_buckets", True))
    self.units = with_teacher(units, config)

  def _take_distill(self, config) -> None:
    """The distillation settings, checked (`distill.distill_settings`), and an empty
    `cache_info` (what `micro_batches` reports of a feature cache)."""
    self.distill_weight, self.distill_temperature = distill_settings(config)
    self.cache_info: Dict[str, Any] = {}

  def _with_distill(self, coefs: Dict[str, float]) -> Dict[str, float]:
    """The loss coefficients `coefs`, the distillation term's weight last when it is on."""
    if self.distill_weight:
      coefs["distill"] = self.distill_weight
    return coefs

  def micro_batch_groups(self, size: int, seed: int):
    """Micro-batches as lists of unit indices (shuffled with `seed`, `size` units each)."""
    return data_lib.group_micro_batches(len(self.units), size, seed)

  @abc.abstractmethod
  def micro_batches(self, groups, shares_of):
    """[micro-batch][device share] batches of the unit indices `groups`; `shares_of` maps a
    micro-batch to this process's per-device shares."""

  @abc.abstractmethod
  def init_params(self, example, rng):
    """The params to train, initialised (`example`: one device share on the devices)."""

  @abc.abstractmethod
  def loss(self) -> Tuple[Callable, Dict[str, float]]:
    """(loss_fn(params, batch, rng) -> {term: (sum, weight)} over a device's share, the terms'
    coefficients)."""

  def make_eval(self, val_units, qrels=None) -> Callable[[Any], Dict[str, float]]:
    """params -> passage metrics on the validation queries (relevant: `qrels`, by default each
    query's rank-1 passage); without validation queries, no metrics."""
    if not val_units:
      return lambda params: {}
    return self._evaluator(val_units, qrels)

  @abc.abstractmethod
  def _evaluator(self, val_units, qrels) -> Callable[[Any], Dict[str, float]]:
    """`make_eval` for a non-empty `val_units`."""

  def export_params(self, params):
    """The params the exported model holds: by default the trained ones."""
    return params

  @abc.abstractmethod
  def save(self, model_dir: str, params, info) -> None:
    """Write the exported model folder."""
