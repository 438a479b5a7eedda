"""Passage-level baselines for `tools/evaluate.py`: BM25, a bi-encoder and a passage cross-encoder.

BM25: a pool's own `bm25` scores when every candidate carries one (as `tools/prepare_data.py`
writes them), else `logrerank_jax.datasets.bm25.BM25Index` over the pool's "title text" strings.

Cross-encoder: an HF sequence-classification folder (`config.json`, weights, tokenizer) of
either encoder family, told apart by config.json's `model_type`:
`ModernBertForSequenceClassification` (e.g. gte-reranker-modernbert-base; converted with
`sequence_classifier_params_from_torch`) or `BertForSequenceClassification` (e.g. an
ms-marco-MiniLM cross-encoder; `bert_sequence_classifier_params_from_torch`, token types 0/1 from
the tokenizer's pair encoding).  Each candidate is scored as the pair
`tokenizer(query, "title text")` (`[CLS] q [SEP] p [SEP]`, longest-first truncation to
`max_len`), the relevance score is the logit of label 0 for a one-label head (label 1 for a
two-label head).  Pairs are padded to the smallest length bucket that holds them and scored
`batch_size` at a time by one jitted function per length bucket.

Bi-encoder: a sentence-transformers BERT-family folder (e.g. all-MiniLM-L6-v2) used as its
model card says: `BertEncoder` (weights via `bert_params_from_torch`), mean pooling of the last
hidden state over the attention mask, L2 normalisation, cosine similarity of query and
"title text" embeddings; texts truncated to the folder's `sentence_bert_config.json`
`max_seq_length` (256 for all-MiniLM-L6-v2). Embeddings are cached by text, so a passage shared
by several pools is embedded once.
"""

import functools
import math
from typing import Dict, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from logrerank_jax.datasets.bm25 import BM25Index
from logrerank_jax.errors import ConfigError, DataError


def passage_string(ctx: dict) -> str:
  """Return the "title text" string of a candidate passage (what BM25 and the cross-encoder read)."""
  title = ctx.get("title") or ""
  text = ctx.get("text")
  if not isinstance(text, str) or not isinstance(title, str):
    raise DataError(f"passage {ctx.get('id')!r}: title/text must be strings")
  return f"{title} {text}".strip()


def bm25_scores(query: str, ctxs: Sequence[dict]) -> list:
  """BM25 score of every candidate: the pool's own `bm25` field, else computed over the pool.

  Args:
    query: the query text.
    ctxs: the candidates.

  Returns:
    One float per candidate.
  """
  if ctxs and all(isinstance(c.get("bm25"), (int, float)) and not isinstance(c.get("bm25"), bool)
                  and math.isfinite(c["bm25"]) for c in ctxs):
    return [float(c["bm25"]) for c in ctxs]
  return [float(s) for s in BM25Index([passage_string(c) for c in ctxs]).scores(query)]


def _classifier(cfg):
  """The sequence-classifier module of an encoder config's family."""
  from logrerank_jax.models.encoders.bert import BertConfig, BertSequenceClassifier
  from logrerank_jax.models.encoders.modernbert import ModernBertSequenceClassifier
  return (BertSequenceClassifier if isinstance(cfg, BertConfig)
          else ModernBertSequenceClassifier)(cfg)


def _score_pairs(params, input_ids, attention_mask, token_type_ids, cfg, label):
  """Jitted body: relevance logit of each padded pair ([B, L] -> [B]).

  `token_type_ids` is None for ModernBERT (it has none).
  """
  extra = () if token_type_ids is None else (token_type_ids,)
  logits = _classifier(cfg).apply({"params": params}, input_ids, attention_mask, *extra)
  return logits[:, label]  # [B] float32


