"""The two training stages, each one object: its model config, data, init, loss, eval, export.

`make_stage(config, workdir, records)` chooses the stage once; the loop in `trainer.py` then
only calls the stage's methods and never branches on which stage it runs.

  LocalStage   trains encoder + heads on (query, passage) units: L_rank + λ·L_role (eq 19-22).
  GlobalStage  freezes a finished local model, caches its per-sentence outputs once
               (`feature_cache`), and trains the graph encoder and global scorer on query
               graphs with the pairwise loss (eq 23).
  PassageStage the passage cross-encoder *baseline*: a BERT-family `BertSequenceClassifier`
               from `init_checkpoint`, trained on each query's (question, passage) pairs with
               a listwise softmax loss against the gold passage; exports an HF folder.

Both run the model only through `LoGReranker`'s entry points (`local_nodes`, `global_logits`).
"""

import collections.abc
import copy
import dataclasses
import json
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from logrerank_jax import losses
from logrerank_jax.data.packing import PackingConfig, grown_buckets
from logrerank_jax.data.tokenization import load_tokenizer, train_wordpiece_tokenizer
from logrerank_jax.errors import ConfigError
from logrerank_jax.evaluation import ranking_from_scores, rerank_metrics
from logrerank_jax.models import log_reranker as lr
from logrerank_jax.models.model_folder import load_model, save_model
from logrerank_jax.ranking import passage_order, passage_scores, run_file_passage_scores
from logrerank_jax.schema import NUM_ROLES
from logrerank_jax.training import data as data_lib
from logrerank_jax.training import feature_cache as fc
from logrerank_jax.training.config_checks import check_stage_settings


# ----------------------------------------------------------------------------- model config

def build_model_config(config, vocab_size: int) -> lr.LoGConfig:
  """Return the `LoGConfig` a training config asks for (preset, ablation, dtype, dropout, λ, τ)."""
  if config.model == "paper":
    cfg = lr.LoGConfig.paper()
    if vocab_size > cfg.local.encoder.vocab_size:
      raise ConfigError(f"tokenizer has {vocab_size} tokens but the paper encoder only "
                        f"{cfg.local.encoder.vocab_size}")
  elif config.model == "tiny":
    cfg = lr.LoGConfig.tiny(vocab_size=vocab_size)
  else:
    raise ConfigError(f"config.model must be 'paper' or 'tiny', got {config.model!r}")
  dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}.get(config.dtype)
  if dtype is None:
    raise ConfigError(f"config.dtype must be 'float32' or 'bfloat16', got {config.dtype!r}")
  encoder = cfg.local.encoder.replace(dtype=dtype)
  local = dataclasses.replace(cfg.local, encoder=encoder, dropout=config.dropout,
                              dense_prior=float(config.get("dense_prior", 0.0)),
                              dense_prior_encoding=config.get("dense_prior_encoding", "split"),
                              dense_prior_pooling=config.get("dense_prior_pooling", "sentence"),
                              dense_prior_gradient=bool(config.get("dense_prior_gradient", True)),
                              dense_prior_passage_cls=bool(config.get("dense_prior_passage_cls",
                                                                      True)),
                              score_temperature=float(config.get("score_temperature", 1.0)),
                              local_head_zero_init=bool(config.get("local_head_zero_init", False)))
  gat = dataclasses.replace(cfg.graph_reranker, dropout=config.dropout, dtype=dtype,
                            residual_local=bool(config.get("global_residual", False)))
  graph = dataclasses.replace(cfg.graph, k=config.graph_k, tau_sim=config.tau_sim,
                              delta=config.delta)
  cfg = dataclasses.replace(cfg, local=local, graph_reranker=gat, graph=graph,
                            lambda_role=config.lambda_role, tau=config.listwise_tau)
  if config.ablation:
    cfg = lr.ablation(cfg, config.ablation)
  return cfg


