"""Train one LoG-Reranker stage: `python tools/train.py --config configs/local_stage.py --workdir DIR`."""

import importlib.util
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from logrerank_jax.errors import ConfigError, LogRerankError
from logrerank_jax.training.config_checks import check_stage_settings

# JAX, Flax and the trainer are imported in main(), after the config checks: a bad config is named
# in about 0.3 s, not after 2.5 s of imports.
_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file (configs/*.py[:tiny]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run folder: checkpoints, logs, exported model.")
_CACHE = flags.DEFINE_string(
    "compilation_cache", None,
    "persistent XLA cache folder (default $LOGRERANK_JAX_COMPILATION_CACHE or "
    "~/.cache/logrerank_jax/xla, the folder tools/evaluate.py, rerank.py and serve.py use)")
_NO_CACHE = flags.DEFINE_bool("no_compilation_cache", False,
                              "do not use the persistent XLA compilation cache")
flags.mark_flags_as_required(["config", "workdir"])


def _reference_keys() -> set:
  """Return the keys every training config must have: those of configs/local_stage.py."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "local_stage.py")
  spec = importlib.util.spec_from_file_location("_logrerank_reference_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return set(module.get_config().keys())


def check_config_keys(config) -> None:
  """Raise ConfigError naming every missing or unknown top-level key of a training config."""
  keys, ref = set(config.keys()), _reference_keys()
  missing, unknown = sorted(ref - keys), sorted(keys - ref)
  if missing or unknown:
    raise ConfigError("config keys do not match configs/local_stage.py:"
                      + (f" missing {missing}" if missing else "")
                      + (f" unknown {unknown}" if unknown else ""))


def parse_flags(argv):
  """Parse flags; a bad --config override (unknown key, wrong type) is one line, not a traceback."""
  try:
    return flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
    # ml_collections reports an unknown override key as a bare AttributeError("'key'").
    msg = str(e).strip().strip('"')
    if isinstance(e, (AttributeError, KeyError)):
      msg = f"unknown config key {msg} (see configs/local_stage.py for the keys)"
    print(f"error: bad flags: {msg}", file=sys.stderr)
    sys.exit(2)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  # Orbax logs every save at INFO; keep the console to the progress bar and our own lines.
  logging.set_verbosity(logging.WARNING)
  try:
    check_config_keys(_CONFIG.value)
    check_stage_settings(_CONFIG.value)
  except LogRerankError as e:
    raise SystemExit(f"error: {type(e).__name__}: {e}") from None
  # pylint: disable=g-import-not-at-top
  from logrerank_jax import compilation
  from logrerank_jax.training.trainer import train_and_evaluate
  # pylint: enable=g-import-not-at-top
  if not _NO_CACHE.value:
    # Executables compiled here (the validation and feature passes run the inference engine's
    # programs) are loaded, not compiled again, by the next stage and by evaluate/rerank/serve
    # runs of the same shapes; a rerun of a stage compiles nothing it compiled before.
    compilation.enable_compilation_cache(_CACHE.value or compilation.default_compilation_cache_dir())
  try:
    summary = train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except LogRerankError as e:
    # One line naming what is wrong, never a bare traceback for bad input.
    raise SystemExit(f"error: {type(e).__name__}: {e}") from None
  print(f"done: step {summary['step']}, loss {summary['loss']}, last val {summary['val']}; "
        f"model ({summary['model_source']}, val {summary['model_val']}) in {summary['model_dir']}")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
