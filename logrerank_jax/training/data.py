"""Turn training records into fixed-shape, per-device micro-batches with node-layout labels.

Two kinds of training unit:
  * local stage: one (query, passage) pair. Each is packed as its own query slot holding one
    passage, so the node layout [Q, N] of a micro-batch *is* the per-passage layout [P, M] that
    the listwise and role losses take (eq 19-22).
  * global stage: one query with all its passages (one graph per query slot, eq 23).

Shapes: every micro-batch of a run is padded to the same (R, L, S, Q, N), taken as the maximum
over the run's micro-batches, so a training run compiles its step once. All micro-batches are
packed up front (host NumPy); that costs host memory proportional to the data and is fine for
the demo and for datasets of tens of thousands of queries.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from logrerank_jax.data.packing import PackingConfig, QueryInput, pack_for_model
from logrerank_jax.data.records import TrainingRecord
from logrerank_jax.errors import ConfigError
from logrerank_jax.schema import MODEL_KEYS, NUM_ROLES, TOKEN_KEYS


@dataclasses.dataclass(frozen=True)
class Unit:
  """One training unit: a query with some of its passages, and their labels."""
  qid: str
  query: QueryInput
  passage_ids: tuple            # passage ids, in `query.passages` order
  passage_rank: tuple           # [P] gold passage ranks (1 = best)
  sentence_rank: tuple          # [P][M] gold sentence ranks
  role: tuple                   # [P][M][3] role targets
  passage_titles: tuple = ()    # [P] passage titles (the passage cross-encoder reads them)


def _unit(rec: TrainingRecord, passages) -> Unit:
  return Unit(
      qid=rec.id,
      query=QueryInput(rec.question, [[s.text for s in p.sentences] for p in passages]),
      passage_ids=tuple(p.id for p in passages),
      passage_rank=tuple(p.rank for p in passages),
      sentence_rank=tuple(tuple(s.rank for s in p.sentences) for p in passages),
      role=tuple(tuple(tuple(s.role) for s in p.sentences) for p in passages),
      passage_titles=tuple(p.title for p in passages))


def local_units(records: Sequence[TrainingRecord]) -> List[Unit]:
  """Return one unit per (query, passage) pair, in file order."""
  return [_unit(r, [p]) for r in records for p in r.passages]


def query_units(records: Sequence[TrainingRecord]) -> List[Unit]:
  """Return one unit per query, with all its passages."""
  return [_unit(r, list(r.passages)) for r in records]


def _labels(units: Sequence[Unit], node_passage: np.ndarray, node_sentence: np.ndarray):
  """Gather each node's labels from its (passage, sentence) indices; padding gets 0."""
  q, n = node_passage.shape
  sentence_rank = np.zeros((q, n), np.int32)
  passage_rank = np.zeros((q, n), np.int32)
  role_target = np.zeros((q, n, NUM_ROLES), np.float32)
  for qi, u in enumerate(units):
    for ni in range(n):
      p, s = int(node_passage[qi, ni]), int(node_sentence[qi, ni])
      if p < 0:
        continue
      sentence_rank[qi, ni] = u.sentence_rank[p][s]
      passage_rank[qi, ni] = u.passage_rank[p]
      role_target[qi, ni] = u.role[p][s]
  return {"sentence_rank": sentence_rank, "passage_rank": passage_rank, "role_target": role_target}


def pack_units(units: Sequence[Unit], tokenizer, packing_cfg: PackingConfig,
               contextual_encoding: bool = True) -> Dict[str, np.ndarray]:
  """Pack units into one micro-batch: model arrays plus node-layout labels.

  Args:
    units: the units of one device's share of a micro-batch.
    tokenizer: fast tokenizer.
    packing_cfg: packer settings.
    contextual_encoding: the model's `LoGConfig.contextual_encoding` (joint passages, or one
      sentence per sequence).

  Returns:
    Dict of NumPy arrays: the model's arrays (`schema.MODEL_KEYS`), the labels
    (`schema.LABEL_KEYS`), and `real_tokens` [] int64.
  """
  packed, info = pack_for_model([u.query for u in units], tokenizer, packing_cfg,
                                contextual_encoding)
  out = {k: np.asarray(getattr(packed, k)) for k in MODEL_KEYS}
  out.update(_labels(units, packed.node_passage, packed.node_sentence))
  out["real_tokens"] = np.asarray(info.real_tokens, np.int64)
  return out


def batch_shape(batch: Dict[str, np.ndarray]) -> tuple:
  """Return (R, L, S, Q, N) of a packed micro-batch."""
  r, l = batch["input_ids"].shape
  q, n = batch["node_mask"].shape
  return r, l, batch["span_kind"].shape[0], q, n


