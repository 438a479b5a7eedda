"""`tools/evaluate.py` on real SciFact pools: BM25, a tiny HF cross-encoder, LoG local-only and full LoG."""

import importlib
import json
import pathlib

import numpy as np
import pytest

from test_inference import make_pools, make_tiny_model
from logrerank_jax import baselines
from logrerank_jax import engine as inference
from logrerank_jax.data.inference_input import parse_inference_record
from logrerank_jax.evaluation import read_trec_run, rerank_metrics, run_from_scores, write_qrels

ROOT = pathlib.Path(__file__).resolve().parent.parent
K = 3  # pools of 5 candidates: a cut-off below the pool size, so the ordering matters


def load_tool():
  """The module behind tools/evaluate.py and `logrerank evaluate`."""
  return importlib.import_module("logrerank_jax.cli.evaluate")


def make_hf_cross_encoder(directory, tokenizer):
  """Save a random tiny `ModernBertForSequenceClassification` with the tokenizer in one folder."""
  import torch
  from transformers import ModernBertConfig, ModernBertForSequenceClassification

  torch.manual_seed(0)
  config = ModernBertConfig(
      vocab_size=len(tokenizer), hidden_size=32, intermediate_size=48, num_hidden_layers=3,
      num_attention_heads=2, max_position_embeddings=512, local_attention=16,
      global_attn_every_n_layers=2, pad_token_id=tokenizer.pad_token_id,
      cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
      bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
      classifier_pooling="mean", num_labels=1)
  model = ModernBertForSequenceClassification(config).eval()
  model.save_pretrained(str(directory))
  tokenizer.save_pretrained(str(directory))
  return model


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """Run evaluate.py once in-process; return paths, pools, qrels, the torch model and stdout."""
  from logrerank_jax.data.tokenization import load_tokenizer

  tmp = tmp_path_factory.mktemp("evaluate")
  pools, qrels = make_pools(pool_size=5, limit=4)
  model = make_tiny_model(tmp / "model", pools)
  torch_model = make_hf_cross_encoder(tmp / "ce", load_tokenizer(str(tmp / "model" / "tokenizer")))
  with open(tmp / "pools.jsonl", "w", encoding="utf-8") as f:
    for p in pools:
      f.write(json.dumps(p) + "\n")
  write_qrels(str(tmp / "pools.qrels"), qrels)
  return tmp, model, pools, qrels, torch_model


def test_evaluate_prints_table_and_writes_runs(run, capsys):
  tmp, model, pools, qrels, _ = run
  out = tmp / "eval"
  rc = load_tool().main([
      "--pools", str(tmp / "pools.jsonl"), "--qrels", str(tmp / "pools.qrels"),
      "--checkpoint", model, "--cross-encoder", str(tmp / "ce"), "--out-dir", str(out),
      "--k", str(K), "--row-len", "128", "--queries-per-batch", "2", "--no-compilation-cache",
      "--no-progress"])
  assert rc == 0
  stdout = capsys.readouterr().out.splitlines()
  systems = ["bm25", "cross-encoder", "log-local", "log"]
  assert stdout[0].split() == ["system", f"recall@{K}", f"map@{K}", f"ndcg@{K}"]
  assert [line.split()[0] for line in stdout[1:1 + len(systems)]] == systems
  # Then LoG minus each other system, paired per query (metrics.json "paired").
  assert stdout[1 + len(systems)].startswith("log minus each system")
  assert [line.split()[0] for line in stdout[2 + len(systems):]] == systems[:-1]
  metrics = json.loads((out / "metrics.json").read_text())["metrics"]

  # BM25 row == rerank_metrics on the pool's BM25 ordering, to the printed precision and exactly.
  bm25_run = run_from_scores({p["id"]: {c["id"]: c["bm25"] for c in p["ctxs"]} for p in pools})
  expected = rerank_metrics(bm25_run, qrels, k=K)
  assert metrics["bm25"] == expected
  assert stdout[1].split()[1:] == [f"{expected[c]:.2f}" for c in (f"recall@{K}", f"map@{K}", f"ndcg@{K}")]

  # Every system: its TREC run re-evaluates to the reported metrics; per-query lines are complete.
  per_query = [json.loads(line) for line in (out / "per_query.jsonl").read_text().splitlines()]
  assert len(per_query) == len(systems) * len(pools)
  for name in systems:
    trec = read_trec_run(str(out / f"run.{name}.trec"))
    # float64 host arithmetic (Python/NumPy, no XLA) on values <= 100: each op rounds to 2.2e-16
    # relative, a few dozen ops stay < 1e-13; the bound is >= 10x that on any CPU.
    assert rerank_metrics(run_from_scores(trec), qrels, k=K) == pytest.approx(metrics[name], abs=1e-9)
    rows = [r for r in per_query if r["system"] == name]
    assert np.mean([r[f"ndcg@{K}"] for r in rows]) == pytest.approx(metrics[name][f"ndcg@{K}"])

  # Full LoG ranking == the passage ranking the reranker itself induces (first appearance).
  rr = inference.Reranker.from_pretrained(model, row_len=128, queries_per_batch=2)  # as the CLI above
  for pool, res in zip(pools, rr.rerank_records(pools)):
    row = next(r for r in per_query if r["system"] == "log" and r["qid"] == pool["id"])
    assert row["ranking"] == [pool["ctxs"][p]["id"] for p in res["passage_ranking"]][:K]


