"""The shipped demo pools the home page (GET /) offers, read from the installed package data."""

import json
import os
from typing import Any, Dict, List

from logrerank_jax.data.pool_files import expand_pools

# Shipped pools the home page offers (package data): the first few of each pool set, as
# (pools file, corpus file) under logrerank_jax/demo_data/.
_DEMO_POOL_FILES = (("paragraphs/test_pools.jsonl", "paragraphs/corpus.jsonl"),
                    ("scholarqa_cs/pools.jsonl", "scholarqa_cs/corpus.jsonl"))
DEMO_POOLS_PER_SET = 3


def _read(root: str, name: str, limit=None) -> List[Dict[str, Any]]:
  out = []
  with open(os.path.join(root, name), encoding="utf-8") as f:
    for line in f:
      if line.strip():
        out.append(json.loads(line))
        if limit is not None and len(out) == limit:
          break
  return out


def demo_pools(per_set: int = DEMO_POOLS_PER_SET) -> List[Dict[str, Any]]:
  """The shipped demo pools the home page offers (full OpenScholar records), `per_set` of each
  pool set present in the installed package."""
  root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo_data")
  pools = []
  for pools_file, corpus_file in _DEMO_POOL_FILES:
    if os.path.exists(os.path.join(root, pools_file)):
      pools += expand_pools(_read(root, pools_file, per_set), _read(root, corpus_file))
  return pools
