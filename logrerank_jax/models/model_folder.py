"""The model folder: save and load a trained model (params via orbax, model config JSON, tokenizer).

The one home of this layout; the trainer writes it, and inference and the converter read and
write it through these functions.

Layout of a model folder:
  params/              orbax StandardCheckpointer tree {"local": ..., "global": ...}
  model_config.json    `LoGConfig` (see `logrerank_jax.models.config_io`)
  tokenizer/           HF tokenizer files (`save_pretrained`)
  info.json            free-form provenance (stage, step, metrics)

The folder is written under a temporary name and renamed when complete, so an interrupted save
leaves any previous model folder intact and never a half-written one.
"""

import json
import os
import shutil
from typing import Any, Dict, Optional, Tuple

import jax
import numpy as np
import orbax.checkpoint as ocp

from logrerank_jax.data.tokenization import load_tokenizer
from logrerank_jax.errors import CheckpointError, LogRerankError
from logrerank_jax.models.config_io import load_log_config, save_log_config


def _recover_interrupted_save(directory: str) -> None:
  """Undo what a save killed mid-way (kill -9, power loss) left behind, before the next save."""
  old = directory + ".old"
  if not os.path.exists(old):
    return
  if os.path.exists(directory):
    # Killed after the new folder landed, while deleting the previous one: finish the delete
    # (otherwise the next save's rename of `directory` onto the non-empty `.old` fails).
    shutil.rmtree(old)
  else:
    # Killed between the two renames: the previous, complete model is `.old`; put it back.
    os.replace(old, directory)


def _this_process_checkpointer() -> ocp.StandardCheckpointer:
  """Return a checkpointer whose barriers involve this process only.

  Model folders are written and read by one process (the caller decides which); orbax's default
  cross-process barriers would make a multi-host run wait for peers that never call it.
  """
  me = jax.process_index()
  return ocp.StandardCheckpointer(multiprocessing_options=ocp.options.MultiprocessingOptions(
      primary_host=me, active_processes={me}))


def save_model(directory: str, params: Dict[str, Any], cfg, tokenizer,
               info: Optional[Dict[str, Any]] = None) -> None:
  """Write a model folder atomically.

  Args:
    directory: destination folder (replaced if it exists).
    params: the `LoGReranker` param tree ({"local": ...} and optionally "global").
    cfg: its `LoGConfig`.
    tokenizer: the fast tokenizer (or None to skip).
    info: JSON-serialisable provenance.
  """
  directory = os.path.abspath(directory)
  _recover_interrupted_save(directory)
  tmp = directory + ".tmp-save"
  if os.path.exists(tmp):
    shutil.rmtree(tmp)
  os.makedirs(tmp)
  params = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), params)
  # `with` closes the checkpointer (its async executor and metadata store) now instead of
  # leaving it to the garbage collector (an unclosed orbax object finalised after its asyncio
  # loop closed reports "Event loop is closed"; see training/checkpoints.py).
  with _this_process_checkpointer() as ckptr:
    ckptr.save(os.path.join(tmp, "params"), params)
    ckptr.wait_until_finished()
  save_log_config(os.path.join(tmp, "model_config.json"), cfg)
  if tokenizer is not None:
    tokenizer.save_pretrained(os.path.join(tmp, "tokenizer"))
  with open(os.path.join(tmp, "info.json"), "w", encoding="utf-8") as f:
    json.dump(info or {}, f, indent=2, sort_keys=True)
  old = directory + ".old"
  if os.path.exists(directory):
    os.replace(directory, old)
  os.replace(tmp, directory)
  if os.path.exists(old):
    shutil.rmtree(old)


def load_model(directory: str, need_tokenizer: bool = True) -> Tuple[Dict[str, Any], Any, Any]:
  """Read a model folder written by `save_model`.

  Args:
    directory: the model folder.
    need_tokenizer: raise if the folder has no tokenizer.

  Returns:
    `(params, cfg, tokenizer)`; tokenizer is None when absent and not needed.
  """
  directory = os.path.abspath(directory)
  if not os.path.exists(directory) and os.path.isdir(directory + ".old"):
    # A save killed between its two renames left the previous, complete model at `.old`;
    # read it there (read-only: the writer's next save puts it back).
    directory += ".old"
  for name in ("params", "model_config.json"):
    if not os.path.exists(os.path.join(directory, name)):
      raise CheckpointError(f"{directory} is not a model folder: it has no {name}")
  cfg = load_log_config(os.path.join(directory, "model_config.json"))
  try:
    with _this_process_checkpointer() as ckptr:
      params = ckptr.restore(os.path.join(directory, "params"))
  except Exception as e:  # pylint: disable=broad-except  (orbax/tensorstore raise many types)
    raise CheckpointError(f"{directory}/params: cannot restore ({_first_line(e)})") from None
  params = jax.tree_util.tree_map(np.asarray, params)
  tok_dir = os.path.join(directory, "tokenizer")
  tokenizer = None
  if os.path.isdir(tok_dir):
    try:
      tokenizer = load_tokenizer(tok_dir)
    except LogRerankError:
      raise
    except Exception as e:  # pylint: disable=broad-except  (tokenizers raise plain Exception)
      raise CheckpointError(f"{tok_dir}: cannot load tokenizer ({_first_line(e)})") from None
  elif need_tokenizer:
    raise CheckpointError(f"{directory} has no tokenizer/ folder")
  return params, cfg, tokenizer


def resolve_model_dir(path: str) -> str:
  """Return the model folder of `path`: `path` itself, or `path/model` for a training workdir.

  Raises:
    CheckpointError: neither holds a `model_config.json`.
  """
  for cand in (path, os.path.join(path, "model")):
    if os.path.isfile(os.path.join(cand, "model_config.json")):
      return cand
  raise CheckpointError(f"{path} is neither a model folder (model_config.json, params/, "
                        "tokenizer/) nor a training workdir containing model/")


def read_info(directory: str) -> Dict[str, Any]:
  """Return the provenance JSON of a model folder ({} if absent)."""
  path = os.path.join(directory, "info.json")
  if not os.path.exists(path):
    return {}
  try:
    with open(path, encoding="utf-8") as f:
      info = json.load(f)
  except (OSError, ValueError, RecursionError) as e:  # ValueError: bad JSON or not UTF-8
    raise CheckpointError(f"{path}: cannot read ({_first_line(e)})") from None
  if not isinstance(info, dict):
    raise CheckpointError(f"{path}: expected a JSON object, got {type(info).__name__}")
  return info


def _first_line(e: BaseException) -> str:
  """Name an exception in one line (library errors must be one line)."""
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__
