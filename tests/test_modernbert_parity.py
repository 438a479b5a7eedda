"""Parity of the Flax ModernBERT with transformers' PyTorch ModernBERT on random weights.

Every parameter of the torch model (norm weights included) is randomised, converted with a
small local helper (W.T for Linear), and outputs are compared at valid positions.
float32 tolerance ATOL_F32 = 1e-5 at valid positions, everywhere in this file (torch vs Flax,
jitted vs eager, packed vs alone). Derivation: two float32 evaluations of the same model differ
only by summation order (XLA's fusions and ISA-specific kernels included); each rounded dot
product (K <= 96) or softmax/norm stage adds a few eps (eps = 2^-23 ~ 1.19e-7) of the output
scale to the pre-LayerNorm residual stream, adding up (not compounding) over depth:
~4 eps x (3 layers + embedding norm + final norm) x scale (max |hidden| ~ 4 on these random
weights: 4.0 in the bf16 test) ~ 9.5e-6. Measured max abs with the default, AVX2 and SSE4.2 XLA
CPU kernels: <= 2.3e-6 (hidden states), <= 1.5e-6 (logits).
"""

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from logrerank_jax.models.attention.blocked import blocked_local_attention
from logrerank_jax.models.attention.reference import attention_mask_matrix, reference_attention
from logrerank_jax.models.attention.tiled import positions_follow_tokens, tiled_attention
from logrerank_jax.models.encoders import modernbert as mb
from torch_init import randomise_normal as _randomise

logging.getLogger("transformers").setLevel(logging.ERROR)
transformers.logging.set_verbosity_error()

ATOL_F32 = 1e-5
L = 40


def _hf_config(**overrides):
  """Return a tiny transformers ModernBertConfig (small RoPE thetas so a theta mix-up shows)."""
  kwargs = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                num_attention_heads=4, global_attn_every_n_layers=2, local_attention=8,
                global_rope_theta=1000.0, local_rope_theta=50.0, pad_token_id=0, bos_token_id=2,
                eos_token_id=3, cls_token_id=2, sep_token_id=3, attn_implementation="eager")
  kwargs.update(overrides)
  return transformers.ModernBertConfig(**kwargs)




def _torch_params_to_flax(state_dict, prefix=""):
  """Map a torch state dict onto the C1 Flax tree (test-local converter)."""
  params = {}
  for key, value in state_dict.items():
    if not key.startswith(prefix):
      continue
    parts = key[len(prefix):].split(".")
    path, leaf = parts[:-1], parts[-1]
    if path and path[0] == "layers":
      path = [f"layers_{path[1]}"] + path[2:]
    value = value.detach().numpy()
    if path[-1] == "tok_embeddings":
      leaf = "embedding"
    elif path[-1].endswith("norm"):
      leaf = "scale" if leaf == "weight" else "bias"
    elif leaf == "weight":
      leaf, value = "kernel", value.T
    node = params
    for name in path:
      node = node.setdefault(name, {})
    node[leaf] = jnp.asarray(value)
  return params


def _classifier_params(state_dict):
  """Split a ModernBertForSequenceClassification state dict into the C1 classifier tree."""
  return {"model": _torch_params_to_flax(state_dict, "model."),
          "head": _torch_params_to_flax(state_dict, "head."),
          "classifier": {"kernel": jnp.asarray(state_dict["classifier.weight"].numpy().T),
                         "bias": jnp.asarray(state_dict["classifier.bias"].numpy())}}


def _torch_hidden(model, ids, mask):
  """Run torch ModernBertModel; return numpy [B, L, d]."""
  with torch.no_grad():
    out = model(input_ids=torch.as_tensor(ids, dtype=torch.long),
                attention_mask=torch.as_tensor(mask, dtype=torch.long))
  return out.last_hidden_state.numpy()


def _padded_batch(lengths, seed):
  """Return ids, mask int32 [B, L] with right padding (pad id 0) and tokens in [4, 64)."""
  rng = np.random.default_rng(seed)
  ids = np.zeros((len(lengths), L), np.int32)
  mask = np.zeros((len(lengths), L), np.int32)
  for b, n in enumerate(lengths):
    ids[b, :n] = rng.integers(4, 64, n)
    mask[b, :n] = 1
  return ids, mask


def _packed_rows(rows, seed):
  """Pack sequences: rows = [[len, ...], ...]; returns ids, mask, seg, pos [R, L] and the seqs."""
  rng = np.random.default_rng(seed)
  shape = (len(rows), L)
  ids, mask, seg, pos = (np.zeros(shape, np.int32) for _ in range(4))
  seqs = []  # (row, start, length, token ids)
  for r, lengths in enumerate(rows):
    start = 0
    for s, n in enumerate(lengths):
      toks = rng.integers(4, 64, n).astype(np.int32)
      ids[r, start:start + n] = toks
      mask[r, start:start + n] = 1
      seg[r, start:start + n] = s + 1
      pos[r, start:start + n] = np.arange(n)
      seqs.append((r, start, n, toks))
      start += n
  return ids, mask, seg, pos, seqs


