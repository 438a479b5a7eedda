"""Jit-compiled batch reranking with a trained LoG-Reranker model folder.

Library entry point (stable; `tools/rerank.py` and the conversion tests call it):

    from logrerank_jax.inference import Reranker
    rr = Reranker.from_dir(path)            # model folder (export.save_model) or a workdir with model/
    out = rr.rerank_records(records)        # list of input dicts -> one output dict per record, in order
    rr.compile_stats()                      # {"xla_compilations", "jit_cache_entries", ...}

Each output dict (the "log" format) is
    {"line", "id", "query", "error": None, "query_truncated",
     "ranked_sentences": [{"rank", "passage", "sentence", "start", "end", "text",
                           "role_probs": {"background", "method", "result"}, "role",
                           "local_score", "global_score", "score", "truncated"}, ...],
     "passage_ranking": [passage index, ...],
     "passages": [{"index", "id", "title", "num_sentences", "num_windows",
                   "truncated_sentences", "empty_sentences"}, ...],
     "context": [{"passage", "sentence", "text", "score", "role",
                  "predecessor", "successor", "similar"}, ...]}
or, for a record that cannot be processed, {"line", "id", "query", "error": "<one line>"}.
`passage`/`sentence` are indices into the input's passage list and the passage's sentences;
`text == passage_text[start:end]`; `score` is the final score used for ranking (the global one,
or the local one for a model trained "w/o global", whose `global_score` is None). Sentences are
ranked by decreasing score, ties by passage order; `passage_ranking` lists passages by the first
appearance of their sentences, then passages without sentences (empty text) in input order.
Context units (eq 17-18) are those of `log_context`, with node indices resolved to
{"passage", "sentence", "text"} references (predecessor/successor may be None).

Shapes.  Queries are packed `queries_per_batch` at a time with `pack_for_config`; the query axis
is always padded to `queries_per_batch` slots and rows, spans and nodes to the `PackingConfig`
buckets, so the forward (`log_forward`, local -> graph -> global in one `jax.jit` with the config
static) sees only a small fixed set of shapes and compiles once per shape bucket.

Compilation count.  `compile_stats()["xla_compilations"]` counts the
`/jax/core/compile/backend_compile_duration` events (`jax.monitoring`) fired while this
reranker's jitted forward runs: one per XLA executable built, including ones loaded from the
persistent compilation cache (`persistent_cache_hits` counts those separately).
`jit_cache_entries` is the jitted function's `_cache_size()` (distinct traced shapes).
"""

import dataclasses
import functools
import math
import os
import threading
from typing import Any, Iterable, List, Optional, Sequence, Union

import jax
import numpy as np

from logrerank_jax.data.inference_input import (InferenceRecord, InputLine,
                                                parse_inference_record)
from logrerank_jax.data.packing import PackingConfig, QueryInput
from logrerank_jax.errors import CheckpointError, ConfigError, DataError, LogRerankError
from logrerank_jax.models import log_reranker as lr
from logrerank_jax.models.local_scorer import SPAN_KEYS, TOKEN_KEYS

ROLE_NAMES = ("background", "method", "result")
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
DEFAULT_CACHE_ENV = "LOGRERANK_JAX_COMPILATION_CACHE"

# Process-wide event counters, fed by one listener pair registered on first use.
_COUNTS = {"compiles": 0, "cache_hits": 0}
_LISTENER_LOCK = threading.Lock()
_LISTENING = False


def _ensure_listeners() -> None:
  """Register the jax.monitoring listeners that count compilations (once per process)."""
  global _LISTENING
  with _LISTENER_LOCK:
    if _LISTENING:
      return

    def on_duration(event, _secs, **_kw):
      if event == BACKEND_COMPILE_EVENT:
        _COUNTS["compiles"] += 1

    def on_event(event, **_kw):
      if event == CACHE_HIT_EVENT:
        _COUNTS["cache_hits"] += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
    _LISTENING = True


def default_compilation_cache_dir() -> str:
  """Return `$LOGRERANK_JAX_COMPILATION_CACHE` or ~/.cache/logrerank_jax/xla."""
  return os.environ.get(DEFAULT_CACHE_ENV) or os.path.join(
      os.path.expanduser("~"), ".cache", "logrerank_jax", "xla")


