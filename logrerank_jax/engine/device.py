"""Device side of the reranking engine: the jitted forwards, the device mesh, the compiled
executables and their counts.

`Engine` owns the params (replicated once over a mesh of this process's devices), the jitted local
stage (`LoGReranker.local_nodes`) and global stage (`LoGReranker.global_logits`, or the graph
alone for a model without a global stage), and one compiled executable per (stage, shapes). Jobs
of one shape run `num_devices` at a time as one data-parallel step (`run_stacked`); a short stack
is padded with inert calls whose outputs are dropped. It knows nothing about records or packing:
the planner (`engine.planner`) hands it model arrays.

Compilation count.  `compile_stats()["xla_compilations"]` counts the
`/jax/core/compile/backend_compile_duration` events (`jax.monitoring`) fired while this engine
compiles: one per XLA executable built, including ones loaded from the persistent compilation
cache (`persistent_cache_hits` counts those separately). `jit_cache_entries` is the number of
distinct (stage, shapes) executables. Engines of one config on one device set share their jitted
stages (`stage_jits`), so an executable another such engine built is reused, not compiled or
counted again.

Not thread-safe: one thread drives an engine (the caller of `EngineCore.score`, or the serving
batcher's engine thread).
"""

import functools
import math
from typing import Any, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from logrerank_jax import compilation
from logrerank_jax.errors import CheckpointError, DataError
from logrerank_jax.models import log_reranker as lr
from logrerank_jax.engine.prior_cache import DEFAULT_MAX_SEGMENTS, PriorCache, uses_split_prior


def check_param_shapes(params, cfg: lr.LoGConfig) -> None:
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


def local_forward(params, arrays, cfg):
  """Jitted local stage over one packed call: the node features the global stage and the
  output need ([Q, N, ...])."""
  nodes = lr.LoGReranker(cfg).apply({"params": {"local": params["local"]}}, arrays, True,
                                    method=lr.LoGReranker.local_nodes)
  return {k: nodes[k] for k in lr.GLOBAL_FEATURE_KEYS}


def prior_forward(params, arrays, cfg):
  """Jitted split dense prior pass over rows in the split layout (`engine.prior_cache`): the
  pooled spans [S, d] the local forward then reads as `prior_pooled`."""
  return lr.LoGReranker(cfg).apply({"params": {"local": params["local"]}}, arrays,
                                   method=lr.LoGReranker.prior_spans)


# How the final logit z becomes the final score: ("sigmoid", a, b) is sigmoid(a z + b) (the
# default (1, 0) is LoG's own score; a calibration.json's Platt (a, b) makes it a calibrated
# probability, in float32 on the device where sigmoid(z) itself would round to 1.0 for large
# z); ("logit", 1, 0) is z itself, what a calibration is fitted on (`engine.calibration`).
RAW_SCORE = ("sigmoid", 1.0, 0.0)


def global_forward(params, feats, cfg, score_map=RAW_SCORE):
  """Jitted global stage over whole query graphs: graph build + GAT, the final score by
  `score_map` (or, without a global stage, the graph alone: final = local)."""
  model = lr.LoGReranker(cfg)
  mask = feats["node_mask"]
  if cfg.use_global:
    logit, graph = model.apply({"params": {"global": params["global"]}}, feats,
                               feats["node_passage"], mask, True,
                               method=lr.LoGReranker.global_logits)
    kind, a, b = score_map
    if kind == "logit":
      final = jnp.where(mask, logit, 0.0)
    else:  # (1, 0) traces exactly the uncalibrated program (its cached executables serve it)
      final = jnp.where(mask, jax.nn.sigmoid(logit if (a, b) == (1.0, 0.0) else a * logit + b),
                        0.0)
  else:
    graph = model.apply({"params": {}}, feats, feats["node_passage"], mask,
                        method=lr.LoGReranker.sentence_graph)
    final = feats["local_score"]
  q, n = mask.shape
  return {"final_score": final.reshape(q * n), "graph": graph}


def stacked(fn, mesh):
  """`fn(params, x)` over a leading device axis of `x`, sharded over `mesh`'s "data" axis,
  params replicated: D calls of one shape run as one data-parallel step."""
  from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  data = NamedSharding(mesh, PartitionSpec("data"))
  return jax.jit(jax.vmap(fn, in_axes=(None, 0)),
                 in_shardings=(NamedSharding(mesh, PartitionSpec()), data), out_shardings=data)


@functools.lru_cache(maxsize=16)
def data_mesh(devices: tuple):
  """The one-axis ("data") mesh over `devices`: one object per device set, which an engine and
  the stages it shares (`stage_jits`) both use."""
  from jax.sharding import Mesh  # pylint: disable=g-import-not-at-top
  return Mesh(np.asarray(devices, dtype=object), ("data",))


