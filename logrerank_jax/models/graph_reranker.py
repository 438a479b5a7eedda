"""Relation-aware graph attention reranker over the sentence graph (paper eq 7, 11-16).

The model reads the frozen local stage's per-sentence outputs (encoder vector h,
role distribution r, local score z_local) and the typed sentence graph of
`logrerank_jax.graph.build.build_sentence_graph` (contract C3), and returns one
global logit per node:

  x0   = LN(phi_h(h) + phi_r(r) + phi_z(z_local))                        (eq 7)
  for each layer:
    e_uv = LeakyReLU(a_head^T [(W_v x_v)_head ; (W_t x_u)_head ; e_t])   (eq 11-12)
    alpha = softmax of e_uv over v's valid in-edges                      (eq 13)
    m_v  = concat_head sum_u alpha_uv (W_t x_u)_head                     (eq 14)
    x    = LN(x + Dropout(W_o m_v));  x = LN(x + Dropout(FFN(x)))
  logit = MLP_global(x_L)  (float32);  z_global = sigmoid(logit)         (eq 15-16)

Relation transforms are computed node-first: one einsum gives every node's
projection under every relation, [N, T, d_g], then one gather picks
(sender, type) per edge. That costs N*T*d_g^2 FLOPs against E*d_g^2 for a
per-edge matmul, and the C3 graph has E ~ (2k+1)*N = 17*N > T*N = 8*N edges, and
it needs no [E, d_g, d_g] gathered weights.

Parameter tree (flax names; `Dense.kernel` is [in, out]):
```
node_init/phi_h/{kernel [d_enc, d_g], bias}   node_init/phi_r/{kernel [3, d_g], bias}
node_init/phi_z/{kernel [1, d_g], bias}       node_init/norm/{scale, bias}
layers_{i}/attn/W_v/kernel  [d_g, d_g]        (target projection, no bias)
layers_{i}/attn/W_rel       [T, d_g, d_g]     (source transform per relation, x @ W_rel[t])
layers_{i}/attn/rel_emb     [T, relation_dim] (e_t)
layers_{i}/attn/att         [H, 2*d_g/H + relation_dim]  (a_head over [target; source; relation])
layers_{i}/attn/W_o/{kernel [d_g, d_g], bias}
layers_{i}/attn_norm/{scale, bias}
layers_{i}/ffn/Wi/{kernel [d_g, ffn_dim], bias}   layers_{i}/ffn/Wo/{kernel [ffn_dim, d_g], bias}
layers_{i}/ffn_norm/{scale, bias}
scorer/hidden/{kernel [d_g, mlp_hidden], bias}    scorer/out/{kernel [mlp_hidden, 1], bias}
```
T = num_edge_types, or 1 with `use_edge_types=False` (every edge then uses relation 0).

Dropout (rate `dropout`, the paper's 0.1) sits where a post-LN transformer puts
it: on the attention sub-layer output, on the FFN output, and on the scorer's
hidden layer; it is active only with `deterministic=False` (rng "dropout").
GELU is exact (erf), as torch's `nn.GELU()`; LeakyReLU slope 0.2 as in GAT.
"""

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph
import numpy as np

from logrerank_jax.errors import ConfigError, DataError
from logrerank_jax.schema import NUM_EDGE_TYPES, NUM_ROLES



