"""ModernBertConfig: HF config.json reading (transformers 4.x and 5.x styles), export, errors."""

import json
import logging

import jax
import jax.numpy as jnp
import pytest
import transformers

from logrerank_jax.errors import ConfigError
from logrerank_jax.models.encoders.modernbert import ModernBertConfig

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


def _patch_backend(monkeypatch, backend, compute_capability=None):
  """Make the dispatch see another backend (this suite runs on CPU) and a fresh fallback log."""
  from logrerank_jax.models.attention import dispatch as ad  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  monkeypatch.setattr(ad, "gpu_compute_capability", lambda: compute_capability)
  # The kernels' on-device self-check cannot run here (no GPU/TPU): pretend it passed. Its
  # failure path is tested below.
  monkeypatch.setattr(ad, "_probe_error", lambda impl: None)
  monkeypatch.setattr(ad, "_reported", set())
  monkeypatch.delenv(ad.INTERPRET_ENV, raising=False)
  return ad


def _fallback_lines(caplog):
  return [r.getMessage() for r in caplog.records
          if r.name == "logrerank_jax.models.attention.dispatch"]


def test_attention_impl_auto_is_the_default_and_resolves_by_backend(monkeypatch, caplog):
  cfg = ModernBertConfig()
  assert cfg.attention_impl == "auto"
  assert jax.default_backend() == "cpu"  # this suite runs on CPU
  assert cfg.resolved_attention_impl() == "tiled"
  _patch_backend(monkeypatch, "gpu", compute_capability=9.0)  # an H100/H200
  assert cfg.resolved_attention_impl() == "pallas_gpu"
  _patch_backend(monkeypatch, "tpu")
  assert cfg.resolved_attention_impl() == "splash_tpu"
  _patch_backend(monkeypatch, "rocm")  # no kernel of ours: the XLA reference
  assert cfg.resolved_attention_impl() == "xla"
  assert not _fallback_lines(caplog)  # nothing fell back
  for backend in ("cpu", "gpu", "tpu"):  # an explicit XLA-path choice is kept on every backend
    _patch_backend(monkeypatch, backend, compute_capability=9.0)
    for impl in ("xla", "blocked", "tiled"):
      assert cfg.replace(attention_impl=impl).resolved_attention_impl() == impl
  with pytest.raises(ConfigError, match="attention_impl"):
    cfg.replace(attention_impl="flash")


@pytest.mark.parametrize("case", ["old-gpu", "head-dim", "import", "pinned-elsewhere",
                                  "self-check", "wrong-result"])
def test_unavailable_kernel_falls_back_with_one_logged_line(monkeypatch, caplog, case):
  cfg = ModernBertConfig()
  want, reason = "xla", ""
  if case == "old-gpu":  # a V100: Pallas Triton needs compute capability >= 8.0
    ad = _patch_backend(monkeypatch, "gpu", compute_capability=7.0)
    reason = "compute capability"
  elif case == "head-dim":  # Triton tiles need a power-of-two head width
    ad = _patch_backend(monkeypatch, "gpu", compute_capability=9.0)
    cfg = cfg.replace(hidden_size=12 * 40)
    reason = "head_dim 40"
  elif case == "import":
    ad = _patch_backend(monkeypatch, "tpu")
    monkeypatch.setattr(ad, "_import_error", lambda impl: "its Pallas module does not import")
    reason = "does not import"
  elif case == "pinned-elsewhere":  # a saved config pinned to the GPU kernel, on a CPU host
    ad = _patch_backend(monkeypatch, "cpu")
    cfg = cfg.replace(attention_impl="pallas_gpu")
    want, reason = "tiled", "gpu backend"
  else:  # the real self-check
    from logrerank_jax.models.attention import dispatch as attention_dispatch  # pylint: disable=g-import-not-at-top
    from logrerank_jax.models.attention import pallas_gpu, reference  # pylint: disable=g-import-not-at-top
    probe = attention_dispatch._probe_error.__wrapped__  # pylint: disable=protected-access
    ad = _patch_backend(monkeypatch, "gpu", compute_capability=9.0)
    monkeypatch.setattr(ad, "_probe_error", probe)
    if case == "self-check":  # the Triton kernel cannot be compiled for this (CPU) device
      reason = "self-check on this device failed"
    else:  # a kernel that runs but ignores the window must not be used
      monkeypatch.setattr(pallas_gpu, "pallas_attention", lambda q, k, v, seg, pos, window, **kw:
                          reference.reference_attention(q, k, v, seg, pos, None, lambda p: p))
      reason = "off by"
  with caplog.at_level(logging.WARNING, logger=ad.__name__):
    for _ in range(3):  # one line per (path, reason), however many layers ask
      assert cfg.resolved_attention_impl() == want
  lines = _fallback_lines(caplog)
  assert len(lines) == 1 and reason in lines[0] and repr(want) in lines[0], lines
  assert cfg.attention_impl in ("auto", "pallas_gpu")  # the config keeps what the user chose