def bucketed_shapes(shapes: Sequence[tuple], bucket_of: Optional[Callable[[tuple], Any]]
                    ) -> List[tuple]:
  """One padded shape per micro-batch: the elementwise maximum over the micro-batches of its
  bucket (`bucket_of(shape)`), or over all of them when `bucket_of` is None.

  One compile per bucket instead of one for the run: with a single run-wide shape a few
  micro-batches that need twice the rows make every step compute them (measured on the demo's
  paragraph records: 3 of 200 micro-batches at 16 rows, 175 at 8, so half the work was filler);
  with no common shape at all every micro-batch compiles anew.
  """
  if bucket_of is None:
    top = max_shape(list(shapes))
    return [top] * len(shapes)
  by_bucket: Dict[Any, List[tuple]] = {}
  for shape in shapes:
    by_bucket.setdefault(bucket_of(shape), []).append(shape)
  top = {b: max_shape(v) for b, v in by_bucket.items()}
  return [top[bucket_of(shape)] for shape in shapes]


def rows_bucket(shape: tuple) -> int:
  """The bucket of a packed batch shape (R, L, S, Q, N): its row count R, which the packer
  already draws from a short ladder."""
  return int(shape[0])


def pad_batch(batch: Dict[str, np.ndarray], shape: tuple) -> Dict[str, np.ndarray]:
  """Pad a packed micro-batch up to `shape` = (R, L, S, Q, N); padding is inert everywhere.

  Args:
    batch: output of `pack_units`.
    shape: target sizes, each >= the batch's own.

  Returns:
    The padded batch; flat node indices in `span_node` are re-based to the new N.
  """
  r, l, s, q, n = shape
  r0, l0, s0, q0, n0 = batch_shape(batch)
  if min(r - r0, l - l0, s - s0, q - q0, n - n0) < 0:
    raise ConfigError(f"cannot pad a batch of shape {(r0, l0, s0, q0, n0)} down to {shape}")
  out = {}
  for k in TOKEN_KEYS:
    out[k] = np.pad(batch[k], ((0, r - r0), (0, l - l0)))
  node = batch["span_node"]
  # A flat index q*N0 + n becomes q*N + n.
  node = np.where(node >= 0, (node // n0) * n + node % n0, -1)
  out["span_node"] = np.pad(node, (0, s - s0), constant_values=-1)
  out["span_kind"] = np.pad(batch["span_kind"], (0, s - s0))
  out["span_query"] = np.pad(batch["span_query"], (0, s - s0))
  out["node_passage"] = np.pad(batch["node_passage"], ((0, q - q0), (0, n - n0)), constant_values=-1)
  out["node_mask"] = np.pad(batch["node_mask"], ((0, q - q0), (0, n - n0)))
  for k in ("sentence_rank", "passage_rank"):
    out[k] = np.pad(batch[k], ((0, q - q0), (0, n - n0)))
  out["role_target"] = np.pad(batch["role_target"], ((0, q - q0), (0, n - n0), (0, 0)))
  out["real_tokens"] = batch["real_tokens"]
  return out


def group_micro_batches(num_units: int, size: int, seed: int) -> List[List[int]]:
  """Shuffle unit indices with `seed` and cut them into micro-batches of `size` (last may be short).

  No unit is dropped: a short last micro-batch is padded with inert slots by the caller.
  """
  order = np.random.RandomState(seed).permutation(num_units)
  return [order[i:i + size].tolist() for i in range(0, num_units, size)]


def split_global_batch(units: Sequence, micro_batch_size: int, num_shards: int) -> List[List]:
  """Split a global micro-batch into `num_shards` contiguous shares of `micro_batch_size // num_shards`.

  A short (last) micro-batch gives short or empty trailing shares; the loss weights make that exact.
  """
  if micro_batch_size % num_shards:
    raise ConfigError(f"micro_batch_size={micro_batch_size} is not divisible by the {num_shards} "
                      "data-parallel devices; set it to a multiple of the device count")
  size = micro_batch_size // num_shards
  return [list(units[i * size:(i + 1) * size]) for i in range(num_shards)]


def max_shape(shapes: Sequence[tuple]) -> tuple:
  """Return the elementwise maximum of (R, L, S, Q, N) tuples."""
  return tuple(int(x) for x in np.max(np.asarray(shapes), axis=0))


def empty_batch(shape: tuple, d_feature: Optional[int] = None) -> Dict[str, np.ndarray]:
  """Return an all-padding micro-batch share of `shape` (a device with no unit this step)."""
  r, l, s, q, n = shape
  out = {k: np.zeros((r, l), np.int32) for k in TOKEN_KEYS}
  out.update(span_kind=np.zeros((s,), np.int32), span_query=np.zeros((s,), np.int32),
             span_node=np.full((s,), -1, np.int32), node_passage=np.full((q, n), -1, np.int32),
             node_mask=np.zeros((q, n), bool), sentence_rank=np.zeros((q, n), np.int32),
             passage_rank=np.zeros((q, n), np.int32), role_target=np.zeros((q, n, NUM_ROLES), np.float32),
             real_tokens=np.asarray(0, np.int64))
  return out