def check_row_fits(config, encoder) -> None:
  """Refuse `config.max_seq_len` beyond the encoder's positions: such a row would index past
  the position table (a gather that XLA clamps without a word). Names both numbers."""
  if config.max_seq_len > encoder.max_positions:
    raise ConfigError(f"config.max_seq_len={config.max_seq_len} exceeds the "
                      f"{encoder.max_positions} positions of the encoder; set "
                      "--config.max_seq_len to at most that")


def packing_config(config, cfg: lr.LoGConfig) -> PackingConfig:
  """Return the packer settings of a training config, checked against the model's encoder."""
  check_row_fits(config, cfg.local.encoder)
  return PackingConfig(row_len=config.max_seq_len, max_query_tokens=config.max_query_tokens)


def forward_packing(pack_cfg: PackingConfig) -> PackingConfig:
  """Packer settings for forward-only passes over whole queries (`fc.compute_features`, the
  reference path the engine's features are tested against): row buckets grown to 1,024 rows, so
  that 4 queries of 50 passages fit one call (the training buckets stop at 128 rows)."""
  return dataclasses.replace(pack_cfg, row_buckets=grown_buckets(pack_cfg.row_buckets, 1024))


def with_attention_dropout(encoder, config):
  """`encoder` (a BERT-family or ModernBERT config) with the training config's
  `encoder_attention_dropout` as its attention-probability dropout; -1 (the default) keeps the
  encoder's own.

  Raises:
    ConfigError: a rate outside [0, 1) other than -1.
  """
  rate = float(config.get("encoder_attention_dropout", -1.0))
  if rate == -1.0:
    return encoder
  if not 0.0 <= rate < 1.0:
    raise ConfigError(f"config.encoder_attention_dropout must be in [0, 1) or -1 (the encoder's "
                      f"own), got {rate}")
  from logrerank_jax.models.encoders.bert import BertConfig  # pylint: disable=g-import-not-at-top
  field = "attention_probs_dropout_prob" if isinstance(encoder, BertConfig) else "attention_dropout"
  return dataclasses.replace(encoder, **{field: rate})


def with_hf_encoder(cfg: lr.LoGConfig, path: str) -> lr.LoGConfig:
  """Replace the encoder config by the one of an HF folder (keeping dtype).

  The folder may be ModernBERT or BERT-family (BERT / RoBERTa / XLM-R; a sentence-transformers
  folder such as all-MiniLM-L6-v2 has config.json at its root): its config.json `model_type`
  decides. The widths that follow the encoder (`g_dim`, the GAT's `d_enc`) follow it
  (`LoGConfig.from_encoder`); everything else stays `cfg`'s.
  """
  from logrerank_jax.models.local_scorer import encoder_config_from_hf  # pylint: disable=g-import-not-at-top
  enc = encoder_config_from_hf(path, dtype=cfg.local.encoder.dtype)
  return lr.LoGConfig.from_encoder(enc, base=cfg)


def hf_encoder_params(path: str, cfg: lr.LoGConfig):
  """Load and convert the encoder weights of an HF folder with the map of `cfg`'s encoder family."""
  from logrerank_jax.convert import (bert_params_from_torch, load_torch_state_dict,  # pylint: disable=g-import-not-at-top
                                     modernbert_params_from_torch)
  convert = {"modernbert": modernbert_params_from_torch,
             "bert": bert_params_from_torch}[cfg.local.encoder_family]
  return convert(load_torch_state_dict(path), cfg.local.encoder)


def training_tokenizer(config, workdir: str, records):
  """Load the configured tokenizer, or train a WordPiece one on the training text."""
  if config.tokenizer:
    return load_tokenizer(config.tokenizer)
  if config.init_checkpoint:
    return load_tokenizer(config.init_checkpoint)
  saved = os.path.join(workdir, "tokenizer")
  if os.path.isdir(saved):  # a resumed run keeps the tokenizer it started with
    return load_tokenizer(saved)
  texts = [r.question for r in records] + [s.text for r in records for p in r.passages
                                           for s in p.sentences]
  # The vocabulary is deterministic, so every process builds the same one; only process 0 writes.
  return train_wordpiece_tokenizer(texts, config.tokenizer_vocab_size,
                                   saved if jax.process_index() == 0 else None)


