"""The split dense prior's pass on deduplicated segments, cached by their tokens.

A model with a split dense prior (`LocalScorerConfig.dense_prior_encoding="split"`, the demo's)
encodes every packed sequence `[CLS] q [SEP] s_1 ... s_m [SEP]` twice: jointly, and once more
as a bi-encoder, the query side and the passage side each its own attention segment
(`local_scorer.split_query_passage`). The second pass is half the local stage's encoder work,
and none of it depends on the pair: the query side's states are the query's alone, the passage
side's the passage window's alone. A query is repeated in every one of its sequences, and
evaluation pools share passages (the 110 ScholarQA-CS pools hold 5,500 passages, 2,065 of them
distinct; the 50 evidence pools 2,500 and 1,305). So the engine runs that pass here instead:

* `call_units` cuts a packed local call into its segments as the split layout has them: each
  sequence's query side (`[CLS] q`, or `[CLS] q [SEP]` without `dense_prior_passage_cls`) and
  passage side (`[CLS] s_1 ... s_m [SEP]`, or `s_1 ... s_m [SEP]` at positions from 1), keyed by
  their token ids and span layout;
* `PriorCache.attach` encodes the segments it has not seen (`LoGReranker.prior_spans`: the same
  encoder params, the same pooling code) packed into rows of their own, keeps each segment's
  pooled spans, and hands every local call its `prior_pooled` [S, d], which the local forward
  reads instead of running the pass.

Same computation per segment; only the packing (which rows, which neighbours in a row, never
attended) differs, so the prior's cosines agree with the in-graph pass to float rounding
(tests/test_prior_cache.py). The cache belongs to one set of params: `Engine.set_params`
clears it. It is bounded (least recently used segments are dropped past `max_segments`).
"""

import collections
from typing import Dict, List, Tuple

import numpy as np

from logrerank_jax.errors import DataError
from logrerank_jax.schema import SPAN_SENTENCE

# Segments kept per engine: 16,384 segments of ~5 pooled spans of d = 768 float32 is ~250 MB at
# worst; evaluation sets hold a few thousand distinct segments.
DEFAULT_MAX_SEGMENTS = 16384


def uses_split_prior(local_cfg) -> bool:
  """Whether a `LocalScorerConfig` runs the split dense prior's second pass."""
  return bool(local_cfg.use_dense_prior and local_cfg.dense_prior_encoding == "split")


class Unit:
  """One segment of the split layout: its tokens, positions, spans (1.. in order, 0 = not
  pooled) and the spans of the local call they stand for."""
  __slots__ = ("key", "ids", "positions", "rel_spans", "call_spans")

  def __init__(self, ids: np.ndarray, positions: np.ndarray, spans: np.ndarray):
    ids = np.ascontiguousarray(ids, np.int32)
    pooled = spans > 0
    self.call_spans = np.unique(spans[pooled])  # spans are numbered in order within a sequence
    rel = np.zeros(len(spans), np.int32)
    rel[pooled] = np.searchsorted(self.call_spans, spans[pooled]) + 1
    self.ids, self.positions, self.rel_spans = ids, positions.astype(np.int32), rel
    # Tokens and span layout decide the pooled spans (positions follow from the side).
    self.key = (positions[:1].tobytes(), ids.tobytes(), rel.tobytes())


def call_units(arrays: Dict[str, np.ndarray], passage_cls: bool) -> List[Unit]:
  """The split layout's segments of one packed local call (two per sequence, in row order).

  Mirrors `local_scorer.split_query_passage`: a sequence's passage side starts at its first
  sentence token; with `passage_cls` the query side's closing [SEP] slot becomes the passage
  side's [CLS] (the sequence's first token id, position 0), else the passage side starts at
  position 1 and the query side keeps its [SEP].
  """
  ids, seg, spans = arrays["input_ids"], arrays["segment_ids"], arrays["span_ids"]
  is_sent = arrays["span_kind"] == SPAN_SENTENCE
  units = []
  for r in np.flatnonzero(seg.any(axis=1)):
    row = seg[r]
    starts = np.flatnonzero(np.diff(row, prepend=0) != 0)
    for a, b in zip(starts.tolist(), np.append(starts[1:], len(row)).tolist()):
      if row[a] == 0:
        continue
      tok, sp = ids[r, a:b], spans[r, a:b]
      f = int(np.argmax(is_sent[sp]))  # first sentence token (every sequence has one)
      if passage_cls:
        q_end, p_tok = f - 1, np.concatenate([tok[:1], tok[f:]])
        p_sp, p_pos = np.concatenate([[0], sp[f:]]), np.arange(b - a - f + 1)
      else:
        q_end, p_tok, p_sp, p_pos = f, tok[f:], sp[f:], np.arange(1, b - a - f + 1)
      units.append(Unit(tok[:q_end], np.arange(q_end), sp[:q_end]))
      units.append(Unit(p_tok, p_pos, p_sp))
  return units


