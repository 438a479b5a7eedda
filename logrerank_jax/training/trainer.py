"""`train_and_evaluate(config, workdir)`: the training loop, data-parallel and resumable.

The loop is the same for both stages; what differs (model config, batches, init, loss,
evaluation, export) is a method of the stage object `stages.make_stage` picks once: "local"
trains the encoder and heads (eq 19-22), "global" the GAT over the frozen local model's cached
outputs (eq 23). This module sets a run up, resumes and exports it; its micro-steps run in
training/loop.py.

Data order: units are grouped into global micro-batches once (seeded shuffle) and each epoch
visits the micro-batches in a seeded permutation, so the micro-step counter alone fixes the
data position. The batches stream: a Grain data iterator over the micro-steps
(`loop.data_iterator`) packs each process's shares of the next steps on a worker thread while
the devices train, and its state (`get_state()`) is saved in every checkpoint's meta and
restored on resume, which is what makes a resumed run identical to an uninterrupted one. A
micro-batch is split into contiguous per-device shares; the loss divides sums by counts summed
over all devices (`step.global_mean_loss`), so the result does not depend on the number of
devices or hosts.
"""

import dataclasses
import json
import os
import tempfile
import time
from typing import Any, Callable, Dict, List

import jax

from logrerank_jax.data.records import validate_training_file
from logrerank_jax.errors import CheckpointError, ConfigError
from logrerank_jax.training import data as data_lib
from logrerank_jax.training import optim
from logrerank_jax.training import step as step_lib
from logrerank_jax.training.checkpoints import Checkpointer
from logrerank_jax.training.config_checks import check_stage_settings
from logrerank_jax.training.loop import LoopContext, TrainingDivergedError, make_runner, train_steps
from logrerank_jax.training.metric_log import MetricLog
from logrerank_jax.training.stages import make_stage

# `trainer.TrainingDivergedError` is the name callers catch; the loop (training/loop.py) raises it.
__all__ = ["TrainingDivergedError", "train_and_evaluate", "validation_units"]


# ----------------------------------------------------------------------------- set-up helpers

def _distributed_initialized() -> bool:
  is_initialized = getattr(jax.distributed, "is_initialized", None)
  if is_initialized is not None:
    return bool(is_initialized())
  # JAX releases without the public check keep the same state here.
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return distributed.global_state.client is not None


def _topology(config):
  """Initialise multi-host JAX if asked; return (local devices used, process index, processes).

  JAX initialises once per process, so a second run in the same process (the global stage after
  the local one, in one script) joins the set-up the first made instead of failing."""
  if config.distributed and not _distributed_initialized():
    kwargs = {}
    if config.coordinator_address:
      kwargs = dict(coordinator_address=config.coordinator_address,
                    num_processes=config.num_processes, process_id=config.process_id)
    jax.distributed.initialize(**kwargs)
  devices = jax.local_devices()
  if config.num_devices:
    if jax.process_count() > 1:
      raise ConfigError("config.num_devices must be 0 (all local devices) in a multi-host run")
    if config.num_devices > len(devices):
      raise ConfigError(f"config.num_devices={config.num_devices} but only {len(devices)} devices")
    devices = devices[:config.num_devices]
  return devices, jax.process_index(), jax.process_count()


# Config keys that must not change when a run resumes (they change the data order or the math).
_RESUME_KEYS = ("stage", "seed", "train_file", "model", "ablation", "dtype", "micro_batch_size",
                "grad_accum_steps", "learning_rate", "num_epochs", "max_seq_len", "weight_decay",
                "warmup_fraction", "lambda_role", "listwise_tau", "dropout", "use_feature_cache",
                "adam_eps")
# Keys added later: part of the signature only when set, so older checkpoints still resume.
_OPTIONAL_RESUME_KEYS = ("teacher_file", "distill_weight", "distill_temperature",
                         "head_learning_rate", "anchor_weight", "role_learning_rate")


def _resume_signature(config) -> Dict[str, Any]:
  sig = {k: config[k] for k in _RESUME_KEYS}
  sig.update({k: config[k] for k in _OPTIONAL_RESUME_KEYS if config.get(k)})
  return sig


def _last_logged(log_path: str):
  """(last training loss, last validation metrics, {step: validation metrics}) in a run's
  metrics.jsonl ((None, {}, {}) if none)."""
  loss, val, by_step = None, {}, {}
  if os.path.exists(log_path):
    with open(log_path, encoding="utf-8") as f:
      for line in f:
        try:
          rec = json.loads(line)
        except ValueError:
          continue  # a line cut by a kill mid-write
        if rec.get("event") == "train":
          loss = rec.get("loss")
        elif rec.get("event") == "val":
          val = {k: v for k, v in rec.items() if k not in ("event", "step", "epoch")}
          by_step[rec.get("step")] = val
  return loss, val, by_step


