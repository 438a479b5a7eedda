"""What the encoder suites (encoder, train_step, kernels) share: the same sequences on both
sides, the torch peer with the Flax encoder's weights, and the attention-free floor.

Inputs are real ScholarQABench text: for each of the first `queries` records of each file, the
query with `passages` gold passages of that file (its own first, then the following records'),
as `[CLS] query [SEP] passage [SEP]` cross-encoder sequences, tokenised by a deterministic
WordPiece tokenizer trained on that text. Flax gets them packed (`pack_queries`, row length
chosen by `choose_row_len`); torch gets the very same sequences in padded batches.

Light at import (JAX, torch and the library load inside the functions): `python -m
logrerank_bench.encoder` sets XLA flags and threads before either starts.
"""

from typing import Any, Dict, Optional, Sequence

ROW_LEN_CANDIDATES = tuple(range(512, 1025, 64))
# The attention-free floor (`attention_free_forward`): a cost reference, never a result.
FLOOR = "flax_attention_free"


def load_queries(files: Sequence[str], queries: int, passages: int):
  """Cross-encoder inputs from ScholarQABench files, and all their text (for the tokenizer)."""
  from logrerank_jax.data.packing import QueryInput  # pylint: disable=g-import-not-at-top
  from logrerank_jax.datasets.scholarqabench import read_scholarqabench  # pylint: disable=g-import-not-at-top
  out, texts = [], []
  for f in files:
    recs = read_scholarqabench(f)
    ps = [p["text"] or p["title"] or "(empty)" for r in recs for p in r["gold"]]
    texts += [r["query"] for r in recs] + ps
    for i in range(min(queries, len(recs))):
      pool = (ps[i:] + ps[:i])[:passages]
      out.append(QueryInput(recs[i]["query"], [[p] for p in pool]))
  return out, texts


def _fine_buckets(n: int):
  return tuple(range(1, max(n, 1) + 1))


def pack(queries, tokenizer, row_len: int):
  """Pack all queries into rows of `row_len` (rows used exactly: no bucket padding)."""
  from logrerank_jax.data.packing import PackingConfig, pack_queries  # pylint: disable=g-import-not-at-top
  probe = PackingConfig(row_len=row_len, row_buckets=_fine_buckets(4096),
                        query_buckets=_fine_buckets(max(len(queries), 1)))
  return pack_queries(queries, tokenizer, probe)


def flops_per_token(cfg, row_len: int) -> float:
  """Estimated forward FLOPs per computed token of our encoder at this row length."""
  d, f = cfg.hidden_size, cfg.intermediate_size
  weights = d * 3 * d + d * d + d * 2 * f + f * d
  n_global = sum(t == "full_attention" for t in cfg.layer_types)
  n_local = cfg.num_hidden_layers - n_global
  return (2.0 * weights * cfg.num_hidden_layers + 4.0 * d * row_len * n_global
          + 4.0 * d * min(row_len, 3 * cfg.sliding_window) * n_local)


def choose_row_len(queries, tokenizer, cfg, row_len) -> Dict[str, Any]:
  """Pick the row length (see `logrerank_bench.encoder`'s doc); return the choice and the
  candidate table."""
  from logrerank_bench.common import sequences_of  # pylint: disable=g-import-not-at-top
  ref_batch, _ = pack(queries, tokenizer, 1024)
  ref = sorted(tuple(s["ids"]) for s in sequences_of(ref_batch))
  cands = ROW_LEN_CANDIDATES if row_len == "auto" else (int(row_len),)
  table = []
  for rl in cands:
    try:
      batch, info = pack(queries, tokenizer, rl)
    except Exception as e:  # pylint: disable=broad-except
      table.append({"row_len": rl, "error": str(e)})
      continue
    same = sorted(tuple(s["ids"]) for s in sequences_of(batch)) == ref
    computed = info.num_rows_used * rl
    table.append({"row_len": rl, "rows": info.num_rows_used, "same_sequences": same,
                  "padding_efficiency": info.real_tokens / computed,
                  "est_gflop": computed * flops_per_token(cfg, rl) / 1e9})
  ok = [t for t in table if t.get("same_sequences")]
  if not ok:
    raise SystemExit(f"no row length in {cands} keeps the sequences of row_len=1024")
  best = min(ok, key=lambda t: t["est_gflop"])
  return {"row_len": best["row_len"], "candidates": table}


