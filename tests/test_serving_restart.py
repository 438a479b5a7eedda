"""Issue 43, part 3: a restart with the same compilation cache loads every compiled program
(`engine.executable_store`) instead of tracing and compiling it, and answers exactly as the
first start did. Two real `tools/serve.py` processes, one after the other, on loopback ports.

What is asserted is what a loaded machine cannot make flaky: the second start's warm-up
compiles nothing (`xla_compilations` 0) and loads all of its programs from the store. The
seconds themselves (first start vs restart) are measured in docs/SERVING.md, not asserted.
"""

import os
import shutil
import subprocess
import sys
import time

import httpx

from test_inference import make_pools, make_tiny_model
from test_serving import ROOT, SERVE, _free_port

FLAGS = ["--row-len", "256", "--row-buckets", "16", "--node-buckets", "256",
         "--queries-per-batch", "2", "--max-query-tokens", "24"]


def _start(model, cache, log_path):
  """One server start until /health is 200: (its /info, one Cohere answer)."""
  port = _free_port()
  url = f"http://127.0.0.1:{port}"
  with open(log_path, "w") as log:
    proc = subprocess.Popen([sys.executable, str(SERVE), "--checkpoint", model, "--port",
                             str(port), "--compilation-cache", str(cache), *FLAGS],
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT)
  try:
    deadline = time.monotonic() + 300
    with httpx.Client(timeout=5) as client:
      while True:
        assert proc.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, log_path.read_text()[-3000:]
        try:
          if client.get(url + "/health").status_code == 200:
            break
        except httpx.TransportError:
          pass
        time.sleep(0.05)
      info = client.get(url + "/info").json()
      pools = make_pools()[0]
      answer = []
      for p in pools:
        r = client.post(url + "/v2/rerank", timeout=60, json={
            "model": "log", "query": p["input"], "documents": [c["text"] for c in p["ctxs"]],
            "relevant_spans": {"mode": "enabled"}})
        assert r.status_code == 200, (r.text, log_path.read_text()[-3000:])
        answer.append(r.json()["results"])
    return info, answer
  finally:
    proc.kill()
    proc.wait(30)


def test_restart_loads_every_program_and_answers_the_same(tmp_path):
  """Three starts on one cache folder: the first compiles (and stores) every program; its store
  is then deleted, so the second start must compile them again, not take them from JAX's
  persistent cache (an executable JAX loaded from its cache serializes broken on XLA:CPU:
  "Function ... not found" when the copy runs), and store them; the third loads them all, and
  they run."""
  model = make_tiny_model(tmp_path / "model", make_pools()[0])
  cache = tmp_path / "cache"
  store = cache / "logrerank-executables"
  first, answer1 = _start(model, cache, tmp_path / "first.log")
  n = first["compile_stats"]["jit_cache_entries"]
  assert n == 2  # one local row bucket, one global node bucket
  assert first["compile_stats"]["executables_loaded"] == 0
  assert first["compile_stats"]["xla_compilations"] == n
  assert len(os.listdir(store)) == n
  shutil.rmtree(store)
  second, answer2 = _start(model, cache, tmp_path / "second.log")
  assert second["compile_stats"]["executables_loaded"] == 0
  assert second["compile_stats"]["persistent_cache_hits"] == 0, second["compile_stats"]
  third, answer3 = _start(model, cache, tmp_path / "third.log")
  # The restart traced and compiled nothing: every program came from the store.
  assert third["compile_stats"]["executables_loaded"] == n, third["compile_stats"]
  assert third["compile_stats"]["xla_compilations"] == 0, third["compile_stats"]
  assert third["compile_stats"]["jit_cache_entries"] == n
  # The loaded programs run, and are the same programs: the same answers, to the bit.
  assert answer3 == answer2 == answer1
