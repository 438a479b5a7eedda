"""Data-parallel training gives the same params on 1 and 4 devices, under pmap, shard_map and jit.

The runs go in subprocesses that see 4 CPU devices (JAX reads the forced device count at
start-up): the toy runs share one, the LoG runs another; a 1-device run uses the first device.
The toy runs use plain SGD and the LoG runs Adam with eps = 1, settings where the gradient's scale shows in
the params, and each suite includes the pre-fix step (checked shard_map reducing the gradient
twice) to prove that its bound catches that bug.
"""

import json
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

from cpu_devices import cpu_devices_env

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKERS = ROOT / "tests" / "workers"
DEMO = ROOT / "logrerank_jax" / "demo_data"


# ----------------------------------------------------------------------------- toy model

def _run_toys(runs, out_dir):
  """(mode, ndev) runs, in order, all in ONE 4-device worker process (tests/workers/dp_toy.py:
  each run on the first ndev devices with its own data and state; only the start-up is shared);
  return (mode, ndev) -> saved arrays."""
  args = [a for m, n in runs for a in (m, str(n), str(out_dir / f"{m}{n}.npz"))]
  proc = subprocess.run([sys.executable, str(WORKERS / "dp_toy.py"), *args],
                        env=cpu_devices_env(4), capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return {(m, n): dict(np.load(out_dir / f"{m}{n}.npz")) for m, n in runs}


TOY_CASES = [("pmap", 4), ("shard_map", 4), ("shard_map", 1), ("jit", 4), ("jit", 1)]
# 12 SGD steps on float32 params of size ~1: only the order of float sums differs between
# layouts. Measured max |difference| 6.0e-8 (w), 3.0e-8 (b), about one ulp at 1.0; the bound
# leaves a 16x margin, and a twice-reduced gradient is off by 1.1 (test below).
TOY_ATOL = 1e-6


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory):
  # The twice-reduced step last (the worker patches it for that run only).
  return _run_toys([("pmap", 1)] + TOY_CASES + [("double", 4)], tmp_path_factory.mktemp("dp"))


@pytest.mark.parametrize("mode,ndev", TOY_CASES, ids=[f"{m}-{n}dev" for m, n in TOY_CASES])
def test_toy_params_equal_single_device_pmap(toy_runs, mode, ndev):
  ref, got = toy_runs[("pmap", 1)], toy_runs[(mode, ndev)]
  assert int(got["step"]) == 12
  np.testing.assert_allclose(got["w"], ref["w"], rtol=0, atol=TOY_ATOL)
  np.testing.assert_allclose(got["b"], ref["b"], rtol=0, atol=TOY_ATOL)
  # Losses ~1-10, measured relative difference <= 2.2e-7.
  np.testing.assert_allclose(got["losses"], ref["losses"], rtol=2e-6, atol=0)


def test_toy_training_moves_params(toy_runs):
  ref = toy_runs[("pmap", 1)]
  w0 = np.random.RandomState(0).randn(5).astype(np.float32)
  assert np.abs(ref["w"] - w0).max() > 1e-2


def test_toy_gradient_reduced_twice_is_caught(toy_runs):
  # The pre-fix step under checked shard_map: its gradient is 4x the true one (the implicit
  # cast's transpose psums it, then the explicit psum again), so with SGD the params drift by
  # ~1 (measured 1.1), far outside TOY_ATOL.
  ref, got = toy_runs[("pmap", 1)], toy_runs[("double", 4)]
  assert np.abs(got["w"] - ref["w"]).max() > 1000 * TOY_ATOL


# ----------------------------------------------------------------------------- real LoG local step

# Adam with eps = 1 (update ~ lr * g / (1 + sqrt(v))) and a large lr, as in tests/test_training.py:
# with the usual eps = 1e-8 Adam is scale-free, which would hide a gradient scaled by the device
# count, and zero-gradient parameters would move by ~lr along float noise.
LOG_OVERRIDES = {"dropout": 0.0, "micro_batch_size": 4, "max_steps": 3, "adam_eps": 1.0,
                 "learning_rate": 0.1}
