"""Local sentence scorer (DESIGN.md eq 1-6): encoder, span pooling, intent/role heads, local MLP.

One (query, passage) pair is encoded as one joint sequence `[CLS] q [SEP] s_1 ... s_m [SEP]`
(eq 1); several such sequences share a packed row (`segment_ids`), and attention never crosses
them, so packing does not change any score. Every span (the query's tokens of one sequence, or
one sentence's tokens) is mean-pooled exactly with a segment sum over the flattened tokens.
Then, for each sentence span s with query span q = span_query[s]:

  gamma = softmax(MLP_int(h_q))              [3]   eq 2 (query intent)
  r     = softmax(MLP_role(h_s))             [3]   eq 3 (sentence role)
  g     = W_p(gamma * r)                     [g_dim]  eq 4 (no bias: a plain projection)
  l     = MLP_local([h_q; h_s; g])           []    eq 5
  z     = sigmoid(l)                         []    eq 6

Role/intent index order everywhere: 0 background, 1 method, 2 result.

Precision: the encoder computes in `encoder.dtype` (e.g. bfloat16); pooling accumulates in float32
and the heads (0.84M params, negligible cost) run entirely in float32, so logits, softmaxes and
sigmoids are float32 under bf16 compute (a bf16 sigmoid collapses distinct scores into ties).

Head sizes (paper leaves them unstated): MLP_int and MLP_role are d -> 256 -> 3, W_p maps the
3-vector to g_dim = d (768, back into encoder space), MLP_local is (2d + g_dim) -> 192 -> 1; all
hidden activations exact GELU, dropout after each hidden activation. With ModernBERT-base
(149,014,272 params) the heads add 840,327 params: local total 149,854,599 vs the paper's 149.85M.

Encoder family: `LocalScorerConfig.encoder` is a `ModernBertConfig` (the paper's encoder) or a
`BertConfig` (BERT / RoBERTa / XLM-R, e.g. all-MiniLM-L6-v2); the config's type is the family
(`encoder_family`), so there is no second field to disagree with it, and the encoder module is
picked from it (`ModernBertEncoder` / `BertEncoder`, param subtree "encoder" either way). BERT
reads token types: each packed sequence `[CLS] q [SEP] s_1 ... s_m [SEP]` gets 0 on
`[CLS] q [SEP]` and 1 on `s_1 ... s_m [SEP]`, BERT's sentence-pair convention (what
`tokenizer(query, passage)` returns); they are derived here from the span table
(`pair_token_types`), so the packed batch is the same for every family. ModernBERT has no token
types and is unchanged. A family with `type_vocab_size` 1 (RoBERTa) gets zeros.

Dense prior (`LocalScorerConfig.dense_prior` > 0; NOT in the paper, off by default): the local
logit gains w * cos(q, s), w a learned scalar initialised to `dense_prior` (param
`dense_prior_scale` [1]). With `dense_prior_encoding="split"` (the default) q and s are the
pooled query and sentence states of a second pass of the same encoder over the same rows, in
which each sequence's query and passage are separate attention segments (`split_query_passage`;
the passage opens with its own [CLS]): the bi-encoder that an encoder like all-MiniLM-L6-v2 was
trained as. `"joint"` takes them from the joint sequence (h_q, h_s) instead, which costs nothing
but loses most of the bi-encoder's ranking (docs/DEMO.md). A head MLP on [h_q; h_s; g] cannot represent a cosine; with the prior,
training starts from the bi-encoder's ranking instead of from a random one. It reaches the graph
through z_local, so inference needs nothing new. "split" doubles the encoder's work in
training; at inference the engine runs that pass once per distinct query and passage window
(`serving.prior_cache`: the pass depends on neither the pair nor the other segments) and hands
the pooled spans in as `prior_pooled`.

Ablations (flags of `LocalScorerConfig`):
  * `use_role_head=False` ("w/o role head"): the role MLP does not exist (no params); r is the
    uniform 1/3 vector in eq 4 AND in the outputs (`role_logits` are zeros). Consequence for the
    graph, which is always built from *predicted* roles: every sentence gets argmax role 0
    (ties -> lower index), so all adjacency edges are type 0 (same-role) and the similarity
    "same role" constraint is vacuous; the role-KL loss has nothing to train and must be off.
  * `use_intent_head=False` ("w/o intent head"): the intent MLP does not exist; gamma = 1/3.
  * "w/o contextual encoding" (each sentence encoded alone as `[CLS] q [SEP] s_ij [SEP]`) changes
    only what the scorer is fed, not the scorer: it is `LoGConfig.contextual_encoding=False`,
    wired by `logrerank_jax.data.packing.pack_for_model`, which packs every sentence as its own
    one-sentence passage and restores the real passage/sentence indices of the nodes.
"""

