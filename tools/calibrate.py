"""Calibrate a model's scores on validation pools: `logrerank calibrate` (logrerank_jax/cli/calibrate.py)."""

import sys

from logrerank_jax.cli.main import main

if __name__ == "__main__":
  sys.exit(main(["calibrate", *sys.argv[1:]]))
