"""The dynamic batcher alone (`serving.batcher`), driven by a scripted stand-in for the engine:
what goes into a batch (token budget, window, a request larger than the budget), the bounded
queue, cancelled requests, per-request errors, an internal fault, and draining on close. The
real engine behind it is tested over HTTP in tests/test_serving.py."""

import dataclasses
import threading
import time

import pytest

from logrerank_jax.errors import DataError
from logrerank_jax.engine.batcher import Batcher, Closed, QueueFull


@dataclasses.dataclass(frozen=True)
class Req:
  name: str
  tokens: int


class ScriptedEngine:
  """Stands in for `Reranker`: counts tokens from the request, records each batch, can be held
  at a gate (so requests pile up), fails one named request, or raises an internal fault."""

  tokenizer = None

  def __init__(self):
    self.batches = []
    self.gate = threading.Event()
    self.gate.set()
    self.started = threading.Event()

  def record_tokens(self, records, tokenizer=None):
    return [r.tokens for r in records]

  def prepare(self, records, tokenizer=None):
    return [r.name for r in records]  # the "jobs": checked against the records below

  def score_chunk(self, records, jobs):
    assert jobs == [r.name for r in records]  # the prepared jobs travel with their batch
    self.started.set()
    self.gate.wait(10)
    self.batches.append([r.name for r in records])
    if any(r.name == "fault" for r in records):
      raise RuntimeError("planted internal fault")
    return [DataError(f"{r.name}: unusable") if r.name.startswith("bad") else f"scores of {r.name}"
            for r in records]


def test_batches_follow_the_token_budget_and_answers_their_own_request():
  eng = ScriptedEngine()
  eng.gate.clear()  # hold the engine so that everything below is queued before any batch
  b = Batcher(eng, max_batch_tokens=100, max_queue=50, window_s=0.05)
  try:
    first = b.submit(Req("warm", 10))
    assert eng.started.wait(5)  # batch 1 (just "warm") is on the engine, held at the gate
    sizes = [40, 40, 30, 150, 20, 60, 50]  # 150: larger than the budget, goes alone
    futs = [b.submit(Req(f"r{i}", n)) for i, n in enumerate(sizes)]
    eng.gate.set()
    results = [f.result(10) for f in [first] + futs]
  finally:
    b.close(10)
  assert [r.scores for r in results] == ["scores of warm"] + [f"scores of r{i}" for i in range(7)]
  assert [r.tokens for r in results] == [10] + sizes
  # In arrival order, a batch closes before the request that would overflow 100 tokens.
  assert eng.batches == [["warm"], ["r0", "r1"], ["r2"], ["r3"], ["r4", "r5"], ["r6"]]
  assert [r.batch_size for r in results[1:]] == [2, 2, 1, 1, 2, 2, 1]


def test_full_queue_refuses_with_retry_after_then_recovers():
  eng = ScriptedEngine()
  eng.gate.clear()
  b = Batcher(eng, max_batch_tokens=10, max_queue=2, window_s=0.0)
  try:
    running = b.submit(Req("a", 10))
    assert eng.started.wait(5)
    # The gather thread prepares one batch ahead ("b"), then waits for the engine to take it;
    # the queue then holds two, and the next request is refused.
    admitted = [b.submit(Req("b", 10))]
    deadline = time.monotonic() + 5
    while b.queue_depth() and time.monotonic() < deadline:  # "b" taken into the next batch
      time.sleep(0.01)
    admitted += [b.submit(Req("c", 10)), b.submit(Req("d", 10))]
    assert b.queue_depth() == 2
    with pytest.raises(QueueFull, match="2 requests waiting") as e:
      b.submit(Req("e", 10))
    assert e.value.retry_after >= 1
    eng.gate.set()
    assert [f.result(10).scores for f in [running] + admitted] == [
        "scores of a", "scores of b", "scores of c", "scores of d"]
    assert b.submit(Req("f", 10)).result(10).scores == "scores of f"  # recovered
  finally:
    b.close(10)


def test_cancelled_request_is_dropped_and_errors_stay_with_their_request():
  eng = ScriptedEngine()
  eng.gate.clear()
  b = Batcher(eng, max_batch_tokens=1000, max_queue=10, window_s=0.05)
  try:
    b.submit(Req("hold", 1))
    assert eng.started.wait(5)
    gone = b.submit(Req("gone", 1))
    assert gone.cancel()  # its client timed out while it waited
    bad, good = b.submit(Req("bad1", 1)), b.submit(Req("ok", 1))
    eng.gate.set()
    assert isinstance(bad.result(10).scores, DataError)
    assert good.result(10).scores == "scores of ok"
  finally:
    b.close(10)
  assert ["gone" not in batch for batch in eng.batches] == [True] * len(eng.batches)
  assert any(batch == ["bad1", "ok"] for batch in eng.batches)


def test_internal_fault_fails_its_batch_only():
  eng = ScriptedEngine()
  b = Batcher(eng, max_batch_tokens=1, max_queue=10, window_s=0.0)
  try:
    with pytest.raises(RuntimeError, match="planted internal fault"):
      b.submit(Req("fault", 1)).result(10)
    assert b.submit(Req("after", 1)).result(10).scores == "scores of after"
  finally:
    b.close(10)


def test_close_scores_every_admitted_request_then_refuses():
  eng = ScriptedEngine()
  eng.gate.clear()
  b = Batcher(eng, max_batch_tokens=1, max_queue=10, window_s=0.0)
  futs = [b.submit(Req(f"q{i}", 1)) for i in range(5)]
  assert eng.started.wait(5)
  closer = threading.Thread(target=b.close, args=(10,))
  closer.start()
  time.sleep(0.05)
  with pytest.raises(Closed):
    b.submit(Req("late", 1))
  eng.gate.set()
  closer.join(10)
  assert not closer.is_alive()
  assert [f.result(0).scores for f in futs] == [f"scores of q{i}" for i in range(5)]
