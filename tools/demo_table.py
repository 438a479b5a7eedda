"""Print one table of several `tools/evaluate.py` runs side by side (the demo's final table).

  python tools/demo_table.py --eval "evidence pools=runs/demo/eval" \
      --eval "ScholarQA-CS=runs/demo/eval_cs" [--markdown out.md]

Rows: the systems of the runs (in tools/evaluate.py's order); per run two columns: nDCG@k,
and the paired comparison evaluate.py stored (its `--paired-against` system, LoG by default,
minus the row's system: mean per-query difference and 95 % paired bootstrap interval).
"""

import argparse
import json
import os
import sys

LABELS = {
    "first-stage": "BM25 over the whole corpus (the pool's first-stage order)",
    "bm25": "BM25 within each pool",
    "bi-encoder": "MiniLM bi-encoder, zero-shot",
    "cross-encoder": "passage cross-encoder, same recipe",
    "log-local": "LoG local-only",
    "log": "LoG",
}


def table(evals) -> str:
  """Markdown table of [(name, metrics.json dict)]."""
  k = evals[0][1]["k"]
  systems = []
  for _, m in evals:
    systems += [s for s in m["metrics"] if s not in systems]
  head = "| system |" + "".join(
      f" {name}: nDCG@{k} | {m['paired']['against']} minus system [95 % CI] |" for name, m in evals)
  rule = "| --- |" + " ---: | ---: |" * len(evals)
  rows = [head, rule]
  for s in systems:
    cells = []
    for _, m in evals:
      value = m["metrics"].get(s, {}).get(f"ndcg@{k}")
      d = m.get("paired", {}).get("systems", {}).get(s)
      cells.append("" if value is None else f"{value:.2f}")
      cells.append("" if d is None else
                   f"{d['mean']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}] ({d['wins']}/{d['losses']})")
    rows.append(f"| {LABELS.get(s, s)} | " + " | ".join(cells) + " |")
  sizes = "; ".join(f"{name}: {m['num_queries']} queries, {'/'.join(map(str, m['pool_sizes']))} "
                    "passages each" for name, m in evals)
  return "\n".join(rows) + f"\n\n{sizes}. Brackets: wins/losses of the compared system over " \
                           "queries.\n"


def main(argv=None) -> int:
  """Run the CLI; return the exit status."""
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--eval", action="append", required=True, metavar="NAME=DIR",
                  help="a pool set's name and the --out-dir of its tools/evaluate.py run")
  ap.add_argument("--markdown", default=None, help="also write the table to this file")
  args = ap.parse_args(argv)
  evals = []
  for spec in args.eval:
    name, sep, path = spec.partition("=")
    if not sep:
      print(f"demo_table: --eval wants NAME=DIR, got {spec!r}", file=sys.stderr)
      return 1
    try:
      with open(os.path.join(path, "metrics.json"), encoding="utf-8") as f:
        evals.append((name, json.load(f)))
    except (OSError, ValueError) as e:
      print(f"demo_table: cannot read {path}/metrics.json ({e})", file=sys.stderr)
      return 1
  out = table(evals)
  print(out)
  if args.markdown:
    with open(args.markdown, "w", encoding="utf-8") as f:
      f.write(out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
