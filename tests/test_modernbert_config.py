"""ModernBertConfig: HF config.json reading (transformers 4.x and 5.x styles), export, errors."""

import json
import logging

import jax
import jax.numpy as jnp
import pytest
import transformers

from logrerank_jax.errors import ConfigError
from logrerank_jax.models.modernbert import ModernBertConfig

logging.getLogger("transformers").setLevel(logging.ERROR)
transformers.logging.set_verbosity_error()

# A config.json in the transformers 4.x style of answerdotai/ModernBERT-base (field names and
# values as that release writes them, including keys this library ignores).
HF4_BASE = {
    "architectures": ["ModernBertForMaskedLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 50281, "classifier_activation": "gelu", "classifier_bias": False,
    "classifier_dropout": 0.0, "classifier_pooling": "mean", "cls_token_id": 50281,
    "decoder_bias": True, "deterministic_flash_attn": False, "embedding_dropout": 0.0,
    "eos_token_id": 50282, "global_attn_every_n_layers": 3, "global_rope_theta": 160000.0,
    "gradient_checkpointing": False, "hidden_activation": "gelu", "hidden_size": 768,
    "initializer_cutoff_factor": 2.0, "initializer_range": 0.02, "intermediate_size": 1152,
    "layer_norm_eps": 1e-05, "local_attention": 128, "local_rope_theta": 10000.0,
    "max_position_embeddings": 8192, "mlp_bias": False, "mlp_dropout": 0.0,
    "model_type": "modernbert", "norm_bias": False, "norm_eps": 1e-05, "num_attention_heads": 12,
    "num_hidden_layers": 22, "pad_token_id": 50283, "position_embedding_type": "absolute",
    "reference_compile": True, "sep_token_id": 50282, "sparse_pred_ignore_index": -100,
    "sparse_prediction": False, "torch_dtype": "float32", "transformers_version": "4.47.0.dev0",
    "vocab_size": 50368,
}


def _hf4_tiny(**changes):
  """Return a tiny 4.x-style dict with non-default thetas and window."""
  d = dict(HF4_BASE, vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=5,
           num_attention_heads=4, global_attn_every_n_layers=2, local_attention=8,
           global_rope_theta=1000.0, local_rope_theta=50.0, id2label={"0": "a", "1": "b", "2": "c"})
  d.update(changes)
  return d


def test_from_hf_4x_base_known_values():
  cfg = ModernBertConfig.from_hf(HF4_BASE)
  assert cfg.num_hidden_layers == 22 and cfg.hidden_size == 768 and cfg.head_dim == 64
  assert cfg.sliding_window == 64 and cfg.classifier_pooling == "mean"
  assert cfg.global_rope_theta == 160000.0 and cfg.local_rope_theta == 10000.0
  assert cfg.layer_types[:4] == ("full_attention", "sliding_attention", "sliding_attention",
                                 "full_attention")
  assert sum(t == "full_attention" for t in cfg.layer_types) == 8  # layers 0, 3, ..., 21
  assert cfg.num_labels == 2 and cfg.dtype == jnp.float32


@pytest.mark.parametrize("hf4", [_hf4_tiny(), HF4_BASE], ids=["tiny", "base"])
def test_from_hf_4x_and_5x_give_identical_configs(hf4):
  # transformers 5.x reads the 4.x dict and writes the 5.x style (rope_parameters, layer_types).
  hf5 = transformers.ModernBertConfig.from_dict(hf4).to_dict()
  assert "rope_parameters" in hf5 and "layer_types" in hf5
  hf5.pop("global_attn_every_n_layers", None)  # only layer_types may carry the pattern
  assert ModernBertConfig.from_hf(hf5) == ModernBertConfig.from_hf(hf4)


def test_5x_rope_parameters_take_precedence_and_layer_types_are_honoured():
  layer_types = ["sliding_attention", "full_attention", "sliding_attention"]
  hf5 = dict(_hf4_tiny(num_hidden_layers=3), layer_types=layer_types,
             rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 7.0},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 3.0}})
  cfg = ModernBertConfig.from_hf(hf5)
  assert cfg.layer_types == tuple(layer_types)
  assert (cfg.global_rope_theta, cfg.local_rope_theta) == (7.0, 3.0)


