"""The global stage's cache of frozen local outputs: computed once, stored on disk, reused.

The global stage freezes the local model, so its per-sentence outputs (h, role distribution,
local score and logit) are the same every epoch. They are computed once per data file, written
as one `.npz` (no pickle) keyed by a fingerprint of the frozen params, the packer settings and
the file's bytes, and read back on the next epoch, run or resume. A changed model or file
changes the fingerprint and the cache is rebuilt; so is a cache written before the global stage
read one of today's keys (it would lack that key).
"""

import dataclasses
import hashlib
import json
import logging
import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from logrerank_jax.errors import DataError
from logrerank_jax.models.log_reranker import GLOBAL_FEATURE_KEYS, LoGConfig, LoGReranker
from logrerank_jax.schema import NUM_ROLES
from logrerank_jax.training import data as data_lib

log = logging.getLogger(__name__)

# Per-node label arrays stored next to the features.
_LABELS = ("node_passage", "sentence_rank", "passage_rank")
# What every cached query holds: the features the global stage reads (`GLOBAL_FEATURE_KEYS`,
# the cached subset of `LoGReranker.local_nodes`) and its labels. A cache file lacking one was
# written by an older version.
CACHED_KEYS = GLOBAL_FEATURE_KEYS + _LABELS


def query_groups(n: int, size: int) -> List[List[int]]:
  """Consecutive groups of `size` indices covering range(n)."""
  return [list(range(i, min(n, i + size))) for i in range(0, n, size)]


def local_features(cfg: LoGConfig, local_params, batch) -> Dict[str, jax.Array]:
  """Run the frozen local model (no dropout): node features [Q, N, ...] (`GLOBAL_FEATURE_KEYS`)."""
  nodes = LoGReranker(cfg).apply({"params": {"local": local_params}}, batch, True,
                                 method=LoGReranker.local_nodes)
  return {k: nodes[k] for k in GLOBAL_FEATURE_KEYS}


def compute_features(cfg: LoGConfig, local_params, units, tokenizer, packing_cfg,
                     group_size: int) -> List[Dict[str, np.ndarray]]:
  """Run the frozen local model over query units; return per-query node features and labels.

  The training packer's whole-query path: the global stage computed its cache this way until
  it moved to the engine (`engine_features`); kept as the reference the engine's features are
  tested against (tests/test_global_features.py)."""
  run = jax.jit(lambda p, b: local_features(cfg, p, b))
  groups = query_groups(len(units), group_size)

  def pack(group):
    return data_lib.pack_units([units[i] for i in group], tokenizer, packing_cfg,
                               cfg.contextual_encoding)
  # Each group is padded to its row bucket's largest shape: one compile per bucket, where the
  # groups' own shapes (spans, nodes) would nearly all differ and each compile anew.
  shapes = data_lib.bucketed_shapes([data_lib.batch_shape(pack(g)) for g in groups],
                                    data_lib.rows_bucket)
  out = []
  for group, shape in zip(groups, shapes):
    share = [units[i] for i in group]
    b = data_lib.pad_batch(pack(group), shape)
    feats = jax.device_get(run(local_params, {k: jnp.asarray(v) for k, v in b.items()
                                              if k != "real_tokens"}))
    for qi in range(len(share)):
      m = b["node_mask"][qi]
      item = {k: np.asarray(v[qi][m]) for k, v in feats.items()}
      for k in _LABELS:
        item[k] = b[k][qi][m]
      out.append(item)
  return out


def local_reranker(cfg: LoGConfig, params, tokenizer, row_len: int, max_query_tokens: int):
  """The inference engine over a model's local stage alone (`engine.EngineCore`, the core of
  `Reranker`, use_global off), packing as a training run with these row and query limits
  packs: what the local stage's validation and the global stage's feature cache both score
  through."""
  from logrerank_jax.engine import EngineCore, default_packing_config  # pylint: disable=g-import-not-at-top
  local_cfg = dataclasses.replace(cfg, use_global=False)
  return EngineCore(params, local_cfg, tokenizer, host_workers=0,
                    packing=default_packing_config(local_cfg, row_len, max_query_tokens))


def engine_features(cfg: LoGConfig, local_params, units, tokenizer, row_len: int,
                    max_query_tokens: int) -> List[Dict[str, np.ndarray]]:
  """The frozen local model's per-query node features and labels, computed by the inference
  engine (`EngineCore.local_nodes`): the calls, row buckets and node order (passage, then
  sentence) that `tools/evaluate.py` and the server give the exported model, so the GAT trains
  on the features it will be fed. Each call is filled with the passages of several queries in
  fine row buckets, where `compute_features` padded whole groups of queries to power-of-two
  row buckets (the demo's SciFact validation pools: about 4x the time).

  Raises:
    DataError: a unit the engine cannot score, or whose node count per passage is not its
      sentence count (a node would lose its labels).
  """
  rr = local_reranker(cfg, {"local": local_params}, tokenizer, row_len, max_query_tokens)
  return reranker_features(rr, units)


