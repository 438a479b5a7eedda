"""The engine core: one model's planner, devices and prior cache, and the named steps every door
scores parsed records through.

`EngineCore` composes the parts of the engine, one job each: `engine.planner.Planner` cuts
records into bucketed device calls (any pool size; a query's graph is never cut),
`engine.device.Engine` runs them on every local device, counts compilations and holds the split
prior's cache (`engine.prior_cache`), `engine.scorer.score_group` takes one group of records
through both stages, and `engine.pipeline` runs the host work of the next chunks on Grain threads
ahead of the devices. Its steps, in the order a chunk of records takes them:

  chunks         record indices cut into the chunks `score` scores
  prepare        host work of one chunk: tokenise, plan and pack its local calls (`Planner`)
  record_tokens  real tokens the local stage runs for each record (the batcher's budget)
  local_nodes    the local stage alone: each record's sentence nodes (training's features)
  score_chunk    one chunk through the local and global stages on this thread
  score          parsed records in chunks, their host work on worker threads ahead

Who uses which: the Python door (`engine.reranker.Reranker`, an `EngineCore` that also loads
model folders, parses input and builds results) calls `score`; the HTTP batcher
(`engine.batcher`) calls `record_tokens`, `prepare` and `score_chunk` on its threads; the
training feature pass (`training.feature_cache`) builds a local-stage `EngineCore` and calls
`chunks` and `local_nodes`. Input here is parsed `InferenceRecord`s; scores come back as
`results.QueryScores` (or the `LogRerankError` of a record), never as output dicts.
"""

from typing import Any, Callable, List, Optional, Sequence, Union

import numpy as np

from logrerank_jax.data.inference_input import InferenceRecord
from logrerank_jax.data.packing import PackingConfig
from logrerank_jax.errors import ConfigError, LogRerankError
from logrerank_jax.models import log_reranker as lr
from logrerank_jax.results import QueryScores
from logrerank_jax.engine import pipeline, scorer
from logrerank_jax.engine.device import Engine
from logrerank_jax.engine.planner import DEFAULT_LOCAL_SLOTS, Planner, default_packing_config
from logrerank_jax.engine.prior_cache import DEFAULT_MAX_SEGMENTS


def check_settings(queries_per_batch, local_slots, host_workers, prior_cache_segments) -> None:
  """Raise ConfigError naming the first engine setting that is not a count it can use."""
  for name, v in (("queries_per_batch", queries_per_batch), ("local_slots", local_slots)):
    if v is None and name == "local_slots":
      continue
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
      raise ConfigError(f"{name} must be a positive int, got {v!r}")
  if isinstance(host_workers, bool) or not isinstance(host_workers, int) or host_workers < 0:
    raise ConfigError(f"host_workers must be an int >= 0, got {host_workers!r}")
  if (isinstance(prior_cache_segments, bool) or not isinstance(prior_cache_segments, int)
      or prior_cache_segments < 0):
    raise ConfigError(f"prior_cache_segments must be an int >= 0, got {prior_cache_segments!r}")


