"""First real use (issue 13): any pool size with default settings, nothing about a query lost,
honest exit status, the inputs users have, queries not cut, the one-call API."""

import json
import pathlib
import subprocess
import sys

import pytest

from conftest import DATA_DIR, read_jsonl
from logrerank_jax import engine as inference
from logrerank_jax.errors import DataError
from test_inference import make_pools, make_tiny_model

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "rerank.py"


def real_passages(n: int):
  """n distinct real PubMed abstracts (the shipped demo data's passages, deduplicated).

  Distinct texts matter: overlapping windows of the same sentences would make near-identical
  sentence vectors, whose similarity edges (top-k, thresholds) flip on float rounding."""
  seen, out = set(), []
  for split in ("train", "val", "test"):
    for rec in read_jsonl(ROOT / "logrerank_jax" / "demo_data" / f"{split}.jsonl"):
      for p in rec["passages"]:
        text = " ".join(s["text"] for s in p["sentences"])
        if text not in seen:
          seen.add(text)
          out.append({"title": "", "text": text, "id": f"w{len(out)}"})
  assert len(out) >= n, len(out)
  return out[:n]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  return make_tiny_model(tmp_path_factory.mktemp("model") / "model", make_pools()[0])


@pytest.fixture(scope="module")
def big_query():
  return {"id": "big", "input": "Does treatment improve survival in older patients?",
          "ctxs": real_passages(200)}


def test_200_passages_in_one_call_equal_several_calls(model_dir, big_query):
  """A 200-passage query scored in one call (buckets large enough) and in several local calls
  with grown node buckets gives the same ranking and scores within 1e-5."""
  # The query holds 223,535 real tokens and 1,923 sentences: packed into rows of 256 it needs more
  # than 1,024 rows and at most 1,280 (`padding_plan`), so these buckets fit it in one call; the
  # assertion on forward_calls below checks that they did.
  one = inference.Reranker.from_pretrained(
      model_dir, row_len=256, queries_per_batch=1, row_buckets=(1280,), span_buckets=(4096,),
      node_buckets=(4096,))
  many = inference.Reranker.from_pretrained(
      model_dir, row_len=256, queries_per_batch=1, row_buckets=(2, 4, 8, 16),
      span_buckets=(64, 128, 256), node_buckets=(16, 64))
  a, = one.rerank_records([big_query])
  b, = many.rerank_records([big_query])
  assert a["error"] is None and b["error"] is None
  assert one.compile_stats()["forward_calls"] == 2          # one local + one global call
  assert many.compile_stats()["forward_calls"] > 4          # several local calls
  assert len(a["passage_ranking"]) == 200 and sorted(a["passage_ranking"]) == list(range(200))
  key = lambda s: (s["passage"], s["sentence"])  # noqa: E731
  sa, sb = sorted(a["ranked_sentences"], key=key), sorted(b["ranked_sentences"], key=key)
  assert [key(s) for s in sa] == [key(s) for s in sb]
  # float32 scores through 3 encoder layers + heads + 2 GAT layers; rows packed differently
  # only change which sequences share a row (attention never crosses them), and XLA's
  # reductions over a different number of rows round differently: bound 1e-5 (measured ~1e-7).
  err = max(abs(x[f] - y[f]) for x, y in zip(sa, sb) for f in ("local_score", "score"))
  assert err <= 1e-5, err
  # Same passage ranking, except between passages whose scores are within that bound (the
  # random tiny model gives many near-ties).
  best = {}
  for s in sa:
    best[s["passage"]] = max(best.get(s["passage"], -1.0), s["score"])
  for x, y in zip(a["passage_ranking"], b["passage_ranking"]):
    assert x == y or abs(best[x] - best[y]) <= 2e-5, (x, y, best[x], best[y])


def test_default_settings_rerank_a_200_passage_pool(model_dir, big_query):
  """Default settings (no bucket or row flags) take any pool size."""
  out, = inference.Reranker.from_pretrained(model_dir).rerank_records([big_query])
  assert out["error"] is None
  assert sorted(out["passage_ranking"]) == list(range(200))


def test_unusable_passage_is_skipped_and_the_rest_reranked(model_dir):
  good = real_passages(6)
  ctxs = good[:2] + [{"title": "x", "text": float("nan")}] + good[2:4] + [
      {"text": None}, {"text": 7}, {"text": "   "}, {"title": "no text"}] + good[4:]
  out, = inference.Reranker.from_pretrained(model_dir).rerank_records(
      [{"input": "What is measured?", "ctxs": ctxs}])
  assert out["error"] is None
  skipped = {p["index"]: p["skipped"] for p in out["passages"] if p["skipped"]}
  assert skipped == {2: "text is NaN", 5: "text is null", 6: "text is int", 7: "text is empty",
                     8: "no 'text' field"}
  ranked = out["passage_ranking"]
  assert sorted(ranked) == list(range(len(ctxs)))              # every passage kept, once
  assert set(ranked[:6]) == {0, 1, 3, 4, 9, 10}                # the good ones ranked first
  assert ranked[6:] == [2, 5, 6, 7, 8]                         # skipped ones last, in order
  assert {s["passage"] for s in out["ranked_sentences"]} == {0, 1, 3, 4, 9, 10}