@dataclasses.dataclass(frozen=True)
class GraphRerankerConfig:
  """Sizes and switches of the global reranker; the defaults are the paper's model.

  Unstated-in-the-paper sizes were chosen so the paper configuration has
  2,664,961 parameters (Table 10: 2.67M, -0.19 %): relation_dim=64 (e_t per
  relation), ffn_dim=1024 (4 x d_model, the usual transformer ratio) and
  mlp_hidden=384 (one hidden layer in MLP_global).
  """

  d_enc: int = 768                 # width of the encoder vectors h fed in
  d_model: int = 256               # d_g
  num_layers: int = 2
  num_heads: int = 4
  num_edge_types: int = NUM_EDGE_TYPES
  relation_dim: int = 64
  ffn_dim: int = 1024
  mlp_hidden: int = 384
  dropout: float = 0.1
  negative_slope: float = 0.2      # LeakyReLU of the attention logits
  layer_norm_eps: float = 1e-5     # torch nn.LayerNorm default, for checkpoint parity
  dtype: Any = jnp.float32         # compute dtype of the projections; scores stay float32
  use_edge_types: bool = True      # ablation "w/o edge types": one shared relation
  receivers_sorted: bool = True    # C3 sorts edges by receiver; enables sorted segment ops
  # NOT in the paper (default False, the paper's logit = MLP_global(x_L)): the global logit is
  # the local logit plus the GAT's correction, logit = l_local + MLP_global(x_L), with the
  # scorer's output layer initialised to zero, so training starts from the local ranking
  # instead of relearning it from z_local = sigmoid(l), which saturates under a dense prior
  # (docs/DEMO.md). No extra parameters; the caller passes `local_logit`.
  residual_local: bool = False

  def __post_init__(self):
    for key in ("d_enc", "d_model", "num_layers", "num_heads", "num_edge_types",
                "relation_dim", "ffn_dim", "mlp_hidden"):
      value = getattr(self, key)
      if not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"GraphRerankerConfig.{key} must be a positive int, got {value!r}")
    if self.d_model % self.num_heads:
      raise ConfigError(f"GraphRerankerConfig.d_model={self.d_model} is not divisible by "
                        f"num_heads={self.num_heads}")
    if not 0.0 <= self.dropout < 1.0:
      raise ConfigError(f"GraphRerankerConfig.dropout must be in [0, 1), got {self.dropout!r}")
    try:
      dtype = jnp.dtype(self.dtype)
    except TypeError as e:
      raise ConfigError(f"GraphRerankerConfig.dtype is not a dtype: {self.dtype!r}") from e
    # Normalise "bfloat16" / jnp.bfloat16 / np.dtype to one hashable value (a static jit argument).
    object.__setattr__(self, "dtype", dtype)

  @property
  def num_relations(self) -> int:
    """Return the number of distinct relation parameters (1 without edge types)."""
    return self.num_edge_types if self.use_edge_types else 1

  @property
  def head_dim(self) -> int:
    """Return the per-head width d_g / H."""
    return self.d_model // self.num_heads


def masked_segment_softmax(logits, mask, segment_ids, num_segments, indices_are_sorted=False):
  """Softmax of edge logits over each receiver's valid edges; empty segments get all zeros.

  Args:
    logits: float32 [E, H] edge logits.
    mask: bool [E]; False edges get weight exactly 0 and do not affect the others.
    segment_ids: int32 [E] receiver of each edge.
    num_segments: number of receivers N.
    indices_are_sorted: whether `segment_ids` is non-decreasing.

  Returns:
    float32 [E, H] weights summing to 1 over each receiver's valid edges (0 where masked).
  """
  mask = mask[:, None]  # [E, 1]
  masked = jnp.where(mask, logits, -jnp.inf)  # [E, H]
  seg_max = jax.ops.segment_max(masked, segment_ids, num_segments=num_segments,
                                indices_are_sorted=indices_are_sorted)  # [N, H]
  # A node with no valid in-edge has max -inf; 0 keeps exp() finite there.
  seg_max = jnp.where(jnp.isfinite(seg_max), seg_max, 0.0)
  ex = jnp.where(mask, jnp.exp(masked - seg_max[segment_ids]), 0.0)  # [E, H]
  denom = jax.ops.segment_sum(ex, segment_ids, num_segments=num_segments,
                              indices_are_sorted=indices_are_sorted)  # [N, H]
  denom = jnp.where(denom > 0, denom, 1.0)
  return ex / denom[segment_ids]


