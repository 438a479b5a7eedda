"""Flax linen BERT-family encoder (BERT, and the RoBERTa / XLM-R embedding layout) + classifier.

Numerically matches transformers' `BertModel` / `BertForSequenceClassification` (float32 parity
tested to 1e-5 on the real all-MiniLM-L6-v2 weights): word + absolute position + token-type
embeddings, embedding LayerNorm, post-LN blocks (x = LN(x + attn(x)); x = LN(x + mlp(x))).
Adds packing exactly as `ModernBertEncoder`: several sequences per row told apart by
`segment_ids` (0 = padding), `position_ids` restarting per segment; no attention crosses a
segment, so packed outputs equal unpacked ones. Attention scores and softmax are float32
whatever the compute dtype; params are float32.

RoBERTa / XLM-R share the encoder layout; they differ in the embedding position offset
(`position_offset = pad_token_id + 1`, set by `BertConfig.from_hf` for those model types) and
`type_vocab_size` 1. Their sequence-classification head is different and is not provided here.

Param tree (torch `Linear.weight [out, in]` is flax `kernel [in, out]`):
  embeddings/{word_embeddings,position_embeddings,token_type_embeddings}/embedding,
  embeddings/norm/{scale,bias},
  layers_{i}/attn/{query,key,value,out}/{kernel,bias}, layers_{i}/attn_norm/{scale,bias},
  layers_{i}/mlp/{Wi,Wo}/{kernel,bias}, layers_{i}/mlp_norm/{scale,bias}.
Classifier: {"bert": encoder tree, "pooler": {"dense"}, "classifier"}.
"""

import dataclasses
import os
from typing import Any, Mapping, Optional, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from logrerank_jax.errors import ConfigError, LogRerankError
from logrerank_jax.models.encoders.hf_common import (ACTIVATIONS, EncoderConfig, get_activation,
                                                     hf_dict_fields, hf_fields, hf_label_maps,
                                                     hf_num_labels, init_module_params,
                                                     read_hf_config)
from logrerank_jax.models.encoders.layers import (LayerNorm, checked_inputs, classifier_logits,
                                                  default_segments_and_positions,
                                                  dispatch_attention, pool_segments)

# HF model types with this layout, and whether their positions are offset by pad_token_id + 1.
_MODEL_TYPES = {"bert": False, "roberta": True, "xlm-roberta": True}


