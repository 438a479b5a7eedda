"""Exact masked attention computed one tile at a time, with a hand-written backward pass.

`attention_impl="tiled"` of `ModernBertConfig` (the fastest path on CPU). A tile is one packed
row and a group of its heads, so its float32 logits stay a few MB and live in cache, where
XLA CPU's elementwise passes over the full [B, H, L, L] logits are memory-bound. Global layers
attend over the whole row; sliding-window layers over blocks of `window` tokens against their
two neighbouring blocks ([nb, W, 3W] logits instead of [L, L]) when `positions_follow_tokens`
holds (checked at run time, so the result is exact for any layout; otherwise the full row is
masked by the window).

The backward pass is flash-attention's: the forward keeps only its output and each query's
softmax max and sum; the backward recomputes one tile's probabilities and forms dq, dk and dv
from them. Differentiating through the forward's `lax.map` instead (what `jax.grad` does
without the custom VJP) stores and replays every tile's intermediates and was measured 1.1-1.6x
slower per attention layer on CPU (see docs/PERFORMANCE.md).

Semantics are those of `reference.reference_attention`: a query sees the keys of its own
nonzero segment (and, windowed, within `window` positions); a query that sees no key (padding)
gets the uniform average of the values of its tile, which no real token ever reads.
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

# Re-exported: the layout check the window blocks rely on (one implementation, with the schedules).
from logrerank_jax.models.attention.block_schedule import positions_follow_tokens  # pylint: disable=unused-import

_NEG = float(np.finfo(np.float32).min)
# Largest float32 logits tile (bytes of [heads, Lq, Lk]) one map step computes: heads are grouped
# up to this size, at least one per step. Measured on 16 rows of 576 tokens (2 CPUs, forward and
# forward + backward, 4 and 12 heads of 64): 8 MiB (4 of 4 heads, or 6 of 12, per global tile;
# every head per window tile) was the fastest or within noise of it among 1.5, 3, 8 and 17 MB;
# one head per step (1.5 MB) was 1.1-1.4x slower.
_TILE_BYTES = 8 << 20


# ----------------------------------------------------------------------------- one tile
# Shapes inside a tile: q [..., G, Lq, Dh], k and v [..., G, Lk, Dh] (G heads, "..." = the
# window blocks of a row, or nothing), seg/pos [..., Lq] and [..., Lk].

def tile_mask(seg_q, seg_k, pos_q, pos_k, window):
  """Which keys each query sees: same nonzero segment and, if windowed, near in position."""
  mask = (seg_q[..., :, None] == seg_k[..., None, :]) & (seg_k[..., None, :] != 0)
  if window is not None:
    mask = mask & (jnp.abs(pos_q[..., :, None] - pos_k[..., None, :]) <= window)
  return mask[..., None, :, :]  # [..., 1, Lq, Lk]: the same for every head


def _tile_logits(q, k, mask):
  logits = jnp.einsum("...gqd,...gkd->...gqk", q, k, preferred_element_type=jnp.float32)
  return jnp.where(mask, logits * (q.shape[-1] ** -0.5), _NEG)


def _tile_forward(q, k, v, mask):
  """Return the float32 output and each query's softmax max and sum ([..., G, Lq, 1])."""
  logits = _tile_logits(q, k, mask)
  m = jnp.max(logits, axis=-1, keepdims=True)
  e = jnp.exp(logits - m)
  s = jnp.sum(e, axis=-1, keepdims=True)
  # Normalising after the value product saves one pass over the logits.
  out = jnp.einsum("...gqk,...gkd->...gqd", e.astype(v.dtype), v,
                   preferred_element_type=jnp.float32) / s
  return out, m, s


def _tile_backward(q, k, v, mask, out, m, s, dout):
  """Return (dq, dk, dv) in float32 for one tile (out, dout float32 [..., G, Lq, Dh])."""
  f32 = lambda x: x.astype(jnp.float32)
  p = jnp.exp(_tile_logits(q, k, mask) - m) / s  # the forward's probabilities
  dv = jnp.einsum("...gqk,...gqd->...gkd", p, dout)
  dp = jnp.einsum("...gqd,...gkd->...gqk", dout, f32(v))
  # Masked logits are constants (`where`), so their gradient is zero, as autodiff gives.
  ds = jnp.where(mask, p * (dp - jnp.sum(dout * out, axis=-1, keepdims=True)), 0.0)
  ds = ds * (q.shape[-1] ** -0.5)
  dq = jnp.einsum("...gqk,...gkd->...gqd", ds, f32(k))
  dk = jnp.einsum("...gqk,...gqd->...gkd", ds, f32(q))
  return dq, dk, dv


