"""Rerank passages at the sentence level: `logrerank rerank` (logrerank_jax/cli/rerank.py)."""

import sys

from logrerank_jax.cli.main import main
# Scripts and tests that load this file as a module use these (tests/test_inference_devices.py).
from logrerank_jax.cli.atomic_files import write_jsonl_atomic
from logrerank_jax.cli.sharding import merge_shards, shard_path
from logrerank_jax.errors import LogRerankError

__all__ = ["main", "merge_shards", "shard_path", "write_jsonl_atomic", "LogRerankError"]

if __name__ == "__main__":
  sys.exit(main(["rerank", *sys.argv[1:]]))