class RelationalAttention(nn.Module):
  """Multi-head relation-aware graph attention (eq 11-14), before the residual."""

  cfg: GraphRerankerConfig

  @nn.compact
  def __call__(self, x, senders, receivers, edge_type, edge_mask):
    """Aggregate typed messages from valid in-neighbours.

    Args:
      x: [N, d_g] node states.
      senders, receivers: int32 [E] edge endpoints (u -> v).
      edge_type: int32 [E] relation index in [0, num_relations).
      edge_mask: bool [E] valid edges.

    Returns:
      [N, d_g] output projection of the concatenated head messages.
    """
    cfg = self.cfg
    num_nodes, d = x.shape
    heads, dh, rel = cfg.num_heads, cfg.head_dim, cfg.num_relations
    f32 = jnp.float32

    w_rel = self.param("W_rel", nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,)),
                       (rel, d, d), f32)
    rel_emb = self.param("rel_emb", nn.initializers.normal(stddev=1.0), (rel, cfg.relation_dim), f32)
    att = self.param("att", nn.initializers.variance_scaling(1.0, "fan_in", "normal", in_axis=-1, out_axis=-2),
                     (heads, 2 * dh + cfg.relation_dim), f32)

    target = nn.Dense(d, use_bias=False, dtype=cfg.dtype, name="W_v")(x)  # [N, d]
    source = jnp.einsum("nd,tde->nte", x.astype(cfg.dtype), w_rel.astype(cfg.dtype))  # [N, T, d]

    # a^T [q; k; e] is linear, so split it into per-node / per-relation parts and
    # gather scalars per edge instead of concatenating [E, 2*dh + rd] vectors.
    att_dst, att_src, att_rel = att[:, :dh], att[:, dh:2 * dh], att[:, 2 * dh:]  # [H, .]
    s_dst = jnp.einsum("nhd,hd->nh", target.astype(f32).reshape(num_nodes, heads, dh), att_dst)  # [N, H]
    s_src = jnp.einsum("nthd,hd->nth", source.astype(f32).reshape(num_nodes, rel, heads, dh),
                       att_src)  # [N, T, H]
    s_rel = jnp.einsum("tr,hr->th", rel_emb, att_rel)  # [T, H]
    logits = s_dst[receivers] + s_src[senders, edge_type] + s_rel[edge_type]  # [E, H]
    logits = nn.leaky_relu(logits, negative_slope=cfg.negative_slope)
    alpha = masked_segment_softmax(logits, edge_mask, receivers, num_nodes,
                                   indices_are_sorted=cfg.receivers_sorted)  # [E, H]

    values = source[senders, edge_type].astype(f32).reshape(-1, heads, dh)  # [E, H, dh]
    msg = jnp.where(edge_mask[:, None, None], alpha[:, :, None] * values, 0.0)  # [E, H, dh]
    agg = jax.ops.segment_sum(msg, receivers, num_segments=num_nodes,
                              indices_are_sorted=cfg.receivers_sorted)  # [N, H, dh]
    agg = agg.reshape(num_nodes, d).astype(cfg.dtype)  # [N, d]
    return nn.Dense(d, dtype=cfg.dtype, name="W_o")(agg)


class FeedForward(nn.Module):
  """Position-wise FFN: Dense -> GELU -> Dense."""

  cfg: GraphRerankerConfig

  @nn.compact
  def __call__(self, x):
    """Return the FFN of `x` [N, d_g] -> [N, d_g]."""
    cfg = self.cfg
    y = nn.Dense(cfg.ffn_dim, dtype=cfg.dtype, name="Wi")(x)
    y = nn.gelu(y, approximate=False)
    return nn.Dense(cfg.d_model, dtype=cfg.dtype, name="Wo")(y)


class GraphLayer(nn.Module):
  """One post-LN relational GAT block: attention + residual + LN, FFN + residual + LN."""

  cfg: GraphRerankerConfig

  @nn.compact
  def __call__(self, x, senders, receivers, edge_type, edge_mask, deterministic=True):
    """Return updated node states [N, d_g]."""
    cfg = self.cfg
    y = RelationalAttention(cfg, name="attn")(x, senders, receivers, edge_type, edge_mask)
    y = nn.Dropout(cfg.dropout)(y, deterministic=deterministic)
    x = nn.LayerNorm(epsilon=cfg.layer_norm_eps, dtype=cfg.dtype, name="attn_norm")(x + y)
    y = FeedForward(cfg, name="ffn")(x)
    y = nn.Dropout(cfg.dropout)(y, deterministic=deterministic)
    return nn.LayerNorm(epsilon=cfg.layer_norm_eps, dtype=cfg.dtype, name="ffn_norm")(x + y)


