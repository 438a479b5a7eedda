"""`GlobalStage`: the graph encoder and global scorer (the GAT) on query graphs over a frozen,
finished local model, with the pairwise loss (eq 23). The local model's per-sentence outputs
are cached once (`feature_cache`) unless `use_feature_cache` is off."""

import dataclasses
import hashlib
import os
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from logrerank_jax import losses
from logrerank_jax.errors import ConfigError, DataError
from logrerank_jax.data.encoding import encode_texts
from logrerank_jax.models import log_reranker as lr
from logrerank_jax.models.model_folder import load_model, save_model
from logrerank_jax.training import data as data_lib
from logrerank_jax.training import feature_cache as fc
from logrerank_jax.training.stages.base import Stage
from logrerank_jax.training.stages.batching import pack_token_batches
from logrerank_jax.training.stages.distill import distill_term
from logrerank_jax.training.stages.model_config import build_model_config, packing_config
from logrerank_jax.training.stages.validation import (passage_metrics,
                                                       validation_passage_logits)


class GlobalStage(Stage):
  """The GAT on query graphs over the frozen local model's outputs, pairwise loss (eq 23)."""
  name = "global"

  def __init__(self, config, workdir: str, records):
    # make_stage has checked that local_checkpoint holds model/ (check_stage_settings).
    model_dir = os.path.join(config.local_checkpoint, "model")
    local_params, local_cfg, self.tokenizer = load_model(model_dir)
    cfg = build_model_config(config, len(self.tokenizer))
    # The frozen local model decides the encoder, its width (the GAT's input) and the local
    # switches; the training config decides the graph and the GAT.
    gat = dataclasses.replace(cfg.graph_reranker, d_enc=local_cfg.local.encoder.hidden_size)
    self.cfg = dataclasses.replace(cfg, local=local_cfg.local, graph_reranker=gat,
                                   contextual_encoding=local_cfg.contextual_encoding,
                                   use_role_head=local_cfg.use_role_head,
                                   use_intent_head=local_cfg.use_intent_head)
    self.config = config
    self.workdir = workdir
    self.frozen_local = jax.tree_util.tree_map(jnp.asarray, local_params["local"])
    self.pack_cfg = packing_config(config, self.cfg)
    self._take_units(config, data_lib.query_units(records))
    self._take_distill(config)
    self._train_subset = self._drop_teacher_only()
    self.num_p = max(len(u.passage_ids) for u in self.units)
    self.fp_base: Optional[str] = None  # identifies the frozen model's cached features
    if config.use_feature_cache:
      self.fp_base = fc.frozen_local_base(self.frozen_local, self.cfg.local, config.max_seq_len,
                                          config.max_query_tokens)

  def _drop_teacher_only(self) -> str:
    """Leave out the teacher-ranked queries (`labelled` false in the teacher file) when there is
    no distillation: eq 23 learns from gold labels only, so they carry no loss, yet their features
    were cached and their micro-batches were steps of zero gradient in which Adam's momentum still
    moved the GAT (the demo: 80 of 160 queries, about half the feature caching). Said on stdout
    and in the run's start record; returns what identifies the kept subset for the cache key
    ("" when every query is kept)."""
    if self.distill_weight:
      return ""
    kept = [u for u in self.units if u.gold]
    left_out = len(self.units) - len(kept)
    if not left_out:
      return ""
    if not kept:
      raise DataError(f"{self.config.train_file}: every training query is teacher-ranked only "
                      f"({self.config.teacher_file}: labelled false), and without distillation "
                      "(distill_weight 0) the global stage has no loss to learn from")
    print(f"global stage: {left_out} of {len(self.units)} training queries are teacher-ranked only "
          "and carry no loss without distillation (distill_weight 0): left out", flush=True)
    self.units = kept
    self.cache_info["teacher_only_left_out"] = left_out
    return "|queries:" + hashlib.sha256("\n".join(u.qid for u in kept).encode()).hexdigest()

  def _features(self, units, data_file: str, split: str, extra_file: str = ""):
    """Cached (or, without the cache, freshly computed) frozen-local features of `units`
    (`extra_file`: a second file the units are read from, e.g. the corpus of id-only pools)."""
    compute = lambda: fc.engine_features(self.cfg, self.frozen_local, units, self.tokenizer,  # noqa: E731
                                         self.config.max_seq_len, self.config.max_query_tokens)
    if self.fp_base is None:
      return compute(), False
    subset = self._train_subset if split == "train" else ""
    fingerprint = fc.cache_fingerprint(self.fp_base + subset, data_file, extra_file)
    if split == "val":
      # The local stage validated this very model on these units through the same engine
      # path, and left the features (LocalStage.save): on a miss of this stage's own cache,
      # read them rather than compute them again. The fingerprint holds them to the same
      # params, local config, packing limits and files.
      shared_path = os.path.join(self.config.local_checkpoint, fc.LOCAL_VAL_FEATURES)
      from_engine = compute

      def from_local_stage():
        shared = fc.read_features(shared_path, fingerprint)
        self.cache_info["val_features_from_local_stage"] = shared is not None
        return from_engine() if shared is None else shared
      compute = from_local_stage
    path = os.path.join(self.workdir, "feature_cache", f"{split}-p{jax.process_index()}.npz")
    feats, hit = fc.load_or_compute_features(path, fingerprint, compute)
    _check_node_counts(feats, units, path)
    return feats, hit

  def micro_batches(self, groups, shares_of):
    """[micro-batch][device share]: cached node features, or token batches without the cache."""
    if self.fp_base is None:
      return pack_token_batches(self.units, groups, shares_of, self.tokenizer, self.pack_cfg,
                                self.cfg.contextual_encoding, self.shape_buckets)
    import time  # pylint: disable=g-import-not-at-top
    t0 = time.time()
    feats, hit = self._features(self.units, self.config.train_file, "train")
    self.cache_info.update(train_cache_hit=hit, cache_seconds=time.time() - t0)
    # Distillation labels come from the units, not the cache: a new teacher file needs no
    # new features.
    feats = [fc.with_unit_labels(f, u) for f, u in zip(feats, self.units)]
    n_max = max(len(f["local_score"]) for f in feats)
    batches = []
    for g in groups:
      shares = shares_of(g)
      q_share = self.config.micro_batch_size // self.num_shards
      batches.append([fc.feature_batch([feats[i] for i in s], q_share, n_max,
                                       [self.units[i].qid for i in s]) for s in shares])
    return batches

  def _global_logits(self, params_global, feats, deterministic, rng=None):
    logits, _ = lr.LoGReranker(self.cfg).apply(
        {"params": {"global": params_global}}, feats, feats["node_passage"], feats["node_mask"],
        deterministic, method=lr.LoGReranker.global_logits,
        rngs=None if deterministic else {"dropout": rng})
    return logits

  def _node_features(self, batch):
    """Node features of a batch: the batch itself (cached), or the frozen local model's."""
    if self.fp_base is not None:
      return batch
    feats = fc.local_features(self.cfg, jax.lax.stop_gradient(self.frozen_local), batch)
    return dict(feats, node_passage=batch["node_passage"], node_mask=batch["node_mask"])

  def init_params(self, example, rng):
    """{"global": ...}: a fresh GAT."""
    return lr.init_stage_params(self.cfg, "global", self._node_features(example), rng)

  def loss(self) -> Tuple[Callable, Dict[str, float]]:
    """The pairwise loss (eq 23) as (sum over queries with pairs, number of such queries)."""

    def loss_fn(params, batch, rng):
      # The frozen local model runs deterministically, exactly as when the cache is filled.
      logits = self._global_logits(params["global"], self._node_features(batch), False, rng)
      per_query, has_pair = losses.pairwise_query_losses(
          logits, batch["passage_rank"], batch["sentence_rank"], batch["node_passage"],
          batch["node_mask"], max_better_rank=max_better_rank)
      # Teacher-ranked queries (no gold labels) have no pairs to learn from.
      has_pair = has_pair & jnp.any(batch["node_mask"] & batch["gold_labels"], axis=-1)
      count = jnp.sum(has_pair).astype(jnp.float32)
      terms = {"pairwise": (jnp.sum(jnp.where(has_pair, per_query, 0.0)), count)}
      if self.distill_weight:
        # Passage scores as LoG ranks passages: each passage's best sentence.
        mask = batch["node_mask"]
        onehot = (batch["node_passage"][..., None] == jnp.arange(self.num_p)) & mask[..., None]
        best = jnp.max(jnp.where(onehot, logits[..., None], -1e9), axis=1)             # [Q, P]
        with_t = onehot & batch["has_teacher"][..., None]
        teacher = jnp.max(jnp.where(with_t, batch["passage_teacher"][..., None], -1e9), axis=1)
        terms["distill"] = distill_term(best, teacher, jnp.any(with_t, axis=1),
                                        self.distill_temperature)
      return terms

    max_better_rank = int(self.config.get("pairwise_max_better_rank", 0))
    if max_better_rank < 0:
      raise ConfigError(f"pairwise_max_better_rank must be >= 0, got {max_better_rank}")
    return loss_fn, self._with_distill({"pairwise": 1.0})

  def _evaluator(self, val_units, qrels) -> Callable[[Any], Dict[str, float]]:
    """params -> passage metrics on the validation queries, from global scores."""
    data_file, extra_file = fc.val_sources(self.config)
    feats, _ = self._features(val_units, data_file, "val", extra_file)
    n_max = max(len(f["local_score"]) for f in feats)
    group_size = self.config.cache_batch_queries
    run = jax.jit(lambda p, b: self._global_logits(p, b, True))

    def node_logits(params_global):
      scores = []
      for group in fc.query_groups(len(val_units), group_size):
        b = fc.feature_batch([feats[i] for i in group], group_size, n_max,
                             [val_units[i].qid for i in group])
        out = np.asarray(run(params_global, {k: jnp.asarray(v) for k, v in b.items()}))
        scores += [out[qi][:len(feats[i]["local_score"])] for qi, i in enumerate(group)]
      return scores
    # `save` fits the calibration on the same features and jitted program: no second pass of
    # the local model over the validation pools (that pass took 109 s of the demo's 20 min).
    self._val_logits = (val_units, qrels, node_logits)

    def evaluate(params):
      return passage_metrics(val_units, node_logits(params["global"]), qrels)
    return evaluate

  def export_params(self, params):
    """The full model: the frozen local params and the trained GAT."""
    return {"local": jax.device_get(self.frozen_local), "global": params["global"]}

  def save(self, model_dir: str, params, info) -> None:
    """Write the LoG model folder (`models.model_folder.save_model`), and with judged validation
    pools its calibration.json (served scores become probabilities)."""
    save_model(model_dir, params, self.cfg, self.tokenizer, info=info)
    val = getattr(self, "_val_logits", None)
    if val is None or not val[1]:
      return
    from logrerank_jax.results import calibration as cal_lib  # pylint: disable=g-import-not-at-top
    from logrerank_jax.errors import LogRerankError  # pylint: disable=g-import-not-at-top
    units, qrels, node_logits = val
    # Validation cuts queries at the training limit (max_query_tokens); the served model reads
    # up to `engine.planner.DEFAULT_MAX_QUERY_TOKENS`. Only when no validation query was cut
    # are the validation logits the served model's; otherwise the exported folder reranks the
    # pools through the engine (`logrerank calibrate`'s path; ~100 s for the demo's 20 pools).
    _, q_len = encode_texts(self.tokenizer, [u.query.query for u in units])
    cut = int(np.sum(np.asarray(q_len) > self.config.max_query_tokens))
    try:
      if cut:
        from logrerank_jax.engine.calibration import fit_and_save_calibration  # pylint: disable=g-import-not-at-top
        cal = fit_and_save_calibration(model_dir, self.config.val_pools, self.config.val_qrels,
                                       self.config.get("val_corpus", ""))
      else:
        z, y = validation_passage_logits(units, node_logits(params["global"]), qrels)
        cal = cal_lib.fit_and_write(model_dir, z, y, fitted_on=self.config.val_pools)
      print(f"calibration: ECE {cal['ece_before']:.4f} -> {cal['ece_after']:.4f} "
            f"(a={cal['a']:.4g}, b={cal['b']:.4g}, {cal['n']} passages)", flush=True)
    except LogRerankError as e:  # e.g. a model that ranks nothing right yet: raw scores
      print(f"calibration: not fitted ({e}); the model keeps its raw scores", flush=True)


def _check_node_counts(feats, units, path: str) -> None:
  """A cached query's features must hold one node per sentence the input path makes of it now.
  The cache key covers the model, the packing and the data files, not the code that splits
  sentences: features cached before a splitter change would otherwise fail later as a bare
  shape error (or, for equal totals, score the wrong sentences)."""
  for f, u in zip(feats, units):
    want = sum(len(p) for p in u.query.passages)
    got = len(f["local_score"])
    if got != want:
      raise DataError(f"{path}: cached features of query {u.qid!r} hold {got} sentence nodes, but "
                      f"its input now splits into {want} sentences (cached by an older sentence "
                      f"splitter?); delete {os.path.dirname(path)}/ and the local stage's "
                      f"{fc.LOCAL_VAL_FEATURES} to recompute them")
