"""A small WordPiece tokenizer trained offline, deterministically (tests, the demo, tiny models).

Training a vocabulary is offline work; the tokenizer it returns is the engine's `FastTokenizer`
(`logrerank_jax.data.fast_tokenizer`), saved in HF format and loaded back by `load_tokenizer`.
"""

import collections
from typing import Iterable, Optional

from logrerank_jax.data.fast_tokenizer import FastTokenizer
from logrerank_jax.data.tokenization import add_tokens_as_transformers

# Special tokens of tokenizers trained here; their ids are fixed so tiny configs can name them.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


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


def train_wordpiece_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: Optional[str] = None
                              ) -> FastTokenizer:
  """Build a lowercasing WordPiece tokenizer on `texts` (no hub needed), deterministically.

  Args:
    texts: training text.
    vocab_size: target vocabulary size, special tokens included (see `wordpiece_vocab`).
    out_dir: if given, the tokenizer is saved there with `save_pretrained` (HF format, loadable
      by transformers).

  Returns:
    A `FastTokenizer` with [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4: the tokenizer
    `transformers.PreTrainedTokenizerFast(tokenizer_object=..., unk_token="[UNK]", ...)` makes of
    the same backend (its special tokens become added tokens; no token_type_ids by default).
  """
  from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

  vocab = wordpiece_vocab(texts, vocab_size)
  tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
  tok.normalizer = normalizers.BertNormalizer(lowercase=True)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece()
  cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
  tok.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
      special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
  named = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
           "mask_token": "[MASK]"}
  add_tokens_as_transformers(tok, named, {})
  fast = FastTokenizer(tok, named)
  if out_dir is not None:
    fast.save_pretrained(out_dir)
  return fast
