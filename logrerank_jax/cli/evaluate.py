"""Evaluate passage rerankers on a pool file with qrels: Recall / MAP / nDCG @k side by side.

  logrerank evaluate --pools pools/scifact_pool.jsonl [--qrels pools/scifact.qrels] \
      [--corpus corpus.jsonl] [--bi-encoder ST_DIR] [--checkpoint MODEL_OR_WORKDIR] \
      [--cross-encoder HF_DIR] [--first-stage] --out-dir eval/ [--k 10]

Systems (each a passage ranking per query), printed in this order in one table:
  first-stage    with --first-stage: the pool's own candidate order (the first-stage
                 retriever's ranking; for every pool the project builds, BM25 over the whole
                 corpus: tools/prepare_data.py, build_demo_data.py, build_cs_pools.py)
  bm25           the pool's own `bm25` scores (or BM25 over the pool alone when absent)
  bi-encoder     a sentence-transformers folder used zero-shot (`--bi-encoder`): mean-pooled,
                 L2-normalised embeddings, cosine (`baselines.BiEncoder`)
  cross-encoder  a sequence-classification head from an HF folder (`--cross-encoder`):
                 ModernBERT or BERT, e.g. the `passage` stage's export (configs/passage_stage.py)
  log-local      LoG "w/o global": passages by their best LOCAL sentence logit (`--checkpoint`)
  log            full LoG: passages by their best final (global) sentence logit, i.e. the order
                 of first appearance in the sentence ranking (`--checkpoint`); logits, since
                 float32 sigmoids of sure sentences tie at 1.0
log-local and log come from the same jitted forward of the same checkpoint.  Rankings sort by
decreasing score, ties by passage id (`logrerank_jax.evaluation.ranking_from_scores`); metrics
follow `logrerank_jax.evaluation.rerank_metrics` (the paper's conventions).  Without `--qrels`,
a passage is relevant iff its `label` is 1.  With `--corpus`, pools may name their candidates by
id (`"ctx_ids"`, as logrerank_jax/demo_data ships them); they are resolved against the corpus and
the full pools written to --out-dir/pools.jsonl, which every system then reads.  Writes into --out-dir: metrics.json,
per_query.jsonl (one line per query and system) and run.<system>.trec (TREC run files).

Paired comparison: when the `--paired-against` system (default `log`) was run, metrics.json's
"paired" holds, for every other system, the per-query nDCG@k differences (the
`--paired-against` system minus that system) summarised as mean, wins / losses / ties and a 95 % paired bootstrap
interval of the mean (`scipy.stats.bootstrap`, percentile method, 10,000 resamples of the
queries, fixed seed: the same interval every run), and the table prints them.

`python tools/evaluate.py ARGS` runs this command too (same flags, outputs and exit status).
"""

import argparse
import json
import os
import sys
import time

# The baselines and the engine (JAX) are imported where a system needs them: `--help` and a bad
# flag answer without loading JAX.
from logrerank_jax.data.pool_files import expand_pools, read_corpus, read_pool_file
from logrerank_jax.data.inference_input import parse_inference_record, read_inference_file
from logrerank_jax.errors import DataError, LogRerankError
from logrerank_jax.evaluation import (query_metrics, read_qrels, read_trec_run, rerank_metrics,
                                      run_from_scores, write_trec_run)

