"""Sliding-window attention over neighbouring key blocks, in plain XLA ops.

`attention_impl="blocked"` of `ModernBertConfig` (window layers only; global layers run the
reference). It forms [W, 3W] logits per block of `window` tokens instead of [L, L], with the
neighbour-block view and the segment/window mask of the tiled kernel (`tiled.neighbours`,
`tiled.tile_mask`) and the reference's masked softmax, so dropout applies as on the reference.
"""

import jax.numpy as jnp

from logrerank_jax.models.attention.reference import masked_softmax
# The neighbour-block view and the segment/window mask shared with the tiled kernel.
from logrerank_jax.models.attention import tiled


def blocked_local_attention(q, k, v, segment_ids, position_ids, window, dropout_fn):
  """Sliding-window attention that only forms logits against the neighbouring key blocks.

  Blocks have `window` tokens, so every key within `window` of a query lies in the query's
  block or one of its two neighbours: logits are [B, H, nb, W, 3W] instead of [B, H, L, L].
  Exact only if the keys within `window` positions of a query are also within `window` tokens
  (true for packed rows, where positions step by 1 inside a segment).

  Args:
    q, k, v: [B, L, H, Dh].
    segment_ids, position_ids: int [B, L].
    window: half window (> 0).
    dropout_fn: applied to the float32 probabilities.

  Returns:
    [B, L, H, Dh] in q's dtype.
  """
  b, l, h, dh = q.shape
  w = max(int(window), 1)
  nb = -(-l // w)
  pad = nb * w - l
  # Padding tokens get segment 0, so they are never visible as keys.
  padded = lambda x: jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
  q, k, v, seg, pos = (padded(x) for x in (q, k, v, segment_ids, position_ids))
  blocks = lambda x: x.reshape((b, nb, w) + x.shape[2:])  # [B, nb, W, ...]

  neighbours = lambda x: tiled.neighbours(x, axis=1)  # [B, nb, W, ...] -> [B, nb, 3W, ...]
  qb, segq, posq = blocks(q), blocks(seg), blocks(pos)  # [B, nb, W, H, Dh], [B, nb, W]
  kb, vb = neighbours(blocks(k)), neighbours(blocks(v))  # [B, nb, 3W, H, Dh]
  segk, posk = neighbours(blocks(seg)), neighbours(blocks(pos))  # [B, nb, 3W]
  scale = dh ** -0.5
  logits = jnp.einsum("bnqhd,bnkhd->bnhqk", qb, kb,
                      preferred_element_type=jnp.float32) * scale  # [B, nb, H, W, 3W]
  mask = tiled.tile_mask(segq, segk, posq, posk, window)  # [B, nb, 1, W, 3W]
  probs = dropout_fn(masked_softmax(logits, mask))
  out = jnp.einsum("bnhqk,bnkhd->bnqhd", probs.astype(vb.dtype), vb,
                   preferred_element_type=jnp.float32)  # [B, nb, W, H, Dh]
  return out.reshape(b, nb * w, h, dh)[:, :l].astype(q.dtype)
