"""Passage-level baselines for `tools/evaluate.py`: BM25 and a ModernBERT passage cross-encoder.

BM25: a pool's own `bm25` scores when every candidate carries one (as `tools/prepare_data.py`
writes them), else `logrerank_jax.data.bm25.BM25Index` over the pool's "title text" strings.

Cross-encoder: an HF `ModernBertForSequenceClassification` folder (`config.json`, weights,
tokenizer; e.g. gte-reranker-modernbert-base) converted with `load_torch_state_dict` +
`sequence_classifier_params_from_torch`.  Each candidate is scored as the pair
`tokenizer(query, "title text")` (`[CLS] q [SEP] p [SEP]`, longest-first truncation to
`max_len`), the relevance score is the logit of label 0 for a one-label head (label 1 for a
two-label head).  Pairs are padded to the smallest length bucket that holds them and scored
`batch_size` at a time by one jitted function per length bucket.
"""

import functools
import math
from typing import Dict, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from logrerank_jax.data.bm25 import BM25Index
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


def _score_pairs(params, input_ids, attention_mask, cfg, label):
  """Jitted body: relevance logit of each padded pair ([B, L] -> [B])."""
  from logrerank_jax.models.modernbert import ModernBertSequenceClassifier
  logits = ModernBertSequenceClassifier(cfg).apply({"params": params}, input_ids, attention_mask)
  return logits[:, label]  # [B] float32


class CrossEncoder:
  """A ModernBERT sequence-classification passage reranker with a jitted, bucketed forward."""

  def __init__(self, params, cfg, tokenizer, max_len: int = 512, batch_size: int = 16,
               length_buckets: Sequence[int] = (64, 128, 256, 512)):
    """Wrap converted params.

    Args:
      params: `ModernBertSequenceClassifier` params.
      cfg: its `ModernBertConfig`.
      tokenizer: the fast tokenizer of the checkpoint.
      max_len: longest pair in tokens (longer pairs are truncated, longest first).
      batch_size: pairs per jitted call.
      length_buckets: padded lengths; `max_len` is added as the last bucket.
    """
    if cfg.num_labels not in (1, 2):
      raise ConfigError(f"cross-encoder must have 1 or 2 labels, got num_labels={cfg.num_labels}")
    if max_len < 8 or batch_size < 1:
      raise ConfigError(f"max_len must be >= 8 and batch_size >= 1, got {max_len}, {batch_size}")
    self.cfg, self.tokenizer = cfg, tokenizer
    self.max_len = min(int(max_len), cfg.max_position_embeddings)
    self.batch_size = int(batch_size)
    self.buckets = tuple(sorted({b for b in length_buckets if b < self.max_len} | {self.max_len}))
    self.params = jax.device_put(params)
    self._jit = jax.jit(functools.partial(_score_pairs, cfg=cfg, label=cfg.num_labels - 1))

  @classmethod
  def from_pretrained(cls, path: str, **kwargs) -> "CrossEncoder":
    """Load an HF ModernBertForSequenceClassification folder (config, weights, tokenizer)."""
    from logrerank_jax.convert import load_torch_state_dict, sequence_classifier_params_from_torch
    from logrerank_jax.data.tokenization import load_tokenizer
    from logrerank_jax.models.modernbert import ModernBertConfig

    cfg = ModernBertConfig.from_hf(path)
    params = sequence_classifier_params_from_torch(load_torch_state_dict(path), cfg)
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
    enc = self.tokenizer([q for q, _ in pairs], [p for _, p in pairs], truncation="longest_first",
                         max_length=self.max_len)["input_ids"]
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
        for r, i in enumerate(chunk):
          ids[r, :len(enc[i])] = enc[i]
          mask[r, :len(enc[i])] = 1
        scores = np.asarray(self._jit(self.params, jnp.asarray(ids), jnp.asarray(mask)))
        out[chunk] = scores[:len(chunk)]
    return out


def cross_encoder_scores(model: CrossEncoder, query: str, ctxs: Sequence[dict]) -> list:
  """Cross-encoder logit of every candidate ("title text")."""
  return [float(s) for s in model.score(query, [passage_string(c) for c in ctxs])]