def pack_units(units: List[Unit], row_len: int, rows: int, spans: int):
  """Rows of the split layout holding `units` (first-fit decreasing), [rows, row_len], and a
  span table of `spans`: (the model arrays, each unit's first span), or (None, None) when the
  units do not fit that many rows and spans."""
  if sum(len(u.call_spans) for u in units) + 1 > spans:
    return None, None
  ids = np.zeros((rows, row_len), np.int32)
  seg = np.zeros((rows, row_len), np.int32)
  pos = np.zeros((rows, row_len), np.int32)
  span_ids = np.zeros((rows, row_len), np.int32)
  free = np.full(rows, row_len, np.int64)
  count = np.zeros(rows, np.int32)
  offsets = [0] * len(units)
  next_span = 1
  for i in sorted(range(len(units)), key=lambda j: -len(units[j].ids)):
    u = units[i]
    n = len(u.ids)
    fits = free >= n
    if not fits.any():
      return None, None
    r = int(np.argmax(fits))
    start = row_len - int(free[r])
    count[r] += 1
    ids[r, start:start + n] = u.ids
    seg[r, start:start + n] = count[r]
    pos[r, start:start + n] = u.positions
    span_ids[r, start:start + n] = np.where(u.rel_spans > 0, u.rel_spans + next_span - 1, 0)
    offsets[i] = next_span
    next_span += len(u.call_spans)
    free[r] -= n
  return {"input_ids": ids, "attention_mask": (seg > 0).astype(np.int32), "segment_ids": seg,
          "position_ids": pos, "span_ids": span_ids,
          "span_kind": np.zeros((spans,), np.int32)}, offsets


class PriorCache:
  """Pooled spans of the split prior's segments, by segment key, for one engine's params."""

  def __init__(self, max_segments: int = DEFAULT_MAX_SEGMENTS):
    self.max_segments = int(max_segments)
    self._pooled: "collections.OrderedDict[tuple, np.ndarray]" = collections.OrderedDict()
    self.stats = {"segments": 0, "encoded": 0, "prior_calls": 0, "prior_tokens": 0}

  def clear(self) -> None:
    """Forget every segment (new params)."""
    self._pooled.clear()

  def __len__(self) -> int:
    return len(self._pooled)

  def _plan(self, units: List[Unit], row_len: int, max_rows: int,
            span_budget: int) -> List[List[Unit]]:
    """Cut the units to encode into calls of at most `max_rows` full rows and `span_budget`
    spans (first-fit decreasing is simulated by a token budget with a margin)."""
    calls, cur, tokens, spans = [], [], 0, 0
    budget = int(0.9 * max_rows * row_len)
    for u in sorted(units, key=lambda v: -len(v.ids)):
      if cur and (tokens + len(u.ids) > budget or spans + len(u.call_spans) > span_budget):
        calls.append(cur)
        cur, tokens, spans = [], 0, 0
      cur.append(u)
      tokens += len(u.ids)
      spans += len(u.call_spans)
    if cur:
      calls.append(cur)
    return calls

  @staticmethod
  def shapes(planner) -> List[Tuple[int, int]]:
    """(rows, spans) of every prior call: power-of-two row counts up to the largest row bucket
    (a handful of shapes to compile; only the last call of a group is partial), each with its
    row bucket's span table (`Planner.rung`)."""
    max_rows = planner.packing.row_buckets[-1]
    rows = [1 << i for i in range(max_rows.bit_length()) if (1 << i) < max_rows] + [max_rows]
    return [(r, planner.rung(r)[0]) for r in rows]

  @staticmethod
  def example(planner, rows: int, spans: int) -> dict:
    """Empty arrays of one prior call of this shape (what `EngineCore.precompile` compiles)."""
    return pack_units([], planner.packing.row_len, rows, spans)[0]

  def _encode(self, engine, planner, units: List[Unit]) -> None:
    """Encode `units` (distinct, not cached) and cache their pooled spans."""
    row_len = planner.packing.row_len
    shapes = self.shapes(planner)
    max_rows, span_budget = shapes[-1][0], shapes[-1][1] - 1
    jobs = []
    for call in self._plan(units, row_len, max_rows, span_budget):
      for rows, spans in shapes:
        arrays, offsets = pack_units(call, row_len, rows, spans)
        if arrays is not None:
          break
      else:  # the plan's margin did not hold: halve the call
        if len(call) == 1:  # cannot happen for units cut from rows of this row length
          raise DataError(f"a prior segment of {len(call[0].ids)} tokens and "
                          f"{len(call[0].call_spans)} spans fits no prior call")
        half = len(call) // 2
        self._encode(engine, planner, call[:half])
        self._encode(engine, planner, call[half:])
        continue
      jobs.append((arrays, (call, offsets)))
      self.stats["prior_tokens"] += int(arrays["input_ids"].size)
    for (call, offsets), out in engine.run_stacked("prior", jobs):
      self.stats["prior_calls"] += 1
      for u, off in zip(call, offsets):
        self._pooled[u.key] = out[off:off + len(u.call_spans)]
        self.stats["encoded"] += 1

  def attach(self, engine, planner, jobs: list) -> list:
    """The local jobs `(arrays, tag)` with `prior_pooled` [S, d] added to each call's arrays,
    encoding the segments not cached yet (one group of prior calls for all the jobs)."""
    passage_cls = engine.cfg.local_scorer_config.dense_prior_passage_cls
    per_job = [call_units(arrays, passage_cls) for arrays, _ in jobs]
    todo: Dict[tuple, Unit] = {}
    for units in per_job:
      for u in units:
        if u.key in self._pooled:
          self._pooled.move_to_end(u.key)
        else:
          todo.setdefault(u.key, u)
    if todo:
      self._encode(engine, planner, list(todo.values()))
    d = engine.cfg.local_scorer_config.encoder.hidden_size
    out = []
    for (arrays, tag), units in zip(jobs, per_job):
      pooled = np.zeros((arrays["span_kind"].shape[0], d), np.float32)
      for u in units:
        pooled[u.call_spans] = self._pooled[u.key]
      self.stats["segments"] += len(units)
      out.append((dict(arrays, prior_pooled=pooled), tag))
    while len(self._pooled) > self.max_segments:  # after use: these jobs needed every entry
      self._pooled.popitem(last=False)
    return out
