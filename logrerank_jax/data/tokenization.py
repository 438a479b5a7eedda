"""Tokenizers of HF checkpoint folders without transformers, a small WordPiece one trained
offline, and many texts encoded into one flat array of token ids.

`load_tokenizer` returns a `FastTokenizer`: a Rust `tokenizers.Tokenizer` with the part of
transformers' fast-tokenizer API the library calls (`tokenizer(texts, ...)`, the special-token
ids, `len`, `save_pretrained`). Importing transformers imports torch where it is installed, about
5 CPU-seconds per process, paid by every CLI start and every test subprocess for nothing: the ids
come from the Rust tokenizer either way. What transformers (5.24, read from its source) does to a
folder's `tokenizer.json` on top (the class `AutoTokenizer` picks, `BertTokenizer` rebuilding the
backend from the vocabulary and `tokenizer_config.json`, the added and special tokens it adds,
the defaults of a call) is repeated here, so ids, token types, offsets and special-token ids are
the same as `AutoTokenizer.from_pretrained(folder)`'s (tests/test_tokenization.py compares them).
A folder this module cannot mirror (another tokenizer class, remote code, a setting transformers
reads that is not repeated here, no `tokenizer.json`) is loaded by transformers as before, with a
warning naming the reason.
"""

import collections
import itertools
import json
import logging
import os
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from logrerank_jax.errors import CheckpointError

log = logging.getLogger(__name__)

# Special tokens of tokenizers trained here; their ids are fixed so tiny configs can name them.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# transformers' named special tokens, in its order (the order it adds missing ones to the backend).
_NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                 "mask_token")
# transformers' model_max_length when none is known, and its "no limit" threshold.
_VERY_LARGE_INTEGER = int(1e30)
_LARGE_INTEGER = int(1e20)
# BertTokenizer's defaults for tokens tokenizer_config.json leaves out (its __init__ signature).
_BERT_DEFAULT_TOKENS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                        "cls_token": "[CLS]", "mask_token": "[MASK]"}
# model_input_names of the two classes mirrored here (class attributes in transformers).
_MODEL_INPUTS = {"bert": ("input_ids", "token_type_ids", "attention_mask"),
                 "backend": ("input_ids", "attention_mask")}
# The tokenizer class transformers registers for a config.json model_type (TOKENIZER_MAPPING_NAMES),
# and whether that class overrides the folder's own tokenizer_class
# (MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS); other model types are left to transformers.
_MODEL_TYPE_TOKENIZER = {"bert": ("BertTokenizer", False), "modernbert": ("TokenizersBackend", True)}
# Registered classes that make AutoTokenizer fall back to TokenizersBackend (its own list).
_BACKEND_CLASSES = ("TokenizersBackend", "PythonBackend", "PreTrainedTokenizerFast",
                    "MistralCommonBackend")
# tokenizer_config.json keys transformers reads while loading a folder with tokenizer.json that
# are not repeated here (remote code, another tokenizer file, backend pieces passed as settings).
# Every other key it reads is honoured below; the rest it only stores (do_basic_tokenize,
# never_split, add_prefix_space, max_length, stride, ...) and cannot change an id.
_UNMIRRORED_KEYS = ("auto_map", "fast_tokenizer_files", "model_specific_special_tokens",
                    "post_processor", "tokenizer_object", "tokenizer_padding",
                    "tokenizer_truncation", "_json_truncation", "_json_padding", "gguf_file")
# Source tokenizer_config.json keys save_pretrained does not copy: paths, load-time flags, and
# what it writes itself (the backend's tokenizer.json carries the added tokens).
_NOT_SAVED = frozenset(("added_tokens_decoder", "name_or_path", "tokenizer_file", "vocab_file",
                        "merges_file", "special_tokens_map_file", "is_local", "local_files_only",
                        "files_loaded", "max_len", "additional_special_tokens",
                        "extra_special_tokens", "add_bos_token", "add_eos_token",
                        "tokenizer_class", *_NAMED_TOKENS))
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
               model_input_names: Sequence[str] = _MODEL_INPUTS["backend"],
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