@functools.lru_cache(maxsize=16)
def stage_jits(cfg: lr.LoGConfig, devices: tuple) -> dict:
  """The jitted stages of one config on one device set, shared by every engine built for them.

  Params are an argument of each call, never a constant, so two engines of one config (a model
  loaded again, a second `Reranker`, the validation engines of a training run) run the same
  programs: sharing the jitted functions lets JAX's own trace, lowering and compilation caches
  serve the second engine's (stage, shapes) without compiling them again (its
  `compile_stats()["xla_compilations"]` stays 0). Bounded: the 16 latest (config, devices).
  """
  mesh = data_mesh(devices)
  return {"local": stacked(functools.partial(local_forward, cfg=cfg), mesh),
          "global": global_jit(cfg, devices, RAW_SCORE),
          "prior": stacked(functools.partial(prior_forward, cfg=cfg), mesh)}


@functools.lru_cache(maxsize=16)
def global_jit(cfg: lr.LoGConfig, devices: tuple, score_map: tuple):
  """The jitted global stage with one final-score map (`RAW_SCORE`), shared like `stage_jits`."""
  return stacked(functools.partial(global_forward, cfg=cfg, score_map=score_map),
                 data_mesh(devices))


def inert_like(arrays: dict) -> dict:
  """An inert call of the same shapes (nothing attended, no spans, no nodes): pads a device
  stack; its outputs are dropped."""
  return {k: np.full_like(v, -1 if k in ("span_node", "node_passage") else 0)
          for k, v in arrays.items()}


def out_of_memory(e: Exception) -> bool:
  """Whether an XLA error is the device running out of memory."""
  text = str(e)
  return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def raise_if_out_of_memory(e: Exception) -> None:
  """Turn a device out-of-memory error into a DataError naming the flags that shrink calls."""
  if out_of_memory(e):
    raise DataError("out of device memory; rerank with fewer queries per call "
                    "(--queries-per-batch / queries_per_batch, local_slots) or shorter rows "
                    "(--row-len / row_len, --row-buckets)") from None


