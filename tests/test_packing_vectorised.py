"""The vectorised packer and the tokenise-once planner equal the loop-based packer, bit for bit.

`logrerank_jax.data.packing.pack_queries` (NumPy over token ids tokenised once) against the packer
it replaced, kept in tests/packing_reference.py: every array of the `PackedBatch` (values, dtype,
shape) and the whole `PackInfo` must be equal, on real pools (ScholarQABench pools with their
sentences split as the engine splits them) under the engine's settings and under settings that
force windows, truncation, query cuts and several sequences per row, with WordPiece and
byte-level BPE tokenizers, for both encodings of the model ("w/o contextual encoding" too), and
on random batches. Then the engine's planner: the local calls it packs from one tokeniser pass
equal the reference packer run on the same calls.
"""

import dataclasses

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from conftest import DATA_DIR
from packing_reference import reference_pack_queries
from logrerank_jax.data import packing
from logrerank_jax.data.inference_input import parse_inference_record
from logrerank_jax.data.packing import PackingConfig, QueryInput, pack_for_model, pack_queries
from logrerank_jax.datasets.pools import build_eval_pools
from logrerank_jax.datasets.scholarqabench import read_scholarqabench
from logrerank_jax.data.encoding import encode_texts
from logrerank_jax.datasets.wordpiece import train_wordpiece_tokenizer
from logrerank_jax.errors import ConfigError

FIELDS = [f.name for f in dataclasses.fields(packing.PackedBatch)]


@pytest.fixture(scope="module")
def pools():
  """Real BM25 pools over both ScholarQABench slices (11-12 passages each)."""
  out = []
  for name in ("scifact_slice", "pubmed_slice"):
    out += build_eval_pools(read_scholarqabench(str(DATA_DIR / f"{name}.jsonl")), pool_size=12)[0]
  return out


@pytest.fixture(scope="module")
def records(pools):
  return [parse_inference_record(p, f"pool {i}") for i, p in enumerate(pools)]


@pytest.fixture(scope="module")
def queries(records):
  return [QueryInput(r.query, r.sentence_texts) for r in records]


@pytest.fixture(scope="module")
def tokenizers(pools):
  """WordPiece (the test tokenizers) and byte-level BPE (ModernBERT's kind), trained on the pools."""
  from test_bpe_tokenizer import build_bpe_tokenizer  # pylint: disable=g-import-not-at-top
  texts = [p["input"] for p in pools] + [c["text"] for p in pools for c in p["ctxs"]]
  return {"wordpiece": train_wordpiece_tokenizer(texts, 2000), "bpe": build_bpe_tokenizer(texts)}


def assert_same(got, want):
  """Equal PackedBatch arrays (values, dtype, shape) and equal PackInfo."""
  (b, i), (rb, ri) = got, want
  for f in FIELDS:
    x, y = getattr(b, f), getattr(rb, f)
    if isinstance(y, np.ndarray):
      assert x.dtype == y.dtype and x.shape == y.shape, f
      np.testing.assert_array_equal(x, y, err_msg=f)
    else:
      assert x == y, f
  assert i == ri


CONFIGS = {
    # The engine's settings (1,024-token rows, its row buckets, 128-token query cut), grown so
    # that all pools fit one batch under the small BPE vocabulary too.
    "engine": PackingConfig(row_len=1024, max_query_tokens=128,
                            row_buckets=packing.grown_buckets(packing.INFERENCE_ROW_BUCKETS, 1024),
                            query_buckets=(64,)),
    # Short rows: passages cut into windows, long sentences truncated, queries cut.
    "windows": PackingConfig(row_len=96, max_query_tokens=16, row_buckets=(64, 256, 1024, 4096),
                             span_buckets=(4096, 16384), query_buckets=(64,)),
    "no_space": PackingConfig(row_len=160, max_query_tokens=24, space_between_sentences=False,
                              row_buckets=(64, 256, 1024, 4096), span_buckets=(4096, 16384),
                              query_buckets=(64,)),
}


