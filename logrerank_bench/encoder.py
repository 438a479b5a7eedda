"""Encoder forward and train-step throughput: Flax ModernBERT vs transformers' ModernBertModel.

  python -m logrerank_bench.encoder --suite encoder --size small --threads 2 --json enc.json
  python -m logrerank_bench.encoder --suite train_step --size small --threads 2 --json train.json
  python -m logrerank_bench.encoder --suite kernels --size small --threads 2 --json kernels.json
  python -m logrerank_bench.encoder --suite encoder --size base --queries 2 --passages 12

Inputs are real ScholarQABench text: for each of the first `queries` records of each file, the
query with `passages` gold passages of that file (its own first, then the following records'),
as `[CLS] query [SEP] passage [SEP]` cross-encoder sequences, tokenised by a deterministic
WordPiece tokenizer trained on that text. Every contender gets exactly the same sequences (the
suite checks it) and is credited with the same real tokens; padding is never counted as work.

Contenders, all timed interleaved (`logrerank_bench.protocol.interleaved`) in one process with the
same thread count:
  flax_<impl>           our packed rows (`pack_queries`, row length chosen below), jit.
  torch_sorted_bs<N>    ModernBertModel, attn_implementation="sdpa", sequences sorted by
                        length, cut into batches of N, each padded to its own longest
                        (FlagEmbedding's recipe), torch.inference_mode. The strongest of these
                        is the peer that `ratio_vs_torch` divides by.
  torch_input_order_bs8 the same model on batches of 8 in input order (the old peer).
  torch_packed_rows     the same model on Flax's packed rows (cost reference only: torch
                        cannot keep packed segments apart).
  flax_attention_free   our encoder with the attention kernel (and the RoPE that only feeds it)
                        removed: every dense layer, norm and activation still runs. A floor, not
                        a model: `ratio_ceiling_vs_torch` = its tokens/s over the strongest peer's
                        is the most any attention kernel could reach with the rest as it is.

Row length: `--row-len auto` packs with every multiple of 64 from 512 to 1,024, keeps those that
produce exactly the same sequences as 1,024 (nothing windowed or truncated differently), and
takes the one with the fewest estimated encoder FLOPs (computed tokens x (weights + global
attention over the row + local attention over the window)). The table of candidates is in the
JSON. It is a user setting (`PackingConfig.row_len`), not a trick: the row length only decides
how sequences share rows.

Only public library API is used: `logrerank_jax.models.encoders.modernbert.{ModernBertConfig,
ModernBertEncoder}`, `logrerank_jax.data.packing`, `logrerank_jax.data.tokenization`,
`logrerank_jax.datasets.scholarqabench` and `logrerank_jax.convert.modernbert_params_from_torch`.
"""

import argparse
import json
import os
import pathlib
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

REPO = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_FILES = (str(REPO / "tests" / "data" / "scifact_slice.jsonl"),
                 str(REPO / "tests" / "data" / "pubmed_slice.jsonl"))
# XLA flags the suite sets when XLA_FLAGS is unset (recorded in the JSON's machine.xla_flags).
# None: jaxlib 0.10 has only the thunk runtime (`--xla_cpu_use_thunk_runtime=false`, which an
# older jaxlib measured faster, is ignored with a warning), and no other XLA CPU setting measured
# faster (docs/PERFORMANCE.md).
DEFAULT_XLA_FLAGS = ""
# The attention-free floor (`attention_free_forward`): a cost reference, never a result.
FLOOR = "flax_attention_free"
DENSE_REPEAT = 10  # products per timed call in the kernels suite
# "tiny" is for the smoke tests (tests/test_benchmark_smoke.py): it runs every code path in seconds
# and its figures mean nothing.
SIZES = ("tiny", "small", "base")
ROW_LEN_CANDIDATES = tuple(range(512, 1025, 64))


# ----------------------------------------------------------------------------- model and data

