"""Which keys each query may see, as token ranges and key-block ranges: the schedules that let
attention kernels skip what the segment (and window) mask discards, and the work they count.

A query sees the keys of its own nonzero segment, within `window` positions on window layers
(`reference.attention_mask_matrix`). `token_key_ranges` bounds that set by one index range
[lo, hi] per token:
- when `positions_follow_tokens` holds (packed rows, padded batches), every segment is one run
  of tokens, and a key more than `window` tokens away is more than `window` positions away, so
  [lo, hi] = the token's run, clipped to +-window tokens on window layers;
- otherwise [0, L - 1] for every real token: exact for any layout, only without skipping;
- padding tokens (segment 0) see nothing: lo = L, hi = -1.
The mask is symmetric, so the same ranges bound the queries that see a key (the backward pass's
schedule over key blocks).

A kernel with query blocks of `block_q` tokens visits, for query block i, the key blocks
`block_bounds` gives: from the block of min(lo) to the block of max(hi) over its queries.
`attention_pairs` counts the query x key pairs every attention path computes from its own
schedule, and the pairs the mask keeps, for `attention_work_efficiency`.
"""

from typing import Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np

from logrerank_jax.errors import ConfigError

# Attention paths whose computed work `computed_pairs` knows (modernbert's attention_impl values).
WORK_PATHS = ("xla", "blocked", "tiled", "pallas_gpu", "splash_tpu")
# Default block size of the GPU kernel ("pallas_gpu"), queries and keys: on packed 50-passage
# ScholarQABench pools at 1,024-token rows, 32 gives attention_work_efficiency 0.87 for the
# base encoder (16: 0.93, 64: 0.76, 128: 0.53; docs/PERFORMANCE.md, "Attention work"), with
# [32, 64] x [64, 32] block products that Triton still maps onto tensor cores.
GPU_BLOCK = 32
# Splash attention's default tiles (multiples of the TPU's 128 lanes).
SPLASH_BLOCK = 128


def _cummax(x, xp):
  return jax.lax.cummax(x, axis=1) if xp is jnp else np.maximum.accumulate(x, axis=1)


def _cummin_reverse(x, xp):
  if xp is jnp:
    return jax.lax.cummin(x, axis=1, reverse=True)
  return np.minimum.accumulate(x[:, ::-1], axis=1)[:, ::-1]


# The functions below take `xp` = jax.numpy (in the kernels, traced) or numpy (host-side work
# counts, where tracing and compiling per batch shape would cost more than the count): one
# implementation for both.

def real_neighbours(segment_ids, xp=jnp):
  """Index and segment of the previous and of the next real token of every token.

  Args:
    segment_ids: int [B, L] (0 = padding).
    xp: jax.numpy or numpy.

  Returns:
    (prev_idx, prev_seg, next_idx, next_seg), int32 [B, L] each; -1 (segment -1) where there is
    no such token.
  """
  b, l = segment_ids.shape
  idx = xp.broadcast_to(xp.arange(l, dtype=xp.int32), (b, l))
  real = segment_ids != 0
  last = _cummax(xp.where(real, idx, -1), xp)  # last real index <= t
  first = _cummin_reverse(xp.where(real, idx, l), xp)  # first real index >= t
  prev_idx = xp.concatenate([xp.full((b, 1), -1, xp.int32), last[:, :-1]], axis=1)
  next_idx = xp.concatenate([first[:, 1:], xp.full((b, 1), l, xp.int32)], axis=1)
  seg_at = lambda i: xp.take_along_axis(segment_ids, xp.clip(i, 0, l - 1), axis=1)
  prev_seg = xp.where(prev_idx >= 0, seg_at(prev_idx), -1).astype(xp.int32)
  next_seg = xp.where(next_idx < l, seg_at(next_idx), -1).astype(xp.int32)
  return prev_idx, prev_seg, xp.where(next_idx < l, next_idx, -1), next_seg


