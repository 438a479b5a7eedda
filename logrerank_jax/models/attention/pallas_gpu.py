"""Block-skipping flash attention for GPUs: a Pallas (Triton) kernel with its backward kernels.

`attention_impl="pallas_gpu"` of `ModernBertConfig`. Exact masked attention (the semantics of
`reference.reference_attention` on real tokens) that only visits the key blocks a query block
can see: the schedule of `block_schedule.token_key_ranges` / `block_bounds` (each packed
segment's own blocks on global layers; those blocks clipped to +-window on window layers). The
segment (and window) mask is still applied element-wise inside each visited block, so the
result is exact for any layout; the schedule only decides what is skipped.

Forward: one program per (query block, row, head), an online softmax over its key blocks in
float32 (flash attention), saving each query's log-sum-exp. Backward: two kernels of the same
shape as the forward, one over query blocks (dq) and one over key blocks (dk, dv); the mask is
symmetric, so a key block's queries come from the same ranges. The backward recomputes the
probabilities from the saved log-sum-exp, as flash attention does; it is exact (the same
formulas as autodiff of the reference, in another summation order) and never stores [L, L].

Padding queries (segment 0) see no key and get a zero output (the reference gives them a
uniform average); no real token reads them, and their cotangents are zero in the model.

On CPU the kernels run in Pallas interpret mode (`interpret=True`), which is how the tests
check them; the Triton lowering needs an NVIDIA GPU (compute capability >= 8.0), head_dim a
power of two >= 16, and block sizes powers of two >= 16 (`unsupported_reason`).
"""

import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from logrerank_jax.models.attention.block_schedule import (GPU_BLOCK, block_bounds, pad_to_blocks,
                                                  token_key_ranges)

DEFAULT_BLOCK_Q = DEFAULT_BLOCK_K = GPU_BLOCK  # see block_schedule.GPU_BLOCK
# Masked logits: finite (no inf - inf), far below any real logit (jax's Pallas kernels use it).
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def _power_of_two(n: int) -> bool:
  return n >= 1 and n & (n - 1) == 0


def unsupported_reason(head_dim: int, block_q: int = DEFAULT_BLOCK_Q,
                       block_k: int = DEFAULT_BLOCK_K) -> Optional[str]:
  """Why the compiled (Triton) kernel cannot take these shapes, or None if it can."""
  if not _power_of_two(head_dim) or head_dim < 16:
    return f"head_dim {head_dim} is not a power of two >= 16 (Triton tiles)"
  for name, b in (("block_q", block_q), ("block_k", block_k)):
    if not _power_of_two(b) or b < 16:
      return f"{name} {b} is not a power of two >= 16 (Triton tiles)"
  return None


def _compiler_params(num_warps: int = 4, num_stages: int = 2):
  from jax.experimental.pallas import triton as plgpu  # pylint: disable=g-import-not-at-top
  params = getattr(plgpu, "CompilerParams", None) or getattr(plgpu, "TritonCompilerParams")
  return params(num_warps=num_warps, num_stages=num_stages)


def _dot(a, b, contract_a: int, contract_b: int):
  """2-D product contracting the given axes, accumulated in float32."""
  return lax.dot_general(a, b, (((contract_a,), (contract_b,)), ((), ())),
                         preferred_element_type=jnp.float32)


def _pair_mask(seg_q, seg_k, pos_q, pos_k, window):
  """[nq, nk]: same nonzero segment and, windowed, within `window` positions."""
  mask = (seg_q[:, None] == seg_k[None, :]) & (seg_k[None, :] != 0)
  if window is not None:
    mask = mask & (jnp.abs(pos_q[:, None] - pos_k[None, :]) <= window)
  return mask


# ----------------------------------------------------------------------------- kernels
# Refs: q/k/v/o/do blocks are [tokens, Dh] (row and head squeezed); seg/pos/lo/hi are whole rows
# [L]; lse/delta are [tokens] (a block) or [L] (whole row).

