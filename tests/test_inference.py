"""Library-level tests of `logrerank_jax.engine` on real SciFact pools with a tiny model."""

import atexit
import math
import os
import shutil
import stat
import tempfile

import jax
import numpy as np
import pytest

from conftest import DATA_DIR
from logrerank_jax import engine as inference
from logrerank_jax.data.inference_input import parse_inference_line
from logrerank_jax.data.packing import PackingConfig
from logrerank_jax.datasets.pools import build_eval_pools
from logrerank_jax.datasets.scholarqabench import read_scholarqabench
from logrerank_jax.data.sentences import split_sentences
from logrerank_jax.errors import CheckpointError, DataError

# Rows of 128 tokens: SciFact abstracts need several windows and some sentences are truncated,
# so windowing and truncation flags are exercised. Coarse buckets keep the shape set small.
PACKING = PackingConfig(row_len=128, max_query_tokens=24, row_buckets=(32, 64),
                        span_buckets=(256,), node_buckets=(128,))


def make_pools(pool_size=4, limit=5):
  """Real SciFact evaluation pools (gold + BM25 negatives) and their qrels."""
  records = read_scholarqabench(str(DATA_DIR / "scifact_slice.jsonl"))
  return build_eval_pools(records, pool_size=pool_size, limit=limit)


_TINY_MODELS = {}  # (the pools' texts, seed) -> a model folder built once per process


def make_tiny_model(directory, pools, seed=0):
  """Save a randomly initialised tiny LoG model folder (tokenizer trained on the pools' text).

  Many test files use the same tiny model (the default `make_pools()`, seed 0): it is built once
  per process (tokenizer training and the jitted init are most of its cost) and copied into
  `directory`, so each caller still owns, and may change, its own folder."""
  from logrerank_bench.suites import random_tiny_model
  from logrerank_jax.datasets.wordpiece import train_wordpiece_tokenizer
  from logrerank_jax.models.model_folder import save_model

  texts = [p["input"] for p in pools] + [c["text"] for p in pools for c in p["ctxs"]]
  key = (tuple(texts), seed)
  if key not in _TINY_MODELS:
    built = tempfile.mkdtemp(prefix="logrerank-tiny-model-")
    atexit.register(shutil.rmtree, built, True)
    tok = train_wordpiece_tokenizer(texts, 600)
    params, cfg = random_tiny_model(tok, seed=seed)
    save_model(os.path.join(built, "model"), params, cfg, tok)
    _TINY_MODELS[key] = os.path.join(built, "model")
  shutil.copytree(_TINY_MODELS[key], directory, dirs_exist_ok=True)
  return str(directory)


@pytest.fixture(scope="module")
def pools():
  return make_pools()[0]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, pools):
  return make_tiny_model(tmp_path_factory.mktemp("model") / "model", pools)


@pytest.fixture(scope="module")
def reranker(model_dir):
  return inference.Reranker.from_pretrained(model_dir, packing=PACKING, queries_per_batch=2)


@pytest.fixture(scope="module")
def outputs(reranker, pools):
  return reranker.rerank_records(pools)


