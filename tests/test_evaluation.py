"""Recall / MAP / nDCG @k against hand-computed values and ir_measures; TREC file round trips."""

import math

import ir_measures
import numpy as np
import pytest
from ir_measures import R, nDCG

from logrerank_jax import evaluation
from logrerank_jax.errors import DataError


def test_hand_computed_example():
  # Relevant d1, d3, d9 (G = 3); d9 is not retrieved in the top 10.
  run = {"q": ["d1", "d2", "d3", "d4"]}
  qrels = {"q": {"d1", "d3", "d9"}}
  m = evaluation.rerank_metrics(run, qrels, k=10)
  # AP@10 = (1/1 + 2/3) / min(3, 10) = 5/9.
  # float64 host arithmetic (Python/NumPy, no XLA) on values <= 100: each op rounds to 2.2e-16
  # relative, a few dozen ops stay < 1e-13; the bound is >= 10x that on any CPU.
  assert m["map@10"] == pytest.approx(100 * 5 / 9, abs=1e-12)
  assert m["recall@10"] == pytest.approx(100 * 2 / 3, abs=1e-12)
  dcg = 1 + 1 / math.log2(4)
  idcg = 1 + 1 / math.log2(3) + 1 / math.log2(4)
  assert m["ndcg@10"] == pytest.approx(100 * dcg / idcg, abs=1e-12)
  assert set(m) == {"recall@10", "map@10", "ndcg@10"}


def test_map_divides_by_min_g_k_when_g_exceeds_k():
  # G = 5 > k = 2, both top-2 documents relevant: AP@2 = (1 + 1) / min(5, 2) = 1 (trec_eval would say 0.4).
  run = {"q": ["a", "b", "c"]}
  qrels = {"q": {"a", "b", "x", "y", "z"}}
  m = evaluation.rerank_metrics(run, qrels, k=2)
  assert m["map@2"] == pytest.approx(100.0)
  assert m["ndcg@2"] == pytest.approx(100.0)   # ideal DCG has min(G, k) = 2 hits
  assert m["recall@2"] == pytest.approx(40.0)


def test_zero_relevant_skipped_and_missing_query_scores_zero():
  run = {"q1": ["a", "b"], "q2": ["c"], "extra": ["z"]}
  qrels = {"q1": {"a"}, "q2": set(), "q3": {"x"}}  # q2 skipped (G = 0), q3 missing -> 0
  m = evaluation.rerank_metrics(run, qrels, k=10)
  assert m == pytest.approx({"recall@10": 50.0, "map@10": 50.0, "ndcg@10": 50.0})


def test_no_relevant_anywhere_is_an_error():
  with pytest.raises(DataError, match="no query with a relevant"):
    evaluation.rerank_metrics({"q": ["a"]}, {"q": set()})


def test_duplicate_doc_is_an_error():
  with pytest.raises(DataError, match="'q'.*'a' twice"):
    evaluation.rerank_metrics({"q": ["a", "b", "a"]}, {"q": {"a"}})


@pytest.mark.parametrize("run,qrels,k", [
    ("not a dict", {"q": {"a"}}, 10), ({"q": "ab"}, {"q": {"a"}}, 10),
    ({"q": ["a"]}, {"q": "a"}, 10), ({"q": ["a"]}, {"q": {"a"}}, 0)],
    ids=["run_not_dict", "ranking_is_str", "qrels_is_str", "k_zero"])
def test_bad_inputs(run, qrels, k):
  with pytest.raises(DataError):
    evaluation.rerank_metrics(run, qrels, k=k)


@pytest.mark.parametrize("seed,k", [(0, 10), (1, 10), (2, 5), (3, 20)], ids=["s0k10", "s1k10", "s2k5", "s3k20"])
def test_matches_ir_measures_on_random_runs(seed, k):
  rng = np.random.default_rng(seed)
  scores, qrels = {}, {}
  for q in range(30):
    n_docs = int(rng.integers(1, 40))
    docs = [f"d{j}" for j in range(n_docs)]
    vals = rng.permutation(n_docs).astype(float) + rng.random(n_docs) * 0.5  # distinct scores
    scores[f"q{q}"] = dict(zip(docs, vals.tolist()))
    g = int(rng.integers(1, 15))  # some relevant docs may be unretrieved; G > k happens
    qrels[f"q{q}"] = {f"d{j}" for j in rng.choice(60, size=g, replace=False)}
  run = evaluation.run_from_scores(scores)
  ours = evaluation.rerank_metrics(run, qrels, k=k)
  irm_qrels = [ir_measures.Qrel(q, d, 1) for q, ds in qrels.items() for d in ds]
  irm_run = [ir_measures.ScoredDoc(q, d, s) for q, ds in scores.items() for d, s in ds.items()]
  ref = ir_measures.calc_aggregate([R @ k, nDCG @ k], irm_qrels, irm_run)
  # float64 host arithmetic (Python/NumPy, no XLA) on values <= 100: each op rounds to 2.2e-16
  # relative, a few dozen ops stay < 1e-13; the bound is >= 10x that on any CPU.
  assert ours[f"recall@{k}"] == pytest.approx(100 * ref[R @ k], abs=1e-9)
  assert ours[f"ndcg@{k}"] == pytest.approx(100 * ref[nDCG @ k], abs=1e-9)


