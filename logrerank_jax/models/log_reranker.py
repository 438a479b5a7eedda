"""The full LoG-Reranker: local scorer -> sentence graph -> global GAT, with every ablation switch.

The configuration is `log_config.py` (re-exported here: `LoGConfig`, `ablation`, `ABLATIONS`,
`MODERNBERT_BASE_HF`): `LoGConfig` is the one place where the paper's ablations are switched, and
it hands this model the resolved sub-configs (`cfg.local_scorer_config`, `cfg.graph_build_config`,
`cfg.graph_reranker_config`). This module is the model those configs run: `LoGReranker`'s entry
points, its param init (whole or per training stage), the jittable forward and parameter counts.
"""

import functools
from typing import Any, Dict, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from logrerank_jax.errors import ConfigError
from logrerank_jax.graph.build import build_sentence_graph
from logrerank_jax.models.graph_reranker import GraphReranker
from logrerank_jax.models.local_scorer import LocalScorer, spans_to_nodes
# The configuration is part of this module's public face (`lr.LoGConfig`, `lr.ablation`).
from logrerank_jax.models.log_config import ABLATIONS, MODERNBERT_BASE_HF, LoGConfig, ablation
from logrerank_jax.schema import (MODEL_KEYS, NUM_ROLES, SPAN_NONE, SPAN_QUERY, SPAN_SENTENCE,
                                  TOKEN_KEYS)

__all__ = ["ABLATIONS", "GLOBAL_FEATURE_KEYS", "LOCAL_NODE_KEYS", "MODERNBERT_BASE_HF", "LoGConfig",
           "LoGReranker", "ablation", "count_params", "device_batch", "example_batch",
           "init_params", "init_stage_params", "log_forward", "param_shapes"]


def device_batch(batch) -> Dict[str, jax.Array]:
  """Pick the arrays the model reads from a `PackedBatch` (or mapping) as jnp arrays.

  Args:
    batch: a `logrerank_jax.data.packing.PackedBatch` or a mapping with its field names.

  Returns:
    Dict of int32/bool jnp arrays: the token arrays, span table and `node_passage`/`node_mask`.
  """
  get = batch.__getitem__ if isinstance(batch, Mapping) else lambda k: getattr(batch, k)
  out = {k: jnp.asarray(get(k), jnp.int32) for k in MODEL_KEYS if k != "node_mask"}
  out["node_mask"] = jnp.asarray(get("node_mask"), bool)
  return out


# Per-node outputs of the local stage, in the [Q, N, ...] layout of a batch's node arrays.
LOCAL_NODE_KEYS = ("h", "h_query", "role_logits", "role_probs", "intent_probs", "local_logit",
                   "local_score")
# The subset of them the global stage reads (`global_logits`): what the training feature cache
# stores and the serving path carries from the local to the global call. One list, so a key the
# GAT starts reading (as `local_logit` for residual_local) reaches both.
GLOBAL_FEATURE_KEYS = ("h", "role_probs", "local_score", "local_logit")