def encoder_config(size: str, vocab_size: int, attention_impl: str = "xla"):
  """ModernBERT-base, the 'small' shrink of it (same layer pattern and 128-token window), or the
  smoke tests' 'tiny' one (3 layers, global attention every 2nd, a 16-token window)."""
  from logrerank_jax.models.encoders.modernbert import ModernBertConfig  # pylint: disable=g-import-not-at-top
  if size == "base":
    cfg = ModernBertConfig(vocab_size=max(vocab_size, 50368), pad_token_id=0)
  elif size == "small":
    cfg = ModernBertConfig(vocab_size=vocab_size, hidden_size=256, intermediate_size=384,
                           num_hidden_layers=4, num_attention_heads=4, pad_token_id=0)
  elif size == "tiny":
    cfg = ModernBertConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=48,
                           num_hidden_layers=3, num_attention_heads=2, local_attention=16,
                           global_attn_every_n_layers=2, pad_token_id=0)
  else:
    raise SystemExit(f"unknown size {size!r}; known: {SIZES}")
  return cfg.replace(attention_impl=attention_impl)


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


def sequences_of(batch) -> List[dict]:
  """Every packed sequence: row, start, token ids, and its creation rank (query span id)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  seqs = []
  for r in range(batch.input_ids.shape[0]):
    seg = batch.segment_ids[r]
    for s in range(1, int(seg.max()) + 1):
      idx = np.nonzero(seg == s)[0]
      seqs.append({"row": r, "start": int(idx[0]), "ids": batch.input_ids[r, idx].astype(np.int64),
                   "rank": int(batch.span_ids[r, idx[1]])})
  return seqs


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
  """Pick the row length (see the module doc); return the choice and the candidate table."""
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
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from logrerank_jax.convert import modernbert_params_from_torch  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  hf = dict(cfg.to_hf_dict())
  hf.update(bos_token_id=None, eos_token_id=None, cls_token_id=None, sep_token_id=None)
  tcfg = transformers.ModernBertConfig(**hf, attn_implementation="sdpa")
  model = transformers.ModernBertModel(tcfg).eval()
  sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
  params = jax.tree_util.tree_map(jnp.asarray, modernbert_params_from_torch(sd, cfg))
  return model, params


def torch_batches(seqs: Sequence[dict], batch_size: int, sort: bool, pad_id: int = 0):
  """(ids, mask, members) torch batches, each padded to its own longest sequence."""
  import torch  # pylint: disable=g-import-not-at-top
  order = (sorted(range(len(seqs)), key=lambda i: len(seqs[i]["ids"])) if sort
           else sorted(range(len(seqs)), key=lambda i: seqs[i]["rank"]))
  out = []
  for i in range(0, len(order), batch_size):
    members = order[i:i + batch_size]
    length = max(len(seqs[j]["ids"]) for j in members)
    ids = torch.full((len(members), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(members), length), dtype=torch.long)
    for r, j in enumerate(members):
      n = len(seqs[j]["ids"])
      ids[r, :n] = torch.as_tensor(seqs[j]["ids"])
      mask[r, :n] = 1
    out.append((ids, mask, members))
  return out


def row_chunks(batch, rows_per_batch: int):
  """Device batches of at most `rows_per_batch` packed rows (every row used, none added)."""
  import jax  # pylint: disable=g-import-not-at-top
  keys = ("input_ids", "attention_mask", "segment_ids", "position_ids")
  n = batch.input_ids.shape[0]
  return [{k: jax.device_put(getattr(batch, k)[i:i + rows_per_batch]) for k in keys}
          for i in range(0, n, rows_per_batch)]


def attention_free_forward(fn, *example_args, **jit_kwargs):
  """Compile `fn(*args)` with every ModernBERT attention kernel replaced by its values.

  The kernel is swapped only while tracing (`unittest.mock`), and the compiled executable is
  returned, so nothing else ever sees the swap. q and k (and their RoPE) then feed nothing and
  XLA drops them; the fused Wqkv projection still computes all three. The result is the cost
  of the layers around attention: a lower bound on the time of any attention kernel's model.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from unittest import mock  # pylint: disable=g-import-not-at-top
  from logrerank_jax.models.encoders import modernbert  # pylint: disable=g-import-not-at-top
  values = lambda q, k, v, *rest: v
  # A fresh wrapper: jax.jit caches traces by function, so jitting `fn` itself here would let a
  # later plain `jax.jit(fn)` reuse this attention-free trace (and the other way round).
  fresh = lambda *args: fn(*args)
  # Every kernel `ModernBertAttention` may call, whatever `attention_impl` picks.
  with mock.patch.multiple(modernbert, tiled_attention=values, reference_attention=values,
                           blocked_local_attention=values, pallas_attention=values,
                           splash_attention=values):
    return jax.jit(fresh, **jit_kwargs).lower(*example_args).compile()


