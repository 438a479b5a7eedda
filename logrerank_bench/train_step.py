"""Train-step throughput: forward + backward + AdamW of the encoder and a scalar head, Flax vs
transformers' ModernBertModel, on the same sequences (`python -m logrerank_bench.encoder --suite
train_step`; the inputs, the peer and the floor are `logrerank_bench.encoder_common`'s).
"""

import time
from typing import Any, Dict, Optional, Sequence

from logrerank_bench.defaults import SLICE_FILES
from logrerank_bench.encoder_common import (FLOOR, attention_free_forward, prepare, row_chunks,
                                            set_torch_threads, torch_batches, torch_model)


def flax_train(cfg, enc_params, batch, seqs, targets, head_w, rows_per_batch: int, lr: float):
  """Flax: packed rows, one jit with the train state donated; and the same step compiled
  attention-free. Returns (one pass of steps, one pass of floor steps, the device batches)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from logrerank_jax.models.encoders.modernbert import ModernBertEncoder  # pylint: disable=g-import-not-at-top
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
  return flax_epoch, floor_epoch, dev


def torch_train(model, seqs, targets, head_w, lr: float, torch_batch_size: int):
  """Torch: sdpa, length-sorted batches padded to their longest, torch.optim.AdamW. Returns (one
  pass of steps, the batches)."""
  import torch  # pylint: disable=g-import-not-at-top
  head = torch.nn.Linear(len(head_w), 1)
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

  return torch_epoch, tb


def train_step_suite(size: str = "small", threads: Optional[int] = None, reps: int = 5,
                     impl: str = "tiled", files: Sequence[str] = SLICE_FILES,
                     queries: int = 2, passages: int = 12, row_len="auto",
                     rows_per_batch: int = 16, torch_batch_size: int = 8, lr: float = 1e-4,
                     log=print) -> Dict[str, Any]:
  """Forward + backward + AdamW of encoder + scalar head on mean pooling: tokens/s, Flax vs torch.

  Both sides regress a fixed random target per sequence with a mean-squared error through
  mean pooling over each sequence and a linear scalar head. Flax: packed rows, one jit with the
  train state donated. Torch: sdpa, length-sorted batches padded to their longest,
  torch.optim.AdamW. One timed call = one pass over every sequence (one step per batch).
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  from logrerank_bench import protocol  # pylint: disable=g-import-not-at-top

  set_torch_threads(threads)
  _, _, cfg, choice, batch, info, seqs = prepare(size, files, queries, passages, row_len, impl,
                                                 log=log)
  real = int(info.real_tokens)
  model, enc_params = torch_model(cfg)
  model.train()
  d = cfg.hidden_size
  rng = np.random.default_rng(0)
  targets = rng.normal(size=len(seqs)).astype(np.float32)
  head_w = (rng.normal(size=(d,)) / np.sqrt(d)).astype(np.float32)
  flax_epoch, floor_epoch, dev = flax_train(cfg, enc_params, batch, seqs, targets, head_w,
                                            rows_per_batch, lr)
  torch_epoch, tb = torch_train(model, seqs, targets, head_w, lr, torch_batch_size)

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
      f"tok/s, ratio {protocol.ratio_text(r)}; attention-free ceiling {protocol.ratio_text(c)}; "
      f"load {load.result['loadavg_before']} -> {load.result['loadavg_after']}")
  return out
