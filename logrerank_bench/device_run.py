"""One prepared accelerator run: every figure of issue 25 in one process and one JSON.

  python -m logrerank_bench.device_run --size base --dtype bfloat16 --data runs/gpu_carry/data \
      --json gpu.json                                  # on the GPU (tools/benchmark_gpu.sh)
  LOGRERANK_PALLAS_INTERPRET=1 python -m logrerank_bench.device_run --size tiny --attention-impl \
      pallas_gpu --json dry.json                       # CPU rehearsal (--dry-run of the script)

Sections, in this order (the JSON is rewritten after each, so a run cut short keeps what it
measured; JAX's peak memory only grows, so inference comes before training):
  attention_work  `logrerank_bench.attention_work`: attention_work_efficiency per path.
  log             LoG per 50-passage query on real pools, one query per call: device ms of one
                  `log_forward` jit (bf16 inference params, `models/precision.py`), host ms
                  (split, tokenise, pack), end-to-end ms through `logrerank_jax.Reranker`; JAX
                  peak memory. Torch peer: transformers' ModernBertModel (sdpa) over the same
                  (query, passage) sequences, length-sorted batches: device ms per query, peak.
  encoder         the local encoder alone on every query's packed rows: tokens/s and MFU (useful
                  FLOPs of the real sequences, `suites.encoder_flops`, over the datasheet peak) for
                  the resolved attention path and for "xla"; torch sdpa on sorted batches.
  train           local-stage training cost: encoder + scalar head on mean pooling, forward,
                  backward and AdamW in one jit (float32 master params, compute dtype as --dtype,
                  state donated), tokens/s; torch: the same with autocast and torch.optim.AdamW.
Timings: `logrerank_bench.protocol.interleaved` (Flax and torch alternate), median and spread.
"""

import argparse
import json
import time
from typing import Any, Dict, Optional

from logrerank_bench import protocol
from logrerank_bench.defaults import SIZES, data_files


def _gb(x: Optional[float]) -> Optional[float]:
  return None if x is None else x / 1e9


