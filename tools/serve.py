"""Serve a LoG-Reranker model over HTTP: `logrerank serve` (logrerank_jax/cli/serve.py)."""

import sys

from logrerank_jax.cli.main import main

if __name__ == "__main__":
  sys.exit(main(["serve", *sys.argv[1:]]))
