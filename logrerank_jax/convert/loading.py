"""Load PyTorch checkpoints into NumPy: safetensors, or weights-only pickles; never runs code."""

import json
import os
import pathlib
import struct
from typing import Dict, Mapping, Tuple, Union

import numpy as np

from logrerank_jax.errors import CheckpointError

PathLike = Union[str, os.PathLike]
StateDict = Dict[str, np.ndarray]

# Folder layouts tried in order, as `transformers` does: safetensors first.
_SAFETENSORS_INDEX = "model.safetensors.index.json"
_SAFETENSORS_FILE = "model.safetensors"
_TORCH_INDEX = "pytorch_model.bin.index.json"
_TORCH_FILE = "pytorch_model.bin"
_TORCH_SUFFIXES = (".bin", ".pt", ".pth")

# safetensors dtype tags that NumPy reads natively (safetensors' own numpy backend handles these).
_NUMPY_SAFETENSORS_DTYPES = frozenset(
    {"F64", "F32", "F16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL"})


def load_torch_state_dict(path: PathLike) -> StateDict:
  """Load a PyTorch checkpoint file or Hugging Face folder into a flat NumPy state dict.

  Accepted inputs: a `.safetensors` file; a `.bin`/`.pt`/`.pth` file; a shard index
  (`*.index.json`); or a folder holding `model.safetensors`, sharded
  `model-0000x-of-0000y.safetensors` + `model.safetensors.index.json`, `pytorch_model.bin`, or
  sharded `pytorch_model-*.bin` + `pytorch_model.bin.index.json` (tried in that order).

  Floating-point tensors keep their precision, except bfloat16 (which NumPy cannot hold): those
  are widened to float32 exactly (every bf16 value is representable in float32). Pickled
  checkpoints are read only through `torch.load(..., weights_only=True)`, which refuses any
  pickle that would import or call code; such a file raises `CheckpointError` and its code never
  runs. torch itself is imported only when a pickled checkpoint is read.

  Args:
    path: a checkpoint file, a shard index file, or a folder containing one.

  Returns:
    `{tensor name: np.ndarray}` in the checkpoint's own key naming.

  Raises:
    CheckpointError: the path is missing or holds no known checkpoint; a shard named by the index
      is missing; a key appears in more than one shard or is absent from its shard; the file is
      unreadable or unsafe; torch is needed but not installed.
  """
  path = pathlib.Path(path)
  if not path.exists():
    raise CheckpointError(f"checkpoint path does not exist: {path}")
  if path.is_dir():
    return _load_folder(path)
  return _load_file(path)


def _load_folder(folder: pathlib.Path) -> StateDict:
  """Load the checkpoint a Hugging Face model folder holds."""
  for name in (_SAFETENSORS_INDEX, _SAFETENSORS_FILE, _TORCH_INDEX, _TORCH_FILE):
    candidate = folder / name
    if candidate.is_file():
      return _load_file(candidate)
  raise CheckpointError(
      f"no checkpoint in folder {folder}: looked for {_SAFETENSORS_INDEX}, {_SAFETENSORS_FILE}, "
      f"{_TORCH_INDEX}, {_TORCH_FILE}")


def _load_file(path: pathlib.Path) -> StateDict:
  """Dispatch one file on its suffix."""
  name = path.name
  if name.endswith(".index.json"):
    return _load_sharded(path)
  if name.endswith(".safetensors"):
    return _load_safetensors(path)
  if name.endswith(_TORCH_SUFFIXES):
    return _load_torch_pickle(path)
  raise CheckpointError(
      f"unknown checkpoint format for {path}: expected .safetensors, .bin, .pt, .pth or "
      "*.index.json")


