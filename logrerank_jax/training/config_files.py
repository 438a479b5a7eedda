"""Load a config file (`configs/*.py`) as a module by its path.

The config files are not a package (ml_collections' `config_flags` reads them by path), so a
config derived from another (`global_stage.py`, `passage_stage.py` from `local_stage.py`) loads
its base through this one helper.
"""

import importlib.util
import os
import types


def load_config_module(path: str) -> types.ModuleType:
  """Execute the config file at `path` and return it as a module (a fresh one per call)."""
  name = "_logrerank_config_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def sibling_config(file: str, name: str) -> types.ModuleType:
  """The config file `name` in the folder of `file` (a config's own `__file__`), loaded."""
  return load_config_module(os.path.join(os.path.dirname(os.path.abspath(file)), name))
