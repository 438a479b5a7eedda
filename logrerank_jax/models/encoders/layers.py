"""Layers the encoder families share (ModernBERT and BERT): the attention core, norms, pooling.

  LayerNorm                        float32 statistics whatever the compute dtype
  dispatch_attention               runs the attention path `attention_impl` resolved to
                                   (`models/attention/dispatch.py`), every path exact on real tokens
  default_segments_and_positions   the packing inputs when a caller gives none
  checked_inputs                   an encoder's input shapes checked, the mask defaulted
  pool_segments                    one vector per packed segment ("cls" or "mean")
  classifier_logits                a sequence classifier's last layer (float32 logits)
"""

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from logrerank_jax.errors import ConfigError, LogRerankError
from logrerank_jax.models.attention import dispatch as attention_dispatch
from logrerank_jax.models.attention.blocked import blocked_local_attention
from logrerank_jax.models.attention.pallas_gpu import pallas_attention
from logrerank_jax.models.attention.reference import reference_attention
from logrerank_jax.models.attention.splash_tpu import splash_attention
from logrerank_jax.models.attention.tiled import tiled_attention

POOLINGS = ("cls", "mean")  # what `pool_segments` (and `ModernBertConfig.classifier_pooling`) take


class LayerNorm(nn.Module):
  """LayerNorm with float32 statistics whatever the compute dtype (torch's biased variance)."""
  eps: float
  use_bias: bool
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):  # [..., d]
    d = x.shape[-1]
    scale = self.param("scale", nn.initializers.ones, (d,), jnp.float32)
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + self.eps) * scale
    if self.use_bias:
      y = y + self.param("bias", nn.initializers.zeros, (d,), jnp.float32)
    return y.astype(self.dtype)


def dispatch_attention(impl: str, q, k, v, segment_ids, position_ids, window: Optional[int],
                       dropout_fn, dropout_active: bool):
  """Attention by the resolved path `impl` (`attention_dispatch.resolve`); every path is exact
  on real tokens (`reference_attention`'s semantics). ModernBERT and BERT layers both call it.

  With attention dropout active (training with `attention_dropout > 0`) the reference path runs,
  since it is the one that applies `dropout_fn` to the probabilities; "blocked" only changes
  window layers.

  Args:
    impl: a resolved path ("xla", "blocked", "tiled", "pallas_gpu", "splash_tpu").
    q, k, v: [B, L, H, Dh].
    segment_ids, position_ids: int [B, L].
    window: half window, or None for global attention.
    dropout_fn: applied to the float32 probabilities (reference path only).
    dropout_active: whether `dropout_fn` drops anything.

  Returns:
    [B, L, H, Dh] in q's dtype.
  """
  if not dropout_active:
    if impl == "tiled":
      return tiled_attention(q, k, v, segment_ids, position_ids, window)
    if impl == "pallas_gpu":
      return pallas_attention(q, k, v, segment_ids, position_ids, window,
                              interpret=attention_dispatch.interpret_kernels())
    if impl == "splash_tpu":
      return splash_attention(q, k, v, segment_ids, position_ids, window,
                              interpret=attention_dispatch.interpret_kernels())
  if window is not None and impl == "blocked":
    return blocked_local_attention(q, k, v, segment_ids, position_ids, window, dropout_fn)
  return reference_attention(q, k, v, segment_ids, position_ids, window, dropout_fn)


def default_segments_and_positions(attention_mask, segment_ids=None, position_ids=None):
  """Fill in segment ids (= attention_mask) and positions (= arange) when not given.

  Args:
    attention_mask: int [B, L] (1 = real token).
    segment_ids: optional int [B, L], 0 = padding.
    position_ids: optional int [B, L].

  Returns:
    (segment_ids, position_ids), int32 [B, L] each.
  """
  if segment_ids is None:
    segment_ids = attention_mask
  else:
    # A token masked out by attention_mask is padding even if its segment id says otherwise.
    segment_ids = jnp.where(attention_mask != 0, segment_ids, 0)
  if position_ids is None:
    position_ids = jnp.broadcast_to(jnp.arange(attention_mask.shape[-1]), attention_mask.shape)
  return segment_ids.astype(jnp.int32), position_ids.astype(jnp.int32)


def checked_inputs(owner: str, input_ids, attention_mask, **others):
  """Check an encoder's inputs and return `attention_mask` (None: all ones).

  `input_ids` must be [B, L] and every other input given (the mask, then `others` in order)
  its shape; a `LogRerankError` names `owner` (the module) and the input.
  """
  if input_ids.ndim != 2:
    raise LogRerankError(f"{owner}: input_ids must be [B, L], got shape {input_ids.shape}")
  if attention_mask is None:
    attention_mask = jnp.ones_like(input_ids)
  for name, x in (("attention_mask", attention_mask), *others.items()):
    if x is not None and x.shape != input_ids.shape:
      raise LogRerankError(f"{owner}: {name} has shape {x.shape}, input_ids {input_ids.shape}")
  return attention_mask


def pool_segments(hidden: jax.Array, segment_ids: jax.Array, num_segments: int,
                  pooling: str) -> jax.Array:
  """Pool each packed segment: its first token ("cls") or the mean of its tokens ("mean").

  Args:
    hidden: [B, L, d].
    segment_ids: int [B, L], segments 1..num_segments (0 = padding).
    num_segments: S, static.
    pooling: "cls" or "mean".

  Returns:
    float32 [B, S, d]; a segment absent from a row gives zeros.
  """
  onehot = (segment_ids[:, None, :] == jnp.arange(1, num_segments + 1)[None, :, None])  # [B, S, L]
  hidden = hidden.astype(jnp.float32)
  if pooling == "mean":
    weights = onehot.astype(jnp.float32)
    counts = jnp.maximum(weights.sum(-1, keepdims=True), 1.0)  # [B, S, 1]
    return jnp.einsum("bsl,bld->bsd", weights, hidden) / counts
  if pooling == "cls":
    first = jnp.argmax(onehot, axis=-1)  # [B, S] index of each segment's first token
    pooled = jnp.take_along_axis(hidden, first[..., None], axis=1)  # [B, S, d]
    return jnp.where(onehot.any(-1)[..., None], pooled, 0.0)
  raise ConfigError(f"pooling must be one of {POOLINGS}, got {pooling!r}")


def classifier_logits(num_labels: int, pooled: jax.Array) -> jax.Array:
  """The linear classifier of a sequence classifier (params "classifier", of the module whose
  `__call__` runs this): float32 logits [..., num_labels].

  Scores stay float32 even under bf16 compute: bf16 collapses near scores into ties.
  """
  return nn.Dense(num_labels, use_bias=True, dtype=jnp.float32, param_dtype=jnp.float32,
                  name="classifier")(pooled.astype(jnp.float32))