def _load_sharded(index_path: pathlib.Path) -> StateDict:
  """Load every shard an index names, checking the shards against the index."""
  try:
    with open(index_path, encoding="utf-8") as f:
      index = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise CheckpointError(f"unreadable shard index {index_path}: {e}") from e
  weight_map = index.get("weight_map") if isinstance(index, dict) else None
  if not isinstance(weight_map, dict) or not weight_map:
    raise CheckpointError(
        f"shard index {index_path} has no 'weight_map' of tensor name -> shard file")

  shard_names = sorted(set(weight_map.values()))
  # Shards live next to the index; a path that leaves the folder is not a shard name.
  escaping = [s for s in shard_names
              if not isinstance(s, str) or pathlib.PurePath(s).name != s or s in ("", ".", "..")]
  if escaping:
    raise CheckpointError(f"shard index {index_path} names invalid shard file(s): {escaping}")
  missing_shards = [s for s in shard_names if not (index_path.parent / s).is_file()]
  if missing_shards:
    raise CheckpointError(f"shard index {index_path} names missing shard file(s): {missing_shards}")

  merged: StateDict = {}
  origin: Dict[str, str] = {}
  duplicates = []
  for shard in shard_names:
    tensors = _load_file(index_path.parent / shard)
    for key, value in tensors.items():
      if key in merged:
        duplicates.append(f"{key} (in {origin[key]} and {shard})")
        continue
      merged[key] = value
      origin[key] = shard
  if duplicates:
    raise CheckpointError(f"key(s) present in more than one shard of {index_path}: {duplicates}")
  absent = [f"{k} (index says {s})" for k, s in sorted(weight_map.items()) if origin.get(k) != s]
  if absent:
    raise CheckpointError(f"key(s) listed in {index_path} are not in their shard: {absent}")
  return merged


def _load_safetensors(path: pathlib.Path) -> StateDict:
  """Read a safetensors file with the safetensors library; bf16 tensors are widened to float32."""
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top

  try:
    header, data_start = _safetensors_header(path)
    out: StateDict = {}
    with safe_open(str(path), framework="numpy") as f:
      for key in f.keys():
        dtype = header[key]["dtype"]
        if dtype in _NUMPY_SAFETENSORS_DTYPES:
          out[key] = np.asarray(f.get_tensor(key))
        elif dtype == "BF16":
          out[key] = _read_bf16_as_f32(path, header[key], data_start)
        else:
          raise CheckpointError(f"tensor {key!r} in {path} has unsupported dtype {dtype}")
    return out
  except CheckpointError:
    raise
  except Exception as e:  # safetensors raises its own SafetensorError and OSError subclasses.
    raise CheckpointError(f"unreadable safetensors file {path}: {e}") from e


def _safetensors_header(path: pathlib.Path) -> Tuple[dict, int]:
  """Return a safetensors file's JSON header and the byte offset where tensor data starts."""
  # Layout: 8-byte little-endian header length, the JSON header, then the raw tensor bytes.
  with open(path, "rb") as f:
    (length,) = struct.unpack("<Q", f.read(8))
    header = json.loads(f.read(length))
  header.pop("__metadata__", None)
  return header, 8 + length


def _read_bf16_as_f32(path: pathlib.Path, entry: dict, data_start: int) -> np.ndarray:
  """Widen one bf16 tensor to float32 by placing its 16 bits in the high half of a float32."""
  begin, end = entry["data_offsets"]
  shape = tuple(entry["shape"])
  with open(path, "rb") as f:
    f.seek(data_start + begin)
    raw = np.frombuffer(f.read(end - begin), dtype="<u2")
  return (raw.astype(np.uint32) << 16).view(np.float32).reshape(shape)


def _load_torch_pickle(path: pathlib.Path) -> StateDict:
  """Read a torch pickle with `weights_only=True`; anything carrying code is refused."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise CheckpointError(
        f"reading {path} needs PyTorch (pickled checkpoint); install torch or convert the "
        "checkpoint to .safetensors") from e
  try:
    # weights_only=True is explicit, so TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD cannot switch it off.
    obj = torch.load(str(path), map_location="cpu", weights_only=True)
  except Exception as e:  # pylint: disable=broad-except
    # UnpicklingError for unsafe globals; RuntimeError / EOFError for corrupt files.
    first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise CheckpointError(
        f"refused to load {path}: not a weights-only PyTorch checkpoint ({first_line})") from e
  if not isinstance(obj, Mapping):
    raise CheckpointError(f"{path} holds a {type(obj).__name__}, not a state dict of tensors")
  out: StateDict = {}
  bad = []
  for key, value in obj.items():
    if not isinstance(value, torch.Tensor):
      bad.append(f"{key} ({type(value).__name__})")
      continue
    value = value.detach().cpu()
    if value.dtype == torch.bfloat16:
      value = value.float()  # NumPy has no bf16; float32 holds every bf16 value exactly.
    out[str(key)] = value.numpy().copy()
  if bad:
    raise CheckpointError(f"{path} has non-tensor entries: {bad}")
  return out
