"""ScholarQABench reader, BM25 and evaluation-pool construction (library and CLI) on the real slices."""

import json
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from logrerank_jax import evaluation
from logrerank_jax.datasets.bm25 import BM25Index, bm25_tokenize
from logrerank_jax.datasets.pools import build_eval_pools
from logrerank_jax.datasets.scholarqabench import read_scholarqabench
from logrerank_jax.errors import ConfigError, DataError

DATA = pathlib.Path(__file__).parent / "data"
ROOT = pathlib.Path(__file__).parent.parent


# ---------------------------------------------------------------- reader

def test_read_scifact_slice(scifact_records):
  recs = read_scholarqabench(str(DATA / "scifact_slice.jsonl"))
  assert len(recs) == len(scifact_records) == 12
  for i, (rec, raw) in enumerate(zip(recs, scifact_records)):
    assert rec["qid"] == str(i) and rec["query"] == raw["input"] and rec["answer"] == raw["answer"]
    assert [p["text"] for p in rec["gold"]] == [c["text"] for c in raw["gold_ctx"]]
    assert all(p["sections"] == [(None, p["text"])] for p in rec["gold"])


def test_read_pubmed_slice_dict_and_string_texts(pubmed_records):
  recs = read_scholarqabench(str(DATA / "pubmed_slice.jsonl"))
  n_dict = 0
  for rec, raw in zip(recs, pubmed_records):
    for p, c in zip(rec["gold"], raw["gold_ctx"]):
      if isinstance(c["text"], dict):
        n_dict += 1
        assert p["text"] == "\n".join(c["text"]["contexts"])
        assert p["sections"] == list(zip(c["text"]["labels"], c["text"]["contexts"]))
      else:
        assert p["sections"] == [(None, c["text"])]
      assert p["title"] == c["title"]
  assert n_dict == 10 and len(recs) == 12


@pytest.mark.parametrize("line,match", [
    ("{not json", "invalid JSON"),
    ('["a list"]', "expected a JSON object"),
    ('{"gold_ctx": [{"title": "", "text": "t"}]}', "'input'"),
    ('{"input": "q", "gold_ctx": []}', "'gold_ctx'"),
    ('{"input": "q", "gold_ctx": [{"title": "", "text": 5}]}', r"gold_ctx\[0\]: text must be"),
    ('{"input": "q", "gold_ctx": [{"title": "", "text": {"contexts": ["a", "b"], "labels": ["X"]}}]}',
     "labels must be a list as long"),
    ('{"input": "q", "answer": 1, "gold_ctx": [{"title": "", "text": "t"}]}', "'answer'"),
], ids=["bad_json", "not_object", "no_input", "empty_gold", "text_int", "labels_mismatch", "answer_int"])
def test_reader_malformed_line_names_file_and_line(tmp_path, line, match):
  path = tmp_path / "bad.jsonl"
  good = '{"input": "q", "answer": "yes", "gold_ctx": [{"title": "", "text": "fine."}]}'
  path.write_text(good + "\n\n" + line + "\n")
  with pytest.raises(DataError, match=f"bad.jsonl:3[: ].*{match}"):
    read_scholarqabench(str(path))


# ---------------------------------------------------------------- BM25

def test_bm25_tokenizer():
  assert bm25_tokenize("IL-6 and TNF-α rose (p<0.05); Über_cells") == [
      "il", "6", "and", "tnf", "α", "rose", "p", "0", "05", "über", "cells"]


def _numpy_bm25(docs, query, k1=1.5, b=0.75):
  """Dense NumPy BM25 with Lucene idf, written independently of the index."""
  toks = [bm25_tokenize(d) for d in docs]
  vocab = sorted({t for d in toks for t in d})
  tf = np.array([[d.count(v) for v in vocab] for d in toks], float)   # [D, V]
  dl = tf.sum(1)
  df = (tf > 0).sum(0)
  idf = np.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
  out = np.zeros(len(docs))
  for t in bm25_tokenize(query):
    if t in vocab:
      j = vocab.index(t)
      out += idf[j] * tf[:, j] * (k1 + 1) / (tf[:, j] + k1 * (1 - b + b * dl / dl.mean()))
  return out


