"""`train_and_evaluate(config, workdir)`: both LoG training stages, data-parallel, resumable.

Stage "local" trains the encoder and heads on (query, passage) units with L_rank + λ·L_role
(eq 19-22). Stage "global" freezes the local model, caches its per-sentence outputs once, and
trains the graph encoder and global scorer on query graphs with the pairwise loss (eq 23).

Data order: units are grouped into global micro-batches once (seeded shuffle), packed once, and
each epoch visits the micro-batches in a seeded permutation. The micro-step counter alone
therefore fixes the data position, which is what makes a resumed run identical to an
uninterrupted one. A micro-batch is split into contiguous per-device shares; the loss divides
sums by counts summed over all devices (`step.global_mean_loss`), so the result does not depend
on the number of devices or hosts.
"""

import dataclasses
import hashlib
import json
import math
import os
import tempfile
import time
from typing import Any, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from logrerank_jax import losses
from logrerank_jax.data.packing import PackingConfig
from logrerank_jax.data.records import validate_training_file
from logrerank_jax.data.tokenization import load_tokenizer, train_wordpiece_tokenizer
from logrerank_jax.errors import CheckpointError, ConfigError, LogRerankError
from logrerank_jax.evaluation import rerank_metrics
from logrerank_jax.graph.build import build_sentence_graph
from logrerank_jax.models import log_reranker as lr
from logrerank_jax.models.graph_reranker import GraphReranker
from logrerank_jax.models.local_scorer import LocalScorer, spans_to_nodes
from logrerank_jax.training import data as data_lib
from logrerank_jax.training import optim
from logrerank_jax.training import step as step_lib
from logrerank_jax.training.checkpoints import Checkpointer
from logrerank_jax.training.export import load_model, save_model


class TrainingDivergedError(LogRerankError):
  """The loss became NaN or infinite; the message names the step."""


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
  local = dataclasses.replace(cfg.local, encoder=encoder, dropout=config.dropout)
  gat = dataclasses.replace(cfg.graph_reranker, dropout=config.dropout, dtype=dtype)
  graph = dataclasses.replace(cfg.graph, k=config.graph_k, tau_sim=config.tau_sim,
                              delta=config.delta)
  cfg = dataclasses.replace(cfg, local=local, graph_reranker=gat, graph=graph,
                            lambda_role=config.lambda_role, tau=config.listwise_tau)
  if config.ablation:
    cfg = lr.ablation(cfg, config.ablation)
  return cfg


def packing_config(config) -> PackingConfig:
  """Return the packer settings of a training config."""
  return PackingConfig(row_len=config.max_seq_len, max_query_tokens=config.max_query_tokens)


# ----------------------------------------------------------------------------- losses

def local_loss_fn(cfg: lr.LoGConfig):
  """Return the local-stage loss: listwise rank (per passage) + role KL (per sentence)."""
  module = LocalScorer(cfg.local_scorer_config)

  def loss_fn(params, batch, rng):
    q, n = batch["node_mask"].shape
    span_out = module.apply({"params": params["local"]}, *[batch[k] for k in data_lib.TOKEN_FIELDS],
                            batch["span_kind"], batch["span_query"], deterministic=False,
                            rngs={"dropout": rng})
    nodes = spans_to_nodes(span_out, batch["span_node"], q * n)
    mask = batch["node_mask"]                                     # [P, M] (one passage per slot)
    logits = nodes["local_logit"].reshape(q, n)                   # [P, M]
    role_logits = nodes["role_logits"].reshape(q, n, 3)           # [P, M, 3]
    passages = jnp.sum(jnp.any(mask, axis=-1)).astype(jnp.float32)
    sentences = jnp.sum(mask).astype(jnp.float32)
    rank = losses.listwise_rank_loss(logits, batch["sentence_rank"], mask, tau=cfg.tau)
    role = losses.role_kl_loss(role_logits, batch["role_target"], mask)
    return {"rank": (rank * passages, passages), "role": (role * sentences, sentences)}

  return loss_fn, {"rank": 1.0, "role": cfg.role_loss_weight}


def _pairwise_terms(logits, batch):
  """Per-query pairwise loss (eq 23) as (sum over queries with pairs, number of such queries)."""
  per_query, has_pair = losses.pairwise_query_losses(
      logits, batch["passage_rank"], batch["sentence_rank"], batch["node_passage"],
      batch["node_mask"])
  count = jnp.sum(has_pair).astype(jnp.float32)
  return jnp.sum(jnp.where(has_pair, per_query, 0.0)), count


