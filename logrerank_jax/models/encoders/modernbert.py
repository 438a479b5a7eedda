"""Flax linen ModernBERT encoder and sequence-classification head.

Numerically matches transformers' `ModernBertModel` / `ModernBertForSequenceClassification`
(float32 parity tested to 1e-5), and adds packing: several sequences per row, told apart by
`segment_ids`, with `position_ids` restarting per segment. No attention crosses a segment, in
global and sliding-window layers alike, so packed outputs equal unpacked ones.

Param tree (contract C1; torch `Linear.weight [out, in]` is flax `kernel [in, out]`):
  embeddings/tok_embeddings/embedding [V, d], embeddings/norm/{scale,bias?}
  layers_{i}/attn_norm (absent for i == 0), layers_{i}/attn/{Wqkv,Wo}, layers_{i}/mlp_norm,
  layers_{i}/mlp/{Wi,Wo}, final_norm.
"""

from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from logrerank_jax.models.encoders.hf_common import get_activation, init_module_params
from logrerank_jax.models.encoders.layers import (LayerNorm, checked_inputs, classifier_logits,
                                                  default_segments_and_positions,
                                                  dispatch_attention, pool_segments)
# The config is part of this module's public face: `from ...modernbert import ModernBertConfig`.
from logrerank_jax.models.encoders.modernbert_config import (FULL_ATTENTION, SLIDING_ATTENTION,
                                                             ModernBertConfig)


def rope_cos_sin(position_ids: jax.Array, head_dim: int, theta: float):
  """Return RoPE cos/sin tables in float32, laid out as HF's cat((freqs, freqs)).

  Args:
    position_ids: int [B, L].
    head_dim: rotary width (whole head).
    theta: RoPE base.

  Returns:
    (cos, sin), each float32 [B, L, head_dim].
  """
  # inv_freq in float64 then rounded once, so it is the correctly rounded float32 value.
  inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
  inv_freq = jnp.asarray(inv_freq.astype(np.float32))  # [Dh/2]
  freqs = position_ids.astype(jnp.float32)[..., None] * inv_freq  # [B, L, Dh/2]
  emb = jnp.concatenate([freqs, freqs], axis=-1)  # [B, L, Dh]
  return jnp.cos(emb), jnp.sin(emb)


