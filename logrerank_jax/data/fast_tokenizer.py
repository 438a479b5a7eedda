"""`FastTokenizer`: a Rust `tokenizers.Tokenizer` with the part of transformers' fast-tokenizer
API the library calls (`tokenizer(texts, ...)`, the special-token ids, `len`, `save_pretrained`).

Importing transformers imports torch where it is installed, about 5 CPU-seconds per process, paid
by every CLI start and every test subprocess for nothing: the ids come from the Rust tokenizer
either way. `tokenization.load_tokenizer` builds one from a HF checkpoint folder the way
transformers would; `datasets.wordpiece.train_wordpiece_tokenizer` trains a small one offline.
"""

import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

# transformers' named special tokens, in its order (the order it adds missing ones to the backend).
NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                "mask_token")
# transformers' model_max_length when none is known, and its "no limit" threshold.
_VERY_LARGE_INTEGER = int(1e30)
_LARGE_INTEGER = int(1e20)
# model_input_names of the two classes mirrored by `tokenization` (class attributes in
# transformers).
MODEL_INPUTS = {"bert": ("input_ids", "token_type_ids", "attention_mask"),
                "backend": ("input_ids", "attention_mask")}
# Source tokenizer_config.json keys save_pretrained does not copy: paths, load-time flags, and
# what it writes itself (the backend's tokenizer.json carries the added tokens).
_NOT_SAVED = frozenset(("added_tokens_decoder", "name_or_path", "tokenizer_file", "vocab_file",
                        "merges_file", "special_tokens_map_file", "is_local", "local_files_only",
                        "files_loaded", "max_len", "additional_special_tokens",
                        "extra_special_tokens", "add_bos_token", "add_eos_token",
                        "tokenizer_class", *NAMED_TOKENS))
_PADDING = ("longest", "max_length", "do_not_pad")
_TRUNCATION = ("only_first", "only_second", "longest_first", "do_not_truncate")


def _special_token_properties(name: str):
  """The `<name>` (string or None) and `<name>_id` properties of a named special token."""
  token = property(lambda self: self._special_tokens.get(name),
                   doc=f"The {name.replace('_', ' ')} string, or None.")
  token_id = property(lambda self: self._special_token_id(name),
                      doc=f"The {name.replace('_', ' ')} id, or None without one.")
  return token, token_id


