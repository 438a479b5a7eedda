"""torch <-> Flax ModernBERT conversion and checkpoint loading: map, parity, round trip, refusals."""

import builtins
import functools
import json
import os
import pickle
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from logrerank_jax.convert import (
    load_torch_state_dict,
    modernbert_encoder_rules,
    modernbert_params_from_torch,
    modernbert_params_to_torch,
    sequence_classifier_params_from_torch,
    sequence_classifier_params_to_torch,
    sequence_classifier_rules,
)
from logrerank_jax.errors import CheckpointError
from logrerank_jax.models.encoders.modernbert import (
    ModernBertConfig,
    ModernBertEncoder,
    ModernBertSequenceClassifier,
)
from torch_init import randomise_uniform_norms as _randomise

# float32 bound for two implementations of the same float32 model (torch vs Flax, and Flax jitted
# vs eager: XLA fuses and reassociates differently, so neither pair is bit-exact). Derivation: they
# differ only by summation order; each rounded dot product (K <= 96 here) or softmax/norm stage
# adds a few eps (eps = 2^-23 ~ 1.19e-7) of the output scale to the pre-LayerNorm residual
# stream, and these add up (do not compound) over depth: ~4 eps x (3 layers + embedding norm +
# final norm) x scale (max |hidden| = 4.1 on these weights) ~ 9.8e-6. Logits (|logit| <= 0.76)
# sit below it. Measured max abs (default ISA / AVX2 / SSE4.2 kernels): hidden states 2.1e-6,
# jit vs eager 1.2e-6, logits 4.2e-7.
PARITY_ATOL = 1e-5

# Tiny shapes: 3 layers (global, sliding, global), window 8 (half 4) < L = 24 so the window bites.
TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            num_attention_heads=4, local_attention=8, global_attn_every_n_layers=2,
            max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            cls_token_id=1, sep_token_id=2)
NO_BIAS = dict(norm_bias=False, attention_bias=False, mlp_bias=False, classifier_bias=False)
ALL_BIAS = dict(norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True)


def _hf_config(**overrides):
  return transformers.ModernBertConfig(**{**TINY, **overrides})




def _inputs():
  """Two rows of L = 24, the second padded after 17 tokens."""
  rng = np.random.default_rng(0)
  ids = rng.integers(3, TINY["vocab_size"], size=(2, 24)).astype(np.int32)  # [B, L]
  mask = np.ones_like(ids)
  mask[1, 17:] = 0
  ids[1, 17:] = TINY["pad_token_id"]
  return ids, mask


@functools.lru_cache(maxsize=None)
def _apply_fn(cfg, classifier, jit=True):
  module = ModernBertSequenceClassifier(cfg) if classifier else ModernBertEncoder(cfg)
  fn = lambda p, ids, m: module.apply({"params": p}, ids, m, deterministic=True)
  return jax.jit(fn) if jit else fn


def _save_bin(sd, folder, shards=1):
  """Write a torch pickle checkpoint as transformers 4.x did (`pytorch_model.bin`, or sharded)."""
  os.makedirs(folder, exist_ok=True)
  if shards == 1:
    torch.save(sd, os.path.join(folder, "pytorch_model.bin"))
    return
  keys = list(sd)
  weight_map = {}
  for s in range(shards):
    name = f"pytorch_model-{s + 1:05d}-of-{shards:05d}.bin"
    part = {k: sd[k] for k in keys[s::shards]}
    torch.save(part, os.path.join(folder, name))
    weight_map.update({k: name for k in part})
  with open(os.path.join(folder, "pytorch_model.bin.index.json"), "w") as f:
    json.dump({"metadata": {}, "weight_map": weight_map}, f)