def enable_compilation_cache(path: str, min_compile_time_secs: float = 0.0) -> str:
  """Turn on JAX's persistent compilation cache in `path` (created with 0o700 permissions).

  Args:
    path: cache folder; created if missing. An existing folder is used as is.
    min_compile_time_secs: cache only executables that took at least this long to compile
      (JAX's default is 1 s; 0 caches everything, which helps small CPU models too).

  Returns:
    The absolute cache path.
  """
  path = os.path.abspath(os.path.expanduser(path))
  if not os.path.isdir(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # Compiled executables are code the process will run: keep the folder private.
    os.mkdir(path, 0o700)
    os.chmod(path, 0o700)  # mkdir's mode is masked by the umask
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_secs))
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path


def resolve_model_dir(path: str) -> str:
  """Return the model folder of `path`: `path` itself, or `path/model` for a training workdir.

  Raises:
    CheckpointError: neither holds a `model_config.json`.
  """
  for cand in (path, os.path.join(path, "model")):
    if os.path.isfile(os.path.join(cand, "model_config.json")):
      return cand
  raise CheckpointError(f"{path} is neither a model folder (model_config.json, params/, "
                        "tokenizer/) nor a training workdir containing model/")


def default_packing_config(cfg: lr.LoGConfig, row_len: Optional[int] = None,
                           max_query_tokens: Optional[int] = None) -> PackingConfig:
  """Packer settings for inference: rows of `row_len` tokens (default 1024, the paper's input
  limit), capped by the encoder's positions; queries cut at `max_query_tokens` (default 64)."""
  row_len = min(int(row_len or 1024), cfg.local.encoder.max_position_embeddings)
  return PackingConfig(row_len=row_len, max_query_tokens=int(max_query_tokens or 64))


def _check_param_shapes(params, cfg: lr.LoGConfig, tokenizer) -> None:
  """Raise CheckpointError listing every param whose shape differs from what `cfg` builds.

  Without it, params saved under another config fail deep inside the first forward call.
  """
  from flax.traverse_util import flatten_dict  # pylint: disable=g-import-not-at-top
  example, _ = lr.pack_for_config([QueryInput("q", [["a b", "c"]])], tokenizer,
                                  PackingConfig(row_len=32, max_query_tokens=8), cfg)
  # Shapes only (no compute); a local-stage export lacks "global", so compare shared subtrees.
  want = jax.eval_shape(lambda k: lr.init_params(cfg, example, k), jax.random.PRNGKey(0))
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


def _forward(params, arrays, cfg):
  """The jitted body: local -> graph -> global, keeping only what the output needs."""
  out = lr.log_forward(params, arrays, cfg)
  keep = {k: out[k] for k in ("local_score", "final_score", "role_probs", "graph")}
  keep["global_score"] = out.get("global_score", out["final_score"])
  return keep


@dataclasses.dataclass
class QueryScores:
  """Host-side scores of one query: per node arrays in passage order, plus its context units."""
  record: InferenceRecord
  node_passage: np.ndarray    # int32 [n]
  node_sentence: np.ndarray   # int32 [n]
  local_score: np.ndarray     # float32 [n]
  global_score: Optional[np.ndarray]  # float32 [n]; None without a global stage
  final_score: np.ndarray     # float32 [n]
  role_probs: np.ndarray      # float32 [n, 3]
  context: list               # build_context units (node indices)
  passage_info: list          # per passage: (num_windows, truncated sentences, empty sentences)
  query_truncated: bool = False  # the query was cut at `max_query_tokens`

  def passage_scores(self, which: str = "final") -> np.ndarray:
    """Best sentence score per passage ([P]); passages without sentences get -1 (below any sigmoid)."""
    scores = {"final": self.final_score, "local": self.local_score}[which]
    out = np.full(len(self.record.passages), -1.0, np.float64)
    for p, s in zip(self.node_passage, scores):
      out[p] = max(out[p], float(s))
    return out


