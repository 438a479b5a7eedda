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
ModernBertEncoder}`, `logrerank_jax.data.packing`, `logrerank_jax.datasets.wordpiece`,
`logrerank_jax.datasets.scholarqabench` and `logrerank_jax.convert.modernbert_params_from_torch`.
"""

import argparse
import os
import time
from typing import Any, Dict, Optional, Sequence

from logrerank_bench.defaults import SIZES, SLICE_FILES, data_files
from logrerank_bench.encoder_common import (FLOOR, attention_free_forward, prepare, row_chunks,
                                            set_torch_threads, torch_batches, torch_model)

# XLA flags the suite sets when XLA_FLAGS is unset (recorded in the JSON's machine.xla_flags).
# None: jaxlib 0.10 has only the thunk runtime (`--xla_cpu_use_thunk_runtime=false`, which an
# older jaxlib measured faster, is ignored with a warning), and no other XLA CPU setting measured
# faster (docs/PERFORMANCE.md).
DEFAULT_XLA_FLAGS = ""
SUITES = ("encoder", "train_step", "kernels")


# ----------------------------------------------------------------------------- encoder suite

def flax_contenders(cfg, params, dev, impls: Sequence[str], log=print):
  """Timed callables of our encoder per attention impl and of the attention-free floor, and each
  impl's outputs (the first call, which compiles every chunk shape)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from logrerank_jax.models.encoders.modernbert import ModernBertEncoder  # pylint: disable=g-import-not-at-top
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
  return fns, flax_out


def torch_contenders(model, seqs, dev, torch_batch_sizes: Sequence[int]):
  """Timed callables of the torch peer per batching, and the padded batches of each."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

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
  fns = {}
  for name, bs in peers.items():
    fns[name] = (lambda bs=bs: run_torch(bs))
  fns["torch_packed_rows"] = lambda: run_torch(packed_rows)
  return fns, peers


def max_abs_err_vs_torch(model, seqs, peer_batches, flax_out) -> Dict[str, float]:
  """Same weights, same tokens: every sequence's Flax output (packed) vs torch's (sorted batch)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  ref = [None] * len(seqs)
  with torch.inference_mode():
    for ids, mask, members in peer_batches:
      h = model(input_ids=ids, attention_mask=mask).last_hidden_state.float().numpy()
      for r, j in enumerate(members):
        ref[j] = h[r, :len(seqs[j]["ids"])]
  errs = {}
  for impl, outs in flax_out.items():
    full = np.concatenate(outs, axis=0)
    errs[impl] = float(max(np.abs(full[s["row"], s["start"]:s["start"] + len(s["ids"])] - ref[j]).max()
                           for j, s in enumerate(seqs)))
  return errs


def encoder_suite(size: str = "small", threads: Optional[int] = None, reps: int = 5,
                  impls: Sequence[str] = ("xla", "blocked", "tiled"),
                  files: Sequence[str] = SLICE_FILES, queries: int = 2, passages: int = 12,
                  row_len="auto", rows_per_batch: int = 16,
                  torch_batch_sizes: Sequence[int] = (8, 32), log=print) -> Dict[str, Any]:
  """Forward tokens/s of the Flax encoder vs the strongest simple PyTorch configuration."""
  from logrerank_bench import protocol  # pylint: disable=g-import-not-at-top

  set_torch_threads(threads)
  _, _, cfg, choice, batch, info, seqs = prepare(size, files, queries, passages, row_len, log=log)
  real = int(info.real_tokens)
  assert real == sum(len(s["ids"]) for s in seqs)
  model, params = torch_model(cfg)
  dev = row_chunks(batch, rows_per_batch)
  fns, flax_out = flax_contenders(cfg, params, dev, impls, log)
  torch_fns, peers = torch_contenders(model, seqs, dev, torch_batch_sizes)
  fns.update(torch_fns)
  errs = max_abs_err_vs_torch(model, seqs, peers[f"torch_sorted_bs{torch_batch_sizes[0]}"],
                              flax_out)

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
  log(f"encoder {size}: {best_flax} / {strongest} = {protocol.ratio_text(r)}; attention-free "
      f"ceiling {protocol.ratio_text(c)}; load {load.result['loadavg_before']} -> "
      f"{load.result['loadavg_after']}, reliable={load.result['reliable']}")
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


def run_suite(suite: str, args, common: Dict[str, Any]) -> Dict[str, Any]:
  """One suite named on the command line (`common`: the arguments every suite takes)."""
  if suite == "encoder":
    return encoder_suite(impls=tuple(args.impls.split(",")),
                         torch_batch_sizes=tuple(int(x) for x in
                                                 args.torch_batch_sizes.split(",")),
                         **common)
  if suite == "train_step":
    from logrerank_bench.train_step import train_step_suite  # pylint: disable=g-import-not-at-top
    return train_step_suite(impl=args.train_impl, **common)
  if suite == "kernels":
    from logrerank_bench.kernel_suite import kernels_suite  # pylint: disable=g-import-not-at-top
    return kernels_suite(**common)
  raise SystemExit(f"unknown suite {suite!r}; known: {', '.join(SUITES)}")


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
  files = data_files(args.data)
  results = {"machine": protocol.machine_info(threads), "args": vars(args), "data_files": list(files),
             "load_at_start": protocol.load_report(0).result}
  start = time.perf_counter()

  def save():
    results["elapsed_s"] = time.perf_counter() - start
    if args.json:
      protocol.write_json(args.json, results)

  common = dict(size=args.size, threads=threads, reps=args.reps, files=files,
                queries=args.queries, passages=args.passages, row_len=args.row_len,
                rows_per_batch=args.rows_per_batch)
  for suite in [s.strip() for s in args.suite.split(",")]:
    results[suite] = run_suite(suite, args, common)
    save()
  save()
  return results


if __name__ == "__main__":
  main()
