"""Plot training curves from one or more run folders' metrics.jsonl into a PNG.

  python tools/plot_training.py --workdir W1 [--workdir W2 ...] --output curves.png

Left: training loss (and its terms) per micro-step, raw (faint) and smoothed with TensorBoard's
debiased exponential moving average (`--smooth`, default 0.9; 0 plots the raw values only);
right: validation metrics per evaluation. The same curves, live: `tensorboard --logdir RUN_DIR`
(each run folder writes `tensorboard/` beside its metrics.jsonl).
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


def ema_smooth(values, weight: float):
  """TensorBoard's scalar smoothing: a debiased exponential moving average.

  s_t = weight * s_{t-1} + (1 - weight) * x_t from s_0 = 0, divided by 1 - weight**t so the
  first points are not pulled towards 0. `weight` 0 returns the values unchanged; None values
  (a term missing from a record) stay None and do not advance the average.
  """
  if not 0.0 <= weight < 1.0:
    raise ValueError(f"smoothing weight must be in [0, 1), got {weight}")
  out, acc, n = [], 0.0, 0
  for x in values:
    if x is None:
      out.append(None)
      continue
    n += 1
    acc = weight * acc + (1.0 - weight) * x
    out.append(acc / (1.0 - weight ** n))
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", action="append", required=True, help="run folder (repeatable)")
  parser.add_argument("--output", required=True, help="PNG to write")
  parser.add_argument("--smooth", type=float, default=0.9,
                      help="loss smoothing weight in [0, 1), TensorBoard's EMA (default 0.9; 0: raw)")
  args = parser.parse_args(argv)
  if not 0.0 <= args.smooth < 1.0:
    parser.error(f"--smooth must be in [0, 1), got {args.smooth}")
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
      curves = [("loss", "-", [r["loss"] for r in train])] + [
          (term, "--", [r.get(term) for r in train])
          for term in sorted({k for r in train for k in r} & {"rank", "role", "pairwise"})]
      for term, style, values in curves:
        if args.smooth:
          raw, = ax_loss.plot(steps, values, style, alpha=0.25, linewidth=0.8)
          ax_loss.plot(steps, ema_smooth(values, args.smooth), style, color=raw.get_color(),
                       label=f"{name}: {term} (smoothed {args.smooth:g})")
        else:
          ax_loss.plot(steps, values, style, label=f"{name}: {term}")
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