class Reranker:
  """A loaded LoG-Reranker with a jitted, shape-bucketed batch forward."""

  def __init__(self, params, cfg: lr.LoGConfig, tokenizer,
               packing: Optional[PackingConfig] = None, queries_per_batch: int = 4,
               _local_only: bool = False):
    """Wrap loaded params.

    Args:
      params: the `LoGReranker` param tree.
      cfg: its `LoGConfig`.
      tokenizer: the fast tokenizer the model was trained with.
      packing: packer settings (default `default_packing_config(cfg)`); its `query_buckets` are
        replaced by `(queries_per_batch,)` so every call has the same number of query slots.
      queries_per_batch: queries packed into one forward call.
    """
    if isinstance(queries_per_batch, bool) or not isinstance(queries_per_batch, int) \
        or queries_per_batch < 1:
      raise ConfigError(f"queries_per_batch must be a positive int, got {queries_per_batch!r}")
    if cfg.use_global and "global" not in params:
      raise CheckpointError("params have no 'global' tree but the config has use_global=True")
    _check_param_shapes(params, cfg, tokenizer)
    self.cfg = cfg
    # True when `from_dir` loaded a local-stage model (no global params) as "w/o global".
    self.local_only = bool(_local_only)
    self.tokenizer = tokenizer
    self.queries_per_batch = queries_per_batch
    self.packing = dataclasses.replace(packing or default_packing_config(cfg),
                                       query_buckets=(queries_per_batch,))
    # Params live on the device once; passing host arrays would copy them on every call.
    self.params = jax.device_put(params)
    self._jit = jax.jit(functools.partial(_forward, cfg=cfg))
    self._compiles = 0
    self._cache_hits = 0
    self._calls = 0
    _ensure_listeners()

  @classmethod
  def from_dir(cls, path: str, **kwargs) -> "Reranker":
    """Load a model folder (`export.save_model` layout) or a training workdir with `model/`.

    Args:
      path: the folder.
      **kwargs: `packing`, `queries_per_batch` (see `__init__`), or `row_len` /
        `max_query_tokens` for the default packing config. Unset ones are read from the folder's
        info.json `"packing"` entry when it has one (the training run's packer settings).

    Returns:
      The `Reranker`.
    """
    from logrerank_jax.training.export import load_model, read_info  # orbax import is slow

    model_dir = resolve_model_dir(path)
    params, cfg, tokenizer = load_model(model_dir)
    if cfg.use_global and "global" not in params:
      # A local-stage export (tools/train.py local stage) has no GAT yet: it is the "w/o global"
      # model, final score = local score. `local_only` records that this happened.
      cfg = dataclasses.replace(cfg, use_global=False)
      kwargs["_local_only"] = True
    row_len = kwargs.pop("row_len", None)
    max_query_tokens = kwargs.pop("max_query_tokens", None)
    if kwargs.get("packing") is None:
      trained = read_info(model_dir).get("packing") or {}
      kwargs["packing"] = default_packing_config(
          cfg, row_len or trained.get("row_len"),
          max_query_tokens or trained.get("max_query_tokens"))
    return cls(params, cfg, tokenizer, **kwargs)

  # ----------------------------------------------------------------------------------- forward

  def compile_stats(self) -> dict:
    """Return compilation counters of this reranker's forward (see the module docstring)."""
    return {"xla_compilations": self._compiles, "persistent_cache_hits": self._cache_hits,
            "jit_cache_entries": int(self._jit._cache_size()),  # pylint: disable=protected-access
            "forward_calls": self._calls}

  def _run(self, batch):
    """Run the jitted forward on a PackedBatch, counting the compilations it triggers."""
    arrays = {k: getattr(batch, k) for k in TOKEN_KEYS + SPAN_KEYS + lr.NODE_KEYS}
    before = dict(_COUNTS)
    out = self._jit(self.params, arrays)
    out = jax.tree_util.tree_map(np.asarray, out)  # waits for the device, then host copies
    self._compiles += _COUNTS["compiles"] - before["compiles"]
    self._cache_hits += _COUNTS["cache_hits"] - before["cache_hits"]
    self._calls += 1
    return out

  def _score_group(self, records: Sequence[InferenceRecord]) -> List[QueryScores]:
    """Pack and score up to `queries_per_batch` records in one forward call."""
    queries = [QueryInput(r.query, r.sentence_texts) for r in records]
    batch, info = lr.pack_for_config(queries, self.tokenizer, self.packing, self.cfg)
    out = self._run(batch)
    q_slots, n_slots = batch.node_mask.shape
    contexts = lr.log_context(out, self.cfg)
    per_q = lambda x, *t: np.asarray(x).reshape(q_slots, n_slots, *t)  # noqa: E731
    local, final = per_q(out["local_score"]), per_q(out["final_score"])
    glob, roles = per_q(out["global_score"]), per_q(out["role_probs"], 3)
    results = []
    for q, rec in enumerate(records):
      n = int(batch.node_mask[q].sum())
      results.append(QueryScores(
          record=rec, node_passage=batch.node_passage[q, :n].copy(),
          node_sentence=batch.node_sentence[q, :n].copy(), local_score=local[q, :n].copy(),
          global_score=glob[q, :n].copy() if self.cfg.use_global else None,
          final_score=final[q, :n].copy(), role_probs=roles[q, :n].copy(),
          context=contexts[q], passage_info=self._passage_info(rec, info.passages[q]),
          query_truncated=bool(info.query_truncated[q])))
    return results

  def _passage_info(self, rec: InferenceRecord, infos) -> list:
    """Per passage (num_windows, truncated, empty); maps back one-sentence sequences if needed."""
    if self.cfg.contextual_encoding:
      return [(i.num_windows, list(i.truncated_sentences), list(i.empty_sentences)) for i in infos]
    # "w/o contextual encoding": PackInfo has one entry per sentence, in passage order.
    out, k = [], 0
    for p in rec.passages:
      mine = infos[k:k + len(p.sentences)]
      k += len(p.sentences)
      out.append((len(mine), [s for s, i in enumerate(mine) if i.truncated_sentences],
                  [s for s, i in enumerate(mine) if i.empty_sentences]))
    return out

  def score(self, records: Sequence[InferenceRecord], progress: bool = False
            ) -> List[Union[QueryScores, LogRerankError]]:
    """Score parsed records in groups of `queries_per_batch`, one result or error per record.

    A group that fails (e.g. a query larger than the biggest bucket) is retried one record at a
    time so only the offending record gets the error.

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
    size = self.queries_per_batch
    for start in range(0, len(records), size):
      idx = list(range(start, min(start + size, len(records))))
      try:
        for i, r in zip(idx, self._score_group([records[i] for i in idx])):
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

  # ------------------------------------------------------------------------------------ output

  def rerank_lines(self, lines: Sequence[InputLine], progress: bool = False) -> List[dict]:
    """Rerank `read_inference_file` entries: one output dict per entry, in order."""
    good = [i for i, ln in enumerate(lines) if isinstance(ln.record, InferenceRecord)]
    scored = self.score([lines[i].record for i in good], progress=progress)
    by_index = dict(zip(good, scored))
    out = []
    for i, ln in enumerate(lines):
      res = by_index.get(i, ln.record)
      if isinstance(res, QueryScores):
        out.append(format_result(res, ln.line))
      else:
        out.append(error_result(ln.raw, str(res), ln.line))
    return out

  def rerank_records(self, records: Iterable[Any], progress: bool = False) -> List[dict]:
    """Rerank input records (dicts in the OpenScholar style): one output dict per record, in order.

    Args:
      records: parsed JSON objects (or `InferenceRecord`s); bad ones give an `error` output.
      progress: show a tqdm progress bar.

    Returns:
      Output dicts in the "log" format (module docstring); `line` is the 1-based record number.
    """
    lines = []
    for n, obj in enumerate(records, start=1):
      if isinstance(obj, InferenceRecord):
        lines.append(InputLine(n, obj.raw, obj))
        continue
      try:
        lines.append(InputLine(n, obj, parse_inference_record(obj, f"record {n}")))
      except DataError as e:
        lines.append(InputLine(n, obj, e))
    return self.rerank_lines(lines, progress=progress)


def _role_name(probs) -> str:
  """Argmax role name (ties to the lower index, as the graph builder)."""
  return ROLE_NAMES[int(np.argmax(probs))]


def _finite(x: float) -> float:
  """Return `x` as float, raising DataError on NaN/Inf (JSON cannot hold them honestly)."""
  x = float(x)
  if not math.isfinite(x):
    raise DataError(f"model produced a non-finite score ({x})")
  return x


def format_result(res: QueryScores, line: Optional[int] = None) -> dict:
  """Turn one query's scores into the "log" output dict (module docstring)."""
  rec = res.record
  try:
    order = np.lexsort((np.arange(len(res.final_score)), -res.final_score))  # score desc, then node
    ranked, passage_ranking, seen = [], [], set()
    for rank, n in enumerate(order.tolist(), start=1):
      p, s = int(res.node_passage[n]), int(res.node_sentence[n])
      sent = rec.passages[p].sentences[s]
      ranked.append({
          "rank": rank, "passage": p, "sentence": s, "start": sent.start, "end": sent.end,
          "text": sent.text,
          "role_probs": {r: _finite(v) for r, v in zip(ROLE_NAMES, res.role_probs[n])},
          "role": _role_name(res.role_probs[n]),
          "local_score": _finite(res.local_score[n]),
          "global_score": None if res.global_score is None else _finite(res.global_score[n]),
          "score": _finite(res.final_score[n]),
          "truncated": s in res.passage_info[p][1]})
      if p not in seen:
        seen.add(p)
        passage_ranking.append(p)
    # Passages without sentences (empty text) are kept, after every scored passage.
    passage_ranking += [p for p in range(len(rec.passages)) if p not in seen]

    def ref(n):
      if n is None:
        return None
      p, s = int(res.node_passage[n]), int(res.node_sentence[n])
      return {"passage": p, "sentence": s, "text": rec.passages[p].sentences[s].text}

    context = []
    for unit in res.context:
      u = dict(ref(unit["node"]))
      u["score"] = _finite(unit["score"])
      u["role"] = None if unit["role"] is None else ROLE_NAMES[unit["role"]]
      for key in ("predecessor", "successor"):
        if key in unit:
          u[key] = ref(unit[key])
      if "similar" in unit:
        u["similar"] = [ref(v) for v in unit["similar"]]
      context.append(u)
  except DataError as e:
    return error_result(rec.raw, str(e), line)
  passages = [{"index": p, "id": ps.passage_id, "title": ps.title,
               "num_sentences": len(ps.sentences), "num_windows": res.passage_info[p][0],
               "truncated_sentences": res.passage_info[p][1],
               "empty_sentences": res.passage_info[p][2]}
              for p, ps in enumerate(rec.passages)]
  return {"line": line, "id": rec.record_id, "query": rec.query, "error": None,
          "query_truncated": res.query_truncated, "ranked_sentences": ranked, "passage_ranking": passage_ranking, "passages": passages,
          "context": context}