class FastTokenizer:
  """A `tokenizers.Tokenizer` with the calls the library makes of a transformers fast tokenizer.

  Supported: `tokenizer(text or texts[, text_pair or pairs], add_special_tokens=, padding=,
  truncation=, max_length=, stride=, pad_to_multiple_of=, padding_side=, return_tensors=
  "np"|"pt", return_token_type_ids=, return_attention_mask=, return_special_tokens_mask=,
  return_offsets_mapping=, return_length=)` with transformers' semantics (`truncation=True` is
  longest_first; `max_length` alone truncates; no truncation or padding unless asked; a single
  text gives flat lists), the named special tokens and their ids, `len` (with added tokens),
  `tokenize`, `decode`, `get_vocab`, `convert_tokens_to_ids`, `save_pretrained`. Arguments
  outside that list raise TypeError rather than being ignored. The result is a plain dict.

  The backend is kept without truncation or padding between calls (a call that asks for them
  sets them and clears them again), so `backend_tokenizer.encode_batch_fast` gives the ids of
  `tokenizer(texts, add_special_tokens=False)` directly (`encode_texts`). Like transformers'
  tokenizers, one object must not be used by two threads at once (copy it with `copy.deepcopy`).

  Build one with `load_tokenizer` or `train_wordpiece_tokenizer`; the constructor takes a backend
  that already holds every added token.
  """

  is_fast = True

  bos_token, bos_token_id = _special_token_properties("bos_token")
  eos_token, eos_token_id = _special_token_properties("eos_token")
  unk_token, unk_token_id = _special_token_properties("unk_token")
  sep_token, sep_token_id = _special_token_properties("sep_token")
  pad_token, pad_token_id = _special_token_properties("pad_token")
  cls_token, cls_token_id = _special_token_properties("cls_token")
  mask_token, mask_token_id = _special_token_properties("mask_token")

  def __init__(self, backend, special_tokens: Dict[str, str], *,
               model_input_names: Sequence[str] = MODEL_INPUTS["backend"],
               model_max_length: Optional[int] = None, padding_side: str = "right",
               truncation_side: str = "right", split_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool = False, clean_up_bpe: bool = False,
               tokenizer_class: str = "PreTrainedTokenizerFast",
               config: Optional[Dict[str, Any]] = None, name_or_path: str = ""):
    """Wrap `backend` with these settings (transformers' names and meanings).

    Args:
      backend: the `tokenizers.Tokenizer` (used as is, not copied).
      special_tokens: named special tokens ("cls_token": "[CLS]", ...); None values are dropped.
      model_input_names: the keys a call returns by default besides input_ids.
      model_max_length: the length `truncation=True` without `max_length` cuts to (None: none).
      padding_side, truncation_side: "right" or "left".
      split_special_tokens: encode special tokens' text as plain text.
      clean_up_tokenization_spaces: `decode` removes spaces before punctuation (not for BPE
        models unless `clean_up_bpe`, as in transformers).
      tokenizer_class: written to tokenizer_config.json by `save_pretrained`.
      config: further tokenizer_config.json entries `save_pretrained` writes back.
      name_or_path: the folder it came from (information only).
    """
    for side in (padding_side, truncation_side):
      if side not in ("right", "left"):
        raise ValueError(f"padding and truncation sides are 'right' or 'left', not {side!r}")
    self._backend = backend
    self._special_tokens = {k: str(v) for k, v in special_tokens.items() if v is not None}
    self.model_input_names = list(model_input_names)
    self.model_max_length = _VERY_LARGE_INTEGER if model_max_length is None else model_max_length
    self.padding_side = padding_side
    self.truncation_side = truncation_side
    self.split_special_tokens = bool(split_special_tokens)
    self.clean_up_tokenization_spaces = bool(clean_up_tokenization_spaces)
    self._clean_up_bpe = bool(clean_up_bpe)
    self.tokenizer_class = tokenizer_class
    self._config = dict(config or {})
    self.name_or_path = name_or_path
    backend.no_truncation()
    backend.no_padding()
    backend.encode_special_tokens = self.split_special_tokens

  # ------------------------------------------------------------------------------ vocabulary

  @property
  def backend_tokenizer(self):
    """The Rust `tokenizers.Tokenizer`."""
    return self._backend

  def __len__(self) -> int:
    """Vocabulary size with the added tokens (what an embedding table must hold)."""
    return self._backend.get_vocab_size(with_added_tokens=True)

  def __bool__(self) -> bool:
    return True

  def __repr__(self) -> str:
    return (f"FastTokenizer(name_or_path={self.name_or_path!r}, class={self.tokenizer_class}, "
            f"vocab={len(self)}, special_tokens={self._special_tokens})")

  @property
  def vocab_size(self) -> int:
    """Size of the base vocabulary, without the added tokens."""
    return self._backend.get_vocab_size(with_added_tokens=False)

  def get_vocab(self) -> Dict[str, int]:
    return self._backend.get_vocab(with_added_tokens=True)

  @property
  def special_tokens_map(self) -> Dict[str, str]:
    """The named special tokens that are set, e.g. {"cls_token": "[CLS]", ...}."""
    return dict(self._special_tokens)

  @property
  def all_special_ids(self) -> List[int]:
    return [self.convert_tokens_to_ids(t) for t in dict.fromkeys(self._special_tokens.values())]

  def convert_tokens_to_ids(self, tokens):
    """Id of a token string (or of each of a list); the unknown token's id when not in the
    vocabulary, as in transformers."""
    if isinstance(tokens, str):
      index = self._backend.token_to_id(tokens)
      unk = self._special_tokens.get("unk_token")
      if index is None and unk is not None:
        index = self._backend.token_to_id(unk)
      return index
    return [self.convert_tokens_to_ids(t) for t in tokens]

  def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
    if isinstance(ids, int):
      return self._backend.id_to_token(ids)
    skip = set(self.all_special_ids) if skip_special_tokens else set()
    return [self._backend.id_to_token(int(i)) for i in ids if int(i) not in skip]

  def _special_token_id(self, name: str) -> Optional[int]:
    token = self._special_tokens.get(name)
    return None if token is None else self.convert_tokens_to_ids(token)

  # -------------------------------------------------------------------------------- encoding

  def _strategies(self, padding, truncation, max_length, pad_to_multiple_of):
    """(padding, truncation, max_length) of a call, as transformers'
    `_get_padding_truncation_strategies` resolves them."""
    if max_length is not None and padding is False and truncation is None:
      truncation = "longest_first"  # max_length alone truncates
    if padding is False:
      padding = "do_not_pad"
    elif padding is True:
      padding = "longest"
    elif padding not in _PADDING:
      raise ValueError(f"padding must be a bool or one of {_PADDING}, not {padding!r}")
    if truncation is None or truncation is False:
      truncation = "do_not_truncate"
    elif truncation is True:
      truncation = "longest_first"
    elif truncation not in _TRUNCATION:
      raise ValueError(f"truncation must be a bool or one of {_TRUNCATION}, not {truncation!r}")
    if max_length is None:
      if padding == "max_length":
        if self.model_max_length > _LARGE_INTEGER:
          padding = "do_not_pad"
        else:
          max_length = self.model_max_length
      if truncation != "do_not_truncate":
        if self.model_max_length > _LARGE_INTEGER:
          truncation = "do_not_truncate"
        else:
          max_length = self.model_max_length
    if padding != "do_not_pad" and (self.pad_token is None or self.pad_token_id is None):
      raise ValueError("asking to pad but the tokenizer has no padding token")
    if (truncation != "do_not_truncate" and padding != "do_not_pad"
        and pad_to_multiple_of is not None and max_length is not None
        and max_length % pad_to_multiple_of != 0):
      raise ValueError(f"truncation length ({max_length}) is not a multiple of "
                       f"pad_to_multiple_of ({pad_to_multiple_of})")
    return padding, truncation, max_length

  def __call__(self, text, text_pair=None, add_special_tokens: bool = True, padding=False,
               truncation=None, max_length: Optional[int] = None, stride: int = 0,
               pad_to_multiple_of: Optional[int] = None, padding_side: Optional[str] = None,
               return_tensors: Optional[str] = None, return_token_type_ids: Optional[bool] = None,
               return_attention_mask: Optional[bool] = None,
               return_special_tokens_mask: bool = False, return_offsets_mapping: bool = False,
               return_length: bool = False, verbose: bool = True) -> Dict[str, Any]:
    """Encode a text, a pair, or a batch of texts or pairs (see the class docstring).

    Returns:
      {"input_ids": ..., then those of "token_type_ids", "attention_mask" in
      `model_input_names` (or asked for), "special_tokens_mask", "offset_mapping", "length"}:
      lists per text (flat for a single text), or arrays [batch, length] with `return_tensors`.
    """
    del verbose  # transformers' too-long warning is not repeated
    padding, truncation, max_length = self._strategies(padding, truncation, max_length,
                                                       pad_to_multiple_of)
    batched = isinstance(text, (list, tuple))
    if batched:
      if isinstance(text_pair, str):
        raise TypeError("with a batch of texts, text_pair must be a list of the same length")
      if text_pair is not None and len(text) != len(text_pair):
        raise ValueError(f"batch length of text: {len(text)} does not match batch length of "
                         f"text_pair: {len(text_pair)}")
      inputs = list(zip(text, text_pair)) if text_pair is not None else list(text)
    else:
      inputs = [(text, text_pair)] if text_pair else [text]  # an empty pair text: one text
    backend = self._backend
    try:
      if truncation != "do_not_truncate":
        backend.enable_truncation(max_length, stride=stride, strategy=truncation,
                                  direction=self.truncation_side)
      if padding != "do_not_pad":
        backend.enable_padding(direction=padding_side or self.padding_side,
                               pad_id=self.pad_token_id, pad_type_id=0, pad_token=self.pad_token,
                               length=max_length if padding == "max_length" else None,
                               pad_to_multiple_of=pad_to_multiple_of)
      # Same ids and types either way; only the _fast one skips the character offsets.
      encode = backend.encode_batch if return_offsets_mapping else backend.encode_batch_fast
      encodings = encode(inputs, add_special_tokens=add_special_tokens) if inputs else []
    finally:
      if truncation != "do_not_truncate":
        backend.no_truncation()
      if padding != "do_not_pad":
        backend.no_padding()
    if return_token_type_ids is None:
      return_token_type_ids = "token_type_ids" in self.model_input_names
    if return_attention_mask is None:
      return_attention_mask = "attention_mask" in self.model_input_names
    out = {"input_ids": [e.ids for e in encodings]}
    if return_token_type_ids:
      out["token_type_ids"] = [e.type_ids for e in encodings]
    if return_attention_mask:
      out["attention_mask"] = [e.attention_mask for e in encodings]
    if return_special_tokens_mask:
      out["special_tokens_mask"] = [e.special_tokens_mask for e in encodings]
    if return_offsets_mapping:
      out["offset_mapping"] = [e.offsets for e in encodings]
    if return_length:
      out["length"] = [len(e.ids) for e in encodings]
    if return_tensors is not None:
      return {k: _as_tensor(k, v, return_tensors) for k, v in out.items()}
    if not batched:
      out = {k: v[0] if v and isinstance(v[0], list) else v for k, v in out.items()}
    return out

  def tokenize(self, text: str, pair: Optional[str] = None, add_special_tokens: bool = False
               ) -> List[str]:
    """The token strings of `text` (and `pair`)."""
    return self._backend.encode(text, pair, add_special_tokens=add_special_tokens).tokens

  def decode(self, token_ids, skip_special_tokens: bool = False,
             clean_up_tokenization_spaces: Optional[bool] = None):
    """The text of `token_ids` (a list of them: a list of texts), as transformers decodes."""
    if hasattr(token_ids, "tolist"):
      token_ids = token_ids.tolist()
    if isinstance(token_ids, (list, tuple)) and token_ids and isinstance(token_ids[0], (list, tuple)):
      return [self.decode(t, skip_special_tokens, clean_up_tokenization_spaces) for t in token_ids]
    if isinstance(token_ids, int):
      token_ids = [token_ids]
    text = self._backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
    clean = (self.clean_up_tokenization_spaces if clean_up_tokenization_spaces is None
             else clean_up_tokenization_spaces)
    # transformers skips the clean-up for BPE models: it deletes real spaces before punctuation.
    if clean and (type(self._backend.model).__name__ != "BPE" or self._clean_up_bpe):
      for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                   (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text

  # ---------------------------------------------------------------------------------- saving

  def save_pretrained(self, save_directory: str) -> Tuple[str, ...]:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json to
    `save_directory`, a folder both `load_tokenizer` and `transformers.AutoTokenizer` load back
    with the same ids.

    Returns:
      The paths written.
    """
    os.makedirs(save_directory, exist_ok=True)
    config = {k: v for k, v in self._config.items() if k not in _NOT_SAVED}
    config.update(self._special_tokens)
    config.update(tokenizer_class=self.tokenizer_class,
                  model_input_names=list(self.model_input_names),
                  padding_side=self.padding_side, truncation_side=self.truncation_side,
                  split_special_tokens=self.split_special_tokens,
                  clean_up_tokenization_spaces=self.clean_up_tokenization_spaces)
    if self._clean_up_bpe:
      config["clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"] = True
    if self.model_max_length < _LARGE_INTEGER:
      config["model_max_length"] = self.model_max_length
    paths = tuple(os.path.join(save_directory, f) for f in (
        "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"))
    self._backend.save(paths[0])
    for path, obj in zip(paths[1:], (config, self._special_tokens)):
      with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    return paths


def _as_tensor(key: str, value: list, kind: str):
  """A batch of lists as one array, as transformers' BatchEncoding converts it ("np": NumPy,
  ragged rows as an object array; "pt": a torch tensor)."""
  if kind == "np":
    if value and isinstance(value[0], (list, tuple)) and len({len(v) for v in value}) > 1:
      return np.asarray([np.asarray(v) for v in value], dtype=object)
    return np.asarray(value, dtype=np.int64 if not value else None)
  if kind == "pt":
    import torch  # pylint: disable=g-import-not-at-top  (only callers that ask for torch pay it)
    try:
      return torch.tensor(value, dtype=torch.int64 if not value else None)
    except ValueError as e:
      raise ValueError(f"cannot make one tensor of {key!r} (rows of different lengths); pass "
                       "padding=True") from e
  raise ValueError(f"return_tensors must be 'np' or 'pt', not {kind!r}")
