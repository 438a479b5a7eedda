"""Packing of (query, passage) sequences into bucketed rows (contract C5), on real text."""

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from logrerank_jax.data import packing
from logrerank_jax.data.packing import PackingConfig, QueryInput, pack_queries
from logrerank_jax.data.sentences import split_sentence_texts
from logrerank_jax.datasets.wordpiece import train_wordpiece_tokenizer
from logrerank_jax.errors import ConfigError, DataError


def _texts(record):
  """Return the gold passage texts of a ScholarQABench record as strings."""
  out = []
  for c in record["gold_ctx"]:
    t = c["text"]
    out.append("\n".join(t["contexts"]) if isinstance(t, dict) else t)
  return out


@pytest.fixture(scope="module")
def tokenizer(scifact_records, pubmed_records):
  """A small WordPiece tokenizer trained on the real slices."""
  texts = [t for r in scifact_records + pubmed_records for t in _texts(r)]
  texts += [r["input"] for r in scifact_records + pubmed_records]
  # Large enough that common words are whole tokens (the vocabulary keeps every character first).
  return train_wordpiece_tokenizer(texts, vocab_size=2000)


@pytest.fixture(scope="module")
def real_queries(scifact_records, pubmed_records):
  """Queries with 1-4 passages each (own gold plus other queries' gold), sentences split."""
  records = scifact_records[:4] + pubmed_records[:4]
  passages = [split_sentence_texts(t) for r in records for t in _texts(r)]
  out = []
  for i, r in enumerate(records):
    k = 1 + i % 4
    out.append(QueryInput(r["input"], [passages[(i + j) % len(passages)] for j in range(k)]))
  return out


