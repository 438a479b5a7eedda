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

import dataclasses
import os
from typing import Any, Mapping, Optional, Tuple, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from logrerank_jax.errors import ConfigError, LogRerankError
from logrerank_jax.models.attention import dispatch as attention_dispatch
from logrerank_jax.models.encoders.hf_common import (ACTIVATIONS, get_activation, init_module_params,
                                            read_hf_config)
from logrerank_jax.models.attention.pallas_gpu import pallas_attention
from logrerank_jax.models.attention.splash_tpu import splash_attention
# Re-exported: the tiled kernel and its layout check are part of this module's API.
from logrerank_jax.models.attention.tiled import positions_follow_tokens, tiled_attention  # pylint: disable=unused-import
# The neighbour-block view and the segment/window mask shared with the tiled kernel.
from logrerank_jax.models.attention.tiled import _neighbours, _tile_mask  # pylint: disable=protected-access

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
_LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION)
_POOLINGS = ("cls", "mean")
_ATTENTION_IMPLS = attention_dispatch.IMPLS

# Fields a HF config.json must state: they fix the parameter shapes, so a default would be a guess.
_REQUIRED_HF_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads")


def _layer_types_every_n(num_layers: int, every_n: int) -> Tuple[str, ...]:
  """Return HF's layer pattern: layer i is global iff i % every_n == 0."""
  return tuple(SLIDING_ATTENTION if i % every_n else FULL_ATTENTION for i in range(num_layers))


