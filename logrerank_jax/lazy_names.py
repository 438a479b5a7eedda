"""Package names resolved on first use (PEP 562), for the packages whose import must stay light.

`logrerank_jax` and `logrerank_jax.engine` hand out names whose modules load JAX, Flax and
Orbax; resolving them on first use lets a process that needs one light module (the error types,
the record readers, a command's `--help`) skip that start-up cost.
"""

import importlib
import sys
from typing import Callable, Iterable, Mapping, Tuple


def lazy_names(package: str, homes: Mapping[str, str], submodules: Iterable[str] = ()
               ) -> Tuple[Callable[[str], object], Callable[[], list]]:
  """The `__getattr__` and `__dir__` of `package`: a name of `homes` ({name: its module}) is
  imported on first use and kept in the package (later lookups skip `__getattr__`); a name in
  `submodules` is that submodule of the package."""
  submodules = frozenset(submodules)

  def __getattr__(name: str):
    if name in submodules:
      return importlib.import_module(f"{package}.{name}")
    module = homes.get(name)
    if module is None:
      raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    setattr(sys.modules[package], name, value)  # later lookups skip this function
    return value

  def __dir__():
    return sorted({*vars(sys.modules[package]), *homes, *submodules})

  return __getattr__, __dir__
