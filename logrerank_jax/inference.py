"""Jit-compiled batch reranking with a trained LoG-Reranker model folder.

Library entry point (stable; `tools/rerank.py`, `tools/evaluate.py` and the notebook API use it):

    import logrerank_jax
    rr = logrerank_jax.Reranker.from_pretrained(path)   # model folder or a workdir with model/
    ranked = rr.rank(query, passages)                   # reranked passages (results.RankedResults)
    out = rr.rerank_records(records)                    # input dicts -> one output dict per record
    rr.compile_stats()                                  # {"xla_compilations", "jit_cache_entries", ...}

The output dicts are the "log" format of `logrerank_jax.results` (typed `RerankResult` /
`RecordError` inside the library, `to_dict()` at the edge).

Any pool size, default settings.  The local stage (`LoGReranker.local_nodes`, one jit) runs
over as many packed calls as the queries need: passages are cut into calls that fit the
largest row/span/node bucket (a query may spread over several calls; a local score depends only
on its (query, passage) sequence, so this changes no score), `queries_per_batch` slots per
call. The global stage (`LoGReranker.global_logits`, a second jit) then runs on each query's
whole sentence graph, `queries_per_batch` queries per call, with node buckets grown by doubling
when a query has more sentences than the largest bucket: a query's graph is never cut. Both
jits see only a small fixed set of shapes (query slots, rows, spans, nodes all bucketed) and
compile once per bucket. The limit left is memory; running out names the flags to change.

Host pipeline.  `score` cuts the records into chunks of `DEFAULT_CHUNK_RECORDS`; the host
work of a chunk (tokenising, planning and packing its local calls: `_local_jobs`) runs on
`host_workers` Grain worker threads ahead of the device work, in input order, so outputs are
identical to the serial engine's (`host_workers=0`).

Compilation count.  `compile_stats()["xla_compilations"]` counts the
`/jax/core/compile/backend_compile_duration` events (`jax.monitoring`) fired while this
reranker's jitted forward runs: one per XLA executable built, including ones loaded from the
persistent compilation cache (`persistent_cache_hits` counts those separately).
`jit_cache_entries` is the jitted function's `_cache_size()` (distinct traced shapes).
"""

import dataclasses
import functools
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from logrerank_jax.data.inference_input import (InferenceRecord, InputLine,
                                                parse_inference_record)
from logrerank_jax.data.packing import (INFERENCE_ROW_BUCKETS, BucketOverflowError,
                                        PackingConfig, QueryInput, bucket_size, grown_buckets,
                                        pack_for_model)
from logrerank_jax import compilation
from logrerank_jax.compilation import (DEFAULT_CACHE_ENV, default_compilation_cache_dir,  # noqa: F401 (public here)
                                       enable_compilation_cache)
from logrerank_jax.errors import CheckpointError, ConfigError, DataError, LogRerankError
from logrerank_jax.graph.context import log_context
from logrerank_jax.models import log_reranker as lr
from logrerank_jax.models.model_folder import load_model, read_info, resolve_model_dir
from logrerank_jax.results import (QueryScores, RankedResults, RecordError, Result, make_result,
                                   ranked_results, record_error, to_openscholar)
from logrerank_jax.schema import MODEL_KEYS, NODE_KEYS, NUM_ROLES, ROLE_NAMES, SPAN_KEYS, TOKEN_KEYS

__all__ = ["Reranker", "QueryScores", "default_packing_config", "enable_compilation_cache",
           "default_compilation_cache_dir", "to_openscholar", "resolve_model_dir"]

# Queries up to this many tokens are never cut by default: real scientific questions and claims
# fit (a 20-word SciFact claim is ~30 WordPiece tokens under a real vocabulary, ~110 under a
# 1,024-word demo vocabulary).
DEFAULT_MAX_QUERY_TOKENS = 128

# Local-stage call layout (module docstring, "Padding"). Query slots per local call: a full
# 128-row call of 1,024-token rows holds ~9 fifty-passage pools, so 16 slots rarely bind.
DEFAULT_LOCAL_SLOTS = 16
# Records handed to one `_score_group`: calls are filled across all of them, so only the last
# call of a chunk is partial. Fixed (not a multiple of the device count) so that the calls, and
# so the scores, are the same on any number of devices.
DEFAULT_CHUNK_RECORDS = 32
# Host threads preparing the next chunks while the devices run (`Reranker.score`). One keeps the
# device fed when host work per chunk is below device work (true with the compiled splitter);
# on a CPU-only machine it shares the cores with XLA, so more would only contend.
DEFAULT_HOST_WORKERS = 1
# A call is cut at this fraction of its largest row bucket's tokens: first-fit decreasing packs
# real pools to ~97-99% of the rows it opens, and an overflowing call is split, not lost.
CALL_FILL = 0.95
# Span table of a row bucket: one span per this many tokens (real text: ~25-30 tokens per
# sentence); a denser call moves to the next row bucket (or is split), never fails.
TOKENS_PER_SPAN = 8


