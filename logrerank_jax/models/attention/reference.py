"""Plain softmax attention over full [L, L] logits: the ground truth every kernel is checked against.

`attention_impl="xla"` of `ModernBertConfig` and `BertConfig`, the path that applies attention
dropout, and the exact fallback of the kernels whose fast path needs a layout condition
(`splash_tpu`). A query sees the keys of its own nonzero segment and, on sliding-window layers,
only those within `window` positions; a fully masked (padding) query gets finite uniform weights.
"""

from typing import Optional

import jax
import jax.numpy as jnp


def attention_mask_matrix(segment_ids: jax.Array, position_ids: jax.Array,
                          window: Optional[int]) -> jax.Array:
  """Return which keys each query sees: same nonzero segment and, if windowed, near in position.

  Args:
    segment_ids: int [B, L], 0 = padding.
    position_ids: int [B, L].
    window: half window (None for global attention).

  Returns:
    bool [B, Lq, Lk].
  """
  seg_q, seg_k = segment_ids[:, :, None], segment_ids[:, None, :]
  mask = (seg_q == seg_k) & (seg_k != 0)
  if window is not None:
    dist = jnp.abs(position_ids[:, :, None] - position_ids[:, None, :])
    mask = mask & (dist <= window)
  return mask


def masked_softmax(logits, mask):
  """Softmax over the last axis in float32; fully masked rows give finite uniform weights."""
  # `where` rather than adding -inf: a fully masked (padding) row becomes uniform, never NaN.
  logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(logits, axis=-1)


def reference_attention(q, k, v, segment_ids, position_ids, window, dropout_fn):
  """Exact attention over full [L, L] logits with a segment (and window) mask.

  Args:
    q, k, v: [B, L, H, Dh] (compute dtype).
    segment_ids, position_ids: int [B, L].
    window: half window or None (global).
    dropout_fn: applied to the float32 probabilities.

  Returns:
    [B, L, H, Dh] in q's dtype.
  """
  scale = q.shape[-1] ** -0.5
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k,
                      preferred_element_type=jnp.float32) * scale  # [B, H, L, L] f32
  mask = attention_mask_matrix(segment_ids, position_ids, window)[:, None]  # [B, 1, L, L]
  probs = dropout_fn(masked_softmax(logits, mask))
  return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v,
                    preferred_element_type=jnp.float32).astype(q.dtype)