def validation_units(config):
  """(validation query units, their qrels or None): from `config.val_pools` (evaluation pools
  and `val_qrels`, id-only pools resolved against `val_corpus`), else from `config.val_file`
  (training records; relevant = each query's rank-1 passage), else none."""
  if config.get("val_pools", ""):
    if not config.get("val_qrels", ""):
      raise ConfigError("config.val_pools needs config.val_qrels")
    return data_lib.pool_units(config.val_pools, config.val_qrels, config.get("val_corpus", ""))
  if config.val_file:
    records = validate_training_file(config.val_file, skip_invalid=config.skip_invalid)[0]
    return data_lib.query_units(records), None
  return [], None


def _check_workdir_writable(workdir: str) -> None:
  """Create `workdir` and prove it writable now, not after hours of training at the first save."""
  try:
    os.makedirs(workdir, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=workdir)
    os.close(fd)
    os.remove(probe)
  except OSError as e:
    raise ConfigError(f"workdir {workdir} is not a writable folder ({e.strerror or e})") from None


@dataclasses.dataclass
class _Prepared:
  """A run's devices, training file report, stage and batches (`_prepare`)."""
  devices: List[Any]
  proc: int
  nproc: int
  report: Any
  stage: Any
  val_units: List[Any]
  val_qrels: Any
  groups: List[List[int]]
  batches: Any
  cache_info: Dict[str, Any]
  prep_seconds: float

  @property
  def num_shards(self) -> int:
    return len(self.devices) * self.nproc


def _prepare(config, workdir: str) -> _Prepared:
  """Check the config and workdir, join the devices, read the data, choose the stage and build
  its micro-batches."""
  check_stage_settings(config)  # before any data is read
  _check_workdir_writable(workdir)
  devices, proc, nproc = _topology(config)
  num_shards = len(devices) * nproc
  records, report = validate_training_file(config.train_file, skip_invalid=config.skip_invalid)

  # The stage is chosen once; everything stage-specific below is one of its methods.
  stage = make_stage(config, workdir, records)
  stage.num_shards = num_shards
  val_units, val_qrels = validation_units(config)

  # Micro-batches: fixed groups, each split into per-device shares.
  groups = stage.micro_batch_groups(config.micro_batch_size, config.seed)
  my_shards = slice(proc * len(devices), (proc + 1) * len(devices))
  shares_of = lambda g: data_lib.split_global_batch(g, config.micro_batch_size, num_shards)[my_shards]  # noqa: E731
  t0 = time.time()
  batches = stage.micro_batches(groups, shares_of)
  cache_info = stage.cache_info
  prep_seconds = time.time() - t0
  return _Prepared(devices, proc, nproc, report, stage, val_units, val_qrels, groups, batches,
                   cache_info, prep_seconds)


@dataclasses.dataclass
class _Optimization:
  """The loss, optimizer and fresh train state of a run, and its step counts (`_optimization`)."""
  loss_fn: Callable
  coefs: Dict[str, float]
  tx: Any
  state: Any
  num_mb: int
  total_micro: int
  total_updates: int


def _optimization(config, prep: _Prepared) -> _Optimization:
  """Params, optimizer, state: the stage's initial params, loss and the optimizer schedule."""
  rng = jax.random.PRNGKey(config.seed)
  example = {k: jax.numpy.asarray(v) for k, v in prep.batches[0][0].items() if k != "real_tokens"}
  init_rng, rng = jax.random.split(rng)
  params = prep.stage.init_params(example, init_rng)
  loss_fn, coefs = prep.stage.loss()

  num_mb = len(prep.batches)
  total_micro = num_mb * config.num_epochs
  if config.max_steps:
    total_micro = min(total_micro, config.max_steps)
  total_updates = optim.total_optimizer_steps(num_mb, config.num_epochs, config.grad_accum_steps)
  frozen = (optim.frozen_mask(params, config.freeze_encoder_layers)
            if config.get("freeze_encoder_layers", 0) else None)
  tx = optim.make_optimizer(config.learning_rate, total_updates, config.warmup_fraction,
                            config.weight_decay, config.grad_accum_steps, config.max_grad_norm,
                            eps=config.adam_eps, frozen=frozen,
                            head_lr=config.get("head_learning_rate", 0.0),
                            anchor_weight=config.get("anchor_weight", 0.0),
                            role_lr=config.get("role_learning_rate", 0.0))
  state = step_lib.create_train_state(params, tx, config.seed)
  return _Optimization(loss_fn, coefs, tx, state, num_mb, total_micro, total_updates)


