"""Benchmark suites: Flax vs PyTorch encoder, LoG pipeline, packing, recompiles, cache, params.

Every suite returns a flat-ish dict of measured figures (JSON-serialisable). Timings are wall-clock
medians after warm-up, with `block_until_ready` (JAX) so asynchronous dispatch is not mistaken for
speed. The PyTorch peer is transformers' `ModernBertModel` with the same config and the same random
weights (converted with `modernbert_params_from_torch`), fed the same token ids.

Thread counts are set by the caller *before* JAX/torch start (see `tools/benchmark.py`): the
process CPU affinity bounds XLA's CPU thread pool, and `torch.set_num_threads` bounds torch's.
"""

import dataclasses
import json
import os
import platform
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from logrerank_bench.protocol import block
from logrerank_jax.convert import modernbert_params_from_torch
from logrerank_jax.data import sentences
from logrerank_jax.data.packing import PackingConfig, QueryInput, pack_queries
from logrerank_jax.datasets.pools import build_eval_pools
from logrerank_jax.data.records import validate_training_file
from logrerank_jax.datasets.scholarqabench import read_scholarqabench
from logrerank_jax.data.sentences import split_sentence_texts
from logrerank_jax.data.tokenization import train_wordpiece_tokenizer
from logrerank_jax.errors import ConfigError, DataError, LogRerankError
import logrerank_jax
from logrerank_jax import engine as inference
from logrerank_jax import losses
from logrerank_jax.models import log_reranker as lr
from logrerank_jax.models.encoders import modernbert as mb

# Paper, Table 10 (inference on one GPU, 50 passages per query).
PAPER_TABLE10 = {"local_params": 149.85e6, "global_params": 2.67e6, "total_params": 152.52e6,
                 "latency_s_per_query": 2.426, "peak_memory_gb": 3.21}
# Datasheet dense bf16 peak of an H100/H200 SXM (TFLOP/s); MFU is stated against this.
PEAK_TFLOPS = {"h200": 989.0, "h100": 989.0}
SIZES = ("tiny", "small", "base")
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


# ----------------------------------------------------------------------------- environment

def machine_info(threads: Optional[int] = None) -> Dict[str, Any]:
  """Record the machine, library versions and thread settings of this run."""
  info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
          "python": platform.python_version(), "cpu_count": os.cpu_count(),
          "cpu_affinity": (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                           else None),
          "jax": jax.__version__, "flax": flax.__version__, "jax_backend": jax.default_backend(),
          "jax_devices": [str(d.device_kind) for d in jax.devices()],
          "xla_flags": os.environ.get("XLA_FLAGS", ""), "threads": threads,
          # Other processes on the machine skew CPU timings; record how busy it was.
          "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    info.update(torch=torch.__version__, transformers=transformers.__version__,
                torch_threads=torch.get_num_threads(),
                torch_cuda=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
  except ImportError:
    info.update(torch=None, transformers=None)
  return info


