"""Build the ScholarQA-CS evaluation pools (logrerank_jax/demo_data/scholarqa_cs/).

  python tools/build_cs_pools.py \
      --input ../shared/data/scholarqabench/scholarqa_cs_test_configs_snippets.json

Writes, into --out: `pools.jsonl` (id-only pools `{"id", "input", "ctx_ids"}`, each in the
first-stage order of BM25 over every snippet), `pools.qrels` (a question's evidence snippets,
at most --max-gold), `corpus.jsonl` (`{"id", "title", "text"}` of every snippet) and
`manifest.json` (source checksum, arguments, counts). Deterministic: a rebuild is
byte-identical. The construction is `logrerank_jax/datasets/scholarqa_cs.py`'s docstring.
Evaluation only: nothing in the project trains on these questions or selects checkpoints on
them.
"""

import argparse
import hashlib
import json
import os
import sys

from logrerank_jax.datasets import scholarqa_cs
from logrerank_jax.errors import LogRerankError
from logrerank_jax.evaluation import write_qrels

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "logrerank_jax",
                           "demo_data", "scholarqa_cs")


def main(argv=None) -> int:
  """Run the CLI; return the exit status."""
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--input", required=True, help="scholarqa_cs_test_configs_snippets.json")
  ap.add_argument("--out", default=DEFAULT_OUT)
  ap.add_argument("--pool-size", type=int, default=scholarqa_cs.DEFAULT_POOL_SIZE)
  ap.add_argument("--max-gold", type=int, default=scholarqa_cs.DEFAULT_MAX_GOLD,
                  help="gold snippets kept per question, in rubric order (default 25)")
  args = ap.parse_args(argv)
  try:
    questions = scholarqa_cs.read_scholarqa_cs(args.input)
    pools, qrels, corpus, stats = scholarqa_cs.build_cs_pools(questions, args.pool_size,
                                                             args.max_gold)
  except (LogRerankError, OSError) as e:
    print(f"build_cs_pools: error: {e}", file=sys.stderr)
    return 1
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "pools.jsonl"), "w", encoding="utf-8") as f:
    for p in pools:
      f.write(json.dumps(p, ensure_ascii=False) + "\n")
  write_qrels(os.path.join(args.out, "pools.qrels"), qrels)
  with open(os.path.join(args.out, "corpus.jsonl"), "w", encoding="utf-8") as f:
    for c in corpus:
      f.write(json.dumps(c, ensure_ascii=False) + "\n")
  with open(args.input, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  manifest = {"source": os.path.basename(args.input), "source_sha256": digest,
              "args": {"pool_size": args.pool_size, "max_gold": args.max_gold},
              "mean_first_gold_position": scholarqa_cs.first_stage_rank_of_gold(pools, qrels),
              **stats}
  with open(os.path.join(args.out, "manifest.json"), "w", encoding="utf-8") as f:
    json.dump(manifest, f, indent=1)
    f.write("\n")
  print(f"build_cs_pools: {len(pools)} pools of {args.pool_size}, {stats['corpus_snippets']} "
        f"snippets, gold per question {stats['gold_per_question']}; wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