def load_tokenizer(path: str):
  """Load the tokenizer saved in a HF checkpoint folder.

  Args:
    path: folder holding `tokenizer.json` (and usually `tokenizer_config.json`), as written by
      `save_pretrained`; the same folder as the model weights.

  Returns:
    A `FastTokenizer` giving the ids `transformers.AutoTokenizer.from_pretrained(path)` gives,
    loaded without importing transformers. A folder without tokenizer.json (transformers converts
    its slow vocabulary) or one this module does not mirror (see the module docstring; logged)
    gives transformers' own `PreTrainedTokenizerFast`.

  Raises:
    CheckpointError: no such folder, no tokenizer files in it, or unreadable ones (one line).
  """
  if not os.path.isdir(path):
    raise CheckpointError(f"tokenizer folder not found: {path}")
  if not os.path.exists(os.path.join(path, "tokenizer.json")) and not os.path.exists(
      os.path.join(path, "tokenizer_config.json")):
    raise CheckpointError(f"no tokenizer.json or tokenizer_config.json in {path}")
  if os.path.exists(os.path.join(path, "tokenizer.json")):
    try:
      tok, reason = _load_without_transformers(path)
    except Exception as e:  # JSON, OS and tokenizers errors (the Rust ones are plain Exception)
      raise CheckpointError(f"cannot load tokenizer from {path}: {_one_line(e)}") from e
    if tok is not None:
      return tok
    log.warning("tokenizer in %s loaded with transformers: %s", path, reason)
  return _load_with_transformers(path)


def _load_with_transformers(path: str):
  """`transformers.AutoTokenizer.from_pretrained(path)`, errors as one-line CheckpointErrors."""
  # Imported here: transformers imports torch where installed, seconds of start-up.
  from transformers import AutoTokenizer, PreTrainedTokenizerFast  # pylint: disable=g-import-not-at-top

  try:
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
  except Exception as e:  # transformers raises many types; report one line.
    raise CheckpointError(f"cannot load tokenizer from {path}: {_one_line(e)}") from e
  if not isinstance(tok, PreTrainedTokenizerFast):
    raise CheckpointError(f"tokenizer in {path} is not a fast tokenizer ({type(tok).__name__})")
  return tok


def _one_line(e: BaseException) -> str:
  lines = str(e).strip().splitlines()
  return f"{type(e).__name__}: {lines[0] if lines else ''}"


def _read_json(path: str) -> Dict[str, Any]:
  """A JSON object file's content; {} when the file does not exist."""
  if not os.path.exists(path):
    return {}
  with open(path, encoding="utf-8") as f:
    obj = json.load(f)
  if not isinstance(obj, dict):
    raise ValueError(f"{os.path.basename(path)} does not hold a JSON object")
  return obj


def _tokenizer_kind(tok_cfg: Dict[str, Any], model_cfg: Dict[str, Any]) -> Optional[str]:
  """The class transformers' `AutoTokenizer.from_pretrained` picks for a folder, as 5.24 decides:
  "bert" (BertTokenizer), "backend" (TokenizersBackend, alias PreTrainedTokenizerFast), or None
  (another class, or one this module cannot tell without transformers' registries)."""
  model_type = model_cfg.get("model_type") or ""
  declared = tok_cfg.get("tokenizer_class")
  hub_class = declared or model_cfg.get("tokenizer_class")
  if model_type and model_type not in _MODEL_TYPE_TOKENIZER:
    return None
  backend_names = ("TokenizersBackend", "PreTrainedTokenizerFast", "PreTrainedTokenizer",
                   "PythonBackend")
  if hub_class and model_type:
    registered, overrides_hub = _MODEL_TYPE_TOKENIZER[model_type]
    if registered.removesuffix("Fast") != hub_class.removesuffix("Fast"):
      # A model type whose registered class differs from the folder's: a backend-only type
      # (ModernBERT) always loads as TokenizersBackend, the others as the folder's class.
      if registered in _BACKEND_CLASSES:
        return "backend"
      name = registered if overrides_hub else hub_class
      if name in ("BertTokenizer", "BertTokenizerFast"):
        return "bert"
      return "backend" if name in backend_names else None
  if declared:
    name = declared.removesuffix("Fast")  # PreTrainedTokenizer(Fast) is PythonBackend -> backend
    return "bert" if name == "BertTokenizer" else "backend" if name in backend_names else None
  if model_cfg.get("tokenizer_class"):
    name = model_cfg["tokenizer_class"]
    if "PreTrainedTokenizerFast" not in name:
      name = name.removesuffix("Fast")
    return {"BertTokenizer": "bert", "PreTrainedTokenizerFast": "backend",
            "TokenizersBackend": "backend"}.get(name)
  if model_type:
    return "bert" if _MODEL_TYPE_TOKENIZER[model_type][0] == "BertTokenizer" else "backend"
  return "backend"  # no class and no model type: transformers' TokenizersBackend