def positions_follow_tokens(segment_ids, position_ids, xp=jnp):
  """True iff tokens of one segment are never closer in position than in index.

  Checked on each row's real tokens in order: the next real token either starts a segment with
  a larger id, or continues the same segment with a position that grew by at least its index
  distance. Then every segment's real tokens are consecutive among the row's real tokens
  (padding may sit between them) and, for tokens i < j of a segment, pos_j - pos_i >= j - i,
  so keys within `window` positions are within `window` tokens. Packed rows and default
  (arange) positions pass.

  Args:
    segment_ids, position_ids: int [B, L].
    xp: jax.numpy or numpy.

  Returns:
    bool scalar.
  """
  l = segment_ids.shape[1]
  idx = xp.arange(l, dtype=xp.int32)[None, :]
  prev, prev_seg, _, _ = real_neighbours(segment_ids, xp)
  prev_pos = xp.take_along_axis(position_ids, xp.maximum(prev, 0), axis=1)
  real = segment_ids != 0
  new_segment = prev_seg < segment_ids
  continues = (prev_seg == segment_ids) & (position_ids - prev_pos >= idx - prev)
  return xp.all(~real | (prev < 0) | new_segment | continues)


def token_key_ranges(segment_ids, position_ids, window: Optional[int], xp=jnp):
  """Per token, an index range [lo, hi] holding every key the token sees (see the module doc).

  Under `positions_follow_tokens` a segment's real tokens are consecutive among the row's real
  tokens (padding may sit between them), so its keys lie between its first and last real token.

  Args:
    segment_ids, position_ids: int [B, L] (0 = padding).
    window: half window, or None (global).
    xp: jax.numpy or numpy.

  Returns:
    (lo, hi), int32 [B, L] each; lo > hi for padding tokens.
  """
  b, l = segment_ids.shape
  idx = xp.broadcast_to(xp.arange(l, dtype=xp.int32), (b, l))
  real = segment_ids != 0
  _, prev_seg, _, next_seg = real_neighbours(segment_ids, xp)
  starts = real & (prev_seg != segment_ids)  # first real token of its segment
  ends = real & (next_seg != segment_ids)  # last real token of its segment
  run_start = _cummax(xp.where(starts, idx, 0), xp)
  run_end = _cummin_reverse(xp.where(ends, idx, l - 1), xp)
  if window is not None:
    run_start = xp.maximum(run_start, idx - int(window))
    run_end = xp.minimum(run_end, idx + int(window))
  follows = positions_follow_tokens(segment_ids, position_ids, xp)
  lo = xp.where(follows, run_start, 0)
  hi = xp.where(follows, run_end, l - 1)
  return xp.where(real, lo, l).astype(xp.int32), xp.where(real, hi, -1).astype(xp.int32)


def block_bounds(lo, hi, block: int):
  """First and last key block of `block` tokens that one block of queries visits.

  The one formula both the kernels (on one query block's ranges, inside the kernel) and the work
  count (`row_block_bounds`) use. `lax.div` truncates; ranges are nonnegative except padding's
  hi = -1, and a padding-only block gets first = L // block >= 1 > 0 = last: no block.

  Args:
    lo, hi: int [n] ranges (`token_key_ranges`) of the n queries of one block.
    block: the key block size.

  Returns:
    (first, last) int32 scalars; last < first means no key block.
  """
  return (jax.lax.div(jnp.min(lo), jnp.int32(block)), jax.lax.div(jnp.max(hi), jnp.int32(block)))


def row_block_bounds(lo, hi, block_from: int, block_to: int):
  """`block_bounds` of every block of `block_from` queries: lo, hi [B, n * block_from] -> [B, n].

  NumPy or JAX arrays; the division truncates toward zero as `lax.div` does in the kernels.
  """
  shape = lo.shape[:-1] + (lo.shape[-1] // block_from, block_from)
  lo, hi = lo.reshape(shape).min(-1), hi.reshape(shape).max(-1)
  if isinstance(lo, np.ndarray):
    return np.trunc(lo / block_to).astype(np.int32), np.trunc(hi / block_to).astype(np.int32)
  return jax.lax.div(lo, jnp.int32(block_to)), jax.lax.div(hi, jnp.int32(block_to))


def pad_to_blocks(x, multiple: int, value=0):
  """Pad the token axis (1) of [B, L, ...] to a multiple of `multiple` with `value` (NumPy or JAX)."""
  pad = -x.shape[1] % multiple
  if not pad:
    return x
  xp = np if isinstance(x, np.ndarray) else jnp
  return xp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2), constant_values=value)


