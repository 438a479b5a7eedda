"""Compare the default sentence splitter (sentencex + post-fixes) with the old pysbd one.

Prints per-class correct counts on the tricky cases (logrerank_jax/datasets/splitter_cases.py),
ms per abstract for both on every gold passage of /work/shared/data/scholarqabench/*.jsonl
(same run, cache cleared, best of --reps), agreement (fraction of passages with identical
boundaries) and a sample of disagreements.

  PYTHONPATH=$PWD python tools/splitter_report.py [--data-glob ...] [--sample 40]

The pysbd side needs the `compare` extra (`pip install "logrerank_jax[compare]"`); without it
the report stops with that one line.
"""

import argparse
import collections
import glob
import json
import random
import sys
import time

from logrerank_jax.data import sentences
from logrerank_jax.datasets.splitter_cases import CASES
from logrerank_jax.errors import ConfigError

NEW, OLD = "sentencex", "pysbd"


def load_texts(pattern):
  """Unique gold passage texts (PubMed paragraphs separately) of the matching jsonl files."""
  texts = []
  for path in sorted(glob.glob(pattern)):
    with open(path, encoding="utf-8") as f:
      for line in f:
        for c in json.loads(line)["gold_ctx"]:
          t = c["text"]
          texts.extend(t["contexts"] if isinstance(t, dict) else [t])
  return list(dict.fromkeys(texts))


def ms_per_text(texts, backend, reps):
  best = float("inf")
  for _ in range(reps):
    sentences.clear_cache()
    start = time.perf_counter()
    for t in texts:
      sentences.split_sentences(t, backend)
    best = min(best, time.perf_counter() - start)
  sentences.clear_cache()
  return best / len(texts) * 1e3


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--data-glob", default="/work/shared/data/scholarqabench/*.jsonl")
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--sample", type=int, default=40)
  args = ap.parse_args()

  total = collections.Counter(c for c, _, _ in CASES)
  right = {b: collections.Counter() for b in (NEW, OLD)}
  for cls, text, expected in CASES:
    for b in (NEW, OLD):
      right[b][cls] += sentences.split_sentence_texts(text, b) == expected
  print(f"{'class':16s} {'cases':>5s} {NEW:>9s} {OLD:>6s}")
  for cls in sorted(total):
    print(f"{cls:16s} {total[cls]:5d} {right[NEW][cls]:9d} {right[OLD][cls]:6d}")
  print(f"{'all':16s} {sum(total.values()):5d} {sum(right[NEW].values()):9d} {sum(right[OLD].values()):6d}")

  texts = load_texts(args.data_glob)
  new_ms, old_ms = ms_per_text(texts, NEW, args.reps), ms_per_text(texts, OLD, args.reps)
  print(f"\n{len(texts)} passages: {NEW} {new_ms:.4f} ms, {OLD} {old_ms:.3f} ms per passage, "
        f"speed-up {old_ms / new_ms:.0f}x")

  diffs = []
  same = 0
  for t in texts:
    a = {s.end for s in sentences.split_sentences(t, NEW)[:-1]}
    b = {s.end for s in sentences.split_sentences(t, OLD)[:-1]}
    same += a == b
    diffs += [(("new" if e in a else "old"), t, e) for e in sorted(a ^ b)]
  print(f"agreement: {same}/{len(texts)} = {same / len(texts):.3f} of passages with identical boundaries; "
        f"{len(diffs)} differing boundaries")
  random.Random(0).shuffle(diffs)
  for who, t, e in diffs[:args.sample]:
    print(f"  {who}-only split: ...{t[max(0, e - 60):e]!r} | {t[e:e + 40]!r}")


if __name__ == "__main__":
  try:
    main()
  except ConfigError as e:  # pysbd not installed: one line, not a traceback
    sys.exit(f"splitter_report: {e}")
