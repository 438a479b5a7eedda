"""Calibrated scores through the engine: fit a model folder's `calibration.json` on validation
pools, measure it on others, and apply it to a loaded `Reranker` (what `logrerank serve` and
`logrerank calibrate` do; the fit and the ECE are `results.calibration`'s).

A passage's logit is its best sentence's final logit, read on the device ("logit" score map,
`engine.device.set_score_map`): reading sigmoid(z) back and inverting it would lose every logit
above ~17 to float32's 1.0. A passage is relevant when the qrels list it for its query; queries
the qrels do not judge are left out.
"""

from typing import List, Optional, Tuple

import numpy as np

from logrerank_jax.data.inference_input import parse_inference_record
from logrerank_jax.data.pool_files import expand_pools, read_corpus, read_pool_file
from logrerank_jax.engine.reranker import Reranker
from logrerank_jax.errors import DataError, LogRerankError
from logrerank_jax.evaluation import read_qrels
from logrerank_jax.results import calibration as cal_lib


def apply_calibration(rr: Reranker) -> Optional[dict]:
  """Serve the folder's calibrated probability as the final score when `rr.model_dir` holds a
  calibration.json (returned, else None: the raw score stays). `Reranker.from_pretrained`
  applies it already unless told `calibrated=False`; this names it for `logrerank serve`."""
  if rr.calibration is None and rr.model_dir:
    cal = cal_lib.read_calibration(rr.model_dir)
    if cal is not None:
      rr.use_calibration(cal)
  return rr.calibration


def labelled_pools(pools: str, qrels: str, corpus: str = "") -> Tuple[list, List[np.ndarray]]:
  """(parsed records, per record a bool array: is passage i relevant) of the judged queries of
  a pool file (id-only pools resolved against `corpus`)."""
  raw = read_pool_file(pools)
  if corpus:
    raw = expand_pools(raw, read_corpus(corpus))
  judged = read_qrels(qrels)
  records, labels = [], []
  for n, rec in enumerate(raw, start=1):
    qid = str(rec.get("id", n - 1)) if isinstance(rec, dict) else ""
    if qid not in judged:
      continue
    parsed = parse_inference_record(rec, f"{pools}:{n}")
    ctxs = rec.get("ctxs", rec.get("passages")) or []
    ids = [str(c.get("id", i)) if isinstance(c, dict) else str(i) for i, c in enumerate(ctxs)]
    records.append(parsed)
    labels.append(np.asarray([i in judged[qid] for i in ids], bool))
  if not records:
    raise DataError(f"{pools}: no query of the pools is judged in {qrels}")
  return records, labels


def passage_logits(rr: Reranker, records: list, labels: List[np.ndarray]
                   ) -> Tuple[np.ndarray, np.ndarray]:
  """(logits, labels) of every scored passage of `records` (passages without a usable sentence
  are left out: they have no logit)."""
  if not rr.cfg.use_global:
    raise DataError("calibration needs a model with a global stage (its final logit)")
  before = rr.engine.score_map
  rr.engine.set_score_map("logit")
  try:
    scored = rr.score(records)
  finally:
    rr.engine.set_score_map(*before)
  zs, ys = [], []
  for res, lab in zip(scored, labels):
    if isinstance(res, LogRerankError):
      raise DataError(f"the engine could not score query {res}")
    z, y = cal_lib.scored_passage_logits(res.node_passage, res.final_score, lab)
    zs.append(z)
    ys.append(y)
  return np.concatenate(zs), np.concatenate(ys)


def measure(rr: Reranker, pools: str, qrels: str, corpus: str = "",
            cal: Optional[dict] = None) -> dict:
  """ECE of the raw score sigmoid(z) and of `cal`'s calibrated one on these pools."""
  z, y = passage_logits(rr, *labelled_pools(pools, qrels, corpus))
  raw = cal_lib.calibrated(z, 1.0, 0.0)
  out = {"n": int(z.size), "positives": int(y.sum()), "bins": cal_lib.ECE_BINS,
         "ece_raw": cal_lib.expected_calibration_error(raw, y)}
  if cal is not None:
    out["ece_calibrated"] = cal_lib.expected_calibration_error(
        cal_lib.calibrated(z, cal["a"], cal["b"]), y)
  return out


def fit_and_save_calibration(model_dir: str, pools: str, qrels: str, corpus: str = "",
                             **reranker_kwargs) -> dict:
  """Rerank validation pools with the exported model, fit Platt scaling of its final logit,
  and write `calibration.json` into `model_dir` (returned)."""
  rr = Reranker.from_pretrained(model_dir, **reranker_kwargs)
  z, y = passage_logits(rr, *labelled_pools(pools, qrels, corpus))
  return cal_lib.fit_and_write(rr.model_dir, z, y, fitted_on=pools)
