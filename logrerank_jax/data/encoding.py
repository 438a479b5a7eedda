"""Many texts encoded into one flat array of token ids (the engine's tokenisation of a chunk)."""

import itertools
from typing import Sequence

import numpy as np


def encode_texts(tokenizer, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
  """Token ids of `texts` without special tokens, as one flat array and a length per text.

  The same ids as `tokenizer(texts, add_special_tokens=False)["input_ids"]`, from one batched
  call of the Rust tokenizer's `encode_batch_fast` (no character offsets tracked) and without the
  per-text lists a tokenizer call builds around each encoding: the engine's host work is mostly
  tokenisation, and about a third of the transformers call was that wrapper (measured on real
  pools). That needs the backend without truncation or padding and with the tokenizer's
  `split_special_tokens` setting, the state a `FastTokenizer` keeps between calls; a transformers
  tokenizer leaves its backend so after its first call, and until then (or for a tokenizer
  without a Rust backend) its own call is made instead.

  Args:
    tokenizer: a `FastTokenizer` or a transformers tokenizer.
    texts: the strings.

  Returns:
    (ids int32 [total tokens], lengths int64 [len(texts)]): text i is
    `ids[sum(lengths[:i]):sum(lengths[:i + 1])]`.
  """
  backend = getattr(tokenizer, "backend_tokenizer", None)
  fast = (backend is not None and hasattr(backend, "encode_batch_fast")
          and backend.truncation is None and backend.padding is None
          and backend.encode_special_tokens == bool(getattr(tokenizer, "split_special_tokens",
                                                            False)))
  if not texts:
    ids = []
  elif fast:
    ids = [e.ids for e in backend.encode_batch_fast(list(texts), add_special_tokens=False)]
  else:
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
  lengths = np.fromiter(map(len, ids), np.int64, len(ids))
  flat = np.fromiter(itertools.chain.from_iterable(ids), np.int32, int(lengths.sum()))
  return flat, lengths