def check_output(out, record):
  """Schema, offsets and coverage checks of one "log" output against its input record."""
  assert out["error"] is None
  assert out["query"] == record["input"] and out["id"] == str(record["id"])
  assert isinstance(out["query_truncated"], bool)
  ctxs = record["ctxs"]
  usable = lambda c: isinstance(c.get("text"), str) and c["text"].strip()  # noqa: E731
  n_sent = lambda c: len(split_sentences(c["text"])) if usable(c) else 0  # noqa: E731
  expected = {(p, s) for p, c in enumerate(ctxs) for s in range(n_sent(c))}
  seen = [(r["passage"], r["sentence"]) for r in out["ranked_sentences"]]
  assert len(seen) == len(set(seen)) and set(seen) == expected  # every sentence exactly once
  assert [r["rank"] for r in out["ranked_sentences"]] == list(range(1, len(seen) + 1))
  scores = [r["score"] for r in out["ranked_sentences"]]
  assert scores == sorted(scores, reverse=True)
  for r in out["ranked_sentences"]:
    text = ctxs[r["passage"]]["text"]
    assert text[r["start"]:r["end"]] == r["text"] and r["text"]
    # float32 softmax of 3 roles, read back as floats: a few eps (1.19e-7) off 1.
    assert math.isclose(sum(r["role_probs"].values()), 1.0, abs_tol=1e-5)
    assert r["role"] == max(r["role_probs"], key=r["role_probs"].get)
    assert 0.0 <= r["local_score"] <= 1.0 and r["global_score"] == r["score"]
  # Passage ranking = order of first appearance; a NumPy reference: best sentence per passage.
  best = np.full(len(ctxs), -1.0)
  for r in out["ranked_sentences"]:
    best[r["passage"]] = max(best[r["passage"]], r["score"])
  assert out["passage_ranking"] == sorted(range(len(ctxs)), key=lambda p: (-best[p], p))
  assert [p["index"] for p in out["passages"]] == list(range(len(ctxs)))
  for p, info in enumerate(out["passages"]):
    assert info["num_sentences"] == n_sent(ctxs[p])
    assert (info["skipped"] is None) == bool(usable(ctxs[p]))
    assert info["id"] == ctxs[p].get("id")
    for s in info["truncated_sentences"]:
      flagged = [r for r in out["ranked_sentences"] if (r["passage"], r["sentence"]) == (p, s)]
      assert flagged[0]["truncated"]
  # Context units: top-K by score, texts resolved.
  ctx = out["context"]
  assert len(ctx) == min(4, len(seen))  # LoGConfig.tiny().context_k == 4
  assert [u["score"] for u in ctx] == scores[:len(ctx)]
  for u in ctx:
    for ref in [u] + [u[k] for k in ("predecessor", "successor") if u[k]] + u["similar"]:
      assert split_sentences(ctxs[ref["passage"]]["text"])[ref["sentence"]].text == ref["text"]
    if u["predecessor"]:
      assert (u["predecessor"]["passage"], u["predecessor"]["sentence"]) == (u["passage"], u["sentence"] - 1)


def test_rerank_records_on_scifact_pools(outputs, pools):
  assert len(outputs) == len(pools)
  for out, rec in zip(outputs, pools):
    check_output(out, rec)
  # Windowing really happened (passages longer than one 128-token row) and truncation is reported.
  assert max(p["num_windows"] for o in outputs for p in o["passages"]) > 1
  assert any(p["truncated_sentences"] for o in outputs for p in o["passages"])


def test_second_pass_compiles_nothing(reranker, pools, outputs):
  rr = reranker
  # Pass 1 (the `outputs` fixture, 2 queries per call): pairs of full pools (64-row bucket) and
  # a lone query (32-row bucket).
  first = outputs
  after_first = rr.compile_stats()
  # Pass 1 built executables (or reused those of another engine of this model and shapes,
  # `engine.stage_jits`, when one ran before in this process).
  assert after_first["jit_cache_entries"] >= 1
  # Pass 2: other pairings, fewer passages, a shorter query: different sizes, same buckets.
  second_input = [pools[4], dict(pools[1], ctxs=pools[1]["ctxs"][:2]),
                  dict(pools[2], input=pools[2]["input"][:40]), pools[0]]
  second = rr.rerank_records(second_input)
  stats = rr.compile_stats()
  assert all(o["error"] is None for o in first + second)
  assert stats["xla_compilations"] == after_first["xla_compilations"], stats
  assert stats["jit_cache_entries"] == after_first["jit_cache_entries"]
  # 4 records, 2 per call: 2 local-stage calls and 2 global-stage calls (more local calls only
  # when a query outgrows the largest row bucket, which these 128-token rows do not).
  assert stats["forward_calls"] == after_first["forward_calls"] + 4


def test_batched_equals_one_at_a_time(model_dir, pools, outputs):
  single = inference.Reranker.from_pretrained(model_dir, packing=PACKING, queries_per_batch=1)
  one_by_one = single.rerank_records(pools[:3])
  worst = 0.0
  for a, b in zip(outputs[:3], one_by_one):  # `outputs` used 2 queries per call
    key = lambda r: (r["passage"], r["sentence"])  # noqa: E731
    ra, rb = sorted(a["ranked_sentences"], key=key), sorted(b["ranked_sentences"], key=key)
    assert [key(r) for r in ra] == [key(r) for r in rb]
    for x, y in zip(ra, rb):
      for name in ("local_score", "global_score"):
        worst = max(worst, abs(x[name] - y[name]))
      for role in inference.ROLE_NAMES:
        worst = max(worst, abs(x["role_probs"][role] - y["role_probs"][role]))
  # Batched vs one at a time: other padded shapes, another float32 program; scores in [0, 1]
  # behind the encoder bound (~1e-5, tests/test_modernbert_parity.py). Measured 1.2e-7 (80x).
  assert worst <= 1e-5, worst