@pytest.mark.parametrize("query", ["genetic variants disease", "rare variants rare", "nothing matches zzz"],
                         ids=["plain", "repeated_term", "no_match"])
def test_bm25_matches_numpy_reference(scifact_records, query):
  docs = [c["text"] for r in scifact_records for c in r["gold_ctx"]]
  got = BM25Index(docs).scores(query)
  # float64 host arithmetic (Python/NumPy, no XLA) on values <= 100: each op rounds to 2.2e-16
  # relative, a few dozen ops stay < 1e-13; the bound is >= 10x that on any CPU.
  np.testing.assert_allclose(got, _numpy_bm25(docs, query), rtol=1e-12, atol=1e-12)


def test_bm25_known_answer_two_docs():
  # D = 2, "cat" in doc 0 only: idf = ln(1 + 1.5 / 1.5) = ln 2; |d0| = 2, avgdl = 1.5.
  s = BM25Index(["cat dog", "dog"]).scores("cat")
  expect = math.log(2) * 2.5 / (1 + 1.5 * (0.25 + 0.75 * 2 / 1.5))
  # float64 host arithmetic (Python/NumPy, no XLA) on values <= 100: each op rounds to 2.2e-16
  # relative, a few dozen ops stay < 1e-13; the bound is >= 10x that on any CPU.
  assert s[0] == pytest.approx(expect, abs=1e-12) and s[1] == 0.0


def test_bm25_ties_exclude_and_short_corpus():
  idx = BM25Index(["alpha beta", "gamma", "alpha beta", "alpha beta", "delta"])
  assert idx.top_k("alpha", 3) == [0, 2, 3]              # identical docs: lower index first
  assert idx.top_k("alpha", 3, exclude=[2]) == [0, 3, 1]  # then zero-score docs by index
  assert idx.top_k("alpha", 10) == [0, 2, 3, 1, 4]
  with pytest.raises(DataError, match="outside the corpus"):
    idx.top_k("alpha", 2, exclude=[7])
  with pytest.raises(DataError, match="at least one document"):
    BM25Index([])


# ---------------------------------------------------------------- pools

@pytest.fixture(scope="module")
def scifact_pools():
  recs = read_scholarqabench(str(DATA / "scifact_slice.jsonl"))
  return recs, build_eval_pools(recs, pool_size=8)


def test_pools_structure(scifact_pools):
  recs, (pools, qrels) = scifact_pools
  all_gold = {p["text"] for r in recs for p in r["gold"]}
  assert [p["id"] for p in pools] == [r["qid"] for r in recs]
  for rec, pool in zip(recs, pools):
    ctxs = pool["ctxs"]
    assert pool["input"] == rec["query"] and len(ctxs) == 8
    assert len({c["id"] for c in ctxs}) == 8
    gold_texts = {p["text"] for p in rec["gold"]}
    assert {c["text"] for c in ctxs if c["label"] == 1} == gold_texts
    assert qrels[rec["qid"]] == {c["id"] for c in ctxs if c["label"] == 1}
    for c in ctxs:
      assert c["text"] in all_gold                     # negatives are other queries' gold contexts
      if c["label"] == 0:
        assert c["text"] not in gold_texts
    # Order: decreasing BM25, ties by ascending passage index.
    keys = [(-c["bm25"], int(c["id"][1:])) for c in ctxs]
    assert keys == sorted(keys)


