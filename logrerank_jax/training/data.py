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
import logging
import math
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from logrerank_jax.data.inference_input import (InferencePassage, InferenceRecord,
                                                parse_inference_record)
from logrerank_jax.data.jsonl import read_json_lines
from logrerank_jax.data.packing import PackingConfig, QueryInput, pack_for_model
from logrerank_jax.data.pool_files import expand_pools, read_corpus, read_pool_file
from logrerank_jax.data.records import TrainingRecord
from logrerank_jax.data.sentences import Sentence
from logrerank_jax.errors import ConfigError, DataError
from logrerank_jax.evaluation import read_qrels
from logrerank_jax.schema import MODEL_KEYS, NUM_ROLES, TOKEN_KEYS

log = logging.getLogger(__name__)


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
  teacher: tuple = ()           # [P] teacher scores of the passages (distillation), or ()
  gold: bool = True             # the passage ranks are gold labels (False: teacher-ranked only)


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


# Per-node distillation labels (not in the paper): the teacher score of the node's passage,
# whether it has one, and whether the node's query has gold passage labels.
TEACHER_KEYS = ("passage_teacher", "has_teacher", "gold_labels")


def node_labels(units: Sequence[Unit], node_passage: np.ndarray, node_sentence: np.ndarray):
  """Gather each node's labels from its (passage, sentence) indices; padding gets 0."""
  q, n = node_passage.shape
  sentence_rank = np.zeros((q, n), np.int32)
  passage_rank = np.zeros((q, n), np.int32)
  role_target = np.zeros((q, n, NUM_ROLES), np.float32)
  teacher = np.zeros((q, n), np.float32)
  has_teacher = np.zeros((q, n), bool)
  gold = np.zeros((q, n), bool)
  for qi, u in enumerate(units):
    for ni in range(n):
      p, s = int(node_passage[qi, ni]), int(node_sentence[qi, ni])
      if p < 0:
        continue
      sentence_rank[qi, ni] = u.sentence_rank[p][s]
      passage_rank[qi, ni] = u.passage_rank[p]
      role_target[qi, ni] = u.role[p][s]
      if u.teacher:
        teacher[qi, ni], has_teacher[qi, ni] = u.teacher[p], True
      gold[qi, ni] = u.gold
  return {"sentence_rank": sentence_rank, "passage_rank": passage_rank, "role_target": role_target,
          "passage_teacher": teacher, "has_teacher": has_teacher, "gold_labels": gold}


def read_teacher_file(path: str) -> Dict[str, Dict[str, Any]]:
  """Read teacher scores for distillation: JSONL `{"id": qid, "scores": {passage id: float},
  "labelled": bool}` (`labelled` False: the record's passage ranks only follow the teacher, so
  they are no gold labels; default True). Returns {qid: {"scores", "labelled"}}.

  Raises:
    DataError: a malformed line (named by line number), a repeated id or a non-finite score.
  """
  out: Dict[str, Dict[str, Any]] = {}
  for lineno, rec, error in read_json_lines(path):  # an unreadable file: its OSError
    where = f"{path}:{lineno}"
    if error is not None:
      raise DataError(f"{where}: invalid JSON ({error})") from None
    if not isinstance(rec, dict):
      rec = {}
    qid, scores = rec.get("id"), rec.get("scores")
    if not isinstance(qid, str) or not isinstance(scores, dict) or not scores:
      raise DataError(f"{where}: expected {{\"id\": str, \"scores\": {{passage id: float}}}}")
    if qid in out:
      raise DataError(f"{where}: query id {qid!r} repeats")
    bad = [k for k, v in scores.items() if isinstance(v, bool) or not isinstance(v, (int, float))
           or not math.isfinite(v)]
    if bad:
      raise DataError(f"{where}: scores of {bad[:3]} are not finite numbers")
    labelled = rec.get("labelled", True)
    if not isinstance(labelled, bool):
      raise DataError(f"{where}: 'labelled' must be true or false")
    out[qid] = {"scores": {str(k): float(v) for k, v in scores.items()}, "labelled": labelled}
  return out


