"""XLA compilation: counting what a jitted function compiles, and the persistent cache.

`COUNTS` is fed by one `jax.monitoring` listener pair registered on first use
(`ensure_listeners`): `compiles` counts `/jax/core/compile/backend_compile_duration` events (one
per XLA executable built, including ones loaded from the persistent cache) and `cache_hits` the
`/jax/compilation_cache/cache_hits` events. A caller reads the counts before and after its own
calls. `enable_compilation_cache` turns on JAX's persistent cache in a private folder.
"""

import os
import threading

# JAX is imported inside the two functions that use it: the command-line flags read
# `DEFAULT_CACHE_ENV` and `default_compilation_cache_dir` for their help without loading it.

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
DEFAULT_CACHE_ENV = "LOGRERANK_JAX_COMPILATION_CACHE"

# Process-wide event counters, fed by one listener pair registered on first use.
COUNTS = {"compiles": 0, "cache_hits": 0}
_LISTENER_LOCK = threading.Lock()
_LISTENING = False


def ensure_listeners() -> None:
  """Register the jax.monitoring listeners that count compilations (once per process)."""
  global _LISTENING
  import jax  # pylint: disable=g-import-not-at-top
  with _LISTENER_LOCK:
    if _LISTENING:
      return

    def on_duration(event, _secs, **_kw):
      if event == BACKEND_COMPILE_EVENT:
        COUNTS["compiles"] += 1

    def on_event(event, **_kw):
      if event == CACHE_HIT_EVENT:
        COUNTS["cache_hits"] += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
    _LISTENING = True


def default_compilation_cache_dir() -> str:
  """Return `$LOGRERANK_JAX_COMPILATION_CACHE` or ~/.cache/logrerank_jax/xla."""
  return os.environ.get(DEFAULT_CACHE_ENV) or os.path.join(
      os.path.expanduser("~"), ".cache", "logrerank_jax", "xla")


def enable_compilation_cache(path: str, min_compile_time_secs: float = 0.0) -> str:
  """Turn on JAX's persistent compilation cache in `path` (created with 0o700 permissions).

  Args:
    path: cache folder; created if missing. An existing folder is used as is.
    min_compile_time_secs: cache only executables that took at least this long to compile
      (JAX's default is 1 s; 0 caches everything, which helps small CPU models too).

  Returns:
    The absolute cache path.
  """
  import jax  # pylint: disable=g-import-not-at-top
  path = os.path.abspath(os.path.expanduser(path))
  if not os.path.isdir(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # Compiled executables are code the process will run: keep the folder private.
    os.mkdir(path, 0o700)
    os.chmod(path, 0o700)  # mkdir's mode is masked by the umask
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_secs))
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path
