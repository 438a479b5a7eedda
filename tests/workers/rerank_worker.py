"""Rerank records with `Reranker` in a fresh process (its device count set by the caller).

Usage: python rerank_worker.py SPEC.json
SPEC: {"model": dir, "input": jsonl, "out": json path, "kwargs": {Reranker.from_pretrained
       keyword arguments}, "precompile": bool}.
Writes {"outputs": [...], "stats": {...}, "devices": n, "live_compilations": n} to "out".
XLA_FLAGS (the CPU device count) must be set by the caller: JAX reads it at start-up.
"""

import json
import pathlib
import sys

import jax


def main():
  spec = json.loads(pathlib.Path(sys.argv[1]).read_text())
  from logrerank_jax import engine as inference  # pylint: disable=g-import-not-at-top
  kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in spec.get("kwargs", {}).items()}
  rr = inference.Reranker.from_pretrained(spec["model"], **kwargs)
  before = rr.precompile()["xla_compilations"] if spec.get("precompile") else 0
  with open(spec["input"], encoding="utf-8") as f:
    records = [json.loads(line) for line in f if line.strip()]
  outputs = rr.rerank_records(records)
  stats = rr.stats()
  pathlib.Path(spec["out"]).write_text(json.dumps({
      "outputs": outputs, "stats": stats, "devices": jax.local_device_count(),
      "live_compilations": stats["xla_compilations"] - before}))


if __name__ == "__main__":
  main()