def reranker_features(rr, units) -> List[Dict[str, np.ndarray]]:
  """`engine_features` through an existing `local_reranker` (its params as they are now): the
  local stage validates through this, and keeps the result for the global stage. `rr` is an
  `engine.EngineCore`: its `chunks` (those `score` scores) and `local_nodes`."""
  out: List[Dict[str, np.ndarray]] = []
  for chunk in rr.chunks(len(units)):
    share = [units[i] for i in chunk]
    nodes = rr.local_nodes([data_lib.unit_record(u) for u in share])[0]
    for u, ns in zip(share, nodes):
      ns.sort(key=lambda t: (t[0], t[1]))  # passage order, as one joint packing gives them
      counts = np.bincount([t[0] for t in ns], minlength=len(u.passage_ids))
      want = [len(p) for p in u.query.passages]
      if counts.tolist() != want:
        raise DataError(f"query {u.qid}: the engine gave {counts.tolist()} sentence nodes per "
                        f"passage, the record has {want}")
      pis = np.asarray([t[0] for t in ns], np.int32)
      labels = data_lib.node_labels([u], pis[None], np.asarray([[t[1] for t in ns]], np.int32))
      out.append({"h": np.stack([t[2] for t in ns]).astype(np.float32),
                  "role_probs": np.stack([t[3] for t in ns]).astype(np.float32),
                  "local_score": np.asarray([t[4] for t in ns], np.float32),
                  "local_logit": np.asarray([t[5] for t in ns], np.float32),
                  "node_passage": pis, "sentence_rank": labels["sentence_rank"][0],
                  "passage_rank": labels["passage_rank"][0]})
  return out


def read_features(path: str, fingerprint: str) -> Optional[List[Dict[str, np.ndarray]]]:
  """The per-query features stored at `path` (`write_features`), or None: no file, another
  fingerprint, or a file written before the global stage read one of `CACHED_KEYS` (e.g.
  `local_logit`, which residual_local adds to the GAT's output; reading it would feed the GAT
  zeros for the missing key)."""
  if not os.path.exists(path):
    return None
  with np.load(path, allow_pickle=False) as z:
    if str(z["fingerprint"]) != fingerprint:
      return None
    missing = [k for k in CACHED_KEYS if k not in z.files]
    if missing:
      log.warning("feature cache %s lacks %s (written by an older version): recomputing it",
                  path, ", ".join(missing))
      return None
    offsets = z["offsets"]
    keys = [k for k in z.files if k not in ("fingerprint", "offsets")]
    arrays = {k: z[k] for k in keys}
  return [{k: arrays[k][offsets[i]:offsets[i + 1]] for k in keys}
          for i in range(len(offsets) - 1)]


def write_features(path: str, fingerprint: str, items: List[Dict[str, np.ndarray]]) -> None:
  """Store per-query features under `fingerprint`, atomically (temp file + rename)."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  offsets = np.cumsum([0] + [len(it["local_score"]) for it in items])
  arrays = {k: np.concatenate([it[k] for it in items]) for k in items[0]}
  tmp = path + ".tmp.npz"
  np.savez(tmp, fingerprint=np.asarray(fingerprint), offsets=offsets, **arrays)
  os.replace(tmp, path)


def load_or_compute_features(path: str, fingerprint: str,
                             compute: Callable[[], List[Dict[str, np.ndarray]]]
                             ) -> Tuple[List[Dict[str, np.ndarray]], bool]:
  """Return (per-query features, True) from `path` if its fingerprint matches (`read_features`),
  else compute and store them and return (features, False). A stale file, or one that lacks
  one of `CACHED_KEYS`, is recomputed and overwritten."""
  items = read_features(path, fingerprint)
  if items is not None:
    return items, True
  items = compute()
  write_features(path, fingerprint, items)
  return items, False


def with_unit_labels(item: Dict[str, np.ndarray], unit) -> Dict[str, np.ndarray]:
  """A query's cached features plus its distillation labels (`data.TEACHER_KEYS`) per node,
  from its unit: the teacher score of each node's passage, and whether it has gold labels."""
  m = len(item["local_score"])
  teacher = (np.asarray(unit.teacher, np.float32)[item["node_passage"]] if unit.teacher
             else np.zeros((m,), np.float32))
  return dict(item, passage_teacher=teacher, has_teacher=np.full((m,), bool(unit.teacher)),
              gold_labels=np.full((m,), bool(unit.gold)))