def timed(fn: Callable[[], Any], reps: int = 3, warmup: int = 1) -> float:
  """Return the median wall time (s) of `fn()` over `reps` runs after `warmup` runs."""
  for _ in range(warmup):
    block(fn())
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    block(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def percentiles(values: Sequence[float]) -> Dict[str, float]:
  """p50 / p95 / mean of a list of seconds."""
  v = np.asarray(values, np.float64)
  return {"p50": float(np.percentile(v, 50)), "p95": float(np.percentile(v, 95)),
          "mean": float(v.mean()), "n": int(v.size)}


class CompileCounter:
  """Count XLA backend compilations (cache hits of the persistent cache are not compilations)."""

  def __init__(self):
    self.count = 0
    self.seconds = 0.0

  def _listener(self, event, duration, **_):
    if event == BACKEND_COMPILE_EVENT:
      self.count += 1
      self.seconds += duration

  def __enter__(self):
    jax.monitoring.register_event_duration_secs_listener(self._listener)
    return self

  def __exit__(self, *exc):
    try:
      jax.monitoring.unregister_event_duration_listener(self._listener)
    except (AttributeError, ValueError):  # older/newer JAX: clear rather than leave it counting
      jax.monitoring.clear_event_listeners()


# ----------------------------------------------------------------------------- data

def load_pools(paths: Sequence[str], pool_size: int = 50, limit: Optional[int] = None
               ) -> List[dict]:
  """Build BM25 pools (`build_eval_pools`) from ScholarQABench files, concatenated.

  Args:
    paths: ScholarQABench single-paper JSONL files (the slices in tests/data, or the full files).
    pool_size: passages per query (smaller when a file's corpus is smaller).
    limit: queries kept per file (None: all).

  Returns:
    OpenScholar-style pool records.
  """
  if not paths:
    raise ConfigError("load_pools needs at least one ScholarQABench file")
  pools = []
  for p in paths:
    if not os.path.exists(p):
      raise DataError(f"benchmark data file not found: {p}")
    pools += build_eval_pools(read_scholarqabench(p), pool_size=pool_size, limit=limit)[0]
  return pools


def pool_query(pool: dict, num_passages: Optional[int] = None) -> QueryInput:
  """Split a pool's passage texts into sentences (the host-side work of LoG, as the engine does)."""
  ctxs = pool["ctxs"][:num_passages]
  return QueryInput(pool["input"], [split_sentence_texts(c["text"]) or [c["title"] or "(empty)"]
                                    for c in ctxs])


def passage_query(pool: dict, num_passages: Optional[int] = None) -> QueryInput:
  """One 'sentence' per passage: the cross-encoder's `[CLS] q [SEP] passage [SEP]` input."""
  ctxs = pool["ctxs"][:num_passages]
  return QueryInput(pool["input"], [[c["text"] or c["title"] or "(empty)"] for c in ctxs])


def benchmark_tokenizer(pools: Sequence[dict], vocab_size: int = 4096):
  """A deterministic WordPiece tokenizer trained on the pools' text (lengths realistic for BERT)."""
  texts = [p["input"] for p in pools] + [c["text"] for p in pools for c in p["ctxs"]]
  return train_wordpiece_tokenizer(texts, vocab_size)


def packed_sequences(batch) -> List[np.ndarray]:
  """Recover the sequences of a packed batch, in creation order (what torch gets padded)."""
  seqs = []
  for r in range(batch.input_ids.shape[0]):
    seg = batch.segment_ids[r]
    for s in range(1, int(seg.max()) + 1):
      idx = np.nonzero(seg == s)[0]
      # The token after [CLS] is the query span; spans are numbered in creation order.
      seqs.append((int(batch.span_ids[r, idx[1]]), batch.input_ids[r, idx]))
  return [ids for _, ids in sorted(seqs, key=lambda t: t[0])]


def padded_batches(seqs: Sequence[np.ndarray], batch_size: int, pad_id: int,
                   pad_to: Optional[int] = None):
  """Cut sequences (in order) into batches padded to their longest (or to `pad_to`)."""
  out = []
  for i in range(0, len(seqs), batch_size):
    chunk = seqs[i:i + batch_size]
    length = pad_to or max(len(s) for s in chunk)
    ids = np.full((len(chunk), length), pad_id, np.int64)
    mask = np.zeros((len(chunk), length), np.int64)
    for j, s in enumerate(chunk):
      ids[j, :len(s)] = s
      mask[j, :len(s)] = 1
    out.append((ids, mask))
  return out


# ----------------------------------------------------------------------------- model sizes

def encoder_config(size: str, vocab_size: int, dtype=jnp.float32, attention_impl: str = "xla"
                   ) -> mb.ModernBertConfig:
  """Encoder of a benchmark size: 'base' = ModernBERT-base; 'small'/'tiny' shrink it."""
  base = mb.ModernBertConfig.from_hf(dict(lr.MODERNBERT_BASE_HF))
  if size == "base":
    cfg = base.replace(vocab_size=max(vocab_size, base.vocab_size))
  elif size == "small":
    # Same layer pattern and 128-token window as base; narrower and shallower for 2 CPU cores.
    cfg = base.replace(vocab_size=vocab_size, hidden_size=256, intermediate_size=384,
                       num_hidden_layers=4, num_attention_heads=4, layer_types=None, pad_token_id=0)
  elif size == "tiny":
    cfg = base.replace(vocab_size=vocab_size, hidden_size=32, intermediate_size=48,
                       num_hidden_layers=3, num_attention_heads=2, local_attention=16,
                       global_attn_every_n_layers=2, layer_types=None, pad_token_id=0)
  else:
    raise ConfigError(f"unknown benchmark size {size!r}; known: {SIZES}")
  return cfg.replace(dtype=dtype, attention_impl=attention_impl)


def log_config(size: str, vocab_size: int, dtype=jnp.float32, attention_impl: str = "xla"
               ) -> lr.LoGConfig:
  """Full LoG config of a benchmark size (paper graph/heads for small and base)."""
  enc = encoder_config(size, vocab_size, dtype, attention_impl)
  if size == "tiny":
    cfg = lr.LoGConfig.tiny(vocab_size)
  else:
    cfg = lr.LoGConfig.paper()
  local = dataclasses.replace(cfg.local, encoder=enc, g_dim=enc.hidden_size)
  return dataclasses.replace(cfg, local=local, graph_reranker=dataclasses.replace(
      cfg.graph_reranker, d_enc=enc.hidden_size))


def row_len_for(size: str) -> int:
  """Packed row length: the paper's 1,024 except for the tiny smoke size."""
  return 128 if size == "tiny" else 1024


def encoder_flops(cfg: mb.ModernBertConfig, seq_lens: Sequence[int]) -> float:
  """Useful forward FLOPs of the encoder on sequences of these lengths (no padding, no masking).

  2 FLOPs per multiply-add of every non-embedding weight per token, plus QK^T and AV over each
  token's real context (the sequence for global layers, the symmetric window for local ones).
  """
  d, f = cfg.hidden_size, cfg.intermediate_size
  per_layer_weights = d * 3 * d + d * d + d * 2 * f + f * d
  tokens = float(sum(seq_lens))
  total = 2.0 * per_layer_weights * cfg.num_hidden_layers * tokens
  half = cfg.local_attention // 2
  for kind in cfg.layer_types:
    for n in seq_lens:
      if kind == mb.FULL_ATTENTION:
        ctx = float(n) * n
      else:  # keys within +-half of each query, clipped at the sequence ends
        i = np.arange(n)
        ctx = float(np.sum(np.minimum(i + half, n - 1) - np.maximum(i - half, 0) + 1))
      total += 4.0 * d * ctx
  return total


def peak_tflops() -> Optional[float]:
  """Datasheet bf16 peak of the first accelerator, if it is a known one."""
  kind = jax.devices()[0].device_kind.lower()
  for name, tf in PEAK_TFLOPS.items():
    if name in kind:
      return tf
  return None


def device_peak_memory_gb() -> Optional[float]:
  """Peak bytes in use on JAX's first device (None where the backend does not report it)."""
  stats = jax.devices()[0].memory_stats() or {}
  peak = stats.get("peak_bytes_in_use")
  return None if peak is None else peak / 1e9


# ----------------------------------------------------------------------------- torch peer

def torch_peer(cfg: mb.ModernBertConfig, seed: int = 0, device: str = "cpu", bf16: bool = False):
  """A transformers ModernBertModel with `cfg` and random weights, and the same weights for Flax.

  Returns:
    (torch model in eval mode, Flax encoder params).
  """
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  torch.manual_seed(seed)
  hf = dict(cfg.to_hf_dict())
  hf.update(bos_token_id=None, eos_token_id=None, cls_token_id=None, sep_token_id=None)
  tcfg = transformers.ModernBertConfig(**hf)
  model = transformers.ModernBertModel(tcfg).eval()
  sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
  params = jax.tree_util.tree_map(jnp.asarray, modernbert_params_from_torch(sd, cfg))
  if bf16:
    model = model.to(torch.bfloat16)
  return model.to(device), params


# ----------------------------------------------------------------------------- suites

def _local_nodes(cfg: lr.LoGConfig, params_local, b):
  """The local stage through the model's entry point: per-node features [Q, N, ...]."""
  nodes = lr.LoGReranker(cfg).apply({"params": {"local": params_local}}, b, True,
                                    method=lr.LoGReranker.local_nodes)
  return {k: nodes[k] for k in ("h", "role_probs", "local_score")}


def _global_logits(cfg: lr.LoGConfig, params_global, nodes, node_passage, node_mask):
  """The global stage (graph build + GAT) through the model's entry point: logits [Q, N]."""
  return lr.LoGReranker(cfg).apply({"params": {"global": params_global}}, nodes, node_passage,
                                   node_mask, True, method=lr.LoGReranker.global_logits)[0]


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
  cfg = log_config(size, len(tokenizer), dtype)
  pcfg = PackingConfig(row_len=row_len_for(size),
                       **({"row_buckets": tuple(row_buckets)} if row_buckets else {}))
  ex, _ = pack_queries([pool_query(pools[0], num_passages)], tokenizer, pcfg)
  params = init_log_params(cfg, ex)
  ce_cfg = cfg.local.encoder.replace(num_labels=1)
  # The cross-encoder shares LoG's encoder weights; only its pooling head is fresh.
  ce_head = mb.init_params(ce_cfg, jax.random.PRNGKey(1), classifier=True)
  ce_params = {"model": params["local"]["encoder"],
               **{k: v for k, v in ce_head.items() if k != "model"}}
  local_fn = jax.jit(lambda p, b: _local_nodes(cfg, p, b))
  global_fn = jax.jit(lambda p, nodes, npass, nmask: _global_logits(cfg, p, nodes, npass, nmask))
  fused_fn = jax.jit(lambda p, b: lr.log_forward(p, b, cfg)["final_score"])
  ce_model = mb.ModernBertSequenceClassifier(ce_cfg)

  @jax.jit
  def ce_fn(p, b):
    nseg = 128  # static upper bound on sequences per row (1024 / shortest sequence)
    return ce_model.apply({"params": p}, b["input_ids"], b["attention_mask"], b["segment_ids"],
                          b["position_ids"], num_segments=nseg)

  def host_log(pool, rec=None):
    _clear_split_cache()  # time the real split, not the lru cache of an earlier pass
    t0 = time.perf_counter()
    q = pool_query(pool, num_passages)
    t1 = time.perf_counter()
    b, info = pack_queries([q], tokenizer, pcfg)
    db = lr.device_batch(b)
    t2 = time.perf_counter()
    if rec is not None:
      rec.update(split_s=t1 - t0, pack_s=t2 - t1)
    return db, info, t2 - t0

  def host_ce(pool):
    t0 = time.perf_counter()
    b, info = pack_queries([passage_query(pool, num_passages)], tokenizer, pcfg)
    db = {k: jnp.asarray(getattr(b, k)) for k in ("input_ids", "attention_mask", "segment_ids",
                                                  "position_ids")}
    return db, info, time.perf_counter() - t0

  def one_query(pool):
    rec = {}
    db, info, rec["host_s"] = host_log(pool, rec)
    t0 = time.perf_counter()
    nodes = block(local_fn(params["local"], db))
    t1 = time.perf_counter()
    block(global_fn(params["global"], nodes, db["node_passage"], db["node_mask"]))
    t3 = time.perf_counter()
    rec.update(encoder_s=t1 - t0, global_s=t3 - t1, real_tokens=info.real_tokens,
               nodes=int(np.sum(np.asarray(db["node_mask"]))))
    rec["log_staged_s"] = rec["host_s"] + t3 - t0
    if fused:
      db2, _, h2 = host_log(pool)
      t0 = time.perf_counter()
      block(fused_fn(params, db2))
      rec["log_fused_s"] = h2 + time.perf_counter() - t0
    cb, cinfo, rec["ce_host_s"] = host_ce(pool)
    t0 = time.perf_counter()
    block(ce_fn(ce_params, cb))
    rec["ce_device_s"] = time.perf_counter() - t0
    rec["ce_s"] = rec["ce_host_s"] + rec["ce_device_s"]
    rec["ce_real_tokens"] = cinfo.real_tokens
    if reranker is not None:
      _clear_split_cache()
      t0 = time.perf_counter()
      engine_rerank(reranker, pool, num_passages)
      rec["engine_s"] = time.perf_counter() - t0
    return rec

  reranker = None
  if engine:
    reranker = make_reranker(params, cfg, tokenizer, pcfg)
  with CompileCounter() as cc:
    t0 = time.perf_counter()
    for pool in pools:
      one_query(pool)
    warm = time.perf_counter() - t0
  recs = [one_query(pool) for pool in pools]
  out: Dict[str, Any] = {"size": size, "dtype": str(jnp.dtype(dtype)), "queries": len(pools),
                         "passages_per_query": float(np.mean(
                             [len(p["ctxs"][:num_passages]) for p in pools])),
                         "nodes_per_query": float(np.mean([r["nodes"] for r in recs])),
                         "log_tokens_per_query": float(np.mean([r["real_tokens"] for r in recs])),
                         "ce_tokens_per_query": float(np.mean([r["ce_real_tokens"] for r in recs])),
                         "warmup_s": warm, "warmup_compilations": cc.count,
                         "engine_used": ("logrerank_jax.engine.Reranker (key 'engine')"
                                         if reranker else "staged jits + log_forward only")}
  for key in ("split_s", "pack_s", "host_s", "encoder_s", "global_s", "log_staged_s",
              "log_fused_s", "ce_host_s", "ce_device_s", "ce_s", "engine_s"):
    if key in recs[0]:
      out[key[:-2]] = percentiles([r[key] for r in recs])
  log_key = "log_fused" if fused else "log_staged"
  out["log_vs_ce_p50"] = out[log_key]["p50"] / out["ce"]["p50"]
  out["log_vs_ce_mean"] = out[log_key]["mean"] / out["ce"]["mean"]
  # Without sentence splitting (pre-split corpora, or splits cached across queries).
  out["log_presplit_vs_ce_mean"] = (out[log_key]["mean"] - out["split"]["mean"]) / out["ce"]["mean"]
  out["log_device_vs_ce_device_mean"] = (sum(out[k]["mean"] for k in ("encoder", "global"))
                                         / out["ce_device"]["mean"])
  if reranker is not None:
    out["engine_vs_ce_p50"] = out["engine"]["p50"] / out["ce"]["p50"]
    # End to end through the engine, one query per call (the latency case, no overlap).
    out["engine_queries_per_s"] = 1.0 / out["engine"]["mean"]
  out["host_ms_per_query"] = {k: out[k]["mean"] * 1e3 for k in ("split", "pack", "host")}
  total = sum(out[k]["mean"] for k in ("host", "encoder", "global"))
  out["time_split"] = {k: out[k]["mean"] / total for k in ("host", "encoder", "global")}
  out["log_tok_s"] = out["log_tokens_per_query"] / out[log_key]["mean"]
  mem = device_peak_memory_gb()
  if mem is not None:
    out["jax_peak_memory_gb"] = mem
  if size == "base":
    out["paper_latency_s_per_query"] = PAPER_TABLE10["latency_s_per_query"]
    out["paper_peak_memory_gb"] = PAPER_TABLE10["peak_memory_gb"]
  log(f"pipeline {size}: LoG p50 {out[log_key]['p50'] * 1e3:.1f} ms, CE p50 "
      f"{out['ce']['p50'] * 1e3:.1f} ms, ratio {out['log_vs_ce_p50']:.2f}")
  return out


def _clear_split_cache():
  """Forget cached sentence splits, so the host-side split is timed for real."""
  sentences.clear_cache()


def _truncate(pool: dict, k: Optional[int]) -> dict:
  """The pool with only its first k passages."""
  return dict(pool, ctxs=pool["ctxs"][:k])


def make_reranker(params, cfg: lr.LoGConfig, tokenizer, pcfg: PackingConfig):
  """The project's inference engine (`logrerank_jax.Reranker`, one query per call)."""
  return logrerank_jax.Reranker(params, cfg, tokenizer, packing=pcfg, queries_per_batch=1)


def engine_rerank(reranker, pool: dict, k: Optional[int]) -> dict:
  """Rerank one pool (first k passages) with the engine; its `error` output is raised, not kept."""
  res = reranker.rerank_records([_truncate(pool, k)])[0]
  if res.get("error"):
    raise LogRerankError(f"inference engine failed on query {pool.get('id')}: {res['error']}")
  return res


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


def init_log_params(cfg: lr.LoGConfig, example, seed: int = 0):
  """LoG params for `cfg`, initialised (jitted) on an example batch's shapes.

  Jitted because eager flax init of the full model takes several times longer on CPU, and with
  the example an argument: closed over, its arrays become constants that XLA spends most of the
  compile folding (the values depend only on the key and the shapes either way)."""
  return jax.jit(lambda key, ex: lr.init_params(cfg, ex, key))(jax.random.PRNGKey(seed),
                                                                lr.device_batch(example))


def random_tiny_model(tokenizer, seed: int = 0, row_len: Optional[int] = None,
                      **encoder_overrides):
  """A randomly initialised tiny LoG model for `tokenizer`'s vocabulary: (params, LoGConfig).

  What the engine needs to plan and pack real text when no trained weights matter (packing does
  not depend on them); the tests' tiny model folders (tests/test_inference.make_tiny_model) are
  this model saved. `row_len` grows the encoder's positions to rows that long;
  `encoder_overrides` replace encoder config fields (e.g. `num_hidden_layers=1` where only the
  packing is measured and the forward is cost alone).
  """
  cfg = lr.LoGConfig.tiny(vocab_size=len(tokenizer))
  enc = cfg.local.encoder.replace(**encoder_overrides)
  if row_len:
    enc = enc.replace(max_position_embeddings=max(row_len, enc.max_position_embeddings))
  if enc != cfg.local.encoder:
    cfg = dataclasses.replace(cfg, local=dataclasses.replace(cfg.local, encoder=enc))
  ex, _ = pack_queries([QueryInput("q", [["a b", "c"]])], tokenizer, PackingConfig(row_len=128))
  return init_log_params(cfg, ex, seed), cfg


def engine_padding(pools: Sequence[dict], tokenizer, row_len: int = 1024,
                   num_passages: Optional[int] = None) -> Dict[str, Any]:
  """Padding of the inference engine with every default (its row buckets, call planner and
  chunks), host work only (`Reranker.padding_plan`), for 1, 4 and all queries per rerank call.
  The engine needs params to exist; packing does not depend on them (a random tiny model)."""
  params, cfg = random_tiny_model(tokenizer, row_len=row_len)
  rr = logrerank_jax.Reranker(params, cfg, tokenizer,
                              packing=inference.default_packing_config(cfg, row_len=row_len))
  pools = [_truncate(p, num_passages) for p in pools]
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


def _labelled_batch(records, tokenizer, pcfg: PackingConfig, num_nodes: Optional[int] = None):
  """Pack training records as query graphs, with the per-node labels of the pairwise loss."""
  queries = [QueryInput(r.question, [[t.text for t in p.sentences] for p in r.passages])
             for r in records]
  b, _ = pack_queries(queries, tokenizer, pcfg)
  db = {k: np.asarray(v) for k, v in lr.device_batch(b).items()}
  q, n = b.node_mask.shape
  db["passage_rank"] = np.zeros((q, n), np.int32)
  db["sentence_rank"] = np.zeros((q, n), np.int32)
  for qi, r in enumerate(records):
    for ni in np.flatnonzero(b.node_mask[qi]):
      p, t = int(b.node_passage[qi, ni]), int(b.node_sentence[qi, ni])
      db["passage_rank"][qi, ni] = r.passages[p].rank
      db["sentence_rank"][qi, ni] = r.passages[p].sentences[t].rank
  return db


def cache_suite(train_file: str, tokenizer, size: str, group_size: int = 2, reps: int = 2,
                limit: Optional[int] = None, log: Callable[[str], None] = print) -> Dict[str, Any]:
  """Global-stage epoch time (loss + grads of the global params) with cached vs recomputed features.

  Both paths run the model's entry points: "recomputed" runs `local_nodes` (frozen, no
  gradient) then `global_logits` every step; "cached" computes `local_nodes` once and runs only
  `global_logits`. Every batch has one shape, so neither path recompiles.
  """
  records = validate_training_file(train_file)[0][:limit]
  cfg = log_config(size, len(tokenizer))
  # One shape for every batch: buckets that fit the largest group.
  pcfg = PackingConfig(row_len=row_len_for(size), query_buckets=(group_size,))
  groups = [records[i:i + group_size] for i in range(0, len(records), group_size)]
  batches = [_labelled_batch(g, tokenizer, pcfg) for g in groups]
  pcfg = dataclasses.replace(pcfg, row_buckets=(max(b["input_ids"].shape[0] for b in batches),),
                             span_buckets=(max(b["span_kind"].shape[0] for b in batches),),
                             node_buckets=(max(b["node_mask"].shape[1] for b in batches),))
  batches = [_labelled_batch(g, tokenizer, pcfg) for g in groups]
  model = lr.LoGReranker(cfg)
  params = init_log_params(cfg, batches[0])
  tx = optax.adamw(3e-5, weight_decay=0.01)
  local_fn = jax.jit(lambda p, b: _local_nodes(cfg, p, b))

  def pairwise(gp, feats, b, rng):
    logits, _ = model.apply({"params": {"global": gp}}, feats, b["node_passage"], b["node_mask"],
                            False, method=lr.LoGReranker.global_logits, rngs={"dropout": rng})
    per_query, has_pair = losses.pairwise_query_losses(
        logits, b["passage_rank"], b["sentence_rank"], b["node_passage"], b["node_mask"])
    return jnp.sum(jnp.where(has_pair, per_query, 0.0)) / jnp.maximum(jnp.sum(has_pair), 1)

  def make_step(features_of):
    @jax.jit
    def step(gparams, opt, batch, rng):
      loss, grads = jax.value_and_grad(
          lambda gp: pairwise(gp, features_of(batch), batch, rng))(gparams)
      upd, opt = tx.update(grads, opt, gparams)
      return optax.apply_updates(gparams, upd), opt, loss
    return step

  t0 = time.perf_counter()
  cached_batches = [dict(b, **jax.device_get(local_fn(params["local"], b))) for b in batches]
  feature_s = time.perf_counter() - t0
  cached_step = make_step(lambda b: b)
  frozen = jax.lax.stop_gradient(params["local"])
  recomputed_step = make_step(lambda b: _local_nodes(cfg, frozen, b))
  rng = jax.random.PRNGKey(1)

  def epoch(step, batches):
    gp, opt = params["global"], tx.init(params["global"])
    for b in batches:
      gp, opt, loss = step(gp, opt, b, rng)
    return loss

  fdev = [jax.device_put(b) for b in cached_batches]
  tdev = [jax.device_put(b) for b in batches]
  cached = timed(lambda: epoch(cached_step, fdev), reps=reps, warmup=1)
  recomputed = timed(lambda: epoch(recomputed_step, tdev), reps=reps, warmup=1)
  out = {"size": size, "queries": len(records), "batches": len(groups),
         "cached_epoch_s": cached, "recomputed_epoch_s": recomputed,
         "speedup": recomputed / cached, "feature_compute_once_s": feature_s}
  log(f"cache {size}: cached epoch {cached * 1e3:.1f} ms, recomputed {recomputed * 1e3:.1f} ms, "
      f"x{recomputed / cached:.1f}")
  return out


def params_suite() -> Dict[str, Any]:
  """Parameter counts of the paper-size model vs the paper's Table 10."""
  counts = lr.count_params(lr.LoGConfig.paper())
  out = {"ours": counts, "paper": {k: PAPER_TABLE10[k] for k in
                                   ("local_params", "global_params", "total_params")}}
  for ours, paper in (("local", "local_params"), ("global", "global_params"),
                      ("total", "total_params")):
    out[f"{ours}_rel_diff"] = counts[ours] / PAPER_TABLE10[paper] - 1.0
  return out


def write_json(path: str, results: Dict[str, Any]) -> None:
  """Write `results` as indented JSON (atomic replace)."""
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(results, f, indent=2, sort_keys=True, default=str)
  os.replace(tmp, path)
