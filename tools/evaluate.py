"""Evaluate passage rerankers on pool files with qrels: `logrerank evaluate` (logrerank_jax/cli/evaluate.py)."""

import sys

from logrerank_jax.cli.main import main

if __name__ == "__main__":
  sys.exit(main(["evaluate", *sys.argv[1:]]))
