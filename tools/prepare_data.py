"""Build deterministic 50-candidate evaluation pools from a ScholarQABench single-paper file.

  python tools/prepare_data.py --input ../shared/data/scholarqabench/scifact_test.jsonl \
      --output pools/scifact_pool.jsonl --qrels pools/scifact.qrels [--pool-size 50] [--limit N]

Positives are each query's gold contexts; negatives are BM25 hits among the other
queries' gold contexts; each pool is ordered by BM25 score (see
`logrerank_jax/datasets/pools.py` for the exact construction).  Writes OpenScholar-style
JSONL (`{"id", "input", "answer", "ctxs": [{"id", "title", "text", "label", "bm25"}]}`)
and a TREC qrels file (`qid 0 passage_id 1`).

`--chunk-sentences K` builds snippet pools instead (`pools.build_chunk_pools`): passages are
chunks of K sentences of the abstracts, a query's gold is every chunk of its gold abstract,
`{"id", "input", "ctxs": [{"id", "title": "", "text"}]}` in BM25 order; with `--sample N
--seed S` for N queries drawn by numpy's PCG64 permutation (the demo's validation pools).
"""

import argparse
import json
import os
import sys

import numpy as np

from logrerank_jax.datasets.pools import build_chunk_pools, build_eval_pools
from logrerank_jax.data.pool_files import expand_pools
from logrerank_jax.datasets.scholarqabench import read_scholarqabench
from logrerank_jax.errors import LogRerankError
from logrerank_jax.evaluation import write_qrels


def parse_args(argv=None):
  """Parse the command line."""
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--input", required=True, help="ScholarQABench single-paper JSONL file")
  p.add_argument("--output", required=True, help="output pools JSONL")
  p.add_argument("--qrels", required=True, help="output TREC qrels file")
  p.add_argument("--pool-size", type=int, default=50, help="candidates per query (default 50)")
  p.add_argument("--limit", type=int, default=None, help="only the first N queries")
  p.add_argument("--chunk-sentences", type=int, default=0,
                 help="snippet pools: passages of this many sentences (0: whole abstracts)")
  p.add_argument("--sample", type=int, default=0,
                 help="with --chunk-sentences: N queries drawn with --seed (0: all, in file order)")
  p.add_argument("--seed", type=int, default=13)
  return p.parse_args(argv)


def main(argv=None) -> int:
  """Run the CLI; return the exit status."""
  args = parse_args(argv)
  try:
    records = read_scholarqabench(args.input)
    if args.chunk_sentences:
      idx = list(range(len(records)))
      if args.sample:
        idx = np.random.default_rng(args.seed).permutation(len(records))[:args.sample].tolist()
      pools, qrels, corpus = build_chunk_pools(records, idx, args.chunk_sentences, args.pool_size)
      pools = expand_pools(pools, corpus)
    else:
      pools, qrels = build_eval_pools(records, pool_size=args.pool_size, limit=args.limit)
  except (LogRerankError, OSError) as e:
    print(f"prepare_data: error: {e}", file=sys.stderr)
    return 1
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  with open(args.output, "w", encoding="utf-8") as f:
    for rec in pools:
      f.write(json.dumps(rec, ensure_ascii=False) + "\n")
  write_qrels(args.qrels, qrels)
  sizes = [len(r["ctxs"]) for r in pools]
  gold_first = sum(r["ctxs"][0]["id"] in qrels[r["id"]] for r in pools)
  print(f"prepare_data: {len(pools)} queries, pool sizes {min(sizes, default=0)}-{max(sizes, default=0)}, "
        f"gold ranked first by BM25 in {gold_first}; wrote {args.output} and {args.qrels}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
