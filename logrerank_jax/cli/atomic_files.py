"""Outputs that are never half-written: the commands write a temporary file or folder next to the
destination and rename it into place (`logrerank rerank`'s JSONL, `logrerank convert`'s folders).

  check_output_writable   fail before any work when the output's folder cannot be written
  write_jsonl_atomic      JSON lines through a temp file renamed over the output
  write_atomically        a whole folder through a temp folder; a previous output is parked
                          until the new one is in place (and put back by the next write if a
                          kill -9 came between the two renames)
"""

import json
import os
import shutil
import tempfile
from typing import Callable

from logrerank_jax.errors import ConfigError


def check_output_writable(path: str) -> None:
  """Create the output's folder and prove it writable (raises OSError naming the problem)."""
  folder = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(path):
    raise IsADirectoryError(f"--output {path} is a folder")
  os.makedirs(folder, exist_ok=True)
  fd, probe = tempfile.mkstemp(prefix=".tmp-probe-", dir=folder)
  os.close(fd)
  os.remove(probe)


def write_jsonl_atomic(path: str, objs) -> None:
  """Write JSON lines to a temp file next to `path`, then rename it over `path`."""
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".jsonl", dir=folder)
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      for obj in objs:
        # NaN can only come from echoing an input record that held it (scores are checked finite).
        f.write(json.dumps(obj, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def _recover_parked(output: str) -> None:
  """Put back a previous output parked by a write killed between its two renames (kill -9)."""
  parent, base = os.path.split(output)
  if os.path.exists(output) or not os.path.isdir(parent):
    return
  for name in sorted(os.listdir(parent)):
    parked = os.path.join(parent, name, "previous")
    if name.startswith(f".{base}.old-") and os.path.isdir(parked):
      os.replace(parked, output)
      shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
      return


def write_atomically(output: str, fill: Callable[[str], None], overwrite: bool = False) -> None:
  """Create folder `output` by letting `fill(tmp_dir)` write a temp folder, then renaming it.

  Args:
    output: destination folder.
    fill: writes the whole content into the folder it is given.
    overwrite: replace an existing `output` (the old one stays until the new one is complete).

  Raises:
    ConfigError: `output` exists and `overwrite` is False.
  """
  output = os.path.abspath(output)
  parent = os.path.dirname(output)
  _recover_parked(output)
  if os.path.exists(output) and not overwrite:
    raise ConfigError(f"output {output} exists; pass --overwrite to replace it")
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(output)}.tmp-", dir=parent)
  try:
    fill(tmp)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  if not os.path.exists(output):
    os.replace(tmp, output)
    return
  # Park the previous output until the new one is in place, and put it back if that fails.
  old = tempfile.mkdtemp(prefix=f".{os.path.basename(output)}.old-", dir=parent)
  parked = os.path.join(old, "previous")
  os.replace(output, parked)
  try:
    os.replace(tmp, output)
  except BaseException:
    os.replace(parked, output)
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  finally:
    shutil.rmtree(old, ignore_errors=True)
