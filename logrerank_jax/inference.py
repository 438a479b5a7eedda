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

Compilation count.  `compile_stats()["xla_compilations"]` counts the
`/jax/core/compile/backend_compile_duration` events (`jax.monitoring`) fired while this
reranker's jitted forward runs: one per XLA executable built, including ones loaded from the
persistent compilation cache (`persistent_cache_hits` counts those separately).
`jit_cache_entries` is the jitted function's `_cache_size()` (distinct traced shapes).
"""

import dataclasses
import functools
import os
import threading
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from logrerank_jax.data.inference_input import (InferenceRecord, InputLine,
                                                parse_inference_record)
from logrerank_jax.data.packing import (BucketOverflowError, PackingConfig, QueryInput,
                                        bucket_size, grown_buckets, pack_for_model)
from logrerank_jax.errors import CheckpointError, ConfigError, DataError, LogRerankError
from logrerank_jax.graph.context import log_context
from logrerank_jax.models import log_reranker as lr
from logrerank_jax.models.model_folder import load_model, read_info, resolve_model_dir
from logrerank_jax.ranking import passage_order, passage_scores, sentence_order
from logrerank_jax.results import (ContextUnit, PassageInfo, RankedResults, RankedSentence,
                                   RecordError, RerankResult, Result, SentenceRef, finite,
                                   ranked_results, record_error, to_openscholar)
from logrerank_jax.schema import MODEL_KEYS, NUM_ROLES, ROLE_NAMES

__all__ = ["Reranker", "QueryScores", "default_packing_config", "enable_compilation_cache",
           "default_compilation_cache_dir", "to_openscholar", "resolve_model_dir"]

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


# Queries up to this many tokens are never cut by default: real scientific questions and claims
# fit (a 20-word SciFact claim is ~30 WordPiece tokens under a real vocabulary, ~110 under a
# 1,024-word demo vocabulary).
DEFAULT_MAX_QUERY_TOKENS = 128


def default_packing_config(cfg: lr.LoGConfig, row_len: Optional[int] = None,
                           max_query_tokens: Optional[int] = None, **buckets) -> PackingConfig:
  """Packer settings for inference.

  Rows of `row_len` tokens (default 1024, the paper's input limit), capped by the encoder's
  positions; queries cut at `max_query_tokens` (default `DEFAULT_MAX_QUERY_TOKENS`, at most
  half a row so passages keep room); `buckets` (row_buckets, span_buckets,
  node_buckets) override the packer's defaults. Any pool size works with any buckets: the
  engine splits a query over several local calls and grows node buckets (module docstring).
  """
  row_len = min(int(row_len or 1024), cfg.local.encoder.max_position_embeddings)
  mqt = int(max_query_tokens) if max_query_tokens else min(DEFAULT_MAX_QUERY_TOKENS, row_len // 2)
  return PackingConfig(row_len=row_len, max_query_tokens=mqt,
                       **{k: tuple(v) for k, v in buckets.items() if v})


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


def _out_of_memory(e: Exception) -> bool:
  text = str(e)
  return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


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
    """Best sentence score per passage ([P], `ranking.passage_scores`); passages without
    sentences get -1, below any sigmoid score (finite, so run files can hold it)."""
    scores = {"final": self.final_score, "local": self.local_score}[which]
    best = passage_scores(self.node_passage, scores, len(self.record.passages))
    return np.where(np.isfinite(best), best, -1.0)


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
    _check_param_shapes(params, cfg)
    self.cfg = cfg
    # True when `from_pretrained` loaded a local-stage model (no global params) as "w/o global".
    self.local_only = bool(_local_only)
    self.tokenizer = tokenizer
    self.queries_per_batch = queries_per_batch
    self.packing = dataclasses.replace(packing or default_packing_config(cfg),
                                       query_buckets=(queries_per_batch,))
    # Params live on the device once; passing host arrays would copy them on every call.
    self.params = jax.device_put(params)
    self._local_jit = jax.jit(functools.partial(_local_forward, cfg=cfg))
    self._global_jit = jax.jit(functools.partial(_global_forward, cfg=cfg))
    self._compiles = 0
    self._cache_hits = 0
    self._calls = 0
    _ensure_listeners()

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
            "jit_cache_entries": int(self._local_jit._cache_size()  # pylint: disable=protected-access
                                     + self._global_jit._cache_size()),  # pylint: disable=protected-access
            "forward_calls": self._calls}

  def _call(self, fn, *args):
    """Run a jitted stage, counting the compilations it triggers; host copies of the result."""
    before = dict(_COUNTS)
    try:
      out = jax.tree_util.tree_map(np.asarray, fn(self.params, *args))  # waits for the device
    except Exception as e:  # pylint: disable=broad-except  (XLA raises its own runtime errors)
      if _out_of_memory(e):
        raise DataError("out of device memory; rerank with fewer queries per call "
                        "(--queries-per-batch / queries_per_batch) or shorter rows "
                        "(--row-len / row_len)") from None
      raise
    self._compiles += _COUNTS["compiles"] - before["compiles"]
    self._cache_hits += _COUNTS["cache_hits"] - before["cache_hits"]
    self._calls += 1
    return out

  def _token_counts(self, records: Sequence[InferenceRecord]):
    """(query tokens, tokens per passage) of each record: the cost used to cut queries into
    calls that fit the buckets (one batched tokeniser call)."""
    texts = [r.query for r in records] + [s for r in records for p in r.sentence_texts for s in p]
    lens = iter(len(t) for t in self.tokenizer(texts, add_special_tokens=False)["input_ids"])
    queries = [next(lens) for _ in records]
    return [(q, [sum(next(lens) + 1 for _ in p) for p in r.sentence_texts])
            for q, r in zip(queries, records)]

  def _local_calls(self, records: Sequence[InferenceRecord]):
    """Cut the records' scorable passages into local-stage calls that fit the buckets.

    Each call holds at most `queries_per_batch` slots; a slot is (record index, passage
    indices) of one record. A query whose passages do not fit one call is spread over several
    slots and calls (local scores depend only on the (query, passage) sequence, so this
    changes no score). Returns a list of calls, each a list of slots.
    """
    pk = self.packing
    row_len = pk.row_len
    # Budgets with slack for first-fit fragmentation; a call that still overflows is split.
    token_budget = int(0.85 * pk.row_buckets[-1] * row_len)
    span_budget = pk.span_buckets[-1] - 1
    node_budget = pk.node_buckets[-1]
    counts = self._token_counts(records)
    calls, cur, used_tokens, used_spans = [], [], 0, 0
    for ri, rec in enumerate(records):
      slot, slot_nodes = None, 0
      q_len, p_lens = counts[ri]
      qtok = min(q_len, pk.max_query_tokens) + 3  # [CLS] q [SEP] ... [SEP] in every window
      for pi, psg in enumerate(rec.passages):
        n = len(psg.sentences)
        if n == 0:
          continue
        windows = max(1, -(-p_lens[pi] // max(row_len - qtok, 1)))
        tokens = p_lens[pi] + windows * qtok
        spans = n + windows
        full = cur and (used_tokens + tokens > token_budget or used_spans + spans > span_budget)
        if full or (slot is not None and slot_nodes + n > node_budget):
          if full:
            calls.append(cur)
            cur, used_tokens, used_spans = [], 0, 0
          slot = None
        if slot is None:
          if len(cur) == self.queries_per_batch:
            calls.append(cur)
            cur, used_tokens, used_spans = [], 0, 0
          slot, slot_nodes = (ri, []), 0
          cur.append(slot)
        slot[1].append(pi)
        slot_nodes += n
        used_tokens += tokens
        used_spans += spans
    if cur:
      calls.append(cur)
    return calls

  def _pack_call(self, records, call):
    """Pack one local call; a call that overflows a bucket is split in halves, and a single
    passage too large for every bucket gets grown buckets (one more shape, not an error)."""
    queries = [QueryInput(records[ri].query, [records[ri].sentence_texts[pi] for pi in pis])
               for ri, pis in call]
    try:
      return [(call, *pack_for_model(queries, self.tokenizer, self.packing,
                                     self.cfg.contextual_encoding))]
    except BucketOverflowError:
      if len(call) > 1 or len(call[0][1]) > 1:
        if len(call) > 1:
          halves = [call[:len(call) // 2], call[len(call) // 2:]]
        else:
          (ri, pis), = call
          halves = [[(ri, pis[:len(pis) // 2])], [(ri, pis[len(pis) // 2:])]]
        return [part for h in halves for part in self._pack_call(records, h)]
    # One passage alone overflows: grow every bucket to cover it.
    big = dataclasses.replace(self.packing, row_buckets=grown_buckets(self.packing.row_buckets, 1 << 20),
                              span_buckets=grown_buckets(self.packing.span_buckets, 1 << 22),
                              node_buckets=grown_buckets(self.packing.node_buckets, 1 << 22))
    batch, info = pack_for_model(queries, self.tokenizer, big, self.cfg.contextual_encoding)
    return [(call, batch, info)]

  def _score_group(self, records: Sequence[InferenceRecord]) -> List[QueryScores]:
    """Score records: local stage over as many bucketed calls as they need, then the global
    stage over each query's whole graph (never cut), `queries_per_batch` queries per call."""
    d = self.cfg.local.encoder.hidden_size
    nodes: List[List[tuple]] = [[] for _ in records]   # per record: (pi, si, h, roles, z)
    windows = [dict() for _ in records]                # per record: pi -> (windows, trunc, empty)
    truncated_q = [False] * len(records)
    for call in self._local_calls(records):
      for part, batch, info in self._pack_call(records, call):
        out = self._call(self._local_jit, {k: getattr(batch, k) for k in MODEL_KEYS})
        for slot, (ri, pis) in enumerate(part):
          truncated_q[ri] |= bool(info.query_truncated[slot])
          m = np.flatnonzero(batch.node_mask[slot])
          for ni in m:
            lp, si = int(batch.node_passage[slot, ni]), int(batch.node_sentence[slot, ni])
            nodes[ri].append((pis[lp], si, out["h"][slot, ni], out["role_probs"][slot, ni],
                              float(out["local_score"][slot, ni])))
          for lp, pinfo in zip(pis, self._passage_info_of(records[ri], pis, info.passages[slot])):
            windows[ri][lp] = pinfo
    results: List[QueryScores] = []
    size = self.queries_per_batch
    for start in range(0, len(records), size):
      group = list(range(start, min(start + size, len(records))))
      for ri in group:
        nodes[ri].sort(key=lambda t: (t[0], t[1]))  # passage order, as one joint packing
      n_max = max([len(nodes[ri]) for ri in group] + [1])
      n = bucket_size(n_max, grown_buckets(self.packing.node_buckets, n_max), "node_buckets")
      feats = {"h": np.zeros((size, n, d), np.float32),
               "role_probs": np.zeros((size, n, NUM_ROLES), np.float32),
               "local_score": np.zeros((size, n), np.float32),
               "node_passage": np.full((size, n), -1, np.int32),
               "node_mask": np.zeros((size, n), bool)}
      for q, ri in enumerate(group):
        for j, (pi, _, h, roles, z) in enumerate(nodes[ri]):
          feats["h"][q, j], feats["role_probs"][q, j], feats["local_score"][q, j] = h, roles, z
          feats["node_passage"][q, j] = pi
        feats["node_mask"][q, :len(nodes[ri])] = True
      out = self._call(self._global_jit, feats)
      out["role_probs"] = feats["role_probs"].reshape(size * n, NUM_ROLES)
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


def make_result(res: QueryScores, line: Optional[int] = None) -> Result:
  """Turn one query's scores into its typed result (or a `RecordError` on a non-finite score)."""
  rec = res.record

  def ref(n) -> Optional[SentenceRef]:
    if n is None:
      return None
    p, s = int(res.node_passage[n]), int(res.node_sentence[n])
    return SentenceRef(p, s, rec.passages[p].sentences[s].text)

  try:
    ranked = []
    for rank, n in enumerate(sentence_order(res.final_score), start=1):
      p, s = int(res.node_passage[n]), int(res.node_sentence[n])
      sent = rec.passages[p].sentences[s]
      ranked.append(RankedSentence(
          rank=rank, passage=p, sentence=s, start=sent.start, end=sent.end, text=sent.text,
          role_probs=tuple(finite(v) for v in res.role_probs[n]),
          local_score=finite(res.local_score[n]),
          global_score=None if res.global_score is None else finite(res.global_score[n]),
          score=finite(res.final_score[n]), truncated=s in res.passage_info[p][1]))
    context = []
    for unit in res.context:
      expanded = "similar" in unit
      context.append(ContextUnit(
          sentence=ref(unit["node"]), score=finite(unit["score"]),
          role=None if unit["role"] is None else ROLE_NAMES[unit["role"]],
          predecessor=ref(unit.get("predecessor")), successor=ref(unit.get("successor")),
          similar=tuple(ref(v) for v in unit["similar"]) if expanded else None))
  except DataError as e:
    return record_error(rec.raw, str(e), line)
  # A passage scores as its best sentence; passages without sentences come last.
  passage_ranking = passage_order(res.passage_scores("final"))
  passages = tuple(PassageInfo(index=p, id=ps.passage_id, title=ps.title,
                               num_sentences=len(ps.sentences), num_windows=res.passage_info[p][0],
                               truncated_sentences=tuple(res.passage_info[p][1]),
                               empty_sentences=tuple(res.passage_info[p][2]),
                               skipped=ps.skipped)
                   for p, ps in enumerate(rec.passages))
  return RerankResult(line=line, id=rec.record_id, query=rec.query,
                      query_truncated=res.query_truncated, ranked_sentences=tuple(ranked),
                      passage_ranking=tuple(passage_ranking), passages=passages,
                      context=tuple(context))
