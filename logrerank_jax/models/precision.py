"""Low-precision parameters for inference: the encoder's matrices stored in its compute dtype.

With `encoder.dtype = bfloat16`, flax's `Dense` and ModernBERT's `Embed` cast their float32
params to bfloat16 on every call; storing those params in bfloat16 once gives the same values
(bit-identical outputs, checked in tests/test_attention_kernels.py) at half the memory and
without the per-call casts. Everything that computes in float32 keeps float32 params: every
LayerNorm (statistics and scale in float32), BERT's embeddings (summed in float32), the local
heads and the graph reranker (scores, softmaxes and sigmoids stay float32: bf16 would collapse
close scores into ties).

The inference engine is the one to call `log_params_for_inference` (not wired here).
"""

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from logrerank_jax.errors import ConfigError


def _cast_leaf(path, leaf, dtype, cast_embeddings: bool):
  names = [getattr(p, "key", str(p)) for p in path]
  leaf_name, module = names[-1], (names[-2] if len(names) > 1 else "")
  if "norm" in module.lower():  # LayerNorm scale/bias: float32 statistics
    return leaf
  if leaf_name in ("kernel", "bias") or (cast_embeddings and leaf_name == "embedding"):
    return leaf.astype(dtype)
  return leaf


def encoder_params_for_inference(params: Mapping[str, Any], encoder_cfg) -> Any:
  """Cast an encoder's param tree (ModernBERT or BERT) to its compute dtype where it computes so.

  Args:
    params: the encoder's params (`ModernBertEncoder` / `BertEncoder` tree).
    encoder_cfg: its `ModernBertConfig` or `BertConfig`; `dtype` is the target.

  Returns:
    A new tree: Dense kernels and biases (and ModernBERT's token embeddings) in `encoder_cfg.dtype`,
    every other leaf unchanged.
  """
  dtype = jnp.dtype(encoder_cfg.dtype)
  if dtype == jnp.float32:
    return params
  # ModernBERT embeds in its compute dtype; BERT sums its three embeddings in float32.
  from logrerank_jax.models.encoders.modernbert import ModernBertConfig  # pylint: disable=g-import-not-at-top
  cast_embeddings = isinstance(encoder_cfg, ModernBertConfig)
  return jax.tree_util.tree_map_with_path(
      lambda path, leaf: _cast_leaf(path, leaf, dtype, cast_embeddings), params)


def log_params_for_inference(params: Mapping[str, Any], cfg) -> dict:
  """A LoG param tree for inference: the local encoder's matrices in its compute dtype.

  Args:
    params: {"local": {"encoder": ..., heads...}, "global": ...} (float32, as trained).
    cfg: the `LoGConfig` the params belong to; `cfg.local.encoder.dtype` is the target.

  Returns:
    A new tree; only `params["local"]["encoder"]` changes (see `encoder_params_for_inference`).
  """
  if "local" not in params or "encoder" not in params["local"]:
    raise ConfigError("log_params_for_inference: params lack the 'local'/'encoder' subtree")
  local = dict(params["local"])
  local["encoder"] = encoder_params_for_inference(local["encoder"], cfg.local.encoder)
  return {**params, "local": local}