def test_pools_negatives_are_the_bm25_top(scifact_pools):
  recs, (pools, _) = scifact_pools
  corpus = []
  for r in recs:
    for p in r["gold"]:
      if (p["title"], p["text"]) not in [(c["title"], c["text"]) for c in corpus]:
        corpus.append(p)
  ref = [_numpy_bm25([f"{p['title']} {p['text']}".strip() for p in corpus], r["query"]) for r in recs]
  for rec, pool, s in zip(recs, pools, ref):
    gold = {int(c["id"][1:]) for c in pool["ctxs"] if c["label"]}
    negs = {int(c["id"][1:]) for c in pool["ctxs"] if not c["label"]}
    order = [i for i in np.lexsort((np.arange(len(s)), -s)) if i not in gold]
    assert negs == set(order[:8 - len(gold)])
    for c in pool["ctxs"]:
      # float64 host arithmetic (Python/NumPy, no XLA) on values <= 100: each op rounds to 2.2e-16
      # relative, a few dozen ops stay < 1e-13; the bound is >= 10x that on any CPU.
      assert c["bm25"] == pytest.approx(s[int(c["id"][1:])], abs=1e-12)


def test_pools_deterministic_and_limit(scifact_pools):
  recs, (pools, qrels) = scifact_pools
  again, again_q = build_eval_pools(read_scholarqabench(str(DATA / "scifact_slice.jsonl")), pool_size=8)
  assert again == pools and again_q == qrels
  limited, lq = build_eval_pools(recs, pool_size=8, limit=3)
  assert limited == pools[:3] and set(lq) == {"0", "1", "2"}


def test_pools_dedup_shared_gold_and_gold_not_forced_first():
  recs = [
      {"qid": "0", "query": "zinc deficiency", "answer": None,
       "gold": [{"title": "", "text": "Zinc levels in plants.", "sections": []}]},
      {"qid": "1", "query": "zinc deficiency in children", "answer": None,
       "gold": [{"title": "", "text": "Zinc deficiency and zinc supplements in children.", "sections": []}]},
      {"qid": "2", "query": "zinc levels", "answer": None,  # shares query 0's abstract
       "gold": [{"title": "", "text": "Zinc levels in plants.", "sections": []}]},
  ]
  pools, qrels = build_eval_pools(recs, pool_size=5)
  assert qrels == {"0": {"p0"}, "1": {"p1"}, "2": {"p0"}}
  assert [c["id"] for c in pools[0]["ctxs"]] == ["p1", "p0"]   # the negative outranks the gold
  assert [c["label"] for c in pools[0]["ctxs"]] == [0, 1]
  assert all(c["label"] == 1 for c in pools[2]["ctxs"] if c["id"] == "p0")


@pytest.mark.parametrize("kwargs", [dict(pool_size=0), dict(limit=-1)], ids=["pool0", "limit_neg"])
def test_pools_bad_config(scifact_pools, kwargs):
  with pytest.raises(ConfigError):
    build_eval_pools(scifact_pools[0], **kwargs)


# ---------------------------------------------------------------- CLI

@pytest.mark.parametrize("slice_name,pool_size,limit", [("scifact_slice", 6, None), ("pubmed_slice", 5, 4)],
                         ids=["scifact", "pubmed_limit"])
def test_cli(tmp_path, slice_name, pool_size, limit):
  out, qrels_path = tmp_path / "pools.jsonl", tmp_path / "qrels.txt"
  cmd = [sys.executable, str(ROOT / "tools" / "prepare_data.py"), "--input", str(DATA / f"{slice_name}.jsonl"),
         "--output", str(out), "--qrels", str(qrels_path), "--pool-size", str(pool_size)]
  if limit is not None:
    cmd += ["--limit", str(limit)]
  res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
  assert res.returncode == 0, res.stderr
  pools = [json.loads(line) for line in out.read_text().splitlines()]
  assert len(pools) == (limit or 12)
  assert all(len(p["ctxs"]) == pool_size for p in pools)
  qrels = evaluation.read_qrels(str(qrels_path))
  assert qrels == {p["id"]: {c["id"] for c in p["ctxs"] if c["label"]} for p in pools}
  expected, _ = build_eval_pools(read_scholarqabench(str(DATA / f"{slice_name}.jsonl")), pool_size, limit)
  assert pools == json.loads(json.dumps(expected))
  # Ranking each pool by its BM25 order is a valid run for the metrics.
  run = {p["id"]: [c["id"] for c in p["ctxs"]] for p in pools}
  m = evaluation.rerank_metrics(run, qrels, k=pool_size)
  assert m[f"recall@{pool_size}"] == pytest.approx(100.0)