# ----------------------------------------------------------------------------- tile views
# A map step sees one row and one head group: x [L, G, Dh], seg/pos [L].

def neighbours(x, axis):
  """[..., nb, W, ...] -> [..., nb, 3W, ...]: previous, own and next block (zeros at the ends)."""
  zero = jnp.zeros_like(jax.lax.slice_in_dim(x, 0, 1, axis=axis))
  prev = jnp.concatenate([zero, jax.lax.slice_in_dim(x, 0, x.shape[axis] - 1, axis=axis)], axis)
  nxt = jnp.concatenate([jax.lax.slice_in_dim(x, 1, x.shape[axis], axis=axis), zero], axis)
  return jnp.concatenate([prev, x, nxt], axis=axis + 1)


def _neighbours_adjoint(x, axis, w):
  """The transpose of `neighbours`: fold [.., nb, 3W, ..] back onto the [.., nb, W, ..] blocks."""
  prev, own, nxt = (jax.lax.slice_in_dim(x, i * w, (i + 1) * w, axis=axis + 1) for i in range(3))
  n = x.shape[axis]
  zero = jnp.zeros_like(jax.lax.slice_in_dim(own, 0, 1, axis=axis))
  # Block j's keys were the "previous" slot of block j + 1 and the "next" slot of block j - 1.
  from_next = jnp.concatenate([jax.lax.slice_in_dim(prev, 1, n, axis=axis), zero], axis)
  from_prev = jnp.concatenate([zero, jax.lax.slice_in_dim(nxt, 0, n - 1, axis=axis)], axis)
  return own + from_next + from_prev


