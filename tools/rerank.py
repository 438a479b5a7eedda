"""Rerank OpenScholar/ScholarQABench-style passages at the sentence level with a LoG-Reranker model.

  python tools/rerank.py --checkpoint MODEL_OR_WORKDIR --input in.jsonl --output out.jsonl \
      [--format log|openscholar] [--strict] [--queries-per-batch 4] [--row-len N] \
      [--max-query-tokens N] \
      [--compilation-cache DIR | --no-compilation-cache] [--no-progress]

Input lines: {"input"|"question": str, "ctxs"|"passages": [{"title", "text", ...}], ...}.
Output: one line per non-blank input line, in order (see `logrerank_jax/inference.py` for the
"log" schema; `--format openscholar` writes the input back with its passages reordered and
`log_context` / `log_passage_order` added).  A record that cannot be processed gets an `error`
field; a passage whose text is unusable is kept, unranked, with its reason in
`passages[i]["skipped"]` (`--strict` makes such a record an error instead). The exit status
is 0 only when every record was fully processed, else 2 after writing everything; the last
stderr line counts records, skipped passages and errors and names the first lines.  The output is written to
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

import jax  # pylint: disable=g-import-not-at-top

from logrerank_jax import inference  # pylint: disable=g-import-not-at-top
from logrerank_jax import results as results_lib  # pylint: disable=g-import-not-at-top
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
                 help="a record with a skipped (unusable) passage becomes an error record")
  p.add_argument("--queries-per-batch", type=int, default=4, help="queries per jitted call (default 4)")
  p.add_argument("--row-len", type=int, default=None,
                 help="packed row length in tokens (default: the model's training setting, else 1024)")
  p.add_argument("--row-buckets", default=None,
                 help="comma-separated rows per local-stage call, e.g. 1,2,4,8,16,32,64,128 (the "
                      "largest bounds one call; bigger queries take several calls)")
  p.add_argument("--node-buckets", default=None,
                 help="comma-separated sentence-node buckets of a query graph (grown by doubling "
                      "when a query has more sentences)")
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
    buckets = {k: _int_list(v, f"--{k.replace('_', '-')}") for k, v in
               (("row_buckets", args.row_buckets), ("node_buckets", args.node_buckets)) if v}
    reranker = inference.Reranker.from_pretrained(
        args.checkpoint, queries_per_batch=args.queries_per_batch, row_len=args.row_len,
        max_query_tokens=args.max_query_tokens, **buckets)
  except (LogRerankError, OSError) as e:
    print(f"rerank: error: {e}", file=sys.stderr)
    return 1
  if reranker.local_only:
    print("rerank: note: the model has no global (GAT) params (a local-stage export); "
          "scores are the local ones and global_score is null", file=sys.stderr)
  typed = reranker.rerank_lines(lines, progress=not args.no_progress and len(lines) > 1)
  if args.strict:
    # --strict: a record with a skipped passage is not fully processed, so it is an error.
    typed = [results_lib.record_error(ln.raw, "passages skipped: " + "; ".join(
        f"{pkey(ln)}[{i}] {why}" for i, why in r.skipped), r.line)
             if getattr(r, "skipped", None) else r for ln, r in zip(lines, typed)]
  results = [r.to_dict() for r in typed]
  if args.format == "openscholar":
    objs = [inference.to_openscholar(ln.raw, r) for ln, r in zip(lines, results)]
  else:
    objs = results
  write_jsonl_atomic(args.output, objs)
  errors = [r for r in typed if r.error is not None]
  partial = [r for r in typed if r.error is None and r.skipped]
  skipped = sum(len(r.skipped) for r in partial)
  for r in errors:
    print(f"rerank: record at line {r.line}: {r.error}", file=sys.stderr)
  for r in partial:
    print(f"rerank: record at line {r.line}: skipped " + "; ".join(
        f"passage {i} ({why})" for i, why in r.skipped), file=sys.stderr)
  stats = reranker.compile_stats()
  print(f"rerank: {len(results)} records in {time.time() - start:.1f}s on "
        f"{jax.local_device_count()} device(s); XLA compilations: {stats['xla_compilations']} "
        f"(persistent-cache hits {stats['persistent_cache_hits']}, jit cache entries "
        f"{stats['jit_cache_entries']}, forward calls {stats['forward_calls']})", file=sys.stderr)
  bad_lines = [r.line for r in errors + partial]
  print(f"rerank: {len(results) - len(errors) - len(partial)} of {len(results)} records fully "
        f"processed, {len(partial)} with {skipped} skipped passage(s), {len(errors)} error(s)"
        + (f"; first lines: {', '.join(map(str, sorted(bad_lines)[:5]))}" if bad_lines else "")
        + f" -> {args.output}", file=sys.stderr)
  # Exit 0 only when every record was fully processed (DESIGN.md §7).
  return 2 if bad_lines else 0


def pkey(line) -> str:
  """The passage-list key of a record ("ctxs" or "passages")."""
  raw = line.raw if isinstance(line.raw, dict) else {}
  return "ctxs" if "ctxs" in raw else "passages"


def _int_list(text: str, flag: str) -> tuple:
  try:
    return tuple(int(x) for x in text.split(",") if x.strip())
  except ValueError:
    raise LogRerankError(f"{flag} must be comma-separated integers, got {text!r}") from None


if __name__ == "__main__":
  sys.exit(main())
