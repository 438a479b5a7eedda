"""Byte-level BPE tokenizers laid out like ModernBERT's, through the library end to end.

The tokenizer is built here with `tokenizers` (ByteLevel pre-tokenizer and decoder, a small BPE
trained on the real text of tests/data/*.jsonl, [PAD]=0 [UNK] [CLS] [SEP] [MASK] specials, a
TemplateProcessing post-processor, no token types) and saved as a transformers
PreTrainedTokenizerFast folder beside a tiny random ModernBertForSequenceClassification
(safetensors). Byte-level BPE splits non-ASCII characters (alpha, kappa, beta, x, minus, +-, micro)
into several byte tokens, unlike the WordPiece test tokenizers; these tests check that loading,
cross-encoder scoring and LoG reranking are unaffected.
"""

import logging

import jax
import numpy as np
import pytest
import torch
import transformers

from conftest import DATA_DIR, read_jsonl
from test_inference import PACKING, check_output, make_pools
from logrerank_jax import Reranker
from logrerank_jax.baselines import CrossEncoder, passage_string
from logrerank_jax.data.packing import QueryInput, pack_queries
from logrerank_jax.data.fast_tokenizer import FastTokenizer
from logrerank_jax.data.tokenization import load_tokenizer
from logrerank_jax.models import log_reranker as lr
from logrerank_jax.models.model_folder import save_model
from torch_init import randomise_uniform_norms as _randomise

logging.getLogger("transformers").setLevel(logging.ERROR)
transformers.logging.set_verbosity_error()

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # ids 0..4; LoGConfig.tiny needs [PAD]=0
VOCAB_SIZE = 700  # 5 specials + 256 byte symbols + ~440 merges
MAX_LEN = 256  # tokens per (query, passage) pair in the cross-encoder tests

# Cross-encoder logits vs the PyTorch classifier on the same ids, float32 both sides.
# Derivation: the two differ only by summation order. Each float32 dot product of length
# K <= 96 (hidden 32, MLP 2 x 48, attention over <= 256 keys) rounds to ~sqrt(K) * eps relative
# (eps = 2^-23 = 1.19e-7), i.e. ~1e-6 of its O(1) terms; each pre-LayerNorm block adds (does not
# multiply) such an error to the residual stream, so 3 layers + final norm + head give
# ~ (3 layers x ~4 matmuls + 2) x 1e-6 x scale (|hidden| <= ~4, head gain < 1) ~ 5e-5 as a
# pessimistic bound; 1e-5 is the ModernBERT parity bound of tests/test_convert_modernbert.py.
# Measured 3.0e-7 (|logit| <= 0.42) with the default and AVX2 XLA CPU kernels, 1.9e-7 with
# SSE4.2 (>= 33x inside).
LOGIT_ATOL = 1e-5

# Real text with the non-ASCII characters byte-level BPE splits: SciFact (alpha, kappa, beta,
# multiplication sign, minus, en dash) and PubMedQA (+-). Micro appears in neither slice, so one
# short constructed sentence carries both micro signs (U+00B5 and U+03BC).
MICRO = "Cells were exposed to 5 \u00b5M or 10 \u03bcM cisplatin (mean \u00b1 SD) for 24 h."


def _ctx_text(ctx):
  """A gold passage's text: SciFact has a string, PubMedQA a dict of labelled contexts."""
  text = ctx["text"]
  return " ".join(text["contexts"]) if isinstance(text, dict) else text


def _corpus():
  """All real text of the test data slices (queries, titles and passage texts)."""
  texts = []
  for name in ("scifact_slice", "pubmed_slice"):
    for rec in read_jsonl(DATA_DIR / f"{name}.jsonl"):
      texts.append(rec["input"])
      for c in rec["gold_ctx"]:
        texts += [c.get("title") or "", _ctx_text(c)]
  return texts