@dataclasses.dataclass(frozen=True)
class ModernBertConfig:
  """Hyper-parameters of a ModernBERT encoder (+ sequence-classification head).

  Defaults are those of transformers' `ModernBertConfig` (ModernBERT-base), except
  `num_labels` which defaults to 1 (a reranker's single relevance logit).
  `attention_impl` chooses how attention is computed: "xla" masks full [L, L] logits (the exact
  reference); "blocked" only computes sliding-window logits of neighbouring key blocks and
  requires positions that step by 1 inside a segment (as packing produces); "tiled" (fastest
  on CPU, exact for any layout) computes one (row, head group) tile at a time, global layers
  over the row and window layers over neighbouring blocks when `positions_follow_tokens` holds
  (checked at run time), with a flash-attention backward pass (`models/attention/tiled.py`).
  "tiled" loops over rows x head groups, so it is not for GPUs. "pallas_gpu" (GPU) is a
  block-skipping flash-attention kernel that only visits the key blocks of each segment (and
  window) (`models/attention/pallas_gpu.py`); "splash_tpu" (TPU) is JAX's splash attention
  (`models/attention/splash_tpu.py`). "auto" (the default) is "tiled" on the CPU backend, "pallas_gpu" on GPU
  and "splash_tpu" on TPU, decided when the model is traced (`resolved_attention_impl`); a kernel
  that cannot run there falls back to the backend's XLA path with one logged warning
  (`models/attention/dispatch.py`). With attention dropout active (training with
  `attention_dropout > 0`), the "tiled", "pallas_gpu" and "splash_tpu" paths use the reference
  path, which applies the dropout.
  `layer_types` is the source of truth; `global_attn_every_n_layers` only derives it when
  `layer_types` is None and is then normalised to the smallest period reproducing it.
  """
  vocab_size: int = 50368
  hidden_size: int = 768
  intermediate_size: int = 1152
  num_hidden_layers: int = 22
  num_attention_heads: int = 12
  hidden_activation: str = "gelu"
  max_position_embeddings: int = 8192
  norm_eps: float = 1e-5
  norm_bias: bool = False
  attention_bias: bool = False
  mlp_bias: bool = False
  attention_dropout: float = 0.0
  embedding_dropout: float = 0.0
  mlp_dropout: float = 0.0
  local_attention: int = 128
  global_attn_every_n_layers: int = 3
  global_rope_theta: float = 160_000.0
  local_rope_theta: float = 10_000.0
  layer_types: Optional[Tuple[str, ...]] = None  # None -> derived from global_attn_every_n_layers
  pad_token_id: Optional[int] = 50283
  classifier_pooling: str = "cls"
  classifier_activation: str = "gelu"
  classifier_bias: bool = False
  classifier_dropout: float = 0.0
  num_labels: int = 1
  dtype: Any = jnp.float32
  attention_impl: str = "auto"

  def __post_init__(self):
    """Normalise derived fields and reject values the model cannot honour."""
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "max_position_embeddings", "local_attention",
                "global_attn_every_n_layers", "num_labels"):
      value = getattr(self, key)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"ModernBertConfig.{key} must be a positive integer, got {value!r}")
    if self.hidden_size % self.num_attention_heads:
      raise ConfigError(f"ModernBertConfig.hidden_size ({self.hidden_size}) is not a multiple of "
                        f"num_attention_heads ({self.num_attention_heads})")
    if (self.hidden_size // self.num_attention_heads) % 2:
      raise ConfigError("ModernBertConfig: head_dim must be even for rotary embeddings, got "
                        f"{self.hidden_size // self.num_attention_heads}")
    for key in ("hidden_activation", "classifier_activation"):
      if getattr(self, key) not in ACTIVATIONS:
        raise ConfigError(f"ModernBertConfig.{key} {getattr(self, key)!r} is not supported; "
                          f"expected one of {sorted(ACTIVATIONS)}")
    for key in ("attention_dropout", "embedding_dropout", "mlp_dropout", "classifier_dropout"):
      value = getattr(self, key)
      if not isinstance(value, (int, float, np.floating)) or not 0.0 <= float(value) < 1.0:
        raise ConfigError(f"ModernBertConfig.{key} must be in [0, 1), got {value!r}")
    for key in ("norm_eps", "global_rope_theta", "local_rope_theta"):
      if not float(getattr(self, key)) > 0.0:
        raise ConfigError(f"ModernBertConfig.{key} must be > 0, got {getattr(self, key)!r}")
    if self.classifier_pooling not in _POOLINGS:
      raise ConfigError(f"ModernBertConfig.classifier_pooling must be one of {_POOLINGS}, "
                        f"got {self.classifier_pooling!r}")
    if self.attention_impl not in _ATTENTION_IMPLS:
      raise ConfigError(f"ModernBertConfig.attention_impl must be one of {_ATTENTION_IMPLS}, "
                        f"got {self.attention_impl!r}")
    if self.layer_types is None:
      layer_types = _layer_types_every_n(self.num_hidden_layers, self.global_attn_every_n_layers)
    else:
      layer_types = tuple(self.layer_types)
    if len(layer_types) != self.num_hidden_layers:
      raise ConfigError(f"ModernBertConfig.layer_types has {len(layer_types)} entries but "
                        f"num_hidden_layers is {self.num_hidden_layers}")
    for t in layer_types:
      if t not in _LAYER_TYPES:
        raise ConfigError(f"ModernBertConfig.layer_types holds {t!r}; expected one of {_LAYER_TYPES}")
    object.__setattr__(self, "layer_types", layer_types)
    # layer_types is the truth; keep global_attn_every_n_layers as the smallest period that
    # reproduces it, so configs read from 4.x (period) and 5.x (layer list) files compare equal.
    for n in range(1, self.num_hidden_layers + 1):
      if _layer_types_every_n(self.num_hidden_layers, n) == layer_types:
        object.__setattr__(self, "global_attn_every_n_layers", n)
        break
    try:
      dtype = jnp.dtype(self.dtype)
    except TypeError as e:
      raise ConfigError(f"ModernBertConfig.dtype is not a dtype: {self.dtype!r}") from e
    if dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
      raise ConfigError(f"ModernBertConfig.dtype must be float32, bfloat16 or float16, got {dtype}")
    object.__setattr__(self, "dtype", dtype)
    for key in ("norm_eps", "global_rope_theta", "local_rope_theta", "attention_dropout",
                "embedding_dropout", "mlp_dropout", "classifier_dropout"):
      object.__setattr__(self, key, float(getattr(self, key)))

  def resolved_attention_impl(self) -> str:
    """The attention path that runs on JAX's default backend: "auto" resolved, and a kernel
    that cannot run here replaced by its logged fallback (see the class doc)."""
    return attention_dispatch.resolve(self.attention_impl, jax.default_backend(), self.head_dim)

  @property
  def head_dim(self) -> int:
    """Width of one attention head."""
    return self.hidden_size // self.num_attention_heads

  @property
  def sliding_window(self) -> int:
    """Half window: a key is visible iff its distance to the query is <= this."""
    return self.local_attention // 2

  @property
  def max_positions(self) -> int:
    """Longest position id (exclusive) a segment may use (as `BertConfig.max_positions`)."""
    return self.max_position_embeddings

  def replace(self, **changes) -> "ModernBertConfig":
    """Return a copy with some fields changed (validated again)."""
    return dataclasses.replace(self, **changes)

  @classmethod
  def from_hf(cls, path_or_dict: Union[str, os.PathLike, Mapping[str, Any]],
              **overrides) -> "ModernBertConfig":
    """Build a config from a HF ModernBERT config (transformers 4.x or 5.x field style).

    Args:
      path_or_dict: a config.json path, a folder containing config.json, or its parsed dict.
      **overrides: fields that HF does not hold (e.g. `dtype`, `attention_impl`) or to replace.

    Returns:
      The config. Unknown HF keys are ignored; missing shape keys or unsupported values raise
      `ConfigError` naming the key.
    """
    hf = read_hf_config(path_or_dict)
    model_type = hf.get("model_type", "modernbert")
    if model_type != "modernbert":
      raise ConfigError(f"HF config model_type is {model_type!r}, expected 'modernbert'")
    for key in _REQUIRED_HF_KEYS:
      if key not in hf:
        raise ConfigError(f"HF config lacks required key {key!r}")
    kwargs = {}
    passthrough = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                   "num_attention_heads", "hidden_activation", "max_position_embeddings",
                   "norm_eps", "norm_bias", "attention_bias", "mlp_bias", "attention_dropout",
                   "embedding_dropout", "mlp_dropout", "local_attention",
                   "global_attn_every_n_layers", "pad_token_id", "classifier_pooling",
                   "classifier_activation", "classifier_bias", "classifier_dropout")
    for key in passthrough:
      if key in hf and hf[key] is not None:
        kwargs[key] = hf[key]
    if "sliding_window" in hf and "local_attention" not in hf:
      kwargs["local_attention"] = 2 * int(hf["sliding_window"])
    if hf.get("layer_types") is not None:
      kwargs["layer_types"] = tuple(hf["layer_types"])
    kwargs.update(_rope_thetas(hf))
    if hf.get("id2label"):
      kwargs["num_labels"] = len(hf["id2label"])
    elif hf.get("num_labels") is not None:
      kwargs["num_labels"] = hf["num_labels"]
    else:
      kwargs["num_labels"] = 2  # transformers' PretrainedConfig default
    kwargs.update(overrides)
    return cls(**kwargs)

  def to_hf_dict(self) -> dict:
    """Return a transformers 5.x-style config dict (also carrying the 4.x rope/pattern keys).

    Returns:
      A JSON-serialisable dict accepted by `transformers.ModernBertConfig(**d)` and by `from_hf`.
    """
    d = {
        "model_type": "modernbert",
        "architectures": ["ModernBertForSequenceClassification"],
        "layer_types": list(self.layer_types),
        "rope_parameters": {
            FULL_ATTENTION: {"rope_type": "default", "rope_theta": self.global_rope_theta},
            SLIDING_ATTENTION: {"rope_type": "default", "rope_theta": self.local_rope_theta},
        },
        "id2label": {str(i): f"LABEL_{i}" for i in range(self.num_labels)},
        "label2id": {f"LABEL_{i}": i for i in range(self.num_labels)},
    }
    for f in dataclasses.fields(self):
      if f.name in ("layer_types", "dtype", "attention_impl", "num_labels",
                    "global_rope_theta", "local_rope_theta"):
        continue
      d[f.name] = getattr(self, f.name)
    return d


