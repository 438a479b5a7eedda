"""A training run's metric log: `metrics.jsonl` and TensorBoard event files in one place.

`train_and_evaluate` hands every record it logs to `MetricLog.write`: the record is appended to
`WORKDIR/metrics.jsonl` (the machine-readable log that `tools/plot_training.py` and resumption
read) and its numbers become TensorBoard scalars in `WORKDIR/tensorboard/`, so that

    tensorboard --logdir runs/demo

shows each stage's run (`passage/tensorboard`, `local/tensorboard`, `global/tensorboard`) side by
side. Scalars, at the record's micro-step:
  train/<term>      the loss and each of its terms (rank, role, pairwise, ...) of "train" records
  train/lr          the learning rate
  throughput/<x>    tokens_per_s, units_per_s
  val/<metric>      each validation metric of "val" records (ndcg_at_10, map_at_10, recall_at_10, ...)

Tag names: TensorBoard accepts only [-/\w.] in a tag (tensorboardX rewrites any other character
to "_" with a log line), so a metric's "@" is spelled "_at_" here (`tag_for`): "ndcg@10" in
metrics.jsonl is "val/ndcg_at_10" in TensorBoard.

The events are written with `tensorboardX` (a small pure-Python writer; the `tensorboard` package
is only needed to view or read them), imported here and only when a run starts, so nothing else in
the library pays for it. A resumed run purges the events at or after its restart step
(`purge_step`), as it continues from the checkpoint, so curves never hold two copies of a step.
Only process 0 of a multi-host run writes.
"""

import json
import math
import os
from typing import Any, Dict, Optional

TENSORBOARD_DIR = "tensorboard"
_NOT_SCALARS = {"event", "step", "epoch", "stage"}
_THROUGHPUT = {"tokens_per_s", "units_per_s"}


def tag_for(kind: str, key: str) -> str:
  """The TensorBoard tag of `key` in a record of `kind` ("train" or "val")."""
  key = key.replace("@", "_at_")
  if kind == "val":
    return f"val/{key}"
  return f"throughput/{key}" if key in _THROUGHPUT else f"train/{key}"


def _scalars(rec: Dict[str, Any]):
  """(tag, value) of the record's finite numbers, named by the record's kind."""
  kind = rec.get("event")
  if kind not in ("train", "val"):
    return
  for key, value in rec.items():
    if key in _NOT_SCALARS or isinstance(value, bool) or not isinstance(value, (int, float)):
      continue
    if not math.isfinite(value):
      continue
    yield tag_for(kind, key), float(value)


class MetricLog:
  """Append-only JSONL log plus TensorBoard scalars of one training run (a context manager)."""

  def __init__(self, workdir: str, enabled: bool = True, start_step: int = 0):
    """Open the logs of `workdir`.

    Args:
      workdir: the run folder.
      enabled: False on processes other than 0: nothing is written.
      start_step: the micro-step the run starts (or resumes) at; TensorBoard events at or after
        it, left by an interrupted earlier run, are purged.
    """
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.tensorboard_dir = os.path.join(workdir, TENSORBOARD_DIR)
    self._file = open(self.path, "a", encoding="utf-8") if enabled else None
    self._tb = None
    if enabled:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      self._tb = SummaryWriter(self.tensorboard_dir, purge_step=start_step or None,
                               flush_secs=30)

  def write(self, rec: Dict[str, Any]) -> None:
    """Log one record (a dict with "event" and, for train/val records, "step")."""
    if self._file is None:
      return
    self._file.write(json.dumps(rec) + "\n")
    self._file.flush()
    step: Optional[int] = rec.get("step")
    if self._tb is not None and step is not None:
      for tag, value in _scalars(rec):
        self._tb.add_scalar(tag, value, int(step))
      if rec.get("event") == "val":
        self._tb.flush()  # validation points are rare and the ones a user waits for

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None
    if self._tb is not None:
      self._tb.close()
      self._tb = None

  def __enter__(self) -> "MetricLog":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
