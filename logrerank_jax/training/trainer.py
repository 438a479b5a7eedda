"""`train_and_evaluate(config, workdir)`: the training loop, data-parallel and resumable.

The loop is the same for both stages; what differs (model config, batches, init, loss,
evaluation, export) is a method of the stage object `stages.make_stage` picks once: "local"
trains the encoder and heads (eq 19-22), "global" the GAT over the frozen local model's cached
outputs (eq 23).

Data order: units are grouped into global micro-batches once (seeded shuffle) and each epoch
visits the micro-batches in a seeded permutation, so the micro-step counter alone fixes the
data position. The batches stream: a Grain data iterator over the micro-steps (`data_iterator`)
packs each process's shares of the next steps on a worker thread while the devices train,
and its state (`get_state()`) is saved in every checkpoint's meta and restored on resume,
which is what makes a resumed run identical to an uninterrupted one. A micro-batch is split
into contiguous per-device shares; the loss divides sums by counts summed over all devices
(`step.global_mean_loss`), so the result does not depend on the number of devices or hosts.
"""

import functools
import json
import math
import os
import tempfile
import time
from typing import Any, Dict

import jax
import numpy as np

from logrerank_jax.data.records import validate_training_file
from logrerank_jax.errors import CheckpointError, ConfigError, LogRerankError
from logrerank_jax.training import data as data_lib
from logrerank_jax.training import optim
from logrerank_jax.training import step as step_lib
from logrerank_jax.training.checkpoints import Checkpointer
from logrerank_jax.training.config_checks import check_stage_settings
from logrerank_jax.training.metric_log import MetricLog
from logrerank_jax.training.stages import make_stage


class TrainingDivergedError(LogRerankError):
  """The loss became NaN or infinite; the message names the step."""


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
_OPTIONAL_RESUME_KEYS = ("teacher_file", "distill_weight", "distill_temperature")


def _resume_signature(config) -> Dict[str, Any]:
  sig = {k: config[k] for k in _RESUME_KEYS}
  sig.update({k: config[k] for k in _OPTIONAL_RESUME_KEYS if config.get(k)})
  return sig


# ----------------------------------------------------------------------------- the loop

def _place(batch_shares, mode, mesh):
  """Put stacked per-device shares on devices for the chosen parallel wrapper."""
  stacked = {k: np.stack([b[k] for b in batch_shares]) for k in batch_shares[0]
             if k != "real_tokens"}
  if mode == "pmap":
    return stacked  # pmap splits the leading device axis itself
  # shard_map and jit: one global array [all shares, ...] split along its leading axis; each
  # process contributes its own devices' shares.
  if jax.process_count() > 1:
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(step_lib.AXIS))
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in stacked.items()}
  return step_lib.put_sharded(stacked, mesh)


PARALLEL_MODES = ("pmap", "shard_map", "jit")


def _runner(loss_fn, coefficients, tx, mode, devices):
  """Build the data-parallel step `mode` names; return (run, place_state, take_state, mesh).

  pmap and shard_map wrap the one per-device step (`step.make_per_device_step`); jit runs the
  global-mean step (`step.make_global_step`) over a mesh with the batch axis sharded.
  """
  if mode not in PARALLEL_MODES:
    raise ConfigError(f"config.parallel must be one of {PARALLEL_MODES}, got {mode!r}")
  if mode == "pmap":
    run = step_lib.pmap_step(step_lib.make_per_device_step(loss_fn, coefficients, tx))
    return run, (lambda s: step_lib.replicate(s, devices)), step_lib.unreplicate, None
  # The mesh spans every device of every process; `_place` assembles the global batch.
  all_devices = jax.devices() if jax.process_count() > 1 else devices
  if mode == "shard_map":
    per_device = step_lib.make_per_device_step(loss_fn, coefficients, tx)
    # The shard_map path sees a [1, ...] slice of the stacked shares on each device.
    squeeze = lambda st, b: per_device(st, jax.tree_util.tree_map(lambda x: x[0], b))  # noqa: E731
    run, mesh = step_lib.shard_map_step(squeeze, all_devices)
  else:
    run, mesh = step_lib.jit_step(step_lib.make_global_step(loss_fn, coefficients, tx), all_devices)
  return run, (lambda s: step_lib.put_replicated(s, mesh)), (lambda s: s), mesh