@pytest.mark.parametrize("text, reason", [(float("nan"), "text is NaN"), (42, "text is int"),
                                          (None, "text is null")],
                         ids=["nan-text", "number-text", "null-text"])
def test_unusable_passage_is_skipped_and_rest_is_ranked(reranker, pools, text, reason):
  rec = dict(pools[3], ctxs=pools[3]["ctxs"][:1] + [{"title": "t", "text": text}]
             + pools[3]["ctxs"][1:])
  out = reranker.rerank_records([rec, pools[4]])
  assert out[0]["error"] is None and out[0]["passages"][1]["skipped"] == reason
  assert out[0]["passage_ranking"][-1] == 1 and 1 not in {s["passage"] for s in out[0]["ranked_sentences"]}
  check_output(out[0], rec)
  check_output(out[1], pools[4])


@pytest.mark.parametrize("bad, message", [
    ({"input": "q", "ctxs": []}, "zero passages"),
    ({"ctxs": [{"text": "A sentence."}]}, "missing query"),
    ({"question": "  ", "passages": [{"text": "A sentence."}]}, "non-empty string"),
    ("not an object", "expected a JSON object"),
], ids=["zero-passages", "missing-query", "blank-query", "not-object"])
def test_bad_record_gets_error_and_rest_is_processed(reranker, pools, bad, message):
  out = reranker.rerank_records([pools[3], bad, pools[4]])
  assert len(out) == 3
  assert message in out[1]["error"] and "ranked_sentences" not in out[1]
  assert out[1]["line"] == 2
  check_output(out[0], pools[3])
  check_output(out[2], pools[4])


def test_query_larger_than_every_bucket_is_scored(reranker, pools):
  # 140 sentences > the largest node bucket (128): the node bucket grows for this query's graph
  # (never cut), and its batch partner is scored as usual.
  huge = {"id": "huge", "input": "q", "ctxs": [{"title": "t", "text": " ".join(
      f"Growth was seen in sample number {i} today." for i in range(140))}]}
  out = reranker.rerank_records([huge, pools[3]])
  check_output(out[0], huge)
  assert len(out[0]["ranked_sentences"]) == 140
  check_output(out[1], pools[3])


def test_malformed_json_line_is_an_error():
  line = parse_inference_line('{"input": "q", "ctxs": [', 7, "in.jsonl")
  assert isinstance(line.record, DataError) and "in.jsonl:7: malformed JSON" in str(line.record)


def test_empty_text_passage_is_kept_last(reranker, pools):
  ctxs = [pools[3]["ctxs"][0], {"id": "empty", "title": "Nothing", "text": "   "}, pools[3]["ctxs"][1]]
  rec = dict(pools[3], ctxs=ctxs)
  out = reranker.rerank_records([rec])[0]
  check_output(out, rec)
  assert out["passage_ranking"][-1] == 1
  assert out["passages"][1]["num_sentences"] == 0 and out["passages"][1]["num_windows"] == 0


def test_long_query_is_flagged(reranker, pools):
  rec = dict(pools[3], input=" ".join([pools[3]["input"]] * 3))  # > max_query_tokens=24
  out = reranker.rerank_records([rec, pools[3]])
  check_output(out[0], rec)
  assert out[0]["query_truncated"] and not out[1]["query_truncated"]


def test_from_dir_accepts_a_training_workdir(model_dir, tmp_path):
  shutil.copytree(model_dir, tmp_path / "work" / "model")
  # A training run's row length in info.json is the default; explicit arguments win. Its query
  # limit is not used: the inference default (half a row, at most 128) keeps real questions.
  (tmp_path / "work" / "model" / "info.json").write_text(
      '{"packing": {"row_len": 96, "max_query_tokens": 16}}')
  rr = inference.Reranker.from_pretrained(str(tmp_path / "work"))
  assert (rr.packing.row_len, rr.packing.max_query_tokens) == (96, 48)
  rr = inference.Reranker.from_pretrained(str(tmp_path / "work"), row_len=128, max_query_tokens=16)
  assert (rr.packing.row_len, rr.packing.max_query_tokens) == (128, 16)
  assert rr.cfg == inference.Reranker.from_pretrained(model_dir, packing=PACKING).cfg
  with pytest.raises(CheckpointError, match="neither a model folder"):
    inference.Reranker.from_pretrained(str(tmp_path))


