"""`LocalStage`: the encoder and heads on (query, passage) units, L_rank + λ·L_role (eq 19-22),
with the optional cross-passage terms (`local_passage_weight`, distillation) over whole queries."""

import dataclasses
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from logrerank_jax import losses
from logrerank_jax.errors import ConfigError
from logrerank_jax.evaluation import ranking_from_scores, rerank_metrics
from logrerank_jax.models import log_reranker as lr
from logrerank_jax.models.model_folder import save_model
from logrerank_jax.ranking import run_file_passage_scores
from logrerank_jax.training import data as data_lib
from logrerank_jax.training import feature_cache as fc
from logrerank_jax.training.stages.base import Stage
from logrerank_jax.training.stages.batching import pack_token_batches
from logrerank_jax.training.stages.distill import distill_term
from logrerank_jax.training.stages.model_config import (build_model_config, hf_encoder_params,
                                                        packing_config, training_tokenizer,
                                                        with_attention_dropout, with_hf_encoder)
from logrerank_jax.training.stages.validation import unit_qrels


def _slot_scores(logit, batch, per: int):
  """Whole-query micro-batches (one passage per slot, a query's `per` slots consecutive):
  [q, per] best sentence logit, teacher score, has-teacher and valid masks, and [q] gold flags."""
  mask = batch["node_mask"]                                                  # [Q, N]
  best = jnp.max(jnp.where(mask, logit, -1e9), axis=-1)                     # [Q]
  valid = jnp.any(mask, axis=-1)
  gold = jnp.any(mask & (batch["passage_rank"] == 1), axis=-1)
  with_t = mask & batch["has_teacher"]
  teacher = jnp.max(jnp.where(with_t, batch["passage_teacher"], -1e9), axis=-1)
  has_t = jnp.any(with_t, axis=-1)
  labelled = jnp.any(mask & batch["gold_labels"], axis=-1)
  q = best.shape[0] // per
  best, valid, gold, teacher, has_t, labelled = (
      x[:q * per].reshape(q, per) for x in (best, valid, gold, teacher, has_t, labelled))
  return best, valid, gold, teacher, has_t, jnp.any(labelled, axis=-1)


def _cross_passage_term(best, valid, gold, labelled):
  """Listwise softmax over each query's passages of their best local sentence logit [q, per],
  against the rank-1 passage (`local_passage_weight`; not in the paper, whose local loss ranks
  sentences within a passage only), for the queries with gold labels (`labelled` [q]); returns
  (sum over queries, queries)."""
  logp = jax.nn.log_softmax(jnp.where(valid, best, -1e9), axis=-1)
  has = jnp.any(gold & valid, axis=-1) & labelled
  per_query = -jnp.sum(jnp.where(gold & valid, logp, 0.0), axis=-1)
  return jnp.sum(jnp.where(has, per_query, 0.0)), jnp.sum(has).astype(jnp.float32)


