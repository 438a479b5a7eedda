"""Compiled executables kept on disk, for a server's fast restart.

JAX's persistent cache saves the XLA compilation, but each restart still traces and lowers
every program to find its cache key: 0.5 s a program on 2 idle cores, 37 programs for a
MiniLM model's default buckets, 20 s a restart (docs/SERVING.md). This store saves each compiled
executable (`jax.experimental.serialize_executable`) under a key of everything that decides the
program, and a restart loads it without tracing (0.06 s a program; the restart takes 4.4 s).

The key: the (stage, input shapes) of the call, the model config, the final-score map, the
param tree's shapes and dtypes, the device platform, kinds and ids, the jax and jaxlib versions,
XLA's flags and optimisation level, and a hash of the package source the programs run (a
changed model code is a new program). Params are an argument of every program, never a
constant, so new weights of the same shapes reuse it.

JAX's persistent cache is off in a process that stores (`server_store`): on XLA:CPU an
executable that JAX loaded from its own cache serializes without part of its code, and the copy
fails when it runs ("Function ... not found"); the engine stores only programs it compiled.
The store replaces that cache for the server's programs.

Loading an executable runs code from the folder: it lives inside the compilation cache folder,
private to its user (created 0o700), as JAX's own cache does.
A file that cannot be read or loaded is treated as a miss (compiled, and written again).
"""

import functools
import hashlib
import logging
import os
import pickle
from typing import Any, Optional

import jax
import jaxlib

log = logging.getLogger(__name__)

SUBDIR = "logrerank-executables"
# Part of every key: a file written under an older layout (or by the bug above) is never read.
_FORMAT = 2


# The code the jitted programs run (`engine.device`'s stages call the model, which builds the
# graph); an edit elsewhere (the server, the CLI, training) changes no program.
_PROGRAM_SOURCES = ("models", "graph", os.path.join("engine", "device.py"), "schema.py",
                    "ranking.py", "losses.py")


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
  """A hash of the package source the programs come from (`_PROGRAM_SOURCES`)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  paths = []
  for part in _PROGRAM_SOURCES:
    full = os.path.join(root, part)
    if os.path.isfile(full):
      paths.append(full)
    for dirpath, _, filenames in os.walk(full):
      paths += [os.path.join(dirpath, n) for n in filenames if n.endswith(".py")]
  h = hashlib.sha256()
  for path in sorted(paths):
    h.update(os.path.relpath(path, root).encode())
    with open(path, "rb") as f:
      h.update(f.read())
  return h.hexdigest()


class ExecutableStore:
  """Serialized executables of one engine's programs in `directory` (see the module doc)."""

  def __init__(self, directory: str):
    self.directory = directory
    if not os.path.isdir(directory):
      os.makedirs(directory, mode=0o700)
      os.chmod(directory, 0o700)  # makedirs' mode is masked by the umask
    self.loaded = 0
    self.saved = 0

  def _path(self, engine, key: tuple) -> str:
    params = jax.tree_util.tree_map(lambda x: (tuple(x.shape), str(x.dtype)), engine.params)
    devices = [(d.platform, getattr(d, "device_kind", ""), d.id) for d in engine.devices]
    # XLA's flags and optimisation level change the code compiled, not the program traced.
    compiler = (os.environ.get("XLA_FLAGS", ""),
                [jax.config.values.get(k) for k in ("jax_disable_most_optimizations",
                                                     "jax_optimization_level",
                                                     "jax_exec_time_optimization_effort")])
    parts = (_FORMAT, key, repr(engine.cfg), engine.score_map, repr(params), devices, jax.__version__,
             jaxlib.__version__, source_hash(), compiler)
    return os.path.join(self.directory, hashlib.sha256(repr(parts).encode()).hexdigest() + ".bin")

  def load(self, engine, key: tuple) -> Optional[Any]:
    """The stored executable of `key` for `engine`, loaded onto its devices; None on a miss."""
    from jax.experimental import serialize_executable  # pylint: disable=g-import-not-at-top
    path = self._path(engine, key)
    if not os.path.exists(path):
      return None
    try:
      with open(path, "rb") as f:
        payload, in_tree, out_tree = pickle.load(f)
      exe = serialize_executable.deserialize_and_load(payload, in_tree, out_tree,
                                                      execution_devices=engine.devices)
    except Exception as e:  # pylint: disable=broad-except  (a torn or stale file: compile)
      log.warning("stored executable %s not loaded (%s: %s); compiling", os.path.basename(path),
                  type(e).__name__, e)
      return None
    self.loaded += 1
    return exe

  def save(self, engine, key: tuple, exe) -> None:
    """Write `exe` (atomically: a temp file renamed); a failure only logs (the next start
    compiles it again)."""
    from jax.experimental import serialize_executable  # pylint: disable=g-import-not-at-top
    path = self._path(engine, key)
    try:
      blob = pickle.dumps(serialize_executable.serialize(exe))
      tmp = f"{path}.{os.getpid()}.tmp"
      with open(tmp, "wb") as f:
        f.write(blob)
      os.replace(tmp, path)
    except Exception as e:  # pylint: disable=broad-except
      log.warning("executable not stored (%s: %s)", type(e).__name__, e)
      return
    self.saved += 1


def server_store(cache_dir: str) -> ExecutableStore:
  """The store of a server whose cache folder is `cache_dir` (in `SUBDIR`), with JAX's own
  persistent cache turned off for this process (module docstring). Call it before the
  process's first compilation: JAX decides once whether its cache is used."""
  jax.config.update("jax_enable_compilation_cache", False)
  cache_dir = os.path.abspath(os.path.expanduser(cache_dir))
  if not os.path.isdir(cache_dir):
    os.makedirs(cache_dir, mode=0o700)
    os.chmod(cache_dir, 0o700)
  return ExecutableStore(os.path.join(cache_dir, SUBDIR))
