"""Calibrated scores: Platt scaling of LoG's final logit, its expected calibration error, and
the model folder's `calibration.json`.

LoG ranks by the logit z of its best sentence; the raw score sigmoid(z) is not a probability
of anything (the demo model's logits are 5-14: its top scores all read 1.0). Platt scaling fits
p = sigmoid(a * z + b) to "this passage is relevant" on validation pools (a > 0 keeps the
order), minimising the log-loss. `calibration.json` in a model folder:
    {"method": "platt", "a", "b", "fitted_on", "n", "positives", "bins", "ece_before", "ece_after"}
A folder without it keeps the raw sigmoid(z).

Pure numpy: the engine (`engine.calibration`) gives the logits, the serving door reads the file.
"""

import json
import math
import os
from typing import Optional, Tuple

import numpy as np

from logrerank_jax.errors import DataError
from logrerank_jax.ranking import passage_scores

FILE_NAME = "calibration.json"
ECE_BINS = 10  # equal-width bins over [0, 1]


def _sigmoid(x: np.ndarray) -> np.ndarray:
  return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow warning for large |x|


def _log_loss(a: float, b: float, z: np.ndarray, t: np.ndarray) -> float:
  s = a * z + b
  # log(1 + e^s) - t s, written stably
  return float(np.mean(np.logaddexp(0.0, s) - t * s))


def fit_platt(logits, labels, iterations: int = 100) -> Tuple[float, float]:
  """Fit (a, b) of p = sigmoid(a * z + b) to binary labels by Newton's method on the log-loss.

  Targets are Platt's (1999): (N+ + 1) / (N+ + 2) for positives, 1 / (N- + 2) for negatives,
  which keeps (a, b) finite when the scores separate the labels (a validation set's top
  passages often do).

  Raises:
    DataError: fewer than 2 scores, a non-finite one, labels of one class only, or a fit whose
      slope is not positive (the scores rank relevant passages below the others).
  """
  z = np.asarray(logits, np.float64).ravel()
  y = np.asarray(labels, bool).ravel()
  if z.shape != y.shape or z.size < 2:
    raise DataError(f"calibration: need as many labels as scores, at least 2 (got {z.size} "
                    f"scores, {y.size} labels)")
  if not np.all(np.isfinite(z)):
    raise DataError("calibration: a score is not finite")
  n_pos = int(y.sum())
  if n_pos == 0 or n_pos == y.size:
    raise DataError(f"calibration: labels of one class only ({n_pos} relevant of {y.size})")
  t = np.where(y, (n_pos + 1.0) / (n_pos + 2.0), 1.0 / (y.size - n_pos + 2.0))
  x = np.stack([z, np.ones_like(z)], axis=1)
  a, b = 1.0 / max(float(np.std(z)), 1e-6), -float(np.mean(z)) / max(float(np.std(z)), 1e-6)
  loss = _log_loss(a, b, z, t)
  for _ in range(iterations):
    p = _sigmoid(a * z + b)
    grad = x.T @ (p - t) / z.size
    hess = (x * (p * (1.0 - p))[:, None]).T @ x / z.size + 1e-12 * np.eye(2)
    step = np.linalg.solve(hess, grad)
    scale = 1.0
    while scale > 1e-8:  # backtracking: Newton's step can overshoot far from the optimum
      na, nb = a - scale * step[0], b - scale * step[1]
      new = _log_loss(na, nb, z, t)
      if new <= loss:
        break
      scale *= 0.5
    else:
      break
    done = loss - new < 1e-14
    a, b, loss = float(na), float(nb), new
    if done:
      break
  if not (a > 0 and math.isfinite(a) and math.isfinite(b)):
    raise DataError(f"calibration: fitted slope a={a:g} is not positive; the scores do not rank "
                    "relevant passages first on this data")
  return a, b


def calibrated(logits, a: float, b: float) -> np.ndarray:
  """The calibrated probabilities sigmoid(a * z + b) (float64)."""
  return _sigmoid(a * np.asarray(logits, np.float64) + b)


def expected_calibration_error(probs, labels, bins: int = ECE_BINS) -> float:
  """ECE: over `bins` equal-width bins of the predicted probability ([k/bins, (k+1)/bins), the
  last one closed), the mean |mean predicted - fraction relevant| weighted by the bin's share
  of the scores."""
  p = np.asarray(probs, np.float64).ravel()
  y = np.asarray(labels, np.float64).ravel()
  if p.size == 0 or p.shape != y.shape:
    raise DataError(f"ECE: need as many labels as probabilities, at least 1 (got {p.size}, "
                    f"{y.size})")
  which = np.minimum((p * bins).astype(np.int64), bins - 1)
  ece = 0.0
  for k in range(bins):
    in_bin = which == k
    if in_bin.any():
      ece += in_bin.mean() * abs(p[in_bin].mean() - y[in_bin].mean())
  return float(ece)


def read_calibration(model_dir: str) -> Optional[dict]:
  """The folder's calibration.json, checked; None when it has none.

  Raises:
    DataError: the file is not JSON, or `method`, `a` or `b` is wrong (named).
  """
  path = os.path.join(model_dir, FILE_NAME)
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      cal = json.load(f)
  except (OSError, ValueError) as e:
    raise DataError(f"{path}: not a readable JSON file ({e})") from None
  if not isinstance(cal, dict) or cal.get("method") != "platt":
    raise DataError(f"{path}: 'method' must be \"platt\"")
  for key in ("a", "b"):
    v = cal.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
      raise DataError(f"{path}: '{key}' must be a finite number, got {v!r}")
  if cal["a"] <= 0:
    raise DataError(f"{path}: 'a' must be > 0 (a calibration keeps LoG's order), got {cal['a']}")
  return cal


def write_calibration(model_dir: str, cal: dict) -> str:
  """Write calibration.json into the folder (atomically: a temp file renamed); its path."""
  path = os.path.join(model_dir, FILE_NAME)
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(cal, f, indent=2)
    f.write("\n")
  os.replace(tmp, path)
  return path


def scored_passage_logits(node_passage, node_scores, labels) -> Tuple[np.ndarray, np.ndarray]:
  """(logits, labels) of one query's passages that have a scored sentence: each passage's best
  sentence score (`ranking.passage_scores`); passages without one have no logit and are left
  out. What both calibration paths fit on: the engine's (`engine.calibration.passage_logits`)
  and the global stage's validation logits (`training.stages.validation`)."""
  labels = np.asarray(labels, bool)
  has = np.zeros(len(labels), bool)
  has[np.asarray(node_passage, np.int64)] = True
  return passage_scores(node_passage, node_scores, len(labels))[has], labels[has]


def fit_and_write(model_dir: str, logits, labels, fitted_on: str) -> dict:
  """Fit Platt scaling to (logits, labels), write the folder's calibration.json and return it
  (with the ECE before, of the raw sigmoid(z), and after).

  Raises:
    DataError: `fit_platt`'s refusals.
  """
  z = np.asarray(logits, np.float64).ravel()
  y = np.asarray(labels, bool).ravel()
  a, b = fit_platt(z, y)
  cal = {"method": "platt", "a": a, "b": b, "fitted_on": fitted_on, "n": int(z.size),
         "positives": int(y.sum()), "bins": ECE_BINS,
         "ece_before": expected_calibration_error(calibrated(z, 1.0, 0.0), y),
         "ece_after": expected_calibration_error(calibrated(z, a, b), y)}
  write_calibration(model_dir, cal)
  return cal
