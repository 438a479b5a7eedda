"""Run `train_and_evaluate` with config overrides in a fresh process; save the final params.

Usage: python train_worker.py SPEC.json [SPEC.json ...]
Several specs run one after another in this one process (the runs of one device count share the
start-up: imports, tokenizer, JAX client); each builds its own trainer, steps and state.
SPEC: {"config": "local"|"global", "variant": "tiny", "overrides": {...}, "workdir": str,
       "out": str (npz of flattened final train-state params, written by process 0),
       optional "gloo": true (multi-process CPU collectives), "double_reduce": true (see below)}.
XLA_FLAGS (CPU device count) must be set by the caller: JAX reads it at start-up.
"""

import json
import pathlib
import sys
import time

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_config(name, variant):
  import importlib.util  # pylint: disable=g-import-not-at-top
  path = ROOT / "configs" / f"{name}_stage.py"
  spec = importlib.util.spec_from_file_location(f"cfg_{name}", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config(variant)


def run(spec):
  from pre_fix_step import gradient_reduced_twice  # pylint: disable=g-import-not-at-top
  from logrerank_jax.training import trainer  # pylint: disable=g-import-not-at-top
  from logrerank_jax.models.model_folder import load_model  # pylint: disable=g-import-not-at-top
  if spec.get("gloo"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  with gradient_reduced_twice(active=bool(spec.get("double_reduce"))):
    config = load_config(spec["config"], spec.get("variant", "tiny"))
    config.progress_bar = False
    for k, v in spec.get("overrides", {}).items():
      config[k] = v
    t0 = time.perf_counter()
    summary = trainer.train_and_evaluate(config, spec["workdir"])
    summary["wall_s"] = time.perf_counter() - t0
  if jax.process_index() == 0 and spec.get("out"):
    # With no validation file the exported model holds the final params of the run.
    params, _, _ = load_model(summary["model_dir"], need_tokenizer=False)
    flat = {jax.tree_util.keystr(p): np.asarray(x)
            for p, x in jax.tree_util.tree_leaves_with_path(params)}
    flat["__step__"] = np.asarray(summary["step"])
    flat["__loss__"] = np.asarray(summary["loss"])
    flat["__processes__"] = np.asarray(jax.process_count())
    np.savez(spec["out"], **flat)
  print(json.dumps({k: v for k, v in summary.items() if k != "model_dir"}, default=str))


def main():
  for path in sys.argv[1:]:
    run(json.loads(pathlib.Path(path).read_text()))


if __name__ == "__main__":
  main()