def _sentence_ids(tokenizer, passage):
  """Token ids of each sentence as the packer tokenises them (leading space after the first)."""
  texts = [s if j == 0 else " " + s for j, s in enumerate(passage)]
  return [list(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []


def _check_invariants(batch, info, queries, tokenizer, cfg):
  """Assert every structural promise of contract C5; return per-node span tokens."""
  r_, l_ = batch.input_ids.shape
  assert l_ == cfg.row_len and r_ in cfg.row_buckets
  assert batch.span_kind.shape[0] in cfg.span_buckets
  assert batch.Q in cfg.query_buckets and batch.N in cfg.node_buckets
  for name in ("input_ids", "attention_mask", "segment_ids", "position_ids", "span_ids"):
    assert getattr(batch, name).dtype == np.int32 and getattr(batch, name).shape == (r_, l_)
  # Padding is exactly where segment_ids == 0; pad tokens are [PAD] and never pooled.
  np.testing.assert_array_equal(batch.attention_mask, (batch.segment_ids > 0).astype(np.int32))
  assert np.all(batch.input_ids[batch.segment_ids == 0] == tokenizer.pad_token_id)
  assert np.all(batch.span_ids[batch.segment_ids == 0] == 0)
  # Segments: contiguous, numbered 1.. in each row, positions restart at 0, [CLS] q [SEP] ... [SEP].
  seg_query_span = {}
  for r in range(r_):
    segs = batch.segment_ids[r]
    present = [s for s in np.unique(segs) if s > 0]
    assert present == list(range(1, len(present) + 1))
    for s in present:
      idx = np.nonzero(segs == s)[0]
      assert idx[-1] - idx[0] + 1 == len(idx), "segment not contiguous"
      np.testing.assert_array_equal(batch.position_ids[r, idx], np.arange(len(idx)))
      ids, sp = batch.input_ids[r, idx], batch.span_ids[r, idx]
      assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
      assert sp[0] == 0 and sp[-1] == 0
      q_span = sp[1]
      assert batch.span_kind[q_span] == packing.SPAN_QUERY
      q_len = int(np.sum(sp == q_span))
      assert ids[1 + q_len] == tokenizer.sep_token_id and sp[1 + q_len] == 0
      # Every other pooled token of the segment is a sentence span whose query span is this one.
      for t in sp[2 + q_len:-1]:
        assert batch.span_kind[t] == packing.SPAN_SENTENCE and batch.span_query[t] == q_span
      seg_query_span[(r, s)] = q_span
  # Span ids are unique within the batch: each span lives in exactly one (row, segment).
  where = {}
  for (r, s), _ in seg_query_span.items():
    for t in np.unique(batch.span_ids[r][batch.segment_ids[r] == s]):
      if t:
        assert t not in where, f"span {t} in two segments"
        where[t] = (r, s)
  used = sorted(where)
  assert used == list(range(1, len(used) + 1))
  assert np.all(batch.span_kind[len(used) + 1:] == packing.SPAN_NONE)
  assert np.all(batch.span_node[batch.span_kind != packing.SPAN_SENTENCE] == -1)
  # Graph layout: node n of query q = n-th sentence in passage order; one span per node.
  node_tokens = {}
  for qi, q in enumerate(queries):
    expect = [(p, s) for p, sents in enumerate(q.passages) for s in range(len(sents))]
    n_q = len(expect)
    got = list(zip(batch.node_passage[qi, :n_q].tolist(), batch.node_sentence[qi, :n_q].tolist()))
    assert got == expect
    assert not batch.node_mask[qi, n_q:].any() and batch.node_mask[qi, :n_q].all()
    assert np.all(batch.node_passage[qi, n_q:] == -1)
    for n in range(n_q):
      spans = np.nonzero(batch.span_node == qi * batch.N + n)[0]
      assert len(spans) == 1, f"query {qi} node {n} has {len(spans)} spans"
      assert batch.node_span[qi, n] == spans[0]
      r, s = where[spans[0]]
      node_tokens[(qi, n)] = batch.input_ids[r][batch.span_ids[r] == spans[0]].tolist()
  assert np.all(batch.node_mask[len(queries):] == False)  # noqa: E712
  assert int(batch.attention_mask.sum()) == info.real_tokens
  assert info.computed_tokens == r_ * l_
  assert info.padding_efficiency == pytest.approx(info.real_tokens / (r_ * l_))
  return node_tokens


@pytest.mark.parametrize("row_len,max_q", [(1024, 64), (160, 24), (96, 16)],
                         ids=["row1024", "row160_windows", "row96_truncation"])
def test_real_text_every_sentence_in_one_span(tokenizer, real_queries, row_len, max_q):
  cfg = PackingConfig(row_len=row_len, max_query_tokens=max_q, row_buckets=(8, 64, 256))
  batch, info = pack_queries(real_queries, tokenizer, cfg)
  node_tokens = _check_invariants(batch, info, real_queries, tokenizer, cfg)
  truncated = set(info.truncated)
  for qi, q in enumerate(real_queries):
    n = 0
    for p, sents in enumerate(q.passages):
      full = _sentence_ids(tokenizer, sents)
      for s, ids in enumerate(full):
        got = node_tokens[(qi, n)]
        if (qi, p, s) in truncated:
          assert len(ids) > len(got) and got == ids[:len(got)]
        else:
          assert got == ids, f"query {qi} passage {p} sentence {s}"
        n += 1
  print(f"row_len={row_len}: rows {info.num_rows_used}->{batch.input_ids.shape[0]}, "
        f"efficiency {info.padding_efficiency:.3f} (rows used {info.row_efficiency:.3f}), "
        f"truncated {len(truncated)}")


def test_sentence_tokens_concatenate_to_the_passage(tokenizer, real_queries):
  """Sentence-wise tokenisation equals tokenising the space-joined passage (WordPiece)."""
  batch, info = pack_queries(real_queries, tokenizer, PackingConfig(row_len=2048, max_query_tokens=64))
  node_tokens = _check_invariants(batch, info, real_queries, tokenizer,
                                  PackingConfig(row_len=2048, max_query_tokens=64))
  for qi, q in enumerate(real_queries):
    n = 0
    for sents in q.passages:
      concat = sum((node_tokens[(qi, n + j)] for j in range(len(sents))), [])
      n += len(sents)
      assert concat == tokenizer(" ".join(sents), add_special_tokens=False)["input_ids"]
  assert all(p.num_windows == 1 for ps in info.passages for p in ps)


def test_windows_repeat_query_and_flag_truncation(tokenizer):
  words = "the cells were treated with drug and the tumour volume was measured".split()
  long_sentence = " ".join(words * 12) + "."  # far longer than a 64-token window
  sents = [" ".join(words[:k + 3]) + "." for k in range(8)]
  passage = sents[:4] + [long_sentence] + sents[4:]
  query = "does the drug reduce tumour volume?"
  cfg = PackingConfig(row_len=64, max_query_tokens=24, row_buckets=(4, 8, 16))
  batch, info = pack_queries([QueryInput(query, [passage])], tokenizer, cfg)
  _check_invariants(batch, info, [QueryInput(query, [passage])], tokenizer, cfg)
  pinfo = info.passages[0][0]
  assert pinfo.truncated_sentences == (4,)
  assert info.truncated == [(0, 0, 4)]
  assert pinfo.num_windows == info.num_sequences >= 3
  q_ids = tokenizer(query, add_special_tokens=False)["input_ids"]
  assert len(q_ids) <= 24 and not info.query_truncated[0]
  expected_prefix = [tokenizer.cls_token_id] + q_ids + [tokenizer.sep_token_id]
  n_seg = 0
  for r in range(batch.input_ids.shape[0]):
    for s in range(1, batch.segment_ids[r].max() + 1):
      ids = batch.input_ids[r][batch.segment_ids[r] == s].tolist()
      assert ids[:len(expected_prefix)] == expected_prefix
      assert len(ids) <= 64
      n_seg += 1
  assert n_seg == pinfo.num_windows
  # The truncated sentence fills its window exactly: 64 - |q| - 3 tokens.
  span = batch.node_span[0, 4]
  assert int(np.sum(batch.span_ids == span)) == 64 - len(q_ids) - 3


def test_query_truncation_and_empty_sentence_flagged(tokenizer):
  query = " ".join(["genome"] * 40)
  cfg = PackingConfig(row_len=128, max_query_tokens=8)
  batch, info = pack_queries([QueryInput(query, [["A result.", "", "Another one."]])], tokenizer, cfg)
  _check_invariants(batch, info, [QueryInput(query, [["A result.", "", "Another one."]])], tokenizer, cfg)
  assert info.query_truncated == (True,)
  assert int(np.sum(batch.span_kind == packing.SPAN_QUERY)) == 1
  assert int(np.sum(batch.span_ids == 1)) == 8
  assert info.passages[0][0].empty_sentences == (1,)
  # The empty sentence is one [UNK] token, not a missing node.
  assert batch.input_ids[batch.span_ids == batch.node_span[0, 1]].tolist() == [tokenizer.unk_token_id]


def test_first_fit_packs_several_sequences_per_row(tokenizer):
  queries = [QueryInput("short query", [["One sentence."], ["Two words."], ["Three is here."]]),
             QueryInput("another", [["Fine."]])]
  cfg = PackingConfig(row_len=64, max_query_tokens=8, row_buckets=(1, 2), node_buckets=(4,))
  batch, info = pack_queries(queries, tokenizer, cfg)
  _check_invariants(batch, info, queries, tokenizer, cfg)
  assert info.num_sequences == 4 and info.num_rows_used == 1
  assert batch.input_ids.shape == (1, 64) and batch.segment_ids.max() == 4
  assert batch.Q == 2 and batch.N == 4
  assert batch.span_node[batch.node_span[1, 0]] == 1 * 4 + 0


def test_deterministic(tokenizer, real_queries):
  cfg = PackingConfig(row_len=160, max_query_tokens=24)
  a, ia = pack_queries(real_queries, tokenizer, cfg)
  b, ib = pack_queries(list(real_queries), tokenizer, cfg)
  for f in ("input_ids", "segment_ids", "position_ids", "span_ids", "span_kind", "span_query",
            "span_node", "node_passage", "node_sentence", "node_span"):
    np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
  assert ia == ib


@pytest.mark.parametrize("n_queries,expect_q", [(1, 1), (3, 4), (5, 8)], ids=["q1", "q3", "q5"])
def test_buckets_respected(tokenizer, n_queries, expect_q):
  queries = [QueryInput(f"query {i}", [["A sentence here."] * (i + 1)]) for i in range(n_queries)]
  cfg = PackingConfig(row_len=64, max_query_tokens=8, row_buckets=(2, 4), span_buckets=(16, 32),
                      node_buckets=(2, 8), query_buckets=(1, 4, 8))
  batch, info = pack_queries(queries, tokenizer, cfg)
  _check_invariants(batch, info, queries, tokenizer, cfg)
  assert batch.Q == expect_q
  assert batch.N == (2 if n_queries <= 2 else 8)


def test_bucket_overflow_is_a_config_error(tokenizer):
  queries = [QueryInput("q", [["A sentence."]] * 10)]
  with pytest.raises(ConfigError, match="row_buckets"):
    pack_queries(queries, tokenizer, PackingConfig(row_len=16, max_query_tokens=4, row_buckets=(1, 2)))


@pytest.mark.parametrize("bad,match", [
    ("not a list", "list of QueryInput"),
    ([("q", [["s"]])], "query 0: expected QueryInput"),
    ([QueryInput("  ", [["s"]])], "query 0: query text"),
    ([QueryInput("q", ["a passage string"])], "query 0 passage 0"),
    ([QueryInput("q", [["ok", 3]])], "query 0 passage 0 sentence 1"),
], ids=["not_list", "tuple_query", "blank_query", "passage_not_list", "sentence_not_str"])
def test_bad_input_raises_data_error(tokenizer, bad, match):
  with pytest.raises(DataError, match=match):
    pack_queries(bad, tokenizer, PackingConfig(row_len=64, max_query_tokens=8))


@pytest.mark.parametrize("kwargs", [dict(row_len=10, max_query_tokens=8), dict(row_buckets=(4, 2)),
                                    dict(node_buckets=()), dict(max_query_tokens=0)],
                         ids=["row_too_short", "unsorted_buckets", "empty_buckets", "zero_query"])
def test_bad_config(kwargs):
  with pytest.raises(ConfigError):
    PackingConfig(**kwargs)


_WORDS = ["cells", "tumour", "the", "was", "protein", "p", "0", "05", "increase", "mice", "rna", "and"]


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(
    st.lists(st.lists(st.lists(st.lists(st.sampled_from(_WORDS), min_size=0, max_size=30),
                               min_size=0, max_size=5), min_size=0, max_size=4),
             min_size=1, max_size=3),
    st.sampled_from([24, 40, 80]))
def test_random_batches_keep_every_sentence(tokenizer, spec, row_len):
  queries = [QueryInput(f"query {i} rna", [[" ".join(w) + "." for w in p] for p in ps])
             for i, ps in enumerate(spec)]
  cfg = PackingConfig(row_len=row_len, max_query_tokens=4)
  batch, info = pack_queries(queries, tokenizer, cfg)
  node_tokens = _check_invariants(batch, info, queries, tokenizer, cfg)
  for qi, q in enumerate(queries):
    n = 0
    for p, sents in enumerate(q.passages):
      for s, ids in enumerate(_sentence_ids(tokenizer, sents)):
        got = node_tokens[(qi, n)]
        assert got == ids if (qi, p, s) not in info.truncated else got == ids[:len(got)]
        n += 1


def test_query_without_passages_and_passage_without_sentences(tokenizer):
  queries = [QueryInput("no passages", []), QueryInput("one empty passage", [[], ["Only sentence."]])]
  cfg = PackingConfig(row_len=64, max_query_tokens=8)
  batch, info = pack_queries(queries, tokenizer, cfg)
  _check_invariants(batch, info, queries, tokenizer, cfg)
  assert not batch.node_mask[0].any()
  assert batch.node_mask[1].tolist()[:2] == [True, False]
  assert batch.node_passage[1, 0] == 1 and batch.node_sentence[1, 0] == 0
  assert [p.num_windows for p in info.passages[1]] == [0, 1] and info.passages[0] == ()
  assert info.num_sequences == 1


def test_inference_row_buckets_are_a_fine_geometric_ladder():
  from logrerank_jax.data.packing import INFERENCE_ROW_BUCKETS, geometric_buckets
  assert INFERENCE_ROW_BUCKETS == geometric_buckets(128) == (
      1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 15, 17, 20, 23, 26, 30, 34, 39, 44, 50, 57, 65, 74, 84,
      95, 107, 121, 128)
  # A call is padded by less than 1/8 of its rows above 8 rows, by nothing below.
  for a, b in zip(INFERENCE_ROW_BUCKETS, INFERENCE_ROW_BUCKETS[1:]):
    assert b - a <= max(1, -(-a // 8))
  assert geometric_buckets(5) == (1, 2, 3, 4, 5) and geometric_buckets(10, ratio=2.0) == tuple(range(1, 9)) + (10,)
