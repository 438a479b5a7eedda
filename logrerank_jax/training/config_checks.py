"""Checks of a training config that need no JAX: a command-line run names a bad setting in a
fraction of a second, before it imports the trainer (tools/train.py), and `train_and_evaluate`
makes the same checks before it reads any data."""

import os

from logrerank_jax.errors import ConfigError

STAGES = ("local", "global", "passage")


def check_stage_settings(config) -> None:
  """Raise ConfigError for an unknown `config.stage`, or a global stage whose
  `config.local_checkpoint` is missing or holds no exported model (model/)."""
  if config.stage not in STAGES:
    raise ConfigError(f"config.stage must be one of {STAGES}, got {config.stage!r}")
  if config.stage == "global":
    if not config.local_checkpoint:
      raise ConfigError("the global stage needs --config.local_checkpoint=DIR (the local stage's "
                        "workdir, which holds model/)")
    if not os.path.isdir(os.path.join(config.local_checkpoint, "model")):
      raise ConfigError(f"config.local_checkpoint={config.local_checkpoint} has no model/ folder; "
                        "pass the workdir of a finished local-stage run")