import dataclasses
import os
from typing import Any, Dict, Mapping, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from logrerank_jax.errors import ConfigError
from logrerank_jax.schema import NUM_ROLES, SPAN_SENTENCE, TOKEN_KEYS
from logrerank_jax.models.encoders.bert import BertConfig, BertEncoder
from logrerank_jax.models.encoders.hf_common import read_hf_config
from logrerank_jax.models.encoders.modernbert import ModernBertConfig, ModernBertEncoder
from logrerank_jax.models.dense_prior import dense_prior_term, segment_means, split_query_passage
from logrerank_jax.models.spans import pair_token_types, pool_spans

# Encoder family name -> its config class (the name is what model_config.json records).
ENCODER_FAMILIES = {"modernbert": ModernBertConfig, "bert": BertConfig}
EncoderConfig = Union[ModernBertConfig, BertConfig]
# HF `model_type`s of each family (config.json); BertConfig.from_hf knows the BERT layouts.
_HF_MODEL_TYPES = {"modernbert": ("modernbert",), "bert": ("bert", "roberta", "xlm-roberta")}


def encoder_family(encoder_cfg) -> str:
  """Return the family name ("modernbert" or "bert") of an encoder config, from its type."""
  for name, cls in ENCODER_FAMILIES.items():
    if isinstance(encoder_cfg, cls):
      return name
  raise ConfigError(f"unknown encoder config type {type(encoder_cfg).__name__}; expected one of "
                    f"{[c.__name__ for c in ENCODER_FAMILIES.values()]}")


def hf_encoder_family(path_or_dict: Union[str, os.PathLike, Mapping[str, Any]]) -> str:
  """Return the family of an HF config.json (folder, file or dict), from its `model_type`.

  A sentence-transformers folder has config.json at its root, so it is read like any HF folder.
  A config without `model_type` is ModernBERT (as `ModernBertConfig.from_hf` has always read it).
  """
  model_type = read_hf_config(path_or_dict).get("model_type", "modernbert")
  for name, types in _HF_MODEL_TYPES.items():
    if model_type in types:
      return name
  known = sorted(t for types in _HF_MODEL_TYPES.values() for t in types)
  raise ConfigError(f"HF config model_type {model_type!r} is not a supported encoder; "
                    f"expected one of {known}")


def encoder_config_from_hf(path_or_dict: Union[str, os.PathLike, Mapping[str, Any]],
                           **overrides) -> EncoderConfig:
  """Read the encoder config of an HF folder of either family (`ModernBertConfig` / `BertConfig`).

  Args:
    path_or_dict: a config.json path, a folder holding one, or its parsed dict.
    **overrides: fields to replace (e.g. `dtype`).
  """
  hf = read_hf_config(path_or_dict)
  return ENCODER_FAMILIES[hf_encoder_family(hf)].from_hf(hf, **overrides)

DENSE_PRIOR_ENCODINGS = ("split", "joint")
DENSE_PRIOR_POOLINGS = ("sentence", "passage")

# Per-span outputs that are scattered to graph nodes.
NODE_OUTPUT_KEYS = ("h", "h_query", "role_logits", "role_probs", "intent_probs", "local_logit",
                    "local_score")