def parse_args(argv=None, prog=None):
  """Parse the command line."""
  p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
  p.add_argument("--pools", required=True, help="pool JSONL (tools/prepare_data.py output)")
  p.add_argument("--qrels", default=None, help="TREC qrels (default: ctx label == 1)")
  p.add_argument("--corpus", default=None,
                 help="JSONL {id, title, text} resolving pools' ctx_ids (logrerank_jax.data.pool_files.expand_pools)")
  p.add_argument("--bi-encoder", default=None, help="sentence-transformers BERT folder (zero-shot)")
  p.add_argument("--bi-max-len", type=int, default=None,
                 help="bi-encoder max tokens (default: the folder's sentence_bert_config.json, else 256)")
  p.add_argument("--checkpoint", default=None, help="LoG model folder or training workdir")
  p.add_argument("--cross-encoder", default=None,
                 help="HF ModernBert/BertForSequenceClassification folder (or a passage-stage workdir/model)")
  p.add_argument("--run", action="append", default=[], metavar="NAME=PATH",
                 help="add a system from a TREC run file (e.g. an earlier run.<system>.trec; scores "
                      "are written exactly, so its figures are those of the run that wrote it)")
  p.add_argument("--out-dir", required=True, help="folder for metrics.json, per_query.jsonl, run.*.trec")
  p.add_argument("--first-stage", action="store_true",
                 help="add the system 'first-stage': the pool's own candidate order")
  p.add_argument("--paired-against", default="log",
                 help="system whose per-query nDCG@k is compared with every other (default log)")
  p.add_argument("--bootstrap-resamples", type=int, default=10000,
                 help="resamples of the paired bootstrap (default 10,000)")
  p.add_argument("--k", type=int, default=10, help="metric cut-off (default 10)")
  p.add_argument("--queries-per-batch", type=int, default=4, help="LoG queries per jitted call")
  p.add_argument("--row-len", type=int, default=None,
                 help="LoG packed row length (default: the model's training setting, else 1024)")
  p.add_argument("--max-query-tokens", type=int, default=None,
                 help="LoG query token limit (default: the engine's, 128, what rerank and serve use; "
                      "at most half a row)")
  p.add_argument("--ce-max-len", type=int, default=512, help="cross-encoder max pair length")
  p.add_argument("--ce-batch-size", type=int, default=16, help="cross-encoder pairs per jitted call")
  p.add_argument("--compilation-cache", default=None, help="persistent XLA cache folder")
  p.add_argument("--no-compilation-cache", action="store_true", help="do not use the persistent cache")
  p.add_argument("--no-progress", action="store_true", help="no progress bar")
  return p.parse_args(argv)


def read_pools(path: str):
  """Read a pool file: list of (qid, query, ctxs, raw record), every ctx with a string id."""
  pools = []
  first_line_of: dict = {}
  for line in read_inference_file(path):  # per-line UTF-8 / JSON / schema errors, named by line
    if isinstance(line.record, DataError):
      raise line.record
    where = f"{path}:{line.line}"
    if line.record.skipped:
      # Metrics need every candidate scored by every system: an unusable passage is an error
      # here (tools/rerank.py keeps such a record and skips the passage instead).
      i, why = line.record.skipped[0]
      raise DataError(f"{where}: {line.record.passage_key}[{i}]: {why}; evaluation pools need "
                      "a usable text for every candidate")
    rec = line.raw
    ctxs = [{"text": c} if isinstance(c, str) else c for c in rec.get("ctxs", rec.get("passages"))]
    qid = str(rec.get("id", len(pools)))
    if qid in first_line_of:
      # A repeated query id would silently overwrite the first pool's scores.
      raise DataError(f"{where}: query id {qid!r} repeats the id of line {first_line_of[qid]}")
    first_line_of[qid] = line.line
    ids = [str(c.get("id", i)) for i, c in enumerate(ctxs)]
    if len(set(ids)) != len(ids):
      raise DataError(f"{where}: passage ids repeat within the pool")
    pools.append((qid, rec.get("input", rec.get("question")), ctxs, ids, rec))
  if not pools:
    raise DataError(f"{path}: no pool records")
  return pools


def label_qrels(pools) -> dict:
  """qrels from the pools' `label` fields (relevant iff label == 1)."""
  return {qid: {i for i, c in zip(ids, ctxs) if c.get("label") == 1} for qid, _, ctxs, ids, _ in pools}


