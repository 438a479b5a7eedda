"""Dynamic batching: concurrent requests share the engine's bucketed device calls.

Requests (one parsed query each) enter a bounded queue (`submit`; past `max_queue` waiting
requests it raises `QueueFull`, the server's 429). A gather thread takes what arrived within a
short window after the first request, up to a token budget (`max_batch_tokens`, counted as the
real tokens the local stage will run for each request, so a batch is a fixed amount of device
work; a request larger than the budget goes alone, never cut), and does the batch's host work
(tokenise, plan and pack its local calls: `EngineCore.prepare`). One engine thread scores the
prepared batches in order (`EngineCore.score_chunk`: the local stage packed across the batch's
requests, the global stage on each query's own whole graph) and resolves each request's future.
The gather thread prepares batch k+1 while the engine runs batch k, then waits for the engine
to take it before gathering batch k+2: what arrives meanwhile waits in the bounded queue (and
joins the same batch), so under overload requests are refused, not piled up in memory.

Why an answer equals the request served alone: a local score depends only on its own (query,
passage) sequence, and the global stage sees each query's own graph (similarity edges never
cross queries), so batching changes only float rounding of the padded shapes (~1e-7).

A request whose future was cancelled before its batch started (its client timed out or went
away) is dropped from the batch; one cancelled later is scored with its batch and the answer
discarded: no batch is ever broken by a client. `close` stops intake, scores everything already
admitted, and stops the threads.

No HTTP here (the app on top turns `QueueFull` into 429 and futures into responses).
"""

import collections
import concurrent.futures
import copy
import dataclasses
import logging
import math
import queue
import threading
import time
from typing import Any, Callable, Optional

from logrerank_jax.data.inference_input import InferenceRecord
# Their values (and why) live in `defaults`, which the command-line flags read without JAX.
from logrerank_jax.engine.defaults import (DEFAULT_MAX_BATCH_TOKENS, DEFAULT_MAX_QUEUE,
                                           DEFAULT_WINDOW_S)
from logrerank_jax.errors import LogRerankError

log = logging.getLogger(__name__)

_STOP = object()


class QueueFull(LogRerankError):
  """The queue holds `max_queue` waiting requests; retry after `retry_after` seconds."""

  def __init__(self, message: str, retry_after: int):
    super().__init__(message)
    self.retry_after = retry_after


class Closed(LogRerankError):
  """The batcher is shutting down and takes no new request."""


@dataclasses.dataclass(frozen=True)
class Scored:
  """What a request's future resolves to: its scores (or the error of its record) and the real
  tokens the local stage ran for it."""
  scores: Any          # results.QueryScores, or the LogRerankError of this record
  tokens: int
  batch_size: int      # requests in the batch it was scored in


@dataclasses.dataclass
class _Item:
  record: InferenceRecord
  future: concurrent.futures.Future
  tokens: int = 0