class _Tiles:
  """How one map step's row is cut into tiles: the whole row, or blocks of `window` tokens."""

  def __init__(self, length: int, window: Optional[int], blocked: bool):
    self.length, self.window, self.blocked = length, window, blocked
    if blocked:
      self.w = max(int(window), 1)
      self.nb = -(-length // self.w)
      self.pad = self.nb * self.w - length

  def _blocks(self, x, axis):  # pad the token axis to nb * W and split it into [nb, W]
    x = jnp.pad(x, [(0, 0)] * axis + [(0, self.pad)] + [(0, 0)] * (x.ndim - axis - 1))
    return x.reshape(x.shape[:axis] + (self.nb, self.w) + x.shape[axis + 1:])

  # A step's q, k, v are token-major [L, G, Dh] (a free reshape of [L, H, Dh] when G = H);
  # tiles are head-major: [G, L, Dh], or [nb, G, W, Dh] for queries and [nb, G, 3W, Dh] for keys.
  def queries(self, x):
    if not self.blocked:
      return jnp.swapaxes(x, 0, 1)
    return jnp.swapaxes(self._blocks(x, 0), 1, 2)

  def keys(self, x):
    if not self.blocked:
      return jnp.swapaxes(x, 0, 1)
    return jnp.swapaxes(neighbours(self._blocks(x, 0), 0), 1, 2)

  def mask(self, seg, pos):
    if not self.blocked:
      return tile_mask(seg, seg, pos, pos, self.window)
    sq, pq = self._blocks(seg, 0), self._blocks(pos, 0)  # padding gets segment 0: never a key
    return tile_mask(sq, neighbours(sq, 0), pq, neighbours(pq, 0), self.window)

  def from_queries(self, x):  # inverse of `queries`
    if not self.blocked:
      return jnp.swapaxes(x, 0, 1)
    x = jnp.swapaxes(x, 1, 2)  # [nb, W, G, Dh]
    return x.reshape((self.nb * self.w,) + x.shape[2:])[:self.length]

  def from_keys(self, x):  # transpose of `keys`: sums each key's contributions from 3 blocks
    if not self.blocked:
      return jnp.swapaxes(x, 0, 1)
    x = _neighbours_adjoint(jnp.swapaxes(x, 1, 2), 0, self.w)  # [nb, W, G, Dh]
    return x.reshape((self.nb * self.w,) + x.shape[2:])[:self.length]


def _heads_per_tile(heads: int, tile_elems: int) -> int:
  """The largest divisor of `heads` whose float32 logits tile fits `_TILE_BYTES` (at least 1)."""
  fits = [g for g in range(1, heads + 1) if heads % g == 0 and 4 * g * tile_elems <= _TILE_BYTES]
  return max(fits, default=1)


def _to_steps(x, g):  # [B, L, H, Dh] -> [B * H/g, L, g, Dh]: one map step per row and head group
  b, l, h, dh = x.shape
  if g == h:
    return x
  return x.reshape(b, l, h // g, g, dh).transpose(0, 2, 1, 3, 4).reshape(b * (h // g), l, g, dh)


def _from_steps(x, b):  # inverse of `_to_steps`
  n, l, g, dh = x.shape
  if n == b:
    return x
  return x.reshape(b, n // b, l, g, dh).transpose(0, 2, 1, 3, 4).reshape(b, l, -1, dh)


def _plan(q, window, blocked):
  b, l, h, _ = q.shape
  tiles = _Tiles(l, window, blocked)
  elems = tiles.nb * tiles.w * 3 * tiles.w if blocked else l * l
  return tiles, _heads_per_tile(h, elems)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attention(q, k, v, segment_ids, position_ids, window, blocked):
  return _attention_fwd(q, k, v, segment_ids, position_ids, window, blocked)[0]


def _attention_fwd(q, k, v, segment_ids, position_ids, window, blocked):
  b, _, h, _ = q.shape
  tiles, g = _plan(q, window, blocked)
  per_step = lambda x: jnp.repeat(x, h // g, axis=0)  # [B, L] -> [B * H/g, L]
  xs = tuple(_to_steps(x, g) for x in (q, k, v)) + (per_step(segment_ids), per_step(position_ids))

  def step(t):
    qs, ks, vs, seg, pos = t
    out, m, s = _tile_forward(tiles.queries(qs), tiles.keys(ks), tiles.keys(vs),
                              tiles.mask(seg, pos))
    return tiles.from_queries(out).astype(q.dtype), (m, s)

  out, stats = jax.lax.map(step, xs)
  return _from_steps(out, b), (xs, out, stats)


def _attention_bwd(window, blocked, res, dout):
  (qs, ks, vs, seg, pos), out, stats = res
  b = dout.shape[0]
  tiles, g = _plan(dout, window, blocked)
  dt = (qs.dtype, ks.dtype, vs.dtype)

  def step(t):
    q, k, v, sg, ps, o, (m, s), do = t
    f32 = lambda x: tiles.queries(x.astype(jnp.float32))
    dq, dk, dv = _tile_backward(tiles.queries(q), tiles.keys(k), tiles.keys(v),
                                tiles.mask(sg, ps), f32(o), m, s, f32(do))
    return (tiles.from_queries(dq).astype(dt[0]), tiles.from_keys(dk).astype(dt[1]),
            tiles.from_keys(dv).astype(dt[2]))

  grads = jax.lax.map(step, (qs, ks, vs, seg, pos, out, stats, _to_steps(dout, g)))
  # Segment and position ids are integers: no cotangent.
  return tuple(_from_steps(x, b) for x in grads) + (None, None)


_attention.defvjp(_attention_fwd, _attention_bwd)


def tiled_attention(q, k, v, segment_ids, position_ids, window):
  """Exact masked attention, one (row, head group) tile at a time; see the module doc.

  Args:
    q, k, v: [B, L, H, Dh] (compute dtype).
    segment_ids, position_ids: int [B, L] (0 = padding).
    window: half window, or None (global).

  Returns:
    [B, L, H, Dh] in q's dtype.
  """
  if window is None:
    return _attention(q, k, v, segment_ids, position_ids, None, False)
  window = int(window)
  windowed = lambda *ops: _attention(*ops, window, True)
  full = lambda *ops: _attention(*ops, window, False)
  return jax.lax.cond(positions_follow_tokens(segment_ids, position_ids), windowed, full,
                      q, k, v, segment_ids, position_ids)