def global_logits_from_features(cfg: lr.LoGConfig, params_global, feats, deterministic, rng=None):
  """Build the graph from cached local outputs and run the GAT: logits [Q, N]."""
  q, n = feats["node_mask"].shape
  graph = build_sentence_graph(feats["h"], feats["role_probs"], feats["local_score"],
                               feats["node_passage"], feats["node_mask"], cfg.graph_build_config)
  logits = GraphReranker(cfg.graph_reranker_config).apply(
      {"params": params_global}, feats["h"].reshape(q * n, -1),
      feats["role_probs"].reshape(q * n, 3), feats["local_score"].reshape(q * n), graph,
      deterministic=deterministic, rngs=None if deterministic else {"dropout": rng})
  return logits.reshape(q, n)


def global_loss_fn(cfg: lr.LoGConfig, frozen_local=None):
  """Return the global-stage pairwise loss, from cached features or (if `frozen_local`) tokens."""

  def loss_fn(params, batch, rng):
    if frozen_local is None:
      logits = global_logits_from_features(cfg, params["global"], batch, False, rng)
    else:
      # The frozen local model runs deterministically, exactly as when the cache is filled.
      logits = _recomputed_global_logits(cfg, frozen_local, params["global"], batch, rng)
    total, count = _pairwise_terms(logits, batch)
    return {"pairwise": (total, count)}

  return loss_fn, {"pairwise": 1.0}


def local_features(cfg: lr.LoGConfig, local_params, batch) -> Dict[str, jax.Array]:
  """Run the frozen local model (no dropout) and return node features [Q, N, ...]."""
  q, n = batch["node_mask"].shape
  span_out = LocalScorer(cfg.local_scorer_config).apply(
      {"params": local_params}, *[batch[k] for k in data_lib.TOKEN_FIELDS], batch["span_kind"],
      batch["span_query"], deterministic=True)
  nodes = spans_to_nodes(span_out, batch["span_node"], q * n)
  return {"h": nodes["h"].reshape(q, n, -1), "role_probs": nodes["role_probs"].reshape(q, n, 3),
          "local_score": nodes["local_score"].reshape(q, n),
          "local_logit": nodes["local_logit"].reshape(q, n)}


def _recomputed_global_logits(cfg, local_params, global_params, batch, rng):
  feats = local_features(cfg, jax.lax.stop_gradient(local_params), batch)
  feats.update(node_passage=batch["node_passage"], node_mask=batch["node_mask"])
  return global_logits_from_features(cfg, global_params, feats, False, rng)


# ----------------------------------------------------------------------------- set-up helpers

def _topology(config):
  """Initialise multi-host JAX if asked; return (local devices used, process index, processes)."""
  if config.distributed:
    kwargs = {}
    if config.coordinator_address:
      kwargs = dict(coordinator_address=config.coordinator_address,
                    num_processes=config.num_processes, process_id=config.process_id)
    jax.distributed.initialize(**kwargs)
  devices = jax.local_devices()
  if config.num_devices:
    if jax.process_count() > 1:
      raise ConfigError("config.num_devices must be 0 (all local devices) in a multi-host run")
    if config.num_devices > len(devices):
      raise ConfigError(f"config.num_devices={config.num_devices} but only {len(devices)} devices")
    devices = devices[:config.num_devices]
  return devices, jax.process_index(), jax.process_count()


def _tokenizer(config, workdir, records):
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