# ----------------------------------------------------------------------------- evaluation

def unit_qrels(units) -> Dict[str, set]:
  """{qid: relevant passage ids} of training-record units: each query's rank-1 passage."""
  return {u.qid: {u.passage_ids[p] for p in range(len(u.passage_ids)) if u.passage_rank[p] == 1}
          for u in units}


def passage_metrics(units, node_scores: List[np.ndarray], qrels: Optional[Dict[str, set]] = None,
                    k: int = 10) -> Dict[str, float]:
  """Metrics of the passage ranking induced by sentence scores (`ranking.passage_scores`).

  The relevant passages are `qrels[qid]` (validation pools), by default each query's rank-1
  passage in the training record (`unit_qrels`).
  """
  run = {}
  for u, scores in zip(units, node_scores):
    node_passage = [p for p, sentences in enumerate(u.query.passages) for _ in sentences]
    best = passage_scores(node_passage, scores, len(u.passage_ids))
    run[u.qid] = [u.passage_ids[p] for p in passage_order(best)]
  return rerank_metrics(run, unit_qrels(units) if qrels is None else qrels, k=k)


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


def _distill_term(scores, teacher, has_teacher, temperature: float):
  """Listwise KL of each query's student scores [q, C] against its teacher scores (not in the
  paper; README); returns (sum over queries, queries)."""
  per_row, has = losses.listwise_kl_per_row(scores, teacher, has_teacher, temperature)
  return jnp.sum(per_row), jnp.sum(has).astype(jnp.float32)


def _device(batch) -> Dict[str, jax.Array]:
  return {k: jnp.asarray(v) for k, v in batch.items() if k != "real_tokens"}


# ----------------------------------------------------------------------------- the stages

class StreamedBatches(collections.abc.Sequence):
  """[micro-batch] -> its per-device shares, built on demand: nothing is held in memory.

  `make(i)` builds micro-batch i; it must be deterministic (the trainer rebuilds a step's
  batch after a resume). Host work runs in the trainer's data iterator (`data_iterator`),
  which prefetches the next steps' batches on a worker thread while the devices train.
  """

  def __init__(self, num: int, make: Callable[[int], List[Dict[str, np.ndarray]]]):
    self._num, self._make = int(num), make

  def __len__(self) -> int:
    return self._num

  def __getitem__(self, i: int):
    if not -self._num <= i < self._num:
      raise IndexError(f"micro-batch {i} of {self._num}")
    return self._make(int(i) % self._num)


def distill_settings(config) -> Tuple[float, float]:
  """(weight, temperature) of the distillation term, checked; weight 0 = off."""
  weight = float(config.get("distill_weight", 0.0))
  temperature = float(config.get("distill_temperature", 1.0))
  if weight < 0 or not temperature > 0:
    raise ConfigError(f"need distill_weight >= 0 and distill_temperature > 0, got {weight}, "
                      f"{temperature}")
  if weight and not config.get("teacher_file", ""):
    raise ConfigError("distill_weight > 0 needs --config.teacher_file (scores of a teacher)")
  return weight, temperature


def _with_teacher(units, config):
  """`units` with the teacher scores of `config.teacher_file` attached (unchanged without one).

  Teacher entries matching no unit are refused, except under `skip_invalid`: the records of
  skipped lines leave their entries unmatched, so they are counted in the log instead.
  """
  path = config.get("teacher_file", "")
  if not path:
    return units
  return data_lib.attach_teacher(units, data_lib.read_teacher_file(path), source=path,
                                 allow_unmatched=bool(config.get("skip_invalid", False)))


