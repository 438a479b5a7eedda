"""Plot training curves from one or more run folders' metrics.jsonl into a PNG.

  python tools/plot_training.py --workdir W1 [--workdir W2 ...] --output curves.png

Left: training loss (and its terms) per micro-step; right: validation metrics per evaluation.
"""

import argparse
import json
import os
import sys


def read_metrics(workdir: str):
  """Return (train records, val records) of a run's metrics.jsonl."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    raise SystemExit(f"error: {path} does not exist (is {workdir} a training workdir?)")
  train, val = [], []
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        rec = json.loads(line)
      except json.JSONDecodeError as e:
        raise SystemExit(f"error: {path}:{lineno}: not JSON ({e.msg})") from None
      if rec.get("event") == "train":
        train.append(rec)
      elif rec.get("event") == "val":
        val.append(rec)
  return train, val


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", action="append", required=True, help="run folder (repeatable)")
  parser.add_argument("--output", required=True, help="PNG to write")
  args = parser.parse_args(argv)
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise SystemExit("error: plotting needs matplotlib (pip install -e '.[dev]')") from None
  fig, (ax_loss, ax_val) = plt.subplots(1, 2, figsize=(11, 4))
  for wd in args.workdir:
    train, val = read_metrics(wd)
    name = os.path.basename(os.path.normpath(wd))
    if train:
      steps = [r["step"] for r in train]
      ax_loss.plot(steps, [r["loss"] for r in train], label=f"{name}: loss")
      for term in sorted({k for r in train for k in r} & {"rank", "role", "pairwise"}):
        ax_loss.plot(steps, [r.get(term) for r in train], "--", label=f"{name}: {term}")
    for metric in ("ndcg@10", "map@10", "recall@10"):
      pts = [(r["step"], r[metric]) for r in val if metric in r]
      if pts:
        ax_val.plot(*zip(*pts), marker="o", label=f"{name}: {metric}")
  ax_loss.set(xlabel="micro-step", ylabel="loss", title="training loss")
  ax_val.set(xlabel="micro-step", ylabel="percent", title="validation (passage ranking)")
  for ax in (ax_loss, ax_val):
    if ax.lines:
      ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(args.output, dpi=110)
  print(f"wrote {args.output}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