class NodeInit(nn.Module):
  """Eq 7: x0 = LN(phi_h(h) + phi_r(r) + phi_z(z_local))."""

  cfg: GraphRerankerConfig

  @nn.compact
  def __call__(self, h, role_probs, z_local):
    """Return initial node states [N, d_g] from h [N, d_enc], r [N, 3], z [N]."""
    cfg = self.cfg
    x = (nn.Dense(cfg.d_model, dtype=cfg.dtype, name="phi_h")(h)
         + nn.Dense(cfg.d_model, dtype=cfg.dtype, name="phi_r")(role_probs)
         + nn.Dense(cfg.d_model, dtype=cfg.dtype, name="phi_z")(z_local[:, None]))
    return nn.LayerNorm(epsilon=cfg.layer_norm_eps, dtype=cfg.dtype, name="norm")(x)


class GlobalScorer(nn.Module):
  """Eq 15: MLP_global(x_L) -> one float32 logit per node (a zero-initialised output layer
  under `residual_local`, so the correction starts at exactly 0)."""

  cfg: GraphRerankerConfig

  @nn.compact
  def __call__(self, x, deterministic=True):
    """Return float32 logits [N] from node states [N, d_g]."""
    cfg = self.cfg
    y = nn.Dense(cfg.mlp_hidden, dtype=cfg.dtype, name="hidden")(x)
    y = nn.gelu(y, approximate=False)
    y = nn.Dropout(cfg.dropout)(y, deterministic=deterministic)
    # The last layer runs in float32: bf16 logits would collapse close scores into ties.
    init = nn.initializers.zeros if cfg.residual_local else nn.initializers.lecun_normal()
    return nn.Dense(1, dtype=jnp.float32, kernel_init=init, name="out")(y.astype(jnp.float32))[:, 0]


class GraphReranker(nn.Module):
  """Global reranker: node init, `num_layers` relational GAT blocks, global scorer (contract C4)."""

  cfg: GraphRerankerConfig

  @nn.compact
  def __call__(self, h, role_probs, z_local, graph: jraph.GraphsTuple, deterministic=True,
               local_logit=None):
    """Score every node of a batched sentence graph.

    Args:
      h: [Q*N, d_enc] sentence vectors from the local encoder.
      role_probs: [Q*N, 3] predicted role distributions.
      z_local: [Q*N] local scores (sigmoid, in [0, 1]).
      graph: C3 `GraphsTuple` with `nodes["mask"]` bool [Q*N], `edges["type"]` int32 [E],
        `edges["mask"]` bool [E]; `receivers` sorted when `cfg.receivers_sorted`.
      deterministic: disable dropout; pass rngs={"dropout": key} when False.
      local_logit: [Q*N] local logits; required with `cfg.residual_local` (added to the
        scorer's output; `init` may omit it), ignored otherwise.

    Returns:
      float32 [Q*N] global logits (z_global = sigmoid); exactly 0 at padding nodes.
    """
    cfg = self.cfg
    node_mask = jnp.asarray(graph.nodes["mask"], bool)  # [Q*N]
    num_nodes = node_mask.shape[0]
    if h.ndim != 2 or h.shape[0] != num_nodes or h.shape[1] != cfg.d_enc:
      raise DataError(f"GraphReranker: h has shape {tuple(h.shape)}, expected ({num_nodes}, {cfg.d_enc})")
    if role_probs.shape != (num_nodes, NUM_ROLES):
      raise DataError(f"GraphReranker: role_probs has shape {tuple(role_probs.shape)}, "
                      f"expected ({num_nodes}, {NUM_ROLES})")
    if z_local.shape != (num_nodes,):
      raise DataError(f"GraphReranker: z_local has shape {tuple(z_local.shape)}, expected ({num_nodes},)")
    if cfg.residual_local and local_logit is None and self.is_initializing():
      local_logit = jnp.zeros((num_nodes,), jnp.float32)  # params do not depend on its values
    if cfg.residual_local and (local_logit is None or local_logit.shape != (num_nodes,)):
      got = None if local_logit is None else tuple(local_logit.shape)
      raise DataError(f"GraphReranker: residual_local needs local_logit of shape ({num_nodes},), "
                      f"got {got}")
    senders = jnp.asarray(graph.senders, jnp.int32)  # [E]
    receivers = jnp.asarray(graph.receivers, jnp.int32)  # [E]
    edge_mask = jnp.asarray(graph.edges["mask"], bool)  # [E]
    if senders.shape != receivers.shape or edge_mask.shape != senders.shape:
      raise DataError("GraphReranker: senders, receivers and edges['mask'] differ in shape: "
                      f"{senders.shape}, {receivers.shape}, {edge_mask.shape}")
    # An edge touching a padding node never counts, whatever its mask says.
    edge_mask = edge_mask & node_mask[senders] & node_mask[receivers]
    if cfg.use_edge_types:
      edge_type = jnp.asarray(graph.edges["type"], jnp.int32)  # [E]
    else:
      edge_type = jnp.zeros_like(senders)

    # Zero padding features so garbage there (even inf/NaN) cannot leak into valid nodes.
    nm = node_mask[:, None]
    h = jnp.where(nm, h, 0).astype(cfg.dtype)
    role_probs = jnp.where(nm, role_probs, 0).astype(cfg.dtype)
    z_local = jnp.where(node_mask, z_local, 0).astype(cfg.dtype)

    x = NodeInit(cfg, name="node_init")(h, role_probs, z_local)  # [N, d_g]
    for i in range(cfg.num_layers):
      x = GraphLayer(cfg, name=f"layers_{i}")(x, senders, receivers, edge_type, edge_mask,
                                              deterministic=deterministic)
    logits = GlobalScorer(cfg, name="scorer")(x, deterministic=deterministic)  # [N] float32
    if cfg.residual_local:
      logits = logits + jnp.where(node_mask, local_logit, 0.0).astype(jnp.float32)
    return jnp.where(node_mask, logits, 0.0)