def test_openscholar_writer_keeps_fields_and_ctxs(outputs, pools):
  for rec, out in zip(pools, outputs):
    back = inference.to_openscholar(rec, out)
    assert {k: back[k] for k in rec if k != "ctxs"} == {k: v for k, v in rec.items() if k != "ctxs"}
    assert back["ctxs"] == [rec["ctxs"][p] for p in out["passage_ranking"]]
    assert sorted(back["ctxs"], key=lambda c: c["id"]) == sorted(rec["ctxs"], key=lambda c: c["id"])
    assert [{k: v for k, v in u.items() if k != "ctx_position"} for u in back["log_context"]] \
        == out["context"]
    assert [back["ctxs"][u["ctx_position"]] for u in back["log_context"]] == \
        [rec["ctxs"][u["passage"]] for u in out["context"]]


def test_compilation_cache_dir_is_private(tmp_path):
  before = jax.config.jax_compilation_cache_dir  # the test run's own cache (conftest.py)
  path = inference.enable_compilation_cache(str(tmp_path / "cache" / "xla"))
  try:
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert jax.config.jax_compilation_cache_dir == path
  finally:
    jax.config.update("jax_compilation_cache_dir", before)


def test_residual_global_score_reaches_the_serving_path(tmp_path, model_dir, pools):
  """A residual global stage (GraphRerankerConfig.residual_local, not in the paper) with its
  correction zeroed scores every sentence exactly as the local stage: the serving path carries
  each node's local logit to the GAT (a lost logit would give sigmoid(0) = 0.5 everywhere)."""
  import dataclasses
  from logrerank_jax.models.model_folder import load_model, save_model
  params, cfg, tok = load_model(model_dir)
  cfg = dataclasses.replace(cfg, graph_reranker=dataclasses.replace(cfg.graph_reranker,
                                                                    residual_local=True))
  out_layer = params["global"]["scorer"]["out"]
  out_layer["kernel"], out_layer["bias"] = (np.zeros_like(out_layer["kernel"]),
                                            np.zeros_like(out_layer["bias"]))
  save_model(str(tmp_path / "model"), params, cfg, tok)
  outs = inference.Reranker.from_pretrained(str(tmp_path / "model"), packing=PACKING,
                                     queries_per_batch=2).rerank_records(pools[:2])
  for out, rec in zip(outs, pools[:2]):
    check_output(out, rec)
    for r in out["ranked_sentences"]:
      # sigmoid(l) from the local stage's float32 logit vs from the same logit passed through
      # the GAT's float32 add of 0: equal to 1e-7 (ulp of values < 1 is <= 6e-8).
      assert abs(r["global_score"] - r["local_score"]) <= 1e-7, r
    assert len({round(r["local_score"], 6) for r in out["ranked_sentences"]}) > 3


def test_set_params_swaps_weights_without_compiling(model_dir, pools, tmp_path):
  """`Engine.set_params` (each validation of a training run scores through the engine): the
  swapped-in params give exactly what an engine built on them gives, with no new compilation;
  params of other shapes are refused by name."""
  other_dir = make_tiny_model(tmp_path / "other", pools, seed=1)
  rr = inference.Reranker.from_pretrained(model_dir, packing=PACKING, queries_per_batch=2)
  before = rr.rerank_records(pools[:2])
  compiled = rr.compile_stats()["xla_compilations"]
  fresh = inference.Reranker.from_pretrained(other_dir, packing=PACKING, queries_per_batch=2)
  rr.engine.set_params(jax.device_get(fresh.params))
  after, want = rr.rerank_records(pools[:2]), fresh.rerank_records(pools[:2])
  assert rr.compile_stats()["xla_compilations"] == compiled
  scores = lambda outs: [[r["local_score"] for r in o["ranked_sentences"]] for o in outs]  # noqa: E731
  assert scores(after) == scores(want) and scores(after) != scores(before)
  bad = jax.tree_util.tree_map(lambda x: x[..., :1] if x.ndim else x, jax.device_get(fresh.params))
  with pytest.raises(CheckpointError, match="do not match the model config"):
    rr.engine.set_params(bad)
