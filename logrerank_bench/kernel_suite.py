"""The two kernels an encoder layer is made of, XLA vs torch on identical inputs
(`python -m logrerank_bench.encoder --suite kernels`).

Not `kernels.py`: a script run from this folder puts it first on sys.path, where transformers
looks for the Hugging Face `kernels` package.
"""

from typing import Any, Dict, Optional, Sequence

from logrerank_bench.defaults import SLICE_FILES
from logrerank_bench.encoder_common import prepare, set_torch_threads

DENSE_REPEAT = 10  # products per timed call in the kernels suite


def dense_contenders(x, w) -> Dict[str, Any]:
  """`jnp.dot` under jit vs `torch.mm`, float32 and bfloat16, DENSE_REPEAT products per call."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  fns = {}
  for dt, tdt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
    jx, jw = jnp.asarray(x, dt), jnp.asarray(w, dt)
    dot = jax.jit(lambda a, c: jnp.dot(a, c, preferred_element_type=a.dtype))
    tx, tw = torch.from_numpy(x).to(tdt), torch.from_numpy(w).to(tdt)
    # Ten products per timed call: one alone (~10 ms) would be timed with the wake-up of the
    # thread pools that the protocol's pause lets go idle.
    fns[f"dense_{dt}_xla"] = lambda dot=dot, jx=jx, jw=jw: [dot(jx, jw) for _ in range(DENSE_REPEAT)]
    fns[f"dense_{dt}_torch"] = lambda tx=tx, tw=tw: [torch.mm(tx, tw) for _ in range(DENSE_REPEAT)]
  return fns


def attention_contenders(cfg, seg, pos, rng):
  """Our `tiled_attention` vs torch's masked sdpa on one packed batch's segment layout (random
  q/k/v), forward and forward + backward, global and window; and each kind's max abs error."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from logrerank_jax.models.attention.tiled import tiled_attention  # pylint: disable=g-import-not-at-top
  b, l = seg.shape
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
  fns, errs = {}, {}
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
  return fns, errs


def kernels_suite(size: str = "small", threads: Optional[int] = None, reps: int = 5,
                  files: Sequence[str] = SLICE_FILES, queries: int = 2, passages: int = 12,
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
  import numpy as np  # pylint: disable=g-import-not-at-top
  from logrerank_bench import protocol  # pylint: disable=g-import-not-at-top

  set_torch_threads(threads)
  _, _, cfg, choice, batch, _, _ = prepare(size, files, queries, passages, row_len, log=log)
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
  fns = dense_contenders(x, w)
  attention_fns, errs = attention_contenders(cfg, seg, pos, rng)
  fns.update(attention_fns)
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
