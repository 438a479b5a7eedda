"""What the Flax encoder families' configs share: activation names, config.json, checks, init.

`ModernBertConfig.from_hf` and `BertConfig.from_hf` (and `local_scorer`'s family dispatch) read
a HF config through `read_hf_config`, take its fields through `hf_fields` and `hf_num_labels`,
and map `hidden_act` / `hidden_activation` names through `ACTIVATIONS`, so both families spell
and check them the same way; both write `to_hf_dict` through `hf_label_maps` and
`hf_dict_fields`. `EncoderConfig` holds the methods both config classes have and the checks
their `__post_init__` run; both `init_params` build their trees with `init_module_params`.
"""

import dataclasses
import json
import os
from typing import Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from logrerank_jax.errors import ConfigError
from logrerank_jax.models.attention import dispatch as attention_dispatch

# Fields a HF config.json must state: they fix the parameter shapes, so a default would be a guess.
REQUIRED_HF_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads")

# Activation names as transformers' ACT2FN spells them; "gelu" there is the exact (erf) GELU.
ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_python": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "relu": jax.nn.relu,
    "tanh": jnp.tanh,
}


def get_activation(name: str) -> Callable[[jax.Array], jax.Array]:
  """Return the activation function for a transformers ACT2FN name.

  Args:
    name: e.g. "gelu" (exact erf GELU), "gelu_new"/"gelu_pytorch_tanh" (tanh approximation),
      "silu", "relu".

  Returns:
    An elementwise function.
  """
  if name not in ACTIVATIONS:
    raise ConfigError(f"unsupported activation {name!r}; expected one of {sorted(ACTIVATIONS)}")
  return ACTIVATIONS[name]


def read_hf_config(path_or_dict) -> dict:
  """Return the HF config as a dict from a dict, a config.json path, or its folder."""
  if isinstance(path_or_dict, Mapping):
    return dict(path_or_dict)
  path = os.fspath(path_or_dict)
  if os.path.isdir(path):
    path = os.path.join(path, "config.json")
  if not os.path.isfile(path):
    raise ConfigError(f"no HF config file at {path}")
  try:
    with open(path, encoding="utf-8") as f:
      hf = json.load(f)
  except json.JSONDecodeError as e:
    raise ConfigError(f"HF config {path} is not valid JSON: {e}") from e
  if not isinstance(hf, dict):
    raise ConfigError(f"HF config {path} does not hold a JSON object")
  return hf


def init_module_params(module, rng: jax.Array, seq_len: int = 8) -> dict:
  """Initialise an encoder or classifier module on a dummy [1, seq_len] batch, jitted (eager
  flax init is several times slower on CPU); returns the tree without the "params" wrapper."""
  ids = jnp.zeros((1, seq_len), jnp.int32)
  return jax.jit(lambda r: module.init(r, ids, jnp.ones_like(ids))["params"])(rng)


def hf_fields(hf: Mapping, passthrough: Iterable[str]) -> dict:
  """Check that `hf` states every `REQUIRED_HF_KEYS` key (`ConfigError` naming the first one
  missing), then return its `passthrough` keys that hold a value (None is unset, as in HF)."""
  for key in REQUIRED_HF_KEYS:
    if key not in hf:
      raise ConfigError(f"HF config lacks required key {key!r}")
  return {key: hf[key] for key in passthrough if key in hf and hf[key] is not None}


def hf_num_labels(hf: Mapping) -> int:
  """The label count of a HF config: `id2label`'s length, else `num_labels`, else 2."""
  if hf.get("id2label"):
    return len(hf["id2label"])
  if hf.get("num_labels") is not None:
    return hf["num_labels"]
  return 2  # transformers' PretrainedConfig default


def hf_label_maps(num_labels: int) -> dict:
  """`id2label` and `label2id` as transformers writes them for unnamed labels."""
  return {"id2label": {str(i): f"LABEL_{i}" for i in range(num_labels)},
          "label2id": {f"LABEL_{i}": i for i in range(num_labels)}}


def hf_dict_fields(cfg, skip: Iterable[str]) -> dict:
  """The config's dataclass fields by name, but those in `skip` (ours, or written otherwise)."""
  return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in skip}


class EncoderConfig:
  """What `BertConfig` and `ModernBertConfig` (frozen dataclasses) share beyond their fields.

  The `check_*` methods are steps of their `__post_init__`; a message names the class and key.
  """

  def check_shape(self, keys: Iterable[str]) -> None:
    """Each of `keys` a positive integer, and the heads dividing `hidden_size`."""
    name = type(self).__name__
    for key in keys:
      value = getattr(self, key)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{name}.{key} must be a positive integer, got {value!r}")
    if self.hidden_size % self.num_attention_heads:
      raise ConfigError(f"{name}.hidden_size ({self.hidden_size}) is not a multiple of "
                        f"num_attention_heads ({self.num_attention_heads})")

  def check_compute_dtype(self) -> None:
    """`dtype` a float32, bfloat16 or float16 dtype, stored as a `jnp.dtype`."""
    name = type(self).__name__
    try:
      dtype = jnp.dtype(self.dtype)
    except TypeError as e:
      raise ConfigError(f"{name}.dtype is not a dtype: {self.dtype!r}") from e
    if dtype not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
      raise ConfigError(f"{name}.dtype must be float32, bfloat16 or float16, got {dtype}")
    object.__setattr__(self, "dtype", dtype)

  def check_attention_impl(self) -> None:
    """`attention_impl` one of `models/attention/dispatch.py`'s paths."""
    if self.attention_impl not in attention_dispatch.IMPLS:
      raise ConfigError(f"{type(self).__name__}.attention_impl must be one of "
                        f"{attention_dispatch.IMPLS}, got {self.attention_impl!r}")

  def resolved_attention_impl(self) -> str:
    """The attention path that runs on JAX's default backend: "auto" resolved, and a kernel
    that cannot run here replaced by its logged fallback (`models/attention/dispatch.py`)."""
    return attention_dispatch.resolve(self.attention_impl, jax.default_backend(), self.head_dim)

  @property
  def head_dim(self) -> int:
    """Width of one attention head."""
    return self.hidden_size // self.num_attention_heads

  def replace(self, **changes):
    """Return a copy with some fields changed (validated again)."""
    return dataclasses.replace(self, **changes)