def _set_torch_threads(threads: Optional[int]):
  import torch  # pylint: disable=g-import-not-at-top
  if threads:
    torch.set_num_threads(threads)


def _prepare(size, files, queries, passages, row_len, impl="xla", log=print):
  from logrerank_jax.data.tokenization import train_wordpiece_tokenizer  # pylint: disable=g-import-not-at-top
  qs, texts = load_queries(files, queries, passages)
  tokenizer = train_wordpiece_tokenizer(texts, 4096)
  cfg = encoder_config(size, len(tokenizer), impl)
  choice = choose_row_len(qs, tokenizer, cfg, row_len)
  batch, info = pack(qs, tokenizer, choice["row_len"])
  seqs = sequences_of(batch)
  log(f"{len(qs)} queries, {len(seqs)} sequences, {info.real_tokens} real tokens, row_len "
      f"{choice['row_len']} ({info.num_rows_used} rows, efficiency "
      f"{info.real_tokens / (info.num_rows_used * choice['row_len']):.3f})")
  return qs, tokenizer, cfg, choice, batch, info, seqs


# ----------------------------------------------------------------------------- suites

def encoder_suite(size: str = "small", threads: Optional[int] = None, reps: int = 5,
                  impls: Sequence[str] = ("xla", "blocked", "tiled"),
                  files: Sequence[str] = DEFAULT_FILES, queries: int = 2, passages: int = 12,
                  row_len="auto", rows_per_batch: int = 16,
                  torch_batch_sizes: Sequence[int] = (8, 32), log=print) -> Dict[str, Any]:
  """Forward tokens/s of the Flax encoder vs the strongest simple PyTorch configuration."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from logrerank_bench import protocol  # pylint: disable=g-import-not-at-top
  from logrerank_jax.models.encoders.modernbert import ModernBertEncoder  # pylint: disable=g-import-not-at-top

  _set_torch_threads(threads)
  _, _, cfg, choice, batch, info, seqs = _prepare(size, files, queries, passages, row_len, log=log)
  real = int(info.real_tokens)
  assert real == sum(len(s["ids"]) for s in seqs)
  model, params = torch_model(cfg)
  dev = row_chunks(batch, rows_per_batch)
  fns, flax_out = {}, {}
  for impl in impls:
    enc = ModernBertEncoder(cfg.replace(attention_impl=impl))
    fwd = jax.jit(lambda p, b, enc=enc: enc.apply({"params": p}, b["input_ids"],
                                                  b["attention_mask"], b["segment_ids"],
                                                  b["position_ids"]))
    t0 = time.perf_counter()
    flax_out[impl] = [np.asarray(fwd(params, b)) for b in dev]  # compiles every chunk shape
    log(f"flax {impl}: compiled and ran once in {time.perf_counter() - t0:.1f} s")
    fns[f"flax_{impl}"] = (lambda fwd=fwd: [fwd(params, b) for b in dev])
  floor_enc = ModernBertEncoder(cfg)
  floor_fwd = lambda p, b: floor_enc.apply({"params": p}, b["input_ids"], b["attention_mask"],
                                           b["segment_ids"], b["position_ids"])
  floors = [attention_free_forward(floor_fwd, params, b) for b in dev]
  fns[FLOOR] = lambda: [f(params, b) for f, b in zip(floors, dev)]

  def run_torch(bs):
    with torch.inference_mode():
      return [model(input_ids=i, attention_mask=m).last_hidden_state for i, m, _ in bs]

  peers = {}
  for n in torch_batch_sizes:
    peers[f"torch_sorted_bs{n}"] = torch_batches(seqs, n, sort=True)
  peers["torch_input_order_bs8"] = torch_batches(seqs, 8, sort=False)
  packed_rows = [(torch.as_tensor(np.array(b["input_ids"]), dtype=torch.long),
                  torch.as_tensor(np.asarray(b["segment_ids"]) > 0, dtype=torch.long), None)
                 for b in dev]
  for name, bs in peers.items():
    fns[name] = (lambda bs=bs: run_torch(bs))
  fns["torch_packed_rows"] = lambda: run_torch(packed_rows)

  # Same weights, same tokens: every sequence's Flax output (packed) vs torch's (sorted batch).
  ref = [None] * len(seqs)
  with torch.inference_mode():
    for ids, mask, members in peers[f"torch_sorted_bs{torch_batch_sizes[0]}"]:
      h = model(input_ids=ids, attention_mask=mask).last_hidden_state.float().numpy()
      for r, j in enumerate(members):
        ref[j] = h[r, :len(seqs[j]["ids"])]
  errs = {}
  for impl, outs in flax_out.items():
    full = np.concatenate(outs, axis=0)
    errs[impl] = float(max(np.abs(full[s["row"], s["start"]:s["start"] + len(s["ids"])] - ref[j]).max()
                           for j, s in enumerate(seqs)))

  with protocol.load_report(threads) as load:
    timing = protocol.interleaved(fns, reps=reps, warmup=1)
  tput = {k: protocol.throughput(v, real) for k, v in timing.items()}
  strongest = max((k for k in tput if k.startswith("torch_sorted")),
                  key=lambda k: tput[k]["median"])
  flax_runs = [k for k in tput if k.startswith("flax_") and k != FLOOR]
  best_flax = max(flax_runs, key=lambda k: tput[k]["median"])
  computed = {f"flax_{i}": int(sum(b["input_ids"].size for b in dev)) for i in impls}
  computed[FLOOR] = computed[best_flax]
  computed.update({k: int(sum(i.numel() for i, _, _ in bs)) for k, bs in peers.items()})
  computed["torch_packed_rows"] = computed[f"flax_{impls[0]}"]
  out = {"size": size, "dtype": "float32", "threads": threads, "reps": reps,
         "load": load.result, "sequences": len(seqs), "real_tokens": real, "row_len": choice["row_len"],
         "row_len_candidates": choice["candidates"], "rows": int(batch.input_ids.shape[0]),
         "rows_per_batch": rows_per_batch, "padding_efficiency": real / computed[best_flax],
         "computed_tokens": computed, "torch_attn_implementation": model.config._attn_implementation,  # pylint: disable=protected-access
         "max_abs_err_vs_torch": errs, "timing_s": timing, "tokens_per_s": tput,
         "strongest_torch": strongest, "best_flax": best_flax,
         "ratio_vs_torch": protocol.ratio(tput[best_flax], tput[strongest]),
         "ratio_vs_torch_by_impl": {k: protocol.ratio(tput[k], tput[strongest])
                                    for k in flax_runs},
         "ratio_ceiling_vs_torch": protocol.ratio(tput[FLOOR], tput[strongest])}
  for k in tput:
    log(f"  {k:24s} {tput[k]['median']:10,.0f} tok/s  (min {tput[k]['min']:,.0f}, "
        f"max {tput[k]['max']:,.0f})")
  r, c = out["ratio_vs_torch"], out["ratio_ceiling_vs_torch"]
  log(f"encoder {size}: {best_flax} / {strongest} = {r['median']:.2f} "
      f"(range {r['min']:.2f}-{r['max']:.2f}); attention-free ceiling {c['median']:.2f} "
      f"(range {c['min']:.2f}-{c['max']:.2f}); load {load.result['loadavg_before']} -> "
      f"{load.result['loadavg_after']}, reliable={load.result['reliable']}")
  return out


def train_step_suite(size: str = "small", threads: Optional[int] = None, reps: int = 5,
                     impl: str = "tiled", files: Sequence[str] = DEFAULT_FILES,
                     queries: int = 2, passages: int = 12, row_len="auto",
                     rows_per_batch: int = 16, torch_batch_size: int = 8, lr: float = 1e-4,
                     log=print) -> Dict[str, Any]:
  """Forward + backward + AdamW of encoder + scalar head on mean pooling: tokens/s, Flax vs torch.

  Both sides regress a fixed random target per sequence with a mean-squared error through
  mean pooling over each sequence and a linear scalar head. Flax: packed rows, one jit with the
  train state donated. Torch: sdpa, length-sorted batches padded to their longest,
  torch.optim.AdamW. One timed call = one pass over every sequence (one step per batch).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from logrerank_bench import protocol  # pylint: disable=g-import-not-at-top
  from logrerank_jax.models.encoders.modernbert import ModernBertEncoder  # pylint: disable=g-import-not-at-top

  _set_torch_threads(threads)
  _, _, cfg, choice, batch, info, seqs = _prepare(size, files, queries, passages, row_len, impl,
                                                  log=log)
  real = int(info.real_tokens)
  model, enc_params = torch_model(cfg)
  model.train()
  d = cfg.hidden_size
  rng = np.random.default_rng(0)
  targets = rng.normal(size=len(seqs)).astype(np.float32)
  head_w = (rng.normal(size=(d,)) / np.sqrt(d)).astype(np.float32)

  # ---- Flax
  nseg = int(batch.segment_ids.max())
  seg_target = np.zeros(batch.segment_ids.shape[:1] + (nseg,), np.float32)
  for j, s in enumerate(seqs):
    seg_target[s["row"], int(batch.segment_ids[s["row"], s["start"]]) - 1] = targets[j]
  dev = row_chunks(batch, rows_per_batch)
  for i, b in enumerate(dev):
    b["target"] = jax.device_put(seg_target[i * rows_per_batch:(i + 1) * rows_per_batch])
  enc = ModernBertEncoder(cfg)
  tx = optax.adamw(lr, weight_decay=0.01)
  params = {"encoder": enc_params, "head": {"w": jnp.asarray(head_w), "b": jnp.zeros(())}}

  def loss_fn(p, b):
    h = enc.apply({"params": p["encoder"]}, b["input_ids"], b["attention_mask"],
                  b["segment_ids"], b["position_ids"], deterministic=False)  # [R, L, d]
    onehot = (b["segment_ids"][:, None, :] == jnp.arange(1, nseg + 1)[None, :, None]
              ).astype(jnp.float32)  # [R, S, L]
    counts = onehot.sum(-1)
    pooled = jnp.einsum("rsl,rld->rsd", onehot, h) / jnp.maximum(counts, 1.0)[..., None]
    pred = pooled @ p["head"]["w"] + p["head"]["b"]
    present = counts > 0
    err = jnp.where(present, pred - b["target"], 0.0)
    return jnp.sum(err ** 2) / jnp.maximum(present.sum(), 1)

  def _step(state, b):
    p, opt = state
    loss, g = jax.value_and_grad(loss_fn)(p, b)
    upd, opt = tx.update(g, opt, p)
    return (optax.apply_updates(p, upd), opt), loss

  step = jax.jit(_step, donate_argnums=(0,))
  copy = lambda tree: jax.tree_util.tree_map(jnp.copy, tree)
  floor_params = copy(params)  # before `state` is donated
  state = [(params, tx.init(params))]
  floor_state = [(floor_params, tx.init(floor_params))]
  floor_steps = [attention_free_forward(_step, floor_state[0], b, donate_argnums=(0,))
                 for b in dev]

  def epoch(run_step, st):
    s = st[0]
    loss = None
    for i, b in enumerate(dev):
      s, loss = run_step(i, s, b)
    st[0] = s
    return loss

  flax_epoch = lambda: epoch(lambda i, s, b: step(s, b), state)
  floor_epoch = lambda: epoch(lambda i, s, b: floor_steps[i](s, b), floor_state)

  # ---- torch
  head = torch.nn.Linear(d, 1)
  with torch.no_grad():
    head.weight.copy_(torch.as_tensor(head_w)[None])
    head.bias.zero_()
  topt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=lr,
                           weight_decay=0.01)
  tb = torch_batches(seqs, torch_batch_size, sort=True)
  ttargets = [torch.as_tensor(targets[m]) for _, _, m in tb]

  def torch_epoch():
    loss = None
    for (ids, mask, _), y in zip(tb, ttargets):
      h = model(input_ids=ids, attention_mask=mask).last_hidden_state
      m = mask[..., None].float()
      pooled = (h * m).sum(1) / m.sum(1)
      loss = torch.mean((head(pooled)[:, 0] - y) ** 2)
      topt.zero_grad(set_to_none=True)
      loss.backward()
      topt.step()
    return loss.detach()

  t0 = time.perf_counter()
  flax_epoch()
  log(f"flax train step: compiled and ran once in {time.perf_counter() - t0:.1f} s")
  fns = {f"flax_{impl}": flax_epoch, f"torch_sorted_bs{torch_batch_size}": torch_epoch,
         FLOOR: floor_epoch}
  with protocol.load_report(threads) as load:
    timing = protocol.interleaved(fns, reps=reps, warmup=1)
  tput = {k: protocol.throughput(v, real) for k, v in timing.items()}
  fk, tk, _ = list(fns)
  out = {"size": size, "threads": threads, "reps": reps, "load": load.result,
         "sequences": len(seqs), "real_tokens": real, "row_len": choice["row_len"],
         "rows": int(batch.input_ids.shape[0]), "rows_per_batch": rows_per_batch,
         "flax_steps_per_pass": len(dev), "torch_steps_per_pass": len(tb),
         "computed_tokens": {fk: int(sum(b["input_ids"].size for b in dev)),
                             tk: int(sum(i.numel() for i, _, _ in tb)),
                             FLOOR: int(sum(b["input_ids"].size for b in dev))},
         "timing_s": timing, "tokens_per_s": tput, "ratio_vs_torch": protocol.ratio(tput[fk], tput[tk]),
         "ratio_ceiling_vs_torch": protocol.ratio(tput[FLOOR], tput[tk])}
  r, c = out["ratio_vs_torch"], out["ratio_ceiling_vs_torch"]
  log(f"train_step {size}: {fk} {tput[fk]['median']:,.0f} tok/s, {tk} {tput[tk]['median']:,.0f} "
      f"tok/s, ratio {r['median']:.2f} (range {r['min']:.2f}-{r['max']:.2f}); attention-free "
      f"ceiling {c['median']:.2f} (range {c['min']:.2f}-{c['max']:.2f}); load "
      f"{load.result['loadavg_before']} -> {load.result['loadavg_after']}")
  return out


