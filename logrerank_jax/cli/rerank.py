"""Rerank OpenScholar/ScholarQABench-style passages at the sentence level with a LoG-Reranker model.

  logrerank rerank --checkpoint MODEL_OR_WORKDIR --input in.jsonl --output out.jsonl \
      [--corpus corpus.jsonl] [--format log|openscholar] [--strict] [--queries-per-batch 4] \
      [--row-len N] [--max-query-tokens N] [--local-slots N] [--precompile] \
      [--distributed [--coordinator-address HOST:PORT --num-processes P --process-id I]] \
      [--compilation-cache DIR | --no-compilation-cache] [--no-progress] [--html OUT_DIR] \
      [--uncalibrated]

Scores: a model folder with a calibration.json (the global stage writes one) reports its
calibrated probabilities sigmoid(a z + b) of LoG's logits z, local and final alike, as `logrerank
serve` does; `--uncalibrated` reports the raw sigmoid(z), which reads 1.0 for sure passages.

Input lines: {"input"|"question": str, "ctxs"|"passages": [{"title", "text", ...}], ...}.
Id-only pools ({"id", "input", "ctx_ids": [passage id, ...]}, as logrerank_jax/demo_data ships
them) need `--corpus`, JSONL {"id", "title", "text"}: each id becomes that passage (`--format
openscholar` writes the resolved `ctxs` back); a record naming an id the corpus lacks is an
error record.
Output: one line per non-blank input line, in order (see `logrerank_jax/results/__init__.py` for
the "log" schema; `--format openscholar` writes the input back with its passages reordered and
`log_context` / `log_passage_order` added).  A record that cannot be processed gets an `error`
field; a passage whose text is unusable is kept, unranked, with its reason in
`passages[i]["skipped"]` (`--strict` makes such a record an error instead). The exit status
is 0 only when every record was fully processed, else 2 after writing everything; the last
stderr line counts records, skipped passages and errors and names the first lines.  The output is written to
a temporary file in the same folder and renamed into place, so it is never half-written.
The stderr summary reports the devices used, the number of XLA compilations of the forward
and the local stage's padding efficiency (real tokens / rows x row length computed).

Devices: every local device by default (calls of one shape run data-parallel over a mesh of
them). `--precompile` compiles every bucket shape before the first record, so live traffic
compiles nothing. `--distributed` initialises `jax.distributed` (coordinator flags, or
auto-detected on a cluster): process i of P reranks records i, i+P, ... on its own devices,
writes them to `OUTPUT.shard-i-of-P` next to the output, and process 0 merges the shards in
input order after a barrier (every record exactly once) and prints the summary.

`--html OUT_DIR` also writes one self-contained explanation page per record
(`record-00001.html`, ...: question, passages in LoG's order, sentence roles and score changes,
the sentence graph and context units) and `index.html`, built by `logrerank_jax.explain` from
the same results the JSONL holds.

`python tools/rerank.py ARGS` runs this command too (same flags, outputs and exit status).
"""

import argparse
import os
import sys
import time

from logrerank_jax import explain
from logrerank_jax import engine as inference
from logrerank_jax import results as results_lib
from logrerank_jax.cli.atomic_files import check_output_writable, write_jsonl_atomic
from logrerank_jax.cli.sharding import init_distributed, merge_shards, shard_path
from logrerank_jax.data.inference_input import (InputLine, PASSAGE_KEYS, parse_inference_record,
                                                 read_inference_file)
from logrerank_jax.data.pool_files import read_corpus, resolve_pool
from logrerank_jax.errors import DataError, LogRerankError


def parse_args(argv=None, prog=None):
  """Parse the command line."""
  p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
  p.add_argument("--checkpoint", required=True,
                 help="model folder (params/, model_config.json, tokenizer/) or a training workdir with model/")
  p.add_argument("--input", required=True, help="input JSONL")
  p.add_argument("--output", required=True, help="output JSONL (written atomically)")
  p.add_argument("--corpus", default=None,
                 help="JSONL {id, title, text} resolving id-only records' ctx_ids "
                      "(logrerank_jax.data.pool_files.resolve_pool)")
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
                 help="query token limit (default 128, at most half a row)")
  p.add_argument("--uncalibrated", action="store_true",
                 help="report the raw sigmoid of LoG's logits even when the model folder holds a "
                      "calibration.json (default: its calibrated probabilities, as serve does)")
  p.add_argument("--local-slots", type=int, default=None,
                 help="query slots per local-stage call (default max(16, --queries-per-batch))")
  p.add_argument("--host-workers", type=int, default=inference.DEFAULT_HOST_WORKERS,
                 help="host threads that tokenise and pack the next records while the devices "
                      f"run (default {inference.DEFAULT_HOST_WORKERS}; 0: serial)")
  p.add_argument("--precompile", action="store_true",
                 help="compile every bucket shape first (a service then compiles nothing live)")
  p.add_argument("--distributed", action="store_true",
                 help="multi-host: jax.distributed.initialize, each process reranks its shard "
                      "of the records, process 0 merges them in input order")
  p.add_argument("--coordinator-address", default="",
                 help="with --distributed: HOST:PORT of process 0 (else auto-detected)")
  p.add_argument("--num-processes", type=int, default=1, help="with --coordinator-address")
  p.add_argument("--process-id", type=int, default=0, help="with --coordinator-address")
  p.add_argument("--compilation-cache", default=None,
                 help=f"persistent XLA cache folder (default ${inference.DEFAULT_CACHE_ENV} or "
                      "~/.cache/logrerank_jax/xla; created with 0o700)")
  p.add_argument("--no-compilation-cache", action="store_true", help="do not use the persistent cache")
  p.add_argument("--no-progress", action="store_true", help="no progress bar")
  p.add_argument("--html", default=None, metavar="OUT_DIR",
                 help="also write one self-contained explanation page per record and index.html "
                      "into OUT_DIR (from the same results as the output)")
  return p.parse_args(argv)


