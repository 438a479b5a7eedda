"""Benchmark LoG-Reranker in JAX against its PyTorch peer; print the figures and write JSON.

  python tools/benchmark.py --suite encoder --size small --threads 2 --json bench.json
  python tools/benchmark.py --suite all --size small --json bench.json
  python tools/benchmark.py --suite encoder,pipeline --size base --dtype bfloat16 \
      --data ../shared/data/scholarqabench --passages 50 --json gpu.json      # on a GPU
  python tools/benchmark.py --suite serving --checkpoint runs/demo/global --clients 16 \
      --requests 48 --reps 5 --json serving.json                             # HTTP load test

Suites: encoder, train_step, kernels, pipeline, packing, attention_work, recompile, cache, params
(see logrerank_bench/); `serving` (not in `all`: it needs a trained model folder, `--checkpoint`) is
the HTTP load test of `tools/serve.py` against the in-process engine (logrerank_bench/serving.py);
`host` (not in `all`) is the engine's host work per real 50-passage query on one thread and its
throughput with 1 and 2 worker processes (logrerank_bench/host.py; `taskset -c 1` for one core).
`attention_work` counts, per attention path, the query x key pairs it computes against those
the masks keep (`attention_work_efficiency`, also copied to the JSON's top level).
`encoder`, `train_step` and `kernels` are `logrerank_bench.encoder` (interleaved
protocol, median and spread, load average recorded, the strongest simple PyTorch peer: sdpa on
length-sorted batches; `kernels` times one dense projection and one attention layer of each
framework on identical inputs); they run in a child process so their XLA flags and thread
settings apply before JAX starts.
Thread counts are fixed before JAX and torch start: the process CPU affinity (which bounds XLA's
CPU thread pool) and torch.set_num_threads both get --threads; both are recorded in the JSON.
"""

import argparse
import os
import sys
import time

from logrerank_bench.defaults import SIZES, data_files, demo_data_dir

SUITES = ("params", "packing", "attention_work", "encoder", "train_step", "kernels", "pipeline",
          "cache", "recompile")
ENCODER_SUITES = ("encoder", "train_step", "kernels")  # logrerank_bench.encoder, in a child process
EXTRA_SUITES = ("serving", "host")  # run only when named


def parse_args(argv=None):
  """Parse the command line."""
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--suite", default="all", help=f"comma list of {SUITES} or 'all'")
  p.add_argument("--size", default="small", choices=SIZES)
  p.add_argument("--threads", type=int, default=0,
                 help="CPU threads for XLA and torch (0: all allowed)")
  p.add_argument("--data", default="",
                 help="folder with ScholarQABench scifact_test.jsonl / pubmed_test.jsonl "
                 "(default: the slices in tests/data)")
  p.add_argument("--passages", type=int, default=50, help="passages per query (pool size)")
  p.add_argument("--queries", type=int, default=0, help="queries per file (0: size default)")
  p.add_argument("--reps", type=int, default=5,
                 help="timed repetitions after warm-up (encoder/train_step: interleaved, >= 5)")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  p.add_argument("--torch-batch-size", type=int, default=8)
  p.add_argument("--recompile-queries", type=int, default=100)
  p.add_argument("--no-fused", action="store_true", help="pipeline: skip the fused log_forward jit")
  p.add_argument("--row-buckets", default="pow2", choices=("pow2", "fine"),
                 help="encoder/pipeline row buckets: the packer's default powers of 2, or "
                 "1..16 then multiples of 4 (fewer padding rows, more shapes to compile)")
  p.add_argument("--impls", default="xla,blocked,tiled", help="encoder attention implementations")
  p.add_argument("--work-row-lens", default="512,1024,2048,4096",
                 help="attention_work: packed row lengths to count at")
  p.add_argument("--time-budget", type=float, default=0.0,
                 help="seconds; suites not started before this much time has passed are skipped")
  p.add_argument("--no-engine", action="store_true",
                 help="pipeline/recompile: do not use logrerank_jax.engine.Reranker")
  p.add_argument("--checkpoint", default="runs/demo/global",
                 help="serving: the model folder to serve (default: the demo's final model)")
  p.add_argument("--clients", type=int, default=16, help="serving: concurrent HTTP clients")
  p.add_argument("--requests", type=int, default=48,
                 help="serving: requests per round (the demo's 50-paragraph test pools, cycled)")
  p.add_argument("--json", default="", help="write all figures here")
  return p.parse_args(argv)


def encoder_child(suite: str, args, threads: int) -> dict:
  """Run one `logrerank_bench.encoder` suite in a child process and return its JSON entry."""
  import json  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  if args.size == "tiny":
    return {"skipped": "encoder/train_step/kernels have sizes small and base"}
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "out.json")
    cmd = [sys.executable, "-m", "logrerank_bench.encoder", "--suite", suite, "--size", args.size,
           "--threads", str(threads), "--reps", str(max(5, args.reps)), "--impls", args.impls,
           "--json", out] + (["--data", args.data] if args.data else []) + (
               ["--queries", str(args.queries)] if args.queries else [])
    subprocess.run(cmd, check=True)
    with open(out, encoding="utf-8") as f:
      return json.load(f)[suite]


