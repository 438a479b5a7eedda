"""`LoGConfig`, the LoG-Reranker's configuration, and the paper's ablations as its switches.

`LoGConfig` is the one place where the paper's ablations (DESIGN.md §1, Tables 3 and 12) are
switched; `ablation(cfg, name)` maps the paper's names to those switches. The sub-configs held by
`LoGConfig` are *base* configs: their own ablation flags must stay at their defaults, and the
resolved configs actually used (`cfg.local_scorer_config`, `cfg.graph_build_config`,
`cfg.graph_reranker_config`) are derived from the switches, so there is one source of truth.
`log_reranker` (the model) re-exports the public names here.

What each switch does (and nothing else):
  contextual_encoding=False   "w/o contextual encoding": every sentence is packed as its own
                              sequence `[CLS] q [SEP] s_ij [SEP]` (`logrerank_jax.data.packing.pack_for_model`); the graph
                              keeps the real passage/sentence indices.
  use_role_head=False         "w/o role head": no role MLP; r = 1/3 (see local_scorer.py); the
                              graph sees role 0 everywhere; role-KL weight becomes 0.
  use_intent_head=False       "w/o intent head": no intent MLP; gamma = 1/3.
  use_intra_passage_edges     "w/o intra-passage edges": GraphBuildConfig.use_adjacency=False.
  use_cross_passage_edges     "w/o cross-passage edges": GraphBuildConfig.use_similarity=False.
  use_edge_constraints        "w/o edge constraints": GraphBuildConfig.use_constraints=False.
  use_edge_types=False        "w/o edge types": every edge type 0 (graph) and one shared relation
                              (GraphRerankerConfig.use_edge_types=False).
  use_adjacency_expansion     "w/o adjacency expansion": context units get no in-passage neighbours.
  use_similarity_expansion    "w/o similarity expansion": context units get no similar neighbours.
  use_global=False            "w/o global": no GAT (no global params); final score = local score.
                              The graph is still built: the structured context expands over it.
  structured_context=False    "w/o structured context": the context is the flat top-K list.
"""

import dataclasses
from typing import Optional

from logrerank_jax.errors import ConfigError
from logrerank_jax.graph.build import GraphBuildConfig
from logrerank_jax.models.graph_reranker import GraphRerankerConfig
from logrerank_jax.models.local_scorer import LocalScorerConfig, encoder_config_from_hf
from logrerank_jax.models.encoders.modernbert import ModernBertConfig

# HF config of ModernBERT-base / gte-reranker-modernbert-base (the paper's local encoder).
MODERNBERT_BASE_HF = {
    "model_type": "modernbert",
    "vocab_size": 50368,
    "hidden_size": 768,
    "intermediate_size": 1152,
    "num_hidden_layers": 22,
    "num_attention_heads": 12,
    "hidden_activation": "gelu",
    "max_position_embeddings": 8192,
    "norm_eps": 1e-5,
    "norm_bias": False,
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
    "embedding_dropout": 0.0,
    "mlp_dropout": 0.0,
    "local_attention": 128,
    "global_attn_every_n_layers": 3,
    "global_rope_theta": 160000.0,
    "local_rope_theta": 10000.0,
    "pad_token_id": 50283,
    "classifier_pooling": "mean",
    "classifier_activation": "gelu",
    "classifier_bias": False,
    "classifier_dropout": 0.0,
    "num_labels": 1,
}

# Paper ablation name -> (LoGConfig field, value that ablates it).
ABLATIONS = {
    "w/o contextual encoding": ("contextual_encoding", False),
    "w/o role head": ("use_role_head", False),
    "w/o intent head": ("use_intent_head", False),
    "w/o intra-passage edges": ("use_intra_passage_edges", False),
    "w/o cross-passage edges": ("use_cross_passage_edges", False),
    "w/o edge constraints": ("use_edge_constraints", False),
    "w/o edge types": ("use_edge_types", False),
    "w/o adjacency expansion": ("use_adjacency_expansion", False),
    "w/o similarity expansion": ("use_similarity_expansion", False),
    "w/o global": ("use_global", False),
    "w/o structured context": ("structured_context", False),
}