def _rotate_half(x):
  """Return cat(-x2, x1) for x = cat(x1, x2) along the last axis (HF convention)."""
  x1, x2 = jnp.split(x, 2, axis=-1)
  return jnp.concatenate([-x2, x1], axis=-1)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotate queries or keys in float32 and cast back.

  Args:
    x: [B, L, H, Dh].
    cos, sin: float32 [B, L, Dh].

  Returns:
    The rotated x, same shape and dtype.
  """
  x32 = x.astype(jnp.float32)
  cos, sin = cos[:, :, None, :], sin[:, :, None, :]
  return (x32 * cos + _rotate_half(x32) * sin).astype(x.dtype)


def _dense(features, use_bias, dtype, name):
  """Return a Dense layer with float32 params and the given compute dtype."""
  return nn.Dense(features, use_bias=use_bias, dtype=dtype, param_dtype=jnp.float32, name=name)


class ModernBertAttention(nn.Module):
  """Multi-head self-attention with fused Wqkv, RoPE and a segment/window mask."""
  cfg: ModernBertConfig
  layer_type: str

  @nn.compact
  def __call__(self, x, cos, sin, segment_ids, position_ids, deterministic):  # x [B, L, d]
    cfg = self.cfg
    b, l, d = x.shape
    qkv = _dense(3 * d, cfg.attention_bias, cfg.dtype, "Wqkv")(x)  # [B, L, 3d]
    qkv = qkv.reshape(b, l, 3, cfg.num_attention_heads, cfg.head_dim)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [B, L, H, Dh]
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    dropout = nn.Dropout(cfg.attention_dropout)
    probs_dropout = lambda p: dropout(p, deterministic=deterministic)
    window = cfg.sliding_window if self.layer_type == SLIDING_ATTENTION else None
    dropout_active = cfg.attention_dropout > 0.0 and not deterministic
    out = dispatch_attention(cfg.resolved_attention_impl(), q, k, v, segment_ids, position_ids,
                             window, probs_dropout, dropout_active)
    out = _dense(d, cfg.attention_bias, cfg.dtype, "Wo")(out.reshape(b, l, d))  # [B, L, d]
    return nn.Dropout(cfg.attention_dropout)(out, deterministic=deterministic)


class ModernBertMLP(nn.Module):
  """GeGLU feed-forward: Wo(drop(act(input) * gate)) with Wi fused as [input | gate]."""
  cfg: ModernBertConfig

  @nn.compact
  def __call__(self, x, deterministic):  # [B, L, d]
    cfg = self.cfg
    inp, gate = jnp.split(_dense(2 * cfg.intermediate_size, cfg.mlp_bias, cfg.dtype, "Wi")(x),
                          2, axis=-1)  # [B, L, I] each
    y = get_activation(cfg.hidden_activation)(inp) * gate
    y = nn.Dropout(cfg.mlp_dropout)(y, deterministic=deterministic)
    return _dense(cfg.hidden_size, cfg.mlp_bias, cfg.dtype, "Wo")(y)


class ModernBertLayer(nn.Module):
  """Pre-norm transformer layer; layer 0 has no attention norm (HF uses Identity there)."""
  cfg: ModernBertConfig
  layer_index: int

  @nn.compact
  def __call__(self, x, cos, sin, segment_ids, position_ids, deterministic):  # [B, L, d]
    cfg = self.cfg
    layer_type = cfg.layer_types[self.layer_index]
    h = x if self.layer_index == 0 else LayerNorm(cfg.norm_eps, cfg.norm_bias, cfg.dtype,
                                                  name="attn_norm")(x)
    x = x + ModernBertAttention(cfg, layer_type, name="attn")(h, cos, sin, segment_ids,
                                                              position_ids, deterministic)
    h = LayerNorm(cfg.norm_eps, cfg.norm_bias, cfg.dtype, name="mlp_norm")(x)
    return x + ModernBertMLP(cfg, name="mlp")(h, deterministic)


class ModernBertEmbeddings(nn.Module):
  """Token embeddings -> LayerNorm -> dropout (ModernBERT has no position embeddings)."""
  cfg: ModernBertConfig

  @nn.compact
  def __call__(self, input_ids, deterministic):  # [B, L]
    cfg = self.cfg
    x = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=cfg.dtype, param_dtype=jnp.float32,
                 name="tok_embeddings")(input_ids)  # [B, L, d]
    x = LayerNorm(cfg.norm_eps, cfg.norm_bias, cfg.dtype, name="norm")(x)
    return nn.Dropout(cfg.embedding_dropout)(x, deterministic=deterministic)


class ModernBertEncoder(nn.Module):
  """ModernBERT encoder: [B, L] token ids -> [B, L, d] hidden states after the final norm."""
  cfg: ModernBertConfig

  @nn.compact
  def __call__(self, input_ids, attention_mask=None, segment_ids=None, position_ids=None,
               deterministic: bool = True):
    """Encode token ids.

    Args:
      input_ids: int32 [B, L].
      attention_mask: int32 [B, L], 1 = real token; None = all ones.
      segment_ids: int32 [B, L], sequences packed in a row (0 = padding); None = attention_mask.
      position_ids: int32 [B, L], restarting per segment; None = arange(L). RoPE only sees
        position differences, so either gives the same outputs for contiguous segments.
      deterministic: False enables dropout (needs rngs={"dropout": key}).

    Returns:
      [B, L, d] in cfg.dtype.
    """
    cfg = self.cfg
    attention_mask = checked_inputs("ModernBertEncoder", input_ids, attention_mask,
                                    segment_ids=segment_ids, position_ids=position_ids)
    segment_ids, position_ids = default_segments_and_positions(attention_mask, segment_ids,
                                                                position_ids)
    x = ModernBertEmbeddings(cfg, name="embeddings")(input_ids, deterministic)
    # One RoPE table per layer type, shared by all layers of that type (as HF).
    rope = {FULL_ATTENTION: rope_cos_sin(position_ids, cfg.head_dim, cfg.global_rope_theta),
            SLIDING_ATTENTION: rope_cos_sin(position_ids, cfg.head_dim, cfg.local_rope_theta)}
    for i in range(cfg.num_hidden_layers):
      cos, sin = rope[cfg.layer_types[i]]
      x = ModernBertLayer(cfg, i, name=f"layers_{i}")(x, cos, sin, segment_ids, position_ids,
                                                      deterministic)
    return LayerNorm(cfg.norm_eps, cfg.norm_bias, cfg.dtype, name="final_norm")(x)


class ModernBertPredictionHead(nn.Module):
  """dense -> activation -> LayerNorm, as HF's ModernBertPredictionHead."""
  cfg: ModernBertConfig

  @nn.compact
  def __call__(self, x):  # [..., d]
    cfg = self.cfg
    x = _dense(cfg.hidden_size, cfg.classifier_bias, cfg.dtype, "dense")(x)
    x = get_activation(cfg.classifier_activation)(x)
    return LayerNorm(cfg.norm_eps, cfg.norm_bias, cfg.dtype, name="norm")(x)


