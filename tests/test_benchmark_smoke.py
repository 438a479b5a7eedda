"""Smoke tests of the benchmark suites at the tiniest sizes: each runs and reports its figures.

Speed is not asserted (shared CI CPUs); what is asserted is what must hold at any speed: the
torch peer really has the Flax encoder's weights (float32 max abs error <= 1e-5 on the same ids),
efficiencies are ratios in (0, 1] that order as the padding schemes imply, no recompilation after
the warm-up, and the JSON holds every documented key.
"""

import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from logrerank_bench import suites as bm
from logrerank_jax.data.packing import PackingConfig, pack_queries
from logrerank_jax.errors import ConfigError, DataError
from logrerank_jax.models import log_reranker as lr

REPO = pathlib.Path(__file__).resolve().parent.parent
DATA = pathlib.Path(__file__).parent / "data"
FILES = [str(DATA / "scifact_slice.jsonl"), str(DATA / "pubmed_slice.jsonl")]
# float32 torch vs Flax tiny encoder: ~4 eps x (depth + 2) x scale ~ 1e-5, derived in
# tests/test_modernbert_parity.py (same model family and sizes).
ATOL_PARITY = 1e-5


@pytest.fixture(scope="module")
def pools():
  """Two real queries (one SciFact, one PubMed) with 4-passage BM25 pools."""
  return bm.load_pools(FILES, pool_size=4, limit=1)


@pytest.fixture(scope="module")
def tokenizer(pools):
  return bm.benchmark_tokenizer(pools, vocab_size=512)


def _finite_positive(d, keys):
  for k in keys:
    assert np.isfinite(d[k]) and d[k] > 0, (k, d[k])


def test_packed_sequences_round_trip(pools, tokenizer):
  """The sequences recovered from packed rows are exactly the packer's, in creation order."""
  q = bm.pool_query(pools[0])
  batch, info = pack_queries([q], tokenizer, PackingConfig(row_len=128))
  seqs = bm.packed_sequences(batch)
  assert len(seqs) == info.num_sequences
  assert sum(len(s) for s in seqs) == info.real_tokens
  cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
  assert all(s[0] == cls_id and s[-1] == sep_id for s in seqs)
  ids, mask = bm.padded_batches(seqs, 3, tokenizer.pad_token_id)[0]
  assert ids.shape == (3, max(len(s) for s in seqs[:3]))
  np.testing.assert_array_equal(mask.sum(1), [len(s) for s in seqs[:3]])


@pytest.mark.parametrize("lens", [[10], [3, 200]], ids=["one_short", "short_and_windowed"])
def test_encoder_flops_known_answer(lens):
  """Weights term + attention term, checked against a direct count."""
  cfg = bm.encoder_config("tiny", 512)
  d, f, half = cfg.hidden_size, cfg.intermediate_size, cfg.local_attention // 2
  want = 2.0 * (4 * d * d + 3 * d * f) * cfg.num_hidden_layers * sum(lens)
  for kind in cfg.layer_types:
    for n in lens:
      pairs = sum(1 for i in range(n) for j in range(n)
                  if kind == "full_attention" or abs(i - j) <= half)
      want += 4.0 * d * pairs
  assert bm.encoder_flops(cfg, lens) == pytest.approx(want, rel=1e-12)


def test_encoder_suite_tiny_smoke():
  """The interleaved encoder suite on one query of two passages: figures exist, every contender
  saw the same sequences, Flax matched torch, and the load was recorded. No speed is asserted."""
  from logrerank_bench import encoder
  out = encoder.encoder_suite(size="tiny", reps=5, impls=("xla",), queries=1, passages=2,
                              torch_batch_sizes=(8,), log=lambda _: None)
  r = out["ratio_vs_torch"]
  assert 0 < r["min"] <= r["median"] <= r["max"] and math.isfinite(r["max"])
  assert out["strongest_torch"].startswith("torch_sorted_bs")
  assert max(out["max_abs_err_vs_torch"].values()) <= ATOL_PARITY, out["max_abs_err_vs_torch"]
  assert isinstance(out["load"]["reliable"], bool) and len(out["load"]["loadavg_before"]) == 3
  assert 0 < out["padding_efficiency"] <= 1
  # The attention-free floor is timed and reported as a ceiling, never as the Flax result.
  assert out["best_flax"] != encoder.FLOOR and encoder.FLOOR in out["tokens_per_s"]
  c = out["ratio_ceiling_vs_torch"]
  assert 0 < c["min"] <= c["median"] <= c["max"] and math.isfinite(c["max"])


