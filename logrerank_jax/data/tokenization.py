"""Tokenizers of HF checkpoint folders without transformers.

`load_tokenizer` returns a `FastTokenizer` (`fast_tokenizer.py`): a Rust `tokenizers.Tokenizer`
with the part of transformers' fast-tokenizer API the library calls (`tokenizer(texts, ...)`, the
special-token ids, `len`, `save_pretrained`). Importing transformers imports torch where it is
installed, about 5 CPU-seconds per process, paid by every CLI start and every test subprocess for
nothing: the ids come from the Rust tokenizer either way. What transformers (5.24, read from its
source) does to a folder's `tokenizer.json` on top (the class `AutoTokenizer` picks,
`BertTokenizer` rebuilding the backend from the vocabulary and `tokenizer_config.json`, the added
and special tokens it adds, the defaults of a call) is repeated here, so ids, token types, offsets
and special-token ids are the same as `AutoTokenizer.from_pretrained(folder)`'s
(tests/test_tokenization.py compares them). A folder this module cannot mirror (another tokenizer
class, remote code, a setting transformers reads that is not repeated here, no `tokenizer.json`)
is loaded by transformers as before, with a warning naming the reason.

Encoding many texts into one flat array of token ids is `encoding.encode_texts`; training a small
WordPiece tokenizer is offline work (`logrerank_jax.datasets.wordpiece`).
"""

import json
import logging
import os
from typing import Any, Dict, Optional, Tuple

from logrerank_jax.data.fast_tokenizer import MODEL_INPUTS, NAMED_TOKENS, FastTokenizer
from logrerank_jax.errors import CheckpointError

log = logging.getLogger(__name__)

# BertTokenizer's defaults for tokens tokenizer_config.json leaves out (its __init__ signature).
_BERT_DEFAULT_TOKENS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                        "cls_token": "[CLS]", "mask_token": "[MASK]"}
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
    if (key.endswith("_token") and key not in NAMED_TOKENS
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
  named = {k: _added_token(tok_cfg[k]) for k in NAMED_TOKENS if k in tok_cfg}
  if "added_tokens_decoder" in tok_cfg:
    added = {int(i): AddedToken(**t) for i, t in tok_cfg["added_tokens_decoder"].items()}
  else:
    # transformers' path for configs without the table: special_tokens_map.json's tokens replace
    # the config's, and the table is the added tokens of tokenizer.json (and added_tokens.json).
    if os.path.exists(os.path.join(path, "added_tokens.json")):
      return None, "the folder has a legacy added_tokens.json"
    for key, value in _read_json(os.path.join(path, "special_tokens_map.json")).items():
      if key in NAMED_TOKENS:
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
  named = {k: named[k] for k in NAMED_TOKENS if k in named}  # transformers' order
  add_tokens_as_transformers(backend, named, added)
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
      model_input_names=tok_cfg.get("model_input_names", MODEL_INPUTS[kind]),
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


def add_tokens_as_transformers(backend, named: Dict[str, Any], added: Dict[int, Any]) -> None:
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