def _save_formats(model, root):
  """Save `model` as safetensors, sharded safetensors, .bin and sharded .bin; return the folders."""
  folders = {}
  folders["safetensors"] = str(root / "st")
  model.save_pretrained(folders["safetensors"])
  folders["sharded_safetensors"] = str(root / "st_sharded")
  model.save_pretrained(folders["sharded_safetensors"], max_shard_size="20KB")
  # transformers 5 always writes safetensors; write the pickle layouts it used to write by hand.
  sd = {k: v.contiguous() for k, v in model.state_dict().items()}
  for name, shards in (("bin", 1), ("sharded_bin", 3)):
    folders[name] = str(root / name)
    _save_bin(sd, folders[name], shards)
    model.config.save_pretrained(folders[name])
  return folders


FORMATS = ["safetensors", "sharded_safetensors", "bin", "sharded_bin"]


@pytest.fixture(scope="module")
def encoder_ckpt(tmp_path_factory):
  """A random tiny torch ModernBertModel, its outputs on `_inputs()`, and its saved folders."""
  torch.manual_seed(0)
  model = _randomise(transformers.ModernBertModel(_hf_config(**NO_BIAS)), seed=1)
  ids, mask = _inputs()
  with torch.no_grad():
    out = model(input_ids=torch.from_numpy(ids).long(),
                attention_mask=torch.from_numpy(mask).long()).last_hidden_state.numpy()
  folders = _save_formats(model, tmp_path_factory.mktemp("encoder"))
  assert len(os.listdir(folders["sharded_safetensors"])) > 3  # really sharded
  return model, out, folders


@pytest.fixture(scope="module", params=["mean_allbias", "cls_nobias"])
def classifier_ckpt(request, tmp_path_factory):
  """A random tiny ModernBertForSequenceClassification (two variants) with outputs and folder."""
  variants = {"mean_allbias": ("mean", ALL_BIAS), "cls_nobias": ("cls", NO_BIAS)}
  pooling, bias = variants[request.param]
  torch.manual_seed(0)
  hf = _hf_config(classifier_pooling=pooling, num_labels=2, **bias)
  model = _randomise(transformers.ModernBertForSequenceClassification(hf), seed=2)
  ids, mask = _inputs()
  with torch.no_grad():
    logits = model(input_ids=torch.from_numpy(ids).long(),
                   attention_mask=torch.from_numpy(mask).long()).logits.numpy()
  folder = tmp_path_factory.mktemp("classifier") / "st"
  model.save_pretrained(str(folder))
  return model, logits, str(folder)


# ---------------------------------------------------------------------------------------------
# The declarative map against contract C1 and the real Flax modules.


def _c1_encoder_tree(n_layers, d, inter, vocab, norm_bias, attn_bias, mlp_bias):
  """Expected {flax path: shape} of the encoder, written out by hand from contract C1."""
  def norm(prefix):
    out = {f"{prefix}/scale": (d,)}
    if norm_bias:
      out[f"{prefix}/bias"] = (d,)
    return out

  def dense(prefix, fan_in, fan_out, bias):
    out = {f"{prefix}/kernel": (fan_in, fan_out)}
    if bias:
      out[f"{prefix}/bias"] = (fan_out,)
    return out

  tree = {"embeddings/tok_embeddings/embedding": (vocab, d), **norm("embeddings/norm"),
          **norm("final_norm")}
  for i in range(n_layers):
    if i > 0:
      tree.update(norm(f"layers_{i}/attn_norm"))
    tree.update(dense(f"layers_{i}/attn/Wqkv", d, 3 * d, attn_bias))
    tree.update(dense(f"layers_{i}/attn/Wo", d, d, attn_bias))
    tree.update(norm(f"layers_{i}/mlp_norm"))
    tree.update(dense(f"layers_{i}/mlp/Wi", d, 2 * inter, mlp_bias))
    tree.update(dense(f"layers_{i}/mlp/Wo", inter, d, mlp_bias))
  return tree


def _trees_equal(a, b):
  """True iff two param trees have the same structure and bit-identical leaves."""
  if jax.tree_util.tree_structure(a) != jax.tree_util.tree_structure(b):
    return False
  pairs = zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
  return all(np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(x, y) for x, y in pairs)