def pack_token_batches(units, groups, shares_of: Callable, tokenizer, pack_cfg: PackingConfig,
                       contextual_encoding: bool, shape_buckets: bool = True) -> StreamedBatches:
  """Every micro-batch's per-device shares, padded to its row bucket's shape, streamed.

  A first pass packs each share of this process only to learn its shape and keeps nothing but
  the shapes; the micro-batches are packed again, on demand, when the trainer reaches them
  (host memory O(one micro-batch), at the price of tokenising the process's shard twice).

  Args:
    units: training units.
    groups: micro-batches as lists of unit indices.
    shares_of: micro-batch -> this process's per-device shares (lists of unit indices).
    tokenizer, pack_cfg, contextual_encoding: how to pack.
    shape_buckets: True: a micro-batch is padded to the largest shape among the micro-batches
      with as many packed rows (the packer's row counts come from a short ladder, so a few
      compiles); False: every micro-batch to the run's largest shape (one compile).

  Returns:
    [micro-batch][device share] packed dicts; the shares of one micro-batch have one shape,
    the same on every process of a multi-host run; a device without units gets an inert share.
  """
  own = []
  for g in groups:
    sh = [data_lib.batch_shape(data_lib.pack_units([units[i] for i in s], tokenizer,
                                                   pack_cfg, contextual_encoding))
          for s in shares_of(g) if s]
    own.append(data_lib.max_shape(sh) if sh else (0, 0, 0, 0, 0))
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    own = [tuple(int(x) for x in row) for row in np.max(
        multihost_utils.process_allgather(np.asarray(own, np.int64)), 0)]
  shape_of = data_lib.bucketed_shapes(own, data_lib.rows_bucket if shape_buckets else None)
  # Its own tokenizer: the prefetch thread packs while the main thread may pack validation
  # batches, and a HF fast tokenizer is not safe to drive from two threads at once.
  tok = copy.deepcopy(tokenizer)

  def make(i):
    shape = shape_of[i]
    return [data_lib.pad_batch(data_lib.pack_units([units[j] for j in s], tok, pack_cfg,
                                                   contextual_encoding), shape)
            if s else data_lib.empty_batch(shape) for s in shares_of(groups[i])]
  return StreamedBatches(len(groups), make)


def _cross_passage_term(best, valid, gold, labelled):
  """Listwise softmax over each query's passages of their best local sentence logit [q, per],
  against the rank-1 passage (`local_passage_weight`; not in the paper, whose local loss ranks
  sentences within a passage only), for the queries with gold labels (`labelled` [q]); returns
  (sum over queries, queries)."""
  logp = jax.nn.log_softmax(jnp.where(valid, best, -1e9), axis=-1)
  has = jnp.any(gold & valid, axis=-1) & labelled
  per_query = -jnp.sum(jnp.where(gold & valid, logp, 0.0), axis=-1)
  return jnp.sum(jnp.where(has, per_query, 0.0)), jnp.sum(has).astype(jnp.float32)


class LocalStage:
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
    self.shape_buckets = bool(config.get("shape_buckets", True))
    self.units = _with_teacher(data_lib.local_units(records), config)
    self.distill_weight, self.distill_temperature = distill_settings(config)
    self.cache_info: Dict[str, Any] = {}
    self.workdir = workdir
    # The frozen-model fingerprint base and node features of the newest validation: `save`
    # leaves them for the global stage when they are the exported model's.
    self._val_features: Optional[Tuple[str, List[Dict[str, np.ndarray]]]] = None

  num_shards = 1  # set by the loop before `micro_batches`

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
      return data_lib.group_micro_batches(len(self.units), size, seed)
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
          terms["distill"] = _distill_term(best, teacher, has_t, self.distill_temperature)
      return terms

    passage_weight = float(self.config.get("local_passage_weight", 0.0))
    slots_per_query = self._per_query()
    coefs = {"rank": 1.0, "role": cfg.role_loss_weight}
    if passage_weight:
      coefs["passage"] = passage_weight
    if self.distill_weight:
      coefs["distill"] = self.distill_weight
    return loss_fn, coefs

  def _per_query(self) -> int:
    counts: Dict[str, int] = {}
    for u in self.units:
      counts[u.qid] = counts.get(u.qid, 0) + 1
    return max(counts.values())

  def make_eval(self, val_units, qrels=None) -> Callable[[Any], Dict[str, float]]:
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
    if not val_units:
      return lambda params: {}
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

  def export_params(self, params):
    """The exported model is the trained local model alone ("w/o global" until stage 2)."""
    return params

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