@pytest.mark.parametrize("tok_name", ["wordpiece", "bpe"])
def test_real_pools_equal_reference(tokenizers, queries, tok_name):
  tok = tokenizers[tok_name]
  truncated = windows = 0
  for name, cfg in CONFIGS.items():
    got = pack_queries(queries, tok, cfg)
    assert_same(got, reference_pack_queries(queries, tok, cfg))
    truncated += len(got[1].truncated)
    windows += sum(p.num_windows > 1 for ps in got[1].passages for p in ps)
    # One query at a time and a few at a time (the shapes of single-query calls).
    for group in (queries[:1], queries[3:6]):
      assert_same(pack_queries(group, tok, cfg), reference_pack_queries(group, tok, cfg))
  # The short-row config did reach the paths it is there for.
  assert truncated > 0 and windows > 0


@pytest.mark.parametrize("tok_name", ["wordpiece", "bpe"])
def test_without_contextual_encoding_equals_reference(tokenizers, queries, tok_name):
  """pack_for_model's one-sentence sequences: the reference is pack_queries on the exploded
  queries with node indices mapped back (the layout pack_for_model documents)."""
  tok = tokenizers[tok_name]
  cfg = dataclasses.replace(CONFIGS["engine"], span_buckets=(8192,), node_buckets=(1024,))
  group = queries[:6]
  exploded = [QueryInput(q.query, [[s] for p in q.passages for s in p]) for q in group]
  rb, ri = reference_pack_queries(exploded, tok, cfg)
  node_passage, node_sentence = np.array(rb.node_passage), np.array(rb.node_sentence)
  for qi, q in enumerate(group):
    real = [(pi, si) for pi, p in enumerate(q.passages) for si in range(len(p))]
    node_passage[qi, :len(real)] = [p for p, _ in real]
    node_sentence[qi, :len(real)] = [s for _, s in real]
  want = dataclasses.replace(rb, node_passage=node_passage, node_sentence=node_sentence)
  assert_same(pack_for_model(group, tok, cfg, contextual_encoding=False), (want, ri))


def test_edge_cases_equal_reference(tokenizers):
  tok = tokenizers["wordpiece"]
  long_sentence = " ".join(["tumour volume was measured"] * 40) + "."
  cases = [
      [],
      [QueryInput("no passages", [])],
      [QueryInput("one empty passage", [[], ["Only sentence."]])],
      [QueryInput(" ".join(["genome"] * 40), [["A result.", "", "Another one."], [""]])],
      [QueryInput("windows", [["Short one."] * 3 + [long_sentence] + ["Tail."] * 5]),
       QueryInput("second", [["Fine."], [], ["x"] * 12])],
  ]
  cfg = PackingConfig(row_len=64, max_query_tokens=8, row_buckets=(1, 2, 4, 8, 16))
  for qs in cases:
    assert_same(pack_queries(qs, tok, cfg), reference_pack_queries(qs, tok, cfg))
  # Overflowing buckets fail alike, naming the same bucket.
  for kwargs, match in ((dict(row_buckets=(1,)), "row_buckets"), (dict(node_buckets=(2,)), "node_buckets"),
                        (dict(span_buckets=(4,)), "span_buckets"), (dict(query_buckets=(1,)), "query_buckets")):
    small = dataclasses.replace(cfg, **kwargs)
    for fn in (pack_queries, reference_pack_queries):
      with pytest.raises(ConfigError, match=match):
        fn(cases[-1], tok, small)


_WORDS = ["cells", "tumour", "the", "was", "protein", "p", "0", "05", "increase", "mice", "rna", ""]


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
    st.lists(st.lists(st.lists(st.lists(st.sampled_from(_WORDS), min_size=0, max_size=40),
                               min_size=0, max_size=6), min_size=0, max_size=5),
             min_size=0, max_size=4),
    st.sampled_from([24, 40, 80]), st.sampled_from([2, 4, 8]))
