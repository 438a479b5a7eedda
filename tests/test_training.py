"""Training runs: exact resume, feature cache, TensorBoard curves, NaN stop.

Each run is a real `train_and_evaluate` on a tiny config over real PubMedQA-derived records, in a
fresh subprocess (JAX reads the CPU device count at start-up). Device-count and host-count
independence live in tests/test_data_parallel.py, over the same data and runs.
"""

import importlib.util
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from cpu_devices import cpu_devices_env

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "workers" / "train_worker.py"
DEMO = ROOT / "logrerank_jax" / "demo_data"

# Equality runs use Adam with eps = 1 (and a larger lr), which makes the update ~lr * gradient.
# With the usual eps = 1e-8, Adam divides each entry by its running RMS, so parameters whose true
# gradient is zero (the output biases: listwise softmax and pairwise differences are shift
# invariant) move by ~lr per step in the direction of float noise, and two summation orders
# (1 vs 4 devices, packed differently) disagree by ~lr. What is tested is the gradient's
# independence of the device layout; the optimizer is checked elsewhere.
EQUALITY = {"adam_eps": 1.0, "learning_rate": 0.1}


@pytest.fixture(scope="module")
def data(train_six):
  """Six training queries (36 passages) and one tokenizer shared by every run (conftest.py)."""
  return train_six


def _spec(data, workdir, out, config="local", **overrides):
  base = {"train_file": str(data / "train.jsonl"), "val_file": "", "tokenizer": str(data / "tok"),
          "dropout": 0.0, "micro_batch_size": 4, "max_steps": 3, **EQUALITY}
  base.update(overrides)
  return {"config": config, "overrides": base, "workdir": str(workdir), "out": str(out)}