def test_to_hf_dict_round_trips_through_transformers():
  cfg = ModernBertConfig.from_hf(_hf4_tiny(norm_bias=True, attention_bias=True,
                                           hidden_activation="gelu_pytorch_tanh",
                                           classifier_pooling="cls", classifier_dropout=0.1))
  hf = transformers.ModernBertConfig(**cfg.to_hf_dict())
  assert list(hf.layer_types) == list(cfg.layer_types) and hf.num_labels == 3
  assert ModernBertConfig.from_hf(hf.to_dict()) == cfg
  assert ModernBertConfig.from_hf(json.loads(json.dumps(cfg.to_hf_dict()))) == cfg


def test_from_hf_reads_file_and_folder(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps(_hf4_tiny()))
  expected = ModernBertConfig.from_hf(_hf4_tiny())
  assert ModernBertConfig.from_hf(tmp_path) == expected
  assert ModernBertConfig.from_hf(str(tmp_path / "config.json")) == expected
  assert ModernBertConfig.from_hf(tmp_path, dtype="bfloat16").dtype == jnp.bfloat16


@pytest.mark.parametrize("change,key", [
    (dict(hidden_activation="gelu_10"), "hidden_activation"),
    (dict(classifier_activation="prelu"), "classifier_activation"),
    (dict(classifier_pooling="max"), "classifier_pooling"),
    (dict(num_attention_heads=5), "num_attention_heads"),
    (dict(layer_types=["full_attention", "chunked_attention", "full_attention",
                       "full_attention", "full_attention"]), "layer_types"),
    (dict(layer_types=["full_attention"]), "layer_types"),
    (dict(rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 1.0}}),
     "rope_type"),
    (dict(model_type="bert"), "model_type"),
    (dict(attention_dropout=1.5), "attention_dropout"),
], ids=["activation", "classifier-activation", "pooling", "heads", "layer-type-name",
        "layer-types-length", "rope-type", "model-type", "dropout-range"])
def test_from_hf_rejects_values_it_cannot_honour(change, key):
  with pytest.raises(ConfigError, match=key):
    ModernBertConfig.from_hf(_hf4_tiny(**change))


@pytest.mark.parametrize("missing", ["vocab_size", "hidden_size", "num_hidden_layers"])
def test_from_hf_names_a_missing_required_key(missing):
  hf = _hf4_tiny()
  del hf[missing]
  with pytest.raises(ConfigError, match=missing):
    ModernBertConfig.from_hf(hf)


def test_from_hf_bad_path(tmp_path):
  with pytest.raises(ConfigError, match="no HF config"):
    ModernBertConfig.from_hf(tmp_path / "absent")
  (tmp_path / "config.json").write_text("{not json")
  with pytest.raises(ConfigError, match="not valid JSON"):
    ModernBertConfig.from_hf(tmp_path)


def test_config_is_hashable_for_static_jit_args():
  a = ModernBertConfig.from_hf(_hf4_tiny(), dtype=jnp.bfloat16)
  b = ModernBertConfig.from_hf(_hf4_tiny(), dtype="bfloat16")
  assert a == b and hash(a) == hash(b)


def test_attention_impl_auto_is_the_default_and_resolves_by_backend(monkeypatch):
  cfg = ModernBertConfig()
  assert cfg.attention_impl == "auto"
  assert jax.default_backend() == "cpu"  # this suite runs on CPU
  assert cfg.resolved_attention_impl() == "tiled"
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert cfg.resolved_attention_impl() == "xla"
  for impl in ("xla", "blocked", "tiled"):  # an explicit choice is kept on every backend
    assert cfg.replace(attention_impl=impl).resolved_attention_impl() == impl
  with pytest.raises(ConfigError, match="attention_impl"):
    cfg.replace(attention_impl="flash")