def test_cross_encoder_matches_torch(run):
  import torch

  tmp, _, pools, _, torch_model = run
  ce = baselines.CrossEncoder.from_pretrained(str(tmp / "ce"), max_len=256, batch_size=4)
  pairs = [(p["input"], baselines.passage_string(c)) for p in pools[:2] for c in p["ctxs"]]
  ours = ce.score_pairs(pairs)
  enc = ce.tokenizer([q for q, _ in pairs], [d for _, d in pairs], truncation="longest_first",
                     max_length=256, padding=True, return_tensors="pt")
  with torch.no_grad():
    ref = torch_model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits[:, 0].numpy()
  err = float(np.max(np.abs(ours - ref)))
  print(f"cross-encoder vs torch: max abs logit error {err:.3g}")
  # float32 on both sides, different summation orders (and a padded torch batch vs our length
  # buckets): the ModernBERT parity derivation of tests/test_convert_modernbert.py gives ~1e-5
  # on O(1) outputs; 1e-4 is above that (this checks the CLI's wiring, not the kernels).
  assert err <= 1e-4, err
  assert len(set(np.round(ours, 4).tolist())) > 1  # scores depend on the passage


def test_label_qrels_and_bad_pool_file(run, capsys):
  tmp, _, pools, qrels, _ = run
  tool = load_tool()
  # Without --qrels, relevance comes from the pools' `label` fields: the same judgements here.
  assert tool.label_qrels(tool.read_pools(str(tmp / "pools.jsonl"))) == qrels
  bad = tmp / "bad.jsonl"
  bad.write_text(json.dumps(pools[0]) + "\n" + json.dumps(dict(pools[1], ctxs=[])) + "\n")
  rc = tool.main(["--pools", str(bad), "--out-dir", str(tmp / "bad_eval"), "--no-progress"])
  assert rc == 1
  assert "bad.jsonl:2" in capsys.readouterr().err and not (tmp / "bad_eval").exists()


@pytest.mark.parametrize("pools_text, corpus_text, needle", [
    ('{"id": "q", "input": "x", "ctx_ids": ["a"]}\n', '{"id": "a", "text": "t"}\n{"id": ',
     "corpus.jsonl:2: malformed JSON"),
    ('{"id": "q", "input": "x", "ctx_ids": ["zz"]}\n', '{"id": "a", "text": "t"}\n',
     "pool 1: pool 'q': passage id 'zz' is not in the corpus"),
    ('{"id": "q", "input": "x", "ctx_ids": ["a"]}\n{oops\n', '{"id": "a", "text": "t"}\n',
     "pools.jsonl:2: malformed JSON"),
], ids=["corpus-line", "missing-id", "pool-line"])
def test_bad_id_only_pools_or_corpus_exit_1_with_one_line(tmp_path, capsys, pools_text,
                                                            corpus_text, needle):
  """--corpus: a malformed line of either file or an id the corpus lacks is one line naming it,
  exit status 1 (they were a bare JSONDecodeError traceback and a ConfigError)."""
  (tmp_path / "pools.jsonl").write_text(pools_text)
  (tmp_path / "corpus.jsonl").write_text(corpus_text)
  rc = load_tool().main(["--pools", str(tmp_path / "pools.jsonl"), "--corpus",
                         str(tmp_path / "corpus.jsonl"), "--out-dir", str(tmp_path / "eval"),
                         "--no-progress"])
  err = capsys.readouterr().err
  assert rc == 1 and needle in err and len(err.strip().splitlines()) == 1, err