def _flat_shapes(tree, prefix=""):
  out = {}
  for k, v in tree.items():
    path = f"{prefix}/{k}" if prefix else k
    out.update(_flat_shapes(v, path) if hasattr(v, "items") else {path: tuple(v.shape)})
  return out


def _rule_flax_shapes(rules):
  return {"/".join(r.flax_path): (tuple(reversed(r.torch_shape)) if r.transform == "linear"
                                  else r.torch_shape) for r in rules}


BIAS_CASES = [NO_BIAS, ALL_BIAS, dict(NO_BIAS, attention_bias=True),
              dict(NO_BIAS, mlp_bias=True, classifier_bias=True)]
BIAS_IDS = ["no_bias", "all_bias", "attn_bias_only", "mlp_and_classifier_bias"]


@pytest.mark.parametrize("bias", BIAS_CASES, ids=BIAS_IDS)
def test_rules_match_contract_and_flax_init(bias):
  cfg = ModernBertConfig.from_hf({**TINY, **bias, "num_labels": 3})
  enc_shapes = _rule_flax_shapes(modernbert_encoder_rules(cfg))
  expected = _c1_encoder_tree(3, 32, 48, 64, bias["norm_bias"], bias["attention_bias"],
                              bias["mlp_bias"])
  assert enc_shapes == expected
  ids = jnp.zeros((1, 4), jnp.int32)
  real = jax.eval_shape(lambda: ModernBertEncoder(cfg).init(jax.random.PRNGKey(0), ids)["params"])
  assert _flat_shapes(real) == expected

  cls_shapes = _rule_flax_shapes(sequence_classifier_rules(cfg))
  head = {"head/dense/kernel": (32, 32), "head/norm/scale": (32,), "classifier/kernel": (32, 3),
          "classifier/bias": (3,)}
  if bias["classifier_bias"]:
    head["head/dense/bias"] = (32,)
  if bias["norm_bias"]:
    head["head/norm/bias"] = (32,)
  assert cls_shapes == {**{f"model/{k}": v for k, v in expected.items()}, **head}
  real_cls = jax.eval_shape(
      lambda: ModernBertSequenceClassifier(cfg).init(jax.random.PRNGKey(0), ids)["params"])
  assert _flat_shapes(real_cls) == cls_shapes


@pytest.mark.parametrize("bias", BIAS_CASES, ids=BIAS_IDS)
def test_rules_match_torch_state_dict_names_and_shapes(bias):
  cfg = ModernBertConfig.from_hf({**TINY, **bias, "num_labels": 3})
  torch_model = transformers.ModernBertForSequenceClassification(_hf_config(num_labels=3, **bias))
  want = {k: tuple(v.shape) for k, v in torch_model.state_dict().items()}
  assert {r.torch_name: r.torch_shape for r in sequence_classifier_rules(cfg)} == want
  enc_want = {k: tuple(v.shape) for k, v in torch_model.model.state_dict().items()}
  assert {r.torch_name: r.torch_shape for r in modernbert_encoder_rules(cfg)} == enc_want


def test_known_answer_transforms():
  """Linear weights are transposed, norms map weight -> scale, embeddings pass unchanged."""
  cfg = ModernBertConfig.from_hf({**TINY, **NO_BIAS, "num_hidden_layers": 1})
  sd = {r.torch_name: np.arange(np.prod(r.torch_shape), dtype=np.float64).reshape(r.torch_shape)
        + 1000 * k for k, r in enumerate(modernbert_encoder_rules(cfg))}
  p = modernbert_params_from_torch(sd, cfg)
  np.testing.assert_array_equal(p["layers_0"]["attn"]["Wqkv"]["kernel"],
                                sd["layers.0.attn.Wqkv.weight"].T)
  assert p["layers_0"]["attn"]["Wqkv"]["kernel"][2, 5] == sd["layers.0.attn.Wqkv.weight"][5, 2]
  np.testing.assert_array_equal(p["layers_0"]["mlp"]["Wo"]["kernel"],
                                sd["layers.0.mlp.Wo.weight"].T)
  np.testing.assert_array_equal(p["embeddings"]["tok_embeddings"]["embedding"],
                                sd["embeddings.tok_embeddings.weight"])
  np.testing.assert_array_equal(p["final_norm"]["scale"], sd["final_norm.weight"])
  assert "attn_norm" not in p["layers_0"]
  leaves = jax.tree_util.tree_leaves(p)
  assert leaves and all(x.dtype == np.float32 for x in leaves)