class CrossEncoder:
  """A ModernBERT or BERT sequence-classification passage reranker (jitted, bucketed forward)."""

  def __init__(self, params, cfg, tokenizer, max_len: int = 512, batch_size: int = 16,
               length_buckets: Sequence[int] = (64, 128, 256, 512)):
    """Wrap converted params.

    Args:
      params: `ModernBertSequenceClassifier` or `BertSequenceClassifier` params.
      cfg: its `ModernBertConfig` or `BertConfig` (the type picks the model).
      tokenizer: the fast tokenizer of the checkpoint.
      max_len: longest pair in tokens (longer pairs are truncated, longest first).
      batch_size: pairs per jitted call.
      length_buckets: padded lengths; `max_len` is added as the last bucket.
    """
    from logrerank_jax.models.encoders.bert import BertConfig
    if cfg.num_labels not in (1, 2):
      raise ConfigError(f"cross-encoder must have 1 or 2 labels, got num_labels={cfg.num_labels}")
    if max_len < 8 or batch_size < 1:
      raise ConfigError(f"max_len must be >= 8 and batch_size >= 1, got {max_len}, {batch_size}")
    self.cfg, self.tokenizer = cfg, tokenizer
    # BERT reads token types (0 query, 1 passage) unless its family has one type (RoBERTa).
    self.uses_token_types = isinstance(cfg, BertConfig) and cfg.type_vocab_size > 1
    positions = cfg.max_positions
    self.max_len = min(int(max_len), positions)
    self.batch_size = int(batch_size)
    self.buckets = tuple(sorted({b for b in length_buckets if b < self.max_len} | {self.max_len}))
    self.params = jax.device_put(params)
    self._jit = jax.jit(functools.partial(_score_pairs, cfg=cfg, label=cfg.num_labels - 1))

  @classmethod
  def from_pretrained(cls, path: str, **kwargs) -> "CrossEncoder":
    """Load an HF ModernBertForSequenceClassification or BertForSequenceClassification folder
    (config, weights, tokenizer); config.json's `model_type` picks the family."""
    from logrerank_jax.convert import (bert_sequence_classifier_params_from_torch,
                                       load_torch_state_dict, sequence_classifier_params_from_torch)
    from logrerank_jax.data.tokenization import load_tokenizer
    from logrerank_jax.models.local_scorer import encoder_config_from_hf, encoder_family

    cfg = encoder_config_from_hf(path)
    convert = {"modernbert": sequence_classifier_params_from_torch,
               "bert": bert_sequence_classifier_params_from_torch}[encoder_family(cfg)]
    params = convert(load_torch_state_dict(path), cfg)
    return cls(params, cfg, load_tokenizer(path), **kwargs)

  def score(self, query: str, passages: Sequence[str]) -> np.ndarray:
    """Relevance logits of (query, passage) pairs.

    Args:
      query: the query.
      passages: passage strings.

    Returns:
      float32 [P].
    """
    return self.score_pairs([(query, p) for p in passages])

  def score_pairs(self, pairs: Sequence[tuple]) -> np.ndarray:
    """Relevance logits of many (query, passage) pairs, batched by length bucket.

    Args:
      pairs: (query, passage) strings.

    Returns:
      float32 [len(pairs)], in input order.
    """
    if not pairs:
      return np.zeros((0,), np.float32)
    encoded = self.tokenizer([q for q, _ in pairs], [p for _, p in pairs],
                             truncation="longest_first", max_length=self.max_len)
    enc = encoded["input_ids"]
    if self.uses_token_types:
      if "token_type_ids" not in encoded:
        raise ConfigError("the cross-encoder's tokenizer returns no token_type_ids, which the "
                          "BERT model reads (0 query, 1 passage)")
      types = encoded["token_type_ids"]
    pad = self.tokenizer.pad_token_id or 0
    out = np.zeros((len(pairs),), np.float32)
    by_bucket: Dict[int, list] = {}
    for i, ids in enumerate(enc):
      bucket = next(b for b in self.buckets if b >= len(ids))
      by_bucket.setdefault(bucket, []).append(i)
    for length, idx in sorted(by_bucket.items()):
      for start in range(0, len(idx), self.batch_size):
        chunk = idx[start:start + self.batch_size]
        ids = np.full((self.batch_size, length), pad, np.int32)  # [B, L]; filler rows stay padding
        mask = np.zeros((self.batch_size, length), np.int32)
        tt = np.zeros((self.batch_size, length), np.int32)
        for r, i in enumerate(chunk):
          ids[r, :len(enc[i])] = enc[i]
          mask[r, :len(enc[i])] = 1
          if self.uses_token_types:
            tt[r, :len(enc[i])] = types[i]
        scores = np.asarray(self._jit(self.params, jnp.asarray(ids), jnp.asarray(mask),
                                      jnp.asarray(tt) if self.uses_token_types else None))
        out[chunk] = scores[:len(chunk)]
    return out


def _embed(params, input_ids, attention_mask, token_type_ids, cfg):
  """Jitted body: mean-pooled, L2-normalised embeddings ([B, L] -> [B, d], float32)."""
  from logrerank_jax.models.encoders.bert import BertEncoder
  h = BertEncoder(cfg).apply({"params": params}, input_ids, attention_mask,
                             token_type_ids).astype(jnp.float32)  # [B, L, d]
  m = attention_mask.astype(jnp.float32)[..., None]  # [B, L, 1]
  pooled = jnp.sum(h * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1e-9)  # [B, d]
  return pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