@dataclasses.dataclass(frozen=True)
class LoGConfig:
  """Full model config: sub-configs, context/loss settings and one switch per paper ablation."""
  local: LocalScorerConfig
  graph: GraphBuildConfig = GraphBuildConfig()
  graph_reranker: GraphRerankerConfig = GraphRerankerConfig()
  context_k: int = 10          # top-K context units (eq 17); unstated in the paper
  num_similar: int = 2         # similar neighbours per unit (eq 18)
  lambda_role: float = 0.5     # eq 22
  tau: float = 1.0             # listwise target temperature (eq 19); unstated in the paper
  # Ablation switches (True / default = the full model).
  contextual_encoding: bool = True
  use_role_head: bool = True
  use_intent_head: bool = True
  use_intra_passage_edges: bool = True
  use_cross_passage_edges: bool = True
  use_edge_constraints: bool = True
  use_edge_types: bool = True
  use_adjacency_expansion: bool = True
  use_similarity_expansion: bool = True
  use_global: bool = True
  structured_context: bool = True

  def __post_init__(self):
    # Ablations are switched here only; a flag flipped inside a sub-config would be a second,
    # conflicting source of truth.
    for sub, flags in (("local", ("use_role_head", "use_intent_head")),
                       ("graph", ("use_adjacency", "use_similarity", "use_constraints",
                                  "use_edge_types")),
                       ("graph_reranker", ("use_edge_types",))):
      for f in flags:
        if not getattr(getattr(self, sub), f):
          raise ConfigError(f"LoGConfig.{sub}.{f} is False; switch ablations on LoGConfig "
                            "(see ABLATIONS), not inside its sub-configs")
    d_enc = self.local.encoder.hidden_size
    if self.graph_reranker.d_enc != d_enc:
      raise ConfigError(f"LoGConfig.graph_reranker.d_enc={self.graph_reranker.d_enc} does not "
                        f"match the encoder's hidden_size={d_enc}")
    if self.context_k < 1:
      raise ConfigError(f"LoGConfig.context_k must be >= 1, got {self.context_k}")
    if self.num_similar < 0:
      raise ConfigError(f"LoGConfig.num_similar must be >= 0, got {self.num_similar}")
    if self.tau <= 0:
      raise ConfigError(f"LoGConfig.tau must be > 0, got {self.tau}")
    if self.lambda_role < 0:
      raise ConfigError(f"LoGConfig.lambda_role must be >= 0, got {self.lambda_role}")

  @property
  def local_scorer_config(self) -> LocalScorerConfig:
    """The local scorer config with the head ablations applied."""
    return dataclasses.replace(self.local, use_role_head=self.use_role_head,
                               use_intent_head=self.use_intent_head)

  @property
  def graph_build_config(self) -> GraphBuildConfig:
    """The graph-construction config with the edge ablations applied."""
    return dataclasses.replace(self.graph, use_adjacency=self.use_intra_passage_edges,
                               use_similarity=self.use_cross_passage_edges,
                               use_constraints=self.use_edge_constraints,
                               use_edge_types=self.use_edge_types)

  @property
  def graph_reranker_config(self) -> GraphRerankerConfig:
    """The GAT config with the edge-type ablation applied."""
    return dataclasses.replace(self.graph_reranker, use_edge_types=self.use_edge_types)

  @property
  def role_loss_weight(self) -> float:
    """lambda_role, or 0 when there is no role head to train."""
    return float(self.lambda_role) if self.use_role_head else 0.0

  @classmethod
  def paper(cls) -> "LoGConfig":
    """Paper-size model: ModernBERT-base local encoder, d_g=256 2-layer 4-head GAT, k=8."""
    encoder = ModernBertConfig.from_hf(dict(MODERNBERT_BASE_HF))
    local = LocalScorerConfig(encoder=encoder, intent_hidden=256, role_hidden=256,
                              g_dim=encoder.hidden_size, local_hidden=192, dropout=0.1)
    return cls(local=local, graph=GraphBuildConfig(k=8, tau_sim=0.75, delta=0.25),
               graph_reranker=GraphRerankerConfig())

  @classmethod
  def from_encoder(cls, encoder, base: Optional["LoGConfig"] = None) -> "LoGConfig":
    """LoG on another encoder: `base` (default `paper()`) with its encoder config replaced.

    The widths that follow the encoder follow it: `local.g_dim` (W_p maps back into encoder
    space, g_dim = d) and `graph_reranker.d_enc` (the GAT reads the pooled sentence states);
    every other size, switch and setting is `base`'s.

    Args:
      encoder: a `ModernBertConfig` or a `BertConfig` (e.g. `BertConfig.from_hf(folder)`, or
        `local_scorer.encoder_config_from_hf(folder)` for either family).
      base: the config to start from.

    Returns:
      The config.
    """
    base = cls.paper() if base is None else base
    d = int(encoder.hidden_size)
    local = dataclasses.replace(base.local, encoder=encoder, g_dim=d)
    gat = dataclasses.replace(base.graph_reranker, d_enc=d)
    return dataclasses.replace(base, local=local, graph_reranker=gat)

  @classmethod
  def from_hf(cls, path, base: Optional["LoGConfig"] = None, **encoder_overrides) -> "LoGConfig":
    """`from_encoder` on the encoder of an HF folder of either family (config.json read only).

    Args:
      path: HF folder (ModernBERT, or BERT / RoBERTa / sentence-transformers) or its config.json.
      base: the config to start from (default `paper()`).
      **encoder_overrides: encoder config fields to replace (e.g. `dtype`).
    """
    return cls.from_encoder(encoder_config_from_hf(path, **encoder_overrides), base)

  @classmethod
  def tiny(cls, vocab_size: int = 1024) -> "LoGConfig":
    """CPU-test size, derived from `paper()` by shrinking sizes only (same code paths).

    Args:
      vocab_size: vocabulary of the (test) tokenizer; its [PAD] id is taken to be 0.
    """
    p = cls.paper()
    # 3 layers, global every 2: global, sliding (window 16 < row length), global.
    encoder = dataclasses.replace(
        p.local.encoder, vocab_size=vocab_size, hidden_size=32, intermediate_size=48,
        num_hidden_layers=3, num_attention_heads=2, max_position_embeddings=1024,
        local_attention=16, global_attn_every_n_layers=2, layer_types=None, pad_token_id=0)
    local = dataclasses.replace(p.local, encoder=encoder, intent_hidden=16, role_hidden=16,
                                g_dim=32, local_hidden=16)
    graph_reranker = dataclasses.replace(p.graph_reranker, d_enc=32, d_model=16, num_heads=2,
                                         relation_dim=8, ffn_dim=32, mlp_hidden=16)
    return dataclasses.replace(p, local=local, graph=dataclasses.replace(p.graph, k=2),
                               graph_reranker=graph_reranker, context_k=4)


def _normalise_name(name: str) -> str:
  """Lower-case and collapse whitespace, so "W/O  Edge Types" finds "w/o edge types"."""
  return " ".join(str(name).lower().split())


def ablation(cfg: LoGConfig, name: str) -> LoGConfig:
  """Return `cfg` with one of the paper's ablations switched on.

  Args:
    cfg: the base config.
    name: a key of `ABLATIONS` (e.g. "w/o edge types"; case and spacing are forgiven).

  Returns:
    The ablated config.

  Raises:
    ConfigError: unknown ablation name.
  """
  key = _normalise_name(name)
  if key not in ABLATIONS:
    raise ConfigError(f"unknown ablation {name!r}; known: {sorted(ABLATIONS)}")
  field, value = ABLATIONS[key]
  return dataclasses.replace(cfg, **{field: value})