def _guarded_save(ckpt: Checkpointer, step: int, save) -> None:
  """Run a checkpoint save; a failed write (disk full, lost mount) becomes one named error.

  Orbax writes into a temporary folder and renames it only when complete, so the previous
  checkpoints stay intact and the next start resumes from the latest complete one.
  """
  try:
    save()
  except CheckpointError:
    raise
  except Exception as e:  # orbax/tensorstore raise ValueError, OSError, RuntimeError...
    first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
    raise CheckpointError(
        f"cannot write the checkpoint of micro-step {step} under {ckpt.workdir} ({first}); "
        f"the last complete checkpoint is step {ckpt.latest_step()}, and a restart resumes "
        "from it") from None


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


def data_iterator(batches, num_mb: int, total_micro: int, seed: int, state=None):
  """Grain iterator of {"step", "micro_batch", "shares"} over micro-steps 0..total_micro-1.

  Step s is micro-batch `permutation(seed + 1 + epoch)[s % num_mb]` of epoch s // num_mb; its
  shares are `batches[micro_batch]` (built on demand for streamed batches). One worker thread
  prefetches two steps ahead. `state` (a checkpoint's `get_state()`) resumes it exactly.
  """
  import grain  # pylint: disable=g-import-not-at-top

  @functools.lru_cache(maxsize=2)
  def order(epoch):
    return np.random.RandomState(seed + 1 + epoch).permutation(num_mb)

  def step_batch(s):
    epoch, idx = divmod(int(s), num_mb)
    mb = int(order(epoch)[idx])
    return {"step": int(s), "micro_batch": mb, "shares": batches[mb]}

  ds = grain.MapDataset.range(total_micro).map(step_batch)
  it = iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)))
  if state is not None:
    it.set_state(state)
  return it


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


