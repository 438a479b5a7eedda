"""The accelerator attention kernels against `reference_attention`, on CPU.

- "pallas_gpu" (`models/attention/pallas_gpu.py`): its Pallas kernels run here in interpret mode,
  forward and backward, on padded, packed and windowed rows, float32 and bfloat16.
- "splash_tpu" (`models/attention/splash_tpu.py`): JAX's splash attention in interpret mode, forward and
  backward, global and windowed, plus its fallback for layouts its index window cannot express.
- The block schedule (`models/attention/block_schedule.py`): it covers every pair the mask keeps, and its
  work counts on hand-counted layouts.
- bf16 inference params (`models/precision.py`): same outputs, float32 scores.

Cotangents are zero at padding queries, as in the model (no real token reads a padding output;
the paths give padding queries different outputs). Shapes are small: interpret mode is slow.
"""

import numpy as np
import jax
import jax.numpy as jnp
import pytest

from logrerank_jax.models.attention import block_schedule as bs
from logrerank_jax.models.encoders import modernbert as mb
from logrerank_jax.models.attention.pallas_gpu import pallas_attention
from logrerank_jax.models.attention.reference import reference_attention
from logrerank_jax.models.attention.splash_tpu import positions_are_contiguous, splash_attention

L = 56  # not a multiple of the 16-token blocks: the kernel pads the rows
H, DH = 2, 16

# float32 bounds. Both sides form the same float32 logits (Dh = 16 products) and softmax; the
# kernel rescales its running sum once per visited key block (<= 4 here) and normalises after
# the value product, so each output, a convex combination of values |v| <= ~4, differs by a few
# float32 roundings per step: ~ (4 steps + 4) x 2^-24 x 4 ~ 2e-6. Gradients are sums of up to L
# such terms; compared relative to their scale (max |g|, at least 1): the same few-ulp errors,
# ~ 1e-6. 1e-5 leaves a 5x margin over both (measured values in the commit message).
ATOL_F32 = 1e-5
RTOL_GRAD_F32 = 1e-5
# bfloat16 bounds (unit roundoff u = 2^-8 relative). Forward: the probabilities are rounded to
# bf16 before the value product (each weight off by <= u, so the output by <= u x max|v| ~ 4u)
# and the output is rounded once more (u/2 x |o| <= 2u): <= 6u ~ 0.023; bound 0.03. Gradients:
# dS is rounded to bf16 before its products with q and k and p before its product with dO, so
# each term of a gradient sum is off by <= u relative: <= u x sum|terms|, which on these random
# inputs stays under 4 x max|g| (no more cancellation than that), plus the final rounding u/2:
# <= 4.5u ~ 0.018 of the scale; bound 0.03.
ATOL_BF16 = 0.03
RTOL_GRAD_BF16 = 0.03


def _rows():
  """[3, L] segment and position ids: packed segments + padding, one padded sequence, all padding."""
  seg = np.zeros((3, L), np.int32)
  pos = np.zeros((3, L), np.int32)
  start = 0
  for s, n in enumerate([13, 20, 5, 9]):  # 47 real tokens, 9 padding
    seg[0, start:start + n] = s + 1
    pos[0, start:start + n] = np.arange(n)
    start += n
  seg[1, :30] = 1  # a padded batch row: one sequence, arange positions
  pos[1] = np.arange(L)
  return seg, pos


def _unordered():
  """Not packer-like: segments interleave and positions jump, so no block can be skipped."""
  seg, pos = _rows()
  return seg[:, ::-1].copy(), (pos * 3) % 11


def _qkv(seed, dtype=jnp.float32):
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  q, k, v, dout = (jax.random.normal(key, (3, L, H, DH)) for key in keys)
  return q.astype(dtype), k.astype(dtype), v.astype(dtype), dout


def _vjp_of(attention, window, **kw):
  """jit of (q, k, v, seg, pos, dout) -> (out, (dq, dk, dv)). Every array is an argument: as
  closed-over constants, XLA would spend the compile constant-folding the masks."""
  def run(q, k, v, seg, pos, dout):
    out, vjp = jax.vjp(lambda q, k, v: attention(q, k, v, seg, pos, window, **kw), q, k, v)
    return out, vjp(dout.astype(out.dtype))
  return jax.jit(run)


def _reference(q, k, v, seg, pos, window):
  return reference_attention(q, k, v, seg, pos, window, lambda p: p)