@dataclasses.dataclass(frozen=True)
class LocalScorerConfig:
  """Sizes and switches of the local scorer (encoder config included)."""
  encoder: EncoderConfig  # ModernBertConfig or BertConfig: its type picks the encoder
  intent_hidden: int = 256
  role_hidden: int = 256
  g_dim: int = 768
  local_hidden: int = 192
  dropout: float = 0.1
  use_role_head: bool = True
  use_intent_head: bool = True
  # NOT in the paper (default 0 = off, the paper's eq 5): a dense similarity prior in the local
  # logit, l = MLP_local([h_q; h_s; g]) + w * cos(q, s), w a learned scalar initialised to
  # this value (module docstring, "Dense prior").
  dense_prior: float = 0.0
  # Where the prior's cosine comes from: "split" = a second pass of the same encoder in which
  # query and passage are separate attention segments (a bi-encoder), "joint" = the pooled
  # states of the joint sequence (h_q, h_s). Only read when dense_prior > 0.
  dense_prior_encoding: str = "split"
  # What the prior's cosine compares (split encoding only): "sentence" = the mean of the query's
  # tokens and of the sentence's tokens; "passage" = the mean of every token of each attention
  # segment (`[CLS] q` and `[CLS] s_1 ... s_m [SEP]`, `dense_prior_passage_cls`), which is the
  # sentence-transformers bi-encoder's mean pooling of the query and of the passage (window):
  # every sentence of a passage gets the passage's cosine, and the head orders sentences within it.
  dense_prior_pooling: str = "sentence"
  # Split encoding only: True = the passage side is encoded `[CLS] s_1 ... s_m [SEP]`, its [CLS]
  # in the slot of the query's closing [SEP] (so the query side is `[CLS] q`), exactly as the
  # bi-encoder encodes a passage; False = `s_1 ... s_m [SEP]` without a [CLS], as models saved
  # before this field were trained, which costs all-MiniLM-L6-v2 3.5 nDCG@10 of its zero-shot
  # ranking on ScholarQA-CS (`split_query_passage`).
  dense_prior_passage_cls: bool = True
  # Split encoding only: whether the encoder learns through the prior's pass (True) or only
  # through the joint sequence (False: the pass is a stop-gradient, so training does not bend the
  # cosine towards the training task directly, and skips that pass's backward, about a quarter
  # of a local training step). The scale w learns either way. No effect on inference.
  dense_prior_gradient: bool = True
  # NOT in the paper (default 1, the paper's z = sigmoid(l)): z_local = sigmoid(l / T), the local
  # score the sentence graph (score-gap edges) and the GAT read. Only the scale at which the
  # sigmoid reads the logit; the local logit, its losses and the local ranking are unchanged.
  # A dense prior of weight w ~ 20 moved the demo's logits to about 1-14 (median 6), where
  # sigmoid(l) is above 0.999 for 43 % of sentences and the graph stage sees no ranking
  # (docs/DEMO.md).
  score_temperature: float = 1.0
  # NOT in the paper (default False, the paper's randomly initialised MLP_local): the output
  # layer of MLP_local starts at zero, so at step 0 the local logit is the dense prior's
  # w * cos(q, s) alone (the bi-encoder's ranking, for a split prior with passage pooling) and
  # the head learns a correction to it, as `GraphRerankerConfig.residual_local` does for the GAT.
  # A random output layer adds an untrained score of its own that a few hundred steps at the
  # paper's learning rate do not remove (docs/DEMO.md). Changes the initial params only.
  local_head_zero_init: bool = False

  def __post_init__(self):
    for name in ("intent_hidden", "role_hidden", "g_dim", "local_hidden"):
      if int(getattr(self, name)) <= 0:
        raise ConfigError(f"LocalScorerConfig.{name} must be positive, got {getattr(self, name)}")
    if not 0.0 <= float(self.dropout) < 1.0:
      raise ConfigError(f"LocalScorerConfig.dropout must be in [0, 1), got {self.dropout}")
    if not np.isfinite(float(self.dense_prior)) or float(self.dense_prior) < 0:
      raise ConfigError(f"LocalScorerConfig.dense_prior must be >= 0, got {self.dense_prior}")
    if not float(self.score_temperature) > 0 or not np.isfinite(float(self.score_temperature)):
      raise ConfigError(f"LocalScorerConfig.score_temperature must be > 0, got "
                        f"{self.score_temperature}")
    if self.dense_prior_encoding not in DENSE_PRIOR_ENCODINGS:
      raise ConfigError(f"LocalScorerConfig.dense_prior_encoding must be one of "
                        f"{DENSE_PRIOR_ENCODINGS}, got {self.dense_prior_encoding!r}")
    if self.dense_prior_pooling not in DENSE_PRIOR_POOLINGS:
      raise ConfigError(f"LocalScorerConfig.dense_prior_pooling must be one of "
                        f"{DENSE_PRIOR_POOLINGS}, got {self.dense_prior_pooling!r}")
    if self.dense_prior_pooling != "sentence" and self.dense_prior_encoding != "split":
      raise ConfigError("LocalScorerConfig.dense_prior_pooling='passage' needs "
                        "dense_prior_encoding='split' (the joint sequence has no passage segment)")
    encoder_family(self.encoder)  # raises for an unknown encoder config type

  @property
  def use_dense_prior(self) -> bool:
    """Whether the local logit has the dense similarity prior (and its scale param)."""
    return float(self.dense_prior) != 0.0

  @property
  def encoder_family(self) -> str:
    """"modernbert" or "bert" (from the encoder config's type)."""
    return encoder_family(self.encoder)


