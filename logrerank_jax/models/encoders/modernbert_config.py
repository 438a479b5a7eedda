"""`ModernBertConfig`: the hyper-parameters of a ModernBERT encoder and its HF config.json mapping.

Reads transformers 4.x and 5.x config files (`ModernBertConfig.from_hf`) and writes the 5.x
form with the 4.x keys alongside (`to_hf_dict`). `layer_types` (one of `FULL_ATTENTION`,
`SLIDING_ATTENTION` per layer) is the source of truth for which layers attend globally.
The model itself is `models/encoders/modernbert.py`, which re-exports this config.
"""

import dataclasses
import os
from typing import Any, Mapping, Optional, Tuple, Union

import jax.numpy as jnp
import numpy as np

from logrerank_jax.errors import ConfigError
from logrerank_jax.models.encoders.hf_common import (ACTIVATIONS, EncoderConfig, hf_dict_fields,
                                                     hf_fields, hf_label_maps, hf_num_labels,
                                                     read_hf_config)
from logrerank_jax.models.encoders.layers import POOLINGS

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
_LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION)


def _layer_types_every_n(num_layers: int, every_n: int) -> Tuple[str, ...]:
  """Return HF's layer pattern: layer i is global iff i % every_n == 0."""
  return tuple(SLIDING_ATTENTION if i % every_n else FULL_ATTENTION for i in range(num_layers))


@dataclasses.dataclass(frozen=True)
class ModernBertConfig(EncoderConfig):
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
    self.check_shape(("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "max_position_embeddings", "local_attention",
                      "global_attn_every_n_layers", "num_labels"))
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
    if self.classifier_pooling not in POOLINGS:
      raise ConfigError(f"ModernBertConfig.classifier_pooling must be one of {POOLINGS}, "
                        f"got {self.classifier_pooling!r}")
    self.check_attention_impl()
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
    self.check_compute_dtype()
    for key in ("norm_eps", "global_rope_theta", "local_rope_theta", "attention_dropout",
                "embedding_dropout", "mlp_dropout", "classifier_dropout"):
      object.__setattr__(self, key, float(getattr(self, key)))

  @property
  def sliding_window(self) -> int:
    """Half window: a key is visible iff its distance to the query is <= this."""
    return self.local_attention // 2

  @property
  def max_positions(self) -> int:
    """Longest position id (exclusive) a segment may use (as `BertConfig.max_positions`)."""
    return self.max_position_embeddings

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
    passthrough = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                   "num_attention_heads", "hidden_activation", "max_position_embeddings",
                   "norm_eps", "norm_bias", "attention_bias", "mlp_bias", "attention_dropout",
                   "embedding_dropout", "mlp_dropout", "local_attention",
                   "global_attn_every_n_layers", "pad_token_id", "classifier_pooling",
                   "classifier_activation", "classifier_bias", "classifier_dropout")
    kwargs = hf_fields(hf, passthrough)
    if "sliding_window" in hf and "local_attention" not in hf:
      kwargs["local_attention"] = 2 * int(hf["sliding_window"])
    if hf.get("layer_types") is not None:
      kwargs["layer_types"] = tuple(hf["layer_types"])
    kwargs.update(_rope_thetas(hf))
    kwargs["num_labels"] = hf_num_labels(hf)
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
        **hf_label_maps(self.num_labels),
    }
    d.update(hf_dict_fields(self, ("layer_types", "dtype", "attention_impl", "num_labels",
                                   "global_rope_theta", "local_rope_theta")))
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