# ---------------------------------------------------------------------------------------------
# End-to-end parity with transformers on checkpoints saved in every layout.


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_encoder_parity_per_format(encoder_ckpt, fmt):
  _, want, folders = encoder_ckpt
  sd = load_torch_state_dict(folders[fmt])
  cfg = ModernBertConfig.from_hf(folders[fmt])
  params = modernbert_params_from_torch(sd, cfg)
  ids, mask = _inputs()
  got = np.asarray(_apply_fn(cfg, False)(params, ids, mask))
  valid = mask.astype(bool)  # padded positions are unspecified in both implementations
  err = np.abs(got - want)[valid].max()
  assert err <= PARITY_ATOL, f"{fmt}: max abs err {err:.2e}"
  assert np.abs(want).max() > 0.5  # the outputs are not trivially small


def test_encoder_jit_matches_no_jit(encoder_ckpt):
  _, _, folders = encoder_ckpt
  cfg = ModernBertConfig.from_hf(folders["safetensors"])
  params = modernbert_params_from_torch(load_torch_state_dict(folders["safetensors"]), cfg)
  ids, mask = _inputs()
  a = np.asarray(_apply_fn(cfg, False, jit=True)(params, ids, mask))
  b = np.asarray(_apply_fn(cfg, False, jit=False)(params, ids, mask))
  # Not bit-exact (was atol=1e-6: 3 of 1,536 elements differ by 1.19e-6 on AVX-512 CPUs); the
  # jitted and eager programs are two float32 evaluation orders, bounded like torch vs Flax.
  np.testing.assert_allclose(a, b, atol=PARITY_ATOL, rtol=0)


def test_all_formats_load_identically(encoder_ckpt):
  model, _, folders = encoder_ckpt
  want = {k: v.numpy() for k, v in model.state_dict().items()}
  for fmt in FORMATS:
    sd = load_torch_state_dict(folders[fmt])
    assert sorted(sd) == sorted(want), fmt
    for k in want:
      assert sd[k].dtype == np.float32 and np.array_equal(sd[k], want[k]), (fmt, k)


def test_classifier_parity_and_encoder_only_from_classifier(classifier_ckpt):
  model, want, folder = classifier_ckpt
  sd = load_torch_state_dict(folder)
  cfg = ModernBertConfig.from_hf(folder)
  params = sequence_classifier_params_from_torch(sd, cfg)
  ids, mask = _inputs()
  got = np.asarray(_apply_fn(cfg, True)(params, ids, mask))
  assert got.shape == want.shape == (2, 2)
  err = np.abs(got - want).max()
  assert err <= PARITY_ATOL, f"max abs err {err:.2e}"

  # Encoder only from the classifier checkpoint: head.* / classifier.* are skipped, not errors.
  enc = modernbert_params_from_torch(sd, cfg)
  assert _trees_equal(enc, params["model"])

  # Same checkpoint without the "model." prefix converts to the same tree.
  bare = {k.removeprefix("model."): v for k, v in sd.items()}
  params_bare = sequence_classifier_params_from_torch(bare, cfg)
  assert _trees_equal(params_bare, params)


def test_encoder_from_mlm_checkpoint_skips_decoder():
  hf = _hf_config(**NO_BIAS)
  mlm = _randomise(transformers.ModernBertForMaskedLM(hf), seed=3)
  sd = {k: v.numpy() for k, v in mlm.state_dict().items()}
  assert any(k.startswith("decoder.") for k in sd) and any(k.startswith("head.") for k in sd)
  cfg = ModernBertConfig.from_hf(hf.to_dict())
  params = modernbert_params_from_torch(sd, cfg)
  np.testing.assert_array_equal(params["layers_2"]["mlp"]["Wi"]["kernel"],
                                sd["model.layers.2.mlp.Wi.weight"].T)