def _compare(got, want, valid, atol, rtol_grad, what):
  out, grads = got
  out_ref, grads_ref = want
  f32 = lambda x: np.asarray(x, np.float32)
  assert np.isfinite(f32(out)).all(), what
  err = np.abs(f32(out)[valid] - f32(out_ref)[valid]).max()
  assert err <= atol, f"{what}: forward max abs error {err:.2e}"
  for wrt, g, g_ref in zip("qkv", grads, grads_ref):
    scale = max(float(np.abs(f32(g_ref)).max()), 1.0)
    err = float(np.abs(f32(g) - f32(g_ref)).max())
    assert err <= rtol_grad * scale, f"{what}: d{wrt} error {err:.2e} at scale {scale:.2e}"


CASES = [
    # (name, window, dtype, block_q, block_k): each a distinct branch of the kernel. The rows
    # hold packed segments + padding, a padded-batch row and an all-padding row. (The schedule's
    # full-row fallback for other layouts only widens the visited range: see the coverage test.)
    ("global-f32", None, jnp.float32, 16, 32),  # segment blocks only; bq != bk
    ("window-f32", 4, jnp.float32, 16, 16),  # ranges clipped to +-window
    ("window-bf16", 4, jnp.bfloat16, 16, 16),
]


@pytest.mark.parametrize("name,window,dtype,block_q,block_k", CASES, ids=[c[0] for c in CASES])
def test_pallas_kernel_equals_reference(name, window, dtype, block_q, block_k):
  seg, pos = _rows()
  q, k, v, dout = _qkv(seed=len(name), dtype=dtype)
  valid = seg > 0
  dout = dout * valid[..., None, None]
  seg, pos = jnp.asarray(seg), jnp.asarray(pos)
  got = _vjp_of(pallas_attention, window, block_q=block_q, block_k=block_k, interpret=True)(
      q, k, v, seg, pos, dout)
  # The reference runs in float32 on the same (bf16-rounded) inputs.
  f32 = lambda x: x.astype(jnp.float32)
  want = _vjp_of(_reference, window)(f32(q), f32(k), f32(v), seg, pos, dout)
  assert got[0].dtype == dtype and all(g.dtype == dtype for g in got[1])
  atol, rtol = (ATOL_F32, RTOL_GRAD_F32) if dtype == jnp.float32 else (ATOL_BF16, RTOL_GRAD_BF16)
  _compare(got, want, valid, atol, rtol, name)
  # Padding queries see nothing and get zeros (never NaN): the all-padding row too.
  assert float(np.abs(np.asarray(got[0], np.float32)[~valid]).max()) == 0.0


