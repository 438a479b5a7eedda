"""What the benchmark suites share: model sizes, the benchmark data, the models under test.

Sizes: `encoder_config` / `log_config` of the benchmark sizes ("tiny", "small", "base"), useful
FLOPs and the datasheet peak for MFU. Data: BM25 pools from ScholarQABench files, their
host-side split into sentences, packed sequences recovered in creation order. Models: LoG
params initialised on an example batch, the inference engine one query per call, and the
PyTorch peer, transformers' `ModernBertModel` with the same config and the same random weights
(converted with `modernbert_params_from_torch`), fed the same token ids.

Thread counts are set by the caller *before* JAX/torch start (see `tools/benchmark.py`): the
process CPU affinity bounds XLA's CPU thread pool, and `torch.set_num_threads` bounds torch's.
This module imports JAX, so it is imported after that.
"""

import dataclasses
import os
from typing import Any, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import logrerank_jax
from logrerank_jax.convert import modernbert_params_from_torch
from logrerank_jax.data import sentences
from logrerank_jax.data.packing import PackingConfig, QueryInput, pack_queries
from logrerank_jax.data.sentences import split_sentence_texts
from logrerank_jax.datasets.wordpiece import train_wordpiece_tokenizer
from logrerank_jax.datasets.pools import build_eval_pools
from logrerank_jax.datasets.scholarqabench import read_scholarqabench
from logrerank_jax.errors import ConfigError, DataError, LogRerankError
from logrerank_jax.models import log_reranker as lr
from logrerank_jax.models.encoders import modernbert as mb

from logrerank_bench.defaults import SIZES

# Paper, Table 10 (inference on one GPU, 50 passages per query).
PAPER_TABLE10 = {"local_params": 149.85e6, "global_params": 2.67e6, "total_params": 152.52e6,
                 "latency_s_per_query": 2.426, "peak_memory_gb": 3.21}
# Datasheet dense bf16 peak of an H100/H200 SXM (TFLOP/s); MFU is stated against this.
PEAK_TFLOPS = {"h200": 989.0, "h100": 989.0}
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


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


def clear_split_cache():
  """Forget cached sentence splits, so the host-side split is timed for real."""
  sentences.clear_cache()


def truncate(pool: dict, k: Optional[int]) -> dict:
  """The pool with only its first k passages."""
  return dict(pool, ctxs=pool["ctxs"][:k])


def benchmark_tokenizer(pools: Sequence[dict], vocab_size: int = 4096):
  """A deterministic WordPiece tokenizer trained on the pools' text (lengths realistic for BERT)."""
  texts = [p["input"] for p in pools] + [c["text"] for p in pools for c in p["ctxs"]]
  return train_wordpiece_tokenizer(texts, vocab_size)


def sequences_of(batch) -> List[dict]:
  """Every packed sequence: row, start, token ids, and its creation rank (query span id)."""
  seqs = []
  for r in range(batch.input_ids.shape[0]):
    seg = batch.segment_ids[r]
    for s in range(1, int(seg.max()) + 1):
      idx = np.nonzero(seg == s)[0]
      # The token after [CLS] is the query span; spans are numbered in creation order.
      seqs.append({"row": r, "start": int(idx[0]), "ids": batch.input_ids[r, idx].astype(np.int64),
                   "rank": int(batch.span_ids[r, idx[1]])})
  return seqs


def packed_sequences(batch) -> List[np.ndarray]:
  """Recover the sequences of a packed batch, in creation order (what torch gets padded)."""
  return [s["ids"] for s in sorted(sequences_of(batch), key=lambda s: s["rank"])]


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

def encoder_config(size: str, vocab_size: int, dtype=jnp.float32, attention_impl: str = "xla",
                   pad_token_id: Optional[int] = None) -> mb.ModernBertConfig:
  """Encoder of a benchmark size: 'base' = ModernBERT-base; 'small'/'tiny' shrink it.

  'small' keeps base's layer pattern and 128-token window; 'tiny' (the smoke tests') has 3
  layers, global attention every 2nd, a 16-token window. `pad_token_id` replaces base's own
  (the encoder suites pad with 0, the benchmark tokenizer's [PAD]; small and tiny use 0).
  """
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
  if pad_token_id is not None:
    cfg = cfg.replace(pad_token_id=pad_token_id)
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


# ----------------------------------------------------------------------------- models

def local_nodes(cfg: lr.LoGConfig, params_local, b):
  """The local stage through the model's entry point: per-node features [Q, N, ...]."""
  nodes = lr.LoGReranker(cfg).apply({"params": {"local": params_local}}, b, True,
                                    method=lr.LoGReranker.local_nodes)
  return {k: nodes[k] for k in ("h", "role_probs", "local_score")}


def global_logits(cfg: lr.LoGConfig, params_global, nodes, node_passage, node_mask):
  """The global stage (graph build + GAT) through the model's entry point: logits [Q, N]."""
  return lr.LoGReranker(cfg).apply({"params": {"global": params_global}}, nodes, node_passage,
                                   node_mask, True, method=lr.LoGReranker.global_logits)[0]


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


def make_reranker(params, cfg: lr.LoGConfig, tokenizer, pcfg: PackingConfig):
  """The project's inference engine (`logrerank_jax.Reranker`, one query per call)."""
  return logrerank_jax.Reranker(params, cfg, tokenizer, packing=pcfg, queries_per_batch=1)


def engine_rerank(reranker, pool: dict, k: Optional[int]) -> dict:
  """Rerank one pool (first k passages) with the engine; its `error` output is raised, not kept."""
  res = reranker.rerank_records([truncate(pool, k)])[0]
  if res.get("error"):
    raise LogRerankError(f"inference engine failed on query {pool.get('id')}: {res['error']}")
  return res


# ----------------------------------------------------------------------------- torch peer

def torch_modernbert(cfg: mb.ModernBertConfig, seed: int = 0):
  """transformers' ModernBertModel (sdpa) with `cfg` and its random init (seeded), in eval mode."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  hf = dict(cfg.to_hf_dict())
  hf.update(bos_token_id=None, eos_token_id=None, cls_token_id=None, sep_token_id=None)
  tcfg = transformers.ModernBertConfig(**hf, attn_implementation="sdpa")
  return transformers.ModernBertModel(tcfg).eval()


def flax_params_of(model, cfg: mb.ModernBertConfig) -> Dict[str, Any]:
  """The torch model's weights as Flax encoder params (the same weights on both sides)."""
  sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
  return jax.tree_util.tree_map(jnp.asarray, modernbert_params_from_torch(sd, cfg))


def torch_batches(seqs: Sequence[np.ndarray], batch_size: int,
                  order: Optional[Sequence[int]] = None, pad_id: int = 0, device: str = "cpu"):
  """(ids, mask, members) torch batches of `seqs` taken in `order` (default: sorted by length,
  FlagEmbedding's recipe), each padded to its own longest sequence, on `device`."""
  import torch  # pylint: disable=g-import-not-at-top
  if order is None:
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
  order = list(order)
  batches = padded_batches([seqs[j] for j in order], batch_size, pad_id)
  return [(torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device),
           order[n * batch_size:(n + 1) * batch_size]) for n, (ids, mask) in enumerate(batches)]
