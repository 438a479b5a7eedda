"""The data-parallel micro-step loop of `trainer.train_and_evaluate`: the parallel step (pmap,
shard_map or jit) and how a micro-batch's shares reach the devices, the streaming data iterator,
and each step's training record, validation and checkpoint.

Data order: step s is micro-batch `permutation(seed + 1 + epoch)[s % num_mb]` of epoch
s // num_mb (`data_iterator`), so the micro-step counter alone fixes the data position; the
iterator's state is saved in every checkpoint's meta and restored on resume.
"""

import dataclasses
import functools
import math
import time
from typing import Any, Callable, Dict, List

import jax
import numpy as np

from logrerank_jax.errors import CheckpointError, ConfigError, LogRerankError
from logrerank_jax.training import optim
from logrerank_jax.training import step as step_lib
from logrerank_jax.training.checkpoints import Checkpointer
from logrerank_jax.training.metric_log import MetricLog


class TrainingDivergedError(LogRerankError):
  """The loss became NaN or infinite; the message names the step."""


# ----------------------------------------------------------------------------- parallel steps

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


def make_runner(loss_fn, coefficients, tx, mode, devices):
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


# ----------------------------------------------------------------------------- the loop

@dataclasses.dataclass
class LoopContext:
  """What the micro-step loop (`train_steps`) reads: the run, its step function, its logs."""
  config: Any
  workdir: str
  proc: int
  ckpt: Checkpointer
  run: Callable
  take_state: Callable
  mesh: Any
  eval_fn: Callable
  log: MetricLog
  signature: Dict[str, Any]
  batches: Any
  groups: List[List[int]]
  num_mb: int
  total_micro: int
  total_updates: int
  has_val: bool


class _Throughput:
  """Real tokens and units trained since the last training record, and since when."""

  def __init__(self):
    self.reset()

  def reset(self) -> None:
    self.t, self.tokens, self.units = time.time(), 0, 0

  def add(self, shares, group) -> None:
    self.tokens += sum(int(b.get("real_tokens", 0)) for b in shares)
    self.units += len(group)

  def rates(self) -> Dict[str, float]:
    dt = max(time.time() - self.t, 1e-9)
    return {"tokens_per_s": self.tokens / dt, "units_per_s": self.units / dt}


def _run_step(loop: LoopContext, dstate, shares, s: int, epoch: int):
  """Micro-step `s` on the devices: (device state after it, its metrics as floats).

  Raises:
    TrainingDivergedError: a NaN or infinite loss (the last good checkpoint is named).
  """
  config = loop.config
  dstate, metrics = loop.run(dstate, _place(shares, config.parallel, loop.mesh))
  if config.parallel == "pmap":
    metrics = loop.take_state(metrics)  # identical on every device
  metrics = {k: float(np.asarray(jax.device_get(v)).reshape(-1)[0]) for k, v in metrics.items()}
  if not math.isfinite(metrics["loss"]):
    raise TrainingDivergedError(
        f"non-finite loss {metrics['loss']} at micro-step {s + 1} (epoch {epoch}); the last good "
        f"checkpoint is step {loop.ckpt.latest_step()} in {loop.workdir}/checkpoints")
  return dstate, metrics


def _train_record(loop: LoopContext, done: int, epoch: int, metrics, window: _Throughput):
  """The "train" record of micro-step `done`: its metrics, learning rate and throughput."""
  config = loop.config
  rates = window.rates()
  return {"event": "train", "step": done, "epoch": epoch, **metrics,
          "lr": float(optim.warmup_linear_decay(config.learning_rate, loop.total_updates,
                                                config.warmup_fraction)(done // config.grad_accum_steps)),
          **rates}


def _due(loop: LoopContext, done: int):
  """(validate, checkpoint) after micro-step `done`: validation every `eval_every_steps`, or at
  each epoch's end without it; checkpoints every `checkpoint_every_steps`; both at the end."""
  config, total_micro = loop.config, loop.total_micro
  end_of_epoch = done % loop.num_mb == 0
  do_eval = loop.has_val and (done == total_micro or (
      config.eval_every_steps and done % config.eval_every_steps == 0) or (
          not config.eval_every_steps and end_of_epoch))
  do_ckpt = done == total_micro or (config.checkpoint_every_steps and
                                    done % config.checkpoint_every_steps == 0)
  return do_eval, do_ckpt


def _evaluate_and_save(loop: LoopContext, dstate, data, done: int, epoch: int, do_eval, do_ckpt,
                       val, val_by_step):
  """Validate (logged, and saved as best when it is) and/or checkpoint after micro-step `done`;
  returns the newest validation metrics."""
  ckpt = loop.ckpt
  host_state = jax.device_get(loop.take_state(dstate))
  meta = {"step": done, "epoch": epoch, "signature": loop.signature,
          "data_iterator": data.get_state()}
  if do_eval:
    val = loop.eval_fn(host_state.params)
    val_by_step[done] = val
    loop.log.write({"event": "val", "step": done, "epoch": epoch, **val})
    _guarded_save(ckpt, done, lambda: ckpt.save_best(done, host_state, meta, val))
  if do_ckpt:
    _guarded_save(ckpt, done, lambda: ckpt.save(done, host_state, meta))
  return val


def train_steps(loop: LoopContext, dstate, start: int, data_state, last_loss, val, val_by_step):
  """Micro-steps `start`..total_micro-1, logged, validated and checkpointed as configured;
  returns (device state, last training loss, last validation metrics)."""
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  config = loop.config
  bar = tqdm(total=loop.total_micro, initial=start,
             disable=not config.progress_bar or loop.proc != 0,
             desc=f"{config.stage} stage", mininterval=2.0)
  window = _Throughput()
  # An older checkpoint has no iterator state; its step is the data position all the same.
  data = data_iterator(loop.batches, loop.num_mb, loop.total_micro, config.seed,
                       data_state if data_state is not None else {"next_index": start})
  if start == 0 and loop.has_val and config.get("validate_at_start", False):
    # Step 0 is a candidate too: the model as initialised (for LoG's global stage with a
    # residual score, exactly the local stage), so selection can keep it when training hurts.
    val = _evaluate_and_save(loop, dstate, data, 0, 0, True, False, val, val_by_step)
  for s in range(start, loop.total_micro):
    item = next(data)
    if item["step"] != s:  # the iterator and the step counter move together, or nothing runs
      raise CheckpointError(f"data iterator at micro-step {item['step']}, training at {s}")
    epoch, shares = s // loop.num_mb, item["shares"]
    dstate, metrics = _run_step(loop, dstate, shares, s, epoch)
    last_loss = metrics["loss"]
    window.add(shares, loop.groups[item["micro_batch"]])
    bar.update(1)
    done = s + 1
    if done % config.log_every_steps == 0 or done == loop.total_micro:
      loop.log.write(_train_record(loop, done, epoch, metrics, window))
      bar.set_postfix(loss=f"{last_loss:.4f}")
      window.reset()
    do_eval, do_ckpt = _due(loop, done)
    if do_eval or do_ckpt:
      val = _evaluate_and_save(loop, dstate, data, done, epoch, do_eval, do_ckpt, val,
                               val_by_step)
  bar.close()
  return dstate, last_loss, val