@dataclasses.dataclass(frozen=True)
class BertConfig(EncoderConfig):
  """Hyper-parameters of a BERT-family encoder (+ sequence-classification head).

  Defaults are those of transformers' `BertConfig` (bert-base-uncased), except `num_labels`
  which defaults to 1 (a reranker's single relevance logit). `position_offset` is added to
  every position id before the position-embedding lookup (0 for BERT, pad_token_id + 1 for
  RoBERTa / XLM-R). `classifier_dropout` None means `hidden_dropout_prob`, as in transformers.
  `dtype` is the compute dtype; params stay float32. `attention_impl` chooses how attention is
  computed, as `ModernBertConfig.attention_impl` does (`models/attention/dispatch.py`): "auto" is
  the tiled path on CPU (a MiniLM forward over 128 rows of 256 tokens, 2 cores: 8.0-9.2 s against
  14.9-16.0 s for "xla", four runs each; LoG's whole inference 1.2x faster, since the encoder's
  dense layers take the rest), the block-skipping kernels on GPU and TPU; every path is exact on
  real tokens. It is not an HF field: `to_hf_dict` leaves it out.
  """
  vocab_size: int = 30522
  hidden_size: int = 768
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  intermediate_size: int = 3072
  hidden_act: str = "gelu"
  hidden_dropout_prob: float = 0.1
  attention_probs_dropout_prob: float = 0.1
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  pad_token_id: Optional[int] = 0
  position_offset: int = 0
  classifier_dropout: Optional[float] = None
  num_labels: int = 1
  model_type: str = "bert"
  dtype: Any = jnp.float32
  attention_impl: str = "auto"

  def __post_init__(self):
    """Reject values the model cannot honour and normalise numeric fields."""
    self.check_shape(("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                      "intermediate_size", "max_position_embeddings", "type_vocab_size",
                      "num_labels"))
    if self.hidden_act not in ACTIVATIONS:
      raise ConfigError(f"BertConfig.hidden_act {self.hidden_act!r} is not supported; expected "
                        f"one of {sorted(ACTIVATIONS)}")
    if self.model_type not in _MODEL_TYPES:
      raise ConfigError(f"BertConfig.model_type must be one of {sorted(_MODEL_TYPES)}, "
                        f"got {self.model_type!r}")
    offset = self.position_offset
    if (isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0
        or offset >= self.max_position_embeddings):
      raise ConfigError(f"BertConfig.position_offset must be in [0, max_position_embeddings), "
                        f"got {offset!r}")
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
      value = getattr(self, key)
      if key == "classifier_dropout" and value is None:
        continue
      if (isinstance(value, bool) or not isinstance(value, (int, float, np.floating))
          or not 0.0 <= float(value) < 1.0):
        raise ConfigError(f"BertConfig.{key} must be in [0, 1), got {value!r}")
      object.__setattr__(self, key, float(value))
    if not float(self.layer_norm_eps) > 0.0:
      raise ConfigError(f"BertConfig.layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")
    object.__setattr__(self, "layer_norm_eps", float(self.layer_norm_eps))
    self.check_compute_dtype()
    self.check_attention_impl()

  @property
  def classifier_dropout_rate(self) -> float:
    """Dropout before the classifier (transformers: classifier_dropout or hidden_dropout_prob)."""
    return self.hidden_dropout_prob if self.classifier_dropout is None else self.classifier_dropout

  @property
  def max_positions(self) -> int:
    """Longest position id (exclusive) a segment may use: max_position_embeddings - offset."""
    return self.max_position_embeddings - self.position_offset

  @classmethod
  def from_hf(cls, path_or_dict: Union[str, os.PathLike, Mapping[str, Any]],
              **overrides) -> "BertConfig":
    """Build a config from a HF BERT / RoBERTa / XLM-R config.json (folder, file or dict).

    Args:
      path_or_dict: a config.json path, a folder containing config.json, or its parsed dict.
      **overrides: fields HF does not hold (e.g. `dtype`) or to replace.

    Returns:
      The config. Unknown HF keys are ignored; missing shape keys, a non-absolute
      `position_embedding_type` or a decoder / cross-attention config raise `ConfigError`.
    """
    hf = read_hf_config(path_or_dict)
    model_type = hf.get("model_type", "bert")
    if model_type not in _MODEL_TYPES:
      raise ConfigError(f"HF config model_type is {model_type!r}, expected one of "
                        f"{sorted(_MODEL_TYPES)}")
    passthrough = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                   "intermediate_size", "hidden_act", "hidden_dropout_prob",
                   "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
                   "layer_norm_eps", "pad_token_id", "classifier_dropout")
    kwargs = {"model_type": model_type, **hf_fields(hf, passthrough)}
    pet = hf.get("position_embedding_type", "absolute")
    if pet not in (None, "absolute"):
      raise ConfigError(f"HF config position_embedding_type {pet!r} is not supported "
                        "(only 'absolute')")
    for key in ("is_decoder", "add_cross_attention"):
      if hf.get(key):
        raise ConfigError(f"HF config sets {key}; only bidirectional encoders are supported")
    if _MODEL_TYPES[model_type]:
      kwargs["position_offset"] = int(kwargs.get("pad_token_id", 1) or 0) + 1
    kwargs["num_labels"] = hf_num_labels(hf)
    kwargs.update(overrides)
    return cls(**kwargs)

  def to_hf_dict(self) -> dict:
    """Return a dict accepted by `transformers.BertConfig(**d)` (RobertaConfig for RoBERTa) and
    by `from_hf`."""
    return {"architectures": ["BertForSequenceClassification" if self.model_type == "bert"
                              else "RobertaModel"],
            "position_embedding_type": "absolute", **hf_label_maps(self.num_labels),
            **hf_dict_fields(self, ("dtype", "num_labels", "position_offset", "attention_impl"))}


