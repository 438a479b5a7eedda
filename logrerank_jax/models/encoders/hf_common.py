"""What the Flax encoder families share: activation names, config.json, param init.

`ModernBertConfig.from_hf` and `BertConfig.from_hf` (and `local_scorer`'s family dispatch) read
a HF config through `read_hf_config` and map `hidden_act` / `hidden_activation` names through
`ACTIVATIONS`, so both families spell and check them the same way; both `init_params` build
their trees with `init_module_params`.
"""

import json
import os
from typing import Callable, Mapping

import jax
import jax.numpy as jnp

from logrerank_jax.errors import ConfigError

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
