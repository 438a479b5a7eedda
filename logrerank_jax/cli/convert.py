"""Convert PyTorch checkpoints to logrerank_jax model folders, and back (see docs/CHECKPOINTS.md).

  # HF ModernBERT or BERT-family folder (e.g. gte-reranker-modernbert-base, all-MiniLM-L6-v2,
  # a BertForSequenceClassification cross-encoder) -> cross-encoder / encoder folder
  logrerank convert --hf-model HF_DIR --output OUT [--tokenizer DIR]
  # full LoG-Reranker torch checkpoint -> model folder that `logrerank rerank` loads
  logrerank convert --log-checkpoint CKPT --log-config model_config.json \
      --tokenizer HF_DIR --output OUT [--rename-table rename.json]
  # model folder -> model.safetensors + model_config.json (+ tokenizer/)
  logrerank convert --to-torch MODEL_DIR --output OUT [--rename-table rename.json]

Every output is written under a temporary name next to OUT and renamed into place when complete,
so an interrupted conversion leaves no half-written output. An existing OUT is refused unless
`--overwrite`. Pickled checkpoints are read with `torch.load(weights_only=True)` only.
`python tools/convert_torch.py ARGS` runs this command too (same flags, outputs and exit status).
"""

import argparse
import json
import os
import sys
from typing import Any, Dict, Optional, Tuple

from logrerank_jax.cli.atomic_files import write_atomically
from logrerank_jax.errors import CheckpointError, ConfigError, LogRerankError

# The converters (torch, JAX, Orbax) are imported by the functions that run them: `--help` and a
# bad flag answer without loading JAX.

CROSS_ENCODER_FORMAT = "logrerank_jax.cross_encoder/1"