def test_rank_api_plain_strings_and_dicts(model_dir):
  rr = inference.Reranker.from_pretrained(model_dir)
  passages = [p["text"] for p in real_passages(5)]
  passages[3] = {"title": "A title", "text": passages[3]}
  ranked = rr.rank("What do the trials show about survival?", passages, top_k=3)
  assert len(ranked) == 3 and [p.rank for p in ranked] == [1, 2, 3]
  full = rr.rank("What do the trials show about survival?", passages)
  assert sorted(p.index for p in full) == list(range(5))
  assert [p.index for p in full][:3] == [p.index for p in ranked]
  scores = [p.score for p in full]
  assert scores == sorted(scores, reverse=True)
  for p in full:
    text = passages[p.index] if isinstance(passages[p.index], str) else passages[p.index]["text"]
    assert p.text == text and p.sentences
    assert all(text[s.start:s.end] == s.text for s in p.sentences)
    assert p.score == p.sentences[0].score
  assert full.context and full.context[0].score == max(scores)
  with pytest.raises(DataError, match="non-empty string"):
    rr.rank("", passages)


@pytest.mark.parametrize("key", ["input", "question", "query"])
def test_query_keys(model_dir, key):
  out, = inference.Reranker.from_pretrained(model_dir).rerank_records(
      [{key: "Is the effect real?", "passages": [p["text"] for p in real_passages(3)]}])
  assert out["error"] is None and out["query"] == "Is the effect real?"


def test_real_claims_are_not_truncated_by_default(model_dir):
  """Default query limit: real SciFact claims fit even under the tiny 600-word test vocabulary."""
  rr = inference.Reranker.from_pretrained(model_dir)
  claims = [r["input"] for r in read_jsonl(DATA_DIR / "scifact_slice.jsonl")]
  outs = rr.rerank_records([{"input": c, "ctxs": real_passages(2)} for c in claims])
  assert all(o["error"] is None for o in outs)
  lengths = [len(rr.tokenizer(c, add_special_tokens=False)["input_ids"]) for c in claims]
  assert max(lengths) > 32  # the old training-time limit would have cut some
  assert not any(o["query_truncated"] for o in outs), lengths


def test_long_query_truncation_is_still_flagged(model_dir):
  rr = inference.Reranker.from_pretrained(model_dir)
  out, = rr.rerank_records([{"input": "survival " * 400, "ctxs": real_passages(2)}])
  assert out["error"] is None and out["query_truncated"] is True


def _run(args, tmp_path):
  return subprocess.run([sys.executable, str(TOOL), "--no-progress", "--no-compilation-cache",
                         *args], capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_cli_exit_status_and_summary(model_dir, tmp_path):
  good = {"id": "g", "input": "Is it effective?", "ctxs": real_passages(3)}
  nan = {"id": "n", "input": "Is it safe?", "ctxs": real_passages(2) + [{"text": float("nan")}]}
  task = {"id": "t", "input": "A ScholarQABench task.", "gold_ctx": [{"title": "", "text": "x"}]}
  inp = tmp_path / "in.jsonl"

  def write(*recs):
    inp.write_text("".join(json.dumps(r) + "\n" for r in recs))

  write(good)
  ok = _run(["--checkpoint", model_dir, "--input", str(inp), "--output", str(tmp_path / "o1")],
            tmp_path)
  assert ok.returncode == 0, ok.stderr
  assert "1 of 1 records fully processed, 0 with 0 skipped passage(s), 0 error(s)" in ok.stderr
  assert "on 1 device(s)" in ok.stderr

  write(good, nan, task)
  part = _run(["--checkpoint", model_dir, "--input", str(inp), "--output", str(tmp_path / "o2")],
              tmp_path)
  assert part.returncode == 2, part.stderr
  last = part.stderr.strip().splitlines()[-1]
  assert "1 of 3 records fully processed, 1 with 1 skipped passage(s), 1 error(s)" in last
  assert "first lines: 2, 3" in last
  assert "tools/prepare_data.py" in part.stderr
  outs = [json.loads(l) for l in (tmp_path / "o2").read_text().splitlines()]
  assert len(outs) == 3 and outs[0]["error"] is None and outs[1]["error"] is None
  assert outs[1]["passages"][2]["skipped"] == "text is NaN"
  assert "gold_ctx" in outs[2]["error"] and "prepare_data.py" in outs[2]["error"]

  strict = _run(["--checkpoint", model_dir, "--input", str(inp), "--output", str(tmp_path / "o3"),
                 "--strict"], tmp_path)
  assert strict.returncode == 2
  outs = [json.loads(l) for l in (tmp_path / "o3").read_text().splitlines()]
  assert outs[0]["error"] is None
  assert outs[1]["error"] == "passages skipped: ctxs[2] text is NaN"


def test_openscholar_context_names_both_orders(model_dir, tmp_path):
  inp = tmp_path / "in.jsonl"
  inp.write_text(json.dumps({"input": "What changed?", "ctxs": real_passages(5), "extra": 1}) + "\n")
  res = _run(["--checkpoint", model_dir, "--input", str(inp), "--output", str(tmp_path / "o"),
              "--format", "openscholar"], tmp_path)
  assert res.returncode == 0, res.stderr
  out = json.loads((tmp_path / "o").read_text())
  assert out["extra"] == 1
  for u in out["log_context"]:
    # `passage` indexes the input order, `ctx_position` the reordered ctxs written here.
    assert out["ctxs"][u["ctx_position"]]["id"] == f"w{u['passage']}"
    assert u["text"] in out["ctxs"][u["ctx_position"]]["text"]
