"""Train one LoG-Reranker stage: `python tools/train.py --config configs/local_stage.py --workdir DIR`."""

from absl import app, flags, logging
from ml_collections import config_flags

from logrerank_jax.errors import LogRerankError
from logrerank_jax.training.trainer import train_and_evaluate

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file (configs/*.py[:tiny]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run folder: checkpoints, logs, exported model.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  # Orbax logs every save at INFO; keep the console to the progress bar and our own lines.
  logging.set_verbosity(logging.WARNING)
  try:
    summary = train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except LogRerankError as e:
    # One line naming what is wrong, never a bare traceback for bad input.
    raise SystemExit(f"error: {type(e).__name__}: {e}") from None
  print(f"done: step {summary['step']}, loss {summary['loss']}, val {summary['val']}, "
        f"model in {summary['model_dir']}")


if __name__ == "__main__":
  app.run(main)