def test_interpret_mode_runs_a_pinned_kernel_on_any_backend(monkeypatch):
  ad = _patch_backend(monkeypatch, "cpu")
  monkeypatch.setenv(ad.INTERPRET_ENV, "1")
  for impl in ("pallas_gpu", "splash_tpu"):
    assert ModernBertConfig(attention_impl=impl).resolved_attention_impl() == impl


def test_pallas_gpu_encoder_through_dispatch_equals_xla(monkeypatch):
  """The path a GPU takes: "auto" on a (patched) GPU backend runs the block-skipping kernel in
  every layer (interpret mode here), and the encoder equals the XLA reference on packed rows
  with padding. (The kernel's gradients: tests/test_attention_kernels.py.)"""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from logrerank_jax.models.encoders import layers, modernbert as mb  # pylint: disable=g-import-not-at-top
  # One global and one window layer: every kind of layer, the fewest to compile.
  cfg = ModernBertConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=2, global_attn_every_n_layers=2, local_attention=8,
                         pad_token_id=0)
  seg = np.zeros((2, 48), np.int32)
  pos = np.zeros((2, 48), np.int32)
  for r, lens in enumerate([[13, 20, 5], [25]]):
    start = 0
    for s, n in enumerate(lens):
      seg[r, start:start + n], pos[r, start:start + n] = s + 1, np.arange(n)
      start += n
  ids = jnp.asarray(np.random.default_rng(0).integers(1, 64, seg.shape) * (seg > 0), jnp.int32)
  mask = jnp.asarray(seg > 0, jnp.int32)
  params = mb.init_params(cfg, jax.random.PRNGKey(0))

  def run(impl_cfg):
    enc = mb.ModernBertEncoder(impl_cfg)
    return np.asarray(jax.jit(enc.apply)({"params": params}, ids, mask, jnp.asarray(seg),
                                         jnp.asarray(pos)))

  ref = run(cfg.replace(attention_impl="xla"))
  ad = _patch_backend(monkeypatch, "gpu", compute_capability=9.0)
  monkeypatch.setenv(ad.INTERPRET_ENV, "1")
  assert cfg.resolved_attention_impl() == "pallas_gpu"
  calls = []
  real_kernel = layers.pallas_attention
  monkeypatch.setattr(layers, "pallas_attention",
                      lambda *a, **k: calls.append((a[5], k)) or real_kernel(*a, **k))
  out = run(cfg)
  # Both layers took the kernel, in interpret mode: the global one (window None) and the
  # window one (half window 4).
  assert [(w, k["interpret"]) for w, k in calls] == [(None, True), (4, True)]
  valid = seg > 0
  # float32, 2 layers: the kernel's per-layer error (<= ~2e-6, tests/test_attention_kernels.py)
  # adds up over depth like the parity tests' 1e-5 bound (measured in the commit message).
  err = np.abs(out[valid] - ref[valid]).max()
  assert err <= 1e-5, err