def log_scores(args, pools) -> dict:
  """Run the LoG checkpoint once; return {"log-local": {qid: {pid: s}}, "log": {...}} and stats.

  Passages score by their best sentence's LOGIT (local, and final under the engine's "logit"
  score map), not its float32 sigmoid: a sure passage's sentences round to exactly 1.0 there,
  and the tie would be broken by passage id (the demo model's ScholarQA-CS top-10s held 48
  such ties for log-local and 22 for log)."""
  from logrerank_jax import engine as inference  # pylint: disable=g-import-not-at-top
  rr = inference.Reranker.from_pretrained(args.checkpoint, queries_per_batch=args.queries_per_batch,
                                          row_len=args.row_len, max_query_tokens=args.max_query_tokens)
  if rr.cfg.use_global:
    rr.engine.set_score_map("logit")
  parsed = [parse_inference_record(raw, f"pool {qid}") for qid, _, _, _, raw in pools]
  results = rr.score(parsed, progress=not args.no_progress)
  out = {"log-local": {}, "log": {}}
  final = "final" if rr.cfg.use_global else "local_logit"  # a local-stage export: final = local
  for (qid, _, _, ids, _), res in zip(pools, results):
    if isinstance(res, LogRerankError):
      raise DataError(f"LoG could not score query {qid}: {res}")
    for system, which in (("log-local", "local_logit"), ("log", final)):
      out[system][qid] = dict(zip(ids, res.passage_scores(which).tolist()))
  return out, rr.compile_stats()


def _cross_encoder_systems(ce, pools, args, queries_per_call: int = 8) -> dict:
  """{qid: {pid: logit}}: the pairs of `queries_per_call` queries per `score_pairs` call, so that
  the length-bucketed batches fill up (one query's 50 pairs over 3-4 buckets are mostly filler
  rows); the same logits as one call per query."""
  from logrerank_jax import baselines  # pylint: disable=g-import-not-at-top
  out = {}
  chunks = [pools[i:i + queries_per_call] for i in range(0, len(pools), queries_per_call)]
  for chunk in _progress(chunks, f"cross-encoder ({queries_per_call} queries per step)", args):
    pairs = [(q, baselines.passage_string(c)) for _, q, ctxs, _, _ in chunk for c in ctxs]
    scores = ce.score_pairs(pairs).tolist()
    start = 0
    for qid, _, ctxs, ids, _ in chunk:
      out[qid] = dict(zip(ids, scores[start:start + len(ctxs)]))
      start += len(ctxs)
  return out


BOOTSTRAP_SEED = 13  # fixed: a rerun prints the same intervals