def attach_teacher(units: Sequence[Unit], teacher: Dict[str, Dict[str, Any]],
                   source: str = "teacher file", allow_unmatched: bool = False) -> List[Unit]:
  """Units with their teacher scores and gold flag from `read_teacher_file` output.

  A unit whose query is in `teacher` must have a score for each of its passages, and every
  teacher entry must match a unit's query: a stale or mistyped teacher file would otherwise
  train without distillation, silently.

  Args:
    units: training units.
    teacher: {query id: {"scores", "labelled"}} (`read_teacher_file`).
    source: what `teacher` came from (its path), for the messages.
    allow_unmatched: log unmatched entries instead of refusing them, where some are expected
      (records the training file's `skip_invalid` dropped).

  Raises:
    DataError: a passage of such a query has no teacher score (names the query and passage), or
      (unless `allow_unmatched`) teacher entries match no unit (counts them, names the first).
  """
  qids = {u.qid for u in units}
  unmatched = [q for q in teacher if q not in qids]
  if unmatched:
    what = (f"{source}: {len(unmatched)} of {len(teacher)} teacher entries match no training "
            f"query (first: {unmatched[0]!r})")
    if not allow_unmatched:
      raise DataError(f"{what}; is it the teacher file of this training file?")
    log.warning("%s; ignored (skip_invalid: their records may be among the skipped lines)", what)
  out = []
  for u in units:
    t = teacher.get(u.qid)
    if t is None:
      out.append(u)
      continue
    missing = [p for p in u.passage_ids if p not in t["scores"]]
    if missing:
      raise DataError(f"teacher scores of query {u.qid!r} lack passage {missing[0]!r}")
    out.append(dataclasses.replace(u, teacher=tuple(t["scores"][p] for p in u.passage_ids),
                                   gold=t["labelled"]))
  return out


def pool_units(pools_path: str, qrels_path: str, corpus_path: str = ""
               ) -> tuple[List[Unit], Dict[str, set]]:
  """Validation units from an evaluation pool file (what `tools/evaluate.py` reads) and qrels.

  Each pool becomes one query unit: its passages split into sentences as inference splits them
  (`parse_inference_record`), titles kept for the passage cross-encoder. Id-only pools
  (`ctx_ids`) are resolved against `corpus_path`. The passage ranks are placeholders (1..P in
  pool order): only the qrels say what is relevant.

  Raises:
    DataError: a pool without usable text for some passage, or a pool without qrels.
  """
  pools = read_pool_file(pools_path)
  if corpus_path:
    pools = expand_pools(pools, read_corpus(corpus_path))
  qrels = read_qrels(qrels_path)
  units, line_of = [], {}
  for i, raw in enumerate(pools):
    rec = parse_inference_record(raw, f"{pools_path}:{i + 1}")
    if rec.skipped:
      raise DataError(f"{pools_path}:{i + 1}: passage {rec.skipped[0][0]}: {rec.skipped[0][1]}")
    # A pool without an id is named by its position (0-based, as tools/evaluate.py names it);
    # two pools of one name would share one qrels entry and one metric, so that is an error.
    qid = rec.record_id or str(i)
    if qid in line_of:
      raise DataError(f"{pools_path}:{i + 1}: query id {qid!r} is also the id of line "
                      f"{line_of[qid]}; validation pools need distinct ids")
    line_of[qid] = i + 1
    if not qrels.get(qid):
      raise DataError(f"{pools_path}:{i + 1}: query {qid!r} has no relevant passage in {qrels_path}")
    ids = tuple(p.passage_id or str(j) for j, p in enumerate(rec.passages))
    units.append(Unit(
        qid=qid, query=QueryInput(rec.query, rec.sentence_texts), passage_ids=ids,
        passage_rank=tuple(range(1, len(ids) + 1)),
        sentence_rank=tuple(tuple(range(1, len(p.sentences) + 1)) for p in rec.passages),
        role=tuple(tuple((1.0 / NUM_ROLES,) * NUM_ROLES for _ in p.sentences)
                   for p in rec.passages),
        passage_titles=tuple(p.title for p in rec.passages)))
  return units, {u.qid: set(qrels[u.qid]) for u in units}


def unit_record(unit: Unit) -> InferenceRecord:
  """The inference engine's record of a query unit: its query and passages, each passage's text
  the unit's sentences joined by one space (offsets into it), so the engine packs exactly the
  unit's sentences (`serving.Reranker.score` reads `sentence_texts`; titles are not packed)."""
  passages = []
  for j, sentences in enumerate(unit.query.passages):
    spans, start = [], 0
    for text in sentences:
      spans.append(Sentence(text, start, start + len(text)))
      start += len(text) + 1
    title = unit.passage_titles[j] if j < len(unit.passage_titles) else ""
    passages.append(InferencePassage(title, " ".join(sentences), tuple(spans),
                                     unit.passage_ids[j]))
  return InferenceRecord(unit.query.query, tuple(passages), "passages", {}, unit.qid)


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
  out.update(node_labels(units, packed.node_passage, packed.node_sentence))
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
  for k in TEACHER_KEYS:
    out[k] = np.pad(batch[k], ((0, q - q0), (0, n - n0)))
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
             passage_teacher=np.zeros((q, n), np.float32), has_teacher=np.zeros((q, n), bool),
             gold_labels=np.zeros((q, n), bool), real_tokens=np.asarray(0, np.int64))
  return out
