"""Restart time of `logrerank serve`: launch -> first `/health` 200, a first start on an empty
compilation cache folder and a second start on the same folder.

  python -m logrerank_bench.serving_restart --checkpoint runs/demo/global [--cache DIR] \
      [--json restart.json] [-- extra serve flags, e.g. --row-len 256]

Each start: one `tools/serve.py` process on a free loopback port, /health polled every 50 ms
(the warm-up's first `/health` answer and the first time each warm-up stage was seen are
recorded), then `/info`'s compile counters, then SIGTERM. Bounded: 900 s a start; the server
is always stopped. The load average is printed with the figures: on a shared machine the
seconds are only comparable within one run.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

from logrerank_bench.defaults import REPO


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def one_start(checkpoint: str, cache: str, flags, log_path: str, timeout: float = 900) -> dict:
  """Launch, wait for /health 200, read /info, stop: the start's figures."""
  port = _free_port()
  url = f"http://127.0.0.1:{port}"
  t0 = time.monotonic()
  with open(log_path, "w") as log:
    proc = subprocess.Popen([sys.executable, str(REPO / "tools" / "serve.py"), "--checkpoint",
                             checkpoint, "--port", str(port), "--compilation-cache", cache,
                             *flags], stdout=log, stderr=subprocess.STDOUT)
  first, stages = None, {}
  try:
    with httpx.Client(timeout=5) as client:
      while True:
        if proc.poll() is not None or time.monotonic() - t0 > timeout:
          raise SystemExit(f"server not ready (see {log_path})")
        try:
          r = client.get(url + "/health")
        except httpx.TransportError:
          time.sleep(0.05)
          continue
        now = time.monotonic() - t0
        first = now if first is None else first
        if r.status_code == 200:
          break
        stages.setdefault(r.json().get("warmup", {}).get("stage", "?"), now)
        time.sleep(0.05)
      ready = time.monotonic() - t0
      info = client.get(url + "/info").json()
  finally:
    if proc.poll() is None:
      proc.send_signal(signal.SIGTERM)
    try:
      proc.wait(60)
    except subprocess.TimeoutExpired:
      proc.kill()
  return {"ready_s": round(ready, 2), "first_health_answer_s": round(first, 2),
          "stage_first_seen_s": {k: round(v, 2) for k, v in stages.items()},
          "warmup_s": info.get("warmup_s"), "compile_stats": info.get("compile_stats"),
          "load_average": os.getloadavg()}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--checkpoint", required=True)
  p.add_argument("--cache", default="", help="cache folder (default: a fresh temporary one)")
  p.add_argument("--json", default="")
  args, flags = p.parse_known_args(argv)
  flags = [f for f in flags if f != "--"]
  own = not args.cache
  cache = args.cache or tempfile.mkdtemp(prefix="logrerank-restart-")
  try:
    out = {}
    for name in ("first_start", "second_start"):
      out[name] = one_start(args.checkpoint, os.path.join(cache, "xla"), flags,
                            os.path.join(cache, f"{name}.log"))
      print(name, json.dumps(out[name]), flush=True)
  finally:
    if own:
      shutil.rmtree(cache, ignore_errors=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
