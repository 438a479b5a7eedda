"""Train one LoG-Reranker stage: `python tools/train.py --config configs/local_stage.py --workdir DIR`."""

import sys

from logrerank_jax.cli.main import main

if __name__ == "__main__":
  sys.exit(main(["train", *sys.argv[1:]]))  # `logrerank train` (logrerank_jax/cli/train.py)