ENCODER_CASES = [
    pytest.param(dict(num_hidden_layers=3, global_attn_every_n_layers=2), id="L3-every2-win8-nobias"),
    pytest.param(dict(num_hidden_layers=5, global_attn_every_n_layers=3, attention_bias=True,
                      mlp_bias=True, norm_bias=True), id="L5-every3-win8-allbias"),
    pytest.param(dict(num_hidden_layers=4, global_attn_every_n_layers=3, local_attention=12,
                      norm_bias=True, hidden_activation="gelu_pytorch_tanh"),
                 id="L4-every3-win12-normbias-tanhgelu"),
    pytest.param(dict(num_hidden_layers=3, global_attn_every_n_layers=2, local_attention=8,
                      hidden_activation="silu", mlp_bias=True), id="L3-every2-silu-mlpbias"),
]


@pytest.mark.parametrize("use_jit", [True, False], ids=["jit", "nojit"])
@pytest.mark.parametrize("overrides", ENCODER_CASES)
def test_encoder_matches_torch_on_padded_batch(overrides, use_jit):
  hf_cfg = _hf_config(**overrides)
  torch_model = _randomise(transformers.ModernBertModel(hf_cfg), seed=1)
  cfg = mb.ModernBertConfig.from_hf(hf_cfg.to_dict())
  assert cfg.layer_types == tuple(hf_cfg.layer_types)
  params = _torch_params_to_flax(torch_model.state_dict())
  ids, mask = _padded_batch([L, 27, 9], seed=2)
  enc = mb.ModernBertEncoder(cfg)
  fn = lambda p, i, m: enc.apply({"params": p}, i, m)
  out = (jax.jit(fn) if use_jit else fn)(params, jnp.asarray(ids), jnp.asarray(mask))
  ref = _torch_hidden(torch_model, ids, mask)
  valid = mask.astype(bool)
  err = np.abs(np.asarray(out)[valid] - ref[valid]).max()
  assert out.shape == (3, L, 32) and out.dtype == jnp.float32
  assert err <= ATOL_F32, f"max abs error {err:.2e} > {ATOL_F32}"
  # The local window really is narrower than the sequence, so sliding layers were exercised.
  assert cfg.local_attention // 2 < L // 2 and mb.SLIDING_ATTENTION in cfg.layer_types