def test_kernels_suite_tiny_smoke():
  """Dense and attention kernels of both frameworks timed on the same inputs; the attention
  outputs agree (float32: the same logits and softmax in another order, <= 1e-5)."""
  from logrerank_bench import kernel_suite as encoder
  out = encoder.kernels_suite(size="tiny", reps=5, queries=1, passages=2, log=lambda _: None)
  assert set(out["xla_over_torch_time"]) == {
      "dense_float32", "dense_bfloat16", "attention_global", "attention_global_grad",
      "attention_window", "attention_window_grad"}
  assert all(0 < v < math.inf for v in out["xla_over_torch_time"].values())
  assert max(out["attention_max_abs_err_vs_torch"].values()) <= 1e-5, out


@pytest.mark.parametrize("impl", ["tiled", "xla", "blocked"])
def test_attention_free_floor_mixes_no_tokens(impl):
  """The floor really has no attention, whichever kernel the config picks: changing one token
  changes no other token's output, while the same encoder compiled normally mixes it into every
  token of its sequence."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from logrerank_bench import encoder
  from logrerank_jax.models.encoders.modernbert import ModernBertEncoder
  cfg = bm.encoder_config("tiny", 64).replace(attention_impl=impl)
  enc = ModernBertEncoder(cfg)
  ids = jnp.arange(4, 20, dtype=jnp.int32)[None]  # one 16-token sequence
  params = enc.init(jax.random.PRNGKey(0), ids)["params"]
  fwd = lambda p, x: enc.apply({"params": p}, x)
  floor = encoder.attention_free_forward(fwd, params, ids)
  other = ids.at[0, 5].set(30)
  for run, mixes in ((floor, False), (jax.jit(fwd), True)):
    changed = np.abs(np.asarray(run(params, other)) - np.asarray(run(params, ids))).max(-1)[0]
    assert changed[5] > 0
    rest = np.delete(changed, 5)
    assert (rest.min() > 0) if mixes else (rest.max() == 0), (mixes, rest)


def test_train_step_suite_tiny_smoke():
  from logrerank_bench import train_step as encoder
  out = encoder.train_step_suite(size="tiny", reps=5, queries=1, passages=2, log=lambda _: None)
  for key in ("ratio_vs_torch", "ratio_ceiling_vs_torch"):
    r = out[key]
    assert 0 < r["min"] <= r["median"] <= r["max"] and math.isfinite(r["max"]), key
  assert isinstance(out["load"]["reliable"], bool)


def test_pipeline_suite_tiny(pools, tokenizer):
  pools = pools[:1]  # one shape to compile per jit
  # fused=False: the engine already runs the one-jit forward; skipping it saves a compilation.
  out = bm.pipeline_suite(pools, tokenizer, "tiny", fused=False, log=lambda _: None)
  assert "log_fused" not in out
  for k in ("split", "pack", "host", "encoder", "global", "log_staged", "ce", "engine"):
    assert out[k]["n"] == len(pools) and 0 < out[k]["p50"] <= out[k]["p95"], k
  assert out["log_vs_ce_p50"] > 0 and out["engine_vs_ce_p50"] > 0
  assert out["engine_queries_per_s"] == pytest.approx(1.0 / out["engine"]["mean"])
  host = out["host_ms_per_query"]
  assert host["host"] == pytest.approx(host["split"] + host["pack"], rel=1e-6) and host["split"] > 0
  assert sum(out["time_split"].values()) == pytest.approx(1.0)
  assert out["nodes_per_query"] > len(pools[0]["ctxs"]) - 1


def test_packing_suite_orders_schemes(pools, tokenizer):
  out = bm.packing_suite(pools, tokenizer, row_len=128, row_buckets=tuple(range(1, 129)))
  for k in ("packed_efficiency", "packed_rows_used_efficiency", "packed_fine_buckets_efficiency",
            "pad_to_longest_efficiency", "pad_to_128_efficiency"):
    assert 0 < out[k] <= 1, k
  # Exact buckets only drop bucket padding; fixed-length padding can never beat pad-to-longest.
  assert out["packed_fine_buckets_efficiency"] == pytest.approx(out["packed_rows_used_efficiency"])
  assert out["packed_efficiency"] <= out["packed_fine_buckets_efficiency"]
  assert out["pad_to_128_efficiency"] <= out["pad_to_longest_efficiency"]
  # The engine's own padding (defaults, host-only plan): more queries per call pack no worse
  # here, and every figure is a real fraction.
  eng = out["engine"]
  effs = [eng[f"queries_per_call_{k}"]["padding_efficiency"] for k in ("1", "4", "all")]
  assert all(0 < e <= 1 for e in effs) and eng["row_buckets"][-1] == 128


def test_recompile_suite_no_recompilation_after_warmup(pools, tokenizer):
  out = bm.recompile_suite(pools[:1], tokenizer, "tiny", num_queries=6, log=lambda _: None)
  assert out["warmup_compilations"] >= out["warmup_shapes"] >= 1
  assert out["run_shapes_not_warmed"] == 0
  assert out["run_compilations"] == 0


def test_cache_suite_tiny(tokenizer):
  out = bm.cache_suite(str(REPO / "logrerank_jax" / "demo_data" / "train.jsonl"), tokenizer,
                       "tiny", group_size=2, reps=1, limit=2, log=lambda _: None)
  assert out["queries"] == 2 and out["batches"] == 1
  _finite_positive(out, ["cached_epoch_s", "recomputed_epoch_s", "speedup"])


def test_params_suite_matches_count_params():
  out = bm.params_suite()
  assert out["ours"] == lr.count_params(lr.LoGConfig.paper())
  assert out["total_rel_diff"] == pytest.approx(out["ours"]["total"] / 152.52e6 - 1.0)


@pytest.mark.parametrize("bad, err", [
    (dict(size="huge"), ConfigError), (dict(paths=["/nonexistent.jsonl"]), DataError)],
    ids=["unknown_size", "missing_file"])
def test_bad_input_raises(bad, err):
  with pytest.raises(err):
    if "size" in bad:
      bm.encoder_config(bad["size"], 512)
    else:
      bm.load_pools(bad["paths"])


def test_cli_writes_json(tmp_path):
  """The CLI runs in its own process (it pins threads) and writes machine + suite figures."""
  path = tmp_path / "bench.json"
  proc = subprocess.run(
      [sys.executable, str(REPO / "tools" / "benchmark.py"), "--suite", "params,packing",
       "--size", "tiny", "--passages", "4", "--threads", "1", "--json", str(path)],
      capture_output=True, text=True, timeout=120, cwd=REPO,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  out = json.loads(path.read_text())
  assert out["machine"]["threads"] == 1 and out["machine"]["torch_threads"] == 1
  assert {"jax", "torch", "transformers", "cpu_affinity"} <= set(out["machine"])
  assert out["machine"]["cpu_affinity"] == 1
  assert 0 < out["packing"]["packed_efficiency"] <= 1
  assert out["params"]["ours"]["total"] > 1e8


def test_attention_work_suite_tiny(pools, tokenizer):
  """attention_work_efficiency per path on real packed pools: ratios in (0, 1]; the block-
  skipping kernel computes less than the full-row paths and no more at smaller blocks; the
  JSON's summary names every path, the kernels' defaults under their own names."""
  from logrerank_bench import attention_work  # pylint: disable=g-import-not-at-top
  out = attention_work.attention_work_suite(pools, tokenizer, "tiny", row_lens=(128, 256),
                                            pallas_blocks=(16, 32), log=lambda _: None)
  eff = out["attention_work_efficiency"]
  assert {"xla", "blocked", "tiled", "pallas_gpu", "pallas_gpu_b16", "pallas_gpu_b32",
          "splash_tpu", "splash_tpu_b128"} <= set(eff)
  assert eff["pallas_gpu"] == eff["pallas_gpu_b32"] and out["row_len"] == 128
  for res in out["by_row_len"].values():
    paths = res["paths"]
    for name, p in paths.items():
      for key in ("global", "window", "model", "model_used_rows"):
        assert 0 < p[key] <= 1, (name, key, p[key])
      assert p["model"] <= p["model_used_rows"] + 1e-12, name  # bucket rows only add work
    computed = lambda name, kind: paths[name]["computed_pairs"][kind]
    for kind in ("global", "window"):
      assert computed("pallas_gpu_b16", kind) <= computed("pallas_gpu_b32", kind)
      assert computed("pallas_gpu_b32", kind) < computed("xla", kind)