def _rope_thetas(hf: Mapping[str, Any]) -> dict:
  """Return {global_rope_theta, local_rope_theta} from 5.x `rope_parameters` or 4.x keys."""
  out = {}
  if "global_rope_theta" in hf:
    out["global_rope_theta"] = hf["global_rope_theta"]
  if "local_rope_theta" in hf:
    out["local_rope_theta"] = hf["local_rope_theta"]
  rope_scaling = hf.get("rope_scaling")
  if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type", "default")) != "default":
    raise ConfigError(f"HF config rope_scaling {rope_scaling!r} is not supported (only default RoPE)")
  params = hf.get("rope_parameters")
  if params is None:
    return out
  if not isinstance(params, Mapping):
    raise ConfigError(f"HF config rope_parameters must be a dict, got {params!r}")
  # 5.x stores one dict per layer type; 5.x values win over 4.x keys, as in transformers.
  for layer_type, field in ((FULL_ATTENTION, "global_rope_theta"),
                            (SLIDING_ATTENTION, "local_rope_theta")):
    sub = params.get(layer_type)
    if sub is None:
      continue
    rope_type = sub.get("rope_type", "default")
    if rope_type != "default":
      raise ConfigError(f"HF config rope_parameters[{layer_type!r}].rope_type is {rope_type!r}; "
                        "only 'default' RoPE is supported")
    if "rope_theta" in sub:
      out[field] = sub["rope_theta"]
  return out


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