def _unmirrored_setting(tok_cfg: Dict[str, Any]) -> Optional[str]:
  """Why transformers must load a folder with this tokenizer_config.json, or None."""
  for key in _UNMIRRORED_KEYS:
    if key in tok_cfg:
      return f"tokenizer_config.json sets {key}"
  for key in ("additional_special_tokens", "extra_special_tokens", "init_inputs"):
    if tok_cfg.get(key):
      return f"tokenizer_config.json sets {key}"
  for key, value in tok_cfg.items():
    # transformers adds any other "*_token" string as a model-specific special token.
    if (key.endswith("_token") and key not in _NAMED_TOKENS
        and (isinstance(value, str) or (isinstance(value, dict) and "__type" in value))):
      return f"tokenizer_config.json sets the model-specific special token {key}"
  return None


def _added_token(value):
  """A special-token value of tokenizer_config.json: a string, None, or an AddedToken dict
  (`{"__type": "AddedToken", "content": ...}`, as transformers 4 wrote it)."""
  from tokenizers import AddedToken  # pylint: disable=g-import-not-at-top
  if value is None or isinstance(value, str):
    return value
  if isinstance(value, dict) and value.get("__type") == "AddedToken":
    return AddedToken(**{k: v for k, v in value.items() if k != "__type"})
  raise ValueError(f"a special token is neither a string nor an AddedToken: {value!r}")


