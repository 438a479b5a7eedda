"""Serving load test: `tools/serve.py` under N concurrent clients against the in-process engine.

  python -m logrerank_bench.serving --checkpoint runs/demo/global [--clients 16] [--requests 48] \
      [--reps 3] [--json serving.json]
  (or: python tools/benchmark.py --suite serving --checkpoint runs/demo/global)

The requests are the demo's held-out evidence pools (real PubMedQA questions, 50 abstract
paragraphs each, `logrerank_jax/demo_data/paragraphs/test_pools.jsonl`), cycled to the asked
count. One server process on a free loopback port, warmed up (every shape precompiled) before
any clock starts; the same model folder and default settings in process. Interleaved rounds
(each round: in-process `rerank_records`, the server at N clients, in-process `rank` one at a
time, the server at 1 client), medians over the rounds with their spread, load average before
and after.

Figures:
  server_c{N}: lost requests (no HTTP answer: must be 0), 5xx (must be 0), other non-200,
    p50/p99 latency, throughput (requests/s), the server's batch sizes (from /metrics);
  in_process: `rerank_records` throughput on the same requests (the batch CLI's engine), and
    `rank()` latency one request at a time;
  ratios: throughput at N clients / in-process `rerank_records` (target >= 0.9), server p50
    latency at 1 client / in-process `rank()` p50 (target <= 1.1).
Bounded: a fixed number of requests, per-request and whole-run timeouts, loopback only; the
server is always killed at the end.
"""

import argparse
import concurrent.futures
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from logrerank_bench.defaults import REPO, demo_data_dir
from logrerank_bench.protocol import write_json


