"""Per-query latency of full LoG (staged, fused, engine) vs the passage cross-encoder; parameter
counts against the paper's Table 10.

Every suite returns a flat-ish dict of measured figures (JSON-serialisable). Timings are wall-clock
after a warm-up pass that compiles every shape, with `block_until_ready` (JAX) so asynchronous
dispatch is not mistaken for speed.
"""

import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from logrerank_bench.common import (PAPER_TABLE10, CompileCounter, clear_split_cache,
                                    device_peak_memory_gb, engine_rerank, global_logits,
                                    init_log_params, local_nodes, log_config, make_reranker,
                                    passage_query, pool_query, row_len_for)
from logrerank_bench.protocol import block, percentiles
from logrerank_jax.data.packing import PackingConfig, pack_queries
from logrerank_jax.models import log_reranker as lr
from logrerank_jax.models.encoders import modernbert as mb

# Per-query records timed by `pipeline_suite`, reported as percentiles under the name less "_s".
TIMED_KEYS = ("split_s", "pack_s", "host_s", "encoder_s", "global_s", "log_staged_s",
              "log_fused_s", "ce_host_s", "ce_device_s", "ce_s", "engine_s")


class PipelineQueries:
  """The jitted stages of LoG and of the cross-encoder on one shared encoder, and one timed query
  through each (`one_query`); `reranker` (the engine) is timed too when set."""

  def __init__(self, example_pool: dict, tokenizer, size: str, num_passages: Optional[int],
               dtype, fused: bool, row_buckets: Optional[Sequence[int]]):
    cfg = log_config(size, len(tokenizer), dtype)
    self.cfg, self.tokenizer, self.num_passages, self.fused = cfg, tokenizer, num_passages, fused
    self.pcfg = PackingConfig(row_len=row_len_for(size),
                              **({"row_buckets": tuple(row_buckets)} if row_buckets else {}))
    ex, _ = pack_queries([pool_query(example_pool, num_passages)], tokenizer, self.pcfg)
    self.params = init_log_params(cfg, ex)
    ce_cfg = cfg.local.encoder.replace(num_labels=1)
    # The cross-encoder shares LoG's encoder weights; only its pooling head is fresh.
    ce_head = mb.init_params(ce_cfg, jax.random.PRNGKey(1), classifier=True)
    self.ce_params = {"model": self.params["local"]["encoder"],
                      **{k: v for k, v in ce_head.items() if k != "model"}}
    self.local_fn = jax.jit(lambda p, b: local_nodes(cfg, p, b))
    self.global_fn = jax.jit(lambda p, nodes, npass, nmask: global_logits(cfg, p, nodes, npass,
                                                                          nmask))
    self.fused_fn = jax.jit(lambda p, b: lr.log_forward(p, b, cfg)["final_score"])
    ce_model = mb.ModernBertSequenceClassifier(ce_cfg)

    @jax.jit
    def ce_fn(p, b):
      nseg = 128  # static upper bound on sequences per row (1024 / shortest sequence)
      return ce_model.apply({"params": p}, b["input_ids"], b["attention_mask"], b["segment_ids"],
                            b["position_ids"], num_segments=nseg)

    self.ce_fn = ce_fn
    self.reranker = None

  def host_log(self, pool, rec=None):
    clear_split_cache()  # time the real split, not the lru cache of an earlier pass
    t0 = time.perf_counter()
    q = pool_query(pool, self.num_passages)
    t1 = time.perf_counter()
    b, info = pack_queries([q], self.tokenizer, self.pcfg)
    db = lr.device_batch(b)
    t2 = time.perf_counter()
    if rec is not None:
      rec.update(split_s=t1 - t0, pack_s=t2 - t1)
    return db, info, t2 - t0

  def host_ce(self, pool):
    t0 = time.perf_counter()
    b, info = pack_queries([passage_query(pool, self.num_passages)], self.tokenizer, self.pcfg)
    db = {k: jnp.asarray(getattr(b, k)) for k in ("input_ids", "attention_mask", "segment_ids",
                                                  "position_ids")}
    return db, info, time.perf_counter() - t0

  def one_query(self, pool):
    params = self.params
    rec = {}
    db, info, rec["host_s"] = self.host_log(pool, rec)
    t0 = time.perf_counter()
    nodes = block(self.local_fn(params["local"], db))
    t1 = time.perf_counter()
    block(self.global_fn(params["global"], nodes, db["node_passage"], db["node_mask"]))
    t3 = time.perf_counter()
    rec.update(encoder_s=t1 - t0, global_s=t3 - t1, real_tokens=info.real_tokens,
               nodes=int(np.sum(np.asarray(db["node_mask"]))))
    rec["log_staged_s"] = rec["host_s"] + t3 - t0
    if self.fused:
      db2, _, h2 = self.host_log(pool)
      t0 = time.perf_counter()
      block(self.fused_fn(params, db2))
      rec["log_fused_s"] = h2 + time.perf_counter() - t0
    cb, cinfo, rec["ce_host_s"] = self.host_ce(pool)
    t0 = time.perf_counter()
    block(self.ce_fn(self.ce_params, cb))
    rec["ce_device_s"] = time.perf_counter() - t0
    rec["ce_s"] = rec["ce_host_s"] + rec["ce_device_s"]
    rec["ce_real_tokens"] = cinfo.real_tokens
    if self.reranker is not None:
      clear_split_cache()
      t0 = time.perf_counter()
      engine_rerank(self.reranker, pool, self.num_passages)
      rec["engine_s"] = time.perf_counter() - t0
    return rec