def with_corpus(lines, by_id, path: str) -> list:
  """Input lines with each id-only record (`ctx_ids`, no passage list) resolved against the
  corpus `by_id` (`read_corpus`) and parsed again; an id the corpus lacks makes that record's
  error (naming the line, the record and the id), as any unusable record does."""
  out = []
  for ln in lines:
    raw = ln.raw
    if not isinstance(raw, dict) or "ctx_ids" not in raw or any(k in raw for k in PASSAGE_KEYS):
      out.append(ln)
      continue
    where = f"{path}:{ln.line}"
    try:
      rec = resolve_pool(raw, by_id, where)
      out.append(InputLine(ln.line, rec, parse_inference_record(rec, where)))
    except DataError as e:
      out.append(InputLine(ln.line, raw, e))
  return out


def load_inputs(args) -> tuple:
  """Everything that can fail before scoring, in this order: the processes, the output folder
  (fail now, not after every record has been scored), the cache, the input and the model.
  Returns (process index, process count, input lines, `Reranker`)."""
  pid, nproc = init_distributed(args)
  check_output_writable(args.output)  # fail now, not after every record has been scored
  if args.html:
    os.makedirs(args.html, exist_ok=True)
  if not args.no_compilation_cache:
    inference.enable_compilation_cache(args.compilation_cache or inference.default_compilation_cache_dir())
  lines = read_inference_file(args.input)
  if args.corpus:
    lines = with_corpus(lines, read_corpus(args.corpus), args.input)
  buckets = {k: _int_list(v, f"--{k.replace('_', '-')}") for k, v in
             (("row_buckets", args.row_buckets), ("node_buckets", args.node_buckets)) if v}
  reranker = inference.Reranker.from_pretrained(
      args.checkpoint, queries_per_batch=args.queries_per_batch, row_len=args.row_len,
      max_query_tokens=args.max_query_tokens, local_slots=args.local_slots,
      host_workers=args.host_workers, calibrated=not args.uncalibrated, **buckets)
  return pid, nproc, lines, reranker


def rerank_shard(args, reranker, lines, pid: int, nproc: int) -> tuple:
  """Rerank this process's records (input indices pid, pid + nproc, ...), write their
  explanation pages and name each bad record on stderr.

  Returns (entries, stats): one entry per record, {"i": input index, "obj": its output line,
  "line", "error", "skipped": count, "page": its index row with --html}, and the reranker's
  counters with `live_compilations` (those after --precompile)."""
  if args.precompile:
    t0 = time.time()
    pre = reranker.precompile()
    print(f"rerank: precompiled {pre['jit_cache_entries']} shapes ({pre['xla_compilations']} XLA "
          f"compilations) in {time.time() - t0:.1f}s", file=sys.stderr)
  compiled_before = reranker.compile_stats()["xla_compilations"] if args.precompile else 0
  mine = [i for i in range(len(lines)) if i % nproc == pid]  # this process's records
  my_lines = [lines[i] for i in mine]
  typed = reranker.rerank_lines(my_lines, progress=not args.no_progress and len(my_lines) > 1)
  if args.strict:
    # --strict: a record with a skipped passage is not fully processed, so it is an error.
    typed = [results_lib.record_error(ln.raw, "passages skipped: " + "; ".join(
        f"{pkey(ln)}[{i}] {why}" for i, why in r.skipped), r.line)
             if getattr(r, "skipped", None) else r for ln, r in zip(my_lines, typed)]
  results = [r.to_dict() for r in typed]
  # Explanation pages from the same results; each process writes its own records' pages.
  pages = explain.write_record_pages(args.html, zip(mine, typed)) if args.html else None
  if args.format == "openscholar":
    objs = [inference.to_openscholar(ln.raw, r) for ln, r in zip(my_lines, results)]
  else:
    objs = results
  for r in typed:
    if r.error is not None:
      print(f"rerank: record at line {r.line}: {r.error}", file=sys.stderr)
    elif r.skipped:
      print(f"rerank: record at line {r.line}: skipped " + "; ".join(
          f"passage {i} ({why})" for i, why in r.skipped), file=sys.stderr)
  stats = reranker.stats()
  stats["live_compilations"] = stats["xla_compilations"] - compiled_before
  entries = [{"i": i, "obj": o, "line": r.line, "error": r.error is not None,
              "skipped": 0 if r.error is not None else len(r.skipped or ())}
             for i, o, r in zip(mine, objs, typed)]
  if pages is not None:
    for e, page in zip(entries, pages):
      e["page"] = page  # the index row, carried through the shards to process 0
  return entries, stats