def demo_requests(n: int) -> List[dict]:
  """n OpenScholar records: the demo's 50-paragraph test pools, cycled."""
  from logrerank_jax.data.pool_files import expand_pools  # pylint: disable=g-import-not-at-top
  read = lambda p: [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()]  # noqa: E731
  demo = demo_data_dir() / "paragraphs"
  pools = expand_pools(read(demo / "test_pools.jsonl"), read(demo / "corpus.jsonl"))
  return [dict(pools[i % len(pools)], id=f"r{i}") for i in range(n)]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Server:
  """`tools/serve.py` on a free loopback port (killed on exit)."""

  def __init__(self, checkpoint: str, flags: Sequence[str], log_path: str, timeout: float = 900):
    import httpx  # pylint: disable=g-import-not-at-top
    self.url = f"http://127.0.0.1:{_free_port()}"
    port = self.url.rsplit(":", 1)[1]
    self.log = open(log_path, "w")
    self.proc = subprocess.Popen(
        [sys.executable, str(REPO / "tools" / "serve.py"), "--checkpoint", checkpoint,
         "--port", port, *flags], cwd=str(REPO), stdout=self.log, stderr=subprocess.STDOUT,
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
      if self.proc.poll() is not None:
        raise RuntimeError(f"server exited {self.proc.returncode}; log: {log_path}")
      try:
        if httpx.get(self.url + "/health", timeout=5).status_code == 200:
          self.warmup_s = time.perf_counter() - t0
          self.info = httpx.get(self.url + "/info", timeout=30).json()
          return
      except httpx.TransportError:
        pass
      time.sleep(0.2)
    self.close()
    raise RuntimeError(f"server not ready in {timeout:.0f} s; log: {log_path}")

  def metrics(self) -> Dict[str, float]:
    import httpx  # pylint: disable=g-import-not-at-top
    from prometheus_client.parser import text_string_to_metric_families  # pylint: disable=g-import-not-at-top
    text = httpx.get(self.url + "/metrics", timeout=30).text
    out = {}
    for fam in text_string_to_metric_families(text):
      for s in fam.samples:
        key = s.name + ("" if not s.labels else json.dumps(s.labels, sort_keys=True))
        out[key] = s.value
    return out

  def close(self):
    if self.proc.poll() is None:
      self.proc.send_signal(signal.SIGTERM)
      try:
        self.proc.wait(60)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait(30)
    self.log.close()


def load_test(url: str, bodies: Sequence[bytes], clients: int, timeout: float) -> Dict[str, Any]:
  """Send every body once from `clients` concurrent clients (keep-alive connections); return
  lost / status counts, latencies and throughput."""
  import httpx  # pylint: disable=g-import-not-at-top
  nxt = iter(range(len(bodies)))
  results: List[Optional[tuple]] = [None] * len(bodies)

  def client():
    with httpx.Client(timeout=timeout) as c:
      for i in nxt:  # the iterator is shared: each body goes to one client
        t0 = time.perf_counter()
        try:
          r = c.post(url + "/v2/rerank", content=bodies[i],
                     headers={"content-type": "application/json"})
          results[i] = (r.status_code, time.perf_counter() - t0)
        except httpx.HTTPError as e:
          results[i] = (f"{type(e).__name__}", time.perf_counter() - t0)

  t0 = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(clients) as ex:
    for f in [ex.submit(client) for _ in range(clients)]:
      f.result()
  wall = time.perf_counter() - t0
  codes = [r[0] if r else "no answer" for r in results]
  lat = [r[1] for r in results if r and r[0] == 200]
  return {"clients": clients, "requests": len(bodies), "wall_s": wall,
          "throughput_rps": len(bodies) / wall,
          "lost": sum(1 for c in codes if not isinstance(c, int)),
          "status_5xx": sum(1 for c in codes if isinstance(c, int) and c >= 500),
          "status_other": sum(1 for c in codes if isinstance(c, int) and c != 200 and c < 500),
          "latency_p50_s": float(np.percentile(lat, 50)) if lat else None,
          "latency_p99_s": float(np.percentile(lat, 99)) if lat else None}


def cohere_body(rec: dict) -> bytes:
  return json.dumps({"model": "log", "query": rec["input"],
                     "documents": [c["text"] for c in rec["ctxs"]],
                     "relevant_spans": {"mode": "enabled", "max_spans": 3}}).encode()


def _median(xs):
  return float(statistics.median(xs)) if xs else None


def serving_round(rr, server, records, bodies, clients: int, latency_requests: int,
                  timeout: float) -> Dict[str, Any]:
  """One interleaved round: in-process `rerank_records`, the server at `clients` clients,
  in-process `rank` one at a time, the server at 1 client."""
  r = {}
  t0 = time.perf_counter()
  outs = rr.rerank_records(records)
  r["in_process_rps"] = len(records) / (time.perf_counter() - t0)
  assert all(o["error"] is None for o in outs)
  r["server"] = load_test(server.url, bodies, clients, timeout)
  rank_lat = []
  for rec in records[:latency_requests]:
    t0 = time.perf_counter()
    rr.rank(rec["input"], [c["text"] for c in rec["ctxs"]])
    rank_lat.append(time.perf_counter() - t0)
  r["rank_p50_s"] = float(np.percentile(rank_lat, 50))
  r["server_c1"] = load_test(server.url, bodies[:latency_requests], 1, timeout)
  return r


def serving_suite(checkpoint: str, clients: int = 16, num_requests: int = 48, reps: int = 3,
                  row_buckets: Optional[Sequence[int]] = None, latency_requests: int = 8,
                  timeout: float = 600.0, log=print, log_path: str = "") -> Dict[str, Any]:
  """The load test (module docstring). Returns the JSON-ready figures.

  `row_buckets` (default: the engine's) applies to both sides; fewer buckets compile faster.
  Both sides share the persistent compilation cache, so the server loads what the in-process
  engine compiled.
  """
  import logrerank_jax  # pylint: disable=g-import-not-at-top
  from logrerank_jax import engine as inference  # pylint: disable=g-import-not-at-top
  cache = inference.enable_compilation_cache(inference.default_compilation_cache_dir())
  records = demo_requests(num_requests)
  bodies = [cohere_body(r) for r in records]
  load_before = os.getloadavg()
  log(f"serving: {num_requests} requests of {len(records[0]['ctxs'])} documents, {clients} "
      f"clients, {reps} rounds; load average {load_before[0]:.2f}")
  rr = logrerank_jax.Reranker.from_pretrained(
      checkpoint, **({"row_buckets": tuple(row_buckets)} if row_buckets else {}))
  t0 = time.perf_counter()
  pre = rr.precompile()
  log(f"serving: in-process engine compiled {pre['jit_cache_entries']} shapes in "
      f"{time.perf_counter() - t0:.1f} s")
  server_flags = ["--compilation-cache", cache] + (
      ["--row-buckets", ",".join(map(str, row_buckets))] if row_buckets else [])
  rr.rerank_records(records[:2])  # first-call costs (splitter, allocator) before the clock
  server = Server(checkpoint, ["--max-queue", str(max(64, 2 * clients)), "--timeout",
                               str(timeout), *server_flags],
                  log_path or os.path.join("/tmp", f"logrerank-serve-{os.getpid()}.log"))
  log(f"serving: server ready in {server.warmup_s:.1f} s at {server.url}")
  try:
    load_test(server.url, bodies[:2], 1, timeout)  # warm the HTTP path too
    rounds = []
    for rep in range(reps):
      r = serving_round(rr, server, records, bodies, clients, latency_requests, timeout)
      rounds.append(r)
      log(f"serving: round {rep + 1}: in-process {r['in_process_rps']:.3f} req/s, server at "
          f"{clients} clients {r['server']['throughput_rps']:.3f} req/s (lost "
          f"{r['server']['lost']}, 5xx {r['server']['status_5xx']}); rank() p50 "
          f"{r['rank_p50_s']:.3f} s, server at 1 client p50 {r['server_c1']['latency_p50_s']:.3f} s")
    metrics = server.metrics()
  finally:
    server.close()
  out = {"checkpoint": checkpoint, "requests": num_requests,
         "documents_per_request": len(records[0]["ctxs"]), "clients": clients, "rounds": rounds,
         "server_warmup_s": server.warmup_s, "row_buckets": list(rr.packing.row_buckets)}
  out.update(serving_figures(rounds, clients, metrics, server.info))
  out.update(load_average_before=list(load_before), load_average_after=list(os.getloadavg()))
  # Load above half the CPUs skews every figure (logrerank_bench/protocol.py's rule).
  out["reliable"] = max(load_before[0], out["load_average_after"][0]) <= (os.cpu_count() or 1) / 2
  return out


def serving_figures(rounds: List[dict], clients: int, metrics: Dict[str, float],
                    info: Dict[str, Any]) -> Dict[str, Any]:
  """Losses, medians over the rounds and the targets' ratios, the server's batching and live
  compilations."""
  batch_count = metrics.get("logrerank_batch_requests_count", 0)
  tput = [r["server"]["throughput_rps"] / r["in_process_rps"] for r in rounds]
  lat = [r["server_c1"]["latency_p50_s"] / r["rank_p50_s"] for r in rounds]
  return {
      "lost": sum(r["server"]["lost"] + r["server_c1"]["lost"] for r in rounds),
      "status_5xx": sum(r["server"]["status_5xx"] + r["server_c1"]["status_5xx"] for r in rounds),
      f"server_c{clients}_throughput_rps": _median([r["server"]["throughput_rps"] for r in rounds]),
      f"server_c{clients}_latency_p50_s": _median([r["server"]["latency_p50_s"] for r in rounds]),
      f"server_c{clients}_latency_p99_s": _median([r["server"]["latency_p99_s"] for r in rounds]),
      "in_process_rerank_records_rps": _median([r["in_process_rps"] for r in rounds]),
      "in_process_rank_p50_s": _median([r["rank_p50_s"] for r in rounds]),
      "server_c1_latency_p50_s": _median([r["server_c1"]["latency_p50_s"] for r in rounds]),
      "ratio_throughput_vs_rerank_records": {"median": _median(tput), "min": min(tput),
                                             "max": max(tput), "target": ">= 0.9"},
      "ratio_latency_c1_vs_rank": {"median": _median(lat), "min": min(lat), "max": max(lat),
                                   "target": "<= 1.1"},
      "server_batches": batch_count,
      "server_mean_batch_requests": (metrics.get("logrerank_batch_requests_sum", 0) / batch_count
                                     if batch_count else None),
      # Compilations counted after warm-up (each shape compiled or loaded from the cache once).
      "server_live_compilations": (metrics.get("logrerank_xla_compilations", 0)
                                   - info["compile_stats"]["xla_compilations"]),
  }


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--checkpoint", default="runs/demo/global")
  p.add_argument("--clients", type=int, default=16)
  p.add_argument("--requests", type=int, default=48)
  p.add_argument("--reps", type=int, default=3)
  p.add_argument("--latency-requests", type=int, default=8)
  p.add_argument("--row-buckets", default="", help="comma list (default: the engine's)")
  p.add_argument("--json", default="")
  args = p.parse_args(argv)
  buckets = tuple(int(x) for x in args.row_buckets.split(",") if x.strip()) or None
  out = serving_suite(args.checkpoint, args.clients, args.requests, args.reps,
                      row_buckets=buckets, latency_requests=args.latency_requests)
  print(json.dumps({k: v for k, v in out.items() if k != "rounds"}, indent=1))
  if args.json:
    write_json(args.json, out, indent=1, sort_keys=False)


if __name__ == "__main__":
  main()