def test_random_batches_equal_reference(tokenizers, spec, row_len, max_q):
  tok = tokenizers["wordpiece"]
  queries = [QueryInput(f"query {i} rna " * (1 + i * 3), [[" ".join(w) for w in p] for p in ps])
             for i, ps in enumerate(spec)]
  cfg = PackingConfig(row_len=row_len, max_query_tokens=max_q,
                      row_buckets=tuple(2 ** k for k in range(10)))
  assert_same(pack_queries(queries, tok, cfg), reference_pack_queries(queries, tok, cfg))


def test_encode_texts_equals_the_transformers_call(tokenizers, queries):
  texts = [q.query for q in queries] + [s for q in queries for p in q.passages for s in p]
  texts += ["", "[CLS] a [SEP] literal", " leading space"]
  for tok in tokenizers.values():
    flat, lengths = encode_texts(tok, texts)
    want = tok(texts, add_special_tokens=False)["input_ids"]
    assert lengths.tolist() == [len(x) for x in want]
    assert flat.dtype == np.int32 and flat.tolist() == [t for x in want for t in x]


def test_planner_calls_equal_reference_packing(tokenizers, records):
  """The engine's local calls (one tokeniser pass per chunk, `Planner.local_jobs`) are the
  reference packer's output on the same slots, array for array, with the engine's padding; for
  both encodings of the model."""
  from logrerank_jax.models import log_reranker as lr  # pylint: disable=g-import-not-at-top
  from logrerank_jax.engine.planner import (Planner, default_packing_config,  # pylint: disable=g-import-not-at-top
                                             pad_local)
  tok = tokenizers["wordpiece"]
  for contextual in (True, False):
    cfg = dataclasses.replace(lr.LoGConfig.tiny(len(tok)), contextual_encoding=contextual)
    # Short rows and few row buckets: several calls, queries spread over slots and calls,
    # passages cut into windows, calls split in halves, on 12-passage pools.
    planner = Planner(cfg, tok, default_packing_config(cfg, row_len=256, row_buckets=(1, 2, 4, 8)),
                      queries_per_batch=4, local_slots=16)
    jobs = planner.local_jobs(records)
    assert len(jobs) > 2
    assert sum(len(slots) for _, (slots, _, _) in jobs) > len(records)  # queries spread
    for arrays, (slots, same, info) in jobs:
      assert same is arrays
      qs = [QueryInput(records[ri].query, [records[ri].sentence_texts[pi] for pi in pis])
            for ri, pis in slots]
      if contextual:
        ref, ref_info = reference_pack_queries(qs, tok, planner.local_packing)
      else:  # the reference of pack_for_model's layout, as in the test above
        ref, ref_info = reference_pack_queries(
            [QueryInput(q.query, [[s] for p in q.passages for s in p]) for q in qs], tok,
            planner.local_packing)
        node_passage, node_sentence = np.array(ref.node_passage), np.array(ref.node_sentence)
        for qi, q in enumerate(qs):
          real = [(pi, si) for pi, p in enumerate(q.passages) for si in range(len(p))]
          node_passage[qi, :len(real)] = [p for p, _ in real]
          node_sentence[qi, :len(real)] = [s for _, s in real]
        ref = dataclasses.replace(ref, node_passage=node_passage, node_sentence=node_sentence)
      assert info == ref_info
      spans = int(np.flatnonzero(ref.span_kind).max(initial=0)) + 1
      shape = planner.local_shape(ref_info.num_rows_used, spans, int(ref.node_mask.sum(1).max()))
      want = pad_local(ref, *shape, planner.pad_id)
      assert sorted(arrays) == sorted(want)
      for key, v in want.items():
        assert arrays[key].dtype == v.dtype and arrays[key].shape == v.shape, key
        np.testing.assert_array_equal(arrays[key], v, err_msg=key)
