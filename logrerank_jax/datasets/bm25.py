"""Deterministic BM25 over a small in-memory corpus (used to build evaluation pools).

Tokeniser: lowercase, then maximal runs of Unicode letters and digits
(`[^\\W_]+`); everything else separates tokens.  No stemming, no stop words.

Scoring (Okapi BM25 with Lucene's non-negative idf):
    score(q, d) = sum over query tokens t (repeats counted) of
        idf(t) * tf(t, d) * (k1 + 1) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
    idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))
with k1 = 1.5, b = 0.75 by default.  Query tokens absent from the corpus add 0.
Ranking sorts by decreasing score; ties go to the lower document index.
"""

import re
from typing import Iterable, Sequence

import numpy as np

from logrerank_jax.errors import DataError

_TOKEN = re.compile(r"[^\W_]+")


def bm25_tokenize(text: str) -> list[str]:
  """Lowercase `text` and return its alphanumeric tokens."""
  if not isinstance(text, str):
    raise DataError(f"BM25 text must be a str, got {type(text).__name__}")
  return _TOKEN.findall(text.lower())


class BM25Index:
  """BM25 index over `texts`; document i is `texts[i]`."""

  def __init__(self, texts: Sequence[str], k1: float = 1.5, b: float = 0.75):
    """Index `texts`.

    Args:
      texts: the documents.
      k1: term-frequency saturation.
      b: length normalisation.
    """
    texts = list(texts)
    if not texts:
      raise DataError("BM25Index needs at least one document")
    for i, t in enumerate(texts):
      if not isinstance(t, str):
        raise DataError(f"BM25Index document {i} must be a str, got {type(t).__name__}")
    self.k1, self.b = float(k1), float(b)
    self.num_docs = len(texts)
    postings: dict[str, dict[int, int]] = {}
    lengths = np.zeros(self.num_docs, np.float64)  # [D]
    for i, t in enumerate(texts):
      toks = bm25_tokenize(t)
      lengths[i] = len(toks)
      for tok in toks:
        doc_tf = postings.setdefault(tok, {})
        doc_tf[i] = doc_tf.get(i, 0) + 1
    avgdl = float(lengths.mean()) or 1.0  # all-empty corpus: every score is 0 anyway
    self._norm = self.k1 * (1.0 - self.b + self.b * lengths / avgdl)  # [D]
    self._postings = {}
    for tok, doc_tf in postings.items():
      docs = np.fromiter(doc_tf.keys(), np.int64, len(doc_tf))
      tfs = np.fromiter(doc_tf.values(), np.float64, len(doc_tf))
      idf = np.log1p((self.num_docs - len(docs) + 0.5) / (len(docs) + 0.5))
      self._postings[tok] = (docs, idf * tfs * (self.k1 + 1.0) / (tfs + self._norm[docs]))

  def scores(self, query: str) -> np.ndarray:
    """Return the BM25 score of every document for `query` (float64 [D])."""
    out = np.zeros(self.num_docs, np.float64)
    for tok in bm25_tokenize(query):
      hit = self._postings.get(tok)
      if hit is not None:
        out[hit[0]] += hit[1]
    return out

  def top_k(self, query: str, k: int, exclude: Iterable[int] = ()) -> list[int]:
    """Return the indices of the k best documents (fewer if the corpus is smaller).

    Args:
      query: query text.
      k: number of documents.
      exclude: document indices never returned.

    Returns:
      Indices by decreasing score, ties to the lower index.
    """
    if k < 0:
      raise DataError(f"top_k needs k >= 0, got {k}")
    s = self.scores(query)
    keep = np.ones(self.num_docs, bool)
    for i in exclude:
      if not 0 <= int(i) < self.num_docs:
        raise DataError(f"exclude index {i} is outside the corpus of {self.num_docs} documents")
      keep[int(i)] = False
    idx = np.nonzero(keep)[0]
    order = idx[np.argsort(-s[idx], kind="stable")]  # stable: ties keep ascending index
    return order[:k].tolist()
