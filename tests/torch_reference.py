"""Plain-PyTorch reference of the full LoG-Reranker, written independently of the Flax code.

It produces real PyTorch checkpoints in the key layout of `docs/CHECKPOINTS.md` and the reference
outputs the conversion tests compare against. Only sizes are read from a `LoGConfig`; the
equations are implemented here from the paper / DESIGN.md, in a deliberately different style
from the Flax model (per-sequence unpacked encoding with transformers' own `ModernBertModel`,
`index_add_` pooling, per-edge relation matmuls, a dense per-receiver softmax):

  local (per sentence s of query q):
    gamma = softmax(MLP_int(h_q)), r = softmax(MLP_role(h_s)), g = W_p(gamma * r)
    l_local = MLP_local([h_q; h_s; g]),  MLP = Linear -> GELU(erf) -> Linear
  global:
    x0 = LN(phi_h(h) + phi_r(r) + phi_z(z_local))
    per layer: e_uv = LeakyReLU_0.2(a_head . [(W_v x_v)_head; (x_u W_rel[t])_head; e_t])
               alpha = softmax over v's valid in-edges, m_v = concat_h sum_u alpha (x_u W_rel[t])_h
               x = LN(x + W_o m);  x = LN(x + FFN(x))
    l_global = MLP_global(x_L)
"""

from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch
import transformers
from torch import nn
from torch.nn import functional as F

from torch_init import randomise_uniform_norms

NUM_ROLES = 3
SPAN_SENTENCE = 2


def hf_encoder_config(encoder_cfg) -> transformers.ModernBertConfig:
  """Return the transformers config of our `ModernBertConfig` (eager attention, exact maths)."""
  d = dict(encoder_cfg.to_hf_dict())
  d.pop("model_type", None)
  d.pop("architectures", None)
  d["attn_implementation"] = "eager"
  return transformers.ModernBertConfig(**d)


class TorchMlp(nn.Module):
  """hidden Linear -> exact GELU -> out Linear."""

  def __init__(self, d_in: int, d_hidden: int, d_out: int):
    super().__init__()
    self.hidden = nn.Linear(d_in, d_hidden)
    self.out = nn.Linear(d_hidden, d_out)

  def forward(self, x):
    """Return out(gelu(hidden(x)))."""
    return self.out(F.gelu(self.hidden(x)))