# ---------------------------------------------------------------------------------------------
# Flax -> torch -> Flax.


@pytest.mark.parametrize("bias", [NO_BIAS, ALL_BIAS], ids=["no_bias", "all_bias"])
def test_round_trip_bit_exact_and_strict_torch_load(bias):
  hf = _hf_config(num_labels=2, **bias)
  cfg = ModernBertConfig.from_hf(hf.to_dict())
  ids = jnp.zeros((1, 4), jnp.int32)
  # The real module's tree structure, filled with random values (no compile needed for shapes).
  shapes = jax.eval_shape(
      lambda: ModernBertSequenceClassifier(cfg).init(jax.random.PRNGKey(1), ids)["params"])
  rng = np.random.default_rng(4)
  cls_params = jax.tree_util.tree_map(
      lambda s: rng.standard_normal(s.shape).astype(np.float32), shapes)

  exported = sequence_classifier_params_to_torch(cls_params, cfg)
  back = sequence_classifier_params_from_torch(exported, cfg)
  assert _trees_equal(back, cls_params)
  torch_cls = transformers.ModernBertForSequenceClassification(hf)
  torch_cls.load_state_dict({k: torch.from_numpy(v) for k, v in exported.items()}, strict=True)
  wqkv = cls_params["model"]["layers_1"]["attn"]["Wqkv"]["kernel"]  # [d, 3d]
  np.testing.assert_array_equal(torch_cls.model.layers[1].attn.Wqkv.weight.detach().numpy(),
                                np.asarray(wqkv).T)

  enc_params = cls_params["model"]
  enc_exported = modernbert_params_to_torch(enc_params, cfg)
  assert not any(k.startswith("model.") for k in enc_exported)
  enc_back = modernbert_params_from_torch(enc_exported, cfg)
  assert _trees_equal(enc_back, enc_params)
  transformers.ModernBertModel(hf).load_state_dict(
      {k: torch.from_numpy(v) for k, v in enc_exported.items()}, strict=True)


# ---------------------------------------------------------------------------------------------
# Mismatch errors name every offending key.


@pytest.fixture(scope="module")
def tiny_sd_and_cfg():
  hf = _hf_config(**NO_BIAS)
  sd = {k: v.numpy() for k, v in transformers.ModernBertModel(hf).state_dict().items()}
  return sd, ModernBertConfig.from_hf(hf.to_dict())


def test_wrong_shape_key_is_named_with_shapes(tiny_sd_and_cfg):
  sd, cfg = tiny_sd_and_cfg
  bad = dict(sd, **{"layers.1.mlp.Wo.weight": np.zeros((32, 40), np.float32)})
  pattern = r"layers\.1\.mlp\.Wo\.weight: expected \(32, 48\), got \(32, 40\)"
  with pytest.raises(CheckpointError, match=pattern):
    modernbert_params_from_torch(bad, cfg)


def test_missing_key_is_named(tiny_sd_and_cfg):
  sd, cfg = tiny_sd_and_cfg
  bad = {k: v for k, v in sd.items() if k != "layers.2.attn_norm.weight"}
  with pytest.raises(CheckpointError, match=r"missing keys \['layers\.2\.attn_norm\.weight'\]"):
    modernbert_params_from_torch(bad, cfg)


def test_unknown_key_is_named(tiny_sd_and_cfg):
  sd, cfg = tiny_sd_and_cfg
  bad = dict(sd, **{"layers.0.attn.rotary.inv_freq": np.zeros(4, np.float32)})
  pattern = r"unexpected keys \['layers\.0\.attn\.rotary\.inv_freq'\]"
  with pytest.raises(CheckpointError, match=pattern):
    modernbert_params_from_torch(bad, cfg)


