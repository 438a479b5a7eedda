"""The public `Reranker`: a loaded LoG-Reranker model folder and its one engine.

    import logrerank_jax
    rr = logrerank_jax.Reranker.from_pretrained(path)   # model folder or a workdir with model/
    ranked = rr.rank(query, passages)                   # reranked passages (results.RankedResults)
    out = rr.rerank_records(records)                    # input dicts -> one output dict per record
    rr.compile_stats()                                  # {"xla_compilations", "jit_cache_entries", ...}

The output dicts are the "log" format of `logrerank_jax.results` (typed `RerankResult` /
`RecordError` inside the library, `to_dict()` at the edge).

`Reranker` composes the parts of the engine, one job each: `serving.planner.Planner` cuts records
into bucketed device calls (any pool size; a query's graph is never cut), `serving.engine.Engine`
runs them on every local device and counts compilations, `serving.scorer.score_group` takes one
group of records through both stages, and `serving.pipeline` runs the host work of the next
chunks on Grain threads ahead of the devices. The HTTP server (`serving.app`, through
`serving.batcher`) scores its requests through the same `prepare` / `score_chunk` pair that
`score` uses.
"""

import dataclasses
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Union

import numpy as np

from logrerank_jax.data.inference_input import (InferenceRecord, InputLine,
                                                parse_inference_record)
from logrerank_jax.data.packing import PackingConfig
from logrerank_jax.errors import ConfigError, DataError, LogRerankError
from logrerank_jax.models import log_reranker as lr
from logrerank_jax.models.model_folder import load_model, read_info, resolve_model_dir
from logrerank_jax.results import (QueryScores, RankedResults, RecordError, Result, make_result,
                                   ranked_results, record_error)
from logrerank_jax.engine import pipeline
from logrerank_jax.engine.device import Engine
from logrerank_jax.engine.planner import DEFAULT_LOCAL_SLOTS, Planner, default_packing_config
from logrerank_jax.engine.prior_cache import DEFAULT_MAX_SEGMENTS
from logrerank_jax.engine.scorer import score_group