def _needed_pairs(seg: np.ndarray, pos: np.ndarray, window: Optional[int]) -> int:
  """Query x key pairs the mask keeps: same nonzero segment, within the window if windowed.

  Counted per segment (n^2 globally; windowed, for each token the segment's positions within
  `window` of its own, by binary search), so long rows cost no [L, L] array.
  """
  total = 0
  for s_row, p_row in zip(seg, pos):
    for s in np.unique(s_row[s_row != 0]):
      p = np.sort(p_row[s_row == s])
      if window is None:
        total += p.size * p.size
      else:
        total += int(np.sum(np.searchsorted(p, p + window, side="right")
                            - np.searchsorted(p, p - window, side="left")))
  return total


def _scheduled_pairs(seg: np.ndarray, pos: np.ndarray, window: Optional[int], block_q: int,
                     block_k: int) -> int:
  """Pairs the block-skipping kernel's forward computes: visited key blocks x block sizes."""
  multiple = int(np.lcm(block_q, block_k))
  seg_p = pad_to_blocks(np.asarray(seg, np.int32), multiple)
  pos_p = pad_to_blocks(np.asarray(pos, np.int32), multiple)
  lo, hi = token_key_ranges(seg_p, pos_p, window, np)
  first, last = row_block_bounds(lo, hi, block_q, block_k)
  blocks = np.maximum(last - first + 1, 0)
  return int(blocks.sum()) * block_q * block_k


def _splash_pairs(seg: np.ndarray, window: Optional[int], block: int) -> int:
  """Pairs splash attention computes: blocks its static mask (full, or the +-window band on
  token indices) does not rule out; segment ids are applied element-wise inside each block."""
  b, l = seg.shape
  lp = l + (-l % block)
  n = lp // block
  if window is None:
    return b * lp * lp
  qi = np.arange(n)[:, None]
  ki = np.arange(n)[None, :]
  # Block (i, j) holds a pair within the band iff their token ranges come within `window`.
  touched = (ki * block <= (qi + 1) * block - 1 + window) & ((ki + 1) * block - 1 >= qi * block - window)
  return b * int(touched.sum()) * block * block


def computed_pairs(path: str, segment_ids, position_ids, window: Optional[int],
                   block_q: int = GPU_BLOCK, block_k: int = GPU_BLOCK,
                   splash_block: int = SPLASH_BLOCK) -> int:
  """Query x key pairs an attention path computes on these rows, from its own schedule.

  Args:
    path: one of `WORK_PATHS`.
    segment_ids, position_ids: int [B, L] of a packed batch (NumPy or JAX).
    window: half window of a window layer, or None (global layer).
    block_q, block_k: the block-skipping GPU kernel's block sizes ("pallas_gpu").
    splash_block: splash attention's block size ("splash_tpu").

  Returns:
    The number of logits the path forms (its backward pass forms the same ones again).
  """
  seg = np.asarray(segment_ids)
  pos = np.asarray(position_ids)
  b, l = seg.shape
  if path == "xla":
    return b * l * l
  if path in ("blocked", "tiled"):
    follows = bool(positions_follow_tokens(seg, pos, np))
    if window is None or (path == "tiled" and not follows):
      return b * l * l
    w = max(int(window), 1)  # blocks of `window` tokens against their own and both neighbours
    return b * -(-l // w) * w * 3 * w
  if path == "pallas_gpu":
    return _scheduled_pairs(seg, pos, window, block_q, block_k)
  if path == "splash_tpu":
    return _splash_pairs(seg, window, splash_block)
  raise ConfigError(f"attention work: unknown path {path!r}; known: {WORK_PATHS}")


def needed_pairs(segment_ids, position_ids, window: Optional[int]) -> int:
  """Query x key pairs the mask keeps: real queries x keys of their own segment (and window)."""
  return _needed_pairs(np.asarray(segment_ids), np.asarray(position_ids), window)


def attention_pairs(path: str, segment_ids, position_ids, window: Optional[int],
                    **block_sizes) -> Dict[str, int]:
  """{"computed": `computed_pairs`, "needed": `needed_pairs`} of one path on these rows."""
  return {"computed": computed_pairs(path, segment_ids, position_ids, window, **block_sizes),
          "needed": needed_pairs(segment_ids, position_ids, window)}