class Batcher:
  """A bounded request queue in front of one engine core, scored in batches on one thread."""

  def __init__(self, core, max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
               max_queue: int = DEFAULT_MAX_QUEUE, window_s: float = DEFAULT_WINDOW_S,
               on_batch: Optional[Callable[[int, int, float], None]] = None):
    """Start the gather and engine threads.

    Args:
      core: a loaded `engine.core.EngineCore` (a `Reranker` is one): its `tokenizer`,
        `record_tokens`, `prepare` and `score_chunk` (only this batcher's threads may drive it
        from now on).
      max_batch_tokens: token budget of a batch (module docstring).
      max_queue: waiting requests before `submit` raises `QueueFull`.
      window_s: gather window after the first request of an idle period.
      on_batch: called after each batch with (requests, tokens, seconds) (e.g. metrics).
    """
    for name, v in (("max_batch_tokens", max_batch_tokens), ("max_queue", max_queue)):
      if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    if not window_s >= 0:
      raise ValueError(f"window_s must be >= 0, got {window_s!r}")
    self.core = core
    self.max_batch_tokens = max_batch_tokens
    self.max_queue = max_queue
    self.window_s = float(window_s)
    self._on_batch = on_batch
    self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
    self._handoff: "queue.Queue" = queue.Queue(maxsize=1)  # one prepared batch ahead
    self._slot = threading.Semaphore(1)  # free while the handoff is empty
    self._lock = threading.Lock()
    self._waiting = 0   # admitted, not yet taken into a batch
    self._pending = 0   # admitted, not yet answered (or dropped)
    self._closed = False
    # Seconds per batch, recent ones: the Retry-After a full queue answers with.
    self._recent = collections.deque(maxlen=16)
    self.batches = 0
    # The gather thread tokenises with its own copy (a HF fast tokenizer is not thread-safe).
    self._tokenizer = copy.deepcopy(core.tokenizer)
    self._threads = [threading.Thread(target=self._gather_loop, name="batcher-gather", daemon=True),
                     threading.Thread(target=self._engine_loop, name="batcher-engine", daemon=True)]
    for t in self._threads:
      t.start()

  # ---------------------------------------------------------------------------- intake

  def submit(self, record: InferenceRecord) -> concurrent.futures.Future:
    """Queue one parsed record; its future resolves to a `Scored`.

    Raises:
      QueueFull: `max_queue` requests are waiting already.
      Closed: the batcher is shutting down.
    """
    fut: concurrent.futures.Future = concurrent.futures.Future()
    with self._lock:
      if self._closed:
        raise Closed("the server is shutting down")
      if self._waiting >= self.max_queue:
        raise QueueFull(f"queue full ({self.max_queue} requests waiting)", self.retry_after())
      self._waiting += 1
      self._pending += 1
      self._queue.put(_Item(record, fut))
    return fut

  def queue_depth(self) -> int:
    """Requests waiting for a batch."""
    return self._waiting

  def pending(self) -> int:
    """Requests admitted and not yet answered (waiting, being prepared or being scored)."""
    return self._pending

  def _done(self, n: int) -> None:
    with self._lock:
      self._pending -= n

  def retry_after(self) -> int:
    """Whole seconds after which a refused client may retry: the time the waiting requests
    take at the recent batch speed (at least 1)."""
    recent = list(self._recent)
    per_batch = sum(recent) / len(recent) if recent else 1.0
    return max(1, math.ceil(per_batch))

  def close(self, timeout: Optional[float] = None) -> None:
    """Stop intake, score every admitted request, stop the threads (waits `timeout` s)."""
    with self._lock:
      if self._closed:
        return
      self._closed = True
      self._queue.put(_STOP)  # after every admitted request: they are all scored first
    for t in self._threads:
      t.join(timeout)

  # ---------------------------------------------------------------------------- threads

  def _take(self, block: bool, timeout: Optional[float] = None):
    item = self._queue.get(block=block, timeout=timeout)
    if item is not _STOP:
      with self._lock:
        self._waiting -= 1
    return item

  def _count(self, item: _Item) -> int:
    try:
      item.tokens = self.core.record_tokens([item.record], self._tokenizer)[0]
    except Exception:  # pylint: disable=broad-except  (its error surfaces when the batch is
      item.tokens = 0  # scored, on the engine thread, for this request only)
    return item.tokens

  def _gather_loop(self) -> None:
    carried = None
    while True:
      self._slot.acquire()  # the previous batch is on the engine: start gathering the next
      first = carried if carried is not None else self._take(block=True)
      carried = None
      if first is _STOP:
        self._handoff.put(_STOP)
        return
      batch, tokens = [first], first.tokens or self._count(first)  # a carried one is counted
      stop = False
      end = time.monotonic() + self.window_s
      while tokens < self.max_batch_tokens:
        remaining = end - time.monotonic()
        try:
          nxt = self._take(block=remaining > 0, timeout=max(remaining, 0) or None)
        except queue.Empty:
          break
        if nxt is _STOP:
          stop = True
          break
        n = self._count(nxt)
        if tokens + n > self.max_batch_tokens:
          carried = nxt  # opens the next batch
          break
        batch.append(nxt)
        tokens += n
      # A future cancelled while waiting (its client gave up) is dropped; the others can no
      # longer be cancelled, so every answer of this batch will be delivered or discarded.
      live = [it for it in batch if it.future.set_running_or_notify_cancel()]
      self._done(len(batch) - len(live))
      if live:
        try:
          jobs = self.core.prepare([it.record for it in live], self._tokenizer)
        except Exception as e:  # pylint: disable=broad-except  (an internal fault: fail the batch)
          jobs = e
        self._handoff.put((live, jobs))
      else:
        self._slot.release()
      if stop:
        carried = _STOP

  def _engine_loop(self) -> None:
    while True:
      got = self._handoff.get()
      self._slot.release()
      if got is _STOP:
        return
      items, jobs = got
      t0 = time.perf_counter()
      try:
        if isinstance(jobs, Exception) and not isinstance(jobs, LogRerankError):
          raise jobs
        results = self.core.score_chunk([it.record for it in items], jobs)
      except Exception as e:  # pylint: disable=broad-except  (internal fault: every request of
        log.exception("batch of %d requests failed", len(items))  # the batch gets a 500)
        for it in items:
          it.future.set_exception(e)
        self._done(len(items))
        continue
      seconds = time.perf_counter() - t0
      self._recent.append(seconds)
      self.batches += 1
      for it, res in zip(items, results):
        it.future.set_result(Scored(res, it.tokens, len(items)))
      self._done(len(items))
      if self._on_batch is not None:
        try:
          self._on_batch(len(items), sum(it.tokens for it in items), seconds)
        except Exception:  # pylint: disable=broad-except  (metrics must not stop the engine)
          log.exception("on_batch callback failed")