class Reranker:
  """A loaded LoG-Reranker with a jitted, shape-bucketed batch forward."""

  def __init__(self, params, cfg: lr.LoGConfig, tokenizer,
               packing: Optional[PackingConfig] = None, queries_per_batch: int = 4,
               local_slots: Optional[int] = None, devices: Optional[Sequence[Any]] = None,
               host_workers: int = pipeline.DEFAULT_HOST_WORKERS,
               prior_cache_segments: int = DEFAULT_MAX_SEGMENTS, _local_only: bool = False):
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
        query and passage window and keeps this many (`serving.prior_cache`); 0 runs it in
        every local call (the training path). Same scores to float rounding.
    """
    for name, v in (("queries_per_batch", queries_per_batch), ("local_slots", local_slots)):
      if v is None and name == "local_slots":
        continue
      if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"{name} must be a positive int, got {v!r}")
    if isinstance(host_workers, bool) or not isinstance(host_workers, int) or host_workers < 0:
      raise ConfigError(f"host_workers must be an int >= 0, got {host_workers!r}")
    self.host_workers = host_workers
    if (isinstance(prior_cache_segments, bool) or not isinstance(prior_cache_segments, int)
        or prior_cache_segments < 0):
      raise ConfigError(f"prior_cache_segments must be an int >= 0, got {prior_cache_segments!r}")
    self.engine = Engine(params, cfg, devices, prior_cache_segments)
    self.cfg = cfg
    # True when `from_pretrained` loaded a local-stage model (no global params) as "w/o global".
    self.local_only = bool(_local_only)
    self.model_dir: Optional[str] = None  # set by `from_pretrained`
    self.tokenizer = tokenizer
    self.queries_per_batch = queries_per_batch
    self.local_slots = int(local_slots or max(DEFAULT_LOCAL_SLOTS, queries_per_batch))
    self.planner = Planner(cfg, tokenizer, packing or default_packing_config(cfg),
                           queries_per_batch, self.local_slots)
    self.packing = self.planner.packing
    # A whole number of global groups, independent of the device count (same calls anywhere).
    self.chunk_records = (-(-pipeline.DEFAULT_CHUNK_RECORDS // queries_per_batch)
                          * queries_per_batch)

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
    rr = cls(params, cfg, tokenizer, **kwargs)
    rr.model_dir = model_dir
    return rr

  from_dir = from_pretrained  # the earlier name

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

  def compile_stats(self) -> dict:
    """Return compilation counters of this reranker's forward (`serving.engine`)."""
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

  def padding_plan(self, records: Iterable[Any]) -> dict:
    """Host work only: plan and pack the local calls of `records` exactly as `rerank_records`
    would (same chunks, same planner, same buckets) and report the padding, without running
    the model: `local_calls`, `real_tokens`, `computed_tokens` (rows x row_len of each call),
    `padding_efficiency` and the distinct call `shapes` (rows, row_len). Records that do not
    parse are left out (as they would be errors)."""
    import numpy as np  # pylint: disable=g-import-not-at-top
    recs = [ln.record for ln in self._lines(records) if isinstance(ln.record, InferenceRecord)]
    real = computed = calls = 0
    shapes = set()
    for idx in self.chunks(len(recs)):
      for arrays, (_, _, info) in self._local_jobs([recs[i] for i in idx]):
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

  def precompile(self) -> dict:
    """Compile every shape the engine uses on bucket-sized traffic: each local row bucket
    (`local_shapes`) and each global node bucket, for this device count, so that live
    traffic compiles nothing (only a query larger than every bucket adds a grown shape).

    Returns:
      `compile_stats()` after compiling.
    """
    prior = self.engine.prior_cache
    d = self.cfg.local_scorer_config.encoder.hidden_size
    for shape in self.planner.local_shapes():
      example = self.planner.local_example(*shape)
      if prior is not None:  # local calls then carry the prior's pooled spans
        example["prior_pooled"] = np.zeros((shape[1], d), np.float32)
      self.engine.compile_shape("local", example)
    if prior is not None:
      for rows, spans in prior.shapes(self.planner):
        self.engine.compile_shape("prior", prior.example(self.planner, rows, spans))
    for n in self.packing.node_buckets:
      self.engine.compile_shape("global", self.planner.global_example(n))
    return self.compile_stats()

  # ------------------------------------------------------------------------------- scoring

  def _local_jobs(self, records: Sequence[InferenceRecord], tokenizer=None) -> list:
    """Host work of a chunk (tokenise, plan the local calls, pack them): `Planner.local_jobs`.
    Pure host code, so it can run on a worker thread (`host_workers`)."""
    return self.planner.local_jobs(records, tokenizer)

  def _score_group(self, records: Sequence[InferenceRecord], jobs: Optional[list] = None
                   ) -> List[QueryScores]:
    """`score_group` of `records`, their host work done here unless `jobs` holds it."""
    if jobs is None:
      jobs = self._local_jobs(records)
    return score_group(self.engine, self.planner, records, jobs)

  def chunks(self, n: int) -> List[List[int]]:
    """Record indices 0..n-1 cut into the chunks of `chunk_records` that `score` scores (the
    training feature pass, `feature_cache.reranker_features`, runs the same chunks)."""
    return pipeline.chunk_indices(n, self.chunk_records)

  def prepare(self, records: Sequence[InferenceRecord], tokenizer=None
              ) -> Union[list, LogRerankError]:
    """Host work of one chunk of records (its local-stage jobs), or the LogRerankError that
    stopped it (`score_chunk` then retries the chunk record by record). Any thread may call
    it with its own `tokenizer` copy (default: this reranker's)."""
    try:
      return self._local_jobs(records, tokenizer)
    except LogRerankError as e:
      return e

  def record_tokens(self, records: Sequence[InferenceRecord], tokenizer=None) -> List[int]:
    """Real tokens the local stage runs for each record (`Planner.record_tokens`)."""
    return self.planner.record_tokens(records, tokenizer)

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
      return self._score_group(records, jobs)
    except LogRerankError:
      out: List[Union[QueryScores, LogRerankError]] = []
      for rec in records:
        try:
          out.append(self._score_group([rec])[0])
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
    devices (`serving.pipeline`); the chunks come back in input order and the jobs are those
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
    chunks = pipeline.prepared_chunks(records, self.chunks(len(records)), self._local_jobs,
                                      self.tokenizer, self.host_workers)
    for idx, jobs in chunks:
      for i, r in zip(idx, self.score_chunk([records[i] for i in idx], jobs)):
        results[i] = r
      if bar is not None:
        bar.update(len(idx))
    if bar is not None:
      bar.close()
    return results

  # ------------------------------------------------------------------------------- output

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
