"""Packed shapes: padding efficiency of our packing (and of the engine's defaults) against
pad-to-longest and pad-to-row-length, and the XLA compilations that varied query sizes cost.
"""

import time
from typing import Any, Callable, Dict, Optional, Sequence

import jax
import numpy as np

import logrerank_jax
from logrerank_bench.common import (CompileCounter, engine_rerank, init_log_params, log_config,
                                    make_reranker, packed_sequences, pool_query,
                                    random_tiny_model, row_len_for, truncate)
from logrerank_jax import engine as inference
from logrerank_jax.data.packing import PackingConfig, pack_queries
from logrerank_jax.models import log_reranker as lr


def packing_suite(pools: Sequence[dict], tokenizer, row_len: int = 1024,
                  num_passages: Optional[int] = None,
                  row_buckets: Optional[Sequence[int]] = None,
                  queries_per_batch: int = 1, engine: bool = True) -> Dict[str, Any]:
  """Padding efficiency (real / computed tokens) of our packing vs pad-to-longest and pad-to-1024.

  With `engine`, also the inference engine's own padding with its defaults (`engine_padding`).

  Queries are packed `queries_per_batch` at a time (1: one query per call, the latency case);
  pad-to-longest pads every (query, passage) sequence of a batch to that batch's longest one.
  """
  grow = {"query_buckets": (queries_per_batch,),
          "row_buckets": (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)}
  cfgs = {"packed": PackingConfig(row_len=row_len, **grow)}
  if row_buckets:
    cfgs["packed_fine_buckets"] = PackingConfig(
        row_len=row_len, **dict(grow, row_buckets=tuple(sorted(set(row_buckets) | {512}))))
  groups = [pools[i:i + queries_per_batch] for i in range(0, len(pools), queries_per_batch)]
  out: Dict[str, Any] = {"queries": len(pools), "row_len": row_len,
                         "queries_per_batch": queries_per_batch,
                         "row_buckets": list(cfgs["packed"].row_buckets)}
  tot = {"real": 0, "longest": 0, "fixed": 0}
  for name, pcfg in cfgs.items():
    computed = used = 0
    per_query = []
    for group in groups:
      b, info = pack_queries([pool_query(p, num_passages) for p in group], tokenizer, pcfg)
      computed += info.computed_tokens
      used += info.num_rows_used * row_len
      per_query.append(info.padding_efficiency)
      if name == "packed":
        lens = [len(s) for s in packed_sequences(b)]
        tot["real"] += info.real_tokens
        tot["longest"] += len(lens) * max(lens)
        tot["fixed"] += len(lens) * row_len
    out[f"{name}_efficiency"] = tot["real"] / computed
    out[f"{name}_rows_used_efficiency"] = tot["real"] / used
    out[f"{name}_min_batch_efficiency"] = float(min(per_query))
  out["real_tokens"] = tot["real"]
  out["pad_to_longest_efficiency"] = tot["real"] / tot["longest"]
  out[f"pad_to_{row_len}_efficiency"] = tot["real"] / tot["fixed"]
  if engine:
    out["engine"] = engine_padding(pools, tokenizer, row_len, num_passages)
  return out


def engine_padding(pools: Sequence[dict], tokenizer, row_len: int = 1024,
                   num_passages: Optional[int] = None) -> Dict[str, Any]:
  """Padding of the inference engine with every default (its row buckets, call planner and
  chunks), host work only (`Reranker.padding_plan`), for 1, 4 and all queries per rerank call.
  The engine needs params to exist; packing does not depend on them (a random tiny model)."""
  params, cfg = random_tiny_model(tokenizer, row_len=row_len)
  rr = logrerank_jax.Reranker(params, cfg, tokenizer,
                              packing=inference.default_packing_config(cfg, row_len=row_len))
  pools = [truncate(p, num_passages) for p in pools]
  out: Dict[str, Any] = {"row_buckets": list(rr.packing.row_buckets)}
  for key, per in (("1", 1), ("4", 4), ("all", max(len(pools), 1))):
    real = computed = 0
    shapes = set()
    for i in range(0, len(pools), per):
      plan = rr.padding_plan(pools[i:i + per])
      real, computed = real + plan["real_tokens"], computed + plan["computed_tokens"]
      shapes |= {tuple(x) for x in plan["shapes"]}
    out[f"queries_per_call_{key}"] = {"padding_efficiency": real / computed,
                                      "distinct_shapes": len(shapes)}
  return out


def recompile_suite(pools: Sequence[dict], tokenizer, size: str, num_queries: int = 100,
                    seed: int = 0, engine: bool = True,
                    log: Callable[[str], None] = print) -> Dict[str, Any]:
  """Compilations during warm-up and during a run of `num_queries` queries of varied sizes.

  Queries are the pools truncated to a random number of passages (1..pool size, fixed seed),
  run through the inference engine (`Reranker`, one query per call) when `engine`, else through
  `jit(log_forward)`. Warm-up runs one query per distinct bucket shape (R, S, N) that any
  truncation of the pools produces: shapes come from the packer's buckets, so a host-side pass
  lists them without touching the device. The run then counts every XLA compilation.
  """
  cfg = log_config(size, len(tokenizer))
  pcfg = PackingConfig(row_len=row_len_for(size))
  fwd = jax.jit(lambda p, b: lr.log_forward(p, b, cfg)["final_score"])
  ex, _ = pack_queries([pool_query(pools[0])], tokenizer, pcfg)
  params = init_log_params(cfg, ex)
  reranker = make_reranker(params, cfg, tokenizer, pcfg) if engine else None

  def run(pool, k):
    if reranker is not None:  # the whole engine: parse, split, pack, forward, context, format
      return engine_rerank(reranker, pool, k)
    b, _ = pack_queries([pool_query(pool, k)], tokenizer, pcfg)
    return np.asarray(fwd(params, lr.device_batch(b)))

  def shape_of(pool, k):
    b, _ = pack_queries([pool_query(pool, k)], tokenizer, pcfg)
    return (b.input_ids.shape[0], b.span_kind.shape[0], b.N)

  # Host-side pass: every bucket shape that any truncation of the pools can produce.
  warm_set = {}
  for pool in pools:
    for k in range(len(pool["ctxs"]), 0, -1):
      warm_set.setdefault(shape_of(pool, k), (pool, k))
  rng = np.random.RandomState(seed)
  plan = []
  for i in range(num_queries):
    pool = pools[i % len(pools)]
    plan.append((pool, int(rng.randint(1, len(pool["ctxs"]) + 1))))
  with CompileCounter() as warm:
    t0 = time.perf_counter()
    for pool, k in warm_set.values():
      run(pool, k)
    warm_s = time.perf_counter() - t0
  with CompileCounter() as after:
    t0 = time.perf_counter()
    for pool, k in plan:
      run(pool, k)
    run_s = time.perf_counter() - t0
  run_shapes = {shape_of(p, k) for p, k in plan}
  out = {"size": size, "warmup_shapes": len(warm_set), "warmup_compilations": warm.count,
         "warmup_compile_s": warm.seconds, "warmup_s": warm_s, "run_queries": num_queries,
         "run_distinct_shapes": len(run_shapes),
         "run_shapes_not_warmed": len(run_shapes - set(warm_set)),
         "run_compilations": after.count, "run_s": run_s,
         "engine_used": "logrerank_jax.engine.Reranker" if reranker else "jit(log_forward)"}
  if reranker is not None:
    out["engine_compile_stats"] = reranker.compile_stats()
  log(f"recompile {size}: warm-up {warm.count} compilations over {len(warm_set)} shapes, "
      f"{after.count} during {num_queries} queries")
  return out
