"""Token micro-batches of the training stages: streamed on demand, each padded to its shape
bucket, with shapes agreed across the processes of a multi-host run."""

import collections.abc
import copy
from typing import Callable, Dict, List

import jax
import numpy as np

from logrerank_jax.data.packing import PackingConfig
from logrerank_jax.training import data as data_lib


class StreamedBatches(collections.abc.Sequence):
  """[micro-batch] -> its per-device shares, built on demand: nothing is held in memory.

  `make(i)` builds micro-batch i; it must be deterministic (the trainer rebuilds a step's
  batch after a resume). Host work runs in the trainer's data iterator (`loop.data_iterator`),
  which prefetches the next steps' batches on a worker thread while the devices train.
  """

  def __init__(self, num: int, make: Callable[[int], List[Dict[str, np.ndarray]]]):
    self._num, self._make = int(num), make

  def __len__(self) -> int:
    return self._num

  def __getitem__(self, i: int):
    if not -self._num <= i < self._num:
      raise IndexError(f"micro-batch {i} of {self._num}")
    return self._make(int(i) % self._num)


def max_over_processes(own: np.ndarray) -> np.ndarray:
  """The element-wise maximum of every process's `own` (int64 array of one shape): the padded
  shapes a multi-host run agrees on, so that every process compiles the same programs."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return np.max(multihost_utils.process_allgather(own), 0)


def pack_token_batches(units, groups, shares_of: Callable, tokenizer, pack_cfg: PackingConfig,
                       contextual_encoding: bool, shape_buckets: bool = True) -> StreamedBatches:
  """Every micro-batch's per-device shares, padded to its row bucket's shape, streamed.

  A first pass packs each share of this process only to learn its shape and keeps nothing but
  the shapes; the micro-batches are packed again, on demand, when the trainer reaches them
  (host memory O(one micro-batch), at the price of tokenising the process's shard twice).

  Args:
    units: training units.
    groups: micro-batches as lists of unit indices.
    shares_of: micro-batch -> this process's per-device shares (lists of unit indices).
    tokenizer, pack_cfg, contextual_encoding: how to pack.
    shape_buckets: True: a micro-batch is padded to the largest shape among the micro-batches
      with as many packed rows (the packer's row counts come from a short ladder, so a few
      compiles); False: every micro-batch to the run's largest shape (one compile).

  Returns:
    [micro-batch][device share] packed dicts; the shares of one micro-batch have one shape,
    the same on every process of a multi-host run; a device without units gets an inert share.
  """
  own = []
  for g in groups:
    sh = [data_lib.batch_shape(data_lib.pack_units([units[i] for i in s], tokenizer,
                                                   pack_cfg, contextual_encoding))
          for s in shares_of(g) if s]
    own.append(data_lib.max_shape(sh) if sh else (0, 0, 0, 0, 0))
  if jax.process_count() > 1:
    own = [tuple(int(x) for x in row) for row in max_over_processes(np.asarray(own, np.int64))]
  shape_of = data_lib.bucketed_shapes(own, data_lib.rows_bucket if shape_buckets else None)
  # Its own tokenizer: the prefetch thread packs while the main thread may pack validation
  # batches, and a HF fast tokenizer is not safe to drive from two threads at once.
  tok = copy.deepcopy(tokenizer)

  def make(i):
    shape = shape_of[i]
    return [data_lib.pad_batch(data_lib.pack_units([units[j] for j in s], tok, pack_cfg,
                                                   contextual_encoding), shape)
            if s else data_lib.empty_batch(shape) for s in shares_of(groups[i])]
  return StreamedBatches(len(groups), make)