class TorchLocalScorer(nn.Module):
  """ModernBertModel + span mean pooling + intent/role heads + W_p + local MLP (eq 1-6)."""

  def __init__(self, local_cfg, use_role_head: bool = True, use_intent_head: bool = True):
    super().__init__()
    d = local_cfg.encoder.hidden_size
    self.encoder = transformers.ModernBertModel(hf_encoder_config(local_cfg.encoder))
    self.use_role_head, self.use_intent_head = use_role_head, use_intent_head
    if use_intent_head:
      self.intent_mlp = TorchMlp(d, local_cfg.intent_hidden, NUM_ROLES)
    if use_role_head:
      self.role_mlp = TorchMlp(d, local_cfg.role_hidden, NUM_ROLES)
    self.proj_g = nn.Linear(NUM_ROLES, local_cfg.g_dim, bias=False)
    self.local_mlp = TorchMlp(2 * d + local_cfg.g_dim, local_cfg.local_hidden, 1)

  def forward(self, sequences: Sequence[Tuple[np.ndarray, np.ndarray]], span_kind: np.ndarray,
              span_query: np.ndarray) -> Dict[str, torch.Tensor]:
    """Score every span.

    Args:
      sequences: one (input_ids [L_i], span_ids [L_i]) pair per (query, passage window), unpadded.
      span_kind: [S] 0 none, 1 query, 2 sentence.
      span_query: [S] query span of each sentence span.

    Returns:
      Per-span tensors: h, h_query [S, d], role_logits, role_probs, intent_probs [S, 3],
      local_logit, local_score [S]; zero on non-sentence spans.
    """
    num_spans = len(span_kind)
    d = self.encoder.config.hidden_size
    sums = torch.zeros(num_spans, d, dtype=torch.float32)
    counts = torch.zeros(num_spans, dtype=torch.float32)
    for ids, spans in sequences:
      ids_t = torch.as_tensor(np.asarray(ids, np.int64))[None]  # [1, L_i]
      hidden = self.encoder(input_ids=ids_t,
                            attention_mask=torch.ones_like(ids_t)).last_hidden_state[0]  # [L_i, d]
      spans_t = torch.as_tensor(np.asarray(spans, np.int64))  # [L_i]
      keep = spans_t > 0  # CLS / SEP are pooled into no span
      sums.index_add_(0, spans_t[keep], hidden[keep])
      counts.index_add_(0, spans_t[keep], torch.ones(int(keep.sum())))
    pooled = sums / counts.clamp(min=1.0)[:, None]  # [S, d]
    is_sent = torch.as_tensor(np.asarray(span_kind) == SPAN_SENTENCE)  # [S]
    q_idx = torch.as_tensor(np.where(np.asarray(span_kind) == SPAN_SENTENCE,
                                     np.asarray(span_query), 0).astype(np.int64))
    h_s, h_q = pooled, pooled[q_idx]  # [S, d]
    uniform = torch.full((num_spans, NUM_ROLES), 1.0 / NUM_ROLES)
    intent = torch.softmax(self.intent_mlp(h_q), -1) if self.use_intent_head else uniform
    if self.use_role_head:
      role_logits = self.role_mlp(h_s)
      role = torch.softmax(role_logits, -1)
    else:
      role_logits, role = torch.zeros(num_spans, NUM_ROLES), uniform
    g = self.proj_g(intent * role)  # [S, g_dim]
    logit = self.local_mlp(torch.cat([h_q, h_s, g], -1))[:, 0]  # [S]
    m = is_sent.float()
    return {"h": h_s * m[:, None], "h_query": h_q * m[:, None],
            "role_logits": role_logits * m[:, None], "role_probs": role * m[:, None],
            "intent_probs": intent * m[:, None], "local_logit": logit * m,
            "local_score": torch.sigmoid(logit) * m}


class TorchNodeInit(nn.Module):
  """x0 = LN(phi_h(h) + phi_r(r) + phi_z(z))."""

  def __init__(self, d_enc: int, d_g: int, eps: float):
    super().__init__()
    self.phi_h = nn.Linear(d_enc, d_g)
    self.phi_r = nn.Linear(NUM_ROLES, d_g)
    self.phi_z = nn.Linear(1, d_g)
    self.norm = nn.LayerNorm(d_g, eps=eps)

  def forward(self, h, r, z):
    """Return x0 [N, d_g] from h [N, d_enc], r [N, 3], z [N]."""
    return self.norm(self.phi_h(h) + self.phi_r(r) + self.phi_z(z[:, None]))