class LoGReranker(nn.Module):
  """Local scorer -> sentence graph -> global GAT: the one forward, with named entry points.

  Every caller (trainer, inference, benchmarks, parameter counting) runs the model through
  these methods, so the forward has one home:

    local_nodes(batch)                      local stage: per-node features [Q, N, ...]
    sentence_graph(features, node_passage, node_mask)
                                            the typed sentence graph (eq 8-10) alone
    global_logits(features, node_passage, node_mask)
                                            global stage: graph build + GAT -> logits [Q, N]
    __call__(batch)                         both, composed (the full model)

  Param tree: {"local": LocalScorer params, "global": GraphReranker params}; an entry point
  only reads the subtree it uses, so a local-stage model has no "global" params and the global
  stage trains "global" alone (`apply(..., method="global_logits")`).
  """
  cfg: LoGConfig

  def setup(self):
    self.local = LocalScorer(self.cfg.local_scorer_config)
    if self.cfg.use_global:
      self.gat = GraphReranker(self.cfg.graph_reranker_config, name="global")

  def local_nodes(self, batch: Mapping[str, jax.Array], deterministic: bool = True
                  ) -> Dict[str, jax.Array]:
    """Local stage (eq 1-6) on a packed batch: per-node outputs in the batch's node layout.

    Args:
      batch: `device_batch(...)` output (token arrays [R, L], span table [S], node arrays [Q, N]).
      deterministic: False enables dropout (needs a "dropout" rng).

    Returns:
      `LOCAL_NODE_KEYS` arrays, float32: `h`/`h_query` [Q, N, d], `role_logits`/`role_probs`/
      `intent_probs` [Q, N, 3], `local_logit`/`local_score` [Q, N]; padding nodes hold zeros.
    """
    q, n = batch["node_mask"].shape
    span_out = self.local(*[batch[k] for k in TOKEN_KEYS], batch["span_kind"],
                          batch["span_query"], deterministic=deterministic,
                          prior_pooled=batch.get("prior_pooled"))
    flat = spans_to_nodes(span_out, batch["span_node"], q * n)  # each [Q*N, ...]
    return {k: v.reshape((q, n) + v.shape[1:]) for k, v in flat.items()}

  def prior_spans(self, batch: Mapping[str, jax.Array]) -> jax.Array:
    """The split dense prior's pass alone over rows already in the split layout
    (`serving.prior_cache`): each span's pooled state [S, d] float32, what `local_nodes` reads
    from `batch["prior_pooled"]` instead of running the pass itself."""
    return self.local(*[batch[k] for k in TOKEN_KEYS], batch["span_kind"], None,
                      prior_only=True)["prior_pooled"]

  def sentence_graph(self, features: Mapping[str, jax.Array], node_passage: jax.Array,
                     node_mask: jax.Array):
    """The typed sentence graph (eq 8-10) of node features [Q, N, ...] (no params)."""
    return build_sentence_graph(features["h"], features["role_probs"], features["local_score"],
                                node_passage, node_mask, self.cfg.graph_build_config)

  def global_logits(self, features: Mapping[str, jax.Array], node_passage: jax.Array,
                    node_mask: jax.Array, deterministic: bool = True):
    """Global stage (eq 7-16): build the typed sentence graph and run the GAT.

    Args:
      features: local outputs [Q, N, ...] with at least `h`, `role_probs`, `local_score` (from
        `local_nodes`, or read back from the feature cache), and `local_logit` when the GAT's
        `residual_local` is on (else GraphReranker raises DataError; `init` may omit it).
      node_passage: [Q, N] int32 passage index of each node (-1 padding).
      node_mask: [Q, N] bool.
      deterministic: False enables dropout (needs a "dropout" rng).

    Returns:
      `(logits [Q, N] float32, zero on padding; graph)` where graph is the C3 GraphsTuple.
    """
    q, n = node_mask.shape
    h, roles, z = features["h"], features["role_probs"], features["local_score"]
    graph = self.sentence_graph(features, node_passage, node_mask)
    # GraphReranker alone checks that a residual_local model got its local logits.
    local_logit = features.get("local_logit")
    if local_logit is not None:
      local_logit = local_logit.reshape(q * n)
    logit = self.gat(h.reshape(q * n, -1), roles.reshape(q * n, NUM_ROLES), z.reshape(q * n),
                     graph, deterministic=deterministic, local_logit=local_logit)
    logit = jnp.where(node_mask, logit.astype(jnp.float32).reshape(q, n), 0.0)
    return logit, graph

  def __call__(self, batch: Mapping[str, jax.Array], deterministic: bool = True,
               freeze_local: bool = False) -> Dict[str, Any]:
    """Score every sentence node of a packed batch (local, then global when `use_global`).

    Args:
      batch: `device_batch(...)` output (token arrays [R, L], span table [S], node arrays [Q, N]).
      deterministic: False enables dropout (needs a "dropout" rng).
      freeze_local: stop gradients at the local outputs (global training stage).

    Returns:
      Dict over flat nodes [Q*N]: `h` [Q*N, d], `role_probs`, `role_logits`, `intent_probs`
      [Q*N, 3], `local_logit`, `local_score`, `final_logit`, `final_score` [Q*N] float32,
      `node_mask` [Q*N] bool, `graph` (the C3 GraphsTuple); plus `global_logit`/`global_score`
      when the global stage is on (else final = local). Padding nodes hold zeros.
    """
    q, n = batch["node_mask"].shape
    nodes = self.local_nodes(batch, deterministic)
    if freeze_local:
      nodes = jax.lax.stop_gradient(nodes)
    node_mask = batch["node_mask"]
    if self.cfg.use_global:
      glogit, graph = self.global_logits(nodes, batch["node_passage"], node_mask, deterministic)
    else:
      # The graph is still built: the structured context expands over it.
      glogit, graph = None, self.sentence_graph(nodes, batch["node_passage"], node_mask)
    out = {k: v.reshape((q * n,) + v.shape[2:]) for k, v in nodes.items()}
    out["node_mask"] = node_mask.reshape(q * n)
    out["graph"] = graph
    if glogit is not None:
      out["global_logit"] = glogit.reshape(q * n)
      out["global_score"] = jnp.where(out["node_mask"], jax.nn.sigmoid(out["global_logit"]), 0.0)
      out["final_logit"], out["final_score"] = out["global_logit"], out["global_score"]
    else:
      out["final_logit"], out["final_score"] = out["local_logit"], out["local_score"]
    return out