def count_params(tree) -> int:
  """Return the number of scalars in a parameter pytree (arrays or `jax.ShapeDtypeStruct`s).

  Args:
    tree: a params pytree, e.g. `variables["params"]` or the output of `param_shapes`.

  Returns:
    Total element count.
  """
  return int(sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(tree)))


def _shape_graph(num_nodes: int, num_edges: int) -> jraph.GraphsTuple:
  """Return a one-query GraphsTuple of ShapeDtypeStructs for abstract initialisation."""
  sds = jax.ShapeDtypeStruct
  return jraph.GraphsTuple(
      nodes={"mask": sds((num_nodes,), jnp.bool_)},
      edges={"type": sds((num_edges,), jnp.int32), "mask": sds((num_edges,), jnp.bool_),
             "cos": sds((num_edges,), jnp.float32)},
      senders=sds((num_edges,), jnp.int32), receivers=sds((num_edges,), jnp.int32),
      n_node=sds((1,), jnp.int32), n_edge=sds((1,), jnp.int32), globals=None)


def param_shapes(cfg: GraphRerankerConfig):
  """Return the params pytree of `GraphReranker(cfg)` as ShapeDtypeStructs (no allocation).

  Args:
    cfg: the model configuration.

  Returns:
    A pytree with the structure of `init(...)["params"]`, leaves `jax.ShapeDtypeStruct`.
  """
  model = GraphReranker(cfg)
  num_nodes, num_edges = 4, 3  # parameter shapes do not depend on the graph size
  sds = jax.ShapeDtypeStruct
  variables = jax.eval_shape(
      model.init, jax.random.PRNGKey(0), sds((num_nodes, cfg.d_enc), jnp.float32),
      sds((num_nodes, NUM_ROLES), jnp.float32), sds((num_nodes,), jnp.float32),
      _shape_graph(num_nodes, num_edges))
  return variables["params"]


def param_count(cfg: GraphRerankerConfig) -> int:
  """Return the parameter count of `GraphReranker(cfg)` via `jax.eval_shape` (no allocation)."""
  return count_params(param_shapes(cfg))
