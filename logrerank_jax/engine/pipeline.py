"""Host pipeline: the host work of the next chunks of records runs ahead of the devices.

`EngineCore.score` cuts the records into chunks of `DEFAULT_CHUNK_RECORDS`; the host work of a
chunk (tokenising, planning and packing its local calls: `Planner.local_jobs`) runs on
`host_workers` Grain worker threads while the caller drives the devices, in input order, so
outputs are identical to the serial engine's (`host_workers=0`).
"""

import copy
import threading
from typing import Callable, Iterator, List, Sequence, Tuple, Union

# Their values (and why) live in `defaults`, which the command-line flags read without JAX.
from logrerank_jax.engine.defaults import DEFAULT_CHUNK_RECORDS, DEFAULT_HOST_WORKERS
from logrerank_jax.errors import LogRerankError


def chunk_indices(n: int, size: int) -> List[List[int]]:
  """Indices 0..n-1 cut into consecutive chunks of `size`."""
  return [list(range(s, min(s + size, n))) for s in range(0, n, size)]


def prepared_chunks(records: Sequence, chunk_records: int, prepare: Callable,
                    tokenizer, host_workers: int
                    ) -> Iterator[Tuple[List[int], Union[list, LogRerankError]]]:
  """Cut `records` into chunks of `chunk_records` (`chunk_indices`) and yield (chunk indices,
  `prepare(chunk records, tokenizer)` or the LogRerankError it raised), in chunk order.

  Serial when `host_workers` is 0 or there is one chunk; otherwise a Grain `MapDataset` over
  the chunks, read by `host_workers` threads with a prefetch of as many chunks, so the host
  work of chunk k+1.. overlaps the device work of chunk k. Threads, not processes: the work
  is the Rust tokenizer and NumPy, which release the GIL, and the records stay in memory.
  Each thread tokenises with its own copy of `tokenizer` (a HF fast tokenizer is not safe to
  drive from several threads at once).

  Args:
    records: the records.
    chunk_records: records per chunk.
    prepare: `prepare(records, tokenizer=None)` -> the chunk's jobs (`Planner.local_jobs`).
    tokenizer: the tokenizer the worker threads copy.
    host_workers: worker threads (0: serial, on the caller's thread and tokenizer).
  """
  def run(idx, tok=None):
    try:
      return idx, prepare([records[i] for i in idx], tok)
    except LogRerankError as e:  # the consumer retries the chunk record by record
      return idx, e

  chunks = chunk_indices(len(records), chunk_records)
  if host_workers == 0 or len(chunks) < 2:
    for idx in chunks:
      yield run(idx)
    return
  import grain  # pylint: disable=g-import-not-at-top
  local = threading.local()

  def run_on_worker(idx):
    if not hasattr(local, "tokenizer"):
      local.tokenizer = copy.deepcopy(tokenizer)
    return run(idx, local.tokenizer)

  ds = grain.MapDataset.source(chunks).map(run_on_worker)
  yield from ds.to_iter_dataset(grain.ReadOptions(num_threads=host_workers,
                                                  prefetch_buffer_size=host_workers))
