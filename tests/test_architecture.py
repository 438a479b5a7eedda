"""The layer rules of docs/ARCHITECTURE.md, enforced: import-linter contracts and public names."""

import ast
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_import_linter_contracts_are_kept():
  """`.importlinter`: layers, data below models, serving without training, benchmarks on the
  public API, the serving package's own layers (the HTTP app on top) and no HTTP stack below
  the app. A broken contract prints the offending import chain."""
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  # The console script installed next to this interpreter (the `dev` extra's import-linter).
  exe = pathlib.Path(sys.executable).with_name("lint-imports")
  proc = subprocess.run([str(exe) if exe.exists() else "lint-imports", "--no-cache"], cwd=ROOT,
                        env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
  assert "8 kept, 0 broken" in proc.stdout, proc.stdout[-2000:]


def _private_library_names(path: pathlib.Path):
  """(line, name) of every underscore name a file takes from logrerank_jax."""
  tree = ast.parse(path.read_text(encoding="utf-8"))
  aliases = set()
  bad = []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("logrerank_jax"):
      for a in node.names:
        if a.name.startswith("_"):
          bad.append((node.lineno, a.name))
        aliases.add(a.asname or a.name)
    elif isinstance(node, ast.Import):
      for a in node.names:
        if a.name.startswith("logrerank_jax"):
          aliases.add((a.asname or a.name).split(".")[0])
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
      base = node.value
      while isinstance(base, ast.Attribute):
        base = base.value
      if isinstance(base, ast.Name) and base.id in aliases:
        bad.append((node.lineno, node.attr))
  return bad


@pytest.mark.parametrize("path", sorted((ROOT / "logrerank_bench").glob("*.py")) + [ROOT / "tools" / "benchmark.py"],
                         ids=lambda p: p.name)
def test_benchmarks_use_no_private_library_names(path):
  assert _private_library_names(path) == []


def test_private_name_check_catches_one(tmp_path):
  """The check above can fail: a file reaching into a private name is reported."""
  f = tmp_path / "x.py"
  f.write_text("from logrerank_jax.data import sentences\nsentences._split_cached.cache_clear()\n"
               "from logrerank_jax.engine import _forward\n")
  assert [n for _, n in _private_library_names(f)] == ["_forward", "_split_cached"] or \
      sorted(n for _, n in _private_library_names(f)) == ["_forward", "_split_cached"]


def test_public_face():
  """`import logrerank_jax` gives the notebook API, the config, model folders and the errors."""
  import logrerank_jax
  for name in ("Reranker", "LoGConfig", "LoGReranker", "load_model", "save_model", "RankedResults",
               "LogRerankError", "DataError", "ConfigError", "CheckpointError"):
    assert name in logrerank_jax.__all__ and hasattr(logrerank_jax, name), name
  assert "Reranker.from_pretrained" in logrerank_jax.__doc__
  # Every public name is what its module defines (the package resolves them on first use).
  from logrerank_jax import errors, models, results
  from logrerank_jax import engine as inference  # noqa: F401
  from logrerank_jax.models import log_reranker, model_folder
  from logrerank_jax.models.encoders import bert, modernbert
  homes = {"Reranker": inference, "LoGConfig": log_reranker, "LoGReranker": log_reranker,
           "ablation": log_reranker, "load_model": model_folder, "save_model": model_folder,
           "LogRerankError": errors, "DataError": errors, "ConfigError": errors,
           "CheckpointError": errors, "RankedResults": results, "RankedPassage": results,
           "RankedSentence": results, "RerankResult": results,
           "ModernBertConfig": modernbert, "ModernBertEncoder": modernbert, "BertConfig": bert,
           "BertEncoder": bert}
  assert set(homes) | {"__version__"} == set(logrerank_jax.__all__)
  for name, module in homes.items():
    assert getattr(logrerank_jax, name) is getattr(module, name), name
  assert set(logrerank_jax.__all__) <= set(dir(logrerank_jax))
  with pytest.raises(AttributeError, match="no attribute 'Rerankr'"):
    logrerank_jax.Rerankr  # pylint: disable=pointless-statement


def test_light_modules_do_not_import_jax():
  """The package, its error types, the record readers and the training-config checks load without
  JAX (the public names resolve on first use), so a tool names bad input or a bad config before
  paying for JAX, Flax and Orbax; the first public model name brings them in."""
  code = ("import sys, logrerank_jax, logrerank_jax.errors, logrerank_jax.data.records, "
          "logrerank_jax.training.config_checks\n"
          "assert 'jax' not in sys.modules, 'jax imported'\n"
          "logrerank_jax.Reranker\n"
          "assert 'jax' in sys.modules\n")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
