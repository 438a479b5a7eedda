"""Orbax checkpoints: periodic ones for resuming, best-by-validation ones for keeping.

A checkpoint holds the whole `TrainState` (params, optimizer state, step, RNG key) and a small JSON
record (data position, epoch, metrics, config), so a killed run resumes exactly. Orbax writes to a
temporary directory and renames it when complete, so a kill during a save leaves the previous
checkpoint intact and the partial one invisible.
"""

import os
from typing import Any, Dict, Optional, Tuple

import flax
import jax
import numpy as np
import orbax.checkpoint as ocp

from logrerank_jax.errors import CheckpointError


def _manager(directory: str, max_to_keep: Optional[int], best_metric: Optional[str] = None,
             best_mode: str = "max") -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep,
      best_fn=(lambda m: float(m[best_metric])) if best_metric else None,
      best_mode=best_mode,
      keep_checkpoints_without_metrics=best_metric is None,
      # Synchronous saves: when `save` returns the checkpoint is on disk, which is what a
      # preemptible run needs before it continues.
      enable_async_checkpointing=False,
      # A save killed or failed mid-way leaves a *.orbax-checkpoint-tmp folder; drop it on start.
      cleanup_tmp_directories=True,
      create=True)
  return ocp.CheckpointManager(
      os.path.abspath(directory), options=options,
      item_handlers={"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()})


def _path_str(path) -> str:
  """Return 'a/b/0' for a key path, the same for dict keys, list indices and attributes."""
  return "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def _shape_mismatches(saved_tree, target_tree):
  """Return 'path: saved (shape) vs expected (shape)' lines for leaves that differ."""
  def flat(tree, shape_of):
    # Compare as plain nested dicts: orbax stores dataclasses and namedtuples that way.
    tree = flax.serialization.to_state_dict(tree)
    return {_path_str(k): shape_of(v) for k, v in jax.tree_util.tree_leaves_with_path(
        tree, is_leaf=lambda x: hasattr(x, "shape"))}
  saved = flat(saved_tree, lambda v: tuple(getattr(v, "shape", ())))
  target = flat(target_tree, lambda v: tuple(np.shape(v)))
  lines = [f"{k}: missing from checkpoint" for k in sorted(target.keys() - saved.keys())]
  lines += [f"{k}: not in the model" for k in sorted(saved.keys() - target.keys())]
  lines += [f"{k}: checkpoint {saved[k]} vs model {target[k]}"
            for k in sorted(saved.keys() & target.keys()) if saved[k] != target[k]]
  return lines


class Checkpointer:
  """Periodic checkpoints under `workdir/checkpoints`, best ones under `workdir/best`."""

  def __init__(self, workdir: str, max_to_keep: int = 2, best_metric: Optional[str] = None,
               best_mode: str = "max", keep_best: int = 1):
    """Open (or create) the checkpoint folders of `workdir`.

    Args:
      workdir: the run's folder.
      max_to_keep: periodic checkpoints kept (oldest deleted first).
      best_metric: validation metric that ranks best checkpoints; None disables them.
      best_mode: "max" or "min" for `best_metric`.
      keep_best: best checkpoints kept.
    """
    self.workdir = workdir
    self._max_to_keep, self._keep_best, self._best_mode = max_to_keep, keep_best, best_mode
    self.periodic = _manager(os.path.join(workdir, "checkpoints"), max_to_keep)
    self.best_metric = best_metric
    self.best = (_manager(os.path.join(workdir, "best"), keep_best, best_metric, best_mode)
                 if best_metric else None)

  def save(self, step: int, state: Any, meta: Dict[str, Any]) -> None:
    """Write a periodic checkpoint of `state` with the JSON-serialisable `meta` at `step`."""
    try:
      self.periodic.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
      self.periodic.wait_until_finished()
    except Exception:
      self.periodic = self._reopen(self.periodic, os.path.join(self.workdir, "checkpoints"),
                                   self._max_to_keep)
      raise

  def save_best(self, step: int, state: Any, meta: Dict[str, Any], metrics: Dict[str, float]) -> bool:
    """Keep `state` if `metrics[best_metric]` is among the best seen; return whether it was."""
    if self.best is None:
      return False
    if self.best_metric not in metrics:
      raise CheckpointError(f"validation metrics lack the best-checkpoint metric '{self.best_metric}'")
    try:
      self.best.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
                     metrics={k: float(v) for k, v in metrics.items()}, force=True)
      self.best.wait_until_finished()
    except Exception:
      self.best = self._reopen(self.best, os.path.join(self.workdir, "best"), self._keep_best,
                               self.best_metric, self._best_mode)
      raise
    return self.best.best_step() == step

  @staticmethod
  def _reopen(mngr: ocp.CheckpointManager, directory: str, *args) -> ocp.CheckpointManager:
    """Close a manager whose save failed (e.g. disk full) and open a fresh one on `directory`.

    A failed save leaves orbax's tensorstore writes and futures behind; closed now, they finish
    while their event loop is alive. Left open (the trainer re-raises the error and never gets to
    `close`), the garbage collector finalises them later against a closed loop ("Event loop is
    closed"). The fresh manager drops the failed save's tmp folder and keeps the object usable
    (`latest_step`, `restore`, another `save`).
    """
    try:
      mngr.close()
    except Exception:  # pylint: disable=broad-except  (the save's own error is the one to report)
      pass
    return _manager(directory, *args)

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def latest_step(self) -> Optional[int]:
    """Return the step of the newest complete periodic checkpoint, or None."""
    return self.periodic.latest_step()

  def restore(self, target_state: Any, step: Optional[int] = None, best: bool = False
              ) -> Tuple[Any, Dict[str, Any]]:
    """Restore a checkpoint into the structure of `target_state`.

    Args:
      target_state: a state of the same structure and shapes (e.g. freshly initialised).
      step: which step; default the latest periodic one (or the best one with `best=True`).
      best: read from the best-checkpoint folder.

    Returns:
      `(state, meta)`.

    Raises:
      CheckpointError: no checkpoint exists, or its shapes differ from `target_state` (listed).
    """
    mngr = self.best if best else self.periodic
    if mngr is None:
      raise CheckpointError("no best-checkpoint folder: the run has no best_metric")
    if step is None:
      step = mngr.best_step() if best else mngr.latest_step()
    if step is None:
      raise CheckpointError(f"no checkpoint under {mngr.directory}")
    saved = mngr.item_metadata(step)["state"]
    bad = _shape_mismatches(saved, target_state)
    if bad:
      raise CheckpointError(f"checkpoint {mngr.directory}/{step} does not match the model: "
                            + "; ".join(bad[:20]) + (f"; ... {len(bad) - 20} more" if len(bad) > 20 else ""))
    restored = mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target_state), meta=ocp.args.JsonRestore()))
    return restored["state"], dict(restored["meta"])

  def close(self) -> None:
    """Release the managers (flushes pending work)."""
    self.periodic.close()
    if self.best is not None:
      self.best.close()