class BenchmarkRun:
  """One run's settings, its pools and tokenizer (built on first use) and the JSON being written.

  Built after the thread settings: it imports JAX and torch."""

  def __init__(self, args, threads: int):
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    import torch  # pylint: disable=g-import-not-at-top
    from logrerank_bench import protocol  # pylint: disable=g-import-not-at-top
    from logrerank_bench import suites as bm  # pylint: disable=g-import-not-at-top
    self.args, self.threads, self.bm, self.protocol = args, threads, bm, protocol
    self.start = time.perf_counter()
    self.fine = tuple(range(1, 17)) + tuple(range(20, 129, 4))
    self.row_buckets = self.fine if args.row_buckets == "fine" else None
    self.dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    on_gpu = jax.default_backend() == "gpu"
    torch_device = "cuda" if on_gpu and torch.cuda.is_available() else "cpu"
    self.files = data_files(args.data)
    default_q = {"tiny": 2, "small": 1, "base": 8 if on_gpu else 1}[args.size]
    self.limit = args.queries or default_q
    self.results = {"machine": protocol.machine_info(threads, load_average=True),
                    "args": vars(args), "data_files": self.files, "torch_device": torch_device}
    print(f"threads={threads} backend={jax.default_backend()} data={self.files}", flush=True)
    self._pools = None
    self.tokenizer = None

  def pools(self):
    if self._pools is None:
      self._pools = self.bm.load_pools(self.files, pool_size=self.args.passages, limit=self.limit)
      self.tokenizer = self.bm.benchmark_tokenizer(self._pools)
    return self._pools

  def save(self):
    self.results["elapsed_s"] = time.perf_counter() - self.start
    if self.args.json:
      self.protocol.write_json(self.args.json, self.results)


def run_packing(run: BenchmarkRun) -> dict:
  bm, row_len = run.bm, run.bm.row_len_for(run.args.size)
  out = bm.packing_suite(run.pools(), run.tokenizer, row_len, row_buckets=run.fine)
  out["batched_4_queries"] = bm.packing_suite(
      run.pools(), run.tokenizer, row_len, row_buckets=run.fine, queries_per_batch=4,
      engine=False)
  eng = out["engine"]
  print("packing: engine defaults, padding efficiency at 1 / 4 / all queries per call: "
        + " / ".join(f"{eng[k]['padding_efficiency']:.3f}" for k in
                     ("queries_per_call_1", "queries_per_call_4", "queries_per_call_all")))
  return out


def run_attention_work(run: BenchmarkRun) -> dict:
  from logrerank_bench import attention_work  # pylint: disable=g-import-not-at-top
  out = attention_work.attention_work_suite(
      run.pools(), run.tokenizer, run.args.size,
      row_lens=tuple(int(x) for x in run.args.work_row_lens.split(",")))
  run.results["attention_work_efficiency"] = out["attention_work_efficiency"]
  return out


def run_host(run: BenchmarkRun) -> dict:
  from logrerank_bench import host  # pylint: disable=g-import-not-at-top
  return host.host_suite()


def run_serving(run: BenchmarkRun) -> dict:
  from logrerank_bench import serving  # pylint: disable=g-import-not-at-top
  return serving.serving_suite(run.args.checkpoint, clients=run.args.clients,
                               num_requests=run.args.requests, reps=run.args.reps)


def run_cache(run: BenchmarkRun) -> dict:
  if run.tokenizer is None:
    run.pools()
  return run.bm.cache_suite(str(demo_data_dir() / "train.jsonl"), run.tokenizer, run.args.size)


RUNNERS = {
    "params": lambda run: run.bm.params_suite(),
    "packing": run_packing,
    "attention_work": run_attention_work,
    "pipeline": lambda run: run.bm.pipeline_suite(
        run.pools(), run.tokenizer, run.args.size, dtype=run.dtype, fused=not run.args.no_fused,
        row_buckets=run.row_buckets, engine=not run.args.no_engine),
    "recompile": lambda run: run.bm.recompile_suite(
        run.pools(), run.tokenizer, run.args.size, num_queries=run.args.recompile_queries,
        engine=not run.args.no_engine),
    "host": run_host,
    "serving": run_serving,
    "cache": run_cache,
}
RUNNERS.update({s: (lambda run, s=s: encoder_child(s, run.args, run.threads))
                for s in ENCODER_SUITES})


def main(argv=None):
  """Run the chosen suites and write the JSON."""
  args = parse_args(argv)
  suites = SUITES if args.suite == "all" else tuple(s.strip() for s in args.suite.split(","))
  unknown = [s for s in suites if s not in SUITES + EXTRA_SUITES]
  if unknown:
    raise SystemExit(f"unknown suite(s) {unknown}; known: {SUITES + EXTRA_SUITES}")
  from logrerank_bench.protocol import set_threads  # pylint: disable=g-import-not-at-top
  threads = set_threads(args.threads)  # before torch and JAX start
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(threads)
  run = BenchmarkRun(args, threads)
  results = run.results
  for suite in suites:
    if args.time_budget and time.perf_counter() - run.start > args.time_budget:
      results[suite] = {"skipped": f"time budget {args.time_budget:.0f} s spent"}
      print(f"{suite}: skipped (time budget)", flush=True)
      continue
    t0 = time.perf_counter()
    results[suite] = RUNNERS[suite](run)
    results[suite]["suite_s"] = time.perf_counter() - t0
    print(f"{suite}: {results[suite]}", flush=True)
    run.save()  # after every suite, so a run cut short keeps what it measured
  run.save()
  return results


if __name__ == "__main__":
  main()
