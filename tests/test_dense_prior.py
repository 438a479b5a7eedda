"""The dense prior of the local logit (`LocalScorerConfig.dense_prior`, NOT in the paper): off by
default; when on, exactly MLP + w * cos(q, s), with q and s the joint sequence's pooled states
("joint") or those of the query and the passage each encoded alone ("split", checked against
the encoder run on them as separate sequences, for both encoder families); finite gradients at
padding spans; saved and loaded with the model config (old configs without the fields load as
they were trained)."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from logrerank_jax.data.packing import PackingConfig, QueryInput, pack_queries
from logrerank_jax.datasets.wordpiece import train_wordpiece_tokenizer
from logrerank_jax.errors import ConfigError
from logrerank_jax.models import config_io
from logrerank_jax.models.encoders import bert as mbert
from logrerank_jax.models.encoders.bert import BertEncoder
from logrerank_jax.models.local_scorer import LocalScorer, LocalScorerConfig
from logrerank_jax.models.encoders.modernbert import ModernBertEncoder
from logrerank_jax.models.log_reranker import LoGConfig

PACK = PackingConfig(row_len=96, row_buckets=(4,), span_buckets=(32,), node_buckets=(16,),
                     query_buckets=(2,), max_query_tokens=24)
ARGS = ("input_ids", "attention_mask", "segment_ids", "position_ids", "span_ids", "span_kind",
        "span_query")


@pytest.fixture(scope="module")
def setup(scifact_records):
  texts = [r["input"] for r in scifact_records] + [c["text"] for r in scifact_records
                                                   for c in r["gold_ctx"]]
  tok = train_wordpiece_tokenizer(texts, vocab_size=800)
  base = LoGConfig.tiny(vocab_size=len(tok)).local_scorer_config
  q = QueryInput(scifact_records[0]["input"],
                 [[scifact_records[1]["input"], scifact_records[2]["input"]],
                  [scifact_records[0]["input"]]])
  batch, _ = pack_queries([q], tok, PACK)
  args = [jnp.asarray(getattr(batch, k)) for k in ARGS]
  return base, args


@pytest.fixture(scope="module")
def short_setup(setup, scifact_records):
  """`setup`'s model config, packed from shorter sentences: a passage of two sentences fits one
  window (in `setup` each long claim gets a window of its own)."""
  tok = train_wordpiece_tokenizer([r["input"] for r in scifact_records], vocab_size=800)
  short = lambda i: " ".join(scifact_records[i]["input"].split()[:8])  # noqa: E731
  q = QueryInput(short(0), [[short(1), short(2), short(3)], [short(4)], [short(5), short(0)]])
  batch, _ = pack_queries([q], tok, PACK)
  return dataclasses.replace(setup[0], encoder=dataclasses.replace(
      setup[0].encoder, vocab_size=len(tok))), [jnp.asarray(getattr(batch, k)) for k in ARGS]


def test_off_by_default_and_exactly_added_when_on(setup):
  base, args = setup
  assert base.dense_prior == 0.0 and not base.use_dense_prior
  on = dataclasses.replace(base, dense_prior=7.5, dense_prior_encoding="joint")
  # Jitted: one XLA program per call instead of one per eager op (compile time is this file's cost).
  p_off = jax.jit(LocalScorer(base).init)(jax.random.PRNGKey(0), *args)["params"]
  p_on = jax.jit(LocalScorer(on).init)(jax.random.PRNGKey(0), *args)["params"]
  assert "dense_prior_scale" not in p_off and float(p_on["dense_prior_scale"][0]) == 7.5
  shared = {k: v for k, v in p_on.items() if k != "dense_prior_scale"}
  out_off = jax.jit(LocalScorer(base).apply)({"params": shared}, *args)
  out_on = jax.jit(LocalScorer(on).apply)({"params": p_on}, *args)
  h, hq, m = (np.asarray(out_on[k], np.float64) for k in ("h", "h_query", "span_mask"))
  cos = np.sum(h * hq, -1) / np.maximum(np.linalg.norm(h, axis=-1) * np.linalg.norm(hq, axis=-1),
                                        1e-6)
  want = np.asarray(out_off["local_logit"], np.float64) + 7.5 * cos * m
  # float32 head and cosine vs float64 NumPy on O(10) logits: ~1e-6 relative (a few eps of
  # 1.19e-7 per op); 1e-5 absolute bounds it.
  np.testing.assert_allclose(np.asarray(out_on["local_logit"]), want, atol=1e-5)
  assert np.any(m > 0) and np.any(m == 0)  # sentence spans and padding/query spans both present


def test_zero_initialised_head_starts_at_the_prior_and_learns(setup):
  """`local_head_zero_init`: MLP_local's output layer starts at zero and every other param is
  drawn as without it, so the initial local logit is w * cos alone; the output layer still gets
  a gradient, so the head can learn its correction."""
  base, args = setup
  on = dataclasses.replace(base, dense_prior=7.5, dense_prior_encoding="joint")
  zero = dataclasses.replace(on, local_head_zero_init=True)
  p_on = jax.jit(LocalScorer(on).init)(jax.random.PRNGKey(0), *args)["params"]
  p_zero = jax.jit(LocalScorer(zero).init)(jax.random.PRNGKey(0), *args)["params"]
  out_layer = p_zero["local_mlp"]["out"]
  assert not np.any(out_layer["kernel"]) and not np.any(out_layer["bias"])
  assert np.any(p_on["local_mlp"]["out"]["kernel"])
  flat_on = dict(jax.tree_util.tree_leaves_with_path(p_on))
  for path, leaf in jax.tree_util.tree_leaves_with_path(p_zero):
    if "out" not in jax.tree_util.keystr(path) or "local_mlp" not in jax.tree_util.keystr(path):
      np.testing.assert_array_equal(leaf, flat_on[path], err_msg=jax.tree_util.keystr(path))
  out = jax.jit(LocalScorer(zero).apply)({"params": p_zero}, *args)
  h, hq, m = (np.asarray(out[k], np.float64) for k in ("h", "h_query", "span_mask"))
  cos = np.sum(h * hq, -1) / np.maximum(np.linalg.norm(h, axis=-1) * np.linalg.norm(hq, axis=-1),
                                        1e-6)
  # The head adds exactly 0; what remains is float32 cosine vs float64 (bound as above).
  np.testing.assert_allclose(np.asarray(out["local_logit"]), 7.5 * cos * m, atol=1e-5)
  mask = jnp.asarray(out["span_mask"], jnp.float32)

  def loss(out_layer):  # a loss that orders the sentence spans, as a function of the out layer
    params = {**p_zero, "local_mlp": {**p_zero["local_mlp"], "out": out_layer}}
    logit = LocalScorer(zero).apply({"params": params}, *args)["local_logit"]
    return jnp.sum(logit * mask * jnp.arange(mask.shape[0]))
  grad = jax.jit(jax.grad(loss))(out_layer)["kernel"]
  assert np.abs(np.asarray(grad)).max() > 1e-6


def _standalone_cos(encoder, enc_params, args, bert: bool, passage: bool = False,
                    passage_cls: bool = True):
  """Reference for the split prior: cut every packed sequence into its query side ([CLS] q
  [SEP], the tokens before its first sentence token) and its passage side (the rest), run the
  encoder on each as a sequence of its own (positions 0... and 1...; token type 0), mean-pool
  each span's tokens there (`passage`: every token of the span's piece, as a bi-encoder pools),
  and return {sentence span: cos(its query span, it)}. `passage_cls`: the query side's last
  token ([SEP]) leaves it and opens the passage side as a [CLS] (the sequence's first id) at
  position 0, so the pieces are [CLS] q and [CLS] s_1 ... s_m [SEP]."""
  ids, _, seg, _, span_ids, span_kind, span_query = (np.asarray(a) for a in args)
  pieces = []  # (token ids, span ids, first position)
  for r in range(ids.shape[0]):
    for k in sorted(set(seg[r][seg[r] > 0].tolist())):
      cols = np.nonzero(seg[r] == k)[0]
      is_sent = span_kind[span_ids[r, cols]] == 2
      cut = int(np.argmax(is_sent)) if is_sent.any() else len(cols)
      if passage_cls and cut < len(cols):
        pieces.append((ids[r, cols[:cut - 1]], span_ids[r, cols[:cut - 1]], 0))
        opened = np.concatenate([ids[r, cols[:1]], ids[r, cols[cut:]]])
        pieces.append((opened, np.concatenate([[0], span_ids[r, cols[cut:]]]), 0))
        continue
      pieces.append((ids[r, cols[:cut]], span_ids[r, cols[:cut]], 0))
      if cut < len(cols):
        pieces.append((ids[r, cols[cut:]], span_ids[r, cols[cut:]], 1))
  length = max(len(t) for t, _, _ in pieces)
  rows = np.zeros((len(pieces), length), np.int32)
  mask, pos, spans = np.zeros_like(rows), np.zeros_like(rows), np.zeros_like(rows)
  for i, (t, sp, first) in enumerate(pieces):
    rows[i, :len(t)], mask[i, :len(t)], spans[i, :len(t)] = t, 1, sp
    pos[i, :len(t)] = np.arange(len(t)) + first
  kwargs = dict(token_type_ids=np.zeros_like(rows)) if bert else {}
  h = np.asarray(jax.jit(encoder.apply)({"params": enc_params}, rows, mask, segment_ids=mask,
                                        position_ids=pos, **kwargs), np.float64)
  if passage:
    pooled = {s: h[i, mask[i] > 0].mean(0) for i in range(len(pieces))
              for s in np.unique(spans[i][spans[i] > 0])}
  else:
    pooled = {s: h[spans == s].mean(0) for s in np.unique(spans[spans > 0])}
  cos = lambda a, b: float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))  # noqa: E731
  return {s: cos(pooled[span_query[s]], pooled[s]) for s in pooled if span_kind[s] == 2}


@pytest.mark.parametrize("family,pooling,passage_cls", [
    ("modernbert", "sentence", True), ("bert", "sentence", True), ("bert", "passage", True),
    ("bert", "passage", False), ("modernbert", "sentence", False)])
def test_split_prior_is_the_bi_encoder_cosine(setup, short_setup, family, pooling, passage_cls):
  base, args = short_setup if pooling == "passage" else setup
  if family == "bert":  # a tiny BERT with type embeddings: the split pass must use type 0
    enc = mbert.BertConfig(vocab_size=base.encoder.vocab_size, hidden_size=32,
                           intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                           max_position_embeddings=128, type_vocab_size=2)
    base = dataclasses.replace(base, encoder=enc)
  on = dataclasses.replace(base, dense_prior=3.0, dense_prior_pooling=pooling,
                           dense_prior_passage_cls=passage_cls)
  assert on.dense_prior_encoding == "split"
  params = jax.jit(LocalScorer(on).init)(jax.random.PRNGKey(2), *args)["params"]
  shared = {k: v for k, v in params.items() if k != "dense_prior_scale"}
  out_on = jax.jit(LocalScorer(on).apply)({"params": params}, *args)
  out_off = jax.jit(LocalScorer(base).apply)({"params": shared}, *args)
  added = (np.asarray(out_on["local_logit"], np.float64)
           - np.asarray(out_off["local_logit"], np.float64)) / 3.0
  encoder = (BertEncoder if family == "bert" else ModernBertEncoder)(on.encoder)
  want = _standalone_cos(encoder, params["encoder"], args, family == "bert", pooling == "passage",
                         passage_cls)
  assert len(want) >= 3
  got = np.array([added[s] for s in sorted(want)])
  ref = np.array([want[s] for s in sorted(want)])
  # Packed vs standalone float32 encoders on O(1) states: a few 1e-7 relative (measured
  # ~1e-7 on the cosine); the logit difference divides by w = 3 after a float32 subtraction of
  # O(1) logits, so 1e-5 bounds it with margin. Sentences differ, so the check can fail.
  np.testing.assert_allclose(got, ref, atol=1e-5)
  assert np.ptp(ref) > 1e-3
  # The joint cosine is something else: the split pass must not be a no-op.
  h, hq = (np.asarray(out_on[k], np.float64) for k in ("h", "h_query"))
  joint = np.array([h[s] @ hq[s] / (np.linalg.norm(h[s]) * np.linalg.norm(hq[s])) for s in sorted(want)])
  assert np.abs(joint - ref).max() > 1e-3
  if pooling == "passage":  # and not the sentence pooling either: one cosine per passage
    other = _standalone_cos(encoder, params["encoder"], args, True, False, passage_cls)
    assert np.abs(np.array([other[s] for s in sorted(want)]) - ref).max() > 1e-3
    assert len(set(np.round(ref, 6))) < len(ref)  # sentences of one passage share it
  # The two passage layouts encode different things: the option is not a no-op either way.
  flipped = _standalone_cos(encoder, params["encoder"], args, family == "bert",
                            pooling == "passage", not passage_cls)
  assert np.abs(np.array([flipped[s] for s in sorted(want)]) - ref).max() > 1e-3


def test_score_temperature_rescales_only_the_local_score(setup):
  """z_local = sigmoid(l / T): the logit (losses, local ranking) is untouched; T = 1 (the
  paper) is the default."""
  base, args = setup
  assert base.score_temperature == 1.0
  hot = dataclasses.replace(base, dense_prior=20.0, score_temperature=4.0)
  params = jax.jit(LocalScorer(hot).init)(jax.random.PRNGKey(3), *args)["params"]
  out_hot = jax.jit(LocalScorer(hot).apply)({"params": params}, *args)
  out_one = jax.jit(LocalScorer(dataclasses.replace(hot, score_temperature=1.0)).apply)(
      {"params": params}, *args)
  np.testing.assert_array_equal(np.asarray(out_hot["local_logit"]), np.asarray(out_one["local_logit"]))
  m = np.asarray(out_hot["span_mask"])
  logit = np.asarray(out_hot["local_logit"], np.float64)
  # float32 sigmoid vs float64 on O(1) arguments: a few eps (1.2e-7); 1e-6 bounds it.
  np.testing.assert_allclose(np.asarray(out_hot["local_score"]), m / (1 + np.exp(-logit / 4.0)),
                             atol=1e-6)
  np.testing.assert_allclose(np.asarray(out_one["local_score"]), m / (1 + np.exp(-logit)),
                             atol=1e-6)
  with pytest.raises(ConfigError, match="score_temperature"):
    dataclasses.replace(base, score_temperature=0.0)


def test_gradients_are_finite_with_zero_padding_spans(setup):
  base, args = setup
  cfg = dataclasses.replace(base, dense_prior=5.0)
  params = jax.jit(LocalScorer(cfg).init)(jax.random.PRNGKey(1), *args)["params"]
  grads = jax.jit(jax.grad(lambda p: jnp.sum(LocalScorer(cfg).apply({"params": p}, *args)["local_logit"])))(
      params)
  leaves = jax.tree_util.tree_leaves(grads)
  assert all(np.all(np.isfinite(np.asarray(g))) for g in leaves)
  assert float(jnp.abs(grads["dense_prior_scale"][0])) > 0


def test_prior_without_gradient_trains_the_encoder_only_through_the_joint_pass(setup):
  """dense_prior_gradient=False: the encoder's gradient is the prior-free model's (the prior's
  pass is a stop-gradient), while w still learns; True (the default) differs."""
  base, args = setup
  on = dataclasses.replace(base, dense_prior=5.0, dense_prior_pooling="passage")
  assert on.dense_prior_gradient
  params = jax.jit(LocalScorer(on).init)(jax.random.PRNGKey(4), *args)["params"]
  shared = {k: v for k, v in params.items() if k != "dense_prior_scale"}

  def enc_grad(cfg, p):
    g = jax.jit(jax.grad(lambda p: jnp.sum(LocalScorer(cfg).apply({"params": p}, *args)
                                           ["local_logit"])))(p)
    return g, np.concatenate([np.ravel(x) for x in jax.tree_util.tree_leaves(g["encoder"])])

  _, g_off = enc_grad(base, shared)
  g_stop_tree, g_stop = enc_grad(dataclasses.replace(on, dense_prior_gradient=False), params)
  _, g_on = enc_grad(on, params)
  # Same program minus a zero-gradient term: float32 rounding of the same sums (~1e-7 of the
  # largest entry); 1e-6 * max bounds it. The prior's own gradient is O(w) = 5 on some entries.
  scale = np.abs(g_off).max()
  np.testing.assert_allclose(g_stop, g_off, atol=1e-6 * scale)
  assert np.abs(g_on - g_off).max() > 1e-3 * scale
  assert float(jnp.abs(g_stop_tree["dense_prior_scale"][0])) > 0


def test_config_round_trip_and_old_configs(setup):
  base, _ = setup
  cfg = dataclasses.replace(LoGConfig.tiny(vocab_size=800),
                            local=dataclasses.replace(base, dense_prior=20.0))
  d = config_io.log_config_to_dict(cfg)
  assert config_io.log_config_from_dict(json.loads(json.dumps(d))).local.dense_prior == 20.0
  assert config_io.log_config_from_dict(d).local.dense_prior_encoding == "split"
  # A model saved before dense_prior_encoding existed used the joint states: it loads so.
  del d["log_config"]["local"]["dense_prior_encoding"]
  del d["log_config"]["local"]["score_temperature"]
  del d["log_config"]["local"]["dense_prior_pooling"]
  del d["log_config"]["local"]["dense_prior_gradient"]
  del d["log_config"]["local"]["local_head_zero_init"]
  assert config_io.log_config_from_dict(d).local.dense_prior_passage_cls  # saved: True, the default
  del d["log_config"]["local"]["dense_prior_passage_cls"]
  old = config_io.log_config_from_dict(d).local
  assert old.dense_prior_gradient and not old.local_head_zero_init
  assert not old.dense_prior_passage_cls  # trained without the passage's [CLS]: loads so
  assert (old.dense_prior, old.dense_prior_encoding, old.dense_prior_pooling,
          old.score_temperature) == (20.0, "joint", "sentence", 1.0)
  del d["log_config"]["local"]["dense_prior"]  # a model saved before the field existed
  assert config_io.log_config_from_dict(d).local.dense_prior == 0.0
  with pytest.raises(ConfigError, match="dense_prior"):
    LocalScorerConfig(encoder=base.encoder, dense_prior=-1.0)
  with pytest.raises(ConfigError, match="dense_prior_encoding"):
    LocalScorerConfig(encoder=base.encoder, dense_prior=1.0, dense_prior_encoding="late")
  with pytest.raises(ConfigError, match="dense_prior_pooling"):
    LocalScorerConfig(encoder=base.encoder, dense_prior=1.0, dense_prior_pooling="token")
  with pytest.raises(ConfigError, match="needs dense_prior_encoding='split'"):
    LocalScorerConfig(encoder=base.encoder, dense_prior=1.0, dense_prior_encoding="joint",
                      dense_prior_pooling="passage")


def test_training_config_keys_reach_the_local_config():
  """The local stage's config keys of this module's options become the model's LocalScorerConfig
  (configs/local_stage.py -> training/stages/model_config.build_model_config); their defaults are the paper's."""
  import pathlib  # pylint: disable=g-import-not-at-top
  from logrerank_jax.training import stages  # pylint: disable=g-import-not-at-top
  from logrerank_jax.training.config_files import load_config_module  # pylint: disable=g-import-not-at-top
  path = pathlib.Path(__file__).resolve().parents[1] / "configs" / "local_stage.py"
  config = load_config_module(str(path)).get_config("tiny")
  paper = stages.build_model_config(config, 800).local
  assert (paper.dense_prior, paper.local_head_zero_init, paper.score_temperature) == (0.0, False,
                                                                                      1.0)
  assert paper.dense_prior_passage_cls  # the bi-encoder's layout, once a split prior is on
  config.update(dict(dense_prior=20.0, dense_prior_pooling="passage", dense_prior_gradient=False,
                     local_head_zero_init=True, score_temperature=4.0,
                     dense_prior_passage_cls=False))
  local = stages.build_model_config(config, 800).local
  assert (local.dense_prior, local.dense_prior_encoding, local.dense_prior_pooling,
          local.dense_prior_gradient, local.local_head_zero_init, local.score_temperature,
          local.dense_prior_passage_cls) == (20.0, "split", "passage", False, True, 4.0, False)