class BiEncoder:
  """Sentence-transformers-style bi-encoder: mean pooling, L2 norm, cosine (jitted, bucketed)."""

  def __init__(self, params, cfg, tokenizer, max_len: int = 256, batch_size: int = 32,
               length_buckets: Sequence[int] = (32, 64, 128, 256, 512)):
    """Wrap converted `BertEncoder` params.

    Args:
      params: `BertEncoder` params.
      cfg: its `BertConfig`.
      tokenizer: the fast tokenizer of the checkpoint.
      max_len: longest text in tokens (longer texts are truncated).
      batch_size: texts per jitted call.
      length_buckets: padded lengths; `max_len` is added as the last bucket.
    """
    if max_len < 8 or batch_size < 1:
      raise ConfigError(f"max_len must be >= 8 and batch_size >= 1, got {max_len}, {batch_size}")
    self.cfg, self.tokenizer = cfg, tokenizer
    self.max_len = min(int(max_len), cfg.max_positions)
    self.batch_size = int(batch_size)
    self.buckets = tuple(sorted({b for b in length_buckets if b < self.max_len} | {self.max_len}))
    self.params = jax.device_put(params)
    self._jit = jax.jit(functools.partial(_embed, cfg=cfg))
    self._cache: Dict[str, np.ndarray] = {}

  @classmethod
  def from_pretrained(cls, path: str, **kwargs) -> "BiEncoder":
    """Load a sentence-transformers BERT-family folder (config.json and weights at its root)."""
    import json
    import os
    from logrerank_jax.convert import bert_params_from_torch, load_torch_state_dict
    from logrerank_jax.data.tokenization import load_tokenizer
    from logrerank_jax.models.local_scorer import encoder_config_from_hf, encoder_family

    cfg = encoder_config_from_hf(path)
    if encoder_family(cfg) != "bert":
      raise ConfigError(f"{path}: the bi-encoder needs a BERT-family folder")
    st = os.path.join(path, "sentence_bert_config.json")
    if "max_len" not in kwargs and os.path.isfile(st):
      with open(st, encoding="utf-8") as f:
        kwargs["max_len"] = int(json.load(f).get("max_seq_length", 256))
    params = bert_params_from_torch(load_torch_state_dict(path), cfg)
    return cls(params, cfg, load_tokenizer(path), **kwargs)

  def embed(self, texts: Sequence[str]) -> np.ndarray:
    """Unit-norm embeddings of `texts`, float32 [len(texts), d] (cached by text)."""
    todo = sorted({t for t in texts if t not in self._cache})
    if todo:
      enc = self.tokenizer(todo, truncation=True, max_length=self.max_len)
      ids_all = enc["input_ids"]
      types_all = enc.get("token_type_ids")
      pad = self.tokenizer.pad_token_id or 0
      by_bucket: Dict[int, list] = {}
      for i, ids in enumerate(ids_all):
        by_bucket.setdefault(next(b for b in self.buckets if b >= len(ids)), []).append(i)
      for length, idx in sorted(by_bucket.items()):
        for start in range(0, len(idx), self.batch_size):
          chunk = idx[start:start + self.batch_size]
          ids = np.full((self.batch_size, length), pad, np.int32)
          mask = np.zeros((self.batch_size, length), np.int32)
          tt = np.zeros((self.batch_size, length), np.int32)
          for r, i in enumerate(chunk):
            ids[r, :len(ids_all[i])] = ids_all[i]
            mask[r, :len(ids_all[i])] = 1
            if types_all is not None:
              tt[r, :len(ids_all[i])] = types_all[i]
          out = np.asarray(self._jit(self.params, jnp.asarray(ids), jnp.asarray(mask),
                                     jnp.asarray(tt)))
          for r, i in enumerate(chunk):
            self._cache[todo[i]] = out[r]
    return np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, self.cfg.hidden_size), np.float32)

  def score(self, query: str, passages: Sequence[str]) -> np.ndarray:
    """Cosine similarity of the query with each passage, float32 [P]."""
    q = self.embed([query])[0]
    return self.embed(list(passages)) @ q


def bi_encoder_scores(model: BiEncoder, query: str, ctxs: Sequence[dict]) -> list:
  """Bi-encoder cosine of every candidate ("title text") with the query."""
  return [float(s) for s in model.score(query, [passage_string(c) for c in ctxs])]