def _masked_softmax(logits, mask):
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
  probs = dropout_fn(_masked_softmax(logits, mask))
  return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v,
                    preferred_element_type=jnp.float32).astype(q.dtype)


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

  neighbours = lambda x: _neighbours(x, axis=1)  # [B, nb, W, ...] -> [B, nb, 3W, ...]
  qb, segq, posq = blocks(q), blocks(seg), blocks(pos)  # [B, nb, W, H, Dh], [B, nb, W]
  kb, vb = neighbours(blocks(k)), neighbours(blocks(v))  # [B, nb, 3W, H, Dh]
  segk, posk = neighbours(blocks(seg)), neighbours(blocks(pos))  # [B, nb, 3W]
  scale = dh ** -0.5
  logits = jnp.einsum("bnqhd,bnkhd->bnhqk", qb, kb,
                      preferred_element_type=jnp.float32) * scale  # [B, nb, H, W, 3W]
  mask = _tile_mask(segq, segk, posq, posk, window)  # [B, nb, 1, W, 3W]
  probs = dropout_fn(_masked_softmax(logits, mask))
  out = jnp.einsum("bnhqk,bnkhd->bnqhd", probs.astype(vb.dtype), vb,
                   preferred_element_type=jnp.float32)  # [B, nb, W, H, Dh]
  return out.reshape(b, nb * w, h, dh)[:, :l].astype(q.dtype)


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
    if input_ids.ndim != 2:
      raise LogRerankError(f"ModernBertEncoder: input_ids must be [B, L], got shape {input_ids.shape}")
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    for name, x in (("attention_mask", attention_mask), ("segment_ids", segment_ids),
                    ("position_ids", position_ids)):
      if x is not None and x.shape != input_ids.shape:
        raise LogRerankError(f"ModernBertEncoder: {name} has shape {x.shape}, input_ids "
                             f"{input_ids.shape}")
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
  raise ConfigError(f"pooling must be one of {_POOLINGS}, got {pooling!r}")


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
    # Scores stay float32 even under bf16 compute: bf16 collapses near scores into ties.
    return nn.Dense(cfg.num_labels, use_bias=True, dtype=jnp.float32, param_dtype=jnp.float32,
                    name="classifier")(pooled.astype(jnp.float32))


def init_params(cfg: ModernBertConfig, rng: jax.Array, classifier: bool = False,
                seq_len: int = 8) -> dict:
  """Return freshly initialised params of the encoder (or the sequence classifier).

  Args:
    cfg: model config.
    rng: PRNG key.
    classifier: True for `ModernBertSequenceClassifier` params.
    seq_len: length of the dummy input used for shape inference.

  Returns:
    The param tree (without the "params" collection wrapper).
  """
  module = ModernBertSequenceClassifier(cfg) if classifier else ModernBertEncoder(cfg)
  return init_module_params(module, rng, seq_len)
