"""Write a `LoGConfig` to JSON and read it back exactly (checkpoints carry their model config).

The encoder config of either family is stored under `log_config.local.encoder`, and its family
under `log_config.local.encoder_family` ("modernbert" or "bert", `local_scorer.ENCODER_FAMILIES`).
Files written before BERT support have no family key and are ModernBERT; they still load.
"""

import dataclasses
import json
from typing import Any, Dict

import numpy as np

from logrerank_jax.errors import ConfigError, LogRerankError
from logrerank_jax.graph.build import GraphBuildConfig
from logrerank_jax.models.encoders.bert import BertConfig
from logrerank_jax.models.graph_reranker import GraphRerankerConfig
from logrerank_jax.models.local_scorer import ENCODER_FAMILIES, LocalScorerConfig, encoder_family
from logrerank_jax.models.log_reranker import LoGConfig

DEFAULT_ENCODER_FAMILY = "modernbert"  # what a model_config.json without the family key holds

FORMAT_VERSION = 1


def _plain(value):
  """Return a JSON-ready copy of a config field (dtypes as names, tuples as lists)."""
  if dataclasses.is_dataclass(value):
    return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
  if isinstance(value, (tuple, list)):
    return [_plain(v) for v in value]
  if isinstance(value, (np.dtype, type)) or type(value).__name__ == "dtype":
    return np.dtype(value).name
  if isinstance(value, np.generic):
    return value.item()
  return value


def log_config_to_dict(cfg: LoGConfig) -> Dict[str, Any]:
  """Return a JSON-serialisable dict of `cfg`."""
  d = _plain(cfg)
  d["local"]["encoder_family"] = encoder_family(cfg.local.encoder)
  return {"format_version": FORMAT_VERSION, "log_config": d}


# Fields added after models were saved without them, with the value those models were
# trained with (the paper's setting; for dense_prior_encoding the only one there was then): a
# file lacking one of these loads as before.
ADDED_LATER = {LocalScorerConfig: {"dense_prior": 0.0, "dense_prior_encoding": "joint",
                                    "dense_prior_pooling": "sentence", "dense_prior_gradient": True,
                                    "dense_prior_passage_cls": False,
                                    "score_temperature": 1.0, "local_head_zero_init": False},
               GraphRerankerConfig: {"residual_local": False},
               # A runtime choice, not a trained one: older BERT-family models get "auto".
               BertConfig: {"attention_impl": "auto"}}


def _build(cls, data: Dict[str, Any], where: str, nested: Dict[str, Any] = None):
  """Instantiate dataclass `cls` from `data`, naming unknown or missing keys."""
  if not isinstance(data, dict):
    raise ConfigError(f"{where}: expected an object, got {type(data).__name__}")
  data = {**ADDED_LATER.get(cls, {}), **data}
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(data) - names)
  missing = sorted(names - set(data))
  if unknown or missing:
    # A missing key would silently take the dataclass default, which may not be what was trained.
    raise ConfigError(f"{where}:" + (f" unknown keys {unknown}" if unknown else "")
                      + (f" missing keys {missing}" if missing else ""))
  kwargs = {}
  for k, v in data.items():
    if nested and k in nested:
      kwargs[k] = nested[k]
    elif k == "dtype":
      try:
        if not isinstance(v, str):
          raise TypeError(v)
        kwargs[k] = np.dtype(v)  # compares equal to jnp.float32 and friends
      except (TypeError, ValueError):
        raise ConfigError(f"{where}.dtype: {v!r} is not a dtype name") from None
    elif isinstance(v, list):
      kwargs[k] = tuple(v)  # configs are hashable (static jit arguments)
    else:
      kwargs[k] = v
  try:
    return cls(**kwargs)
  except LogRerankError:
    raise
  except (TypeError, ValueError) as e:  # e.g. a __post_init__ check of a wrong-typed value
    raise ConfigError(f"{where}: {e}") from None


def log_config_from_dict(data: Dict[str, Any]) -> LoGConfig:
  """Rebuild a `LoGConfig` from `log_config_to_dict` output.

  Raises:
    ConfigError: unknown format version, unknown or missing keys (named).
  """
  if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
    raise ConfigError(f"model config: unsupported format_version "
                      f"{data.get('format_version') if isinstance(data, dict) else None!r}")
  d = data.get("log_config")
  if not isinstance(d, dict):
    raise ConfigError(f"model config: 'log_config' must be an object, got {type(d).__name__}")
  local = d.get("local", {})
  if not isinstance(local, dict):
    raise ConfigError(f"log_config.local: expected an object, got {type(local).__name__}")
  local = dict(local)
  family = local.pop("encoder_family", DEFAULT_ENCODER_FAMILY)
  if not isinstance(family, str) or family not in ENCODER_FAMILIES:
    raise ConfigError(f"log_config.local.encoder_family: {family!r} is not one of "
                      f"{sorted(ENCODER_FAMILIES)}")
  encoder = _build(ENCODER_FAMILIES[family], local.get("encoder", {}), "log_config.local.encoder")
  local_cfg = _build(LocalScorerConfig, local, "log_config.local", {"encoder": encoder})
  graph = _build(GraphBuildConfig, d.get("graph", {}), "log_config.graph")
  gat = _build(GraphRerankerConfig, d.get("graph_reranker", {}), "log_config.graph_reranker")
  return _build(LoGConfig, d, "log_config",
                {"local": local_cfg, "graph": graph, "graph_reranker": gat})


def save_log_config(path: str, cfg: LoGConfig) -> None:
  """Write `cfg` as JSON to `path`."""
  with open(path, "w", encoding="utf-8") as f:
    json.dump(log_config_to_dict(cfg), f, indent=2, sort_keys=True)


def load_log_config(path: str) -> LoGConfig:
  """Read a `LoGConfig` written by `save_log_config`."""
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except (OSError, ValueError, RecursionError) as e:  # ValueError: bad JSON or not UTF-8
    raise ConfigError(f"{path}: cannot read model config ({e})") from None
  return log_config_from_dict(data)
