"""Print the parameter counts of the paper-size LoG-Reranker next to the paper's Table 10.

Counts come from `jax.eval_shape` (nothing is allocated). Exits 1 when any count is more than
`--tolerance` (default 2 %) away from the paper's figure.

  python tools/param_table.py [--tolerance 0.02]
  # LoG on another backbone: the encoder of an HF folder (ModernBERT or BERT-family, e.g. a
  # sentence-transformers all-MiniLM-L6-v2 folder), heads/GAT sized by LoGConfig.from_hf
  python tools/param_table.py --hf-model PATH
"""

import argparse
import sys

# Table 10 of the paper, in parameters. The encoder figure (ModernBERT-base, 149.01M) is the
# paper's text; "local heads" is the local total minus the encoder.
PAPER = {
    "encoder": 149.01e6,
    "local_heads": 149.85e6 - 149.01e6,
    "local": 149.85e6,
    "global": 2.67e6,
    "total": 152.52e6,
}
ROWS = (("encoder", "local encoder (ModernBERT-base)"), ("local_heads", "local heads"),
        ("local", "local reranker total"), ("global", "global reranker"), ("total", "total"))
# The paper rounds to 0.01M, so the small "local heads" row is only known to about +-0.01M
# (~1.2 %); it is printed for reference and checked against the same tolerance.


def param_table(counts, tolerance):
  """Format the comparison table.

  Args:
    counts: {"encoder", "local_heads", "local", "global", "total"} -> parameters.
    tolerance: allowed relative deviation (0.02 = 2 %).

  Returns:
    (table text, list of row keys that are off by more than `tolerance`).
  """
  lines = [f"{'component':34s} {'ours':>14s} {'paper':>10s} {'dev':>8s}"]
  bad = []
  for key, label in ROWS:
    ours, ref = counts[key], PAPER[key]
    dev = ours / ref - 1.0
    flag = "" if abs(dev) <= tolerance else "  <-- off"
    if flag:
      bad.append(key)
    lines.append(f"{label:34s} {ours:>14,d} {ref / 1e6:>9.2f}M {100 * dev:>+7.2f}%{flag}")
  return "\n".join(lines), bad


def backbone_table(counts, name):
  """Format the counts of a LoG built on another backbone (no paper figures to compare)."""
  labels = dict(ROWS, encoder=f"local encoder ({name})")
  width = max(34, *map(len, labels.values()))
  lines = [f"{'component':{width}s} {'ours':>14s}"]
  lines += [f"{labels[key]:{width}s} {counts[key]:>14,d}" for key, _ in ROWS]
  return "\n".join(lines)


def main(argv=None):
  """Print the table for `LoGConfig.paper()`; return the exit status.

  Args:
    argv: command-line arguments (default sys.argv[1:]).

  Returns:
    0 when every count is within tolerance, else 1.
  """
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tolerance", type=float, default=0.02,
                      help="largest allowed relative deviation from Table 10 (default 0.02)")
  parser.add_argument("--hf-model", metavar="PATH",
                      help="count LoG on this HF folder's encoder instead (ModernBERT or BERT); "
                           "printed without the paper comparison")
  args = parser.parse_args(argv)
  from logrerank_jax.models.log_reranker import LoGConfig, count_params  # after --help

  if args.hf_model:
    from logrerank_jax.models.local_scorer import encoder_config_from_hf, encoder_family
    enc = encoder_config_from_hf(args.hf_model)
    name = (f"{encoder_family(enc)}, {enc.num_hidden_layers} layers, "
            f"d={enc.hidden_size}")
    print(backbone_table(count_params(LoGConfig.from_encoder(enc)), name))
    return 0
  table, bad = param_table(count_params(LoGConfig.paper()), args.tolerance)
  print(table)
  if bad:
    print(f"off by more than {100 * args.tolerance:.1f} %: {', '.join(bad)}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