def _forward_kernel(q_ref, k_ref, v_ref, seg_ref, pos_ref, lo_ref, hi_ref, o_ref, lse_ref, *,
                    scale, window, block_q, block_k):
  qs = pl.ds(pl.program_id(0) * block_q, block_q)
  q = q_ref[...]
  seg_q, pos_q = seg_ref[qs], pos_ref[qs]
  first, last = block_bounds(lo_ref[qs], hi_ref[qs], block_k)

  def body(j, carry):
    acc, m, l = carry
    ks = pl.ds(j * block_k, block_k)
    mask = _pair_mask(seg_q, seg_ref[ks], pos_q, pos_ref[ks], window)
    s = jnp.where(mask, _dot(q, k_ref[ks, :], 1, 1) * scale, _MASK_VALUE)  # [bq, bk] f32
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    # Masked entries are zeroed, not just made small: a block whose queries see none of its
    # keys then adds nothing, whatever the running max.
    p = jnp.where(mask, jnp.exp(s - m_new[:, None]), 0.0)
    corr = jnp.exp(m - m_new)
    v = v_ref[ks, :]
    acc = acc * corr[:, None] + _dot(p.astype(v.dtype), v, 1, 0)
    return acc, m_new, l * corr + jnp.sum(p, axis=1)

  init = (jnp.zeros(q.shape, jnp.float32), jnp.full((block_q,), _MASK_VALUE, jnp.float32),
          jnp.zeros((block_q,), jnp.float32))
  acc, m, l = lax.fori_loop(first, last + 1, body, init)
  seen = l > 0  # padding queries see no key
  l_safe = jnp.where(seen, l, 1.0)
  o_ref[...] = jnp.where(seen[:, None], acc / l_safe[:, None], 0.0).astype(o_ref.dtype)
  lse_ref[...] = m + jnp.log(l_safe)


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, seg_ref, pos_ref, lo_ref, hi_ref,
               dq_ref, *, scale, window, block_q, block_k):
  qs = pl.ds(pl.program_id(0) * block_q, block_q)
  q, do = q_ref[...], do_ref[...]
  lse, delta = lse_ref[...], delta_ref[...]
  seg_q, pos_q = seg_ref[qs], pos_ref[qs]
  first, last = block_bounds(lo_ref[qs], hi_ref[qs], block_k)

  def body(j, dq):
    ks = pl.ds(j * block_k, block_k)
    k, v = k_ref[ks, :], v_ref[ks, :]
    mask = _pair_mask(seg_q, seg_ref[ks], pos_q, pos_ref[ks], window)
    p = jnp.where(mask, jnp.exp(_dot(q, k, 1, 1) * scale - lse[:, None]), 0.0)
    ds = p * (_dot(do, v, 1, 1) - delta[:, None])  # [bq, bk]
    return dq + _dot(ds.astype(k.dtype), k, 1, 0)

  dq = lax.fori_loop(first, last + 1, body, jnp.zeros(q.shape, jnp.float32))
  dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, seg_ref, pos_ref, lo_ref, hi_ref,
                dk_ref, dv_ref, *, scale, window, block_q, block_k):
  ks = pl.ds(pl.program_id(0) * block_k, block_k)
  k, v = k_ref[...], v_ref[...]
  seg_k, pos_k = seg_ref[ks], pos_ref[ks]
  # The mask is symmetric: the queries that see these keys lie in the keys' own ranges.
  first, last = block_bounds(lo_ref[ks], hi_ref[ks], block_q)

  def body(i, carry):
    dk, dv = carry
    qs = pl.ds(i * block_q, block_q)
    q, do = q_ref[qs, :], do_ref[qs, :]
    mask = _pair_mask(seg_ref[qs], seg_k, pos_ref[qs], pos_k, window)
    p = jnp.where(mask, jnp.exp(_dot(q, k, 1, 1) * scale - lse_ref[qs][:, None]), 0.0)
    dv = dv + _dot(p.astype(do.dtype), do, 0, 0)  # [bk, Dh]
    ds = p * (_dot(do, v, 1, 1) - delta_ref[qs][:, None])
    return dk + _dot(ds.astype(q.dtype), q, 0, 0), dv

  zeros = jnp.zeros(k.shape, jnp.float32)
  dk, dv = lax.fori_loop(first, last + 1, body, (zeros, zeros))
  dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


# ----------------------------------------------------------------------------- calls

def _specs(b, l, h, dh, block):
  """BlockSpecs for a grid (blocks, B, H): a token block, a whole row, row ids, row stats."""
  tile = pl.BlockSpec((None, block, None, dh), lambda i, r, j: (r, i, j, 0))
  row = pl.BlockSpec((None, l, None, dh), lambda i, r, j: (r, 0, j, 0))
  ids = pl.BlockSpec((None, l), lambda i, r, j: (r, 0))
  stat_tile = pl.BlockSpec((None, None, block), lambda i, r, j: (r, j, i))
  stat_row = pl.BlockSpec((None, None, l), lambda i, r, j: (r, j, 0))
  del b, h
  return tile, row, ids, stat_tile, stat_row


