"""attention_work_efficiency: the attention work each path computes against the work the masks keep.

For every attention path of `ModernBertConfig.attention_impl`, on the benchmark's packed pools
(one query per packed batch, the packer's row buckets, as the engine's latency case), count per
layer type
  needed   = the query x key pairs the mask keeps (real queries x keys of their own segment, and
             within +-window positions on window layers),
  computed = the pairs the path forms, from its own schedule
             (`logrerank_jax.models.attention.block_schedule.computed_pairs`): every [L, L] logit for
             "xla"; neighbouring window blocks for "blocked"/"tiled" on window layers; the visited
             key blocks of the block-skipping GPU kernel for "pallas_gpu" at each block size; the
             blocks splash's static mask keeps for "splash_tpu".
and report needed / computed per layer type and for the whole encoder (layers weighted by their
count in the config's layer pattern). Pure bookkeeping from segment and position ids: the same
on any machine, no accelerator needed. Forward work; the backward passes of "tiled",
"pallas_gpu" and "splash_tpu" revisit the same blocks, so their ratio is the same.
"""

from typing import Any, Dict, Optional, Sequence

from logrerank_bench.common import encoder_config, pool_query
from logrerank_jax.data.packing import PackingConfig, pack_queries
from logrerank_jax.models.encoders import modernbert as mb
from logrerank_jax.models.attention.block_schedule import (GPU_BLOCK, SPLASH_BLOCK, computed_pairs,
                                                  needed_pairs)

# Block sizes counted for the GPU kernel (queries = keys) and for splash.
PALLAS_BLOCKS = (16, 32, 64, 128)
SPLASH_BLOCKS = (128,)


def _paths(pallas_blocks: Sequence[int], splash_blocks: Sequence[int]):
  out = [("xla", "xla", {}), ("blocked", "blocked", {}), ("tiled", "tiled", {})]
  out += [(f"pallas_gpu_b{b}", "pallas_gpu", {"block_q": b, "block_k": b}) for b in pallas_blocks]
  out += [(f"splash_tpu_b{b}", "splash_tpu", {"splash_block": b}) for b in splash_blocks]
  return out


def _used_rows(batch):
  """(segment_ids, position_ids) of the rows holding at least one real token."""
  keep = (batch.segment_ids != 0).any(axis=1)
  return batch.segment_ids[keep], batch.position_ids[keep]


def attention_work(batches, cfg: mb.ModernBertConfig,
                   pallas_blocks: Sequence[int] = PALLAS_BLOCKS,
                   splash_blocks: Sequence[int] = SPLASH_BLOCKS) -> Dict[str, Any]:
  """Work per path on packed batches (objects with `segment_ids`, `position_ids` [R, L]).

  Returns:
    {"paths": {name: {"global": eff, "window": eff, "model": eff, "model_used_rows": eff,
     "computed_pairs": {...}}}, "needed_pairs": {...}, "layers": {...}}; eff = needed / computed.
    `model_used_rows` counts only rows holding a real token (as if the row bucket fitted
    exactly): what the path costs apart from the bucket padding the packer adds.
  """
  kinds = {"global": None, "window": cfg.sliding_window}
  layers = {"global": sum(t == mb.FULL_ATTENTION for t in cfg.layer_types)}
  layers["window"] = cfg.num_hidden_layers - layers["global"]
  rows = {"all": [(b.segment_ids, b.position_ids) for b in batches],
          "used": [_used_rows(b) for b in batches]}
  needed = {k: sum(needed_pairs(s, p, w) for s, p in rows["all"]) for k, w in kinds.items()}
  out: Dict[str, Any] = {"layers": layers, "needed_pairs": needed, "paths": {}}
  model_needed = sum(layers[k] * needed[k] for k in kinds)
  for name, path, kw in _paths(pallas_blocks, splash_blocks):
    res: Dict[str, Any] = {}
    for which, key in (("all", "computed_pairs"), ("used", "computed_pairs_used_rows")):
      res[key] = {k: sum(computed_pairs(path, s, p, w, **kw) for s, p in rows[which])
                  for k, w in kinds.items()}
    res.update({k: needed[k] / res["computed_pairs"][k] for k in kinds})
    res["model"] = model_needed / sum(layers[k] * res["computed_pairs"][k] for k in kinds)
    res["model_used_rows"] = model_needed / sum(layers[k] * res["computed_pairs_used_rows"][k]
                                                for k in kinds)
    out["paths"][name] = res
  return out


def attention_work_suite(pools: Sequence[dict], tokenizer, size: str,
                         row_lens: Sequence[int] = (512, 1024, 2048, 4096),
                         num_passages: Optional[int] = None,
                         pallas_blocks: Sequence[int] = PALLAS_BLOCKS,
                         log=print) -> Dict[str, Any]:
  """attention_work_efficiency per path and row length on packed pools (see the module doc).

  Each query is packed alone (`pack_queries` with the packer's default row buckets) at every row
  length; the top-level `attention_work_efficiency` (path -> whole-encoder efficiency) is that
  of the paper's 1,024-token rows (or the first row length given, if 1,024 is not among them).
  """
  cfg = encoder_config(size, len(tokenizer))
  out: Dict[str, Any] = {"size": size, "queries": len(pools), "window": cfg.sliding_window,
                         "by_row_len": {}}
  for row_len in row_lens:
    pcfg = PackingConfig(row_len=row_len)
    batches, real, computed_tokens, seqs = [], 0, 0, 0
    for pool in pools:
      b, info = pack_queries([pool_query(pool, num_passages)], tokenizer, pcfg)
      batches.append(b)
      real += info.real_tokens
      computed_tokens += b.input_ids.size
      seqs += info.num_sequences
    res = attention_work(batches, cfg, pallas_blocks)
    res.update(padding_efficiency=real / computed_tokens, real_tokens=real, sequences=seqs,
               rows=sum(b.input_ids.shape[0] for b in batches),
               rows_used=sum(int((b.segment_ids != 0).any(axis=1).sum()) for b in batches))
    out["by_row_len"][str(row_len)] = res
    log(f"attention work, rows of {row_len} (used rows only): " + ", ".join(
        f"{k} {v['model']:.3f} ({v['model_used_rows']:.3f})" for k, v in res["paths"].items()))
  main = str(1024 if 1024 in row_lens else row_lens[0])
  out["row_len"] = int(main)
  eff = {k: v["model"] for k, v in out["by_row_len"][main]["paths"].items()}
  # The kernels' default block sizes under the paths' own names (what attention_impl runs).
  for path, block in (("pallas_gpu", GPU_BLOCK), ("splash_tpu", SPLASH_BLOCK)):
    if f"{path}_b{block}" in eff:
      eff[path] = eff[f"{path}_b{block}"]
  out["attention_work_efficiency"] = eff
  out["default_blocks"] = {"pallas_gpu": GPU_BLOCK, "splash_tpu": SPLASH_BLOCK}
  return out