class TorchRelationalAttention(nn.Module):
  """Relation-aware multi-head graph attention, one relation matmul per edge."""

  def __init__(self, d_g: int, heads: int, num_rel: int, rel_dim: int, slope: float):
    super().__init__()
    self.heads, self.dh, self.slope = heads, d_g // heads, slope
    self.W_v = nn.Linear(d_g, d_g, bias=False)
    self.W_rel = nn.Parameter(torch.randn(num_rel, d_g, d_g) / d_g ** 0.5)  # [T, in, out]
    self.rel_emb = nn.Embedding(num_rel, rel_dim)
    self.att = nn.Parameter(torch.randn(heads, 2 * self.dh + rel_dim) * 0.1)
    self.W_o = nn.Linear(d_g, d_g)

  def forward(self, x, senders, receivers, etype, emask):
    """Return W_o of the concatenated head messages [N, d_g]; edges are LongTensors [E]."""
    n, e = x.shape[0], senders.shape[0]
    hh, dh = self.heads, self.dh
    tgt = self.W_v(x)[receivers].view(e, hh, dh)  # [E, H, dh]
    src = torch.bmm(x[senders][:, None, :], self.W_rel[etype])[:, 0].view(e, hh, dh)  # [E, H, dh]
    rel = self.rel_emb(etype)[:, None, :].expand(e, hh, -1)  # [E, H, r]
    feats = torch.cat([tgt, src, rel], -1)  # [E, H, 2dh + r]
    logits = F.leaky_relu((feats * self.att[None]).sum(-1), self.slope)  # [E, H]
    member = (receivers[None, :] == torch.arange(n)[:, None]) & emask[None, :]  # [N, E]
    dense = torch.where(member[:, :, None], logits[None], torch.tensor(float("-inf")))  # [N, E, H]
    alpha = torch.nan_to_num(torch.softmax(dense, dim=1), nan=0.0)  # rows without edges -> 0
    agg = torch.einsum("neh,ehd->nhd", alpha, src).reshape(n, hh * dh)  # [N, d_g]
    return self.W_o(agg)


class TorchGraphLayer(nn.Module):
  """Post-LN block: LN(x + attn(x)); LN(x + FFN(x))."""

  def __init__(self, gcfg, num_rel: int):
    super().__init__()
    d = gcfg.d_model
    self.attn = TorchRelationalAttention(d, gcfg.num_heads, num_rel, gcfg.relation_dim,
                                         gcfg.negative_slope)
    self.attn_norm = nn.LayerNorm(d, eps=gcfg.layer_norm_eps)
    self.ffn = nn.Module()
    self.ffn.Wi = nn.Linear(d, gcfg.ffn_dim)
    self.ffn.Wo = nn.Linear(gcfg.ffn_dim, d)
    self.ffn_norm = nn.LayerNorm(d, eps=gcfg.layer_norm_eps)

  def forward(self, x, senders, receivers, etype, emask):
    """Return the updated node states [N, d_g]."""
    x = self.attn_norm(x + self.attn(x, senders, receivers, etype, emask))
    return self.ffn_norm(x + self.ffn.Wo(F.gelu(self.ffn.Wi(x))))


class TorchGraphReranker(nn.Module):
  """Node init, relational GAT layers, global MLP scorer."""

  def __init__(self, gcfg, use_edge_types: bool = True):
    super().__init__()
    self.use_edge_types = use_edge_types
    num_rel = gcfg.num_edge_types if use_edge_types else 1
    self.node_init = TorchNodeInit(gcfg.d_enc, gcfg.d_model, gcfg.layer_norm_eps)
    self.layers = nn.ModuleList([TorchGraphLayer(gcfg, num_rel) for _ in range(gcfg.num_layers)])
    self.scorer = TorchMlp(gcfg.d_model, gcfg.mlp_hidden, 1)

  def forward(self, h, role_probs, z_local, senders, receivers, etype, emask, node_mask):
    """Return global logits [N] (0 at padding nodes); graph arrays are NumPy or tensors."""
    as_long = lambda a: torch.as_tensor(np.array(a, np.int64))
    senders, receivers = as_long(senders), as_long(receivers)
    etype = as_long(etype) if self.use_edge_types else torch.zeros_like(senders)
    node_mask = torch.as_tensor(np.array(node_mask, bool))
    emask = torch.as_tensor(np.array(emask, bool)) & node_mask[senders] & node_mask[receivers]
    nm = node_mask[:, None].float()
    x = self.node_init(h * nm, role_probs * nm, z_local * node_mask.float())
    for layer in self.layers:
      x = layer(x, senders, receivers, etype, emask)
    return self.scorer(x)[:, 0] * node_mask.float()


