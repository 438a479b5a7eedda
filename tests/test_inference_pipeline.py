"""Issue 16 (host pipeline): Grain worker threads prepare the next chunks of records while the
devices run the current one. Same jobs, same order, so outputs equal the serial engine's
bit for bit; a chunk whose host work fails is retried record by record, as serially."""

import json

import pytest

from logrerank_jax import engine as inference
from logrerank_jax.errors import ConfigError, DataError

from test_inference import check_output, make_pools, make_tiny_model


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  pools = make_pools(pool_size=6, limit=5)[0]
  model = make_tiny_model(tmp_path_factory.mktemp("pipe") / "model", pools)
  # 10 records (real SciFact pools and cut variants), in chunks of 2: five chunks, so the
  # workers really run ahead of the consumer.
  records = pools + [dict(p, id=f"{p['id']}-cut", ctxs=p["ctxs"][:2 + i % 3])
                     for i, p in enumerate(pools)]
  return model, records


def _reranker(model, workers, chunk=2):
  rr = inference.Reranker.from_pretrained(model, row_len=256, row_buckets=(4, 8, 16),
                                          queries_per_batch=2, host_workers=workers)
  rr.chunk_records = chunk  # several chunks from a few records
  return rr


def test_pipelined_outputs_equal_serial(setup):
  model, records = setup
  serial = _reranker(model, 0).rerank_records(records)
  for workers in (1, 3):
    rr = _reranker(model, workers)
    piped = rr.rerank_records(records)
    # Bit-identical: the same host jobs run through the same executables.
    assert json.dumps(piped, sort_keys=True) == json.dumps(serial, sort_keys=True), workers
    assert [o["id"] for o in piped] == [str(r["id"]) for r in records]  # input order, once
    assert rr.stats()["local_calls"] > 5
  for out, rec in zip(serial, records):
    check_output(out, rec)


def test_second_reranker_of_a_model_compiles_nothing(setup):
  """Engines of one config on one device set share their jitted stages (`engine.stage_jits`):
  a model loaded again runs the first one's executables, with the same outputs; other shapes
  still compile."""
  model, records = setup
  first = _reranker(model, 0)
  want = first.rerank_records(records)
  assert first.compile_stats()["jit_cache_entries"] >= 2  # local and global shapes
  again = _reranker(model, 0)
  assert json.dumps(again.rerank_records(records), sort_keys=True) == json.dumps(want,
                                                                                 sort_keys=True)
  stats = again.compile_stats()
  assert stats["xla_compilations"] == 0, stats
  assert stats["jit_cache_entries"] == first.compile_stats()["jit_cache_entries"]
  # A row bucket no engine of this model used before: compiled, and counted.
  other = inference.Reranker.from_pretrained(model, row_len=256, row_buckets=(6,),
                                             queries_per_batch=2, host_workers=0)
  other.rerank_records(records[:1])
  assert other.compile_stats()["xla_compilations"] >= 1


def _failing_on(rr, bad):
  """Make `rr`'s host work fail for any chunk holding record `bad` (a worker-side error)."""
  real = rr.planner.local_jobs

  def failing(recs, tokenizer=None):
    if any(r.record_id == bad for r in recs):
      raise DataError(f"record {bad}: planted host failure")
    return real(recs, tokenizer)
  return failing


def test_worker_failure_is_retried_per_record(setup, monkeypatch):
  model, records = setup
  bad = str(records[3]["id"])
  runs = {}
  for workers in (0, 2):
    rr = _reranker(model, workers)
    monkeypatch.setattr(rr.planner, "local_jobs", _failing_on(rr, bad))
    runs[workers] = rr.rerank_records(records)
  outs = runs[2]
  assert [o["id"] for o in outs] == [str(r["id"]) for r in records]
  assert "planted host failure" in outs[3]["error"]
  assert sum(o["error"] is not None for o in outs) == 1
  # Its chunk-mate (record 2) is rescored alone, as on the serial path: identical to it.
  assert json.dumps(outs, sort_keys=True) == json.dumps(runs[0], sort_keys=True)
  # Records of the other chunks are untouched by the failure.
  clean = _reranker(model, 2).rerank_records(records)
  # (Record 2 alone may differ from its batched self in the last float bits: another shape.)
  assert all(outs[i] == clean[i] for i in range(len(records)) if i not in (2, 3))


@pytest.mark.parametrize("value", [-1, 1.5, True, "2"], ids=["negative", "float", "bool", "str"])
def test_bad_host_workers_is_a_config_error(setup, value):
  with pytest.raises(ConfigError, match="host_workers"):
    inference.Reranker.from_pretrained(setup[0], host_workers=value)