def train_and_evaluate(config, workdir: str) -> Dict[str, Any]:
  """Run one training stage as `config` says, writing checkpoints and logs under `workdir`.

  Args:
    config: an ml_collections ConfigDict from `configs/local_stage.py` or `configs/global_stage.py`.
    workdir: run folder: checkpoints/, best/, metrics.jsonl, tensorboard/, tokenizer/, model/
      (the export).

  Returns:
    Summary dict: final step, last training loss, last validation metrics, model folder.
  """
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  check_stage_settings(config)  # before any data is read
  _check_workdir_writable(workdir)
  devices, proc, nproc = _topology(config)
  num_shards = len(devices) * nproc
  records, report = validate_training_file(config.train_file, skip_invalid=config.skip_invalid)
  rng = jax.random.PRNGKey(config.seed)

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

  # Params, optimizer, state.
  example = {k: jax.numpy.asarray(v) for k, v in batches[0][0].items() if k != "real_tokens"}
  init_rng, rng = jax.random.split(rng)
  params = stage.init_params(example, init_rng)
  loss_fn, coefs = stage.loss()

  num_mb = len(batches)
  total_micro = num_mb * config.num_epochs
  if config.max_steps:
    total_micro = min(total_micro, config.max_steps)
  total_updates = optim.total_optimizer_steps(num_mb, config.num_epochs, config.grad_accum_steps)
  frozen = (optim.frozen_mask(params, config.freeze_encoder_layers)
            if config.get("freeze_encoder_layers", 0) else None)
  tx = optim.make_optimizer(config.learning_rate, total_updates, config.warmup_fraction,
                            config.weight_decay, config.grad_accum_steps, config.max_grad_norm,
                            eps=config.adam_eps, frozen=frozen)
  state = step_lib.create_train_state(params, tx, config.seed)

  # `with`: the checkpointer (and orbax's pending work) is closed on every exit, errors too.
  with Checkpointer(workdir, max_to_keep=config.max_to_keep,
                    best_metric=config.best_metric if val_units else None) as ckpt:
    signature = _resume_signature(config)
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

    run, place_state, take_state, mesh = _runner(loss_fn, coefs, tx, config.parallel, devices)
    dstate = place_state(state)

    eval_fn = stage.make_eval(val_units, val_qrels)

    start = int(jax.device_get(take_state(dstate).step))
    # metrics.jsonl and TensorBoard events (training/metric_log.py); process 0 writes.
    log = MetricLog(workdir, enabled=proc == 0, start_step=start)
    log_path = log.path

    def write(rec):
      log.write(rec)

    write({"event": "start", "stage": config.stage, "step": start, "micro_batches_per_epoch": num_mb,
           "total_micro_steps": total_micro, "devices": num_shards, "processes": nproc,
           "prep_seconds": prep_seconds, "invalid_records_skipped": report.n_invalid, **cache_info})
    # A re-run of a finished (or resumed) run keeps what the earlier run measured.
    last_loss, val, val_by_step = _last_logged(log_path)
    bar = tqdm(total=total_micro, initial=start, disable=not config.progress_bar or proc != 0,
               desc=f"{config.stage} stage", mininterval=2.0)
    window_t, window_tokens, window_units = time.time(), 0, 0
    # An older checkpoint has no iterator state; its step is the data position all the same.
    data = data_iterator(batches, num_mb, total_micro, config.seed,
                         data_state if data_state is not None else {"next_index": start})
    for s in range(start, total_micro):
      item = next(data)
      if item["step"] != s:  # the iterator and the step counter move together, or nothing runs
        raise CheckpointError(f"data iterator at micro-step {item['step']}, training at {s}")
      epoch, shares = s // num_mb, item["shares"]
      dstate, metrics = run(dstate, _place(shares, config.parallel, mesh))
      if config.parallel == "pmap":
        metrics = take_state(metrics)  # identical on every device
      metrics = {k: float(np.asarray(jax.device_get(v)).reshape(-1)[0]) for k, v in metrics.items()}
      if not math.isfinite(metrics["loss"]):
        raise TrainingDivergedError(
            f"non-finite loss {metrics['loss']} at micro-step {s + 1} (epoch {epoch}); the last good "
            f"checkpoint is step {ckpt.latest_step()} in {workdir}/checkpoints")
      last_loss = metrics["loss"]
      window_tokens += sum(int(b.get("real_tokens", 0)) for b in shares)
      window_units += len(groups[item["micro_batch"]])
      bar.update(1)
      done = s + 1
      if done % config.log_every_steps == 0 or done == total_micro:
        dt = max(time.time() - window_t, 1e-9)
        rec = {"event": "train", "step": done, "epoch": epoch, **metrics,
               "lr": float(optim.warmup_linear_decay(config.learning_rate, total_updates,
                                                     config.warmup_fraction)(done // config.grad_accum_steps)),
               "tokens_per_s": window_tokens / dt, "units_per_s": window_units / dt}
        write(rec)
        bar.set_postfix(loss=f"{last_loss:.4f}")
        window_t, window_tokens, window_units = time.time(), 0, 0
      end_of_epoch = done % num_mb == 0
      do_eval = bool(val_units) and (done == total_micro or (
          config.eval_every_steps and done % config.eval_every_steps == 0) or (
              not config.eval_every_steps and end_of_epoch))
      do_ckpt = done == total_micro or (config.checkpoint_every_steps and
                                        done % config.checkpoint_every_steps == 0)
      if do_eval or do_ckpt:
        host_state = jax.device_get(take_state(dstate))
        meta = {"step": done, "epoch": epoch, "signature": signature,
                "data_iterator": data.get_state()}
        if do_eval:
          val = eval_fn(host_state.params)
          val_by_step[done] = val
          write({"event": "val", "step": done, "epoch": epoch, **val})
          _guarded_save(ckpt, done, lambda: ckpt.save_best(done, host_state, meta, val))
        if do_ckpt:
          _guarded_save(ckpt, done, lambda: ckpt.save(done, host_state, meta))
    bar.close()

    # Export the model for inference: the best-by-validation params if any, else the last ones.
    final_state = jax.device_get(take_state(dstate))
    export_params = final_state.params
    source = f"step {int(final_state.step)}"
    model_val = val
    if ckpt.best is not None and ckpt.best.best_step() is not None:
      best_state, best_meta = ckpt.restore(final_state, best=True)
      export_params, source = best_state.params, f"best step {best_meta['step']}"
      # The exported model's own validation, not the last one's (they differ when the last
      # validation is not the best).
      model_val = val_by_step.get(best_meta["step"], val)
    export_params = stage.export_params(export_params)
    model_dir = os.path.join(workdir, "model")
    if proc == 0:
      # The packer settings travel with the model so inference packs exactly as training did.
      info = {"stage": config.stage, "source": source, "val": model_val, "last_val": val,
              "packing": {"row_len": config.max_seq_len,
                          "max_query_tokens": config.max_query_tokens}}
      stage.save(model_dir, export_params, info)  # a LoG model folder, or the stage's own format
  write({"event": "end", "step": int(final_state.step), "loss": last_loss, "val": val})
  log.close()
  return {"step": int(final_state.step), "loss": last_loss, "val": val, "model_val": model_val,
          "model_source": source, "model_dir": model_dir, **cache_info}
