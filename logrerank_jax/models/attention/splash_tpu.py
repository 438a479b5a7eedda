"""TPU attention through JAX's splash attention kernel (`jax.experimental.pallas.ops.tpu`).

`attention_impl="splash_tpu"` of `ModernBertConfig`. Splash takes one example at a time (heads
first) with a static block-sparse mask and element-wise `SegmentIds`; this wrapper scales q,
lays rows out head-major, pads them to whole blocks and maps the kernel over the batch.
- Global layers: `FullMask` + segment ids. Segment ids are applied element-wise inside every
  block, so splash skips no block on global layers (its block sparsity comes from the static
  mask only); see `block_schedule.attention_pairs`.
- Window layers: `LocalMask(window_size=(w, w))` (keys within w token indices, both sides) +
  segment ids; splash skips the blocks outside that band. A window on token indices equals
  ModernBERT's window on positions only if positions step by exactly 1 inside each segment and
  each segment is one run (`positions_are_contiguous`, what the packer produces); the wrapper
  checks it at run time and otherwise computes the exact reference instead.
Padding queries (segment 0) see the padding keys of their row (splash compares segment ids
only); no real token reads them.

Gradients are splash's own backward kernels (dq and dkv, flash-attention style). Splash's
kernels use TPU-only features (Mosaic, scalar prefetch), and its interpret mode runs them on
any backend; see tests/test_attention_kernels.py for what was checked on CPU.
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp

from logrerank_jax.models.attention.block_schedule import (SPLASH_BLOCK, pad_to_blocks,
                                                  positions_follow_tokens, real_neighbours)
from logrerank_jax.models.attention.reference import reference_attention

DEFAULT_BLOCK = SPLASH_BLOCK  # multiples of the TPU's 128 lanes are required


def positions_are_contiguous(segment_ids: jax.Array, position_ids: jax.Array) -> jax.Array:
  """True iff inside every segment, position distance = token index distance.

  Then a window on token indices (splash's `LocalMask`) is ModernBERT's window on positions.
  Packed rows and padded batches with arange positions pass.

  Args:
    segment_ids, position_ids: int [B, L] (0 = padding).

  Returns:
    bool scalar.
  """
  l = segment_ids.shape[1]
  prev_idx, prev_seg, _, _ = real_neighbours(segment_ids)
  idx = jnp.arange(l, dtype=jnp.int32)[None, :]
  prev_pos = jnp.take_along_axis(position_ids, jnp.maximum(prev_idx, 0), axis=1)
  # Each real token continuing its segment (padding may sit between them) steps its position
  # by exactly its index distance.
  continues = (segment_ids != 0) & (prev_seg == segment_ids)
  exact = (position_ids - prev_pos) == (idx - prev_idx)
  return positions_follow_tokens(segment_ids, position_ids) & jnp.all(~continues | exact)


@functools.lru_cache(maxsize=64)
def _kernel(length: int, heads: int, window: Optional[int], block: int, interpret: bool):
  """The splash kernel for one (padded) row length, head count and window (mask work cached)."""
  from jax.experimental.pallas.ops.tpu import splash_attention as sa  # pylint: disable=g-import-not-at-top
  shape = (length, length)
  if window is None:
    mask = sa.FullMask(shape)
  else:
    mask = sa.LocalMask(shape, window_size=(window, window), offset=0)
  sizes = sa.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                        block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                        block_q_dq=block, block_kv_dq=block)
  return sa.make_splash_mha(sa.MultiHeadMask([mask] * heads), block_sizes=sizes, head_shards=1,
                            q_seq_shards=1, interpret=interpret)


def _splash(q, k, v, seg, window, block, interpret):
  """Splash on [B, L, H, Dh] rows (L a multiple of `block`); q pre-scaled."""
  from jax.experimental.pallas.ops.tpu import splash_attention as sa  # pylint: disable=g-import-not-at-top
  _, l, h, _ = q.shape
  kernel = _kernel(l, h, window, block, interpret)
  heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # [B, H, L, Dh]

  def one(q, k, v, s):
    return kernel(q, k, v, segment_ids=sa.SegmentIds(q=s, kv=s))

  out = jax.vmap(one)(heads_first(q), heads_first(k), heads_first(v), seg)
  return heads_first(out)


def splash_attention(q, k, v, segment_ids, position_ids, window: Optional[int],
                     block: int = DEFAULT_BLOCK, interpret: bool = False):
  """Exact masked attention through splash attention (see the module doc).

  Args:
    q, k, v: [B, L, H, Dh] (compute dtype).
    segment_ids, position_ids: int [B, L] (0 = padding).
    window: half window, or None (global).
    block: splash block size (a multiple of 128).
    interpret: run splash in Pallas interpret mode (any backend; slow).

  Returns:
    [B, L, H, Dh] in q's dtype.
  """
  l = q.shape[1]
  window = None if window is None else int(window)
  # Splash has no softmax scale: scale q (exact for head_dim a power of 4, e.g. 64 -> 1/8).
  scaled = (q * (q.shape[-1] ** -0.5)).astype(q.dtype)
  qp, kp, vp = (pad_to_blocks(x, block) for x in (scaled, k, v))
  seg = pad_to_blocks(segment_ids.astype(jnp.int32), block)
  run = lambda: _splash(qp, kp, vp, seg, window, block, interpret)[:, :l].astype(q.dtype)
  if window is None:
    return run()
  exact = lambda: reference_attention(q, k, v, segment_ids, position_ids, window, lambda p: p)
  return jax.lax.cond(positions_are_contiguous(segment_ids, position_ids), run, exact)
