"""`PassageStage`: the passage cross-encoder *baseline*. A BERT-family `BertSequenceClassifier`
from `init_checkpoint`, trained on each query's (question, passage) pairs with a listwise softmax
loss against the gold passage; it exports an HF BertForSequenceClassification folder."""

import json
import os
from typing import Any, Callable, Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from logrerank_jax.data.tokenization import load_tokenizer
from logrerank_jax.errors import ConfigError
from logrerank_jax.evaluation import rerank_metrics
from logrerank_jax.ranking import passage_order
from logrerank_jax.training import data as data_lib
from logrerank_jax.training import feature_cache as fc
from logrerank_jax.training.stages.base import Stage
from logrerank_jax.training.stages.batching import max_over_processes
from logrerank_jax.training.stages.distill import distill_term
from logrerank_jax.training.stages.model_config import (check_row_fits, encoder_family,
                                                        with_attention_dropout)
from logrerank_jax.training.stages.validation import unit_qrels


def passage_text(unit, p: int) -> str:
  """The "title text" string of a unit's passage p (what `baselines.passage_string` builds)."""
  title = unit.passage_titles[p] if unit.passage_titles else ""
  return f"{title} {' '.join(unit.query.passages[p])}".strip()


def _length_bucket(longest: int, cap: int) -> int:
  """The pair length a batch whose longest pair has `longest` tokens is padded to: the next
  power of two >= 64, at most `cap`."""
  return min(cap, max(64, 1 << (int(longest) - 1).bit_length()))


class PassageStage(Stage):
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
    self._take_units(config, data_lib.query_units(records))
    self._take_distill(config)
    self.num_p = max(len(u.passage_ids) for u in self.units)

  def _encode(self, units):
    """Tokenised (question, "title text") pairs of every passage of `units`, in order."""
    pairs = [(u.query.query, passage_text(u, p)) for u in units for p in range(len(u.passage_ids))]
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
      own = max_over_processes(own)
    top = int(own.max())
    if self.shape_buckets:
      lengths = [_length_bucket(x, top) for x in own]
    else:
      lengths = [top] * len(groups)
    return [[self._pack([self.units[i] for i in s], q_share, length) for s in shares_of(g)]
            for g, length in zip(groups, lengths)]

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
        terms["distill"] = distill_term(logits, batch["passage_teacher"],
                                        valid & batch["has_teacher"], self.distill_temperature)
      return terms

    return loss_fn, self._with_distill({"listwise": 1.0})

  def _evaluator(self, val_units, qrels) -> Callable[[Any], Dict[str, float]]:
    """params -> passage metrics on the validation queries (relevant: `qrels`, by default each
    query's rank-1 passage). The pairs are packed once, all to one shape (one compile)."""
    run = jax.jit(lambda p, b: self._logits(p, b, True))
    groups = fc.query_groups(len(val_units), self.config.cache_batch_queries)
    num_p = max(len(u.passage_ids) for u in val_units)
    # One length for every group: the longest validation pair's power-of-two bucket.
    longest = max(len(x) for x in self._encode(val_units)["input_ids"])
    length = _length_bucket(longest, self.config.max_seq_len)
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