class Engine:
  """The jitted local and global stages of one model on this process's devices."""

  def __init__(self, params, cfg: lr.LoGConfig, devices: Optional[Sequence[Any]] = None,
               prior_cache_segments: int = DEFAULT_MAX_SEGMENTS):
    """Place `params` on the devices and build the jitted stages.

    Args:
      params: the `LoGReranker` param tree (checked against `cfg`).
      cfg: its `LoGConfig`.
      devices: the devices to shard calls over (default `jax.local_devices()`).
      prior_cache_segments: for a split dense prior, the distinct segments whose prior pass
        is kept (`engine.prior_cache`); 0 runs the pass inside every local call instead.
    """
    from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
    if cfg.use_global and "global" not in params:
      raise CheckpointError("params have no 'global' tree but the config has use_global=True")
    check_param_shapes(params, cfg)
    self.cfg = cfg
    self.devices = list(devices) if devices else list(jax.local_devices())
    self.num_devices = len(self.devices)
    self.mesh = data_mesh(tuple(self.devices))
    self._data_sharding = NamedSharding(self.mesh, PartitionSpec("data"))
    # Params live on the devices once (replicated); host arrays would be copied on every call.
    self.params = jax.device_put(params, NamedSharding(self.mesh, PartitionSpec()))
    self._jits = stage_jits(cfg, tuple(self.devices))
    self.score_map = RAW_SCORE  # `set_score_map`
    # `engine.executable_store.ExecutableStore`, set by a server for its fast restart; None:
    # every program is traced and compiled (or found in JAX's persistent cache).
    self.executable_store = None
    # The split dense prior's pass runs once per distinct segment, outside the local forward
    # (`engine.prior_cache`); None for a model without one, or when turned off.
    self.prior_cache = (PriorCache(prior_cache_segments)
                        if prior_cache_segments and uses_split_prior(cfg.local_scorer_config)
                        else None)
    self._executables = {}  # (stage, shapes) -> compiled executable
    self._compiles = 0
    self._cache_hits = 0
    self.calls = 0
    # Local-stage bookkeeping: `real` is added by the caller (it knows the packed tokens).
    self.tokens = {"real": 0, "computed": 0, "inert": 0, "local_calls": 0, "inert_calls": 0}
    compilation.ensure_listeners()

  def set_params(self, params) -> None:
    """Swap in new params of the same shapes (checked), e.g. each validation of a training run:
    the compiled calls take params as an argument, so none is compiled again."""
    from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
    if self.cfg.use_global and "global" not in params:
      raise CheckpointError("params have no 'global' tree but the config has use_global=True")
    check_param_shapes(params, self.cfg)
    self.params = jax.device_put(params, NamedSharding(self.mesh, PartitionSpec()))
    if self.prior_cache is not None:
      self.prior_cache.clear()  # its pooled spans are the old params'

  def set_score_map(self, kind: str, a: float = 1.0, b: float = 0.0) -> None:
    """How the final logit becomes the final score (`RAW_SCORE`): ("sigmoid", a, b) with a > 0
    (the order is the logit's), or ("logit", 1, 0). Only the global stage compiles again."""
    if kind not in ("sigmoid", "logit") or not (a > 0 and math.isfinite(a) and math.isfinite(b)):
      raise ValueError(f"score map: kind 'sigmoid' or 'logit' with a > 0, got ({kind}, {a}, {b})")
    score_map = (kind, float(a), float(b)) if kind == "sigmoid" else ("logit", 1.0, 0.0)
    if score_map == self.score_map:
      return
    self.score_map = score_map
    self._jits = dict(self._jits)  # a copy: `stage_jits`' dict is shared by other engines
    self._jits["global"] = global_jit(self.cfg, tuple(self.devices), score_map)
    self._executables = {k: v for k, v in self._executables.items() if k[0] != "global"}

  def compile_stats(self) -> dict:
    """Compilation counters (module docstring) and the number of device steps run."""
    out = {"xla_compilations": self._compiles, "persistent_cache_hits": self._cache_hits,
           "jit_cache_entries": len(self._executables), "forward_calls": self.calls}
    if self.executable_store is not None:
      out["executables_loaded"] = self.executable_store.loaded
    return out

  def executable(self, stage: str, stacked_arrays: dict):
    """The compiled executable of a stage for these stacked shapes (compiled once, counted)."""
    key = (stage,) + tuple((k, v.shape, str(v.dtype)) for k, v in sorted(stacked_arrays.items()))
    exe = self._executables.get(key)
    if exe is None and self.executable_store is not None:
      exe = self.executable_store.load(self, key)  # a restart's programs, without tracing
      if exe is not None:
        self._executables[key] = exe
    if exe is None:
      spec = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in stacked_arrays.items()}
      before = dict(compilation.COUNTS)
      try:
        exe = self._jits[stage].lower(self.params, spec).compile()
      except Exception as e:  # pylint: disable=broad-except
        raise_if_out_of_memory(e)
        raise
      finally:
        self._compiles += compilation.COUNTS["compiles"] - before["compiles"]
        self._cache_hits += compilation.COUNTS["cache_hits"] - before["cache_hits"]
      self._executables[key] = exe
      # Only a program compiled here can be stored: one JAX loaded from its own persistent
      # cache serializes broken on XLA:CPU (`engine.executable_store`).
      if self.executable_store is not None and compilation.COUNTS["cache_hits"] == before[
          "cache_hits"]:
        self.executable_store.save(self, key, exe)
    return exe

  def compile_shape(self, stage: str, arrays: dict) -> None:
    """Compile `stage` for one call of `arrays`' shapes (stacked over the devices)."""
    self.executable(stage, {k: np.zeros((self.num_devices,) + v.shape, v.dtype)
                            for k, v in arrays.items()})

  def call(self, stage: str, lanes: List[dict]):
    """Run up to `num_devices` calls of one shape as one data-parallel step (the stack padded
    with inert calls); host copies of each real lane's outputs."""
    d = self.num_devices
    lanes = list(lanes) + [inert_like(lanes[0])] * (d - len(lanes))
    stacked_arrays = {k: np.stack([ln[k] for ln in lanes]) for k in lanes[0]}
    exe = self.executable(stage, stacked_arrays)
    try:
      out = exe(self.params, jax.device_put(stacked_arrays, self._data_sharding))
      out = jax.tree_util.tree_map(np.asarray, out)  # waits for the devices
    except Exception as e:  # pylint: disable=broad-except  (XLA raises its own runtime errors)
      raise_if_out_of_memory(e)
      raise
    self.calls += 1
    return out

  def run_stacked(self, stage: str, jobs: list) -> list:
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
        out = self.call(stage, [jobs[j][0] for j in part])
        if stage == "local":
          self.tokens["local_calls"] += len(part)
          self.tokens["inert_calls"] += d - len(part)
          rows_len = int(np.prod(jobs[part[0]][0]["input_ids"].shape))
          self.tokens["computed"] += rows_len * len(part)
          self.tokens["inert"] += rows_len * (d - len(part))
        for lane, j in enumerate(part):
          outs[j] = (jobs[j][1], jax.tree_util.tree_map(lambda x, i=lane: x[i], out))
    return outs