def _dense(features, dtype, name):
  """Return a biased Dense layer with float32 params and the given compute dtype."""
  return nn.Dense(features, use_bias=True, dtype=dtype, param_dtype=jnp.float32, name=name)


def _embed(num, features, dtype, name):
  return nn.Embed(num, features, dtype=dtype, param_dtype=jnp.float32, name=name)


class BertEmbeddings(nn.Module):
  """word + token-type + position embeddings -> LayerNorm -> dropout (HF BertEmbeddings)."""
  cfg: BertConfig

  @nn.compact
  def __call__(self, input_ids, token_type_ids, position_ids, deterministic):  # [B, L] each
    cfg = self.cfg
    d = cfg.hidden_size
    # Summed in float32 (as torch does in float32), then normalised with float32 statistics.
    x = _embed(cfg.vocab_size, d, jnp.float32, "word_embeddings")(input_ids)
    x = x + _embed(cfg.type_vocab_size, d, jnp.float32, "token_type_embeddings")(token_type_ids)
    x = x + _embed(cfg.max_position_embeddings, d, jnp.float32, "position_embeddings")(
        position_ids + cfg.position_offset)  # [B, L, d]
    x = LayerNorm(cfg.layer_norm_eps, True, cfg.dtype, name="norm")(x)
    return nn.Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)


class BertAttention(nn.Module):
  """Multi-head self-attention (separate q/k/v) + output projection, segment-masked."""
  cfg: BertConfig

  @nn.compact
  def __call__(self, x, segment_ids, position_ids, deterministic):  # x [B, L, d]
    cfg = self.cfg
    b, l, d = x.shape
    heads = lambda y: y.reshape(b, l, cfg.num_attention_heads, cfg.head_dim)  # [B, L, H, Dh]
    q = heads(_dense(d, cfg.dtype, "query")(x))
    k = heads(_dense(d, cfg.dtype, "key")(x))
    v = heads(_dense(d, cfg.dtype, "value")(x))
    dropout = nn.Dropout(cfg.attention_probs_dropout_prob)
    dropout_active = cfg.attention_probs_dropout_prob > 0.0 and not deterministic
    out = dispatch_attention(cfg.resolved_attention_impl(), q, k, v, segment_ids, position_ids,
                             None, lambda p: dropout(p, deterministic=deterministic),
                             dropout_active)
    out = _dense(d, cfg.dtype, "out")(out.reshape(b, l, d))
    return nn.Dropout(cfg.hidden_dropout_prob)(out, deterministic=deterministic)


class BertMLP(nn.Module):
  """Wo(act(Wi x)) then dropout (HF BertIntermediate + BertOutput.dense/dropout)."""
  cfg: BertConfig

  @nn.compact
  def __call__(self, x, deterministic):  # [B, L, d]
    cfg = self.cfg
    y = get_activation(cfg.hidden_act)(_dense(cfg.intermediate_size, cfg.dtype, "Wi")(x))
    y = _dense(cfg.hidden_size, cfg.dtype, "Wo")(y)
    return nn.Dropout(cfg.hidden_dropout_prob)(y, deterministic=deterministic)


class BertLayer(nn.Module):
  """Post-LN transformer layer: x = LN(x + attn(x)); x = LN(x + mlp(x))."""
  cfg: BertConfig

  @nn.compact
  def __call__(self, x, segment_ids, position_ids, deterministic):  # [B, L, d]
    cfg = self.cfg
    ln = lambda name: LayerNorm(cfg.layer_norm_eps, True, cfg.dtype, name=name)
    # Residual sums in float32, so bf16 rounding enters only once per sum (at the norm's output).
    a = BertAttention(cfg, name="attn")(x, segment_ids, position_ids, deterministic)
    x = ln("attn_norm")(x.astype(jnp.float32) + a.astype(jnp.float32))
    m = BertMLP(cfg, name="mlp")(x, deterministic)
    return ln("mlp_norm")(x.astype(jnp.float32) + m.astype(jnp.float32))