class TorchLoGReranker(nn.Module):
  """`local` + `global` submodules; state-dict keys as in docs/CHECKPOINTS.md."""

  def __init__(self, cfg):
    super().__init__()
    self.local = TorchLocalScorer(cfg.local, cfg.use_role_head, cfg.use_intent_head)
    if cfg.use_global:
      self.add_module("global", TorchGraphReranker(cfg.graph_reranker, cfg.use_edge_types))

  @property
  def global_(self) -> TorchGraphReranker:
    """Return the `global` submodule (a Python keyword, so not an attribute name)."""
    return getattr(self, "global")


def randomise_(model: nn.Module, seed: int) -> nn.Module:
  """Give every parameter non-trivial values (norm weights near 1, nonzero biases); eval mode.

  `torch_init.randomise_uniform_norms` with std 0.2, the values the LoG conversion tests were
  measured with (checked bit-identical to this file's earlier own copy of the recipe)."""
  return randomise_uniform_norms(model, seed, std=0.2)


def unpack_rows(batch) -> List[Tuple[np.ndarray, np.ndarray]]:
  """Cut a packed batch back into its sequences: one (input_ids, span_ids) pair per segment."""
  out = []
  seg = np.asarray(batch.segment_ids)
  for r in range(seg.shape[0]):
    for s in sorted(set(seg[r].tolist()) - {0}):
      cols = np.flatnonzero(seg[r] == s)
      out.append((np.asarray(batch.input_ids)[r, cols], np.asarray(batch.span_ids)[r, cols]))
  return out


def spans_to_nodes(span_out: Dict[str, torch.Tensor], span_node: np.ndarray,
                   num_nodes: int) -> Dict[str, torch.Tensor]:
  """Place per-span outputs at their flat node index (span_node >= 0); padding nodes are zero."""
  span_node = np.asarray(span_node)
  src = np.flatnonzero(span_node >= 0)
  dst = torch.as_tensor(span_node[src].astype(np.int64))
  out = {}
  for k, v in span_out.items():
    z = torch.zeros((num_nodes,) + tuple(v.shape[1:]), dtype=v.dtype)
    z[dst] = v[torch.as_tensor(src.astype(np.int64))]
    out[k] = z
  return out


def reference_forward(model: TorchLoGReranker, batch, cfg):
  """Run the torch reference on a packed batch's sequences.

  The sentence graph is built by `logrerank_jax.graph.build.build_sentence_graph` from the
  *torch* local outputs and then fed to the torch GAT, so a comparison isolates weights and maths.

  Args:
    model: the reference model (eval mode).
    batch: a `PackedBatch`.
    cfg: the `LoGConfig` (graph-construction settings).

  Returns:
    (per-node NumPy outputs [Q*N, ...] incl. `global_logit` with a global part, host GraphsTuple).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from logrerank_jax.graph.build import build_sentence_graph  # pylint: disable=g-import-not-at-top
  q, n = batch.node_mask.shape
  with torch.no_grad():
    spans = model.local(unpack_rows(batch), batch.span_kind, batch.span_query)
    nodes = spans_to_nodes(spans, batch.span_node, q * n)
    graph = build_sentence_graph(
        jnp.asarray(nodes["h"].numpy()).reshape(q, n, -1),
        jnp.asarray(nodes["role_probs"].numpy()).reshape(q, n, NUM_ROLES),
        jnp.asarray(nodes["local_score"].numpy()).reshape(q, n), jnp.asarray(batch.node_passage),
        jnp.asarray(batch.node_mask), cfg.graph_build_config)
    graph = jax.tree_util.tree_map(np.asarray, graph)
    out = {k: v.numpy() for k, v in nodes.items()}
    if cfg.use_global:
      out["global_logit"] = model.global_(
          nodes["h"], nodes["role_probs"], nodes["local_score"], graph.senders, graph.receivers,
          graph.edges["type"], graph.edges["mask"], np.asarray(batch.node_mask).reshape(-1)).numpy()
  return out, graph