def error_result(raw: Any, message: str, line: Optional[int] = None) -> dict:
  """The output dict of a record that could not be processed."""
  rid = query = None
  if isinstance(raw, dict):
    rid = raw.get("id") if isinstance(raw.get("id"), (str, int)) else None
    rid = None if rid is None or isinstance(rid, bool) else str(rid)
    q = raw.get("input", raw.get("question"))
    query = q if isinstance(q, str) else None
  return {"line": line, "id": rid, "query": query, "error": message}


def to_openscholar(raw: Any, result: dict) -> dict:
  """Write an input record back with its passages reordered (OpenScholar generation input).

  Every input field is kept; the passage list (`ctxs` or `passages`, whichever the input used)
  is reordered by `passage_ranking`, each passage object unchanged. Added keys:
  `log_passage_order` (original indices, best first) and `log_context` (the context units, whose
  `passage` indices refer to the ORIGINAL order). A failed record is written back unchanged with
  an `error` field (a line that was not a JSON object becomes {"error", "line"}).

  Args:
    raw: the parsed input object.
    result: its `format_result` / `error_result` dict.

  Returns:
    The output object.
  """
  if result.get("error") is not None:
    if isinstance(raw, dict):
      return {**raw, "error": result["error"]}
    return {"error": result["error"], "line": result.get("line")}
  out = dict(raw)
  pkey = "ctxs" if "ctxs" in raw else "passages"
  out[pkey] = [raw[pkey][p] for p in result["passage_ranking"]]
  out["log_passage_order"] = list(result["passage_ranking"])
  out["log_context"] = result["context"]
  return out