class GlobalStage:
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
    self.shape_buckets = bool(config.get("shape_buckets", True))
    self.units = _with_teacher(data_lib.query_units(records), config)
    self.num_p = max(len(u.passage_ids) for u in self.units)
    self.distill_weight, self.distill_temperature = distill_settings(config)
    self.cache_info: Dict[str, Any] = {}
    self.fp_base: Optional[str] = None  # identifies the frozen model's cached features
    if config.use_feature_cache:
      self.fp_base = fc.frozen_local_base(self.frozen_local, self.cfg.local, config.max_seq_len,
                                          config.max_query_tokens)

  def _features(self, units, data_file: str, split: str, extra_file: str = ""):
    """Cached (or, without the cache, freshly computed) frozen-local features of `units`
    (`extra_file`: a second file the units are read from, e.g. the corpus of id-only pools)."""
    compute = lambda: fc.engine_features(self.cfg, self.frozen_local, units, self.tokenizer,  # noqa: E731
                                         self.config.max_seq_len, self.config.max_query_tokens)
    if self.fp_base is None:
      return compute(), False
    fingerprint = fc.cache_fingerprint(self.fp_base, data_file, extra_file)
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
    return fc.load_or_compute_features(
        os.path.join(self.workdir, "feature_cache", f"{split}-p{jax.process_index()}.npz"),
        fingerprint, compute)

  def micro_batches(self, groups, shares_of):
    """[micro-batch][device share]: cached node features, or token batches without the cache."""
    if self.fp_base is None:
      return pack_token_batches(self.units, groups, shares_of, self.tokenizer, self.pack_cfg,
                                self.cfg.contextual_encoding, self.shape_buckets)
    import time  # pylint: disable=g-import-not-at-top
    t0 = time.time()
    feats, hit = self._features(self.units, self.config.train_file, "train")
    self.cache_info = {"train_cache_hit": hit, "cache_seconds": time.time() - t0}
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

  def micro_batch_groups(self, size: int, seed: int):
    """Micro-batches as lists of unit indices (shuffled with `seed`, `size` units each)."""
    return data_lib.group_micro_batches(len(self.units), size, seed)

  num_shards = 1  # set by the loop before `micro_batches`

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
        terms["distill"] = _distill_term(best, teacher, jnp.any(with_t, axis=1),
                                         self.distill_temperature)
      return terms

    max_better_rank = int(self.config.get("pairwise_max_better_rank", 0))
    if max_better_rank < 0:
      raise ConfigError(f"pairwise_max_better_rank must be >= 0, got {max_better_rank}")
    coefs = {"pairwise": 1.0}
    if self.distill_weight:
      coefs["distill"] = self.distill_weight
    return loss_fn, coefs

  def make_eval(self, val_units, qrels=None) -> Callable[[Any], Dict[str, float]]:
    """params -> passage metrics on the validation queries, from global scores."""
    if not val_units:
      return lambda params: {}
    data_file, extra_file = fc.val_sources(self.config)
    feats, _ = self._features(val_units, data_file, "val", extra_file)
    n_max = max(len(f["local_score"]) for f in feats)
    group_size = self.config.cache_batch_queries
    run = jax.jit(lambda p, b: self._global_logits(p, b, True))

    def evaluate(params):
      scores = []
      for group in fc.query_groups(len(val_units), group_size):
        b = fc.feature_batch([feats[i] for i in group], group_size, n_max,
                             [val_units[i].qid for i in group])
        out = np.asarray(run(params["global"], {k: jnp.asarray(v) for k, v in b.items()}))
        scores += [out[qi][:len(feats[i]["local_score"])] for qi, i in enumerate(group)]
      return passage_metrics(val_units, scores, qrels)
    return evaluate

  def export_params(self, params):
    """The full model: the frozen local params and the trained GAT."""
    return {"local": jax.device_get(self.frozen_local), "global": params["global"]}

  def save(self, model_dir: str, params, info) -> None:
    """Write the LoG model folder (`models.model_folder.save_model`)."""
    save_model(model_dir, params, self.cfg, self.tokenizer, info=info)