def _save_tokenizer(tokenizer_dir: Optional[str], fallback: Optional[str], dest: str):
  """Copy a HF tokenizer (`load_tokenizer`: the same ids as transformers) into `dest`; return it,
  or None if absent."""
  from logrerank_jax.data.tokenization import load_tokenizer
  src = tokenizer_dir or fallback
  if src is None:
    return None
  if tokenizer_dir is None and not any(
      os.path.exists(os.path.join(src, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
    return None  # the HF folder has no tokenizer and none was asked for
  tok = load_tokenizer(src)
  tok.save_pretrained(dest)
  return tok


def _save_params(path: str, params) -> None:
  """Write a param tree with orbax's StandardCheckpointer (float32 leaves)."""
  import jax
  import numpy as np
  import orbax.checkpoint as ocp
  params = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), params)
  ckptr = ocp.StandardCheckpointer()
  ckptr.save(path, params)
  ckptr.wait_until_finished()


def _convert_modernbert(hf_dir: str, sd, cfg) -> Tuple[Dict[str, Any], bool]:
  """(params, has classifier) of a ModernBERT state dict."""
  from logrerank_jax.convert import (modernbert_params_from_torch,
                                     sequence_classifier_params_from_torch)
  from logrerank_jax.convert.modernbert_map import ENCODER_TORCH_PREFIX, HEAD_MODULES
  bare = {k[len(ENCODER_TORCH_PREFIX):] if k.startswith(ENCODER_TORCH_PREFIX) else k for k in sd}
  with_head = any(k.split(".", 1)[0] in ("head", "classifier") for k in bare)
  if with_head:
    return sequence_classifier_params_from_torch(sd, cfg), True
  if any(k.split(".", 1)[0] in HEAD_MODULES for k in bare):
    raise CheckpointError(f"{hf_dir} holds a ModernBERT task head other than sequence "
                          "classification (e.g. a masked-LM decoder); only the encoder or a "
                          "ModernBertForSequenceClassification checkpoint converts")
  return {"model": modernbert_params_from_torch(sd, cfg)}, False


def _convert_bert(hf_dir: str, sd, cfg) -> Tuple[Dict[str, Any], bool]:
  """(params, has classifier) of a BERT-family state dict (the pooler of a bare encoder is
  dropped: the LoG encoder and `BertEncoder` have none)."""
  from logrerank_jax.convert import bert_params_from_torch, bert_sequence_classifier_params_from_torch
  from logrerank_jax.convert.bert_map import BERT_HEAD_MODULES, BERT_TORCH_PREFIXES

  def bare(k):
    for prefix in BERT_TORCH_PREFIXES:
      if k.startswith(prefix):
        return k[len(prefix):]
    return k
  tops = {bare(k).split(".", 1)[0] for k in sd}
  if "classifier" in tops:
    if cfg.model_type != "bert":
      raise CheckpointError(f"{hf_dir}: a {cfg.model_type} classification head does not convert "
                            "(only BertForSequenceClassification's pooler + linear head)")
    return bert_sequence_classifier_params_from_torch(sd, cfg), True
  other = sorted(tops & set(BERT_HEAD_MODULES))
  if other:
    raise CheckpointError(f"{hf_dir} holds a BERT task head other than sequence classification "
                          f"({other}); only the encoder or a BertForSequenceClassification "
                          "checkpoint converts")
  return {"model": bert_params_from_torch(sd, cfg)}, False


def convert_hf_model(hf_dir: str, output: str, tokenizer_dir: Optional[str] = None,
                     overwrite: bool = False) -> Dict[str, Any]:
  """Convert an HF ModernBERT or BERT-family folder into a cross-encoder folder.

  The family comes from config.json's `model_type` (modernbert; bert / roberta / xlm-roberta;
  a sentence-transformers folder has config.json at its root). Layout: `params/` (orbax),
  `config.json` (HF-style, read back by the family's `from_hf`), `tokenizer/`, `info.json`
  (`family`: "modernbert" or "bert"). `params/` holds:
    ModernBERT: `{"model": encoder, "head": ..., "classifier": ...}` for a
      ModernBertForSequenceClassification checkpoint, `{"model": encoder}` for a bare encoder;
    BERT: `{"bert": encoder, "pooler": ..., "classifier": ...}` (`BertSequenceClassifier`) for a
      BertForSequenceClassification checkpoint, `{"model": encoder}` (`BertEncoder`, no pooler)
      for a bare encoder.

  Args:
    hf_dir: the HF folder (config.json + model.safetensors / pytorch_model.bin, sharded or not).
    output: destination folder.
    tokenizer_dir: tokenizer folder; default the HF folder's own tokenizer (if it has one).
    overwrite: replace an existing output.

  Returns:
    The info dict written to info.json.
  """
  from logrerank_jax.convert import load_torch_state_dict
  from logrerank_jax.models.local_scorer import encoder_config_from_hf, encoder_family
  cfg = encoder_config_from_hf(hf_dir)
  family = encoder_family(cfg)
  sd = load_torch_state_dict(hf_dir)
  params, with_head = (_convert_modernbert if family == "modernbert" else _convert_bert)(
      hf_dir, sd, cfg)
  info = {"format": CROSS_ENCODER_FORMAT, "source": os.path.abspath(hf_dir), "family": family,
          "has_classifier": with_head, "num_labels": cfg.num_labels if with_head else None,
          "classifier_pooling": getattr(cfg, "classifier_pooling", "cls")}

  def fill(tmp):
    _save_params(os.path.join(tmp, "params"), params)
    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
      json.dump(cfg.to_hf_dict(), f, indent=2, sort_keys=True)
    info["has_tokenizer"] = _save_tokenizer(tokenizer_dir, hf_dir,
                                            os.path.join(tmp, "tokenizer")) is not None
    with open(os.path.join(tmp, "info.json"), "w", encoding="utf-8") as f:
      json.dump(info, f, indent=2, sort_keys=True)

  write_atomically(output, fill, overwrite)
  return info


def load_cross_encoder_folder(path: str) -> Tuple[Dict[str, Any], Any, Any]:
  """Read a folder written by `convert_hf_model`.

  Args:
    path: the folder.

  Returns:
    `(params, encoder config, tokenizer or None)`; the config is a `ModernBertConfig` or a
    `BertConfig` (from config.json's `model_type`). Without a classifier `params["model"]` are
    the encoder's params (local-stage encoder initialisation); with one the whole tree is the
    family's sequence-classifier params (`logrerank_jax.baselines.CrossEncoder(params, cfg,
    tokenizer)`).
  """
  import jax
  import numpy as np
  import orbax.checkpoint as ocp
  from logrerank_jax.data.tokenization import load_tokenizer
  from logrerank_jax.models.local_scorer import encoder_config_from_hf
  info_path = os.path.join(path, "info.json")
  try:
    with open(info_path, encoding="utf-8") as f:
      info = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise CheckpointError(f"{path} is not a converted cross-encoder folder ({e})") from None
  if info.get("format") != CROSS_ENCODER_FORMAT:
    raise CheckpointError(f"{info_path}: format {info.get('format')!r}, expected "
                          f"{CROSS_ENCODER_FORMAT!r}")
  cfg = encoder_config_from_hf(os.path.join(path, "config.json"))
  params = ocp.StandardCheckpointer().restore(os.path.abspath(os.path.join(path, "params")))
  params = jax.tree_util.tree_map(np.asarray, params)
  tok_dir = os.path.join(path, "tokenizer")
  return params, cfg, (load_tokenizer(tok_dir) if os.path.isdir(tok_dir) else None)


def convert_log_checkpoint(checkpoint: str, config_path: str, tokenizer_dir: str, output: str,
                           rename=None, overwrite: bool = False) -> Dict[str, Any]:
  """Convert a full LoG-Reranker torch checkpoint into an `export.save_model` model folder.

  Args:
    checkpoint: .safetensors / .bin / .pt file, shard index, or folder holding one.
    config_path: the model's `LoGConfig` JSON (`config_io.save_log_config` format).
    tokenizer_dir: HF tokenizer folder the model was trained with.
    output: destination model folder.
    rename: optional rename table (JSON path or object) for a differently-named checkpoint.
    overwrite: replace an existing output.

  Returns:
    The info dict written to info.json.
  """
  from logrerank_jax.convert import load_torch_state_dict, log_params_from_torch
  from logrerank_jax.data.tokenization import load_tokenizer
  from logrerank_jax.models.config_io import load_log_config
  from logrerank_jax.models.model_folder import save_model
  cfg = load_log_config(config_path)
  tokenizer = load_tokenizer(tokenizer_dir)
  if len(tokenizer) > cfg.local.encoder.vocab_size:
    raise ConfigError(f"tokenizer {tokenizer_dir} has {len(tokenizer)} tokens but the model's "
                      f"vocab_size is {cfg.local.encoder.vocab_size}")
  params = log_params_from_torch(load_torch_state_dict(checkpoint), cfg, rename=rename)
  info = {"stage": "converted", "source": os.path.abspath(checkpoint),
          "source_config": os.path.abspath(config_path)}

  def fill(tmp):
    # save_model writes (atomically) a folder of its own; build it inside our temp folder and
    # lift its entries up, so OUT appears only once everything is written.
    inner = os.path.join(tmp, "model")
    save_model(inner, params, cfg, tokenizer, info)
    for name in os.listdir(inner):
      os.replace(os.path.join(inner, name), os.path.join(tmp, name))
    os.rmdir(inner)

  write_atomically(output, fill, overwrite)
  return info


def export_to_torch(model_dir: str, output: str, rename=None, overwrite: bool = False
                    ) -> Dict[str, Any]:
  """Write a model folder's params as a torch state dict: model.safetensors + model_config.json.

  Args:
    model_dir: a model folder (or a training workdir holding model/).
    output: destination folder; also receives the tokenizer (tokenizer/) when the model has one.
    rename: optional rename table applied to the output key names.
    overwrite: replace an existing output.

  Returns:
    `{"num_tensors", "num_params"}`.
  """
  import numpy as np
  import safetensors.numpy
  from logrerank_jax.convert import log_params_to_torch
  from logrerank_jax.models.config_io import save_log_config
  from logrerank_jax.models.model_folder import load_model
  if not os.path.isfile(os.path.join(model_dir, "model_config.json")) and os.path.isfile(
      os.path.join(model_dir, "model", "model_config.json")):
    model_dir = os.path.join(model_dir, "model")
  params, cfg, tokenizer = load_model(model_dir, need_tokenizer=False)
  sd = log_params_to_torch(params, cfg, rename=rename)

  def fill(tmp):
    safetensors.numpy.save_file(sd, os.path.join(tmp, "model.safetensors"),
                                metadata={"format": "pt"})
    save_log_config(os.path.join(tmp, "model_config.json"), cfg)
    if tokenizer is not None:
      tokenizer.save_pretrained(os.path.join(tmp, "tokenizer"))

  write_atomically(output, fill, overwrite)
  return {"num_tensors": len(sd), "num_params": int(sum(np.prod(v.shape) for v in sd.values()))}


def parse_args(argv=None, prog=None):
  """Parse the command line."""
  p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
  mode = p.add_mutually_exclusive_group(required=True)
  mode.add_argument("--hf-model", help="HF ModernBERT or BERT-family folder -> cross-encoder/encoder folder")
  mode.add_argument("--log-checkpoint", help="full LoG-Reranker torch checkpoint -> model folder")
  mode.add_argument("--to-torch", metavar="MODEL_DIR",
                    help="model folder -> model.safetensors + model_config.json")
  p.add_argument("--log-config", help="LoGConfig JSON of --log-checkpoint (model_config.json)")
  p.add_argument("--tokenizer", help="HF tokenizer folder (required with --log-checkpoint)")
  p.add_argument("--rename-table",
                 help="rename table JSON: {exact: {old: new}, regex: [[pattern, repl]]}")
  p.add_argument("--output", required=True, help="output folder (written atomically)")
  p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
  args = p.parse_args(argv)
  if args.log_checkpoint and not (args.log_config and args.tokenizer):
    p.error("--log-checkpoint needs --log-config and --tokenizer")
  if not args.log_checkpoint and args.log_config:
    p.error("--log-config only goes with --log-checkpoint")
  if args.hf_model and args.rename_table:
    p.error("--rename-table applies to --log-checkpoint and --to-torch")
  return args


def main(argv=None, prog=None) -> int:
  """Run the CLI; return the exit status."""
  args = parse_args(argv, prog)
  try:
    if args.hf_model:
      info = convert_hf_model(args.hf_model, args.output, args.tokenizer, args.overwrite)
      what = "cross-encoder" if info["has_classifier"] else "encoder"
    elif args.log_checkpoint:
      convert_log_checkpoint(args.log_checkpoint, args.log_config, args.tokenizer, args.output,
                             args.rename_table, args.overwrite)
      what = "LoG-Reranker model folder"
    else:
      info = export_to_torch(args.to_torch, args.output, args.rename_table, args.overwrite)
      what = f"torch state dict ({info['num_tensors']} tensors, {info['num_params']:,} params)"
  except LogRerankError as e:
    print(f"convert_torch: error: {type(e).__name__}: {e}", file=sys.stderr)
    return 1
  print(f"convert_torch: wrote {what} to {args.output}", file=sys.stderr)
  return 0