def build_bpe_tokenizer(texts):
  """A ModernBERT-style byte-level BPE PreTrainedTokenizerFast trained on `texts`."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

  tok = Tokenizer(models.BPE(unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIALS,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                show_progress=False)
  tok.train_from_iterator(texts, trainer)
  cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
  tok.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
      special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
  return transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
      sep_token="[SEP]", mask_token="[MASK]", model_input_names=["input_ids", "attention_mask"])




@pytest.fixture(scope="module")
def bpe_tokenizer():
  return build_bpe_tokenizer(_corpus())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, bpe_tokenizer):
  """A tiny random ModernBertForSequenceClassification + the BPE tokenizer in one folder."""
  ids = {t: bpe_tokenizer.convert_tokens_to_ids(t) for t in SPECIALS}
  hf = transformers.ModernBertConfig(
      vocab_size=len(bpe_tokenizer), hidden_size=32, intermediate_size=48, num_hidden_layers=3,
      num_attention_heads=4, local_attention=8, global_attn_every_n_layers=2,
      max_position_embeddings=MAX_LEN, pad_token_id=ids["[PAD]"], cls_token_id=ids["[CLS]"],
      sep_token_id=ids["[SEP]"], bos_token_id=ids["[CLS]"], eos_token_id=ids["[SEP]"],
      num_labels=1, classifier_pooling="mean", attn_implementation="eager")
  torch.manual_seed(0)
  model = _randomise(transformers.ModernBertForSequenceClassification(hf), seed=3)
  folder = tmp_path_factory.mktemp("bpe") / "ckpt"
  model.save_pretrained(str(folder))
  bpe_tokenizer.save_pretrained(str(folder))
  return model, str(folder)


def _pairs():
  """Real (query, "title text") pairs: every SciFact query with its own and a foreign abstract."""
  pools = make_pools(pool_size=2, limit=12)[0]
  pairs = [(p["input"], passage_string(c)) for p in pools for c in p["ctxs"]]
  return pairs + [(pools[0]["input"], MICRO)]


def test_load_tokenizer_reads_the_bpe_folder(checkpoint, bpe_tokenizer):
  _, folder = checkpoint
  tok = load_tokenizer(folder)
  assert isinstance(tok, FastTokenizer)  # loaded without transformers
  assert [tok.convert_tokens_to_ids(t) for t in SPECIALS] == [0, 1, 2, 3, 4]
  assert (tok.pad_token_id, tok.cls_token_id, tok.sep_token_id, tok.unk_token_id) == (0, 2, 3, 1)
  text = "IL-6 and TNF-\u03b1 rose 2.5\u00d7 (\u00b112%) at 5 \u00b5M."
  enc = tok("Does \u03ba bind?", text)
  assert "token_type_ids" not in enc  # ModernBERT has no token types
  assert enc["input_ids"] == bpe_tokenizer("Does \u03ba bind?", text)["input_ids"]
  ids = enc["input_ids"]
  assert ids[0] == 2 and ids.count(3) == 2 and ids[-1] == 3  # [CLS] A [SEP] B [SEP]
  assert 1 not in ids  # byte-level: nothing is unknown
  # Non-ASCII characters are several byte tokens that decode back to the exact text.
  assert len(tok.tokenize("\u03b1")) == 2 and len(tok.tokenize("\u00b1")) >= 1
  assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
  for s in (MICRO, "\u03b2-catenin \u2212 Wnt \u2013 \u03ba"):
    assert tok.decode(tok(s, add_special_tokens=False)["input_ids"]) == s


def test_cross_encoder_matches_torch_on_real_pairs(checkpoint):
  model, folder = checkpoint
  ce = CrossEncoder.from_pretrained(folder, max_len=MAX_LEN, batch_size=4,
                                    length_buckets=(64, 128))
  pairs = _pairs()
  got = ce.score_pairs(pairs)
  tok = load_tokenizer(folder)
  enc = tok([q for q, _ in pairs], [p for _, p in pairs], truncation="longest_first",
            max_length=MAX_LEN)["input_ids"]
  assert max(len(e) for e in enc) == MAX_LEN and min(len(e) for e in enc) <= 128  # 2 buckets
  assert any(len(tok.tokenize(c)) > 1 for q, p in pairs for c in q + p if ord(c) > 127)
  want = []
  with torch.no_grad():  # one unpadded pair at a time: no padding in the reference at all
    for ids in enc:
      want.append(model(input_ids=torch.tensor([ids])).logits[0, 0].item())
  want = np.asarray(want)
  err = np.abs(got - want).max()
  print(f"BPE cross-encoder max abs logit error {err:.3e}, |logit| max {np.abs(want).max():.2f}")
  assert err <= LOGIT_ATOL, f"max abs logit error {err:.2e}"
  assert np.std(want) > 1e-2 and np.abs(want).max() > 0.1  # the logits are not trivially equal


@pytest.fixture(scope="module")
def bpe_pools():
  """Real SciFact pools (every record: alpha, kappa, beta, x, minus, en dash occur), one PubMedQA
  passage with +-, and the constructed micro sentence."""
  pools = make_pools(pool_size=3, limit=12)[0]
  pub = read_jsonl(DATA_DIR / "pubmed_slice.jsonl")
  pm = next(r for r in pub if "\u00b1" in _ctx_text(r["gold_ctx"][0]))
  text = _ctx_text(pm["gold_ctx"][0])
  extra = {"input": pm["input"], "id": "pubmed-pm",
           "ctxs": [{"id": "pm0", "title": "", "text": text},
                    {"id": "micro", "title": "", "text": MICRO + " " + pools[1]["ctxs"][0]["text"]}]}
  return pools + [extra]


@pytest.fixture(scope="module")
def log_model_dir(tmp_path_factory, bpe_tokenizer):
  cfg = lr.LoGConfig.tiny(vocab_size=len(bpe_tokenizer))
  assert bpe_tokenizer.pad_token_id == cfg.local.encoder.pad_token_id == 0
  example, _ = pack_queries([QueryInput("q", [["a b", "c"]])], bpe_tokenizer, PACKING)
  # The example an argument, not a closed-over constant (XLA would spend the compile folding it).
  params = jax.jit(lambda key, ex: lr.init_params(cfg, ex, key))(jax.random.PRNGKey(0),
                                                                  lr.device_batch(example))
  folder = tmp_path_factory.mktemp("bpe_log") / "model"
  save_model(str(folder), params, cfg, bpe_tokenizer)
  return str(folder)


def test_log_rerank_records_with_bpe_tokenizer(log_model_dir, bpe_pools):
  reranker = Reranker.from_pretrained(log_model_dir, packing=PACKING, queries_per_batch=2)
  outs = reranker.rerank_records(bpe_pools)
  assert len(outs) == len(bpe_pools)
  for out, rec in zip(outs, bpe_pools):
    check_output(out, rec)  # every sentence exactly once, offsets slice back, scores sorted
  # Every non-ASCII character of the passages comes back inside its (exactly sliced) sentence.
  chars = {c for rec in bpe_pools for ctx in rec["ctxs"] for c in ctx["text"] if ord(c) > 127}
  assert {"\u00b1", "\u00b5", "\u03bc", "\u03b2", "\u00d7", "\u2212"} <= chars, chars
  texts = [r["text"] for o in outs for r in o["ranked_sentences"]]
  for ch in chars:
    assert any(ch in t for t in texts), ch
  assert all(np.isfinite(r["score"]) for o in outs for r in o["ranked_sentences"])