def kernels_suite(size: str = "small", threads: Optional[int] = None, reps: int = 5,
                  files: Sequence[str] = DEFAULT_FILES, queries: int = 2, passages: int = 12,
                  row_len="auto", rows_per_batch: int = 16, log=print) -> Dict[str, Any]:
  """The two kernels an encoder layer is made of, XLA vs torch on identical inputs.

  dense_<dtype>: the MLP input projection (tokens of one packed batch x d -> 2 x intermediate),
    `jnp.dot` under jit vs `torch.mm` (oneDNN/MKL), float32 and bfloat16, ten products per
    timed call; GFLOP/s.
  attention_<global|window>[_grad]: one attention layer on one packed batch of the suite's rows
    (their real segment layout, random q/k/v), our `tiled_attention` vs torch's
    `scaled_dot_product_attention` with the same boolean segment (and window) mask, forward
    and forward + backward; ms per layer. Torch's masked sdpa computes every [L, L] logit; ours
    computes full rows for global layers and neighbouring blocks for window layers.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from logrerank_bench import protocol  # pylint: disable=g-import-not-at-top
  from logrerank_jax.models.encoders.modernbert import tiled_attention  # pylint: disable=g-import-not-at-top

  _set_torch_threads(threads)
  _, _, cfg, choice, batch, _, _ = _prepare(size, files, queries, passages, row_len, log=log)
  rng = np.random.default_rng(0)
  seg = batch.segment_ids[:rows_per_batch].astype(np.int32)
  pos = batch.position_ids[:rows_per_batch].astype(np.int32)
  b, l = seg.shape
  m, d, n = b * l, cfg.hidden_size, 2 * cfg.intermediate_size
  out: Dict[str, Any] = {"size": size, "threads": threads, "reps": reps, "rows": b, "row_len": l,
                         "dense_shape": [m, d, n]}

  # Dense: [m, d] x [d, n].
  x = rng.standard_normal((m, d)).astype(np.float32)
  w = (rng.standard_normal((d, n)) / np.sqrt(d)).astype(np.float32)
  fns = {}
  for dt, tdt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
    jx, jw = jnp.asarray(x, dt), jnp.asarray(w, dt)
    dot = jax.jit(lambda a, c: jnp.dot(a, c, preferred_element_type=a.dtype))
    tx, tw = torch.from_numpy(x).to(tdt), torch.from_numpy(w).to(tdt)
    # Ten products per timed call: one alone (~10 ms) would be timed with the wake-up of the
    # thread pools that the protocol's pause lets go idle.
    fns[f"dense_{dt}_xla"] = lambda dot=dot, jx=jx, jw=jw: [dot(jx, jw) for _ in range(DENSE_REPEAT)]
    fns[f"dense_{dt}_torch"] = lambda tx=tx, tw=tw: [torch.mm(tx, tw) for _ in range(DENSE_REPEAT)]

  # Attention: q, k, v [B, L, H, Dh] for us, [B, H, L, Dh] for torch.
  h, dh = cfg.num_attention_heads, cfg.head_dim
  window = cfg.sliding_window
  qkv = [rng.standard_normal((b, l, h, dh)).astype(np.float32) for _ in range(3)]
  dout = rng.standard_normal((b, l, h, dh)).astype(np.float32) * (seg > 0)[..., None, None]
  jq, jk, jv, jdo = (jnp.asarray(a) for a in qkv + [dout])
  jseg, jpos = jnp.asarray(seg), jnp.asarray(pos)
  same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] > 0)
  near = np.abs(pos[:, :, None] - pos[:, None, :]) <= window
  # Torch: padding queries see no key; give them themselves so softmax stays finite (their
  # outputs and gradients are never read, as in the model).
  eye = np.eye(l, dtype=bool)[None]
  masks = {"global": torch.from_numpy(same | eye)[:, None],
           "window": torch.from_numpy((same & near) | eye)[:, None]}
  tq, tk, tv, tdo = (torch.from_numpy(a.transpose(0, 2, 1, 3).copy()) for a in qkv + [dout])
  errs = {}
  for kind, win in (("global", None), ("window", window)):
    att = lambda q, k, v, win=win: tiled_attention(q, k, v, jseg, jpos, win)
    fwd = jax.jit(att)
    grad = jax.jit(lambda q, k, v, att=att: jax.vjp(att, q, k, v)[1](jdo))
    fns[f"attention_{kind}_xla"] = lambda fwd=fwd: fwd(jq, jk, jv)
    fns[f"attention_{kind}_grad_xla"] = lambda grad=grad: grad(jq, jk, jv)
    mask = masks[kind]

    def torch_fwd(mask=mask):
      with torch.inference_mode():
        return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask)

    def torch_grad(mask=mask):
      q, k, v = (t.detach().requires_grad_() for t in (tq, tk, tv))
      o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
      return torch.autograd.grad(o, (q, k, v), tdo)

    fns[f"attention_{kind}_torch"] = torch_fwd
    fns[f"attention_{kind}_grad_torch"] = torch_grad
    # Same work: both compute the same attention on the real query tokens.
    ours = np.asarray(fwd(jq, jk, jv))
    theirs = torch_fwd().numpy().transpose(0, 2, 1, 3)
    errs[kind] = float(np.abs(ours - theirs)[seg > 0].max())
  for f in fns.values():  # compile
    protocol.block(f())
  out["attention_max_abs_err_vs_torch"] = errs
  with protocol.load_report(threads) as load:
    timing = protocol.interleaved(fns, reps=reps, warmup=1)
  out.update(load=load.result, timing_s=timing)
  flops = 2.0 * m * d * n * DENSE_REPEAT
  out["dense_gflop_s"] = {k: flops / t["median"] / 1e9 for k, t in timing.items()
                          if k.startswith("dense_")}
  out["attention_ms"] = {k: t["median"] * 1e3 for k, t in timing.items()
                         if k.startswith("attention_")}
  out["xla_over_torch_time"] = {
      k[:-4]: timing[k]["median"] / timing[k[:-4] + "_torch"]["median"]
      for k in timing if k.endswith("_xla")}
  for k, v in out["dense_gflop_s"].items():
    log(f"  {k:28s} {v:8.0f} GFLOP/s")
  for k, v in out["attention_ms"].items():
    log(f"  {k:28s} {v:8.1f} ms")
  log(f"kernels {size}: XLA time / torch time {({k: round(v, 2) for k, v in out['xla_over_torch_time'].items()})}; "
      f"load {load.result['loadavg_before']} -> {load.result['loadavg_after']}, "
      f"reliable={load.result['reliable']}")
  return out


# ----------------------------------------------------------------------------- command line

def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--suite", default="encoder",
                 help="encoder, train_step, kernels, or several comma-separated")
  p.add_argument("--size", default="small", choices=SIZES)
  p.add_argument("--threads", type=int, default=0, help="CPU threads for XLA and torch (0: all)")
  p.add_argument("--reps", type=int, default=5, help="interleaved timed rounds (>= 5)")
  p.add_argument("--impls", default="xla,blocked,tiled", help="encoder: attention impls")
  p.add_argument("--train-impl", default="tiled", help="train_step: attention impl")
  p.add_argument("--data", default="", help="folder with scifact_test.jsonl / pubmed_test.jsonl "
                 "(default: the slices in tests/data)")
  p.add_argument("--queries", type=int, default=2, help="queries per file")
  p.add_argument("--passages", type=int, default=12, help="passages per query")
  p.add_argument("--row-len", default="auto", help="'auto' or a packed row length")
  p.add_argument("--rows-per-batch", type=int, default=16)
  p.add_argument("--torch-batch-sizes", default="8,32")
  p.add_argument("--xla-flags", default=None,
                 help=f"XLA_FLAGS to set (default: $XLA_FLAGS if set, else {DEFAULT_XLA_FLAGS!r}; "
                 "pass '' for XLA's defaults)")
  p.add_argument("--json", default="")
  return p.parse_args(argv)


def main(argv=None):
  """Set threads and XLA flags before JAX/torch start, run the suites, write the JSON."""
  args = parse_args(argv)
  if args.xla_flags is not None:
    os.environ["XLA_FLAGS"] = args.xla_flags
  elif "XLA_FLAGS" not in os.environ:
    os.environ["XLA_FLAGS"] = DEFAULT_XLA_FLAGS
  from logrerank_bench import protocol  # pylint: disable=g-import-not-at-top
  threads = protocol.set_threads(args.threads)
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(threads)
  if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
  files = DEFAULT_FILES
  if args.data:
    files = [os.path.join(args.data, f) for f in ("scifact_test.jsonl", "pubmed_test.jsonl")
             if os.path.exists(os.path.join(args.data, f))]
  results = {"machine": protocol.machine_info(threads), "args": vars(args), "data_files": list(files),
             "load_at_start": protocol.load_report(0).result}
  start = time.perf_counter()

  def save():
    results["elapsed_s"] = time.perf_counter() - start
    if args.json:
      with open(args.json + ".tmp", "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, sort_keys=True, default=str)
      os.replace(args.json + ".tmp", args.json)

  common = dict(size=args.size, threads=threads, reps=args.reps, files=files,
                queries=args.queries, passages=args.passages, row_len=args.row_len,
                rows_per_batch=args.rows_per_batch)
  for suite in [s.strip() for s in args.suite.split(",")]:
    if suite == "encoder":
      results[suite] = encoder_suite(impls=tuple(args.impls.split(",")),
                                     torch_batch_sizes=tuple(int(x) for x in
                                                             args.torch_batch_sizes.split(",")),
                                     **common)
    elif suite == "train_step":
      results[suite] = train_step_suite(impl=args.train_impl, **common)
    elif suite == "kernels":
      results[suite] = kernels_suite(**common)
    else:
      raise SystemExit(f"unknown suite {suite!r}; known: encoder, train_step, kernels")
    save()
  save()
  return results


if __name__ == "__main__":
  main()