def test_block_schedule_covers_every_kept_pair():
  """Every (query, key) pair the mask keeps lies in a key block its query block visits, for
  packed rows (random segment lengths, padding), windows, and the unordered fallback."""
  rng = np.random.default_rng(0)
  # Padding inside a segment (arange positions): positions still follow tokens, and the segment's
  # keys span the hole.
  hole_seg = np.array([[1] * 10 + [0] * 3 + [1] * 8 + [2] * 10 + [0] * 9], np.int32)
  hole_pos = np.array([list(range(21)) + list(range(10)) + [0] * 9], np.int32)
  hole_pos[0, 10:13] = 0
  layouts = [_rows(), _unordered(), (hole_seg, hole_pos)]
  for _ in range(2):
    seg = np.zeros((2, 96), np.int32)
    pos = np.zeros((2, 96), np.int32)
    for r in range(2):
      start, s = 0, 1
      while start < 96 - 4:
        n = int(rng.integers(1, 40))
        n = min(n, 96 - start - int(rng.integers(0, 4)))
        if n <= 0:
          break
        seg[r, start:start + n], pos[r, start:start + n] = s, np.arange(n)
        start, s = start + n, s + 1
    layouts.append((seg, pos))
  # Two batches (positions_follow_tokens is decided per batch): the packer-like layouts padded
  # to whole blocks of every size below (segment 0 is padding, as the kernel pads), and the
  # unordered one (its schedule falls back to whole rows).
  pad = lambda x, n=96: np.pad(x, [(0, 0), (0, n - x.shape[1])])
  ordered = [layouts[0]] + layouts[2:]
  seg_o = np.concatenate([pad(s) for s, _ in ordered])
  pos_o = np.concatenate([pad(p) for _, p in ordered])
  rows = lambda x: np.pad(pad(x), [(0, seg_o.shape[0] - x.shape[0]), (0, 0)])  # same shape
  batches = [(seg_o, pos_o), (rows(layouts[1][0]), rows(layouts[1][1]))]
  traced = jax.jit(bs.token_key_ranges, static_argnums=(2,))  # what the kernels run
  for seg, pos in batches:
    for window in (None, 3, 8):
      # The host-side work counts run the same function on NumPy; the kernels trace it.
      lo, hi = bs.token_key_ranges(seg, pos, window, np)
      if window != 8:  # (one windowed case is enough to compare, and compiles less)
        for got, want in zip(traced(seg, pos, window), (lo, hi)):
          np.testing.assert_array_equal(np.asarray(got), want)
      keep = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] != 0)
      if window is not None:
        keep &= np.abs(pos[:, :, None] - pos[:, None, :]) <= window
      b_idx, qi, ki = np.nonzero(keep)
      for bq, bk in ((16, 16), (16, 32), (32, 16)):
        first, last = bs.row_block_bounds(lo, hi, bq, bk)
        qb, kb = qi // bq, ki // bk
        assert np.all(first[b_idx, qb] <= kb) and np.all(kb <= last[b_idx, qb]), (window, bq, bk)
        # The dkv kernel's schedule (ranges of key blocks over query blocks) covers them too.
        kfirst, klast = bs.row_block_bounds(lo, hi, bk, bq)
        assert np.all(kfirst[b_idx, kb] <= qb) and np.all(qb <= klast[b_idx, kb])
    # Skipping really happens on the ordered batch (else this test could not tell).
    if seg is batches[0][0]:
      first, last = bs.row_block_bounds(lo, hi, 16, 16)
      assert np.maximum(last - first + 1, 0).sum() < first.size * (seg.shape[1] // 16)


def test_attention_pairs_known_answers():
  # One row of 16 tokens: segments of 5, 3 and 4 tokens, then 4 padding; blocks of 4.
  seg = np.array([[1] * 5 + [2] * 3 + [3] * 4 + [0] * 4], np.int32)
  pos = np.array([list(range(5)) + list(range(3)) + list(range(4)) + [0] * 4], np.int32)
  pairs = lambda path, window, **kw: bs.attention_pairs(path, seg, pos, window, **kw)
  # Global: query blocks 0 and 1 reach keys 0..7 (2 key blocks each), block 2 its own block,
  # block 3 (padding) nothing: 5 blocks x 16. Kept pairs: 5^2 + 3^2 + 4^2 = 50.
  assert pairs("pallas_gpu", None, block_q=4, block_k=4) == {"computed": 80, "needed": 50}
  assert pairs("xla", None) == {"computed": 256, "needed": 50}
  assert pairs("tiled", None)["computed"] == 256
  # Window 1: the same 5 blocks; kept pairs per segment n + 2 (n - 1): 13 + 7 + 10 = 30.
  assert pairs("pallas_gpu", 1, block_q=4, block_k=4) == {"computed": 80, "needed": 30}
  # Blocked/tiled windows: 16 blocks of 1 token against 3 tokens each.
  assert pairs("blocked", 1)["computed"] == 48 and pairs("tiled", 1)["computed"] == 48
  # Splash, rows padded to its 128-token blocks: global computes every block; window 64 on 512
  # tokens keeps the blocks within one of the diagonal: 4 + 2 x 3 = 10 of 16.
  assert pairs("splash_tpu", None)["computed"] == 128 * 128
  wide = np.ones((1, 512), np.int32)
  band = bs.attention_pairs("splash_tpu", wide, np.arange(512)[None], 64)
  assert band["computed"] == 10 * 128 * 128
  # needed = sum over queries of the keys within 64 = 512 x 129 - 2 x (64 x 65 / 2).
  assert band["needed"] == 512 * 129 - 64 * 65


@pytest.mark.parametrize("window", [None, 8], ids=["global", "window8"])
def test_splash_interpret_equals_reference(window):
  """Splash (interpret mode) on two packed rows of 256 tokens, 128-token blocks."""
  seg = np.zeros((2, 256), np.int32)
  pos = np.zeros((2, 256), np.int32)
  for r, lens in enumerate([[100, 70, 60], [256]]):
    start = 0
    for s, n in enumerate(lens):
      seg[r, start:start + n], pos[r, start:start + n] = s + 1, np.arange(n)
      start += n
  keys = jax.random.split(jax.random.PRNGKey(5), 4)
  q, k, v, dout = (jax.random.normal(key, (2, 256, 2, 16)) for key in keys)
  valid = seg > 0
  dout = dout * valid[..., None, None]
  seg, pos = jnp.asarray(seg), jnp.asarray(pos)
  got = _vjp_of(splash_attention, window, interpret=True)(q, k, v, seg, pos, dout)
  want = _vjp_of(_reference, window)(q, k, v, seg, pos, dout)
  _compare(got, want, valid, ATOL_F32, RTOL_GRAD_F32, f"splash window={window}")


def test_positions_are_contiguous_known_answers():
  seg = jnp.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 0, 0, 0], [1, 1, 2, 2, 1, 0], [1, 1, 1, 1, 0, 0],
                   [1, 1, 0, 1, 0, 0], [1, 1, 0, 1, 0, 0]])
  pos = jnp.array([[0, 1, 2, 0, 1, 0], [0, 2, 3, 0, 0, 0], [0, 1, 0, 1, 2, 0], [5, 6, 7, 8, 0, 0],
                   [0, 1, 2, 3, 0, 0], [0, 1, 0, 5, 0, 0]])
  # packed; a position gap; a segment that resumes; an offset start (still steps by 1); a hole
  # with arange positions (distances agree); a hole the positions jump over (they do not).
  check = jax.jit(positions_are_contiguous)
  for row, expected in enumerate([True, False, False, True, True, False]):
    assert bool(check(seg[row:row + 1], pos[row:row + 1])) == expected, row


