"""Train one LoG-Reranker stage: `logrerank train --config local_stage[:tiny] --workdir DIR`."""

import importlib.util
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from logrerank_jax.errors import ConfigError, LogRerankError
from logrerank_jax.training.config_checks import check_stage_settings

# JAX, Flax and the trainer are imported in train_main(), after the config checks: a bad config
# is named in about 0.3 s, not after 2.5 s of imports.
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Training config file: a shipped config by name (local_stage, global_stage, "
    "passage_stage; e.g. local_stage:tiny) or a path FILE.py[:variant].", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run folder: checkpoints, logs, exported model.")
_CACHE = flags.DEFINE_string(
    "compilation_cache", None,
    "persistent XLA cache folder (default $LOGRERANK_JAX_COMPILATION_CACHE or "
    "~/.cache/logrerank_jax/xla, the folder tools/evaluate.py, rerank.py and serve.py use)")
_NO_CACHE = flags.DEFINE_bool("no_compilation_cache", False,
                              "do not use the persistent XLA compilation cache")
flags.mark_flags_as_required(["config", "workdir"])

# The shipped configs (logrerank_jax/configs/, installed with the package). The keys every
# training config must have are those of local_stage.py there.
PACKAGED_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "configs")
REFERENCE_CONFIG = os.path.join(PACKAGED_CONFIGS, "local_stage.py")


def resolve_config_arg(argv: list) -> list:
  """`--config NAME[:variant]` where NAME is no file here but a shipped config
  (`local_stage.py`, `global_stage`, ...) names that shipped file, so an installed package trains
  without a checkout; an existing path is left alone."""
  out = list(argv)
  for i, arg in enumerate(out):
    if arg.startswith("--config="):
      value, prefix = arg[len("--config="):], "--config="
    elif arg == "--config" and i + 1 < len(out):
      continue
    elif i > 0 and out[i - 1] == "--config":
      value, prefix = arg, ""
    else:
      continue
    path, sep, variant = value.partition(":")
    name = path if path.endswith(".py") else path + ".py"
    shipped = os.path.join(PACKAGED_CONFIGS, name)
    if not os.path.exists(path) and os.sep not in path and os.path.isfile(shipped):
      out[i] = prefix + shipped + sep + variant
    elif not os.path.exists(path):
      # ml_collections would report this later as a traceback; name it in one line instead.
      names = sorted(f[:-3] for f in os.listdir(PACKAGED_CONFIGS)
                     if f.endswith(".py") and not f.startswith("_"))
      raise ConfigError(f"--config {value}: no such file, and no shipped config of that name "
                        f"(shipped: {', '.join(names)}; e.g. --config local_stage:tiny)")
  return out


def _reference_keys() -> set:
  """Return the keys every training config must have: those of the shipped local_stage.py."""
  spec = importlib.util.spec_from_file_location("_logrerank_reference_config", REFERENCE_CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return set(module.get_config().keys())


def check_config_keys(config) -> None:
  """Raise ConfigError naming every missing or unknown top-level key of a training config."""
  keys, ref = set(config.keys()), _reference_keys()
  missing, unknown = sorted(ref - keys), sorted(keys - ref)
  if missing or unknown:
    raise ConfigError("config keys do not match the shipped local_stage config:"
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
      msg = f"unknown config key {msg} (see logrerank_jax/configs/local_stage.py for the keys)"
    print(f"error: bad flags: {msg}", file=sys.stderr)
    sys.exit(2)


def train_main(argv):
  """absl's main: check the config, then train the stage and print where its model is."""
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


def main(argv=None, prog=None) -> int:
  """Run the command under absl (`app.run` exits with the status; `prog` is unused: absl names
  the program by sys.argv[0]). As before, ml_collections found the `--config.KEY=VALUE`
  overrides in sys.argv when the flags above were defined, so `argv` is sys.argv's tail."""
  del prog
  try:
    argv = resolve_config_arg(sys.argv[1:] if argv is None else list(argv))
  except ConfigError as e:
    print(f"error: ConfigError: {e}", file=sys.stderr)
    return 2
  # absl's --help prints the docstring of __main__ (tools/train.py's is this one; the `logrerank`
  # console script has none) and the flags it counts as the main module's, sys.argv[0]'s: these
  # flags belong to this module, so they are declared key flags of the program too.
  sys.modules["__main__"].__doc__ = __doc__
  for flag in ("config", "workdir", "compilation_cache", "no_compilation_cache"):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[flag])
  app.run(train_main, argv=[sys.argv[0], *argv], flags_parser=parse_flags)
  return 0
