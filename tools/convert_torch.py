"""Convert PyTorch checkpoints to model folders, and back: `logrerank convert` (logrerank_jax/cli/convert.py)."""

import sys

from logrerank_jax.cli.main import main
# Scripts and tests that load this file as a module use these (tests/test_bert_backbone.py).
from logrerank_jax.cli.convert import convert_hf_model, load_cross_encoder_folder

__all__ = ["main", "convert_hf_model", "load_cross_encoder_folder"]

if __name__ == "__main__":
  sys.exit(main(["convert", *sys.argv[1:]]))