def test_bf16_inference_params_same_outputs_float32_scores():
  """`log_params_for_inference` stores the encoder's matrices in bf16: the bf16 encoder gives
  bit-identical outputs to running it on the float32 params (flax casts them to bf16 per call
  anyway); the local stage's scores and softmaxes stay float32 on the cast params; the
  encoder's matrices take half the bytes, and norms, heads and the graph reranker keep float32."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from logrerank_jax.models import log_reranker as lr  # pylint: disable=g-import-not-at-top
  from logrerank_jax.models.precision import (encoder_params_for_inference,  # pylint: disable=g-import-not-at-top
                                              log_params_for_inference)

  cfg = lr.LoGConfig.tiny(vocab_size=64)
  enc_cfg = cfg.local.encoder.replace(dtype=jnp.bfloat16, attention_impl="xla", norm_bias=True,
                                      attention_bias=True, mlp_bias=True)
  cfg = dataclasses.replace(cfg, local=dataclasses.replace(cfg.local, encoder=enc_cfg))
  ids = jnp.asarray(np.random.default_rng(0).integers(1, 64, (2, 24)), jnp.int32)
  # Two layers (one global, one window) are every kind of layer; fewer to compile.
  enc = mb.ModernBertEncoder(enc_cfg.replace(num_hidden_layers=2, layer_types=None))
  params = jax.jit(lambda key: enc.init(key, ids)["params"])(jax.random.PRNGKey(0))
  cast = encoder_params_for_inference(params, enc_cfg)
  run = lambda p: jax.jit(enc.apply)({"params": p}, ids)
  np.testing.assert_array_equal(np.asarray(run(cast), np.float32),
                                np.asarray(run(params), np.float32))
  nbytes = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))
  norms = sum(x.nbytes for p, x in jax.tree_util.tree_leaves_with_path(params)
              if "norm" in jax.tree_util.keystr(p))
  assert norms and nbytes(cast) == (nbytes(params) - norms) // 2 + norms
  # The whole LoG tree, traced only (no compile): the cast touches the encoder alone, and the
  # local stage run on it still returns float32 scores and softmaxes.
  batch = lr.example_batch(num_rows=1, row_len=24)
  model = lr.LoGReranker(cfg)
  shapes = jax.eval_shape(lambda key: lr.init_params(cfg, batch, key), jax.random.PRNGKey(0))
  cast_shapes = jax.eval_shape(lambda p: log_params_for_inference(p, cfg), shapes)
  rest = [cast_shapes["global"], {k: v for k, v in cast_shapes["local"].items() if k != "encoder"}]
  assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(rest))
  assert {x.dtype for x in jax.tree_util.tree_leaves(cast_shapes["local"]["encoder"])} == {
      jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)}
  out = jax.eval_shape(lambda p: model.apply({"params": p}, batch,
                                             method=lr.LoGReranker.local_nodes), cast_shapes)
  for key in ("h", "role_probs", "intent_probs", "local_logit", "local_score"):
    assert out[key].dtype == jnp.float32, key