def default_packing_config(cfg: lr.LoGConfig, row_len: Optional[int] = None,
                           max_query_tokens: Optional[int] = None, **buckets) -> PackingConfig:
  """Packer settings for inference.

  Rows of `row_len` tokens (default 1024, the paper's input limit), capped by the encoder's
  positions (`max_positions`: 512 for BERT, 512 for RoBERTa's 514 offset embeddings); queries
  cut at `max_query_tokens` (default `DEFAULT_MAX_QUERY_TOKENS`, at most half a row so
  passages keep room); `buckets` (row_buckets, span_buckets,
  node_buckets) override the packer's defaults. Any pool size works with any buckets: the
  engine splits a query over several local calls and grows node buckets (module docstring).
  """
  row_len = min(int(row_len or 1024), cfg.local.encoder.max_positions)
  mqt = int(max_query_tokens) if max_query_tokens else min(DEFAULT_MAX_QUERY_TOKENS, row_len // 2)
  buckets = {k: tuple(v) for k, v in buckets.items() if v}
  buckets.setdefault("row_buckets", INFERENCE_ROW_BUCKETS)
  return PackingConfig(row_len=row_len, max_query_tokens=mqt, **buckets)


def _check_param_shapes(params, cfg: lr.LoGConfig) -> None:
  """Raise CheckpointError listing every param whose shape differs from what `cfg` builds.

  Without it, params saved under another config fail deep inside the first forward call.
  """
  from flax.traverse_util import flatten_dict  # pylint: disable=g-import-not-at-top
  want = lr.param_shapes(cfg)  # shapes only, no compute
  # A local-stage export lacks "global", so compare shared subtrees.
  shared = [top for top in want if top in params]
  want = {"/".join(k): tuple(v.shape)
          for k, v in flatten_dict({t: dict(want[t]) for t in shared}).items()}
  got = {"/".join(k): tuple(np.shape(v))
         for k, v in flatten_dict({t: dict(params[t]) for t in shared}).items()}
  bad = [f"{k}: missing from checkpoint" for k in sorted(want.keys() - got.keys())]
  bad += [f"{k}: not in the model" for k in sorted(got.keys() - want.keys())]
  bad += [f"{k}: checkpoint {got[k]} vs model {want[k]}"
          for k in sorted(want.keys() & got.keys()) if got[k] != want[k]]
  if bad:
    raise CheckpointError(f"params do not match the model config ({len(bad)} mismatches): "
                          + "; ".join(bad[:20]) + (f"; ... {len(bad) - 20} more" if len(bad) > 20 else ""))


def _local_forward(params, arrays, cfg):
  """Jitted local stage over one packed call: the node features the global stage and the
  output need ([Q, N, ...])."""
  nodes = lr.LoGReranker(cfg).apply({"params": {"local": params["local"]}}, arrays, True,
                                    method=lr.LoGReranker.local_nodes)
  return {k: nodes[k] for k in ("h", "role_probs", "local_score")}


def _global_forward(params, feats, cfg):
  """Jitted global stage over whole query graphs: graph build + GAT (or, without a global
  stage, the graph alone: final = local)."""
  model = lr.LoGReranker(cfg)
  mask = feats["node_mask"]
  if cfg.use_global:
    logit, graph = model.apply({"params": {"global": params["global"]}}, feats,
                               feats["node_passage"], mask, True,
                               method=lr.LoGReranker.global_logits)
    final = jnp.where(mask, jax.nn.sigmoid(logit), 0.0)
  else:
    graph = model.apply({"params": {}}, feats, feats["node_passage"], mask,
                        method=lr.LoGReranker.sentence_graph)
    final = feats["local_score"]
  q, n = mask.shape
  return {"final_score": final.reshape(q * n), "graph": graph}


def _stacked(fn, mesh):
  """`fn(params, x)` over a leading device axis of `x`, sharded over `mesh`'s "data" axis,
  params replicated: D calls of one shape run as one data-parallel step."""
  from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  data = NamedSharding(mesh, PartitionSpec("data"))
  return jax.jit(jax.vmap(fn, in_axes=(None, 0)),
                 in_shardings=(NamedSharding(mesh, PartitionSpec()), data), out_shardings=data)


def _pad_local(batch, rows: int, spans: int, nodes: int, pad_id: int) -> dict:
  """A packed batch's model arrays padded to (rows, spans, nodes per slot) with inert entries
  (padding rows, empty spans, masked nodes); span_node's flat q * N + n is re-based on `nodes`."""
  out = {}
  r0 = batch.input_ids.shape[0]
  for k in TOKEN_KEYS:
    a = getattr(batch, k)
    fill = pad_id if k == "input_ids" else 0
    out[k] = np.concatenate([a, np.full((rows - r0, a.shape[1]), fill, a.dtype)]) if rows > r0 else a
  s0 = batch.span_kind.shape[0]
  n0 = batch.N
  for k in SPAN_KEYS:
    a = getattr(batch, k)
    if k == "span_node":
      a = np.where(a >= 0, (a // n0) * nodes + a % n0, -1).astype(a.dtype)
    out[k] = np.concatenate([a, np.full((spans - s0,), -1 if k == "span_node" else 0, a.dtype)])
  for k in NODE_KEYS:
    a = getattr(batch, k)
    fill = -1 if k == "node_passage" else False
    out[k] = np.concatenate([a, np.full((a.shape[0], nodes - n0), fill, a.dtype)], axis=1)
  return out


def _inert_like(arrays: dict) -> dict:
  """An inert call of the same shapes (nothing attended, no spans, no nodes): pads a device
  stack; its outputs are dropped."""
  return {k: np.full_like(v, -1 if k in ("span_node", "node_passage") else 0)
          for k, v in arrays.items()}


def _out_of_memory(e: Exception) -> bool:
  text = str(e)
  return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


class Reranker:
  """A loaded LoG-Reranker with a jitted, shape-bucketed batch forward."""

  def __init__(self, params, cfg: lr.LoGConfig, tokenizer,
               packing: Optional[PackingConfig] = None, queries_per_batch: int = 4,
               local_slots: Optional[int] = None, devices: Optional[Sequence[Any]] = None,
               host_workers: int = DEFAULT_HOST_WORKERS, _local_only: bool = False):
    """Wrap loaded params.

    Args:
      params: the `LoGReranker` param tree.
      cfg: its `LoGConfig`.
      tokenizer: the fast tokenizer the model was trained with.
      packing: packer settings (default `default_packing_config(cfg)`); its `query_buckets` are
        replaced by `(queries_per_batch,)` so every call has the same number of query slots.
      queries_per_batch: queries per global-stage call (whole query graphs).
      local_slots: query slots per local-stage call (default `max(DEFAULT_LOCAL_SLOTS,
        queries_per_batch)`); a slot holds passages of one query, so a call can be filled
        with the passages of many queries.
      devices: the devices to shard calls over (default `jax.local_devices()`: all of this
        process's devices); D calls of one shape run as one data-parallel step.
      host_workers: host threads that prepare the next chunks of records (tokenise, plan,
        pack) while the devices run the current one (`score`); 0 runs everything serially.
    """
    for name, v in (("queries_per_batch", queries_per_batch), ("local_slots", local_slots)):
      if v is None and name == "local_slots":
        continue
      if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"{name} must be a positive int, got {v!r}")
    if isinstance(host_workers, bool) or not isinstance(host_workers, int) or host_workers < 0:
      raise ConfigError(f"host_workers must be an int >= 0, got {host_workers!r}")
    self.host_workers = host_workers
    if cfg.use_global and "global" not in params:
      raise CheckpointError("params have no 'global' tree but the config has use_global=True")
    _check_param_shapes(params, cfg)
    self.cfg = cfg
    # True when `from_pretrained` loaded a local-stage model (no global params) as "w/o global".
    self.local_only = bool(_local_only)
    self.tokenizer = tokenizer
    self.queries_per_batch = queries_per_batch
    self.local_slots = int(local_slots or max(DEFAULT_LOCAL_SLOTS, queries_per_batch))
    self.packing = dataclasses.replace(packing or default_packing_config(cfg),
                                       query_buckets=(queries_per_batch,))
    self._local_packing = dataclasses.replace(self.packing, query_buckets=(self.local_slots,))
    # A whole number of global groups, independent of the device count (same calls anywhere).
    self.chunk_records = -(-DEFAULT_CHUNK_RECORDS // queries_per_batch) * queries_per_batch
    from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
    self.devices = list(devices) if devices else list(jax.local_devices())
    self.num_devices = len(self.devices)
    self.mesh = Mesh(np.asarray(self.devices, dtype=object), ("data",))
    self._data_sharding = NamedSharding(self.mesh, PartitionSpec("data"))
    # Params live on the devices once (replicated); host arrays would be copied on every call.
    self.params = jax.device_put(params, NamedSharding(self.mesh, PartitionSpec()))
    self._local_jit = _stacked(functools.partial(_local_forward, cfg=cfg), self.mesh)
    self._global_jit = _stacked(functools.partial(_global_forward, cfg=cfg), self.mesh)
    self._executables = {}  # (stage, shapes) -> compiled executable
    self._pad_id = int(tokenizer.pad_token_id or 0) if tokenizer is not None else 0
    self._compiles = 0
    self._cache_hits = 0
    self._calls = 0
    self._tokens = {"real": 0, "computed": 0, "inert": 0, "local_calls": 0, "inert_calls": 0}
    compilation.ensure_listeners()

  @classmethod
  def from_pretrained(cls, path: str, **kwargs) -> "Reranker":
    """Load a model folder (`model_folder.save_model` layout) or a training workdir with `model/`.

    Args:
      path: the folder.
      **kwargs: `packing`, `queries_per_batch` (see `__init__`), or `row_len`,
        `max_query_tokens`, `row_buckets`, `span_buckets`, `node_buckets` for the default packing
        config (`default_packing_config`). An unset `row_len` is read from the folder's
        info.json `"packing"` entry when it has one (the training run's row length).

    Returns:
      The `Reranker`.
    """
    model_dir = resolve_model_dir(path)
    params, cfg, tokenizer = load_model(model_dir)
    if cfg.use_global and "global" not in params:
      # A local-stage export (tools/train.py local stage) has no GAT yet: it is the "w/o global"
      # model, final score = local score. `local_only` records that this happened.
      cfg = dataclasses.replace(cfg, use_global=False)
      kwargs["_local_only"] = True
    row_len = kwargs.pop("row_len", None)
    max_query_tokens = kwargs.pop("max_query_tokens", None)
    buckets = {k: kwargs.pop(k) for k in ("row_buckets", "span_buckets", "node_buckets")
               if kwargs.get(k)}
    if kwargs.get("packing") is None:
      # The training run's row length travels with the model; the query limit does not (a
      # training-time limit sized for short demo questions would cut real ones).
      trained = read_info(model_dir).get("packing") or {}
      kwargs["packing"] = default_packing_config(cfg, row_len or trained.get("row_len"),
                                                 max_query_tokens, **buckets)
    return cls(params, cfg, tokenizer, **kwargs)

  from_dir = from_pretrained  # the earlier name

  # ----------------------------------------------------------------------------------- forward

  def compile_stats(self) -> dict:
    """Return compilation counters of this reranker's forward (see the module docstring)."""
    return {"xla_compilations": self._compiles, "persistent_cache_hits": self._cache_hits,
            "jit_cache_entries": len(self._executables), "forward_calls": self._calls}

  def stats(self) -> dict:
    """Compilation counters plus local-stage padding: `real_tokens` (tokens of the packed
    sequences), `computed_tokens` (rows x row_len of every real local call), their ratio
    `padding_efficiency`, and `inert_tokens` of the inert calls that pad a device stack."""
    t = self._tokens
    return dict(self.compile_stats(), devices=self.num_devices, real_tokens=t["real"],
                computed_tokens=t["computed"], inert_tokens=t["inert"],
                local_calls=t["local_calls"], inert_calls=t["inert_calls"],
                padding_efficiency=t["real"] / t["computed"] if t["computed"] else None)

  def padding_plan(self, records: Iterable[Any]) -> dict:
    """Host work only: plan and pack the local calls of `records` exactly as `rerank_records`
    would (same chunks, same planner, same buckets) and report the padding, without running
    the model: `local_calls`, `real_tokens`, `computed_tokens` (rows x row_len of each call),
    `padding_efficiency` and the distinct call `shapes` (rows, row_len). Records that do not
    parse are left out (as they would be errors)."""
    recs = [ln.record for ln in self._lines(records) if isinstance(ln.record, InferenceRecord)]
    real = computed = calls = 0
    shapes = set()
    for idx in self._chunks(len(recs)):
      for arrays, (_, _, info) in self._local_jobs([recs[i] for i in idx]):
        real += info.real_tokens
        computed += int(np.prod(arrays["input_ids"].shape))
        shapes.add(tuple(arrays["input_ids"].shape))
        calls += 1
    return {"local_calls": calls, "real_tokens": real, "computed_tokens": computed,
            "padding_efficiency": real / computed if computed else None,
            "shapes": sorted(shapes)}

  def _executable(self, stage: str, stacked: dict):
    """The compiled executable of a stage for these stacked shapes (compiled once, counted)."""
    key = (stage,) + tuple((k, v.shape, str(v.dtype)) for k, v in sorted(stacked.items()))
    exe = self._executables.get(key)
    if exe is None:
      fn = self._local_jit if stage == "local" else self._global_jit
      spec = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in stacked.items()}
      before = dict(compilation.COUNTS)
      try:
        exe = fn.lower(self.params, spec).compile()
      except Exception as e:  # pylint: disable=broad-except
        self._raise_oom(e)
        raise
      finally:
        self._compiles += compilation.COUNTS["compiles"] - before["compiles"]
        self._cache_hits += compilation.COUNTS["cache_hits"] - before["cache_hits"]
      self._executables[key] = exe
    return exe

  @staticmethod
  def _raise_oom(e: Exception) -> None:
    if _out_of_memory(e):
      raise DataError("out of device memory; rerank with fewer queries per call "
                      "(--queries-per-batch / queries_per_batch, local_slots) or shorter rows "
                      "(--row-len / row_len, --row-buckets)") from None

  def _call(self, stage: str, lanes: List[dict]):
    """Run up to `num_devices` calls of one shape as one data-parallel step (the stack padded
    with inert calls); host copies of each real lane's outputs."""
    d = self.num_devices
    lanes = list(lanes) + [_inert_like(lanes[0])] * (d - len(lanes))
    stacked = {k: np.stack([ln[k] for ln in lanes]) for k in lanes[0]}
    exe = self._executable(stage, stacked)
    try:
      out = exe(self.params, jax.device_put(stacked, self._data_sharding))
      out = jax.tree_util.tree_map(np.asarray, out)  # waits for the devices
    except Exception as e:  # pylint: disable=broad-except  (XLA raises its own runtime errors)
      self._raise_oom(e)
      raise
    self._calls += 1
    return out

  def _local_shape(self, rows: int, spans: int, nodes: int):
    """(rows, spans, nodes per slot) of the smallest row bucket that holds a call; the span
    table and node slots of a row bucket are fixed (`_rung`), so each row bucket is one shape.
    None when no row bucket holds it."""
    for r in self.packing.row_buckets:
      if r >= rows:
        s, n = self._rung(r)
        if s >= spans and n >= nodes:
          return r, s, n
    return None

  def _rung(self, rows: int):
    """(spans, nodes per slot) of a local call of `rows` rows: spans for one per
    `TOKENS_PER_SPAN` tokens (capped by the largest span bucket), nodes as many as spans
    (capped by the largest node bucket), each rounded up to a configured bucket."""
    pk = self.packing
    want = max(rows * pk.row_len // TOKENS_PER_SPAN, 1)
    s = next((b for b in pk.span_buckets if b >= want), pk.span_buckets[-1])
    n = next(b for b in pk.node_buckets if b >= min(s, pk.node_buckets[-1]))
    return int(s), int(n)

  def local_shapes(self) -> List[tuple]:
    """Every (rows, spans, nodes per slot) a local call can have (one per row bucket), for
    calls that fit the buckets; a passage larger than every bucket adds a grown shape."""
    return [(r,) + self._rung(r) for r in self.packing.row_buckets]

  def precompile(self) -> dict:
    """Compile every shape the engine uses on bucket-sized traffic: each local row bucket
    (`local_shapes`) and each global node bucket, for this device count, so that live
    traffic compiles nothing (only a query larger than every bucket adds a grown shape).

    Returns:
      `compile_stats()` after compiling.
    """
    slots, qpb = self.local_slots, self.queries_per_batch
    d_enc = self.cfg.local.encoder.hidden_size
    L = self.packing.row_len
    stack = lambda arrays: {k: np.zeros((self.num_devices,) + v.shape, v.dtype)  # noqa: E731
                            for k, v in arrays.items()}
    for r, s, n in self.local_shapes():
      arrays = {k: np.zeros((r, L), np.int32) for k in TOKEN_KEYS}
      arrays.update({k: np.zeros((s,), np.int32) for k in SPAN_KEYS})
      arrays.update(node_passage=np.zeros((slots, n), np.int32),
                    node_mask=np.zeros((slots, n), bool))
      self._executable("local", stack(arrays))
    for n in self.packing.node_buckets:
      self._executable("global", stack(self._global_arrays(qpb, n, d_enc)))
    return self.compile_stats()

  @staticmethod
  def _global_arrays(size: int, n: int, d: int) -> dict:
    return {"h": np.zeros((size, n, d), np.float32),
            "role_probs": np.zeros((size, n, NUM_ROLES), np.float32),
            "local_score": np.zeros((size, n), np.float32),
            "node_passage": np.full((size, n), -1, np.int32),
            "node_mask": np.zeros((size, n), bool)}

  def _token_counts(self, records: Sequence[InferenceRecord], tokenizer=None):
    """(query tokens, tokens per passage) of each record: the cost used to cut queries into
    calls that fit the buckets (one batched tokeniser call)."""
    tokenizer = tokenizer or self.tokenizer
    texts = [r.query for r in records] + [s for r in records for p in r.sentence_texts for s in p]
    lens = iter(len(t) for t in tokenizer(texts, add_special_tokens=False)["input_ids"])
    queries = [next(lens) for _ in records]
    return [(q, [sum(next(lens) + 1 for _ in p) for p in r.sentence_texts])
            for q, r in zip(queries, records)]

  def _local_calls(self, records: Sequence[InferenceRecord], tokenizer=None):
    """Cut the records' scorable passages into nearly full local-stage calls.

    The passages of all `records` (in order) are cut into the fewest calls that fit the
    largest row bucket at `CALL_FILL` of its tokens, the span table and `local_slots` slots,
    with the tokens balanced over the calls (so the last call is not a small remainder). A slot
    is (record index, passage indices) of one record: a query may spread over several slots and
    calls (local scores depend only on the (query, passage) sequence, so this changes no score).
    Returns a list of calls, each a list of slots.
    """
    pk = self.packing
    row_len = pk.row_len
    max_rows = pk.row_buckets[-1]
    span_budget, node_budget = self._rung(max_rows)
    span_budget -= 1  # span 0 is the dummy
    token_budget = int(CALL_FILL * max_rows * row_len)
    counts = self._token_counts(records, tokenizer)
    items = []  # (record, passage, tokens, spans, nodes)
    for ri, rec in enumerate(records):
      q_len, p_lens = counts[ri]
      qtok = min(q_len, pk.max_query_tokens) + 3  # [CLS] q [SEP] ... [SEP] in every window
      for pi, psg in enumerate(rec.passages):
        n = len(psg.sentences)
        if n == 0:
          continue
        if not self.cfg.contextual_encoding:  # one sequence per sentence
          windows = n
        else:
          windows = max(1, -(-p_lens[pi] // max(row_len - qtok, 1)))
        items.append((ri, pi, p_lens[pi] + windows * qtok, n + windows, n))
    total = sum(t for _, _, t, _, _ in items)
    n_calls = max(1, -(-total // token_budget),
                  -(-sum(sp for _, _, _, sp, _ in items) // span_budget))
    target = total / n_calls
    calls, cur, used_tokens, used_spans, done = [], [], 0, 0, 0
    slot, slot_nodes = None, 0
    for ri, pi, tokens, spans, n in items:
      new_slot = slot is None or slot[0] != ri or slot_nodes + n > node_budget
      full = cur and (used_tokens + tokens > token_budget or used_spans + spans > span_budget
                      or (new_slot and len(cur) == self.local_slots)
                      # balanced cut: the call's share of the chunk's tokens is reached
                      or done + tokens / 2 > (len(calls) + 1) * target)
      if full:
        calls.append(cur)
        cur, used_tokens, used_spans, slot = [], 0, 0, None
      if slot is None or new_slot:
        slot, slot_nodes = (ri, []), 0
        cur.append(slot)
      slot[1].append(pi)
      slot_nodes += n
      used_tokens += tokens
      used_spans += spans
      done += tokens
    if cur:
      calls.append(cur)
    return calls

  def _pack_call(self, records, call, tokenizer=None):
    """Pack one local call into its row bucket's shape: [(slots, model arrays, PackInfo)].

    A call that overflows the largest bucket is split in halves, and a single passage too
    large for every bucket gets grown buckets (one more shape, not an error)."""
    tokenizer = tokenizer or self.tokenizer
    queries = [QueryInput(records[ri].query, [records[ri].sentence_texts[pi] for pi in pis])
               for ri, pis in call]
    try:
      batch, info = pack_for_model(queries, tokenizer, self._local_packing,
                                   self.cfg.contextual_encoding)
      spans = int(np.flatnonzero(batch.span_kind).max(initial=0)) + 1
      shape = self._local_shape(info.num_rows_used, spans, int(batch.node_mask.sum(1).max()))
      if shape is None:
        raise BucketOverflowError("call does not fit a row bucket's span table or node slots")
      return [(call, _pad_local(batch, *shape, self._pad_id), info)]
    except BucketOverflowError:
      if len(call) > 1 or len(call[0][1]) > 1:
        if len(call) > 1:
          halves = [call[:len(call) // 2], call[len(call) // 2:]]
        else:
          (ri, pis), = call
          halves = [[(ri, pis[:len(pis) // 2])], [(ri, pis[len(pis) // 2:])]]
        return [part for h in halves for part in self._pack_call(records, h, tokenizer)]
    # One passage alone overflows: grow every bucket to cover it.
    big = dataclasses.replace(self._local_packing,
                              row_buckets=grown_buckets(self.packing.row_buckets, 1 << 20),
                              span_buckets=grown_buckets(self.packing.span_buckets, 1 << 22),
                              node_buckets=grown_buckets(self.packing.node_buckets, 1 << 22))
    batch, info = pack_for_model(queries, tokenizer, big, self.cfg.contextual_encoding)
    return [(call, {k: getattr(batch, k) for k in MODEL_KEYS}, info)]

  def _run_stacked(self, stage: str, jobs: list) -> list:
    """Run (arrays, tag) jobs: jobs of one shape are stacked `num_devices` at a time (in
    order); returns (tag, outputs of its lane) per job, in job order."""
    by_shape = {}
    for j, (arrays, _) in enumerate(jobs):
      by_shape.setdefault(tuple((k, v.shape) for k, v in sorted(arrays.items())), []).append(j)
    outs = [None] * len(jobs)
    d = self.num_devices
    for idx in by_shape.values():
      for start in range(0, len(idx), d):
        part = idx[start:start + d]
        out = self._call(stage, [jobs[j][0] for j in part])
        if stage == "local":
          self._tokens["local_calls"] += len(part)
          self._tokens["inert_calls"] += d - len(part)
          rows_len = int(np.prod(jobs[part[0]][0]["input_ids"].shape))
          self._tokens["computed"] += rows_len * len(part)
          self._tokens["inert"] += rows_len * (d - len(part))
        for lane, j in enumerate(part):
          outs[j] = (jobs[j][1], jax.tree_util.tree_map(lambda x, i=lane: x[i], out))
    return outs

  def _local_jobs(self, records: Sequence[InferenceRecord], tokenizer=None) -> list:
    """Host work of a chunk (tokenise, plan the local calls, pack them): the local-stage jobs
    `_score_group` runs. Pure host code, so it can run on a worker thread (`host_workers`)."""
    return [(arrays, (part, arrays, info)) for call in self._local_calls(records, tokenizer)
            for part, arrays, info in self._pack_call(records, call, tokenizer)]

  def _score_group(self, records: Sequence[InferenceRecord], jobs: Optional[list] = None
                   ) -> List[QueryScores]:
    """Score records: local stage over as few, nearly full calls as they need, then the global
    stage over each query's whole graph (never cut), `queries_per_batch` queries per call;
    calls of one shape run `num_devices` at a time. `jobs`: the records' `_local_jobs`, when
    a host worker has prepared them already."""
    d = self.cfg.local.encoder.hidden_size
    nodes: List[List[tuple]] = [[] for _ in records]   # per record: (pi, si, h, roles, z)
    windows = [dict() for _ in records]                # per record: pi -> (windows, trunc, empty)
    truncated_q = [False] * len(records)
    if jobs is None:
      jobs = self._local_jobs(records)
    for (part, arrays, info), out in self._run_stacked("local", jobs):
      self._tokens["real"] += info.real_tokens
      node_passage, node_mask = arrays["node_passage"], arrays["node_mask"]
      for slot, (ri, pis) in enumerate(part):
        truncated_q[ri] |= bool(info.query_truncated[slot])
        for ni in np.flatnonzero(node_mask[slot]):
          # node n of a slot is its n-th sentence in passage order (packer contract)
          lp = int(node_passage[slot, ni])
          nodes[ri].append((pis[lp], out["h"][slot, ni], out["role_probs"][slot, ni],
                            float(out["local_score"][slot, ni])))
        for lp, pinfo in zip(pis, self._passage_info_of(records[ri], pis, info.passages[slot])):
          windows[ri][lp] = pinfo
    # Sentence index of each node: a passage's nodes are its sentences in order, all in one
    # slot (packer contract), so counting them per passage recovers the index.
    for ri in range(len(records)):
      fixed, seen = [], {}
      for pi, h, roles, z in nodes[ri]:
        si = seen.get(pi, 0)
        seen[pi] = si + 1
        fixed.append((pi, si, h, roles, z))
      nodes[ri] = fixed
    size = self.queries_per_batch
    gjobs = []
    for start in range(0, len(records), size):
      group = list(range(start, min(start + size, len(records))))
      for ri in group:
        nodes[ri].sort(key=lambda t: (t[0], t[1]))  # passage order, as one joint packing
      n_max = max([len(nodes[ri]) for ri in group] + [1])
      n = bucket_size(n_max, grown_buckets(self.packing.node_buckets, n_max), "node_buckets")
      feats = self._global_arrays(size, n, d)
      for q, ri in enumerate(group):
        for j, (pi, _, h, roles, z) in enumerate(nodes[ri]):
          feats["h"][q, j], feats["role_probs"][q, j], feats["local_score"][q, j] = h, roles, z
          feats["node_passage"][q, j] = pi
        feats["node_mask"][q, :len(nodes[ri])] = True
      gjobs.append((feats, (group, feats)))
    results: List[QueryScores] = []
    for (group, feats), out in self._run_stacked("global", gjobs):
      n = feats["node_mask"].shape[1]
      out = dict(out, role_probs=feats["role_probs"].reshape(size * n, NUM_ROLES))
      contexts = log_context(out, self.cfg)
      final = out["final_score"].reshape(size, n)
      for q, ri in enumerate(group):
        rec, k = records[ri], len(nodes[ri])
        empty_info = (0, [], [])
        results.append(QueryScores(
            record=rec, node_passage=feats["node_passage"][q, :k].copy(),
            node_sentence=np.asarray([t[1] for t in nodes[ri]], np.int32),
            local_score=feats["local_score"][q, :k].copy(),
            global_score=final[q, :k].copy() if self.cfg.use_global else None,
            final_score=final[q, :k].copy(), role_probs=feats["role_probs"][q, :k].copy(),
            context=contexts[q],
            passage_info=[windows[ri].get(pi, empty_info) for pi in range(len(rec.passages))],
            query_truncated=truncated_q[ri]))
    return results

  def _passage_info_of(self, rec: InferenceRecord, pis, infos) -> list:
    """Per packed passage (num_windows, truncated, empty), for the passages `pis` of `rec`."""
    if self.cfg.contextual_encoding:
      return [(i.num_windows, list(i.truncated_sentences), list(i.empty_sentences)) for i in infos]
    # "w/o contextual encoding": PackInfo has one entry per sentence, in passage order.
    out, k = [], 0
    for pi in pis:
      mine = infos[k:k + len(rec.passages[pi].sentences)]
      k += len(rec.passages[pi].sentences)
      out.append((len(mine), [s for s, i in enumerate(mine) if i.truncated_sentences],
                  [s for s, i in enumerate(mine) if i.empty_sentences]))
    return out

  def score(self, records: Sequence[InferenceRecord], progress: bool = False
            ) -> List[Union[QueryScores, LogRerankError]]:
    """Score parsed records in chunks of `chunk_records`, one result or error per record.

    Local calls are filled across a chunk's records, global calls take `queries_per_batch`
    of them at a time. A chunk that fails (e.g. a query larger than the biggest bucket) is
    retried one record at a time so only the offending record gets the error.

    With `host_workers` > 0 the host work of the next chunks (tokenising, planning and packing
    the local calls) runs on that many Grain worker threads while this thread drives the
    devices; the chunks come back in input order and the jobs are those the serial path
    builds, so the results are identical (tested).

    Args:
      records: parsed `InferenceRecord`s.
      progress: show a tqdm progress bar (queries).

    Returns:
      One `QueryScores` or `LogRerankError` per record, in order.
    """
    results: List[Any] = [None] * len(records)
    bar = None
    if progress:
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top
      bar = tqdm(total=len(records), unit="query", desc="rerank")
    for idx, jobs in self._prepared_chunks(records, self._chunks(len(records))):
      group = [records[i] for i in idx]
      try:
        if isinstance(jobs, LogRerankError):
          raise jobs
        for i, r in zip(idx, self._score_group(group, jobs)):
          results[i] = r
      except LogRerankError:
        for i in idx:
          try:
            results[i] = self._score_group([records[i]])[0]
          except LogRerankError as e:
            results[i] = e
      if bar is not None:
        bar.update(len(idx))
    if bar is not None:
      bar.close()
    return results

  def _chunks(self, n: int) -> List[List[int]]:
    """Record indices 0..n-1 cut into the chunks of `chunk_records` that `score` scores."""
    size = self.chunk_records
    return [list(range(s, min(s + size, n))) for s in range(0, n, size)]

  def _prepared_chunks(self, records: Sequence[InferenceRecord], chunks: List[List[int]]):
    """Yield (chunk indices, local jobs or the LogRerankError preparing them raised), in order.

    Serial when `host_workers` is 0 or there is one chunk; otherwise a Grain `MapDataset` over
    the chunks, read by `host_workers` threads with a prefetch of as many chunks, so the host
    work of chunk k+1.. overlaps the device work of chunk k. Threads, not processes: the work
    is the Rust tokenizer and NumPy, which release the GIL, and the records stay in memory.
    Each thread tokenises with its own copy of the tokenizer (a HF fast tokenizer is not
    safe to drive from several threads at once)."""
    def prepare(idx, tokenizer=None):
      try:
        return idx, self._local_jobs([records[i] for i in idx], tokenizer)
      except LogRerankError as e:  # the consumer retries the chunk record by record
        return idx, e

    if self.host_workers == 0 or len(chunks) < 2:
      for idx in chunks:
        yield prepare(idx)
      return
    import copy  # pylint: disable=g-import-not-at-top
    import threading  # pylint: disable=g-import-not-at-top
    import grain  # pylint: disable=g-import-not-at-top
    local = threading.local()

    def prepare_on_worker(idx):
      if not hasattr(local, "tokenizer"):
        local.tokenizer = copy.deepcopy(self.tokenizer)
      return prepare(idx, local.tokenizer)

    ds = grain.MapDataset.source(chunks).map(prepare_on_worker)
    yield from ds.to_iter_dataset(grain.ReadOptions(num_threads=self.host_workers,
                                                    prefetch_buffer_size=self.host_workers))

  # ------------------------------------------------------------------------------------ output

  def rerank_lines(self, lines: Sequence[InputLine], progress: bool = False) -> List[Result]:
    """Rerank `read_inference_file` entries: one typed result per entry, in order."""
    good = [i for i, ln in enumerate(lines) if isinstance(ln.record, InferenceRecord)]
    scored = self.score([lines[i].record for i in good], progress=progress)
    by_index = dict(zip(good, scored))
    out = []
    for i, ln in enumerate(lines):
      res = by_index.get(i, ln.record)
      if isinstance(res, QueryScores):
        out.append(make_result(res, ln.line))
      else:
        out.append(record_error(ln.raw, str(res), ln.line))
    return out

  def _lines(self, records: Iterable[Any]) -> List[InputLine]:
    lines = []
    for n, obj in enumerate(records, start=1):
      if isinstance(obj, InferenceRecord):
        lines.append(InputLine(n, obj.raw, obj))
        continue
      try:
        lines.append(InputLine(n, obj, parse_inference_record(obj, f"record {n}")))
      except DataError as e:
        lines.append(InputLine(n, obj, e))
    return lines

  def rerank_records(self, records: Iterable[Any], progress: bool = False) -> List[dict]:
    """Rerank input records (dicts in the OpenScholar style): one output dict per record, in order.

    Args:
      records: parsed JSON objects (or `InferenceRecord`s); bad ones give an `error` output.
      progress: show a tqdm progress bar.

    Returns:
      Output dicts in the "log" format (`logrerank_jax.results`); `line` is the 1-based record
      number.
    """
    return [r.to_dict() for r in self.rerank_lines(self._lines(records), progress=progress)]

  def rank(self, query: str, passages: Sequence[Union[str, Mapping[str, Any]]],
           top_k: Optional[int] = None) -> RankedResults:
    """Rerank one query's passages; the one-call notebook API.

    Args:
      query: the question.
      passages: plain strings, or `{"title", "text", ...}` dicts.
      top_k: keep only the best `top_k` passages (None: all).

    Returns:
      `RankedResults`: the passages best first, each with `.index` (into `passages`), `.text`,
      `.score` (its best sentence's) and `.sentences` (its ranked sentences); `.context` holds
      the query's structured context units.

    Raises:
      DataError: the query or a passage is unusable (the message names it).
    """
    ctxs = [{"title": "", "text": p} if isinstance(p, str) else p for p in passages]
    res = self.rerank_lines(self._lines([{"input": query, "ctxs": ctxs}]))[0]
    if isinstance(res, RecordError):
      raise DataError(res.error)
    return ranked_results(res, ctxs, top_k)