def test_first_stage_system_and_paired_bootstrap(run, tmp_path):
  """--first-stage scores the pool order; the paired comparison is the per-query nDCG
  difference, its bootstrap interval holds the mean, and a rerun gives the same figures."""
  tmp, _, pools, qrels, _ = run
  args = ["--pools", str(tmp / "pools.jsonl"), "--qrels", str(tmp / "pools.qrels"), "--k", str(K),
          "--first-stage", "--paired-against", "first-stage", "--no-progress"]
  tool = load_tool()
  assert tool.main(args + ["--out-dir", str(tmp_path / "a")]) == 0
  assert tool.main(args + ["--out-dir", str(tmp_path / "b")]) == 0
  a = json.loads((tmp_path / "a" / "metrics.json").read_text())
  b = json.loads((tmp_path / "b" / "metrics.json").read_text())
  assert a["paired"] == b["paired"]
  order_run = {p["id"]: [c["id"] for c in p["ctxs"]] for p in pools}
  assert a["metrics"]["first-stage"] == rerank_metrics(order_run, qrels, k=K)
  rows = [json.loads(line) for line in (tmp_path / "a" / "per_query.jsonl").read_text().splitlines()]
  ndcg = {(r["system"], r["qid"]): r[f"ndcg@{K}"] for r in rows}
  diffs = [ndcg[("first-stage", q)] - ndcg[("bm25", q)] for q in sorted(qrels)]
  d = a["paired"]["systems"]["bm25"]
  assert d["mean"] == pytest.approx(np.mean(diffs), abs=1e-9)
  assert (d["wins"], d["losses"], d["ties"]) == (sum(x > 0 for x in diffs), sum(x < 0 for x in diffs),
                                                sum(x == 0 for x in diffs))
  assert d["low"] <= d["mean"] <= d["high"]


def test_paired_bootstrap_matches_a_numpy_percentile_bootstrap():
  tool = load_tool()
  rng = np.random.default_rng(0)
  a, b = rng.normal(50, 20, 60), rng.normal(45, 20, 60)
  got = tool.paired_comparison(a, b, resamples=10000)
  diff = a - b
  idx = np.random.default_rng(1).integers(0, len(diff), size=(10000, len(diff)))
  low, high = np.percentile(diff[idx].mean(axis=1), [2.5, 97.5])
  # Two independent Monte-Carlo estimates of the same percentiles: each endpoint's sampling
  # sd is sqrt(q(1-q)/R) / density ~ 0.027 standard errors of the mean at R = 10,000 (normal
  # bootstrap distribution, q = 0.025); 0.15 se is > 3.9 sd of the difference of two estimates.
  se = diff.std(ddof=1) / np.sqrt(len(diff))
  assert abs(got["low"] - low) < 0.15 * se and abs(got["high"] - high) < 0.15 * se
  assert got["mean"] == pytest.approx(diff.mean())
  same = tool.paired_comparison(np.ones(5), np.zeros(5))
  assert (same["low"], same["high"], same["wins"]) == (1.0, 1.0, 5)


def test_log_ranks_by_logits_and_unpooled_judged_queries_are_named(run, capsys):
  """LoG's run files hold each passage's best sentence LOGIT (local and final), so sure passages
  do not tie at float32's sigmoid 1.0; judged queries without a pool are left out of every
  metric (they averaged in as 0 before) and named on stderr and in metrics.json."""
  tmp, model, pools, qrels, _ = run
  extra = dict(qrels, **{"not-pooled-1": {"x"}, "not-pooled-2": {"y"}})
  write_qrels(str(tmp / "extra.qrels"), extra)
  out = tmp / "eval_logits"
  rc = load_tool().main([
      "--pools", str(tmp / "pools.jsonl"), "--qrels", str(tmp / "extra.qrels"),
      "--checkpoint", model, "--out-dir", str(out), "--k", str(K), "--row-len", "128",
      "--queries-per-batch", "2", "--no-compilation-cache", "--no-progress"])
  assert rc == 0
  err = capsys.readouterr().err
  assert "2 judged queries" in err and "not-pooled-1" in err, err
  m = json.loads((out / "metrics.json").read_text())
  assert m["judged_queries_without_pool"] == ["not-pooled-1", "not-pooled-2"]
  for name in ("log", "log-local"):  # the same figures as with the pools' own qrels
    assert m["metrics"][name] == rerank_metrics(run_from_scores(read_trec_run(
        str(out / f"run.{name}.trec"))), qrels, k=K)

  rr = inference.Reranker.from_pretrained(model, row_len=128, queries_per_batch=2)
  rr.engine.set_score_map("logit")
  scored = rr.score([parse_inference_record(p, f"pool {p['id']}") for p in pools])
  for name, which in (("log", "final"), ("log-local", "local_logit")):
    trec = read_trec_run(str(out / f"run.{name}.trec"))
    for p, res in zip(pools, scored):
      best = {}
      z = res.final_score if which == "final" else res.local_logit
      for node, pi in enumerate(res.node_passage):
        cid = p["ctxs"][int(pi)]["id"]
        best[cid] = max(best.get(cid, -np.inf), float(z[node]))
      # Written with repr-exact floats (read_trec_run round-trips them); the engine is the same
      # jitted program on the same inputs, so equality is exact.
      assert {c: trec[p["id"]][c] for c in best} == best
      # The local logits are the sigmoid's arguments: sigmoid(local_logit) == local_score (float32).
      np.testing.assert_allclose(1 / (1 + np.exp(-res.local_logit.astype(np.float64))),
                                 res.local_score, rtol=1e-6, atol=1e-7)