def test_all_problems_reported_in_one_error(tiny_sd_and_cfg):
  sd, cfg = tiny_sd_and_cfg
  bad = {k: v for k, v in sd.items() if k not in ("final_norm.weight", "layers.0.mlp_norm.weight")}
  bad["embeddings.tok_embeddings.weight"] = np.zeros((65, 32), np.float32)
  bad["pooler.weight"] = np.zeros(3, np.float32)
  with pytest.raises(CheckpointError) as e:
    modernbert_params_from_torch(bad, cfg)
  msg = str(e.value)
  assert "\n" not in msg
  for name in ("final_norm.weight", "layers.0.mlp_norm.weight", "pooler.weight",
               "embeddings.tok_embeddings.weight: expected (64, 32), got (65, 32)"):
    assert name in msg


def test_classifier_missing_head_is_named(tiny_sd_and_cfg):
  sd, cfg = tiny_sd_and_cfg  # a bare ModernBertModel checkpoint has no head
  with pytest.raises(CheckpointError, match=r"head\.dense\.weight.*classifier\.weight"):
    sequence_classifier_params_from_torch(sd, cfg)


def test_prefix_clash_is_refused(tiny_sd_and_cfg):
  sd, cfg = tiny_sd_and_cfg
  bad = dict(sd, **{"model.final_norm.weight": sd["final_norm.weight"]})
  with pytest.raises(CheckpointError, match=r"final_norm\.weight"):
    modernbert_params_from_torch(bad, cfg)


def test_to_torch_names_bad_flax_paths(tiny_sd_and_cfg):
  sd, cfg = tiny_sd_and_cfg
  params = modernbert_params_from_torch(sd, cfg)
  params["layers_1"]["attn"]["Wo"]["kernel"] = np.zeros((32, 31), np.float32)
  del params["final_norm"]
  params["layers_0"]["attn_norm"] = {"scale": np.ones(32, np.float32)}
  with pytest.raises(CheckpointError) as e:
    modernbert_params_to_torch(params, cfg)
  msg = str(e.value)
  for name in ("final_norm/scale", "layers_0/attn_norm/scale",
               "layers_1/attn/Wo/kernel: expected (32, 32), got (32, 31)"):
    assert name in msg


# ---------------------------------------------------------------------------------------------
# Loader: layouts, dtypes and refusals.


class _Payload:
  """A pickle payload that runs code when unpickled (the attack the loader must refuse)."""

  def __init__(self, marker, how):
    self.marker, self.how = str(marker), how

  def __reduce__(self):
    if self.how == "os_system":
      return (os.system, (f"touch '{self.marker}'",))
    return (builtins.open, (self.marker, "w"))


@pytest.mark.parametrize("how", ["os_system", "open_file"], ids=["os_system", "open_file"])
@pytest.mark.parametrize("container", ["torch_save_zip", "raw_pickle"],
                         ids=["torch_save_zip", "raw_pickle"])
def test_code_carrying_pickle_is_refused_and_never_runs(tmp_path, how, container):
  marker = tmp_path / "pwned"
  path = tmp_path / "evil.bin"
  obj = {"w": torch.ones(2), "x": _Payload(marker, how)}
  if container == "torch_save_zip":
    torch.save(obj, str(path))
  else:
    with open(path, "wb") as f:
      pickle.dump(obj, f, protocol=2)
  with pytest.raises(CheckpointError, match="refused to load"):
    load_torch_state_dict(path)
  assert not marker.exists()
  # Control: the payload is live, so the check above could fail.
  control = tmp_path / "control"
  pickle.loads(pickle.dumps(_Payload(control, how)))
  assert control.exists()


def test_bf16_is_widened_exactly(tmp_path):
  w = torch.randn(5, 3).to(torch.bfloat16)
  want = w.float().numpy()
  from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top
  save_file({"w": w, "f16": w.half()}, str(tmp_path / "m.safetensors"))
  torch.save({"w": w}, str(tmp_path / "m.pt"))
  st = load_torch_state_dict(tmp_path / "m.safetensors")
  assert st["w"].dtype == np.float32 and np.array_equal(st["w"], want)
  assert st["f16"].dtype == np.float16  # other float dtypes keep their precision
  pt = load_torch_state_dict(tmp_path / "m.pt")
  assert pt["w"].dtype == np.float32 and np.array_equal(pt["w"], want)