class EngineCore:
  """One model's jitted, shape-bucketed engine over parsed records (module docstring)."""

  def __init__(self, params, cfg: lr.LoGConfig, tokenizer,
               packing: Optional[PackingConfig] = None, queries_per_batch: int = 4,
               local_slots: Optional[int] = None, devices: Optional[Sequence[Any]] = None,
               host_workers: int = pipeline.DEFAULT_HOST_WORKERS,
               prior_cache_segments: int = DEFAULT_MAX_SEGMENTS):
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
      prior_cache_segments: a model with a split dense prior runs that pass once per distinct
        query and passage window and keeps this many (`engine.prior_cache`); 0 runs it in
        every local call (the training path). Same scores to float rounding.
    """
    check_settings(queries_per_batch, local_slots, host_workers, prior_cache_segments)
    self.host_workers = host_workers
    self.engine = Engine(params, cfg, devices, prior_cache_segments)
    self.cfg = cfg
    self.tokenizer = tokenizer
    self.queries_per_batch = queries_per_batch
    self.local_slots = int(local_slots or max(DEFAULT_LOCAL_SLOTS, queries_per_batch))
    self.planner = Planner(cfg, tokenizer, packing or default_packing_config(cfg),
                           queries_per_batch, self.local_slots)
    self.packing = self.planner.packing
    # A whole number of global groups, independent of the device count (same calls anywhere).
    self.chunk_records = (-(-pipeline.DEFAULT_CHUNK_RECORDS // queries_per_batch)
                          * queries_per_batch)

  # ------------------------------------------------------------------------- the engine's parts

  @property
  def devices(self) -> list:
    return self.engine.devices

  @property
  def num_devices(self) -> int:
    return self.engine.num_devices

  @property
  def mesh(self):
    return self.engine.mesh

  @property
  def params(self):
    return self.engine.params

  def set_params(self, params) -> None:
    """Swap in new params of the same shapes (`Engine.set_params`: nothing compiles again)."""
    self.engine.set_params(params)

  def compile_stats(self) -> dict:
    """Return compilation counters of this engine's forward (`engine.device`)."""
    return self.engine.compile_stats()

  def stats(self) -> dict:
    """Compilation counters plus local-stage padding: `real_tokens` (tokens of the packed
    sequences), `computed_tokens` (rows x row_len of every real local call), their ratio
    `padding_efficiency`, and `inert_tokens` of the inert calls that pad a device stack. A
    split-prior model adds `prior`: segments its local calls held, how many of them were
    encoded (the distinct ones not cached), the prior's calls and their computed tokens."""
    t = self.engine.tokens
    out = dict(self.compile_stats(), devices=self.num_devices, real_tokens=t["real"],
               computed_tokens=t["computed"], inert_tokens=t["inert"],
               local_calls=t["local_calls"], inert_calls=t["inert_calls"],
               padding_efficiency=t["real"] / t["computed"] if t["computed"] else None)
    if self.engine.prior_cache is not None:
      out["prior"] = dict(self.engine.prior_cache.stats)
    return out

  def padding_plan(self, records: Sequence[InferenceRecord]) -> dict:
    """Host work only: plan and pack the local calls of parsed `records` exactly as `score`
    would (same chunks, same planner, same buckets) and report the padding, without running
    the model: `local_calls`, `real_tokens`, `computed_tokens` (rows x row_len of each call),
    `padding_efficiency` and the distinct call `shapes` (rows, row_len)."""
    real = computed = calls = 0
    shapes = set()
    for idx in self.chunks(len(records)):
      for arrays, (_, _, info) in self.planner.local_jobs([records[i] for i in idx]):
        real += info.real_tokens
        computed += int(np.prod(arrays["input_ids"].shape))
        shapes.add(tuple(arrays["input_ids"].shape))
        calls += 1
    return {"local_calls": calls, "real_tokens": real, "computed_tokens": computed,
            "padding_efficiency": real / computed if computed else None,
            "shapes": sorted(shapes)}

  def local_shapes(self) -> List[tuple]:
    """Every (rows, spans, nodes per slot) a local call can have (one per row bucket), for
    calls that fit the buckets; a passage larger than every bucket adds a grown shape."""
    return self.planner.local_shapes()

  def precompile(self, on_progress: Optional[Callable[[int, int], None]] = None) -> dict:
    """Compile every shape the engine uses on bucket-sized traffic: each local row bucket
    (`local_shapes`) and each global node bucket, for this device count, so that live
    traffic compiles nothing (only a query larger than every bucket adds a grown shape).

    Args:
      on_progress: called with (shapes done, shapes in all) before the first and after each
        shape (a server's /health reports it while warming).

    Returns:
      `compile_stats()` after compiling.
    """
    prior = self.engine.prior_cache
    d = self.cfg.local_scorer_config.encoder.hidden_size
    work = []
    for shape in self.planner.local_shapes():
      example = self.planner.local_example(*shape)
      if prior is not None:  # local calls then carry the prior's pooled spans
        example["prior_pooled"] = np.zeros((shape[1], d), np.float32)
      work.append(("local", example))
    if prior is not None:
      work += [("prior", prior.example(self.planner, rows, spans))
               for rows, spans in prior.shapes(self.planner)]
    work += [("global", self.planner.global_example(n)) for n in self.packing.node_buckets]
    for done, (stage, example) in enumerate(work):
      if on_progress is not None:
        on_progress(done, len(work))
      self.engine.compile_shape(stage, example)
    if on_progress is not None:
      on_progress(len(work), len(work))
    return self.compile_stats()

  # ------------------------------------------------------------------------------- scoring

  def chunks(self, n: int) -> List[List[int]]:
    """Record indices 0..n-1 cut into the chunks of `chunk_records` that `score` scores (the
    training feature pass, `feature_cache.reranker_features`, runs the same chunks)."""
    return pipeline.chunk_indices(n, self.chunk_records)

  def prepare(self, records: Sequence[InferenceRecord], tokenizer=None
              ) -> Union[list, LogRerankError]:
    """Host work of one chunk of records (its local-stage jobs, `Planner.local_jobs`), or the
    LogRerankError that stopped it (`score_chunk` then retries the chunk record by record).
    Any thread may call it with its own `tokenizer` copy (default: this engine's)."""
    try:
      return self.planner.local_jobs(records, tokenizer)
    except LogRerankError as e:
      return e

  def record_tokens(self, records: Sequence[InferenceRecord], tokenizer=None) -> List[int]:
    """Real tokens the local stage runs for each record (`Planner.record_tokens`)."""
    return self.planner.record_tokens(records, tokenizer)

  def local_nodes(self, records: Sequence[InferenceRecord], jobs: Optional[list] = None):
    """The local stage alone (`scorer.local_nodes`): per record its sentence nodes, passage
    windows and whether its query was cut; what the global stage's training features are."""
    return scorer.local_nodes(self.engine, self.planner, records, jobs)

  def score_chunk(self, records: Sequence[InferenceRecord],
                  jobs: Union[None, list, LogRerankError] = None
                  ) -> List[Union[QueryScores, LogRerankError]]:
    """Score one chunk of records on this thread: one result or error per record.

    A chunk that fails (e.g. a query larger than the biggest bucket, or host work that raised)
    is retried one record at a time, so only the offending record gets the error.

    Args:
      records: parsed records.
      jobs: their `prepare` output when it ran already (else it runs here).
    """
    try:
      if isinstance(jobs, LogRerankError):
        raise jobs
      return scorer.score_group(self.engine, self.planner, records, jobs)
    except LogRerankError:
      out: List[Union[QueryScores, LogRerankError]] = []
      for rec in records:
        try:
          out.append(scorer.score_group(self.engine, self.planner, [rec])[0])
        except LogRerankError as e:
          out.append(e)
      return out

  def score(self, records: Sequence[InferenceRecord], progress: bool = False
            ) -> List[Union[QueryScores, LogRerankError]]:
    """Score parsed records in chunks of `chunk_records`, one result or error per record.

    Local calls are filled across a chunk's records, global calls take `queries_per_batch`
    of them at a time. A chunk that fails is retried one record at a time (`score_chunk`).

    With `host_workers` > 0 the host work of the next chunks (tokenising, planning and packing
    the local calls) runs on that many Grain worker threads while this thread drives the
    devices (`engine.pipeline`); the chunks come back in input order and the jobs are those
    the serial path builds, so the results are identical (tested).

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
    chunks = pipeline.prepared_chunks(records, self.chunk_records, self.planner.local_jobs,
                                      self.tokenizer, self.host_workers)
    for idx, jobs in chunks:
      for i, r in zip(idx, self.score_chunk([records[i] for i in idx], jobs)):
        results[i] = r
      if bar is not None:
        bar.update(len(idx))
    if bar is not None:
      bar.close()
    return results