class PassageStage:
  """Passage cross-encoder baseline on query units: listwise softmax over a query's passages.

  Each passage is the pair `tokenizer(question, "title text")` (as `baselines.CrossEncoder`
  scores it), truncated longest-first to `max_seq_len`; a micro-batch holds
  `micro_batch_size` queries, all their passages, padded to one (Q, P, L) shape.
  """
  name = "passage"

  def __init__(self, config, workdir: str, records):
    from logrerank_jax.models.local_scorer import encoder_config_from_hf  # pylint: disable=g-import-not-at-top
    if not config.init_checkpoint:
      raise ConfigError("the passage stage needs --config.init_checkpoint=<HF BERT folder>")
    self.config = config
    self.tokenizer = load_tokenizer(config.tokenizer or config.init_checkpoint)
    enc = encoder_config_from_hf(config.init_checkpoint)
    if encoder_family(enc) != "bert":
      raise ConfigError("the passage stage supports BERT-family checkpoints only")
    check_row_fits(config, enc)
    self.cfg = with_attention_dropout(enc, config).replace(num_labels=1)
    self.shape_buckets = bool(config.get("shape_buckets", True))
    self.units = _with_teacher(data_lib.query_units(records), config)
    self.distill_weight, self.distill_temperature = distill_settings(config)
    self.cache_info: Dict[str, Any] = {}
    self.num_p = max(len(u.passage_ids) for u in self.units)

  def _encode(self, units):
    """Tokenised (question, "title text") pairs of every passage of `units`, in order."""
    pairs = [(u.query.query, _passage_text(u, p)) for u in units for p in range(len(u.passage_ids))]
    return self.tokenizer([q for q, _ in pairs], [t for _, t in pairs], truncation="longest_first",
                          max_length=self.config.max_seq_len) if pairs else {"input_ids": []}

  def _pack(self, units, num_q: int, length: int = 0, num_p: int = 0):
    """[Q, P, L] ids / mask / types, [Q, P] valid, gold and teacher arrays, [Q] gold-label
    flags, for up to `num_q` units (P: `num_p`, default the training queries' most passages)."""
    enc = self._encode(units)
    length = length or max([len(x) for x in enc["input_ids"]] + [8])
    shape = (num_q, num_p or self.num_p, length)
    ids, mask, types = (np.zeros(shape, np.int32) for _ in range(3))
    valid, gold = np.zeros(shape[:2], bool), np.zeros(shape[:2], bool)
    teacher, has_teacher = np.zeros(shape[:2], np.float32), np.zeros(shape[:2], bool)
    labelled = np.zeros(shape[:1], bool)
    k, real = 0, 0
    for qi, u in enumerate(units):
      labelled[qi] = u.gold
      for p in range(len(u.passage_ids)):
        x = enc["input_ids"][k]
        ids[qi, p, :len(x)] = x
        mask[qi, p, :len(x)] = 1
        types[qi, p, :len(x)] = enc["token_type_ids"][k]
        valid[qi, p], gold[qi, p] = True, u.passage_rank[p] == 1
        if u.teacher:
          teacher[qi, p], has_teacher[qi, p] = u.teacher[p], True
        real += len(x)
        k += 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types,
            "passage_mask": valid, "gold": gold, "labelled": labelled,
            "passage_teacher": teacher, "has_teacher": has_teacher,
            "real_tokens": np.asarray(real, np.int64)}

  def micro_batches(self, groups, shares_of):
    """[micro-batch][device share] packed pair batches, each micro-batch padded to its length
    bucket (the next power of two >= 64 of its longest pair, at most the run's longest; one
    compile per bucket) or, with `shape_buckets` False, all to the run's longest pair."""
    q_share = max(1, self.config.micro_batch_size // self.num_shards)
    # Tokenising alone gives a share's longest pair; the shares are packed when reached.
    own = np.asarray([max([max([len(x) for x in self._encode(
        [self.units[i] for i in s])["input_ids"]] + [8]) for s in shares_of(g)] or [0])
                      for g in groups], np.int64)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      own = np.max(multihost_utils.process_allgather(own), 0)
    top = int(own.max())
    if self.shape_buckets:
      lengths = [min(top, max(64, 1 << (int(x) - 1).bit_length())) for x in own]
    else:
      lengths = [top] * len(groups)
    return [[self._pack([self.units[i] for i in s], q_share, length) for s in shares_of(g)]
            for g, length in zip(groups, lengths)]

  def micro_batch_groups(self, size: int, seed: int):
    """Micro-batches as lists of unit indices (shuffled with `seed`, `size` units each)."""
    return data_lib.group_micro_batches(len(self.units), size, seed)

  num_shards = 1  # set by the loop before `micro_batches`

  def _logits(self, params, batch, deterministic, rng=None):
    from logrerank_jax.models.encoders.bert import BertSequenceClassifier  # pylint: disable=g-import-not-at-top
    q, p, l = batch["input_ids"].shape
    flat = lambda x: x.reshape(q * p, l)  # noqa: E731
    logits = BertSequenceClassifier(self.cfg).apply(
        {"params": params}, flat(batch["input_ids"]), flat(batch["attention_mask"]),
        flat(batch["token_type_ids"]), deterministic=deterministic,
        rngs=None if deterministic else {"dropout": rng})
    return logits[:, 0].reshape(q, p)

  def init_params(self, example, rng):
    """A fresh classifier head on the checkpoint's encoder (and its pooler when it has one)."""
    from logrerank_jax.convert import bert_params_from_torch, load_torch_state_dict  # pylint: disable=g-import-not-at-top
    from logrerank_jax.models.encoders.bert import init_params  # pylint: disable=g-import-not-at-top
    params = jax.device_get(init_params(self.cfg, rng, classifier=True))
    sd = load_torch_state_dict(self.config.init_checkpoint)
    params = dict(params, bert=bert_params_from_torch(sd, self.cfg))
    w, b = sd.get("pooler.dense.weight"), sd.get("pooler.dense.bias")
    if w is not None and b is not None:
      params["pooler"] = {"dense": {"kernel": np.asarray(w, np.float32).T,
                                    "bias": np.asarray(b, np.float32)}}
    return params

  def loss(self) -> Tuple[Callable, Dict[str, float]]:
    """Listwise softmax cross-entropy of each query's passages against its gold passage(s)."""

    def loss_fn(params, batch, rng):
      logits = self._logits(params, batch, False, rng)         # [Q, P]
      valid, gold = batch["passage_mask"], batch["gold"]
      has = jnp.any(gold & valid, axis=-1) & batch["labelled"]  # [Q]
      logp = jax.nn.log_softmax(jnp.where(valid, logits, -1e9), axis=-1)
      target = jnp.where(gold & valid, 1.0, 0.0)
      target = target / jnp.maximum(jnp.sum(target, -1, keepdims=True), 1.0)
      per_query = -jnp.sum(jnp.where(valid, target * logp, 0.0), axis=-1)
      count = jnp.sum(has).astype(jnp.float32)
      terms = {"listwise": (jnp.sum(jnp.where(has, per_query, 0.0)), count)}
      if self.distill_weight:
        terms["distill"] = _distill_term(logits, batch["passage_teacher"],
                                         valid & batch["has_teacher"], self.distill_temperature)
      return terms

    coefs = {"listwise": 1.0}
    if self.distill_weight:
      coefs["distill"] = self.distill_weight
    return loss_fn, coefs

  def make_eval(self, val_units, qrels=None) -> Callable[[Any], Dict[str, float]]:
    """params -> passage metrics on the validation queries (relevant: `qrels`, by default each
    query's rank-1 passage). The pairs are packed once, all to one shape (one compile)."""
    if not val_units:
      return lambda params: {}
    run = jax.jit(lambda p, b: self._logits(p, b, True))
    groups = fc.query_groups(len(val_units), self.config.cache_batch_queries)
    num_p = max(len(u.passage_ids) for u in val_units)
    # One length for every group: the longest validation pair's power-of-two bucket.
    longest = max(len(x) for x in self._encode(val_units)["input_ids"])
    length = min(self.config.max_seq_len, max(64, 1 << (longest - 1).bit_length()))
    batches = [self._pack([val_units[i] for i in g], self.config.cache_batch_queries, length,
                          num_p) for g in groups]
    qrels = unit_qrels(val_units) if qrels is None else qrels

    def evaluate(params):
      run_ = {}
      for group, b in zip(groups, batches):
        out = np.asarray(run(params, {k: jnp.asarray(v) for k, v in b.items()
                                      if k != "real_tokens"}))
        for qi, i in enumerate(group):
          u = val_units[i]
          scores = out[qi, :len(u.passage_ids)]
          run_[u.qid] = [u.passage_ids[p] for p in passage_order(scores)]
      return rerank_metrics(run_, qrels, k=10)
    return evaluate

  def export_params(self, params):
    return params

  def save(self, model_dir: str, params, info) -> None:
    """Write an HF BertForSequenceClassification folder (config, safetensors, tokenizer)."""
    from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
    from logrerank_jax.convert import bert_sequence_classifier_params_to_torch  # pylint: disable=g-import-not-at-top
    os.makedirs(model_dir, exist_ok=True)
    sd = bert_sequence_classifier_params_to_torch(jax.device_get(params), self.cfg)
    save_file({k: np.ascontiguousarray(v, np.float32) for k, v in sd.items()},
              os.path.join(model_dir, "model.safetensors"))
    hf = dict(self.cfg.to_hf_dict(), num_labels=1, architectures=["BertForSequenceClassification"])
    hf.setdefault("id2label", {"0": "LABEL_0"})
    hf.setdefault("label2id", {"LABEL_0": 0})
    with open(os.path.join(model_dir, "config.json"), "w", encoding="utf-8") as f:
      json.dump(hf, f, indent=1)
    self.tokenizer.save_pretrained(model_dir)
    with open(os.path.join(model_dir, "info.json"), "w", encoding="utf-8") as f:
      json.dump(info, f, indent=1, default=str)


def _passage_text(unit, p: int) -> str:
  """The "title text" string of a unit's passage p (what `baselines.passage_string` builds)."""
  title = unit.passage_titles[p] if unit.passage_titles else ""
  return f"{title} {' '.join(unit.query.passages[p])}".strip()


def encoder_family(cfg) -> str:
  from logrerank_jax.models.local_scorer import encoder_family as fam  # pylint: disable=g-import-not-at-top
  return fam(cfg)


def make_stage(config, workdir: str, records):
  """Choose the stage once from `config.stage`: `LocalStage`, `GlobalStage` or `PassageStage`."""
  check_stage_settings(config)
  return {"local": LocalStage, "global": GlobalStage,
          "passage": PassageStage}[config.stage](config, workdir, records)
