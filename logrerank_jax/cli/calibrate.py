"""Calibrate a model's scores: fit Platt scaling of LoG's final logit on validation pools and
write `calibration.json` into the model folder (`engine.calibration`), or measure a folder's
calibration on other pools.

  logrerank calibrate --checkpoint DIR --pools P --qrels Q [--corpus C] [--check]

Prints the expected calibration error (10 equal-width bins) of "passage is relevant" before
(the raw sigmoid of the logit) and after. `--check` fits nothing: it measures the folder's
calibration.json on these pools (held-out pools: the figure to report). A served model folder
with a calibration.json answers the calibrated probability as `relevance_score`.
"""

import argparse
import json
import sys


def parse_args(argv=None, prog=None):
  """Parse the command line."""
  p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
  p.add_argument("--checkpoint", required=True, help="model folder or training workdir")
  p.add_argument("--pools", required=True, help="pool file (OpenScholar records or id-only)")
  p.add_argument("--qrels", required=True, help="qrels of the pools (qid 0 docid rel)")
  p.add_argument("--corpus", default="", help="corpus of id-only pools")
  p.add_argument("--check", action="store_true",
                 help="measure the folder's calibration.json on these pools; write nothing")
  p.add_argument("--queries-per-batch", type=int, default=4, help="queries per global call")
  p.add_argument("--no-compilation-cache", action="store_true", help="no persistent XLA cache")
  return p.parse_args(argv)


def main(argv=None, prog=None) -> int:
  """Fit (or --check) and print the ECE before / after; return the exit status."""
  args = parse_args(argv, prog)
  name = prog or "calibrate"
  # JAX loads only once the flags are known good.
  from logrerank_jax import compilation  # pylint: disable=g-import-not-at-top
  from logrerank_jax.engine import Reranker  # pylint: disable=g-import-not-at-top
  from logrerank_jax.engine import calibration as cal  # pylint: disable=g-import-not-at-top
  from logrerank_jax.errors import LogRerankError  # pylint: disable=g-import-not-at-top
  from logrerank_jax.results.calibration import read_calibration  # pylint: disable=g-import-not-at-top
  if not args.no_compilation_cache:
    compilation.enable_compilation_cache(compilation.default_compilation_cache_dir())
  try:
    if args.check:
      rr = Reranker.from_pretrained(args.checkpoint, queries_per_batch=args.queries_per_batch)
      found = read_calibration(rr.model_dir)
      if found is None:
        print(f"{name}: error: {rr.model_dir} has no calibration.json", file=sys.stderr)
        return 1
      out = cal.measure(rr, args.pools, args.qrels, args.corpus, found)
      before, after = out["ece_raw"], out["ece_calibrated"]
    else:
      out = cal.fit_and_save_calibration(args.checkpoint, args.pools, args.qrels, args.corpus,
                                         queries_per_batch=args.queries_per_batch)
      before, after = out["ece_before"], out["ece_after"]
  except LogRerankError as e:
    print(f"{name}: error: {e}", file=sys.stderr)
    return 1
  print(json.dumps(out))
  print(f"{name}: ECE ({out['bins']} bins, {out['n']} passages, {out['positives']} relevant): "
        f"{before:.4f} raw -> {after:.4f} calibrated", file=sys.stderr)
  return 0