def _launch(spec, ndev, path, extra_env=None):
  path.write_text(json.dumps(spec))
  env = cpu_devices_env(ndev, **(extra_env or {}))
  return subprocess.Popen([sys.executable, str(WORKER), str(path)], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run(spec, ndev, path, timeout=300):
  proc = _launch(spec, ndev, path)
  out, err = proc.communicate(timeout=timeout)
  assert proc.returncode == 0, err[-4000:]
  return json.loads(out.strip().splitlines()[-1])


def _params(path):
  with np.load(path) as z:
    return {k: z[k] for k in z.files}


def _assert_close(a, b, atol):
  assert a.keys() == b.keys()
  for k in a:
    if not k.startswith("__"):
      np.testing.assert_allclose(a[k], b[k], rtol=0, atol=atol, err_msg=k)


RESUME_RUN = dict(max_steps=12, checkpoint_every_steps=2)


@pytest.fixture(scope="module")
def full_run(data, tmp_path_factory):
  """One uninterrupted 12-step run, checkpointed every 2 steps: the reference of the resume test,
  and the checkpoints the out-of-step test tampers with (each on its own copy)."""
  d = tmp_path_factory.mktemp("full_run")
  _run(_spec(data, d / "wd", d / "full.npz", **RESUME_RUN), 1, d / "a.json")
  return d


def test_kill_and_resume_gives_identical_params(data, full_run, tmp_path):
  spec = _spec(data, tmp_path / "killed", tmp_path / "killed.npz", **RESUME_RUN)
  proc = _launch(spec, 1, tmp_path / "b.json")
  first = tmp_path / "killed" / "checkpoints" / "2"
  deadline = time.time() + 240
  while not first.exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  proc.communicate()
  steps = sorted(int(p.name) for p in (tmp_path / "killed" / "checkpoints").iterdir() if p.name.isdigit())
  assert steps and max(steps) < 12, f"the run was not interrupted mid-way: {steps}"
  assert not (tmp_path / "killed.npz").exists()
  summary = _run(spec, 1, tmp_path / "b.json")
  assert summary["step"] == 12
  a, b = _params(full_run / "full.npz"), _params(tmp_path / "killed.npz")
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  # Every checkpoint carries the streaming data iterator's state, at its own micro-step.
  for d in (tmp_path / "killed" / "checkpoints").iterdir():
    if d.name.isdigit():
      meta = json.loads((d / "meta" / "metadata").read_text())
      assert meta["data_iterator"] == {"next_index": int(d.name)}, d


def test_resume_refuses_a_data_iterator_out_of_step(data, full_run, tmp_path):
  shutil.copytree(full_run / "wd", tmp_path / "wd")
  spec = _spec(data, tmp_path / "wd", tmp_path / "p.npz", **RESUME_RUN)
  last = tmp_path / "wd" / "checkpoints" / "12" / "meta" / "metadata"
  meta = json.loads(last.read_text())
  assert meta["data_iterator"] == {"next_index": 12}
  meta["data_iterator"] = {"next_index": 11}
  last.write_text(json.dumps(meta))
  proc = _launch(spec, 1, tmp_path / "b.json")
  _, err = proc.communicate(timeout=300)
  assert proc.returncode != 0
  assert "checkpoint step 12 but its data iterator is at micro-step 11" in err, err[-2000:]
  assert not (tmp_path / "p.npz").exists()


def test_feature_cache_equals_recompute_and_loss_falls(data, tmp_path):
  """Both tiny stages end to end from tools/train.py; cached global training = recomputed."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  local = tmp_path / "local"
  cmd = [sys.executable, str(ROOT / "tools" / "train.py"), "--config",
         str(ROOT / "configs" / "local_stage.py") + ":tiny", f"--workdir={local}",
         f"--config.train_file={data / 'train.jsonl'}", f"--config.val_file={data / 'val.jsonl'}",
         f"--config.tokenizer={data / 'tok'}", "--config.num_epochs=3", "--config.log_every_steps=1",
         "--config.progress_bar=False"]
  res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-4000:]
  # One micro-step per micro-batch of (query, passage) units, 3 epochs.
  units = sum(len(json.loads(l)["passages"]) for l in (data / "train.jsonl").read_text().splitlines())
  spec = importlib.util.spec_from_file_location("local_cfg", ROOT / "configs" / "local_stage.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  steps = 3 * -(-units // module.get_config("tiny").micro_batch_size)
  assert f"done: step {steps}" in res.stdout, res.stdout[-2000:]
  losses = [r["loss"] for r in map(json.loads, (local / "metrics.jsonl").read_text().splitlines())
            if r["event"] == "train"]
  third = steps // 3  # one epoch
  assert len(losses) == steps and np.mean(losses[-third:]) < np.mean(losses[:third])

  def global_spec(name, **overrides):
    settings = dict(local_checkpoint=str(local), max_steps=0, micro_batch_size=2,
                    log_every_steps=1, tau_sim=0.3, delta=0.5)
    settings.update(overrides)
    spec = _spec(data, tmp_path / name, tmp_path / f"{name}.npz", config="global", **settings)
    (tmp_path / f"{name}.json").write_text(json.dumps(spec))
    return tmp_path / f"{name}.json"

  # The global stage from tools/train.py too, with the tiny config's own optimizer settings:
  # the pairwise loss falls.
  g_tiny = tmp_path / "g_tiny"
  res = subprocess.run(
      [sys.executable, str(ROOT / "tools" / "train.py"), "--config",
       str(ROOT / "configs" / "global_stage.py") + ":tiny", f"--workdir={g_tiny}",
       f"--config.local_checkpoint={local}", f"--config.train_file={data / 'train.jsonl'}",
       f"--config.val_file={data / 'val.jsonl'}", f"--config.tokenizer={data / 'tok'}",
       "--config.micro_batch_size=2", "--config.log_every_steps=1", "--config.tau_sim=0.3",
       "--config.delta=0.5", "--config.dropout=0.0", "--config.progress_bar=False"],
      env=env, capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-4000:]
  assert "done: step 9," in res.stdout, res.stdout[-2000:]  # 6 queries / 2 per step x 3 epochs
  glosses = [r["loss"] for r in map(json.loads, (g_tiny / "metrics.jsonl").read_text()
                                     .splitlines()) if r["event"] == "train"]
  assert np.mean(glosses[-3:]) < np.mean(glosses[:3])
  _check_tensorboard(local, steps, ("train/loss", "train/rank", "train/role"))
  _check_tensorboard(g_tiny, 9, ("train/loss", "train/pairwise"))

  # Cached vs recomputed features: the same math, but the frozen encoder runs on differently
  # packed rows, so features differ by float rounding (~1e-7); compared under EQUALITY (see top).
  # The three runs in one worker process (each builds its own trainer; start-up is shared).
  names = ("g_cached", "g_recomputed", "g_init")
  specs = [global_spec("g_cached", use_feature_cache=True),
           global_spec("g_recomputed", use_feature_cache=False),
           global_spec("g_init", learning_rate=0.0, max_steps=1)]
  proc = subprocess.run([sys.executable, str(WORKER), *map(str, specs)], env=cpu_devices_env(1),
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  walls = [json.loads(l)["wall_s"] for l in proc.stdout.splitlines() if l.startswith('{"')]
  assert len(walls) == 3, proc.stdout[-2000:]  # one summary line per run
  cached, recomputed, init = (_params(tmp_path / f"{n}.npz") for n in names)
  _assert_close(cached, recomputed, 1e-5)
  moved = max(float(np.abs(init[k] - cached[k]).max()) for k in init if not k.startswith("__"))
  assert moved > 100 * 1e-5
  t_cached, t_recomputed = walls[:2]
  print(f"global stage wall time: cached {t_cached:.1f}s, recomputed {t_recomputed:.1f}s")


def _check_tensorboard(workdir, steps, train_tags):
  """The run's TensorBoard events, read back with TensorBoard's own reader, hold every logged
  training step of the loss terms, the learning rate and throughput, and the validation metrics,
  with the values metrics.jsonl holds."""
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
  from logrerank_jax.training.metric_log import tag_for
  acc = EventAccumulator(str(workdir / "tensorboard"), size_guidance={"scalars": 0})
  acc.Reload()
  tags = set(acc.Tags()["scalars"])
  keys = {"train/lr": ("train", "lr"), "throughput/tokens_per_s": ("train", "tokens_per_s"),
          "throughput/units_per_s": ("train", "units_per_s"), "val/ndcg_at_10": ("val", "ndcg@10"),
          "val/map_at_10": ("val", "map@10"), "val/recall_at_10": ("val", "recall@10")}
  keys.update({t: ("train", t.split("/")[1]) for t in train_tags})
  assert all(tag_for(*kk) == t for t, kk in keys.items())  # the documented names
  assert set(keys) <= tags, sorted(set(keys) - tags)
  records = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  train = {r["step"]: r for r in records if r["event"] == "train"}
  val = {r["step"]: r for r in records if r["event"] == "val"}
  assert len(train) == steps and val
  for tag, (kind, key) in keys.items():
    source = val if kind == "val" else train
    got = {e.step: e.value for e in acc.Scalars(tag)}
    assert got.keys() == source.keys(), tag
    # Event files hold float32: compare at float32 resolution (relative 2^-23 ~ 1.2e-7, x8).
    np.testing.assert_allclose([got[k] for k in sorted(got)],
                               [source[k][key] for k in sorted(got)], rtol=1e-6, err_msg=tag)


def test_nan_loss_stops_with_step_and_keeps_checkpoint(data, tmp_path, monkeypatch):
  import jax.numpy as jnp
  from logrerank_jax.training import stages, trainer
  from logrerank_jax.training.checkpoints import Checkpointer
  import importlib.util
  spec = importlib.util.spec_from_file_location("local_stage", ROOT / "configs" / "local_stage.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config("tiny")
  for k, v in _spec(data, tmp_path, tmp_path / "x.npz", max_steps=4,
                    checkpoint_every_steps=2)["overrides"].items():
    config[k] = v
  config.progress_bar = False
  trainer.train_and_evaluate(config, str(tmp_path / "wd"))
  config.max_steps = 8
  monkeypatch.setattr(stages.losses, "listwise_rank_loss", lambda *a, **k: jnp.float32(jnp.nan))
  with pytest.raises(trainer.TrainingDivergedError, match="micro-step 5"):
    trainer.train_and_evaluate(config, str(tmp_path / "wd"))
  assert Checkpointer(str(tmp_path / "wd")).latest_step() == 4