def _write_sharded(folder, shards):
  """Write safetensors shards {file: {key: array}}; the index maps each key to its first file."""
  folder.mkdir(exist_ok=True)
  weight_map = {}
  for name, tensors in shards.items():
    safetensors.numpy.save_file(tensors, str(folder / name))
    for k in tensors:
      weight_map.setdefault(k, name)
  with open(folder / "model.safetensors.index.json", "w") as f:
    json.dump({"weight_map": weight_map}, f)


def test_index_naming_missing_shard_is_named(tmp_path):
  _write_sharded(tmp_path, {"model-00001-of-00002.safetensors": {"a": np.ones(2, np.float32)}})
  index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
  index["weight_map"]["b"] = "model-00002-of-00002.safetensors"
  (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
  with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors"):
    load_torch_state_dict(tmp_path)


def test_duplicate_key_across_shards_is_named(tmp_path):
  one, two = np.ones(2, np.float32), np.zeros(1, np.float32)
  _write_sharded(tmp_path, {"s1.safetensors": {"a": one, "dup": two},
                            "s2.safetensors": {"b": one, "dup": two + 1}})
  # The index must name both shards for both to be read.
  index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
  assert set(index["weight_map"].values()) == {"s1.safetensors", "s2.safetensors"}
  pattern = r"more than one shard.*dup \(in s1\.safetensors and s2\.safetensors\)"
  with pytest.raises(CheckpointError, match=pattern):
    load_torch_state_dict(tmp_path)


def test_index_key_absent_from_its_shard_is_named(tmp_path):
  _write_sharded(tmp_path, {"s1.safetensors": {"a": np.ones(2, np.float32)}})
  index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
  index["weight_map"]["ghost"] = "s1.safetensors"
  (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
  with pytest.raises(CheckpointError, match="ghost"):
    load_torch_state_dict(tmp_path)


BAD_FILE_CASES = ["missing_path", "empty_folder", "unknown_suffix", "corrupt_safetensors",
                  "non_tensor_entry", "index_escapes_folder"]


@pytest.mark.parametrize("case", BAD_FILE_CASES, ids=BAD_FILE_CASES)
def test_bad_paths_and_files_raise_checkpoint_error(tmp_path, case):
  if case == "missing_path":
    path, pattern = tmp_path / "nope", "does not exist"
  elif case == "empty_folder":
    path, pattern = tmp_path, "no checkpoint in folder"
  elif case == "unknown_suffix":
    path, pattern = tmp_path / "weights.h5", "unknown checkpoint format"
    path.write_bytes(b"\0")
  elif case == "corrupt_safetensors":
    path, pattern = tmp_path / "model.safetensors", "unreadable safetensors"
    path.write_bytes(b"\x10\0\0\0\0\0\0\0{not json}")
  elif case == "non_tensor_entry":
    path, pattern = tmp_path / "m.bin", r"non-tensor entries: \['step \(int\)'\]"
    torch.save({"w": torch.ones(1), "step": 3}, str(path))
  else:
    path, pattern = tmp_path / "model.safetensors.index.json", r"invalid shard file\(s\): \['\.\./x"
    path.write_text(json.dumps({"weight_map": {"a": "../x.safetensors"}}))
  with pytest.raises(CheckpointError, match=pattern):
    load_torch_state_dict(path)


def test_bin_without_torch_gives_clear_error(tmp_path, monkeypatch):
  path = tmp_path / "pytorch_model.bin"
  torch.save({"w": torch.ones(1)}, str(path))
  monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
  with pytest.raises(CheckpointError, match="needs PyTorch"):
    load_torch_state_dict(tmp_path)