def example_batch(num_rows: int = 1, row_len: int = 8, num_queries: int = 1, num_nodes: int = 2
                  ) -> Dict[str, jax.Array]:
  """A minimal valid `device_batch` (one query span, two sentence spans): for shapes only.

  Param shapes do not depend on batch shapes, so this is what `param_shapes` traces `init` on.
  """
  ex = {k: jnp.zeros((num_rows, row_len), jnp.int32) for k in TOKEN_KEYS}
  ex["attention_mask"] = ex["segment_ids"] = jnp.ones((num_rows, row_len), jnp.int32)
  ex["span_kind"] = jnp.array([SPAN_NONE, SPAN_QUERY, SPAN_SENTENCE, SPAN_SENTENCE], jnp.int32)
  ex["span_query"] = jnp.array([0, 0, 1, 1], jnp.int32)
  ex["span_node"] = jnp.array([-1, -1, 0, 1], jnp.int32)
  ex["node_passage"] = jnp.zeros((num_queries, num_nodes), jnp.int32)
  ex["node_mask"] = jnp.ones((num_queries, num_nodes), bool)
  return ex


def param_shapes(cfg: LoGConfig) -> Dict[str, Any]:
  """The param tree `init_params` would build, as `jax.ShapeDtypeStruct`s (nothing allocated)."""
  return jax.eval_shape(lambda k: LoGReranker(cfg).init(k, example_batch())["params"],
                        jax.random.PRNGKey(0))


def init_params(cfg: LoGConfig, batch, rng) -> Dict[str, Any]:
  """Initialise the full model's params on a (packed) example batch.

  Args:
    cfg: model config.
    batch: a `PackedBatch` or `device_batch` dict (only its shapes matter).
    rng: PRNG key.

  Returns:
    The param tree {"local": {...}, "global": {...} (absent when use_global=False)}.
  """
  return LoGReranker(cfg).init(rng, device_batch(batch))["params"]