def torch_model(cfg, seed: int = 0):
  """transformers ModernBertModel (sdpa) with `cfg` and its random init; same weights for Flax."""
  from logrerank_bench.common import flax_params_of, torch_modernbert  # pylint: disable=g-import-not-at-top
  model = torch_modernbert(cfg, seed)
  return model, flax_params_of(model, cfg)


def torch_batches(seqs: Sequence[dict], batch_size: int, sort: bool, pad_id: int = 0):
  """(ids, mask, members) torch batches, each padded to its own longest sequence: sorted by
  length, or in creation order."""
  from logrerank_bench import common  # pylint: disable=g-import-not-at-top
  order = None if sort else sorted(range(len(seqs)), key=lambda i: seqs[i]["rank"])
  return common.torch_batches([s["ids"] for s in seqs], batch_size, order, pad_id)


def row_chunks(batch, rows_per_batch: int):
  """Device batches of at most `rows_per_batch` packed rows (every row used, none added)."""
  import jax  # pylint: disable=g-import-not-at-top
  keys = ("input_ids", "attention_mask", "segment_ids", "position_ids")
  n = batch.input_ids.shape[0]
  return [{k: jax.device_put(getattr(batch, k)[i:i + rows_per_batch]) for k in keys}
          for i in range(0, n, rows_per_batch)]


def set_torch_threads(threads: Optional[int]):
  import torch  # pylint: disable=g-import-not-at-top
  if threads:
    torch.set_num_threads(threads)


def prepare(size, files, queries, passages, row_len, impl="xla", log=print):
  """The suites' common start: queries, tokenizer, encoder config (pad id 0), row length, the
  packed batch and its sequences."""
  from logrerank_bench.common import encoder_config, sequences_of  # pylint: disable=g-import-not-at-top
  from logrerank_jax.datasets.wordpiece import train_wordpiece_tokenizer  # pylint: disable=g-import-not-at-top
  qs, texts = load_queries(files, queries, passages)
  tokenizer = train_wordpiece_tokenizer(texts, 4096)
  cfg = encoder_config(size, len(tokenizer), attention_impl=impl, pad_token_id=0)
  choice = choose_row_len(qs, tokenizer, cfg, row_len)
  batch, info = pack(qs, tokenizer, choice["row_len"])
  seqs = sequences_of(batch)
  log(f"{len(qs)} queries, {len(seqs)} sequences, {info.real_tokens} real tokens, row_len "
      f"{choice['row_len']} ({info.num_rows_used} rows, efficiency "
      f"{info.real_tokens / (info.num_rows_used * choice['row_len']):.3f})")
  return qs, tokenizer, cfg, choice, batch, info, seqs


def attention_free_forward(fn, *example_args, **jit_kwargs):
  """Compile `fn(*args)` with every ModernBERT attention kernel replaced by its values.

  The kernel is swapped only while tracing (`unittest.mock`), and the compiled executable is
  returned, so nothing else ever sees the swap. q and k (and their RoPE) then feed nothing and
  XLA drops them; the fused Wqkv projection still computes all three. The result is the cost
  of the layers around attention: a lower bound on the time of any attention kernel's model.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from unittest import mock  # pylint: disable=g-import-not-at-top
  from logrerank_jax.models.encoders import layers  # pylint: disable=g-import-not-at-top
  values = lambda q, k, v, *rest: v
  # A fresh wrapper: jax.jit caches traces by function, so jitting `fn` itself here would let a
  # later plain `jax.jit(fn)` reuse this attention-free trace (and the other way round).
  fresh = lambda *args: fn(*args)
  # Every kernel `ModernBertAttention` may call, whatever `attention_impl` picks.
  with mock.patch.multiple(layers, tiled_attention=values, reference_attention=values,
                           blocked_local_attention=values, pallas_attention=values,
                           splash_attention=values):
    return jax.jit(fresh, **jit_kwargs).lower(*example_args).compile()