class _Mlp(nn.Module):
  """Dense -> exact GELU -> dropout -> Dense, all float32 (`zero_out`: the last Dense starts at
  zero, so the MLP outputs 0 until it trains)."""
  hidden: int
  out: int
  dropout: float
  zero_out: bool = False

  @nn.compact
  def __call__(self, x, deterministic: bool):
    x = nn.Dense(self.hidden, dtype=jnp.float32, name="hidden")(x)
    x = nn.gelu(x, approximate=False)
    x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
    kernel_init = nn.initializers.zeros if self.zero_out else nn.linear.default_kernel_init
    return nn.Dense(self.out, dtype=jnp.float32, kernel_init=kernel_init, name="out")(x)


class LocalScorer(nn.Module):
  """Encoder + span pooling + intent/role heads + local MLP (eq 1-6)."""
  cfg: LocalScorerConfig

  @nn.compact
  def __call__(self, input_ids, attention_mask, segment_ids, position_ids, span_ids, span_kind,
               span_query, deterministic: bool = True, prior_pooled=None,
               prior_only: bool = False) -> Dict[str, jax.Array]:
    """Score every span of a packed batch.

    Args:
      input_ids, attention_mask, segment_ids, position_ids, span_ids: [R, L] int32 (contract C5).
      span_kind: [S] int32 (0 none, 1 query, 2 sentence).
      span_query: [S] int32, for a sentence span the index of its sequence's query span.
      deterministic: False enables dropout (needs a "dropout" rng).
      prior_pooled: split dense prior only: [S, d] float32, each span's pooled state of the
        prior's pass, computed elsewhere (`prior_only`, on deduplicated segments:
        `serving.prior_cache`); the pass is then not run here. None runs it (training does).
      prior_only: the rows are already in the split layout (each side its own segment, the
        positions and ids of `split_query_passage`): return only that pass's pooled spans,
        `{"prior_pooled": [S, d]}` (`span_query` is unused). One compact method per Flax
        module, so this entry point is a flag, and it reads the same "encoder" params.

    Returns:
      Dict of per-span float32 arrays: `h` [S, d] (pooled span), `h_query` [S, d] (pooled query
      of the span's sequence), `role_logits` [S, 3], `role_probs` [S, 3], `intent_probs` [S, 3],
      `local_logit` [S], `local_score` [S], `span_mask` [S] bool (sentence spans). Entries of
      non-sentence spans are zeroed so they carry no garbage.
    """
    cfg = self.cfg
    num_spans = span_kind.shape[0]
    is_bert = isinstance(cfg.encoder, BertConfig)
    encoder = (BertEncoder if is_bert else ModernBertEncoder)(cfg.encoder, name="encoder")

    def encode(segments, positions, token_types, ids=input_ids):  # -> [R, L, d]
      if is_bert:
        return encoder(ids, attention_mask, token_type_ids=token_types,
                       segment_ids=segments, position_ids=positions, deterministic=deterministic)
      return encoder(ids, attention_mask, segment_ids=segments, position_ids=positions,
                     deterministic=deterministic)

    def prior_pass(ids2, seg2, pos2):  # the split prior's pooled spans  [S, d]
      # The same encoder (same params) once more, query and passage as separate segments
      # and token type 0 throughout: the bi-encoder the checkpoint may have been trained as.
      hidden2 = encode(seg2, pos2, jnp.zeros_like(ids2), ids2)  # [R, L, d]
      if cfg.dense_prior_pooling == "passage":
        # Each span's tokens lie in one segment, so pooling the segment means over the span
        # gives that segment's mean (its [CLS]/[SEP] included, as the bi-encoder pools).
        hidden2 = segment_means(hidden2, seg2)
      return pool_spans(hidden2, span_ids, num_spans)[0]

    if prior_only:
      return {"prior_pooled": prior_pass(input_ids, segment_ids, position_ids)}

    token_types = (pair_token_types(span_ids, span_kind, segment_ids)
                   if is_bert and cfg.encoder.type_vocab_size > 1 else jnp.zeros_like(input_ids))
    hidden = encode(segment_ids, position_ids, token_types)  # [R, L, d]
    pooled, _ = pool_spans(hidden, span_ids, num_spans)  # [S, d] float32
    is_sent = span_kind == SPAN_SENTENCE  # [S]
    q_idx = jnp.where(is_sent, span_query, 0)
    h_s = pooled  # [S, d]
    h_q = jnp.take(pooled, q_idx, axis=0)  # [S, d]

    intent_probs, role_logits, role_probs = _intent_and_role(cfg, h_q, h_s, num_spans,
                                                             deterministic)

    g = nn.Dense(cfg.g_dim, use_bias=False, dtype=jnp.float32, name="proj_g")(
        intent_probs * role_probs)  # [S, g_dim]
    x = jnp.concatenate([h_q, h_s, g], axis=-1)  # [S, 2d + g_dim]
    logit = _Mlp(cfg.local_hidden, 1, cfg.dropout, zero_out=cfg.local_head_zero_init,
                 name="local_mlp")(x, deterministic)[:, 0]  # [S]
    if cfg.use_dense_prior:
      split_rows = lambda: split_query_passage(input_ids, span_ids, span_kind, segment_ids,
                                               position_ids, cfg.dense_prior_passage_cls)
      logit = logit + dense_prior_term(self, cfg, prior_pass, split_rows, prior_pooled, q_idx,
                                       h_q, h_s)  # [S]
    return _sentence_outputs(cfg, is_sent, h_s, h_q, role_logits, role_probs, intent_probs,
                             logit)