def feature_batch(items: Sequence[Dict[str, np.ndarray]], q: int, n: int,
                  qids: Optional[Sequence[str]] = None) -> Dict[str, np.ndarray]:
  """Assemble cached query features into one [q, n] share (padding slots inert).

  Items without distillation labels (`with_unit_labels`) get none: no teacher, gold labels.

  Args:
    items: per-query features and labels (`compute_features` / `load_or_compute_features`).
    q, n: the share's query slots and nodes per query.
    qids: the items' query ids, to name a bad item (default: its position in `items`).

  Raises:
    DataError: an item lacks one of `CACHED_KEYS` (names the key and the query): a zero-filled
      `local_logit` would silently become a residual model's local ranking.
  """
  for qi, it in enumerate(items):
    missing = [k for k in CACHED_KEYS if k not in it]
    if missing:
      who = repr(qids[qi]) if qids is not None else f"#{qi} of this batch"
      raise DataError(f"cached features of query {who} lack {missing[0]!r}; delete the feature "
                      "cache (workdir/feature_cache/) to recompute it")
  d = items[0]["h"].shape[-1] if items else 1
  out = {"h": np.zeros((q, n, d), np.float32),
         "role_probs": np.zeros((q, n, NUM_ROLES), np.float32),
         "local_score": np.zeros((q, n), np.float32), "local_logit": np.zeros((q, n), np.float32),
         "node_passage": np.full((q, n), -1, np.int32), "node_mask": np.zeros((q, n), bool),
         "sentence_rank": np.zeros((q, n), np.int32), "passage_rank": np.zeros((q, n), np.int32),
         "passage_teacher": np.zeros((q, n), np.float32), "has_teacher": np.zeros((q, n), bool),
         "gold_labels": np.zeros((q, n), bool)}
  for qi, it in enumerate(items):
    m = len(it["local_score"])
    for k in CACHED_KEYS:
      out[k][qi, :m] = it[k]
    for k in ("passage_teacher", "has_teacher"):  # distillation labels are optional
      if k in it:
        out[k][qi, :m] = it[k]
    out["gold_labels"][qi, :m] = it["gold_labels"] if "gold_labels" in it else True
    out["node_mask"][qi, :m] = True
  return out


def file_digest(path: str) -> str:
  """Short sha256 of a file's bytes."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      h.update(chunk)
  return h.hexdigest()[:16]


def tree_digest(tree) -> str:
  """Short sha256 of a param tree's float32 values (identifies the frozen local model)."""
  h = hashlib.sha256()
  for leaf in jax.tree_util.tree_leaves(tree):
    h.update(np.ascontiguousarray(np.asarray(leaf, np.float32)).tobytes())
  return h.hexdigest()[:16]


def cache_fingerprint(fp_base: str, data_file: str, extra_file: str = "") -> str:
  """The cache key of the features of `data_file` (read with `extra_file`, e.g. the corpus of
  id-only pools) under the frozen model `fp_base` (`frozen_local_base`)."""
  base = fp_base + (file_digest(extra_file) if extra_file else "")
  return hashlib.sha256((base + file_digest(data_file)).encode()).hexdigest()


def frozen_local_base(local_params, local_cfg, row_len: int, max_query_tokens: int) -> str:
  """What identifies a frozen local model's features apart from the data (`cache_fingerprint`'s
  `fp_base`): its params, its local config (switches without params, e.g. score_temperature,
  change the features of the same params) and the packing limits. The local stage writes its
  kept validation's features under it, the global stage looks them up with it."""
  return json.dumps({"local": tree_digest(local_params), "local_config": repr(local_cfg),
                     "max_seq_len": row_len, "max_query_tokens": max_query_tokens,
                     # computed by the inference engine (engine_features); a cache of the
                     # older whole-group packing is recomputed
                     "features": "engine"})


def val_sources(config) -> Tuple[str, str]:
  """(data file, extra file) the validation units of a training config are read from: the
  pool file and its corpus, or `val_file` and nothing (what the validation cache is keyed by)."""
  pools = config.get("val_pools", "")
  return (pools, config.get("val_corpus", "")) if pools else (config.val_file, "")


# Where a local-stage run leaves the frozen features of its exported model's validation
# (relative to its workdir): the global stage's validation cache, computed already.
LOCAL_VAL_FEATURES = os.path.join("feature_cache", "val-exported-model.npz")