def log_forward(params, batch, cfg: LoGConfig, deterministic: bool = True,
                rngs: Optional[Dict[str, jax.Array]] = None, freeze_local: bool = False
                ) -> Dict[str, Any]:
  """Run local -> graph -> global on a packed batch (jit with `static_argnames=("cfg",
  "deterministic", "freeze_local")`).

  Args:
    params: the `LoGReranker` param tree.
    batch: a `PackedBatch` or `device_batch` dict.
    cfg: model config (static).
    deterministic: False enables dropout (pass rngs={"dropout": key}).
    rngs: PRNG keys for dropout.
    freeze_local: stop gradients at the local outputs (global training stage).

  Returns:
    The per-node output dict of `LoGReranker.__call__`.
  """
  return LoGReranker(cfg).apply({"params": params}, device_batch(batch), deterministic,
                                freeze_local, rngs=rngs)


def count_params(cfg: LoGConfig) -> Dict[str, int]:
  """Parameter counts from `param_shapes` (nothing is allocated).

  Args:
    cfg: model config.

  Returns:
    {"encoder", "local_heads", "local", "global", "total"} in parameters.
  """
  shapes = param_shapes(cfg)

  def size(tree):
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(tree))

  enc = size(shapes["local"]["encoder"])
  local = size(shapes["local"])
  glob = size(shapes.get("global", {}))
  return {"encoder": enc, "local_heads": local - enc, "local": local, "global": glob,
          "total": local + glob}


# The inputs each stage's init reads.
_STAGE_INIT_KEYS = {"local": TOKEN_KEYS + ("span_kind", "span_query"),
                    "global": ("h", "role_probs", "local_score", "node_passage", "node_mask")}


def init_stage_params(cfg: LoGConfig, stage: str, features: Mapping[str, jax.Array], rng
                      ) -> Dict[str, Any]:
  """Initialise the params one training stage trains: {"local": ...} or {"global": ...}.

  Each stage module is initialised on its own (the RNG of `LocalScorer` / `GraphReranker` at
  the root, as a stage-trained model has always been initialised), so a given seed gives the
  same initial weights, and runs reproduce each other bit for bit.

  Jitted, once per (config, stage): eager flax init compiles and runs every operation of the
  model on its own (about 170 small XLA compilations for the tiny model, most of a tiny training
  run's start-up); one compilation instead, which the persistent cache also keeps. Measured
  against the eager init it replaced: bit-identical except the token embedding table, whose
  scaled normal draws XLA now fuses (at most 1 ulp, 6e-8, apart).

  Args:
    cfg: model config.
    stage: "local" (encoder and heads, from a `device_batch`) or "global" (the GAT, from
      node features [Q, N, ...] with `h`, `role_probs`, `local_score`, `node_passage`,
      `node_mask`).
    features: the example batch (local) or example node features (global).
    rng: PRNG key.

  Returns:
    The param tree of that stage.
  """
  if stage not in _STAGE_INIT_KEYS:
    raise ConfigError(f"unknown training stage {stage!r}; known: {sorted(_STAGE_INIT_KEYS)}")
  return _stage_initializer(cfg, stage)({k: features[k] for k in _STAGE_INIT_KEYS[stage]}, rng)


@functools.lru_cache(maxsize=None)
def _stage_initializer(cfg: LoGConfig, stage: str):
  return jax.jit(functools.partial(_init_stage_params, cfg, stage))


def _init_stage_params(cfg: LoGConfig, stage: str, features: Mapping[str, jax.Array], rng):
  if stage == "local":
    return {"local": LocalScorer(cfg.local_scorer_config).init(
        rng, *[features[k] for k in TOKEN_KEYS], features["span_kind"],
        features["span_query"])["params"]}
  q, n = features["node_mask"].shape
  graph = build_sentence_graph(features["h"], features["role_probs"], features["local_score"],
                               features["node_passage"], features["node_mask"],
                               cfg.graph_build_config)
  return {"global": GraphReranker(cfg.graph_reranker_config).init(
      rng, features["h"].reshape(q * n, -1), features["role_probs"].reshape(q * n, NUM_ROLES),
      features["local_score"].reshape(q * n), graph)["params"]}