def print_summary(args, entries, headers, nproc: int, start: float) -> int:
  """The two summary lines on stderr (devices, compilations and padding; records fully
  processed, skipped passages and errors); return the exit status."""
  total = {k: sum(h[k] for h in headers) for k in
           ("devices", "xla_compilations", "persistent_cache_hits", "jit_cache_entries",
            "forward_calls", "real_tokens", "computed_tokens", "inert_tokens", "live_compilations")}
  errors = [e for e in entries if e["error"]]
  partial = [e for e in entries if not e["error"] and e["skipped"]]
  skipped = sum(e["skipped"] for e in partial)
  eff = total["real_tokens"] / total["computed_tokens"] if total["computed_tokens"] else 0.0
  procs = f" in {nproc} processes" if nproc > 1 else ""
  print(f"rerank: {len(entries)} records in {time.time() - start:.1f}s on "
        f"{total['devices']} device(s){procs}; XLA compilations: {total['xla_compilations']} "
        f"(persistent-cache hits {total['persistent_cache_hits']}, jit cache entries "
        f"{total['jit_cache_entries']}, forward calls {total['forward_calls']}"
        + (f", after precompile {total['live_compilations']}" if args.precompile else "")
        + f"); padding efficiency {eff:.3f} ({total['real_tokens']} real / "
        f"{total['computed_tokens']} computed tokens, {total['inert_tokens']} in inert "
        "device-stack calls)", file=sys.stderr)
  bad_lines = [e["line"] for e in errors + partial]
  print(f"rerank: {len(entries) - len(errors) - len(partial)} of {len(entries)} records fully "
        f"processed, {len(partial)} with {skipped} skipped passage(s), {len(errors)} error(s)"
        + (f"; first lines: {', '.join(map(str, sorted(bad_lines)[:5]))}" if bad_lines else "")
        + f" -> {args.output}", file=sys.stderr)
  # Exit 0 only when every record was fully processed (DESIGN.md §7).
  return 2 if bad_lines else 0


def main(argv=None, prog=None) -> int:
  """Run the CLI; return the exit status."""
  args = parse_args(argv, prog)
  start = time.time()
  try:
    pid, nproc, lines, reranker = load_inputs(args)
  except (LogRerankError, OSError) as e:
    print(f"rerank: error: {e}", file=sys.stderr)
    return 1
  if reranker.local_only and pid == 0:
    print("rerank: note: the model has no global (GAT) params (a local-stage export); "
          "scores are the local ones and global_score is null", file=sys.stderr)
  entries, stats = rerank_shard(args, reranker, lines, pid, nproc)
  headers = [stats]
  if nproc > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    write_jsonl_atomic(shard_path(args.output, pid, nproc), [stats] + entries)
    multihost_utils.sync_global_devices("logrerank_jax rerank: shards written")
    if pid != 0:
      return 2 if any(e["error"] or e["skipped"] for e in entries) else 0
    try:
      headers, entries = merge_shards(args.output, nproc, len(lines))
    except (LogRerankError, OSError, ValueError) as e:
      print(f"rerank: error: merging the shards: {e}", file=sys.stderr)
      return 1
  write_jsonl_atomic(args.output, [e["obj"] for e in entries])
  if args.html:
    index = explain.write_index(args.html, [e["page"] for e in entries])
    print(f"rerank: {len(entries)} explanation pages and {index}", file=sys.stderr)
  return print_summary(args, entries, headers, nproc, start)


def pkey(line) -> str:
  """The passage-list key of a record ("ctxs" or "passages")."""
  raw = line.raw if isinstance(line.raw, dict) else {}
  return "ctxs" if "ctxs" in raw else "passages"


def _int_list(text: str, flag: str) -> tuple:
  try:
    return tuple(int(x) for x in text.split(",") if x.strip())
  except ValueError:
    raise LogRerankError(f"{flag} must be comma-separated integers, got {text!r}") from None