class ModernBertSequenceClassifier(nn.Module):
  """Encoder + pooling + head + linear classifier (HF ModernBertForSequenceClassification)."""
  cfg: ModernBertConfig

  @nn.compact
  def __call__(self, input_ids, attention_mask=None, segment_ids=None, position_ids=None,
               deterministic: bool = True, num_segments: Optional[int] = None):
    """Score sequences (or, with `num_segments`, every packed segment).

    Args:
      input_ids, attention_mask, segment_ids, position_ids: as `ModernBertEncoder`.
      deterministic: False enables dropout.
      num_segments: if given, pool each segment 1..num_segments of each row separately.

    Returns:
      float32 logits [B, num_labels], or [B, num_segments, num_labels] with `num_segments`.
    """
    cfg = self.cfg
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    hidden = ModernBertEncoder(cfg, name="model")(input_ids, attention_mask, segment_ids,
                                                 position_ids, deterministic)  # [B, L, d]
    if num_segments is not None:
      seg, _ = default_segments_and_positions(attention_mask, segment_ids, position_ids)
      pooled = pool_segments(hidden, seg, num_segments, cfg.classifier_pooling)  # [B, S, d]
    elif cfg.classifier_pooling == "cls":
      pooled = hidden[:, 0].astype(jnp.float32)  # [B, d]
    else:
      m = attention_mask.astype(jnp.float32)[..., None]  # [B, L, 1]
      # max(., 1): an all-padding (bucket filler) row pools to 0 instead of HF's NaN, so it
      # cannot poison a masked loss.
      pooled = (hidden.astype(jnp.float32) * m).sum(1) / jnp.maximum(m.sum(1), 1.0)  # [B, d]
    pooled = ModernBertPredictionHead(cfg, name="head")(pooled.astype(cfg.dtype))
    pooled = nn.Dropout(cfg.classifier_dropout)(pooled, deterministic=deterministic)
    return classifier_logits(cfg.num_labels, pooled)


def init_params(cfg: ModernBertConfig, rng: jax.Array, classifier: bool = False,
                seq_len: int = 8) -> dict:
  """Fresh params of `ModernBertEncoder` (`ModernBertSequenceClassifier` with `classifier`),
  without the "params" wrapper (`hf_common.init_module_params`, on a dummy [1, seq_len] batch)."""
  module = ModernBertSequenceClassifier(cfg) if classifier else ModernBertEncoder(cfg)
  return init_module_params(module, rng, seq_len)
