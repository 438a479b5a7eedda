"""Rerank OpenScholar/ScholarQABench-style passages at the sentence level with a LoG-Reranker model.

  python tools/rerank.py --checkpoint MODEL_OR_WORKDIR --input in.jsonl --output out.jsonl \
      [--format log|openscholar] [--strict] [--queries-per-batch 4] [--row-len N] \
      [--max-query-tokens N] \
      [--compilation-cache DIR | --no-compilation-cache] [--no-progress]

Input lines: {"input"|"question": str, "ctxs"|"passages": [{"title", "text", ...}], ...}.
Output: one line per non-blank input line, in order (see `logrerank_jax/inference.py` for the
"log" schema; `--format openscholar` writes the input back with its passages reordered and
`log_context` / `log_passage_order` added).  A record that cannot be processed gets an `error`
field; `--strict` then exits with status 2 after writing everything.  The output is written to
a temporary file in the same folder and renamed into place, so it is never half-written.
The last stderr line reports the number of XLA compilations of the forward.
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from logrerank_jax import inference  # pylint: disable=g-import-not-at-top
from logrerank_jax.data.inference_input import read_inference_file  # pylint: disable=g-import-not-at-top
from logrerank_jax.errors import LogRerankError  # pylint: disable=g-import-not-at-top


def parse_args(argv=None):
  """Parse the command line."""
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--checkpoint", required=True,
                 help="model folder (params/, model_config.json, tokenizer/) or a training workdir with model/")
  p.add_argument("--input", required=True, help="input JSONL")
  p.add_argument("--output", required=True, help="output JSONL (written atomically)")
  p.add_argument("--format", choices=("log", "openscholar"), default="log",
                 help="log: ranked sentences, passage ranking, context units; openscholar: the input "
                      "records with ctxs reordered and log_context added")
  p.add_argument("--strict", action="store_true",
                 help="exit with status 2 if any record has an error (after writing everything)")
  p.add_argument("--queries-per-batch", type=int, default=4, help="queries per jitted call (default 4)")
  p.add_argument("--row-len", type=int, default=None,
                 help="packed row length in tokens (default: the model's training setting, else 1024)")
  p.add_argument("--max-query-tokens", type=int, default=None,
                 help="query token limit (default: the model's training setting, else 64)")
  p.add_argument("--compilation-cache", default=None,
                 help=f"persistent XLA cache folder (default ${inference.DEFAULT_CACHE_ENV} or "
                      "~/.cache/logrerank_jax/xla; created with 0o700)")
  p.add_argument("--no-compilation-cache", action="store_true", help="do not use the persistent cache")
  p.add_argument("--no-progress", action="store_true", help="no progress bar")
  return p.parse_args(argv)


def check_output_writable(path: str) -> None:
  """Create the output's folder and prove it writable (raises OSError naming the problem)."""
  folder = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(path):
    raise IsADirectoryError(f"--output {path} is a folder")
  os.makedirs(folder, exist_ok=True)
  fd, probe = tempfile.mkstemp(prefix=".tmp-probe-", dir=folder)
  os.close(fd)
  os.remove(probe)


def write_jsonl_atomic(path: str, objs) -> None:
  """Write JSON lines to a temp file next to `path`, then rename it over `path`."""
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".jsonl", dir=folder)
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      for obj in objs:
        # NaN can only come from echoing an input record that held it (scores are checked finite).
        f.write(json.dumps(obj, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def main(argv=None) -> int:
  """Run the CLI; return the exit status."""
  args = parse_args(argv)
  start = time.time()
  try:
    check_output_writable(args.output)  # fail now, not after every record has been scored
    if not args.no_compilation_cache:
      inference.enable_compilation_cache(args.compilation_cache or inference.default_compilation_cache_dir())
    lines = read_inference_file(args.input)
    reranker = inference.Reranker.from_dir(args.checkpoint, queries_per_batch=args.queries_per_batch,
                                           row_len=args.row_len,
                                           max_query_tokens=args.max_query_tokens)
  except (LogRerankError, OSError) as e:
    print(f"rerank: error: {e}", file=sys.stderr)
    return 1
  if reranker.local_only:
    print("rerank: note: the model has no global (GAT) params (a local-stage export); "
          "scores are the local ones and global_score is null", file=sys.stderr)
  results = [r.to_dict() for r in reranker.rerank_lines(lines, progress=not args.no_progress and len(lines) > 1)]
  if args.format == "openscholar":
    objs = [inference.to_openscholar(ln.raw, r) for ln, r in zip(lines, results)]
  else:
    objs = results
  write_jsonl_atomic(args.output, objs)
  errors = [r for r in results if r.get("error") is not None]
  for r in errors:
    print(f"rerank: record at line {r['line']}: {r['error']}", file=sys.stderr)
  stats = reranker.compile_stats()
  print(f"rerank: {len(results)} records ({len(errors)} with errors) -> {args.output} in "
        f"{time.time() - start:.1f}s; XLA compilations: {stats['xla_compilations']} "
        f"(persistent-cache hits {stats['persistent_cache_hits']}, jit cache entries "
        f"{stats['jit_cache_entries']}, forward calls {stats['forward_calls']})", file=sys.stderr)
  return 2 if (args.strict and errors) else 0


if __name__ == "__main__":
  sys.exit(main())