def paired_comparison(per_query_a, per_query_b, resamples: int = 10000, seed: int = BOOTSTRAP_SEED,
                      confidence: float = 0.95) -> dict:
  """Paired bootstrap of the mean per-query difference a - b (same queries, same order).

  Resamples queries with replacement (`scipy.stats.bootstrap` on the differences, percentile
  interval); returns {"mean", "low", "high", "wins", "losses", "ties", "queries"}.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  from scipy import stats  # pylint: disable=g-import-not-at-top
  diff = np.asarray(per_query_a, np.float64) - np.asarray(per_query_b, np.float64)
  if diff.ndim != 1 or len(diff) < 2:
    raise DataError(f"a paired bootstrap needs >= 2 queries, got {diff.shape}")
  if np.all(diff == diff[0]):  # every resample has the same mean: a degenerate interval
    low = high = float(diff[0])
  else:
    res = stats.bootstrap((diff,), np.mean, n_resamples=resamples, confidence_level=confidence,
                          method="percentile", vectorized=True,
                          rng=np.random.default_rng(seed))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
  return {"mean": float(diff.mean()), "low": low, "high": high,
          "wins": int(np.sum(diff > 0)), "losses": int(np.sum(diff < 0)),
          "ties": int(np.sum(diff == 0)), "queries": int(len(diff))}


def _per_query_ndcg(scores: dict, qrels: dict, k: int) -> dict:
  """{qid: nDCG@k in percent} over the queries of `qrels` with a relevant passage."""
  run = run_from_scores(scores)
  return {qid: 100.0 * query_metrics(run.get(qid, []), rel, k)["ndcg"] if run.get(qid) else 0.0
          for qid, rel in qrels.items() if rel}


def _progress(pools, name, args):
  """Iterate pools with a progress bar (stderr) unless --no-progress."""
  if args.no_progress:
    return pools
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  return tqdm(pools, desc=name, mininterval=2.0)


def score_systems(args, pools) -> tuple:
  """Every asked-for system's scores, {system: {qid: {pid: score}}} in the table's order, with
  the seconds each model took and the LoG compile stats (None without --checkpoint)."""
  from logrerank_jax import baselines  # pylint: disable=g-import-not-at-top
  systems = {}
  if args.first_stage:
    # The candidate order itself as scores (first = highest); ties cannot occur.
    systems["first-stage"] = {qid: {pid: -float(i) for i, pid in enumerate(ids)}
                              for qid, _, _, ids, _ in pools}
  systems["bm25"] = {qid: dict(zip(ids, baselines.bm25_scores(q, ctxs)))
                     for qid, q, ctxs, ids, _ in pools}
  timings = {}
  if args.bi_encoder:
    t0 = time.time()
    kw = {} if args.bi_max_len is None else {"max_len": args.bi_max_len}
    bi = baselines.BiEncoder.from_pretrained(args.bi_encoder, **kw)
    # Embed every distinct text once, in full batches (BiEncoder caches by text): per query,
    # one query and ~50 passages over several length buckets would mostly be filler rows.
    bi.embed([q for _, q, _, _, _ in pools]
             + [baselines.passage_string(c) for _, _, ctxs, _, _ in pools for c in ctxs])
    systems["bi-encoder"] = {qid: dict(zip(ids, baselines.bi_encoder_scores(bi, q, ctxs)))
                             for qid, q, ctxs, ids, _ in _progress(pools, "bi-encoder", args)}
    timings["bi-encoder"] = time.time() - t0
  if args.cross_encoder:
    t0 = time.time()
    ce = baselines.CrossEncoder.from_pretrained(args.cross_encoder, max_len=args.ce_max_len,
                                                batch_size=args.ce_batch_size)
    systems["cross-encoder"] = _cross_encoder_systems(ce, pools, args)
    timings["cross-encoder"] = time.time() - t0
  stats = None
  if args.checkpoint:
    t0 = time.time()
    log, stats = log_scores(args, pools)
    systems.update(log)
    timings["log"] = time.time() - t0
  for spec in args.run:
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
      raise DataError(f"--run wants NAME=PATH, got {spec!r}")
    systems[name] = {qid: read_trec_run(path).get(qid, {}) for qid, _, _, _, _ in pools}
  order = ("first-stage", "bm25", "bi-encoder", "cross-encoder", "log-local", "log")
  systems = dict(sorted(systems.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order
                                                         else len(order))))
  return systems, timings, stats


def paired_comparisons(args, systems, qrels) -> dict:
  """{system: paired_comparison of the --paired-against system minus it}, over the queries with
  a relevant passage; empty when that system was not run."""
  paired = {}
  if args.paired_against in systems:
    ref = _per_query_ndcg(systems[args.paired_against], qrels, args.k)
    qids = sorted(ref)
    for name, s in systems.items():
      if name != args.paired_against:
        other = _per_query_ndcg(s, qrels, args.k)
        paired[name] = paired_comparison([ref[q] for q in qids], [other[q] for q in qids],
                                         args.bootstrap_resamples)
  return paired


def read_inputs(args) -> tuple:
  """(pools, qrels over the pools' queries, judged queries without a pool); with --corpus the id-only pools are resolved and written to
  --out-dir/pools.jsonl first, and every system reads those."""
  pools_path = args.pools
  if args.corpus:
    pools_path = os.path.join(args.out_dir, "pools.jsonl")
    os.makedirs(args.out_dir, exist_ok=True)
    expanded = expand_pools(read_pool_file(args.pools), read_corpus(args.corpus))
    with open(pools_path, "w", encoding="utf-8") as f:
      for rec in expanded:
        f.write(json.dumps(rec, ensure_ascii=False) + "\n")
  pools = read_pools(pools_path)
  if not args.qrels:
    return pools, label_qrels(pools), []
  qrels = read_qrels(args.qrels)
  # Judged queries without a pool have no ranking: averaged in they would count as 0 (a qrels
  # file of 188 queries over 40 pools printed "40 queries" and averaged over 188). The metrics
  # cover the pools' queries; the others are named on stderr and in metrics.json.
  pooled = {qid for qid, _, _, _, _ in pools}
  unpooled = sorted(q for q, rel in qrels.items() if rel and q not in pooled)
  return pools, {q: rel for q, rel in qrels.items() if q in pooled}, unpooled


def write_outputs(args, pools, qrels, systems, metrics, paired, timings, unpooled) -> None:
  """metrics.json, per_query.jsonl and run.<system>.trec into --out-dir."""
  os.makedirs(args.out_dir, exist_ok=True)
  k = args.k
  with open(os.path.join(args.out_dir, "metrics.json"), "w", encoding="utf-8") as f:
    json.dump({"k": k, "num_queries": len(pools),
               "pool_sizes": sorted({len(ctxs) for _, _, ctxs, _, _ in pools}),
               "metrics": metrics, "seconds": timings,
               "judged_queries_without_pool": unpooled,
               "paired": {"against": args.paired_against, "metric": f"ndcg@{k}",
                          "resamples": args.bootstrap_resamples, "seed": BOOTSTRAP_SEED,
                          "systems": paired}}, f, indent=2)
  with open(os.path.join(args.out_dir, "per_query.jsonl"), "w", encoding="utf-8") as f:
    for name, scores in systems.items():
      run = run_from_scores(scores)
      for qid, ranking in run.items():
        rel = qrels.get(qid, set())
        m = query_metrics(ranking, rel, k) if rel else None
        row = {"qid": qid, "system": name, "num_relevant": len(rel), "ranking": ranking[:k]}
        row.update({f"{n}@{k}": None if m is None else 100.0 * m[n] for n in ("recall", "ap", "ndcg")})
        f.write(json.dumps(row) + "\n")
  for name, scores in systems.items():
    write_trec_run(os.path.join(args.out_dir, f"run.{name}.trec"), scores, tag=name)


def print_table(args, pools, metrics, paired) -> None:
  """The pool summary (stderr), then the metrics table and the paired comparisons (stdout)."""
  k = args.k
  sizes = sorted({len(ctxs) for _, _, ctxs, _, _ in pools})
  print(f"evaluate: {len(pools)} queries, {'/'.join(map(str, sizes))} candidates each",
        file=sys.stderr)
  cols = [f"recall@{k}", f"map@{k}", f"ndcg@{k}"]
  print(f"{'system':<16}" + "".join(f"{c:>12}" for c in cols))
  for name, m in metrics.items():
    print(f"{name:<16}" + "".join(f"{m[c]:>12.2f}" for c in cols))
  if paired:
    print(f"{args.paired_against} minus each system, nDCG@{k} per query: mean [95 % paired "
          f"bootstrap interval] wins/losses/ties")
    for name, d in paired.items():
      print(f"  {name:<14}{d['mean']:>+8.2f} [{d['low']:+.2f}, {d['high']:+.2f}] "
            f"{d['wins']}/{d['losses']}/{d['ties']}")


def main(argv=None, prog=None) -> int:
  """Run the CLI; return the exit status."""
  args = parse_args(argv, prog)
  start = time.time()
  try:
    if args.k < 1:
      raise DataError(f"--k must be >= 1, got {args.k}")
    if not args.no_compilation_cache and (args.checkpoint or args.cross_encoder):
      from logrerank_jax import compilation  # pylint: disable=g-import-not-at-top
      compilation.enable_compilation_cache(args.compilation_cache
                                           or compilation.default_compilation_cache_dir())
    pools, qrels, unpooled = read_inputs(args)
    if unpooled:
      print(f"evaluate: {len(unpooled)} judged queries of {args.qrels} have no pool in "
            f"{args.pools} and are left out of every metric (first: {', '.join(unpooled[:3])})",
            file=sys.stderr)
    systems, timings, stats = score_systems(args, pools)
    metrics = {name: rerank_metrics(run_from_scores(s), qrels, k=args.k) for name, s in systems.items()}
    paired = paired_comparisons(args, systems, qrels)
  except (LogRerankError, OSError) as e:
    print(f"evaluate: error: {e}", file=sys.stderr)
    return 1

  write_outputs(args, pools, qrels, systems, metrics, paired, timings, unpooled)
  print_table(args, pools, metrics, paired)
  extra = "" if stats is None else (f"; LoG XLA compilations {stats['xla_compilations']} over "
                                    f"{stats['forward_calls']} calls")
  print(f"evaluate: {len(pools)} queries, {len(systems)} systems in {time.time() - start:.1f}s{extra}; "
        f"wrote {args.out_dir}", file=sys.stderr)
  return 0