LOG_CASES = {"pmap-1dev": ("pmap", 1), "jit-1dev": ("jit", 1), "pmap-4dev": ("pmap", 4),
             "shard_map-4dev": ("shard_map", 4), "jit-4dev": ("jit", 4)}
# 3 steps of the tiny LoG local model: measured max |param difference| between any two of the
# runs 3.0e-8 (float summation order only; pmap-4dev and shard_map-4dev are bitwise equal); the
# bound leaves a 33x margin, and the twice-reduced gradient moves the params by 1.8e-2 (test
# below), 18000x the bound.
LOG_ATOL = 1e-6


@pytest.fixture(scope="module")
def log_data(train_six):
  """Six training queries and a tokenizer trained on them (conftest.py; shared with
  tests/test_training.py)."""
  return train_six


def _log_spec(data, name, mode, ndev, overrides=None, **spec_extra):
  overrides = dict(LOG_OVERRIDES, train_file=str(data / "train.jsonl"), val_file="",
                   tokenizer=str(data / "tok"), parallel=mode, num_devices=ndev,
                   **(overrides or {}))
  spec = {"config": "local", "overrides": overrides, "workdir": str(data / f"wd-{name}"),
          "out": str(data / f"{name}.npz"), **spec_extra}
  (data / f"{name}.json").write_text(json.dumps(spec))
  return data / f"{name}.json"


def _load_npz(path):
  with np.load(path) as z:
    return {k: z[k] for k in z.files}


