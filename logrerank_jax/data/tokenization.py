"""Load HF tokenizers from checkpoint folders, train a small WordPiece one offline, and encode
many texts into one flat array of token ids."""

import collections
import itertools
import os
from typing import Iterable, Optional, Sequence

import numpy as np

from logrerank_jax.errors import CheckpointError

# Special tokens of tokenizers trained here; their ids are fixed so tiny configs can name them.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def load_tokenizer(path: str):
  """Load the fast tokenizer saved in a HF checkpoint folder.

  Args:
    path: folder holding `tokenizer.json` (and usually `tokenizer_config.json`), as written by
      `save_pretrained`; the same folder as the model weights.

  Returns:
    A `transformers.PreTrainedTokenizerFast`.
  """
  # Imported here: transformers is heavy and only the text side needs it.
  from transformers import AutoTokenizer, PreTrainedTokenizerFast

  if not os.path.isdir(path):
    raise CheckpointError(f"tokenizer folder not found: {path}")
  if not os.path.exists(os.path.join(path, "tokenizer.json")) and not os.path.exists(
      os.path.join(path, "tokenizer_config.json")):
    raise CheckpointError(f"no tokenizer.json or tokenizer_config.json in {path}")
  try:
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
  except Exception as e:  # transformers raises many types; report one line.
    raise CheckpointError(f"cannot load tokenizer from {path}: {type(e).__name__}: {e}") from e
  if not isinstance(tok, PreTrainedTokenizerFast):
    raise CheckpointError(f"tokenizer in {path} is not a fast tokenizer ({type(tok).__name__})")
  return tok


def encode_texts(tokenizer, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
  """Token ids of `texts` without special tokens, as one flat array and a length per text.

  The same ids as `tokenizer(texts, add_special_tokens=False)["input_ids"]`, from one batched
  call of the Rust tokenizer's `encode_batch_fast` (no character offsets tracked) and without the
  per-text dicts transformers builds around each encoding: the engine's host work is mostly
  tokenisation, and about a third of the transformers call was that wrapper (measured on real
  pools). transformers' own call first switches the backend to no truncation, no padding and its
  `split_special_tokens` setting; where the backend is not in that state already, that call is
  made instead (it leaves the backend in that state for the next call). A tokenizer without a
  Rust backend takes the transformers call too.

  Args:
    tokenizer: a `transformers` tokenizer (fast: `backend_tokenizer`).
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


def wordpiece_vocab(texts: Iterable[str], vocab_size: int) -> list:
  """Return a deterministic WordPiece vocabulary for `texts`.

  The vocabulary is the special tokens, every character seen (as a word start and as a `##`
  continuation, so any word decomposes and nothing maps to [UNK] needlessly), then the most
  frequent whole words, ties broken alphabetically. The `tokenizers` trainer breaks ties by hash
  order, which differs between processes; multi-host runs and resumed runs need the same ids.

  Args:
    texts: training text.
    vocab_size: target size; at least the special tokens plus the characters are kept.

  Returns:
    The token list; index = id.
  """
  from tokenizers import normalizers, pre_tokenizers

  norm = normalizers.BertNormalizer(lowercase=True)
  pre = pre_tokenizers.BertPreTokenizer()
  counts = collections.Counter()
  for text in texts:
    counts.update(w for w, _ in pre.pre_tokenize_str(norm.normalize_str(text)))
  chars = sorted({c for w in counts for c in w})
  vocab = list(SPECIAL_TOKENS) + chars + ["##" + c for c in chars]
  seen = set(vocab)
  for word, _ in sorted(counts.items(), key=lambda wc: (-wc[1], wc[0])):
    if len(vocab) >= vocab_size:
      break
    if word not in seen:
      vocab.append(word)
      seen.add(word)
  return vocab


def train_wordpiece_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: Optional[str] = None):
  """Build a lowercasing WordPiece tokenizer on `texts` (no hub needed), deterministically.

  Args:
    texts: training text.
    vocab_size: target vocabulary size, special tokens included (see `wordpiece_vocab`).
    out_dir: if given, the tokenizer is saved there with `save_pretrained` (HF format).

  Returns:
    A `transformers.PreTrainedTokenizerFast` with [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4.
  """
  from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
  from transformers import PreTrainedTokenizerFast

  vocab = wordpiece_vocab(texts, vocab_size)
  tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
  tok.normalizer = normalizers.BertNormalizer(lowercase=True)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece()
  cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
  tok.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
      special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
  fast = PreTrainedTokenizerFast(
      tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
      sep_token="[SEP]", mask_token="[MASK]")
  if out_dir is not None:
    os.makedirs(out_dir, exist_ok=True)
    fast.save_pretrained(out_dir)
  return fast