def _file_digest(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()[:16]


def _cache_fingerprint(fp_base: str, data_file: str) -> str:
  """Return the cache key of one data file's features under the frozen model `fp_base`."""
  return hashlib.sha256((fp_base + _file_digest(data_file)).encode()).hexdigest()


def _tree_digest(tree) -> str:
  h = hashlib.sha256()
  for leaf in jax.tree_util.tree_leaves(tree):
    h.update(np.ascontiguousarray(np.asarray(leaf, np.float32)).tobytes())
  return h.hexdigest()[:16]


# Config keys that must not change when a run resumes (they change the data order or the math).
_RESUME_KEYS = ("stage", "seed", "train_file", "model", "ablation", "dtype", "micro_batch_size",
                "grad_accum_steps", "learning_rate", "num_epochs", "max_seq_len", "weight_decay",
                "warmup_fraction", "lambda_role", "listwise_tau", "dropout", "use_feature_cache",
                "adam_eps")


def _resume_signature(config) -> Dict[str, Any]:
  return {k: config[k] for k in _RESUME_KEYS}


# ----------------------------------------------------------------------------- feature cache

def _query_groups(n: int, size: int) -> List[List[int]]:
  return [list(range(i, min(n, i + size))) for i in range(0, n, size)]


def compute_features(cfg, local_params, units, tokenizer, packing_cfg, group_size: int):
  """Run the frozen local model over query units; return per-query node features and labels."""
  run = jax.jit(lambda p, b: local_features(cfg, p, b))
  out = []
  for group in _query_groups(len(units), group_size):
    share = [units[i] for i in group]
    b = data_lib.pack_units(share, tokenizer, packing_cfg, cfg)
    feats = jax.device_get(run(local_params, {k: jnp.asarray(v) for k, v in b.items()
                                              if k != "real_tokens"}))
    for qi in range(len(share)):
      m = b["node_mask"][qi]
      item = {k: np.asarray(v[qi][m]) for k, v in feats.items()}
      for k in ("node_passage", "sentence_rank", "passage_rank"):
        item[k] = b[k][qi][m]
      out.append(item)
  return out


def load_or_compute_features(path: str, fingerprint: str, compute):
  """Return cached per-query features from `path` if its fingerprint matches, else compute and store."""
  if os.path.exists(path):
    with np.load(path, allow_pickle=False) as z:
      if str(z["fingerprint"]) == fingerprint:
        offsets = z["offsets"]
        keys = [k for k in z.files if k not in ("fingerprint", "offsets")]
        arrays = {k: z[k] for k in keys}
        return [{k: arrays[k][offsets[i]:offsets[i + 1]] for k in keys}
                for i in range(len(offsets) - 1)], True
  items = compute()
  offsets = np.cumsum([0] + [len(it["local_score"]) for it in items])
  arrays = {k: np.concatenate([it[k] for it in items]) for k in items[0]}
  tmp = path + ".tmp.npz"
  np.savez(tmp, fingerprint=np.asarray(fingerprint), offsets=offsets, **arrays)
  os.replace(tmp, path)
  return items, False


def feature_batch(items: List[Dict[str, np.ndarray]], q: int, n: int) -> Dict[str, np.ndarray]:
  """Assemble cached query features into one [q, n] share (padding slots inert)."""
  d = items[0]["h"].shape[-1] if items else 1
  out = {"h": np.zeros((q, n, d), np.float32), "role_probs": np.zeros((q, n, 3), np.float32),
         "local_score": np.zeros((q, n), np.float32),
         "node_passage": np.full((q, n), -1, np.int32), "node_mask": np.zeros((q, n), bool),
         "sentence_rank": np.zeros((q, n), np.int32), "passage_rank": np.zeros((q, n), np.int32)}
  for qi, it in enumerate(items):
    m = len(it["local_score"])
    for k in ("h", "role_probs", "local_score", "node_passage", "sentence_rank", "passage_rank"):
      out[k][qi, :m] = it[k]
    out["node_mask"][qi, :m] = True
  return out


# ----------------------------------------------------------------------------- evaluation

def passage_metrics(units, node_scores: List[np.ndarray], k: int = 10) -> Dict[str, float]:
  """Metrics of the passage ranking induced by sentence scores (a passage scores its best sentence).

  The relevant passage of a query is its rank-1 passage in the training record.
  """
  run, qrels = {}, {}
  for u, scores in zip(units, node_scores):
    best = {}
    node = 0
    for p, sentences in enumerate(u.query.passages):
      best[p] = float(np.max(scores[node:node + len(sentences)]))
      node += len(sentences)
    order = sorted(best, key=lambda p: (-best[p], p))
    run[u.qid] = [u.passage_ids[p] for p in order]
    qrels[u.qid] = {u.passage_ids[p] for p in range(len(u.passage_ids)) if u.passage_rank[p] == 1}
  return rerank_metrics(run, qrels, k=k)


# ----------------------------------------------------------------------------- the loop

def _place(batch_shares, mode, mesh):
  """Put stacked per-device shares on devices for the chosen parallel wrapper."""
  stacked = {k: np.stack([b[k] for b in batch_shares]) for k in batch_shares[0]
             if k != "real_tokens"}
  if mode == "pmap":
    return stacked  # pmap splits the leading device axis itself
  if jax.process_count() > 1:
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(step_lib.AXIS))
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in stacked.items()}
  return step_lib.put_sharded(stacked, mesh)