def pipeline_suite(pools: Sequence[dict], tokenizer, size: str, num_passages: Optional[int] = None,
                   dtype=jnp.float32, fused: bool = True, engine: bool = True,
                   row_buckets: Optional[Sequence[int]] = None,
                   log: Callable[[str], None] = print) -> Dict[str, Any]:
  """Per-query latency of full LoG (staged, fused, engine) vs the passage cross-encoder.

  LoG per query = host (sentence splitting, tokenising, packing) + local scorer + graph build +
  GAT, each a separate jit timed with `block_until_ready`; `fused` also times one `log_forward`
  jit (what a batch engine runs). The cross-encoder packs `[CLS] q [SEP] passage [SEP]` with
  the same packer and encoder size and scores every segment. Every query shape is compiled in a
  warm-up pass first; latencies are from a second pass.
  """
  run = PipelineQueries(pools[0], tokenizer, size, num_passages, dtype, fused, row_buckets)
  if engine:
    run.reranker = make_reranker(run.params, run.cfg, tokenizer, run.pcfg)
  with CompileCounter() as cc:
    t0 = time.perf_counter()
    for pool in pools:
      run.one_query(pool)
    warm = time.perf_counter() - t0
  recs = [run.one_query(pool) for pool in pools]
  out: Dict[str, Any] = {"size": size, "dtype": str(jnp.dtype(dtype)), "queries": len(pools),
                         "passages_per_query": float(np.mean(
                             [len(p["ctxs"][:num_passages]) for p in pools])),
                         "nodes_per_query": float(np.mean([r["nodes"] for r in recs])),
                         "log_tokens_per_query": float(np.mean([r["real_tokens"] for r in recs])),
                         "ce_tokens_per_query": float(np.mean([r["ce_real_tokens"] for r in recs])),
                         "warmup_s": warm, "warmup_compilations": cc.count,
                         "engine_used": ("logrerank_jax.engine.Reranker (key 'engine')"
                                         if run.reranker else "staged jits + log_forward only")}
  log_key = "log_fused" if fused else "log_staged"
  pipeline_figures(out, recs, log_key, run.reranker is not None)
  mem = device_peak_memory_gb()
  if mem is not None:
    out["jax_peak_memory_gb"] = mem
  if size == "base":
    out["paper_latency_s_per_query"] = PAPER_TABLE10["latency_s_per_query"]
    out["paper_peak_memory_gb"] = PAPER_TABLE10["peak_memory_gb"]
  log(f"pipeline {size}: LoG p50 {out[log_key]['p50'] * 1e3:.1f} ms, CE p50 "
      f"{out['ce']['p50'] * 1e3:.1f} ms, ratio {out['log_vs_ce_p50']:.2f}")
  return out


def pipeline_figures(out: Dict[str, Any], recs: List[dict], log_key: str, engine: bool) -> None:
  """Add the per-stage percentiles and the LoG / cross-encoder ratios of `recs` to `out`."""
  for key in TIMED_KEYS:
    if key in recs[0]:
      out[key[:-2]] = percentiles([r[key] for r in recs])
  out["log_vs_ce_p50"] = out[log_key]["p50"] / out["ce"]["p50"]
  out["log_vs_ce_mean"] = out[log_key]["mean"] / out["ce"]["mean"]
  # Without sentence splitting (pre-split corpora, or splits cached across queries).
  out["log_presplit_vs_ce_mean"] = (out[log_key]["mean"] - out["split"]["mean"]) / out["ce"]["mean"]
  out["log_device_vs_ce_device_mean"] = (sum(out[k]["mean"] for k in ("encoder", "global"))
                                         / out["ce_device"]["mean"])
  if engine:
    out["engine_vs_ce_p50"] = out["engine"]["p50"] / out["ce"]["p50"]
    # End to end through the engine, one query per call (the latency case, no overlap).
    out["engine_queries_per_s"] = 1.0 / out["engine"]["mean"]
  out["host_ms_per_query"] = {k: out[k]["mean"] * 1e3 for k in ("split", "pack", "host")}
  total = sum(out[k]["mean"] for k in ("host", "encoder", "global"))
  out["time_split"] = {k: out[k]["mean"] / total for k in ("host", "encoder", "global")}
  out["log_tok_s"] = out["log_tokens_per_query"] / out[log_key]["mean"]


def params_suite() -> Dict[str, Any]:
  """Parameter counts of the paper-size model vs the paper's Table 10."""
  counts = lr.count_params(lr.LoGConfig.paper())
  out = {"ours": counts, "paper": {k: PAPER_TABLE10[k] for k in
                                   ("local_params", "global_params", "total_params")}}
  for ours, paper in (("local", "local_params"), ("global", "global_params"),
                      ("total", "total_params")):
    out[f"{ours}_rel_diff"] = counts[ours] / PAPER_TABLE10[paper] - 1.0
  return out
