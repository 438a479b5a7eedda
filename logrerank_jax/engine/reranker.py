"""The public `Reranker`: the Python door to a loaded LoG-Reranker model folder and its engine.

    import logrerank_jax
    rr = logrerank_jax.Reranker.from_pretrained(path)   # model folder or a workdir with model/
    ranked = rr.rank(query, passages)                   # reranked passages (results.RankedResults)
    out = rr.rerank_records(records)                    # input dicts -> one output dict per record
    rr.compile_stats()                                  # {"xla_compilations", "jit_cache_entries", ...}

The output dicts are the "log" format of `logrerank_jax.results` (typed `RerankResult` /
`RecordError` inside the library, `to_dict()` at the edge).

A `Reranker` is an `engine.core.EngineCore` (the planner, the devices, the prior cache and the
named steps every door scores through) that also loads model folders (`from_pretrained`), parses
its input first (`data.inference_input`), hands the parsed records to the core's `score`, and
builds the results last (`results.make_result`). The HTTP server (`serving.app`, through
`engine.batcher`) drives the same object through the core's `record_tokens` / `prepare` /
`score_chunk`.
"""

import dataclasses
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Union

from logrerank_jax.data.inference_input import (InferenceRecord, InputLine,
                                                parse_inference_record)
from logrerank_jax.data.packing import PackingConfig
from logrerank_jax.errors import DataError
from logrerank_jax.models import log_reranker as lr
from logrerank_jax.models.model_folder import load_model, read_info, resolve_model_dir
from logrerank_jax.results.calibration import read_calibration
from logrerank_jax.results import (QueryScores, RankedResults, RecordError, Result, make_result,
                                   ranked_results, record_error)
from logrerank_jax.engine.core import EngineCore
from logrerank_jax.engine.pipeline import DEFAULT_HOST_WORKERS
from logrerank_jax.engine.planner import default_packing_config
from logrerank_jax.engine.prior_cache import DEFAULT_MAX_SEGMENTS


def parse_lines(records: Iterable[Any]) -> List[InputLine]:
  """Parse input records (dicts in the OpenScholar style, or `InferenceRecord`s) into numbered
  `InputLine`s; a record that does not parse holds its DataError (its output is an error)."""
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


class Reranker(EngineCore):
  """A loaded LoG-Reranker with a jitted, shape-bucketed batch forward.

  An `EngineCore` itself, not a wrapper of one: the HTTP app hands its loaded `Reranker` to the
  batcher, which calls the core's steps on it directly, so there is nothing to relay."""

  def __init__(self, params, cfg: lr.LoGConfig, tokenizer,
               packing: Optional[PackingConfig] = None, queries_per_batch: int = 4,
               local_slots: Optional[int] = None, devices: Optional[Sequence[Any]] = None,
               host_workers: int = DEFAULT_HOST_WORKERS,
               prior_cache_segments: int = DEFAULT_MAX_SEGMENTS, _local_only: bool = False):
    """Wrap loaded params (the arguments are `EngineCore.__init__`'s)."""
    super().__init__(params, cfg, tokenizer, packing, queries_per_batch, local_slots, devices,
                     host_workers, prior_cache_segments)
    # True when `from_pretrained` loaded a local-stage model (no global params) as "w/o global".
    self.local_only = bool(_local_only)
    self.model_dir: Optional[str] = None  # set by `from_pretrained`
    # The folder's calibration.json when `from_pretrained` applied it (scores are calibrated).
    self.calibration: Optional[dict] = None

  @classmethod
  def from_pretrained(cls, path: str, calibrated: bool = True, **kwargs) -> "Reranker":
    """Load a model folder (`model_folder.save_model` layout) or a training workdir with `model/`.

    Args:
      path: the folder.
      calibrated: when the folder holds a calibration.json (the global stage writes one; also
        `logrerank calibrate`), scores are its calibrated probabilities sigmoid(a z + b) of
        LoG's logits z, the final and the local score alike, as `logrerank serve` reports them
        (`self.calibration` holds it). Raw sigmoid(z) saturates: a sure passage's score reads
        exactly 1.0 in float32. False: the raw sigmoid. Rankings are the same either way
        (a > 0), except ties at 1.0.
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
    cal = read_calibration(model_dir) if calibrated else None
    if cal is not None:
      rr.use_calibration(cal)
    return rr

  def use_calibration(self, cal: dict) -> None:
    """Report `cal`'s (a calibration.json's) probabilities sigmoid(a z + b) of LoG's logits z,
    final and local scores alike; `self.calibration` holds it.

    Raises:
      DataError: the model has no global stage (the calibration is of its logit).
    """
    if not self.cfg.use_global:
      raise DataError(f"{self.model_dir}: calibration.json calibrates the global stage's logit; "
                      "this model has no global stage")
    self.engine.set_score_map("sigmoid", cal["a"], cal["b"])
    self.calibration = cal

  def padding_plan(self, records: Iterable[Any]) -> dict:
    """Host work only: plan and pack the local calls of `records` exactly as `rerank_records`
    would (same chunks, same planner, same buckets) and report the padding, without running
    the model: `local_calls`, `real_tokens`, `computed_tokens` (rows x row_len of each call),
    `padding_efficiency` and the distinct call `shapes` (rows, row_len). Records that do not
    parse are left out (as they would be errors)."""
    recs = [ln.record for ln in parse_lines(records) if isinstance(ln.record, InferenceRecord)]
    return super().padding_plan(recs)

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

  def rerank_records(self, records: Iterable[Any], progress: bool = False) -> List[dict]:
    """Rerank input records (dicts in the OpenScholar style): one output dict per record, in order.

    Args:
      records: parsed JSON objects (or `InferenceRecord`s); bad ones give an `error` output.
      progress: show a tqdm progress bar.

    Returns:
      Output dicts in the "log" format (`logrerank_jax.results`); `line` is the 1-based record
      number.
    """
    return [r.to_dict() for r in self.rerank_lines(parse_lines(records), progress=progress)]

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
    res = self.rerank_lines(parse_lines([{"input": query, "ctxs": ctxs}]))[0]
    if isinstance(res, RecordError):
      raise DataError(res.error)
    return ranked_results(res, ctxs, top_k)