def _intent_and_role(cfg, h_q, h_s, num_spans, deterministic):
  """gamma (eq 2) and r (eq 3): (intent_probs, role_logits, role_probs) [S, 3] float32; an
  ablated head has no MLP and gives the uniform 1/3 (its role logits are zeros). Called inside
  `LocalScorer.__call__`, so the MLPs are its submodules."""
  uniform = jnp.full((num_spans, NUM_ROLES), 1.0 / NUM_ROLES, jnp.float32)
  if cfg.use_intent_head:
    intent_logits = _Mlp(cfg.intent_hidden, NUM_ROLES, cfg.dropout, name="intent_mlp")(
        h_q, deterministic)  # [S, 3]
    intent_probs = jax.nn.softmax(intent_logits, axis=-1)
  else:
    intent_probs = uniform
  if cfg.use_role_head:
    role_logits = _Mlp(cfg.role_hidden, NUM_ROLES, cfg.dropout, name="role_mlp")(
        h_s, deterministic)  # [S, 3]
    role_probs = jax.nn.softmax(role_logits, axis=-1)
  else:
    role_logits = jnp.zeros((num_spans, NUM_ROLES), jnp.float32)
    role_probs = uniform
  return intent_probs, role_logits, role_probs


def _sentence_outputs(cfg, is_sent, h_s, h_q, role_logits, role_probs, intent_probs, logit):
  """The per-span output dict of `LocalScorer.__call__`, zeroed outside sentence spans."""
  m = is_sent.astype(jnp.float32)
  out = {
      "h": h_s * m[:, None],
      "h_query": h_q * m[:, None],
      "role_logits": role_logits * m[:, None],
      "role_probs": role_probs * m[:, None],
      "intent_probs": intent_probs * m[:, None],
      "local_logit": logit * m,
      "local_score": jax.nn.sigmoid(logit / cfg.score_temperature) * m,
      "span_mask": is_sent,
  }
  return out


def score_batch(module: LocalScorer, params, batch: Mapping[str, Any], deterministic: bool = True,
                rngs=None) -> Dict[str, jax.Array]:
  """Apply `module` to the token/span arrays of a packed batch (a `PackedBatch` or a dict).

  Args:
    module: a `LocalScorer`.
    params: its params (the inner tree, without the "params" key).
    batch: object or mapping with the C5 fields `input_ids` ... `span_query`.
    deterministic: False enables dropout.
    rngs: e.g. {"dropout": key} when not deterministic.

  Returns:
    The per-span output dict of `LocalScorer.__call__`.
  """
  get = batch.__getitem__ if isinstance(batch, Mapping) else lambda k: getattr(batch, k)
  args = [jnp.asarray(get(k), jnp.int32) for k in TOKEN_KEYS + ("span_kind", "span_query")]
  return module.apply({"params": params}, *args, deterministic=deterministic, rngs=rngs)


def spans_to_nodes(span_out: Mapping[str, jax.Array], span_node, num_nodes: int
                   ) -> Dict[str, jax.Array]:
  """Scatter per-span outputs to the flat graph layout [Q*N, ...] via `span_node`.

  Args:
    span_out: per-span arrays with leading dim S (e.g. `LocalScorer` outputs).
    span_node: [S] int32, flat node index q*N + n of a sentence span, -1 otherwise.
    num_nodes: Q*N (static).

  Returns:
    Dict with the keys of `NODE_OUTPUT_KEYS` present in `span_out`, each [Q*N, ...] float32;
    nodes without a span (padding) are zero.
  """
  span_node = jnp.asarray(span_node, jnp.int32)
  # Non-sentence spans go to an out-of-range index and are dropped by the scatter.
  idx = jnp.where(span_node >= 0, span_node, num_nodes)  # [S]
  out = {}
  for k in NODE_OUTPUT_KEYS:
    if k not in span_out:
      continue
    v = span_out[k]
    out[k] = jnp.zeros((num_nodes,) + v.shape[1:], v.dtype).at[idx].set(v, mode="drop")
  return out