def _forward(q, k, v, seg, pos, lo, hi, window, block_q, block_k, interpret):
  b, l, h, dh = q.shape
  tile, row, ids, stat_tile, _ = _specs(b, l, h, dh, block_q)
  kernel = functools.partial(_forward_kernel, scale=dh ** -0.5, window=window, block_q=block_q,
                             block_k=block_k)
  return pl.pallas_call(
      kernel, grid=(l // block_q, b, h),
      in_specs=[tile, row, row, ids, ids, ids, ids], out_specs=[tile, stat_tile],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, h, l), jnp.float32)],
      compiler_params=None if interpret else _compiler_params(),
      interpret=interpret, name="block_skipping_attention_fwd")(q, k, v, seg, pos, lo, hi)


def _backward(q, k, v, seg, pos, lo, hi, out, lse, dout, window, block_q, block_k, interpret):
  b, l, h, dh = q.shape
  scale = dh ** -0.5
  f32 = lambda x: x.astype(jnp.float32)
  # delta_i = sum_d o_id * do_id = sum_j p_ij dp_ij: the softmax backward's row term.
  delta = jnp.einsum("blhd,blhd->bhl", f32(out), f32(dout))
  common = dict(scale=scale, window=window, block_q=block_q, block_k=block_k)
  params = None if interpret else _compiler_params()
  tile, row, ids, stat_tile, stat_row = _specs(b, l, h, dh, block_q)
  dq = pl.pallas_call(
      functools.partial(_dq_kernel, **common), grid=(l // block_q, b, h),
      in_specs=[tile, row, row, tile, stat_tile, stat_tile, ids, ids, ids, ids], out_specs=tile,
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype), compiler_params=params,
      interpret=interpret, name="block_skipping_attention_dq",
  )(q, k, v, dout, lse, delta, seg, pos, lo, hi)
  ktile, row, ids, _, stat_row = _specs(b, l, h, dh, block_k)
  dk, dv = pl.pallas_call(
      functools.partial(_dkv_kernel, **common), grid=(l // block_k, b, h),
      in_specs=[row, ktile, ktile, row, stat_row, stat_row, ids, ids, ids, ids],
      out_specs=[ktile, ktile],
      out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
      compiler_params=params, interpret=interpret, name="block_skipping_attention_dkv",
  )(q, k, v, dout, lse, delta, seg, pos, lo, hi)
  return dq, dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10))
def _attention(q, k, v, seg, pos, lo, hi, window, block_q, block_k, interpret):
  return _forward(q, k, v, seg, pos, lo, hi, window, block_q, block_k, interpret)[0]


def _attention_fwd(q, k, v, seg, pos, lo, hi, window, block_q, block_k, interpret):
  out, lse = _forward(q, k, v, seg, pos, lo, hi, window, block_q, block_k, interpret)
  return out, (q, k, v, seg, pos, lo, hi, out, lse)


def _attention_bwd(window, block_q, block_k, interpret, res, dout):
  q, k, v, seg, pos, lo, hi, out, lse = res
  dq, dk, dv = _backward(q, k, v, seg, pos, lo, hi, out, lse, dout, window, block_q, block_k,
                         interpret)
  return dq, dk, dv, None, None, None, None  # integer ids and ranges: no cotangent


_attention.defvjp(_attention_fwd, _attention_bwd)


def pallas_attention(q, k, v, segment_ids, position_ids, window: Optional[int],
                     block_q: int = DEFAULT_BLOCK_Q, block_k: int = DEFAULT_BLOCK_K,
                     interpret: bool = False):
  """Exact masked attention that skips the key blocks no query of a block can see.

  Args:
    q, k, v: [B, L, H, Dh] (compute dtype).
    segment_ids, position_ids: int [B, L] (0 = padding).
    window: half window, or None (global).
    block_q, block_k: query and key block sizes (L is padded to a multiple of both).
    interpret: run the kernels in Pallas interpret mode (any backend; slow).

  Returns:
    [B, L, H, Dh] in q's dtype; zero at padding queries.
  """
  l = q.shape[1]
  window = None if window is None else int(window)
  multiple = math.lcm(block_q, block_k)
  q, k, v = (pad_to_blocks(x, multiple) for x in (q, k, v))
  seg = pad_to_blocks(segment_ids.astype(jnp.int32), multiple)  # padding: segment 0
  pos = pad_to_blocks(position_ids.astype(jnp.int32), multiple)
  lo, hi = token_key_ranges(seg, pos, window)
  out = _attention(q, k, v, seg, pos, lo, hi, window, block_q, block_k, bool(interpret))
  return out[:, :l]