class BertEncoder(nn.Module):
  """BERT-family encoder: [B, L] token ids -> [B, L, d] last hidden state (HF last_hidden_state)."""
  cfg: BertConfig

  @nn.compact
  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, segment_ids=None,
               position_ids=None, deterministic: bool = True):
    """Encode token ids.

    Args:
      input_ids: int32 [B, L].
      attention_mask: int32 [B, L], 1 = real token; None = all ones.
      token_type_ids: int32 [B, L] (0 / 1 for BERT sentence pairs); None = zeros.
      segment_ids: int32 [B, L], sequences packed in a row (0 = padding); None = attention_mask.
      position_ids: int32 [B, L], restarting per segment (0 at each segment's first token);
        None = arange(L). Absolute positions: a packed row needs restarting positions to equal
        its sequences run alone. `cfg.position_offset` is added before the lookup.
      deterministic: False enables dropout (needs rngs={"dropout": key}).

    Returns:
      [B, L, d] in cfg.dtype.
    """
    cfg = self.cfg
    attention_mask = checked_inputs("BertEncoder", input_ids, attention_mask,
                                    token_type_ids=token_type_ids, segment_ids=segment_ids,
                                    position_ids=position_ids)
    if position_ids is None and input_ids.shape[1] > cfg.max_positions:
      raise LogRerankError(f"BertEncoder: sequence length {input_ids.shape[1]} exceeds the "
                           f"{cfg.max_positions} positions the model has")
    segment_ids, position_ids = default_segments_and_positions(attention_mask, segment_ids,
                                                                position_ids)
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    x = BertEmbeddings(cfg, name="embeddings")(input_ids, token_type_ids.astype(jnp.int32),
                                               position_ids, deterministic)
    for i in range(cfg.num_hidden_layers):
      x = BertLayer(cfg, name=f"layers_{i}")(x, segment_ids, position_ids, deterministic)
    return x


class BertSequenceClassifier(nn.Module):
  """Encoder + pooler (dense + tanh on [CLS]) + classifier (HF BertForSequenceClassification)."""
  cfg: BertConfig

  @nn.compact
  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, segment_ids=None,
               position_ids=None, deterministic: bool = True, num_segments: Optional[int] = None):
    """Score sequences (or, with `num_segments`, every packed segment by its first token).

    Args:
      input_ids, attention_mask, token_type_ids, segment_ids, position_ids: as `BertEncoder`.
      deterministic: False enables dropout.
      num_segments: if given, pool each segment 1..num_segments of each row separately.

    Returns:
      float32 logits [B, num_labels], or [B, num_segments, num_labels] with `num_segments`.
    """
    cfg = self.cfg
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    hidden = BertEncoder(cfg, name="bert")(input_ids, attention_mask, token_type_ids,
                                          segment_ids, position_ids, deterministic)  # [B, L, d]
    if num_segments is not None:
      seg, _ = default_segments_and_positions(attention_mask, segment_ids, position_ids)
      first = pool_segments(hidden, seg, num_segments, "cls")  # [B, S, d]
    else:
      first = hidden[:, 0]  # [B, d]
    pooled = BertPooler(cfg, name="pooler")(first)
    pooled = nn.Dropout(cfg.classifier_dropout_rate)(pooled, deterministic=deterministic)
    return classifier_logits(cfg.num_labels, pooled)


class BertPooler(nn.Module):
  """tanh(dense(first token)), as HF BertPooler; float32 output."""
  cfg: BertConfig

  @nn.compact
  def __call__(self, x):  # [..., d]
    y = _dense(self.cfg.hidden_size, self.cfg.dtype, "dense")(x.astype(self.cfg.dtype))
    return jnp.tanh(y.astype(jnp.float32))


def init_params(cfg: BertConfig, rng: jax.Array, classifier: bool = False,
                seq_len: int = 8) -> dict:
  """Fresh params of `BertEncoder` (`BertSequenceClassifier` with `classifier`), without the
  "params" wrapper (`hf_common.init_module_params`, on a dummy [1, seq_len] batch)."""
  module = BertSequenceClassifier(cfg) if classifier else BertEncoder(cfg)
  return init_module_params(module, rng, seq_len)