def _run_logs(data, runs):
  """Run name -> `_log_spec` arguments, all in ONE 4-device worker process, in order
  (tests/workers/train_worker.py: each run builds its own trainer, steps and state; only the
  start-up is shared); return name -> final params."""
  specs = [_log_spec(data, name, *args, **extra) for name, (args, extra) in runs.items()]
  cmd = [sys.executable, str(WORKERS / "train_worker.py"), *map(str, specs)]
  proc = subprocess.run(cmd, env=cpu_devices_env(4), capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return {name: _load_npz(data / f"{name}.npz") for name in runs}


@pytest.fixture(scope="module")
def log_runs(log_data):
  runs = {name: (case, {}) for name, case in LOG_CASES.items()}
  runs["lr0-1dev"] = (("pmap", 1, {"max_steps": 1, "learning_rate": 0.0}), {})
  runs["dropout-pmap-4dev"] = (("pmap", 4, {"dropout": 0.1}), {})
  runs["dropout-jit-4dev"] = (("jit", 4, {"dropout": 0.1}), {})
  # The twice-reduced step (test below) last: the worker patches it for that run only.
  runs["double-4dev"] = (("shard_map", 4), {"double_reduce": True})
  return _run_logs(log_data, runs)


def _max_param_diff(a, b):
  assert a.keys() == b.keys()
  return max(float(np.abs(a[k] - b[k]).max()) for k in a if not k.startswith("__"))


@pytest.mark.parametrize("name", [n for n in LOG_CASES if n != "pmap-1dev"])
def test_log_params_equal_single_device_pmap(log_runs, name):
  ref, got = log_runs["pmap-1dev"], log_runs[name]
  assert int(got["__step__"]) == 3
  # Loss ~2.85, measured relative difference <= 1.7e-7 (the bound as tests/test_training.py).
  np.testing.assert_allclose(got["__loss__"], ref["__loss__"], rtol=1e-5)
  assert _max_param_diff(got, ref) < LOG_ATOL


@pytest.mark.parametrize("ndev", [1, 4])
def test_log_three_wrappers_equal(log_runs, ndev):
  runs = {n: log_runs[n] for n in LOG_CASES if n.endswith(f"-{ndev}dev")}
  assert len(runs) == (2 if ndev == 1 else 3)
  names = sorted(runs)
  for a in names:
    for b in names:
      assert _max_param_diff(runs[a], runs[b]) < LOG_ATOL, (a, b)


def test_log_gradient_reduced_twice_is_caught(log_runs, log_data):
  # The pre-fix step (no varying cast) under checked shard_map reduces the gradient twice (4x):
  # with Adam eps = 1 the params leave LOG_ATOL by orders of magnitude. This also guards the
  # equalities above against vacuity (params that did not move would agree with this run too).
  diff = _max_param_diff(log_runs["double-4dev"], log_runs["pmap-1dev"])
  assert diff > 1000 * LOG_ATOL, diff


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_process_runs(log_data):
  """The LoG runs of LOG_OVERRIDES as 2 processes x 2 CPU devices (jax.distributed, gloo), under
  jit and then pmap, both runs in the same two worker processes (the second run joins the
  distributed set-up the first made, tests/workers/train_worker.py); mode -> the final params
  process 0 saved."""
  port, procs, modes = _free_port(), [], ("jit", "pmap")
  for pid in range(2):
    paths = []
    for mode in modes:
      overrides = dict(LOG_OVERRIDES, train_file=str(log_data / "train.jsonl"), val_file="",
                       tokenizer=str(log_data / "tok"), parallel=mode, distributed=True,
                       coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
      spec = {"config": "local", "overrides": overrides, "gloo": True,
              "workdir": str(log_data / f"wd-{mode}-2proc"),
              "out": str(log_data / f"{mode}-2proc.npz")}
      paths.append(log_data / f"{mode}-2proc-{pid}.json")
      paths[-1].write_text(json.dumps(spec))
    procs.append(subprocess.Popen(
        [sys.executable, str(WORKERS / "train_worker.py"), *map(str, paths)],
        env=cpu_devices_env(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  for p in procs:
    _, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-4000:]
  return {mode: _load_npz(log_data / f"{mode}-2proc.npz") for mode in modes}


def test_log_jit_two_processes_equal_one_process(log_runs, two_process_runs):
  # 2 processes x 2 CPU devices, one 4-device mesh: each process packs its own devices' shares
  # and `_place` assembles the global batch with jax.make_array_from_process_local_data.
  # Measured max |param difference| to the one-process 4-device jit run: 3.0e-8.
  got = two_process_runs["jit"]
  assert int(got["__processes__"]) == 2  # this run, too, was one of two processes
  np.testing.assert_allclose(got["__loss__"], log_runs["jit-4dev"]["__loss__"], rtol=1e-5)
  assert _max_param_diff(got, log_runs["jit-4dev"]) < LOG_ATOL


@pytest.mark.parametrize("name", ["pmap-4dev", "shard_map-4dev"])
def test_same_params_on_1_and_4_devices(log_runs, name):
  # (Moved from tests/test_training.py, whose own three runs repeated three of `log_runs`.)
  ref, got = log_runs["pmap-1dev"], log_runs[name]
  assert int(got["__step__"]) == 3
  np.testing.assert_allclose(got["__loss__"], ref["__loss__"], rtol=1e-5)
  assert _max_param_diff(got, ref) < LOG_ATOL


def test_training_changed_the_params(log_runs):
  # Guard against a vacuous equality: 3 steps (warm-up makes the first one lr 0) move the weights
  # far more than LOG_ATOL. The 1-step run at lr 0 holds the initial params.
  assert _max_param_diff(log_runs["lr0-1dev"], log_runs["pmap-1dev"]) > 1000 * LOG_ATOL


def test_log_pmap_two_processes_equal_one_process(log_runs, two_process_runs):
  # 2 processes x 2 CPU devices under pmap (jax.distributed), against the one-process 4-device
  # pmap run. (Moved from tests/test_training.py.)
  got = two_process_runs["pmap"]
  assert int(got["__processes__"]) == 2  # this run, too, was one of two processes
  np.testing.assert_allclose(got["__loss__"], log_runs["pmap-4dev"]["__loss__"], rtol=1e-5)
  assert _max_param_diff(got, log_runs["pmap-4dev"]) < LOG_ATOL


def test_log_dropout_same_masks_under_pmap_and_jit(log_runs):
  # The jit step gives share i the dropout key pmap gives device i, so with dropout on the two
  # still agree. Measured (dropout 0.1, 4 devices): max |param difference| 3.0e-8 (shard_map is
  # bitwise equal to pmap), while dropout moves the params 2.4e-3 from the dropout-free run.
  assert _max_param_diff(log_runs["dropout-jit-4dev"], log_runs["dropout-pmap-4dev"]) < LOG_ATOL