def test_map_against_numpy_reference():
  rng = np.random.default_rng(7)
  for _ in range(50):
    n, k = int(rng.integers(1, 30)), int(rng.integers(1, 15))
    ranking = [f"d{i}" for i in rng.permutation(n)]
    rel = {f"d{i}" for i in rng.choice(40, size=int(rng.integers(1, 12)), replace=False)}
    g = np.array([d in rel for d in ranking[:k]], float)
    prec = np.cumsum(g) / np.arange(1, len(g) + 1)
    ap = float(np.sum(g * prec) / min(len(rel), k))
    # float64 host arithmetic (Python/NumPy, no XLA) on values <= 100: each op rounds to 2.2e-16
    # relative, a few dozen ops stay < 1e-13; the bound is >= 10x that on any CPU.
    assert evaluation.query_metrics(ranking, rel, k)["ap"] == pytest.approx(ap, abs=1e-12)


def test_trec_run_round_trip_and_tie_order(tmp_path):
  scores = {"q1": {"b": 1.0, "a": 1.0, "c": 2.5}, "q2": {"x": -0.125}}
  path = tmp_path / "run.trec"
  evaluation.write_trec_run(str(path), scores, tag="test")
  lines = path.read_text().splitlines()
  assert lines[0] == "q1 Q0 c 1 2.5 test"
  assert lines[1].startswith("q1 Q0 a 2 ") and lines[2].startswith("q1 Q0 b 3 ")
  assert evaluation.read_trec_run(str(path)) == scores
  assert evaluation.run_from_scores(scores) == {"q1": ["c", "a", "b"], "q2": ["x"]}


def test_qrels_round_trip_and_zero_judgements(tmp_path):
  qrels = {"q1": {"a", "b"}, "q2": {"c"}}
  path = tmp_path / "qrels.txt"
  evaluation.write_qrels(str(path), qrels)
  assert evaluation.read_qrels(str(path)) == qrels
  path.write_text("q1 0 a 1\nq1 0 b 0\nq3 0 z 0\n")
  assert evaluation.read_qrels(str(path)) == {"q1": {"a"}, "q3": set()}


@pytest.mark.parametrize("content,match", [
    ("q1 Q0 a 1\n", ":1: expected"), ("q1 Q0 a 1 high t\n", "not a number"),
    ("q1 Q0 a 1 1.0 t\nq1 Q0 a 2 0.5 t\n", ":2: doc 'a' listed twice")],
    ids=["short_line", "bad_score", "duplicate"])
def test_malformed_run_file(tmp_path, content, match):
  path = tmp_path / "bad.trec"
  path.write_text(content)
  with pytest.raises(DataError, match=match):
    evaluation.read_trec_run(str(path))


def test_ids_with_spaces_rejected(tmp_path):
  with pytest.raises(DataError, match="without whitespace"):
    evaluation.write_trec_run(str(tmp_path / "r"), {"q 1": {"a": 1.0}}, tag="t")


def test_unscored_passage_floor_is_below_logits_and_minus_one_for_sigmoids():
  """`run_file_passage_scores`: a passage without a scored sentence sits below every scored one,
  at -1 for sigmoid scores (as before) and below the lowest when logits go under -1."""
  from logrerank_jax.ranking import passage_order, run_file_passage_scores
  sig = run_file_passage_scores([0, 0, 2], [0.2, 0.9, 0.0], 3)
  assert sig.tolist() == [0.9, -1.0, 0.0]
  logit = run_file_passage_scores([0, 2, 3], [-7.5, -3.0, 4.0], 4)
  assert logit.tolist() == [-7.5, -8.5, -3.0, 4.0] and passage_order(logit) == [3, 2, 0, 1]
  assert run_file_passage_scores([], [], 2).tolist() == [-1.0, -1.0]
