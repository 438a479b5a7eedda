"""Multi-host `logrerank rerank --distributed`: process i of P reranks records i, i+P, ... and
writes them to `OUTPUT.shard-i-of-P`; process 0 merges the shards in input order after a barrier
(every record exactly once).

JAX is imported when `--distributed` setup runs, not with this module.
"""

import json
import os

from logrerank_jax.errors import LogRerankError


def init_distributed(args) -> tuple:
  """Initialise multi-host JAX when asked; return (process index, process count)."""
  import jax  # pylint: disable=g-import-not-at-top
  if args.distributed:
    # CPU hosts need a collectives backend for the barrier; other platforms ignore it.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs = {}
    if args.coordinator_address:
      kwargs = dict(coordinator_address=args.coordinator_address,
                    num_processes=args.num_processes, process_id=args.process_id)
    jax.distributed.initialize(**kwargs)
  return jax.process_index(), jax.process_count()


def shard_path(output: str, pid: int, nproc: int) -> str:
  """Where process `pid` of `nproc` writes its records (next to the output)."""
  return f"{output}.shard-{pid}-of-{nproc}"


def merge_shards(output: str, nproc: int, total: int) -> list:
  """Read every process's shard; return its entries ordered by input index, checking that each
  of the `total` records is there exactly once. Removes the shard files."""
  entries, headers = {}, []
  for pid in range(nproc):
    path = shard_path(output, pid, nproc)
    with open(path, encoding="utf-8") as f:
      headers.append(json.loads(f.readline()))
      for line in f:
        e = json.loads(line)
        if e["i"] in entries:
          raise LogRerankError(f"record {e['i']} written by two processes")
        entries[e["i"]] = e
  missing = sorted(set(range(total)) - entries.keys())
  if missing:
    raise LogRerankError(f"records missing from the shards: {missing[:10]}")
  for pid in range(nproc):
    os.remove(shard_path(output, pid, nproc))
  return headers, [entries[i] for i in range(total)]