def _runner(per_device, mode, devices):
  """Wrap the per-device step with pmap or shard_map; return (run, place_state, take_state, mesh)."""
  if mode == "pmap":
    run = step_lib.pmap_step(per_device)
    return run, (lambda s: step_lib.replicate(s, devices)), step_lib.unreplicate, None
  if mode != "shard_map":
    raise ConfigError(f"config.parallel must be 'pmap' or 'shard_map', got {mode!r}")
  # The shard_map path sees a [1, ...] slice of the stacked shares on each device.
  squeeze = lambda st, b: per_device(st, jax.tree_util.tree_map(lambda x: x[0], b))
  all_devices = jax.devices() if jax.process_count() > 1 else devices
  run, mesh = step_lib.shard_map_step(squeeze, all_devices)
  return run, (lambda s: step_lib.put_replicated(s, mesh)), (lambda s: s), mesh


def _guarded_save(ckpt: Checkpointer, step: int, save) -> None:
  """Run a checkpoint save; a failed write (disk full, lost mount) becomes one named error.

  Orbax writes into a temporary folder and renames it only when complete, so the previous
  checkpoints stay intact and the next start resumes from the latest complete one.
  """
  try:
    save()
  except CheckpointError:
    raise
  except Exception as e:  # orbax/tensorstore raise ValueError, OSError, RuntimeError...
    first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
    raise CheckpointError(
        f"cannot write the checkpoint of micro-step {step} under {ckpt.workdir} ({first}); "
        f"the last complete checkpoint is step {ckpt.latest_step()}, and a restart resumes "
        "from it") from None


def _check_workdir_writable(workdir: str) -> None:
  """Create `workdir` and prove it writable now, not after hours of training at the first save."""
  try:
    os.makedirs(workdir, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=workdir)
    os.close(fd)
    os.remove(probe)
  except OSError as e:
    raise ConfigError(f"workdir {workdir} is not a writable folder ({e.strerror or e})") from None