def _restore(ckpt: Checkpointer, state, signature: Dict[str, Any], workdir: str):
  """(train state, data-iterator state) to start from: the latest checkpoint's, refused when the
  config changed since (`_resume_signature`) or its iterator is out of step; for a fresh run,
  (`state`, None)."""
  data_state = None
  if ckpt.latest_step() is not None:
    state, meta = ckpt.restore(state)
    changed = {k: (meta["signature"].get(k), v) for k, v in signature.items()
               if meta["signature"].get(k) != v}
    if changed:
      raise ConfigError(f"cannot resume {workdir}: config changed since the checkpoint: {changed}")
    data_state = meta.get("data_iterator")
    if data_state is not None and data_state.get("next_index") != int(state.step):
      raise CheckpointError(
          f"cannot resume {workdir}: checkpoint step {int(state.step)} but its data iterator "
          f"is at micro-step {data_state.get('next_index')}")
  return state, data_state


def _export(loop: LoopContext, stage, dstate, val, val_by_step):
  """Export the model for inference: the best-by-validation params if any, else the last ones.
  Returns (final host state, the exported model's validation, its source, the model folder)."""
  config, ckpt = loop.config, loop.ckpt
  final_state = jax.device_get(loop.take_state(dstate))
  export_params = final_state.params
  selected_step = int(final_state.step)
  source = f"step {selected_step}"
  model_val = val
  if ckpt.best is not None and ckpt.best.best_step() is not None:
    best_state, best_meta = ckpt.restore(final_state, best=True)
    selected_step = int(best_meta["step"])
    export_params, source = best_state.params, f"best step {selected_step}"
    # The exported model's own validation, not the last one's (they differ when the last
    # validation is not the best).
    model_val = val_by_step.get(selected_step, val)
  export_params = stage.export_params(export_params)
  model_dir = os.path.join(loop.workdir, "model")
  if loop.proc == 0:
    # The packer settings travel with the model so inference packs exactly as training did.
    # `selected_step`/`selected_by`: what model selection chose and on which metric;
    # `validations`: every validation's figure of that metric, by step, so the choice can be
    # checked against the curve.
    metric = config.best_metric
    info = {"stage": config.stage, "source": source, "selected_step": selected_step,
            "selected_by": metric if loop.has_val else None, "val": model_val, "last_val": val,
            "validations": {str(k): v.get(metric) for k, v in sorted(val_by_step.items())
                            if isinstance(k, int)},
            "packing": {"row_len": config.max_seq_len,
                        "max_query_tokens": config.max_query_tokens}}
    stage.save(model_dir, export_params, info)  # a LoG model folder, or the stage's own format
  return final_state, model_val, source, model_dir


def train_and_evaluate(config, workdir: str) -> Dict[str, Any]:
  """Run one training stage as `config` says, writing checkpoints and logs under `workdir`.

  Args:
    config: an ml_collections ConfigDict from `configs/local_stage.py` or `configs/global_stage.py`.
    workdir: run folder: checkpoints/, best/, metrics.jsonl, tensorboard/, tokenizer/, model/
      (the export).

  Returns:
    Summary dict: final step, last training loss, last validation metrics, model folder.
  """
  prep = _prepare(config, workdir)
  opt = _optimization(config, prep)

  # `with`: the checkpointer (and orbax's pending work) is closed on every exit, errors too.
  with Checkpointer(workdir, max_to_keep=config.max_to_keep,
                    best_metric=config.best_metric if prep.val_units else None) as ckpt:
    signature = _resume_signature(config)
    state, data_state = _restore(ckpt, opt.state, signature, workdir)

    run, place_state, take_state, mesh = make_runner(opt.loss_fn, opt.coefs, opt.tx,
                                                     config.parallel, prep.devices)
    dstate = place_state(state)

    eval_fn = prep.stage.make_eval(prep.val_units, prep.val_qrels)

    start = int(jax.device_get(take_state(dstate).step))
    # metrics.jsonl and TensorBoard events (training/metric_log.py); process 0 writes.
    log = MetricLog(workdir, enabled=prep.proc == 0, start_step=start)
    log.write({"event": "start", "stage": config.stage, "step": start,
               "micro_batches_per_epoch": opt.num_mb, "total_micro_steps": opt.total_micro,
               "devices": prep.num_shards, "processes": prep.nproc,
               "prep_seconds": prep.prep_seconds, "invalid_records_skipped": prep.report.n_invalid,
               **prep.cache_info})
    # A re-run of a finished (or resumed) run keeps what the earlier run measured.
    last_loss, val, val_by_step = _last_logged(log.path)
    loop = LoopContext(config, workdir, prep.proc, ckpt, run, take_state, mesh, eval_fn, log,
                       signature, prep.batches, prep.groups, opt.num_mb, opt.total_micro,
                       opt.total_updates, bool(prep.val_units))
    dstate, last_loss, val = train_steps(loop, dstate, start, data_state, last_loss, val,
                                         val_by_step)
    final_state, model_val, source, model_dir = _export(loop, prep.stage, dstate, val,
                                                        val_by_step)
  log.write({"event": "end", "step": int(final_state.step), "loss": last_loss, "val": val})
  log.close()
  return {"step": int(final_state.step), "loss": last_loss, "val": val, "model_val": model_val,
          "model_source": source, "model_dir": model_dir, **prep.cache_info}