def _load_without_transformers(path: str) -> Tuple[Optional[FastTokenizer], str]:
  """(the folder's FastTokenizer, "") built as transformers 5.24 builds its tokenizer, or
  (None, why transformers must load it)."""
  from tokenizers import AddedToken, Tokenizer  # pylint: disable=g-import-not-at-top

  tok_cfg = _read_json(os.path.join(path, "tokenizer_config.json"))
  model_cfg = _read_json(os.path.join(path, "config.json"))
  kind = _tokenizer_kind(tok_cfg, model_cfg)
  if kind is None:
    declared = tok_cfg.get("tokenizer_class") or model_cfg.get("tokenizer_class")
    model_type = model_cfg.get("model_type")
    return None, (f"tokenizer class {declared} is not mirrored here" if declared and not model_type
                  else f"tokenizer class {declared} of model type {model_type} is not mirrored here")
  reason = _unmirrored_setting(tok_cfg)
  if reason:
    return None, reason
  backend = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
  named = {k: _added_token(tok_cfg[k]) for k in _NAMED_TOKENS if k in tok_cfg}
  if "added_tokens_decoder" in tok_cfg:
    added = {int(i): AddedToken(**t) for i, t in tok_cfg["added_tokens_decoder"].items()}
  else:
    # transformers' path for configs without the table: special_tokens_map.json's tokens replace
    # the config's, and the table is the added tokens of tokenizer.json (and added_tokens.json).
    if os.path.exists(os.path.join(path, "added_tokens.json")):
      return None, "the folder has a legacy added_tokens.json"
    for key, value in _read_json(os.path.join(path, "special_tokens_map.json")).items():
      if key in _NAMED_TOKENS:
        named[key] = AddedToken(**{**value, "special": True}) if isinstance(value, dict) else value
      elif value:
        return None, f"special_tokens_map.json sets {key}"
    added = backend.get_added_tokens_decoder()
  # tokenizer.json's truncation and padding only give the sides' defaults (transformers resets
  # both on every call), and, for a config without one, the padding token.
  json_truncation, json_padding = backend.truncation, backend.padding
  config = dict(tok_cfg)
  if kind == "bert":
    for key, value in _BERT_DEFAULT_TOKENS.items():
      named.setdefault(key, value)
    if any(named[k] is None for k in _BERT_DEFAULT_TOKENS):
      return None, "a BertTokenizer special token is set to null"
    config.update(do_lower_case=tok_cfg.get("do_lower_case", True),
                  tokenize_chinese_chars=tok_cfg.get("tokenize_chinese_chars", True),
                  strip_accents=tok_cfg.get("strip_accents"))
    backend = _bert_backend(backend, config, str(named["unk_token"]))
  elif json_padding is not None:
    named.setdefault("pad_token", json_padding["pad_token"])
  named = {k: named[k] for k in _NAMED_TOKENS if k in named}  # transformers' order
  _add_tokens_as_transformers(backend, named, added)
  if backend.get_vocab_size() > 100000 and backend.pre_tokenizer is not None:
    return None, "vocabularies over 100000 tokens may get transformers' Mistral regex patch"
  if kind == "bert":
    _set_bert_post_processor(backend, named)
  elif backend.post_processor is None:
    from tokenizers import processors  # pylint: disable=g-import-not-at-top
    # transformers' update_post_processor with no BOS/EOS: token types 0, then 1 for a pair.
    backend.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1",
                                                           special_tokens=[])
  # The class save_pretrained writes: the folder's own name for the class loaded here, else the
  # name transformers 4 and 5 both load as that class.
  declared = tok_cfg.get("tokenizer_class")
  if kind == "bert":
    cls_name = declared if declared in ("BertTokenizer", "BertTokenizerFast") else "BertTokenizer"
  else:
    cls_name = "TokenizersBackend" if declared == "TokenizersBackend" else "PreTrainedTokenizerFast"
  max_len = tok_cfg["model_max_length"] if "model_max_length" in tok_cfg else tok_cfg.get("max_len")
  return FastTokenizer(
      backend, {k: None if v is None else str(v) for k, v in named.items()},
      model_input_names=tok_cfg.get("model_input_names", _MODEL_INPUTS[kind]),
      model_max_length=max_len,
      padding_side=tok_cfg.get("padding_side", (json_padding or {}).get("direction", "right")),
      truncation_side=tok_cfg.get("truncation_side",
                                  (json_truncation or {}).get("direction", "right")),
      split_special_tokens=tok_cfg.get("split_special_tokens", False),
      clean_up_tokenization_spaces=tok_cfg.get("clean_up_tokenization_spaces", False),
      clean_up_bpe=tok_cfg.get(
          "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False),
      tokenizer_class=cls_name, config=config, name_or_path=str(path)), ""


def _bert_backend(source, cfg: Dict[str, Any], unk_token: str):
  """The backend transformers' BertTokenizer builds in place of tokenizer.json's: a WordPiece
  model on tokenizer.json's vocabulary (default "##" prefix and 100-character word limit), a
  BertNormalizer set by tokenizer_config.json's do_lower_case, tokenize_chinese_chars and
  strip_accents, BERT pre-tokenisation and decoding; no added tokens yet."""
  from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers  # pylint: disable=g-import-not-at-top
  tok = Tokenizer(models.WordPiece(source.get_vocab(with_added_tokens=False), unk_token=unk_token))
  tok.normalizer = normalizers.BertNormalizer(
      clean_text=True, handle_chinese_chars=cfg["tokenize_chinese_chars"],
      strip_accents=cfg["strip_accents"], lowercase=cfg["do_lower_case"])
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece(prefix="##")
  return tok


def _set_bert_post_processor(backend, named: Dict[str, Any]) -> None:
  """BertTokenizer's template: [CLS] A [SEP] (types 0), then B [SEP] (types 1) for a pair."""
  from tokenizers import processors  # pylint: disable=g-import-not-at-top
  cls, sep = str(named["cls_token"]), str(named["sep_token"])
  unk_id = backend.token_to_id(str(named["unk_token"]))
  ids = []
  for token, fallback in ((cls, 2), (sep, 3)):
    index = backend.token_to_id(token)
    index = unk_id if index is None else index  # transformers' convert_tokens_to_ids
    ids.append(fallback if index is None else index)
  backend.post_processor = processors.TemplateProcessing(
      single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
      special_tokens=[(cls, ids[0]), (sep, ids[1])])


def _add_tokens_as_transformers(backend, named: Dict[str, Any], added: Dict[int, Any]) -> None:
  """Add to `backend` what transformers' TokenizersBackend.__init__ adds: every entry of the
  folder's added-tokens table in id order (5.24 checks the table against the ids of the
  backend's added tokens, which never equal a token, so all are passed; tokenizers ignores exact
  repeats and updates changed flags), then each named special token whose text is in neither,
  as a special token. A token already in the vocabulary keeps its id but is then matched before
  normalisation, so this changes how "[CLS]" written in a text encodes."""
  from tokenizers import AddedToken  # pylint: disable=g-import-not-at-top
  to_add = [t for _, t in sorted(added.items())]
  present = ({t.content for t in backend.get_added_tokens_decoder().values()}
             | {str(t) for t in to_add})
  for value in named.values():
    if value is not None and str(value) not in present and value not in to_add:
      to_add.append(value)
  named_text = {str(v) for v in named.values() if v}
  tokens = []
  for token in to_add:
    if isinstance(token, str):
      token = AddedToken(token, special=True)
    elif not token.special and str(token) in named_text:
      token.special = True
    tokens.append(token)
  if tokens:
    backend.add_tokens(tokens)


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
  _add_tokens_as_transformers(tok, named, {})
  fast = FastTokenizer(tok, named)
  if out_dir is not None:
    fast.save_pretrained(out_dir)
  return fast