def train_and_evaluate(config, workdir: str) -> Dict[str, Any]:
  """Run one training stage as `config` says, writing checkpoints and logs under `workdir`.

  Args:
    config: an ml_collections ConfigDict from `configs/local_stage.py` or `configs/global_stage.py`.
    workdir: run folder: checkpoints/, best/, metrics.jsonl, tokenizer/, model/ (the export).

  Returns:
    Summary dict: final step, last training loss, last validation metrics, model folder.
  """
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  _check_workdir_writable(workdir)
  if config.stage not in ("local", "global"):
    raise ConfigError(f"config.stage must be 'local' or 'global', got {config.stage!r}")
  devices, proc, nproc = _topology(config)
  num_shards = len(devices) * nproc
  records, report = validate_training_file(config.train_file, skip_invalid=config.skip_invalid)
  val_records = (validate_training_file(config.val_file, skip_invalid=config.skip_invalid)[0]
                 if config.val_file else [])
  pack_cfg = packing_config(config)
  rng = jax.random.PRNGKey(config.seed)

  # Model, params to train and frozen parts.
  frozen_local = None
  if config.stage == "local":
    tokenizer = _tokenizer(config, workdir, records)
    cfg = build_model_config(config, len(tokenizer))
    if config.init_checkpoint:
      cfg = _with_hf_encoder(cfg, config.init_checkpoint)
    units = data_lib.local_units(records)
  else:
    if not config.local_checkpoint:
      raise ConfigError("the global stage needs --config.local_checkpoint=DIR (the local stage's "
                        "workdir, which holds model/)")
    model_dir = os.path.join(config.local_checkpoint, "model")
    if not os.path.isdir(model_dir):
      raise ConfigError(f"config.local_checkpoint={config.local_checkpoint} has no model/ folder; "
                        "pass the workdir of a finished local-stage run")
    local_params, local_cfg, tokenizer = load_model(model_dir)
    cfg = build_model_config(config, len(tokenizer))
    cfg = dataclasses.replace(cfg, local=local_cfg.local,
                              contextual_encoding=local_cfg.contextual_encoding,
                              use_role_head=local_cfg.use_role_head,
                              use_intent_head=local_cfg.use_intent_head)
    frozen_local = jax.tree_util.tree_map(jnp.asarray, local_params["local"])
    units = data_lib.query_units(records)
  val_units = data_lib.query_units(val_records)

  # Micro-batches: fixed groups, each split into per-device shares.
  groups = data_lib.group_micro_batches(len(units), config.micro_batch_size, config.seed)
  my_shards = slice(proc * len(devices), (proc + 1) * len(devices))
  t0 = time.time()
  cache_info = {}
  fp_base = None  # identifies the frozen local model's features when they are cached
  if config.stage == "global" and config.use_feature_cache:
    fp_base = json.dumps({"local": _tree_digest(frozen_local), "max_seq_len": config.max_seq_len,
                          "max_query_tokens": config.max_query_tokens})
    cache_dir = os.path.join(workdir, "feature_cache")
    os.makedirs(cache_dir, exist_ok=True)
    feats, hit = load_or_compute_features(
        os.path.join(cache_dir, f"train-p{proc}.npz"),
        _cache_fingerprint(fp_base, config.train_file),
        lambda: compute_features(cfg, frozen_local, units, tokenizer, pack_cfg,
                                 config.cache_batch_queries))
    cache_info = {"train_cache_hit": hit, "cache_seconds": time.time() - t0}
    n_max = max(len(f["local_score"]) for f in feats)
    q_share = config.micro_batch_size // num_shards
    batches = []
    for g in groups:
      shares = data_lib.split_global_batch(g, config.micro_batch_size, num_shards)[my_shards]
      batches.append([feature_batch([feats[i] for i in s], q_share, n_max) for s in shares])
  else:
    packed = []
    shapes = []
    for g in groups:
      shares = data_lib.split_global_batch(g, config.micro_batch_size, num_shards)[my_shards]
      mb = [data_lib.pack_units([units[i] for i in s], tokenizer, pack_cfg, cfg) if s else None
            for s in shares]
      packed.append(mb)
      shapes += [data_lib.batch_shape(b) for b in mb if b is not None]
    shape = data_lib.max_shape(shapes)
    if nproc > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      shape = tuple(int(x) for x in np.max(multihost_utils.process_allgather(np.asarray(shape)), 0))
    batches = [[data_lib.pad_batch(b, shape) if b is not None else data_lib.empty_batch(shape)
                for b in mb] for mb in packed]
  prep_seconds = time.time() - t0

  # Params, optimizer, state.
  example = {k: jnp.asarray(v) for k, v in batches[0][0].items() if k != "real_tokens"}
  init_rng, rng = jax.random.split(rng)
  if config.stage == "local":
    local_init = LocalScorer(cfg.local_scorer_config).init(
        init_rng, *[example[k] for k in data_lib.TOKEN_FIELDS], example["span_kind"],
        example["span_query"])["params"]
    if config.init_checkpoint:
      local_init = dict(local_init)
      local_init["encoder"] = _hf_encoder_params(config.init_checkpoint, cfg)
    params = {"local": local_init}
    loss_fn, coefs = local_loss_fn(cfg)
  else:
    if config.use_feature_cache:
      feats_ex = example
    else:
      feats_ex = dict(local_features(cfg, frozen_local, example), node_passage=example["node_passage"],
                      node_mask=example["node_mask"])
    q, n = feats_ex["node_mask"].shape
    graph = build_sentence_graph(feats_ex["h"], feats_ex["role_probs"], feats_ex["local_score"],
                                 feats_ex["node_passage"], feats_ex["node_mask"], cfg.graph_build_config)
    params = {"global": GraphReranker(cfg.graph_reranker_config).init(
        init_rng, feats_ex["h"].reshape(q * n, -1), feats_ex["role_probs"].reshape(q * n, 3),
        feats_ex["local_score"].reshape(q * n), graph)["params"]}
    loss_fn, coefs = global_loss_fn(cfg, None if config.use_feature_cache else frozen_local)

  num_mb = len(batches)
  total_micro = num_mb * config.num_epochs
  if config.max_steps:
    total_micro = min(total_micro, config.max_steps)
  total_updates = optim.total_optimizer_steps(num_mb, config.num_epochs, config.grad_accum_steps)
  tx = optim.make_optimizer(config.learning_rate, total_updates, config.warmup_fraction,
                            config.weight_decay, config.grad_accum_steps, config.max_grad_norm,
                            eps=config.adam_eps)
  state = step_lib.create_train_state(params, tx, config.seed)

  ckpt = Checkpointer(workdir, max_to_keep=config.max_to_keep,
                      best_metric=config.best_metric if val_units else None)
  signature = _resume_signature(config)
  if ckpt.latest_step() is not None:
    state, meta = ckpt.restore(state)
    changed = {k: (meta["signature"].get(k), v) for k, v in signature.items()
               if meta["signature"].get(k) != v}
    if changed:
      raise ConfigError(f"cannot resume {workdir}: config changed since the checkpoint: {changed}")

  per_device = step_lib.make_per_device_step(loss_fn, coefs, tx)
  run, place_state, take_state, mesh = _runner(per_device, config.parallel, devices)
  dstate = place_state(state)

  # Evaluation closure.
  eval_fn = _make_eval(config, cfg, val_units, tokenizer, pack_cfg, frozen_local, workdir, fp_base)

  log_path = os.path.join(workdir, "metrics.jsonl")
  log = open(log_path, "a", encoding="utf-8") if proc == 0 else None

  def write(rec):
    if log is not None:
      log.write(json.dumps(rec) + "\n")
      log.flush()

  start = int(jax.device_get(take_state(dstate).step))
  write({"event": "start", "stage": config.stage, "step": start, "micro_batches_per_epoch": num_mb,
         "total_micro_steps": total_micro, "devices": num_shards, "processes": nproc,
         "prep_seconds": prep_seconds, "invalid_records_skipped": report.n_invalid, **cache_info})
  last_loss, val = None, {}
  bar = tqdm(total=total_micro, initial=start, disable=not config.progress_bar or proc != 0,
             desc=f"{config.stage} stage", mininterval=2.0)
  window_t, window_tokens, window_units = time.time(), 0, 0
  for s in range(start, total_micro):
    epoch, idx = divmod(s, num_mb)
    order = np.random.RandomState(config.seed + 1 + epoch).permutation(num_mb)
    shares = batches[order[idx]]
    dstate, metrics = run(dstate, _place(shares, config.parallel, mesh))
    if config.parallel == "pmap":
      metrics = take_state(metrics)  # identical on every device
    metrics = {k: float(np.asarray(jax.device_get(v)).reshape(-1)[0]) for k, v in metrics.items()}
    if not math.isfinite(metrics["loss"]):
      raise TrainingDivergedError(
          f"non-finite loss {metrics['loss']} at micro-step {s + 1} (epoch {epoch}); the last good "
          f"checkpoint is step {ckpt.latest_step()} in {workdir}/checkpoints")
    last_loss = metrics["loss"]
    window_tokens += sum(int(b.get("real_tokens", 0)) for b in shares)
    window_units += len(groups[order[idx]])
    bar.update(1)
    done = s + 1
    if done % config.log_every_steps == 0 or done == total_micro:
      dt = max(time.time() - window_t, 1e-9)
      rec = {"event": "train", "step": done, "epoch": epoch, **metrics,
             "lr": float(optim.warmup_linear_decay(config.learning_rate, total_updates,
                                                   config.warmup_fraction)(done // config.grad_accum_steps)),
             "tokens_per_s": window_tokens / dt, "units_per_s": window_units / dt}
      write(rec)
      bar.set_postfix(loss=f"{last_loss:.4f}")
      window_t, window_tokens, window_units = time.time(), 0, 0
    end_of_epoch = done % num_mb == 0
    do_eval = bool(val_units) and (done == total_micro or (
        config.eval_every_steps and done % config.eval_every_steps == 0) or (
            not config.eval_every_steps and end_of_epoch))
    do_ckpt = done == total_micro or (config.checkpoint_every_steps and
                                      done % config.checkpoint_every_steps == 0)
    if do_eval or do_ckpt:
      host_state = jax.device_get(take_state(dstate))
      meta = {"step": done, "epoch": epoch, "signature": signature}
      if do_eval:
        val = eval_fn(host_state.params)
        write({"event": "val", "step": done, "epoch": epoch, **val})
        _guarded_save(ckpt, done, lambda: ckpt.save_best(done, host_state, meta, val))
      if do_ckpt:
        _guarded_save(ckpt, done, lambda: ckpt.save(done, host_state, meta))
  bar.close()

  # Export the model for inference: the best-by-validation params if any, else the last ones.
  final_state = jax.device_get(take_state(dstate))
  export_params = final_state.params
  source = f"step {int(final_state.step)}"
  if ckpt.best is not None and ckpt.best.best_step() is not None:
    best_state, best_meta = ckpt.restore(final_state, best=True)
    export_params, source = best_state.params, f"best step {best_meta['step']}"
  if config.stage == "global":
    export_params = {"local": jax.device_get(frozen_local), "global": export_params["global"]}
  model_dir = os.path.join(workdir, "model")
  if proc == 0:
    # The packer settings travel with the model so inference packs exactly as training did.
    save_model(model_dir, export_params, cfg, tokenizer,
               info={"stage": config.stage, "source": source, "val": val,
                     "packing": {"row_len": config.max_seq_len,
                                 "max_query_tokens": config.max_query_tokens}})
  ckpt.close()
  write({"event": "end", "step": int(final_state.step), "loss": last_loss, "val": val})
  if log is not None:
    log.close()
  return {"step": int(final_state.step), "loss": last_loss, "val": val, "model_dir": model_dir,
          **cache_info}


def _make_eval(config, cfg, val_units, tokenizer, pack_cfg, frozen_local, workdir, fp_base):
  """Return `params -> metrics` on the validation queries (passage nDCG/MAP/Recall@10)."""
  if not val_units:
    return lambda params: {}
  if config.stage == "local":
    run = jax.jit(lambda p, b: local_features(cfg, p, b)["local_logit"])

    def evaluate(params):
      scores = []
      for group in _query_groups(len(val_units), config.cache_batch_queries):
        share = [val_units[i] for i in group]
        b = data_lib.pack_units(share, tokenizer, pack_cfg, cfg)
        out = np.asarray(run(params["local"], {k: jnp.asarray(v) for k, v in b.items()
                                               if k != "real_tokens"}))
        scores += [out[qi][b["node_mask"][qi]] for qi in range(len(share))]
      return passage_metrics(val_units, scores)
    return evaluate

  if fp_base is not None:
    feats, _ = load_or_compute_features(
        os.path.join(workdir, "feature_cache", f"val-p{jax.process_index()}.npz"),
        _cache_fingerprint(fp_base, config.val_file),
        lambda: compute_features(cfg, frozen_local, val_units, tokenizer, pack_cfg,
                                 config.cache_batch_queries))
  else:
    feats = compute_features(cfg, frozen_local, val_units, tokenizer, pack_cfg,
                             config.cache_batch_queries)
  n_max = max(len(f["local_score"]) for f in feats)
  run = jax.jit(lambda p, b: global_logits_from_features(cfg, p, b, True))

  def evaluate(params):
    scores = []
    for group in _query_groups(len(val_units), config.cache_batch_queries):
      b = feature_batch([feats[i] for i in group], config.cache_batch_queries, n_max)
      out = np.asarray(run(params["global"], {k: jnp.asarray(v) for k, v in b.items()}))
      scores += [out[qi][:len(feats[i]["local_score"])] for qi, i in enumerate(group)]
    return passage_metrics(val_units, scores)
  return evaluate


def _with_hf_encoder(cfg: lr.LoGConfig, path: str) -> lr.LoGConfig:
  """Replace the encoder config by the one of an HF ModernBERT folder (keeping dtype)."""
  from logrerank_jax.models.modernbert import ModernBertConfig  # pylint: disable=g-import-not-at-top
  enc = ModernBertConfig.from_hf(path).replace(dtype=cfg.local.encoder.dtype)
  local = dataclasses.replace(cfg.local, encoder=enc)
  gat = dataclasses.replace(cfg.graph_reranker, d_enc=enc.hidden_size)
  return dataclasses.replace(cfg, local=local, graph_reranker=gat)


def _hf_encoder_params(path: str, cfg: lr.LoGConfig):
  """Load and convert the encoder weights of an HF ModernBERT folder."""
  from logrerank_jax.convert import load_torch_state_dict, modernbert_params_from_torch  # pylint: disable=g-import-not-at-top
  return modernbert_params_from_torch(load_torch_state_dict(path), cfg.local.encoder)