class DeviceRun:
  """Holds the pools, tokenizer, configs and the JSON being written."""

  def __init__(self, args):
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    import torch  # pylint: disable=g-import-not-at-top
    from logrerank_bench import suites as bm  # pylint: disable=g-import-not-at-top
    self.args, self.bm = args, bm
    self.dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    self.torch_device = "cuda" if torch.cuda.is_available() else "cpu"
    files = data_files(args.data)
    self.pools = bm.load_pools(files, pool_size=args.passages, limit=args.queries)
    self.tokenizer = bm.benchmark_tokenizer(self.pools)
    self.start = time.perf_counter()
    self.results: Dict[str, Any] = {
        "machine": protocol.machine_info(load_average=True), "args": vars(args),
        "data_files": files,
        "torch_device": self.torch_device, "peak_tflops": bm.peak_tflops(),
        "jax_backend": jax.default_backend()}

  def save(self):
    self.results["elapsed_s"] = time.perf_counter() - self.start
    if self.args.json:
      protocol.write_json(self.args.json, self.results)

  def over_budget(self) -> bool:
    return bool(self.args.time_budget) and (
        time.perf_counter() - self.start > self.args.time_budget)

  # --------------------------------------------------------------------------- models
  def log_config(self):
    return self.bm.log_config(self.args.size, len(self.tokenizer), self.dtype,
                              self.args.attention_impl)

  def torch_model(self, enc_cfg):
    """transformers' ModernBertModel (sdpa) with enc_cfg, on the torch device, in --dtype."""
    import torch  # pylint: disable=g-import-not-at-top
    model = self.bm.torch_modernbert(enc_cfg)
    if self.args.dtype == "bfloat16":
      model = model.to(torch.bfloat16)
    return model.to(self.torch_device)

  def torch_peak_gb(self, reset: bool = False) -> Optional[float]:
    import torch  # pylint: disable=g-import-not-at-top
    if self.torch_device != "cuda":
      return None
    peak = torch.cuda.max_memory_allocated() / 1e9
    if reset:
      torch.cuda.reset_peak_memory_stats()
    return peak

  # --------------------------------------------------------------------------- sections
  def attention_work(self) -> Dict[str, Any]:
    from logrerank_bench.attention_work import attention_work_suite  # pylint: disable=g-import-not-at-top
    out = attention_work_suite(self.pools, self.tokenizer, self.args.size,
                               row_lens=(self.bm.row_len_for(self.args.size), 2048))
    self.results["attention_work_efficiency"] = out["attention_work_efficiency"]
    return out

  def packed(self):
    from logrerank_jax.data.packing import PackingConfig, pack_queries  # pylint: disable=g-import-not-at-top
    pcfg = PackingConfig(row_len=self.bm.row_len_for(self.args.size))
    return pcfg, [pack_queries([self.bm.pool_query(p)], self.tokenizer, pcfg)
                  for p in self.pools]

  def log(self) -> Dict[str, Any]:
    """LoG per query (device, host, end to end) and the torch encoder over the same sequences."""
    import jax  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    import torch  # pylint: disable=g-import-not-at-top
    import logrerank_jax  # pylint: disable=g-import-not-at-top
    from logrerank_jax.models import log_reranker as lr  # pylint: disable=g-import-not-at-top
    from logrerank_jax.models.precision import log_params_for_inference  # pylint: disable=g-import-not-at-top
    bm = self.bm
    cfg = self.log_config()
    pcfg, packed = self.packed()
    dev = [jax.device_put(lr.device_batch(b)) for b, _ in packed]
    params = bm.init_log_params(cfg, dev[0])
    infer = log_params_for_inference(params, cfg)
    fwd = jax.jit(lambda p, b: lr.log_forward(p, b, cfg)["final_score"])
    reranker = logrerank_jax.Reranker(params, cfg, self.tokenizer, packing=pcfg,
                                      queries_per_batch=1)
    model = self.torch_model(cfg.local.encoder)
    peers = [bm.torch_batches(bm.packed_sequences(b), self.args.torch_batch_size,
                              device=self.torch_device) for b, _ in packed]

    def run_torch(batches):
      with torch.inference_mode():
        return [model(input_ids=i, attention_mask=m).last_hidden_state for i, m, _ in batches]

    def host(pool):  # what the engine does per query before the device: split, tokenise, pack
      bm.clear_split_cache()
      from logrerank_jax.data.packing import pack_queries  # pylint: disable=g-import-not-at-top
      return pack_queries([bm.pool_query(pool)], self.tokenizer, pcfg)

    def engine(pool):
      bm.clear_split_cache()
      return bm.engine_rerank(reranker, pool, None)

    fns = {}
    for i, pool in enumerate(self.pools):
      fns[f"log_device_q{i}"] = lambda b=dev[i]: fwd(infer, b)
      fns[f"torch_device_q{i}"] = lambda t=peers[i]: run_torch(t)
      fns[f"log_host_q{i}"] = lambda p=pool: host(p)
      fns[f"log_engine_q{i}"] = lambda p=pool: engine(p)
    with bm.CompileCounter() as cc:
      for f in fns.values():  # compile every shape
        protocol.block(f())
    jax_peak_infer = bm.device_peak_memory_gb()
    torch_peak = self.torch_peak_gb(reset=True)
    timing = protocol.interleaved(fns, reps=self.args.reps, warmup=1, pause_s=self.args.pause)
    per = lambda prefix: [timing[f"{prefix}_q{i}"]["median"] for i in range(len(self.pools))]
    ms = lambda xs: {"mean": 1e3 * float(np.mean(xs)), "max": 1e3 * float(np.max(xs)),
                     "per_query": [1e3 * x for x in xs]}
    torch_host = []
    for pool in self.pools:  # the torch peer's host work: tokenise (query, passage) pairs
      t0 = time.perf_counter()
      pair = bm.passage_query(pool)
      self.tokenizer([pair.query] * len(pair.passages), [p[0] for p in pair.passages])
      torch_host.append(time.perf_counter() - t0)
    out = {"queries": len(self.pools), "attention_impl": cfg.local.encoder.attention_impl,
           "resolved_attention_impl": cfg.local.encoder.resolved_attention_impl(),
           "passages_per_query": float(np.mean([len(p["ctxs"]) for p in self.pools])),
           "real_tokens_per_query": float(np.mean([i.real_tokens for _, i in packed])),
           "rows_per_query": [int(b.input_ids.shape[0]) for b, _ in packed],
           "warmup_compilations": cc.count,
           "log_device_ms": ms(per("log_device")), "log_host_ms": ms(per("log_host")),
           "log_end_to_end_ms": ms(per("log_engine")),
           "log_end_to_end_note": "through logrerank_jax.Reranker with float32 params (the "
                                  "engine does not cast to bf16 yet); device ms uses the "
                                  "bf16 inference params",
           "jax_peak_memory_gb": jax_peak_infer,
           "torch": {"device_ms": ms(per("torch_device")),
                     "host_ms": ms(torch_host),
                     "end_to_end_ms": ms([a + b for a, b in zip(per("torch_device"), torch_host)]),
                     "peak_memory_gb": torch_peak,
                     "batch_size": self.args.torch_batch_size},
           "timing_s": {k: {kk: v[kk] for kk in ("median", "min", "max")}
                        for k, v in timing.items()}}
    return out

  def encoder(self) -> Dict[str, Any]:
    """Encoder tokens/s and MFU, resolved attention path and "xla", vs torch sdpa."""
    import jax  # pylint: disable=g-import-not-at-top
    import torch  # pylint: disable=g-import-not-at-top
    from logrerank_jax.models.encoders import modernbert as mb  # pylint: disable=g-import-not-at-top
    from logrerank_jax.models.precision import encoder_params_for_inference  # pylint: disable=g-import-not-at-top
    bm = self.bm
    enc_cfg = self.log_config().local.encoder
    _, packed = self.packed()
    keys = ("input_ids", "attention_mask", "segment_ids", "position_ids")
    dev = [{k: jax.device_put(getattr(b, k)) for k in keys} for b, _ in packed]
    seqs = [s for b, _ in packed for s in bm.packed_sequences(b)]
    real = sum(len(s) for s in seqs)
    flops = bm.encoder_flops(enc_cfg, [len(s) for s in seqs])
    params = encoder_params_for_inference(
        mb.init_params(enc_cfg, jax.random.PRNGKey(0)), enc_cfg)
    fns = {}
    impls = {"resolved": enc_cfg, "xla": enc_cfg.replace(attention_impl="xla")}
    for name, c in impls.items():
      enc = mb.ModernBertEncoder(c)
      f = jax.jit(lambda p, b, enc=enc: enc.apply({"params": p}, *(b[k] for k in keys)))
      fns[f"flax_{name}"] = lambda f=f: [f(params, b) for b in dev]
    model = self.torch_model(enc_cfg)
    batches = bm.torch_batches(seqs, self.args.torch_batch_size, device=self.torch_device)

    def run_torch():
      with torch.inference_mode():
        return [model(input_ids=i, attention_mask=m).last_hidden_state for i, m, _ in batches]

    fns["torch_sdpa"] = run_torch
    for f in fns.values():
      protocol.block(f())
    timing = protocol.interleaved(fns, reps=self.args.reps, warmup=1, pause_s=self.args.pause)
    peak = bm.peak_tflops()
    out = {"real_tokens": real, "sequences": len(seqs), "useful_tflop": flops / 1e12,
           "resolved_attention_impl": enc_cfg.resolved_attention_impl(),
           "computed_tokens": int(sum(b["input_ids"].size for b in dev)),
           "torch_computed_tokens": int(sum(i.numel() for i, _, _ in batches)), "runs": {}}
    for k, t in timing.items():
      s = t["median"]
      out["runs"][k] = {"s": s, "tokens_per_s": real / s,
                        "mfu": None if peak is None else flops / s / (peak * 1e12),
                        "min_s": t["min"], "max_s": t["max"]}
    return out

  def train(self) -> Dict[str, Any]:
    """Local-stage training cost: encoder + head, forward + backward + AdamW, tokens/s."""
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    import optax  # pylint: disable=g-import-not-at-top
    import torch  # pylint: disable=g-import-not-at-top
    from logrerank_jax.models.encoders import modernbert as mb  # pylint: disable=g-import-not-at-top
    bm = self.bm
    enc_cfg = self.log_config().local.encoder
    _, packed = self.packed()
    keys = ("input_ids", "attention_mask", "segment_ids", "position_ids")
    # The local stage trains on micro-batches of rows: the first query's packed rows.
    batch = packed[0][0]
    b = {k: jax.device_put(getattr(batch, k)) for k in keys}
    seqs = bm.packed_sequences(batch)
    real = sum(len(s) for s in seqs)
    nseg = int(batch.segment_ids.max())
    target = jnp.asarray(np.random.default_rng(0).normal(size=(batch.segment_ids.shape[0], nseg)),
                         jnp.float32)
    enc = mb.ModernBertEncoder(enc_cfg)
    d = enc_cfg.hidden_size
    params = {"encoder": mb.init_params(enc_cfg, jax.random.PRNGKey(0)),
              "head": jnp.zeros((d,), jnp.float32)}
    tx = optax.adamw(1e-5, weight_decay=0.01)

    def loss_fn(p):
      h = enc.apply({"params": p["encoder"]}, *(b[k] for k in keys)).astype(jnp.float32)
      onehot = (b["segment_ids"][:, None, :] == jnp.arange(1, nseg + 1)[None, :, None])
      w = onehot.astype(jnp.float32)
      pooled = jnp.einsum("rsl,rld->rsd", w, h) / jnp.maximum(w.sum(-1), 1.0)[..., None]
      err = jnp.where(w.sum(-1) > 0, pooled @ p["head"] - target, 0.0)
      return jnp.sum(err ** 2)

    def _step(state):
      p, opt = state
      loss, g = jax.value_and_grad(loss_fn)(p)
      upd, opt = tx.update(g, opt, p)
      return (optax.apply_updates(p, upd), opt), loss

    step = jax.jit(_step, donate_argnums=(0,))  # the train state is updated in place
    state = [(params, tx.init(params))]

    def flax_step():
      state[0], loss = step(state[0])
      return loss

    model = self.torch_model(enc_cfg).float().train()
    head = torch.nn.Linear(d, 1).to(self.torch_device)
    opt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=1e-5,
                            weight_decay=0.01)
    tb = bm.torch_batches(seqs, self.args.torch_batch_size, device=self.torch_device)
    autocast = self.args.dtype == "bfloat16"

    def torch_step():
      loss = None
      for ids, mask, _ in tb:  # one optimiser step per batch: the same tokens as one Flax step
        with torch.autocast(self.torch_device, dtype=torch.bfloat16, enabled=autocast):
          h = model(input_ids=ids, attention_mask=mask).last_hidden_state
          m = mask[..., None].to(h.dtype)
          loss = (head((h * m).sum(1) / m.sum(1)).float() ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
      return loss.detach()

    fns = {"flax": flax_step, "torch_sdpa": torch_step}
    for f in fns.values():
      protocol.block(f())
    timing = protocol.interleaved(fns, reps=self.args.reps, warmup=1, pause_s=self.args.pause)
    return {"real_tokens_per_step": real, "rows": int(batch.input_ids.shape[0]),
            "resolved_attention_impl": enc_cfg.resolved_attention_impl(),
            "tokens_per_s": {k: real / t["median"] for k, t in timing.items()},
            "timing_s": {k: {kk: t[kk] for kk in ("median", "min", "max")}
                         for k, t in timing.items()},
            "jax_peak_memory_gb": self.bm.device_peak_memory_gb(),
            "torch_peak_memory_gb": self.torch_peak_gb()}


SECTIONS = ("attention_work", "log", "encoder", "train")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--size", default="base", choices=SIZES)
  p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
  p.add_argument("--attention-impl", default="auto", help="ModernBertConfig.attention_impl")
  p.add_argument("--data", default="", help="folder with scifact_test.jsonl / pubmed_test.jsonl")
  p.add_argument("--passages", type=int, default=50)
  p.add_argument("--queries", type=int, default=4, help="queries per file")
  p.add_argument("--reps", type=int, default=5)
  p.add_argument("--pause", type=float, default=0.05, help="seconds between timed calls")
  p.add_argument("--torch-batch-size", type=int, default=16)
  p.add_argument("--sections", default=",".join(SECTIONS))
  p.add_argument("--time-budget", type=float, default=0.0,
                 help="seconds; sections not started before this much time has passed are skipped")
  p.add_argument("--json", default="")
  return p.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  run = DeviceRun(args)
  for name in [s.strip() for s in args.sections.split(",") if s.strip()]:
    if name not in SECTIONS:
      raise SystemExit(f"unknown section {name!r}; known: {SECTIONS}")
    if run.over_budget():
      run.results[name] = {"skipped": f"time budget {args.time_budget:.0f} s spent"}
      print(f"{name}: skipped (time budget)", flush=True)
      continue
    t0 = time.perf_counter()
    try:
      run.results[name] = getattr(run, name)()
    except Exception as e:  # pylint: disable=broad-except
      # One failed section must not cost the others' figures on a rented device.
      import traceback  # pylint: disable=g-import-not-at-top
      traceback.print_exc()
      run.results[name] = {"error": f"{type(e).__name__}: {e}"}
    run.results[name]["section_s"] = time.perf_counter() - t0
    print(f"{name}: {json.dumps(run.results[name], default=str)[:2000]}", flush=True)
    run.save()
  run.save()
  return run.results


if __name__ == "__main__":
  main()
