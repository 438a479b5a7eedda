"""Distillation from a teacher's scores (not in the paper; README), shared by the three stages:
the checked settings, the teacher scores attached to the training units, and the loss term."""

from typing import Tuple

import jax.numpy as jnp

from logrerank_jax import losses
from logrerank_jax.errors import ConfigError
from logrerank_jax.training import data as data_lib


def distill_settings(config) -> Tuple[float, float]:
  """(weight, temperature) of the distillation term, checked; weight 0 = off."""
  weight = float(config.get("distill_weight", 0.0))
  temperature = float(config.get("distill_temperature", 1.0))
  if weight < 0 or not temperature > 0:
    raise ConfigError(f"need distill_weight >= 0 and distill_temperature > 0, got {weight}, "
                      f"{temperature}")
  if weight and not config.get("teacher_file", ""):
    raise ConfigError("distill_weight > 0 needs --config.teacher_file (scores of a teacher)")
  return weight, temperature


def with_teacher(units, config):
  """`units` with the teacher scores of `config.teacher_file` attached (unchanged without one).

  Teacher entries matching no unit are refused, except under `skip_invalid`: the records of
  skipped lines leave their entries unmatched, so they are counted in the log instead.
  """
  path = config.get("teacher_file", "")
  if not path:
    return units
  return data_lib.attach_teacher(units, data_lib.read_teacher_file(path), source=path,
                                 allow_unmatched=bool(config.get("skip_invalid", False)))


def distill_term(scores, teacher, has_teacher, temperature: float):
  """Listwise KL of each query's student scores [q, C] against its teacher scores (not in the
  paper; README); returns (sum over queries, queries)."""
  per_row, has = losses.listwise_kl_per_row(scores, teacher, has_teacher, temperature)
  return jnp.sum(per_row), jnp.sum(has).astype(jnp.float32)
