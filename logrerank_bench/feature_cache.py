"""Global-stage training with cached local features vs features recomputed every step."""

import dataclasses
import time
from typing import Any, Callable, Dict, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from logrerank_bench.common import init_log_params, local_nodes, log_config, row_len_for
from logrerank_bench.protocol import timed
from logrerank_jax import losses
from logrerank_jax.data.packing import PackingConfig, QueryInput, pack_queries
from logrerank_jax.data.records import validate_training_file
from logrerank_jax.models import log_reranker as lr


def labelled_batch(records, tokenizer, pcfg: PackingConfig, num_nodes: Optional[int] = None):
  """Pack training records as query graphs, with the per-node labels of the pairwise loss."""
  queries = [QueryInput(r.question, [[t.text for t in p.sentences] for p in r.passages])
             for r in records]
  b, _ = pack_queries(queries, tokenizer, pcfg)
  db = {k: np.asarray(v) for k, v in lr.device_batch(b).items()}
  q, n = b.node_mask.shape
  db["passage_rank"] = np.zeros((q, n), np.int32)
  db["sentence_rank"] = np.zeros((q, n), np.int32)
  for qi, r in enumerate(records):
    for ni in np.flatnonzero(b.node_mask[qi]):
      p, t = int(b.node_passage[qi, ni]), int(b.node_sentence[qi, ni])
      db["passage_rank"][qi, ni] = r.passages[p].rank
      db["sentence_rank"][qi, ni] = r.passages[p].sentences[t].rank
  return db


def one_shape_batches(records, tokenizer, size: str, group_size: int):
  """`labelled_batch`es of `group_size` records, all of one shape: buckets that fit the largest."""
  pcfg = PackingConfig(row_len=row_len_for(size), query_buckets=(group_size,))
  groups = [records[i:i + group_size] for i in range(0, len(records), group_size)]
  batches = [labelled_batch(g, tokenizer, pcfg) for g in groups]
  pcfg = dataclasses.replace(pcfg, row_buckets=(max(b["input_ids"].shape[0] for b in batches),),
                             span_buckets=(max(b["span_kind"].shape[0] for b in batches),),
                             node_buckets=(max(b["node_mask"].shape[1] for b in batches),))
  return groups, [labelled_batch(g, tokenizer, pcfg) for g in groups]


def global_step_fn(cfg: lr.LoGConfig, tx, features_of):
  """One jitted AdamW step of the global params on the pairwise loss, features from
  `features_of(batch)`."""
  model = lr.LoGReranker(cfg)

  def pairwise(gp, feats, b, rng):
    logits, _ = model.apply({"params": {"global": gp}}, feats, b["node_passage"], b["node_mask"],
                            False, method=lr.LoGReranker.global_logits, rngs={"dropout": rng})
    per_query, has_pair = losses.pairwise_query_losses(
        logits, b["passage_rank"], b["sentence_rank"], b["node_passage"], b["node_mask"])
    return jnp.sum(jnp.where(has_pair, per_query, 0.0)) / jnp.maximum(jnp.sum(has_pair), 1)

  @jax.jit
  def step(gparams, opt, batch, rng):
    loss, grads = jax.value_and_grad(
        lambda gp: pairwise(gp, features_of(batch), batch, rng))(gparams)
    upd, opt = tx.update(grads, opt, gparams)
    return optax.apply_updates(gparams, upd), opt, loss
  return step


def cache_suite(train_file: str, tokenizer, size: str, group_size: int = 2, reps: int = 2,
                limit: Optional[int] = None, log: Callable[[str], None] = print) -> Dict[str, Any]:
  """Global-stage epoch time (loss + grads of the global params) with cached vs recomputed features.

  Both paths run the model's entry points: "recomputed" runs `local_nodes` (frozen, no
  gradient) then `global_logits` every step; "cached" computes `local_nodes` once and runs only
  `global_logits`. Every batch has one shape, so neither path recompiles.
  """
  records = validate_training_file(train_file)[0][:limit]
  cfg = log_config(size, len(tokenizer))
  groups, batches = one_shape_batches(records, tokenizer, size, group_size)
  params = init_log_params(cfg, batches[0])
  tx = optax.adamw(3e-5, weight_decay=0.01)
  local_fn = jax.jit(lambda p, b: local_nodes(cfg, p, b))

  t0 = time.perf_counter()
  cached_batches = [dict(b, **jax.device_get(local_fn(params["local"], b))) for b in batches]
  feature_s = time.perf_counter() - t0
  cached_step = global_step_fn(cfg, tx, lambda b: b)
  frozen = jax.lax.stop_gradient(params["local"])
  recomputed_step = global_step_fn(cfg, tx, lambda b: local_nodes(cfg, frozen, b))
  rng = jax.random.PRNGKey(1)

  def epoch(step, batches):
    gp, opt = params["global"], tx.init(params["global"])
    for b in batches:
      gp, opt, loss = step(gp, opt, b, rng)
    return loss

  fdev = [jax.device_put(b) for b in cached_batches]
  tdev = [jax.device_put(b) for b in batches]
  cached = timed(lambda: epoch(cached_step, fdev), reps=reps, warmup=1)
  recomputed = timed(lambda: epoch(recomputed_step, tdev), reps=reps, warmup=1)
  out = {"size": size, "queries": len(records), "batches": len(groups),
         "cached_epoch_s": cached, "recomputed_epoch_s": recomputed,
         "speedup": recomputed / cached, "feature_compute_once_s": feature_s}
  log(f"cache {size}: cached epoch {cached * 1e3:.1f} ms, recomputed {recomputed * 1e3:.1f} ms, "
      f"x{recomputed / cached:.1f}")
  return out