def test_cli_malformed_input_exits_with_message(tmp_path):
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"input": "q"}\n')
  res = subprocess.run([sys.executable, str(ROOT / "tools" / "prepare_data.py"), "--input", str(bad),
                        "--output", str(tmp_path / "o.jsonl"), "--qrels", str(tmp_path / "q.txt")],
                       capture_output=True, text=True, timeout=60, check=False)
  assert res.returncode == 1
  assert "bad.jsonl:1" in res.stderr and "gold_ctx" in res.stderr
  assert not (tmp_path / "o.jsonl").exists()


# ---------------------------------------------------------------- id-only pools + a corpus

CORPUS = [{"id": "a", "title": "A", "text": "alpha"}, {"id": 7, "text": "seven"},
          {"id": "n", "title": "no text"}]


def test_expand_pools_resolves_ids_and_passes_full_pools_through():
  from logrerank_jax.data.pool_files import expand_pools, index_corpus
  full = {"id": "q0", "input": "x", "ctxs": [{"text": "t"}]}
  out = expand_pools([{"id": "q1", "input": "y", "ctx_ids": ["a", 7]}, full], CORPUS)
  assert out[0] == {"id": "q1", "input": "y", "ctxs": [{"id": "a", "title": "A", "text": "alpha"},
                                                       {"id": "7", "title": "", "text": "seven"}]}
  assert out[1] is full
  # read_corpus's {id: entry} gives the same; an entry without text gives a passage without one
  # (the readers skip it with its reason), not a KeyError.
  assert expand_pools([{"id": "q1", "input": "y", "ctx_ids": ["a", 7]}],
                      index_corpus(CORPUS)) == out[:1]
  assert expand_pools([{"id": "q", "input": "y", "ctx_ids": ["n"]}], CORPUS)[0]["ctxs"] == [
      {"id": "n", "title": "no text"}]


@pytest.mark.parametrize("pools, corpus, needle", [
    ([{"id": "q1", "ctx_ids": ["a", "zz", "yy"]}], CORPUS,
     "pool 1: pool 'q1': passage id 'zz' is not in the corpus (2 of its 3 ids missing)"),
    ([{"id": "q0", "ctxs": []}, {"id": "q2", "ctx_ids": ["a"], "ctxs": [{"text": "t"}]}], CORPUS,
     "pool 2: pool 'q2' has both 'ctxs' and 'ctx_ids'; give one"),
    ([{"id": "q3", "ctx_ids": "a"}], CORPUS, "pool 1: 'ctx_ids' must be a list of passage ids"),
    ([], CORPUS + [{"id": "a", "text": "again"}], "corpus entry 4: passage id 'a' repeats"),
    ([], [{"text": "no id"}], "corpus entry 1: expected a JSON object with an 'id'"),
], ids=["missing-id", "ctxs-and-ctx_ids", "ctx_ids-not-list", "repeated-corpus-id", "no-id"])
def test_expand_pools_errors_name_the_pool_or_entry(pools, corpus, needle):
  from logrerank_jax.data.pool_files import expand_pools
  with pytest.raises(DataError) as info:
    expand_pools(pools, corpus)
  assert needle in str(info.value) and "\n" not in str(info.value)


def test_read_pool_file_names_a_malformed_line(tmp_path):
  from logrerank_jax.data.pool_files import read_pool_file
  path = tmp_path / "pools.jsonl"
  path.write_text('{"id": "q"}\n\n{"id": \n')
  with pytest.raises(DataError, match=rf"{path}:3: malformed JSON"):
    read_pool_file(str(path))
  path.write_text('{"id": "q"}\n\n[1]\n')
  assert read_pool_file(str(path)) == [{"id": "q"}, [1]]
  with pytest.raises(DataError, match="cannot read pools"):
    read_pool_file(str(tmp_path / "absent.jsonl"))