class LocalStage(Stage):
  """Encoder + heads on (query, passage) units, listwise + role-KL loss (eq 19-22)."""
  name = "local"

  def __init__(self, config, workdir: str, records):
    self.config = config
    self.tokenizer = training_tokenizer(config, workdir, records)
    cfg = build_model_config(config, len(self.tokenizer))
    if config.init_checkpoint:
      cfg = with_hf_encoder(cfg, config.init_checkpoint)
      # Token ids past the embedding table would be clamped by XLA's gather, not refused.
      if len(self.tokenizer) > cfg.local.encoder.vocab_size:
        raise ConfigError(
            f"tokenizer has {len(self.tokenizer)} tokens but the encoder of "
            f"config.init_checkpoint={config.init_checkpoint} only "
            f"{cfg.local.encoder.vocab_size}; use that folder's tokenizer")
    self.cfg = dataclasses.replace(cfg, local=dataclasses.replace(
        cfg.local, encoder=with_attention_dropout(cfg.local.encoder, config)))
    self.pack_cfg = packing_config(config, self.cfg)
    self._take_units(config, data_lib.local_units(records))
    self._take_distill(config)
    self.workdir = workdir
    # The frozen-model fingerprint base and node features of the newest validation: `save`
    # leaves them for the global stage when they are the exported model's.
    self._val_features: Optional[Tuple[str, List[Dict[str, np.ndarray]]]] = None

  def _whole_queries(self) -> bool:
    """Whether the loss has a cross-passage term (gold or distillation): whole queries then."""
    return bool(self.config.get("local_passage_weight", 0.0)) or bool(self.distill_weight)

  def micro_batch_groups(self, size: int, seed: int):
    """Shuffled micro-batches of `size` units; with a cross-passage term, whole queries.

    The cross-passage terms (`local_passage_weight`, `distill_weight`) need every passage of
    a query in one device share, so each micro-batch is then the passages of `size // P`
    queries (P passages each, the same P for every query), query order shuffled with `seed`;
    one device only.
    """
    if not self._whole_queries():
      return super().micro_batch_groups(size, seed)
    if self.num_shards != 1:
      raise ConfigError("local_passage_weight or distill_weight > 0 needs one data-parallel device")
    by_query: Dict[str, List[int]] = {}
    for i, u in enumerate(self.units):
      by_query.setdefault(u.qid, []).append(i)
    queries = list(by_query.values())
    per = max(len(q) for q in queries)
    short = next((qid for qid, q in by_query.items() if len(q) != per), None)
    if short is not None:
      # A query's slots must line up with the [q, per] view of the cross-passage terms.
      raise ConfigError(f"a cross-passage term needs the same number of passages in every "
                        f"training query: {short!r} has {len(by_query[short])}, others {per}")
    if size < per:
      raise ConfigError(f"a cross-passage term needs micro_batch_size >= {per} (the passages "
                        f"of one query), got {size}")
    order = np.random.RandomState(seed).permutation(len(queries))
    step = size // per
    return [[i for qi in order[j:j + step] for i in queries[qi]]
            for j in range(0, len(queries), step)]

  def micro_batches(self, groups, shares_of):
    """[micro-batch][device share] packed token batches."""
    return pack_token_batches(self.units, groups, shares_of, self.tokenizer, self.pack_cfg,
                              self.cfg.contextual_encoding, self.shape_buckets)

  def init_params(self, example, rng):
    """{"local": ...}: random heads, and the encoder of `init_checkpoint` when one is given."""
    params = lr.init_stage_params(self.cfg, "local", example, rng)
    if self.config.init_checkpoint:
      params["local"] = dict(params["local"])
      params["local"]["encoder"] = hf_encoder_params(self.config.init_checkpoint, self.cfg)
    return params

  def loss(self) -> Tuple[Callable, Dict[str, float]]:
    """The local loss as per-term (sum, weight) over a device's share, and term coefficients."""
    cfg = self.cfg
    model = lr.LoGReranker(cfg)

    def loss_fn(params, batch, rng):
      nodes = model.apply({"params": params}, batch, False, method=lr.LoGReranker.local_nodes,
                          rngs={"dropout": rng})
      mask = batch["node_mask"]                     # [P, M]: one passage per query slot
      passages = jnp.sum(jnp.any(mask, axis=-1)).astype(jnp.float32)
      sentences = jnp.sum(mask).astype(jnp.float32)
      rank = losses.listwise_rank_loss(nodes["local_logit"], batch["sentence_rank"], mask,
                                       tau=cfg.tau)
      role = losses.role_kl_loss(nodes["role_logits"], batch["role_target"], mask)
      terms = {"rank": (rank * passages, passages), "role": (role * sentences, sentences)}
      if passage_weight or self.distill_weight:
        best, valid, gold, teacher, has_t, labelled = _slot_scores(nodes["local_logit"], batch,
                                                                   slots_per_query)
        if passage_weight:
          terms["passage"] = _cross_passage_term(best, valid, gold, labelled)
        if self.distill_weight:
          terms["distill"] = distill_term(best, teacher, has_t, self.distill_temperature)
      return terms

    passage_weight = float(self.config.get("local_passage_weight", 0.0))
    slots_per_query = self._per_query()
    coefs = {"rank": 1.0, "role": cfg.role_loss_weight}
    if passage_weight:
      coefs["passage"] = passage_weight
    return loss_fn, self._with_distill(coefs)

  def _per_query(self) -> int:
    counts: Dict[str, int] = {}
    for u in self.units:
      counts[u.qid] = counts.get(u.qid, 0) + 1
    return max(counts.values())

  def _evaluator(self, val_units, qrels) -> Callable[[Any], Dict[str, float]]:
    """params -> passage metrics on the validation queries, from local scores.

    The queries are scored by the inference engine (`serving.Reranker`, local stage only) with
    this run's row length and query cut: the calls, buckets and passage ranking (best local
    sentence score, ties by passage id) that `tools/evaluate.py` gives the exported model as
    `log-local`, so the validation figure is that one (for queries within the query cut). The
    engine fills each call with passages of several queries in small row buckets, where
    whole-query groups padded to a power-of-two row bucket computed up to twice the tokens.
    One engine per stage: each evaluation swaps in the params, and the compiled calls are
    reused.

    The node features behind the scores are the global stage's validation features for these
    params (`feature_cache.reranker_features`, the global stage's own path), so the newest
    ones are kept and `save` leaves them for it.
    """
    qrels = unit_qrels(val_units) if qrels is None else qrels
    engine: Dict[str, Any] = {}  # the one local_reranker, built at the first validation

    def evaluate(params):
      local = {"local": params["local"]}
      if "rr" in engine:
        engine["rr"].engine.set_params(local)
      else:
        engine["rr"] = fc.local_reranker(self.cfg, local, self.tokenizer, self.config.max_seq_len,
                                         self.config.max_query_tokens)
      items = fc.reranker_features(engine["rr"], val_units)
      self._val_features = (self._features_base(params), items)
      # Ties (sigmoid scores saturate in float32) by ascending passage id, as in evaluate.py.
      run = {u.qid: ranking_from_scores(dict(zip(u.passage_ids, run_file_passage_scores(
          it["node_passage"], it["local_score"], len(u.passage_ids)).tolist())))
             for u, it in zip(val_units, items)}
      return rerank_metrics(run, qrels, k=10)
    return evaluate

  # export_params: the base's, the trained params: the exported model is the trained local
  # model alone ("w/o global" until stage 2).

  def _features_base(self, params) -> str:
    """`feature_cache.frozen_local_base` of `params` with this run's packing limits: what a
    global stage on the exported model computes for its own cache."""
    return fc.frozen_local_base(params["local"], self.cfg.local, self.config.max_seq_len,
                                self.config.max_query_tokens)

  def save(self, model_dir: str, params, info) -> None:
    """Write the LoG model folder (`models.model_folder.save_model`), and, when the newest
    validation scored these params, its node features where the global stage looks for its
    validation cache (`feature_cache.LOCAL_VAL_FEATURES`; the demo: about 80 s it would spend
    computing them again). Other params write nothing: a file already there (e.g. from the run
    a re-run of a finished workdir re-exports) is left, and its fingerprint, which names the
    params it was computed with, decides whether the global stage may read it."""
    save_model(model_dir, params, self.cfg, self.tokenizer, info=info)
    base = self._features_base(params)
    if self._val_features is not None and self._val_features[0] == base:
      fc.write_features(os.path.join(self.workdir, fc.LOCAL_VAL_FEATURES),
                        fc.cache_fingerprint(base, *fc.val_sources(self.config)),
                        self._val_features[1])