@pytest.mark.parametrize("attention_impl", ["xla", "blocked"])
def test_packed_rows_equal_sequences_run_alone(attention_impl):
  hf_cfg = _hf_config(num_hidden_layers=3, global_attn_every_n_layers=2)
  torch_model = _randomise(transformers.ModernBertModel(hf_cfg), seed=3)
  cfg = mb.ModernBertConfig.from_hf(hf_cfg.to_dict(), attention_impl=attention_impl)
  params = _torch_params_to_flax(torch_model.state_dict())
  # Row 0: three sequences + 2 padding tokens; row 1: two sequences; row 2: all padding.
  ids, mask, seg, pos, seqs = _packed_rows([[13, 20, 5], [25, 15], []], seed=4)
  out = jax.jit(mb.ModernBertEncoder(cfg).apply)(
      {"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(seg), jnp.asarray(pos))
  out = np.asarray(out)
  assert np.isfinite(out).all(), "padding rows/tokens must stay finite"
  for r, start, n, toks in seqs:
    ref = _torch_hidden(torch_model, toks[None], np.ones((1, n), np.int32))[0]
    err = np.abs(out[r, start:start + n] - ref).max()
    assert err <= ATOL_F32, f"row {r} segment at {start} (len {n}): max abs error {err:.2e}"


@pytest.mark.parametrize("local_attention", [8, 6, 128], ids=["win8", "win6-ragged-blocks", "win128>L"])
def test_blocked_local_attention_equals_reference(local_attention):
  # The attention kernels alone on random q/k/v (the blocked path end to end is checked against
  # torch in test_packed_rows_equal_sequences_run_alone[blocked]).
  window = local_attention // 2
  _, _, seg, pos, _ = _packed_rows([[13, 20, 5], [L]], seed=5)
  q, k, v = (jax.random.normal(key, (2, L, 4, 8)) for key in jax.random.split(jax.random.PRNGKey(0), 3))
  no_dropout = lambda p: p
  # q, k, v, seg, pos as arguments: closed over, they would be constants XLA folds at compile time.
  jitted = jax.jit(lambda fn, w, *a: fn(*a, w, no_dropout), static_argnums=(0, 1))
  run = lambda fn, w: jitted(fn, w, q, k, v, jnp.asarray(seg), jnp.asarray(pos))  # noqa: E731
  ref = np.asarray(run(reference_attention, window))
  blocked = np.asarray(run(blocked_local_attention, window))
  valid = seg > 0
  err = np.abs(ref[valid] - blocked[valid]).max()
  # Same math, different blocking of the softmax sums (K <= L = 40 keys, |v| ~ N(0, 1) so
  # |out| <~ 3): a few eps x sqrt(K) x 3 ~ 1e-5 is the float32 ATOL_F32 bound; measured 2.4e-7.
  assert err <= ATOL_F32, f"blocked vs reference max abs error {err:.2e}"
  assert np.isfinite(blocked).all()
  # The window must matter here (except when it spans every segment), else the test is vacuous.
  window_effect = np.abs(np.asarray(run(reference_attention, None))[valid] - ref[valid]).max()
  assert (window_effect > 1e-3) == (window < L - 1), window_effect


def test_bf16_compute_close_to_float32_torch():
  hf_cfg = _hf_config(num_hidden_layers=3, global_attn_every_n_layers=2)
  torch_model = _randomise(transformers.ModernBertModel(hf_cfg), seed=6)
  cfg = mb.ModernBertConfig.from_hf(hf_cfg.to_dict(), dtype=jnp.bfloat16)
  params = _torch_params_to_flax(torch_model.state_dict())
  ids, mask = _padded_batch([L, 21], seed=7)
  out = jax.jit(mb.ModernBertEncoder(cfg).apply)({"params": params}, ids, mask)
  assert out.dtype == jnp.bfloat16
  assert all(x.dtype == jnp.float32 for x in jax.tree_util.tree_leaves(params))
  ref = _torch_hidden(torch_model, ids, mask)
  valid = mask.astype(bool)
  diff = np.abs(np.asarray(out, np.float32)[valid] - ref[valid])
  scale = np.abs(ref[valid]).max()
  # Derived like the bf16 bound of tests/test_bert_parity.py: bf16 rounds to unit roundoff
  # u = 2^-9 ~ 1.95e-3 relative; each layer feeds n_r ~ 10 rounded results into the residual
  # stream (attn norm, Wqkv, scores, softmax, PV, Wo, mlp norm, Wi, GLU, Wo), depth 3. Worst
  # case, the errors add: max <= n_r * depth * u * scale; as a random walk the typical (mean
  # abs) error is ~ sqrt(n_r * depth) * u * scale. Measured (scale 4.0, default / AVX2 / SSE4.2
  # kernels): max 3.4e-2 (bound 0.23, 6.8x), mean 5.6e-3 (bound 4.3e-2, 7.6x). (Was
  # max <= 2.5e-2 * scale and mean <= 3e-3 * scale: only 2.9x / 2.1x above one machine's run.)
  n_r, depth, u = 10, 3, 2.0 ** -9
  max_bound, mean_bound = n_r * depth * u * scale, np.sqrt(n_r * depth) * u * scale
  assert diff.max() <= max_bound, f"bf16 max abs error {diff.max():.3e} > {max_bound:.3e}"
  assert diff.mean() <= mean_bound, f"bf16 mean abs error {diff.mean():.3e} > {mean_bound:.3e}"


@pytest.mark.parametrize("pooling,classifier_bias", [("cls", False), ("mean", True)],
                         ids=["cls", "mean-bias"])
def test_sequence_classifier_matches_torch(pooling, classifier_bias):
  hf_cfg = _hf_config(classifier_pooling=pooling, classifier_bias=classifier_bias, num_labels=3,
                      norm_bias=True)
  torch_model = _randomise(transformers.ModernBertForSequenceClassification(hf_cfg), seed=8)
  cfg = mb.ModernBertConfig.from_hf(hf_cfg.to_dict())
  assert cfg.num_labels == 3 and cfg.classifier_pooling == pooling
  params = _classifier_params(torch_model.state_dict())
  # The last row is all padding (a bucket filler): its logits must be finite, not compared.
  ids, mask = _padded_batch([L, 30, 7, 0], seed=9)
  logits = jax.jit(mb.ModernBertSequenceClassifier(cfg).apply)({"params": params}, ids, mask)
  with torch.no_grad():
    ref = torch_model(input_ids=torch.as_tensor(ids[:3], dtype=torch.long),
                      attention_mask=torch.as_tensor(mask[:3], dtype=torch.long)).logits.numpy()
  assert logits.shape == (4, 3) and logits.dtype == jnp.float32
  assert np.isfinite(np.asarray(logits)).all()
  err = np.abs(np.asarray(logits)[:3] - ref).max()
  assert err <= ATOL_F32, f"{pooling}: max abs logit error {err:.2e}"

  # Per-segment pooling of a packed row equals each sequence scored alone.
  ids_p, mask_p, seg_p, pos_p, seqs = _packed_rows([[13, 20, 5]], seed=10)
  seg_logits = jax.jit(mb.ModernBertSequenceClassifier(cfg).apply, static_argnames="num_segments")(
      {"params": params}, ids_p, mask_p, seg_p, pos_p, num_segments=4)
  assert seg_logits.shape == (1, 4, 3)
  for s, (_, _, n, toks) in enumerate(seqs):
    with torch.no_grad():
      alone = torch_model(input_ids=torch.as_tensor(toks[None], dtype=torch.long),
                          attention_mask=torch.ones((1, n), dtype=torch.long)).logits.numpy()[0]
    err = np.abs(np.asarray(seg_logits[0, s]) - alone).max()
    assert err <= ATOL_F32, f"{pooling}: segment {s + 1} max abs logit error {err:.2e}"


def test_dropout_active_only_when_not_deterministic():
  cfg = mb.ModernBertConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                            num_attention_heads=4, local_attention=8, attention_dropout=0.1,
                            embedding_dropout=0.1, mlp_dropout=0.1)
  params = mb.init_params(cfg, jax.random.PRNGKey(0))
  ids, mask = _padded_batch([L, 20], seed=11)
  enc = mb.ModernBertEncoder(cfg)
  apply = jax.jit(enc.apply, static_argnames="deterministic")
  det = apply({"params": params}, ids, mask)
  det_again = apply({"params": params}, ids, mask, deterministic=True)
  k1, k2 = jax.random.PRNGKey(1), jax.random.PRNGKey(2)
  drop1 = apply({"params": params}, ids, mask, deterministic=False, rngs={"dropout": k1})
  drop1b = apply({"params": params}, ids, mask, deterministic=False, rngs={"dropout": k1})
  drop2 = apply({"params": params}, ids, mask, deterministic=False, rngs={"dropout": k2})
  np.testing.assert_array_equal(np.asarray(det), np.asarray(det_again))
  np.testing.assert_array_equal(np.asarray(drop1), np.asarray(drop1b))
  assert np.abs(np.asarray(drop1) - np.asarray(det)).max() > 1e-2
  assert np.abs(np.asarray(drop1) - np.asarray(drop2)).max() > 1e-2


def test_rope_known_answer():
  # Position 1, head_dim 4, theta 100: inv_freq = [1, 100^-0.5] = [1, 0.1]; layout cat(f, f).
  cos, sin = mb.rope_cos_sin(jnp.array([[0, 1]]), 4, 100.0)
  # float32 angle (<= 1, rounded: eps = 1.19e-7 absolute) then float32 cos (half an ulp): error
  # <= ~2 eps relative to cos(1) = 0.54, i.e. < 5e-7; rtol 1e-6 (measured 5e-8 relative).
  np.testing.assert_allclose(np.asarray(cos[0, 1]), np.cos([1.0, 0.1, 1.0, 0.1]), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(sin[0, 0]), np.zeros(4), atol=0)
  x = jnp.array([1.0, 2.0, 3.0, 4.0]).reshape(1, 1, 1, 4)
  rotated = mb.apply_rope(x, jnp.full((1, 1, 4), 0.0), jnp.full((1, 1, 4), 1.0))
  np.testing.assert_array_equal(np.asarray(rotated).ravel(), [-3.0, -4.0, 1.0, 2.0])


def test_window_mask_known_answer():
  seg = jnp.array([[1, 1, 1, 1, 2, 2, 0]])
  pos = jnp.array([[0, 1, 2, 3, 0, 1, 0]])
  mask = np.asarray(attention_mask_matrix(seg, pos, window=1))[0]
  expected = np.array([
      [1, 1, 0, 0, 0, 0, 0],
      [1, 1, 1, 0, 0, 0, 0],
      [0, 1, 1, 1, 0, 0, 0],
      [0, 0, 1, 1, 0, 0, 0],
      [0, 0, 0, 0, 1, 1, 0],
      [0, 0, 0, 0, 1, 1, 0],
      [0, 0, 0, 0, 0, 0, 0]], bool)
  np.testing.assert_array_equal(mask, expected)


def test_official_converter_gives_the_same_outputs():
  # logrerank_jax.convert (another module) on a HF ForSequenceClassification state dict.
  from logrerank_jax.convert import (modernbert_params_from_torch,
                                     sequence_classifier_params_from_torch)
  hf_cfg = _hf_config(classifier_pooling="mean", num_labels=1, norm_bias=True, attention_bias=True)
  torch_model = _randomise(transformers.ModernBertForSequenceClassification(hf_cfg), seed=12)
  cfg = mb.ModernBertConfig.from_hf(hf_cfg.to_dict())
  sd = {k: v.detach().numpy() for k, v in torch_model.state_dict().items()}
  ids, mask = _padded_batch([L, 17], seed=13)
  with torch.no_grad():
    ref_logits = torch_model(input_ids=torch.as_tensor(ids, dtype=torch.long),
                             attention_mask=torch.as_tensor(mask, dtype=torch.long)).logits.numpy()
  ref_hidden = _torch_hidden(torch_model.model, ids, mask)

  enc_params = modernbert_params_from_torch(sd, cfg)  # "model." prefix and head keys handled there
  hidden = jax.jit(mb.ModernBertEncoder(cfg).apply)({"params": enc_params}, ids, mask)
  valid = mask.astype(bool)
  err = np.abs(np.asarray(hidden)[valid] - ref_hidden[valid]).max()
  assert err <= ATOL_F32, f"encoder via converter: max abs error {err:.2e}"

  clf_params = sequence_classifier_params_from_torch(sd, cfg)
  logits = jax.jit(mb.ModernBertSequenceClassifier(cfg).apply)({"params": clf_params}, ids, mask)
  err = np.abs(np.asarray(logits) - ref_logits).max()
  assert logits.shape == (2, 1) and err <= ATOL_F32, f"classifier via converter: {err:.2e}"


def test_layernorm_statistics_stay_float32_under_bf16():
  # Values 1024 + 8k are exact in bf16, but their sum (~4e4) is not: bf16 statistics would put
  # the mean off by up to ~128 and wreck the output; float32 statistics are exact here.
  x = (1024.0 + 8.0 * np.arange(32, dtype=np.float32))[None]  # [1, 32], exact in bf16
  ln = mb.LayerNorm(eps=1e-5, use_bias=False, dtype=jnp.bfloat16)
  params = ln.init(jax.random.PRNGKey(0), jnp.asarray(x, jnp.bfloat16))
  out = np.asarray(ln.apply(params, jnp.asarray(x, jnp.bfloat16)), np.float32)
  ref = (x - x.mean()) / np.sqrt(x.var() + 1e-5)
  # Only the final bf16 rounding of outputs in [-1.7, 1.7] remains: <= 2^-8 * 2 ~ 7.8e-3.
  assert np.abs(out - ref).max() <= 7.8e-3, np.abs(out - ref).max()


# ----------------------------------------------------------------------------- attention_impl="tiled"
# Tolerance of the tiled kernels vs the reference on random N(0, 1) q/k/v: both compute the same
# float32 logits and softmax; the tiled path normalises after the value product instead of
# before and sums in another order, so outputs (convex combinations of values with |v| <= 3.2)
# differ by a few float32 ulps: measured max 4.8e-7 over the cases below (the same with
# XLA_FLAGS=--xla_cpu_max_isa=AVX2).
# 1e-5 (the module's float32 parity bound) leaves a 20x margin.
ATOL_TILED_KERNEL = 1e-5


def _random_qkv(b, seed=0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  return tuple(jax.random.normal(key, (b, L, 4, 8)) for key in keys)


def _tiled_layouts():
  """(name, segment_ids, position_ids, positions_follow_tokens expected) on [*, L] rows."""
  _, _, seg_p, pos_p, _ = _packed_rows([[13, 20, 5], [L], []], seed=14)  # packed + padding row
  _, mask = _padded_batch([L, 27, 9], seed=15)  # a padded batch: segment = mask, arange positions
  pos_pad = np.broadcast_to(np.arange(L, dtype=np.int32), mask.shape).copy()
  # Not packer-like: segment ids decreasing along the row and positions stepping by 2 then 0,
  # so the window-block shortcut would be wrong; the run-time check must fall back.
  seg_w = seg_p[:, ::-1].copy()
  pos_w = (pos_p * 2) % 7
  return [("packed", seg_p, pos_p, True), ("padded", mask, pos_pad, True),
          ("unordered", seg_w, pos_w, False)]


# The segment and position ids go into the jitted functions below as arguments, as the model passes
# them (not as constants XLA could fold): the layout check then runs at run time, as in the model,
# and the three layouts ([3, L] int32 each) share one compiled program per window and heads per
# tile (lru_cache keeps the jitted functions for the file's run).
def _attention(kind, window):
  if kind == "tiled":
    return lambda q, k, v, seg, pos: tiled_attention(q, k, v, seg, pos, window)
  return lambda q, k, v, seg, pos: reference_attention(q, k, v, seg, pos, window, lambda p: p)


@functools.lru_cache(maxsize=None)
def _attention_jit(kind, window):
  return jax.jit(_attention(kind, window))


@functools.lru_cache(maxsize=None)
def _attention_vjp_jit(kind, window, heads_per_tile=None):
  """jit of (output, vjp(dout)) of one attention function; heads_per_tile only keys the cache (the
  tiled kernel reads it, monkeypatched, when this is traced)."""
  f = _attention(kind, window)
  return jax.jit(lambda q, k, v, seg, pos, dout: (lambda out, vjp: (out, vjp(dout)))(
      *jax.vjp(lambda q, k, v: f(q, k, v, seg, pos), q, k, v)))


@pytest.mark.parametrize("local_attention", [None, 8, 6, 128], ids=["global", "win8", "win6-ragged",
                                                                    "win128>L"])
@pytest.mark.parametrize("layout", [0, 1, 2], ids=["packed", "padded", "unordered"])
def test_tiled_attention_equals_reference(layout, local_attention):
  name, seg, pos, follows = _tiled_layouts()[layout]
  window = None if local_attention is None else local_attention // 2
  q, k, v = _random_qkv(seg.shape[0], seed=16)
  seg, pos = jnp.asarray(seg), jnp.asarray(pos)
  assert bool(positions_follow_tokens(seg, pos)) == follows, name
  ref = np.asarray(_attention_jit("reference", window)(q, k, v, seg, pos))
  got = np.asarray(_attention_jit("tiled", window)(q, k, v, seg, pos))
  valid = np.asarray(seg) > 0
  assert np.isfinite(got).all()
  err = np.abs(got[valid] - ref[valid]).max()
  assert err <= ATOL_TILED_KERNEL, f"{name} window={window}: tiled vs reference {err:.2e}"


# The tiled kernel's hand-written backward (models/attention/tiled.py) vs autodiff of the
# reference, per layout, window and heads per map step (1 and 2 split the 4 heads into groups;
# 4 is what these shapes get by default). Cotangents are zero at padding queries, as in the model
# (no real token reads a padding output). Gradients are compared relative to each one's scale
# (at least 1): measured max 9.3e-7 over these cases, the same with XLA_FLAGS=--xla_cpu_max_isa=
# AVX2; bound 1e-5 (10x margin).
ATOL_TILED_GRAD = 1e-5


def _vjp_inputs(layout, local_attention):
  """One gradient case: layout name, (q, k, v, segment ids, position ids, output cotangent, zero
  at padding queries), window, and the real-token mask."""
  name, seg, pos, _ = _tiled_layouts()[layout]
  window = None if local_attention is None else local_attention // 2
  q, k, v = _random_qkv(seg.shape[0], seed=19)
  real = jnp.asarray(seg > 0)
  dout = jax.random.normal(jax.random.PRNGKey(20), q.shape) * real[..., None, None]
  return name, (q, k, v, jnp.asarray(seg), jnp.asarray(pos), dout), window, np.asarray(real)


@functools.lru_cache(maxsize=None)
def _reference_vjp(layout, local_attention):
  """Autodiff of the reference attention for one (layout, window): the same for every heads-per-
  tile case below (the reference has no tiles), so computed once per file run, not three times."""
  _, args, window, _ = _vjp_inputs(layout, local_attention)
  out, grads = _attention_vjp_jit("reference", window)(*args)
  return np.asarray(out), tuple(np.asarray(g) for g in grads)


@pytest.mark.parametrize("heads_per_tile", [1, 2, 4], ids=["1head", "2heads", "4heads"])
@pytest.mark.parametrize("local_attention", [None, 8, 6, 128], ids=["global", "win8", "win6-ragged",
                                                                    "win128>L"])
@pytest.mark.parametrize("layout", [0, 1, 2], ids=["packed", "padded", "unordered"])
def test_tiled_attention_gradients_equal_reference(layout, local_attention, heads_per_tile,
                                                   monkeypatch):
  from logrerank_jax.models.attention import tiled as ta  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(ta, "_heads_per_tile", lambda heads, elems: heads_per_tile)
  name, args, window, valid = _vjp_inputs(layout, local_attention)
  out, grads = _attention_vjp_jit("tiled", window, heads_per_tile)(*args)
  out_ref, grads_ref = _reference_vjp(layout, local_attention)
  err = np.abs(np.asarray(out)[valid] - np.asarray(out_ref)[valid]).max()
  assert err <= ATOL_TILED_KERNEL, f"{name} window={window}: forward {err:.2e}"
  for wrt, g, g_ref in zip("qkv", grads, grads_ref):
    scale = max(float(np.abs(np.asarray(g_ref)).max()), 1.0)
    err = float(np.abs(np.asarray(g) - np.asarray(g_ref)).max())
    assert err <= ATOL_TILED_GRAD * scale, (
        f"{name} window={window} {heads_per_tile} heads/tile: d{wrt} error {err:.2e} at scale "
        f"{scale:.2e}")


def test_tiled_attention_bfloat16_keeps_dtypes_and_tracks_float32():
  # bf16 q/k/v: outputs and gradients stay bf16 and follow the float32 reference run on the same
  # (bf16-rounded) inputs. Bounds: outputs |o| <= max|v| ~ 3.5, rounded once to bf16 (2^-8
  # relative) after weights rounded to bf16 (2^-8 each): <= 2 * 2^-8 * 3.5 ~ 0.03 (measured
  # 6.0e-3); gradients rounded to bf16 from float32 tiles: 2e-2 of their scale (measured 3.8e-3).
  name, seg, pos, _ = _tiled_layouts()[0]
  q, k, v = (x.astype(jnp.bfloat16) for x in _random_qkv(seg.shape[0], seed=21))
  real = jnp.asarray(seg > 0)
  dout = (jax.random.normal(jax.random.PRNGKey(22), q.shape) * real[..., None, None])
  seg, pos = jnp.asarray(seg), jnp.asarray(pos)
  f32 = lambda x: x.astype(jnp.float32)
  for window in (None, 4):
    out, vjp = jax.vjp(lambda q, k, v: tiled_attention(q, k, v, seg, pos, window), q, k, v)
    grads = vjp(dout.astype(jnp.bfloat16))
    out_ref, vjp_ref = jax.vjp(
        lambda q, k, v: reference_attention(q, k, v, seg, pos, window, lambda p: p),
        f32(q), f32(k), f32(v))
    grads_ref = vjp_ref(f32(dout.astype(jnp.bfloat16)))
    assert out.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in grads)
    valid = np.asarray(real)
    err = np.abs(np.asarray(f32(out))[valid] - np.asarray(out_ref)[valid]).max()
    assert err <= 0.03, f"{name} window={window}: bf16 forward {err:.2e}"
    for wrt, g, g_ref in zip("qkv", grads, grads_ref):
      scale = max(float(np.abs(np.asarray(g_ref)).max()), 1.0)
      err = float(np.abs(np.asarray(f32(g)) - np.asarray(g_ref)).max())
      assert err <= 2e-2 * scale, f"window={window}: bf16 d{wrt} {err:.2e} at scale {scale:.2e}"


def test_heads_per_tile_known_answers():
  from logrerank_jax.models.attention import tiled as ta  # pylint: disable=g-import-not-at-top
  budget = ta._TILE_BYTES // 4  # float32 logits that fit one tile
  assert ta._heads_per_tile(4, budget // 4) == 4  # all heads fit
  assert ta._heads_per_tile(12, budget // 6) == 6  # the largest divisor of 12 that fits
  assert ta._heads_per_tile(12, budget // 5) == 4  # 5 would fit but does not divide 12
  assert ta._heads_per_tile(12, budget * 3) == 1  # one head per step even if over budget
  assert ta._heads_per_tile(7, budget // 3) == 1  # a prime head count larger than what fits


def test_positions_follow_tokens_known_answers():
  seg = jnp.array([[1, 1, 1, 2, 2, 0, 0], [1, 1, 0, 1, 0, 0, 0], [2, 2, 1, 1, 0, 0, 0],
                   [1, 1, 2, 2, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0]])
  pos = jnp.array([[0, 1, 2, 0, 1, 0, 0], [0, 1, 2, 3, 0, 0, 0], [0, 1, 0, 1, 0, 0, 0],
                   [0, 1, 0, 1, 2, 0, 0], [0, 2, 1, 0, 0, 0, 0]])
  # rows: packed; a hole inside a segment with arange positions; decreasing segment ids;
  # a segment that resumes after another; positions going back inside a segment.
  for row, expected in enumerate([True, True, False, False, False]):
    got = bool(positions_follow_tokens(seg[row:row + 1], pos[row:row + 1]))
    assert got == expected, (row, got)


@pytest.mark.parametrize("overrides", ENCODER_CASES)
def test_tiled_encoder_matches_torch_on_padded_batch(overrides):
  hf_cfg = _hf_config(**overrides)
  torch_model = _randomise(transformers.ModernBertModel(hf_cfg), seed=1)
  cfg = mb.ModernBertConfig.from_hf(hf_cfg.to_dict(), attention_impl="tiled")
  params = _torch_params_to_flax(torch_model.state_dict())
  ids, mask = _padded_batch([L, 27, 9], seed=2)
  out = jax.jit(mb.ModernBertEncoder(cfg).apply)({"params": params}, ids, mask)
  ref = _torch_hidden(torch_model, ids, mask)
  valid = mask.astype(bool)
  err = np.abs(np.asarray(out)[valid] - ref[valid]).max()
  assert err <= ATOL_F32, f"tiled, padded batch: max abs error {err:.2e} > {ATOL_F32}"


def test_default_attention_on_cpu_is_the_tiled_path():
  # attention_impl="auto" (the default) must be exactly the tiled computation on CPU.
  hf_cfg = _hf_config(num_hidden_layers=3, global_attn_every_n_layers=2)
  params = _torch_params_to_flax(
      _randomise(transformers.ModernBertModel(hf_cfg), seed=23).state_dict())
  ids, mask, seg, pos, _ = _packed_rows([[13, 20, 5], [25, 15]], seed=24)
  outs = {}
  for impl in ("auto", "tiled", "xla"):
    enc = mb.ModernBertEncoder(mb.ModernBertConfig.from_hf(hf_cfg.to_dict(), attention_impl=impl))
    outs[impl] = np.asarray(jax.jit(enc.apply)({"params": params}, ids, mask, seg, pos))
  np.testing.assert_array_equal(outs["auto"], outs["tiled"])
  # ... and not the reference's (else the first check could not tell them apart).
  assert np.abs(outs["auto"] - outs["xla"]).max() > 0


@pytest.mark.parametrize("local_attention", [8, 6, 12], ids=["win8", "win6", "win12"])
def test_tiled_packed_rows_equal_sequences_run_alone(local_attention):
  hf_cfg = _hf_config(num_hidden_layers=3, global_attn_every_n_layers=2,
                      local_attention=local_attention)
  torch_model = _randomise(transformers.ModernBertModel(hf_cfg), seed=3)
  cfg = mb.ModernBertConfig.from_hf(hf_cfg.to_dict(), attention_impl="tiled")
  params = _torch_params_to_flax(torch_model.state_dict())
  ids, mask, seg, pos, seqs = _packed_rows([[13, 20, 5], [25, 15], []], seed=4)
  enc = mb.ModernBertEncoder(cfg)
  out = np.asarray(jax.jit(enc.apply)({"params": params}, ids, mask, seg, pos))
  assert np.isfinite(out).all(), "padding rows/tokens must stay finite"
  xla = mb.ModernBertEncoder(cfg.replace(attention_impl="xla"))
  ref_xla = np.asarray(jax.jit(xla.apply)({"params": params}, ids, mask, seg, pos))
  for r, start, n, toks in seqs:
    ref = _torch_hidden(torch_model, toks[None], np.ones((1, n), np.int32))[0]
    err = np.abs(out[r, start:start + n] - ref).max()
    assert err <= ATOL_F32, f"row {r} segment at {start} (len {n}): max abs error {err:.2e}"
    err = np.abs(out[r, start:start + n] - ref_xla[r, start:start + n]).max()
    assert err <= ATOL_F32, f"tiled vs xla, row {r} segment at {start}: {err:.2e}"


def test_tiled_gradients_equal_reference():
  # Training runs through lax.map / lax.cond: the gradients must be the reference's too.
  hf_cfg = _hf_config(num_hidden_layers=3, global_attn_every_n_layers=2)
  torch_model = _randomise(transformers.ModernBertModel(hf_cfg), seed=17)
  params = _torch_params_to_flax(torch_model.state_dict())
  ids, mask, seg, pos, _ = _packed_rows([[13, 20, 5], [25, 15]], seed=18)
  grads = {}
  for impl in ("xla", "tiled"):
    enc = mb.ModernBertEncoder(mb.ModernBertConfig.from_hf(hf_cfg.to_dict(), attention_impl=impl))
    loss = lambda p, enc=enc: jnp.sum(
        enc.apply({"params": p}, ids, mask, seg, pos) * jnp.asarray(seg > 0)[..., None] ** 2)
    grads[impl] = jax.tree_util.tree_leaves(jax.jit(jax.grad(loss))(params))
  # Gradients are sums over 80 tokens x 32 features of O(1) terms (largest |g| = 75 here), so
  # compare relative to each leaf's scale (at least 1): measured max 6.4e-7 of the scale, with
  # and without --xla_cpu_max_isa=AVX2; bound 1e-5 (15x margin).
  for g_ref, g in zip(grads["xla"], grads["tiled"]):
    scale = max(float(np.abs(np.asarray(g_ref)).max()), 1.0)
    err = float(np.abs(np.asarray(g) - np.asarray(g_ref)).max())
    assert err <= 1e-5 * scale, f"gradient error {err:.2e} at scale {scale:.2e}"
