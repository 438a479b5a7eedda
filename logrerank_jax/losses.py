"""Training losses of LoG-Reranker (paper eqs 19-23): listwise local, role KL, pairwise global;
and, not in the paper, a listwise distillation KL towards a teacher's scores.

Every loss is pure `jax.numpy`, safe under `jit`/`pmap`/`vmap`, and returns one scalar.
Computation runs in float32 whatever the input dtype (bf16/f16 inputs are upcast; float64
inputs under `jax.enable_x64` stay float64, which is what finite-difference checks need).
Masked entries never reach an exponential or a logarithm: they are replaced by a constant
with `jnp.where` first, so they get exactly zero gradient even when they hold garbage
such as 1e30 or inf.
"""

import functools
import numbers

import jax
import jax.numpy as jnp

from logrerank_jax.errors import ConfigError, DataError

__all__ = ["listwise_rank_loss", "role_kl_loss", "pairwise_global_loss", "listwise_kl_loss",
           "listwise_kl_per_row"]


def _compute_dtype(*arrays):
  """Return the float dtype to compute in: the inputs' float dtype, at least float32."""
  dtype = jnp.float32
  for a in arrays:
    a_dtype = jnp.result_type(a)  # no device copy just to read a dtype
    if jnp.issubdtype(a_dtype, jnp.floating):
      dtype = jnp.promote_types(dtype, a_dtype)
  return dtype


def _check_shape(name, array, shape):
  """Raise DataError unless `array` has exactly `shape`."""
  if tuple(jnp.shape(array)) != tuple(shape):
    raise DataError(f"{name} has shape {tuple(jnp.shape(array))}, expected {tuple(shape)}")


def _masked_log_softmax(x, mask):
  """Return log_softmax of `x` over the last axis restricted to `mask`; 0 where masked.

  Args:
    x: float array [..., M].
    mask: bool array [..., M]; rows with no valid entry give all zeros.

  Returns:
    Array [..., M] with log-probabilities on valid entries and 0 elsewhere.
  """
  x_safe = jnp.where(mask, x, 0.0)  # garbage in masked slots never reaches exp
  # The shift is mathematically gradient-free; stop_gradient keeps max's subgradient out.
  row_max = jnp.max(jnp.where(mask, x_safe, -jnp.inf), axis=-1, keepdims=True)
  row_max = jax.lax.stop_gradient(jnp.where(jnp.isfinite(row_max), row_max, 0.0))
  shifted = jnp.where(mask, x_safe - row_max, 0.0)
  exp = jnp.where(mask, jnp.exp(shifted), 0.0)
  total = jnp.sum(exp, axis=-1, keepdims=True)
  log_total = jnp.log(jnp.where(total > 0, total, 1.0))  # empty rows: log 1 = 0
  return jnp.where(mask, shifted - log_total, 0.0)


def listwise_rank_loss(logits, ranks, mask, tau=1.0):
  """Return the listwise local ranking loss (eqs 19-20), averaged over non-empty passages.

  For each passage the target is softmax(-rank / tau) over its valid sentences and the
  loss is the cross-entropy -sum(target * log softmax(logits)) over the same sentences.

  Args:
    logits: float [P, M] local logits, one row per passage, M padded sentences.
    ranks: int or float [P, M] gold sentence ranks within the passage, 1 = best; ties allowed.
    mask: bool [P, M], True for real sentences.
    tau: positive temperature of the target distribution.

  Returns:
    Scalar loss (float32); 0 when no passage has a valid sentence.
  """
  if isinstance(tau, numbers.Number) and not tau > 0:
    raise ConfigError(f"listwise_rank_loss: tau must be > 0, got {tau}")
  if jnp.ndim(logits) != 2:
    raise DataError(f"logits must be [P, M], got shape {tuple(jnp.shape(logits))}")
  _check_shape("ranks", ranks, jnp.shape(logits))
  _check_shape("mask", mask, jnp.shape(logits))
  dtype = _compute_dtype(logits)
  logits = jnp.asarray(logits).astype(dtype)  # [P, M]
  mask = jnp.asarray(mask).astype(bool)  # [P, M]
  ranks = jnp.where(mask, jnp.asarray(ranks).astype(dtype), 0.0)  # [P, M]
  target = jnp.exp(_masked_log_softmax(-ranks / tau, mask))  # [P, M]
  target = jnp.where(mask, target, 0.0)
  log_probs = _masked_log_softmax(logits, mask)  # [P, M]
  per_passage = -jnp.sum(jnp.where(mask, target * log_probs, 0.0), axis=-1)  # [P]
  valid = jnp.any(mask, axis=-1)  # [P]
  count = jnp.sum(valid)
  total = jnp.sum(jnp.where(valid, per_passage, 0.0))
  return total / jnp.maximum(count, 1).astype(dtype)


def role_kl_loss(role_logits, target_probs, mask):
  """Return KL(target || softmax(role_logits)) (eq 21) averaged over valid sentences.

  Terms with target probability 0 contribute 0 (0 log 0 = 0). Targets are used as given
  (they are expected to be distributions over the 3 roles).

  Args:
    role_logits: float [P, M, 3] role logits (background, method, result).
    target_probs: float [P, M, 3] target role distributions.
    mask: bool [P, M], True for real sentences.

  Returns:
    Scalar loss (float32); 0 when no sentence is valid.
  """
  if jnp.ndim(role_logits) != 3:
    raise DataError(f"role_logits must be [P, M, R], got shape {tuple(jnp.shape(role_logits))}")
  _check_shape("target_probs", target_probs, jnp.shape(role_logits))
  _check_shape("mask", mask, jnp.shape(role_logits)[:2])
  dtype = _compute_dtype(role_logits, target_probs)
  mask = jnp.asarray(mask).astype(bool)[..., None]  # [P, M, 1]
  full = jnp.broadcast_to(mask, jnp.shape(role_logits))  # [P, M, R]
  log_q = _masked_log_softmax(jnp.asarray(role_logits).astype(dtype), full)  # [P, M, R]
  target = jnp.where(full, jnp.asarray(target_probs).astype(dtype), 0.0)  # [P, M, R]
  positive = target > 0
  log_target = jnp.log(jnp.where(positive, target, 1.0))  # log only where defined
  terms = jnp.where(positive, target * (log_target - log_q), 0.0)  # [P, M, R]
  count = jnp.sum(mask)
  return jnp.sum(terms) / jnp.maximum(count, 1).astype(dtype)


def _pairwise_sums(logits, passage_rank, sentence_rank, passage_ids, mask, max_better_rank=0):
  """Return (sum of -log sigmoid(l_u - l_v) over D_q, |D_q|) for one query's nodes [N]."""
  l = jnp.where(mask, logits, 0.0)  # [N]
  # pairs[u, v]: u should outrank v (eq 23's D_q).
  pairs = (
      mask[:, None] & mask[None, :]
      & (passage_ids[:, None] != passage_ids[None, :])
      & (passage_rank[:, None] < passage_rank[None, :])
      & (sentence_rank[:, None] <= sentence_rank[None, :]))  # [N, N]
  if max_better_rank:
    # Not in the paper: only pairs whose better node's passage ranks in the top K.
    pairs = pairs & (passage_rank[:, None] <= max_better_rank)
  diff = jnp.where(pairs, l[:, None] - l[None, :], 0.0)  # [N, N]
  total = jnp.sum(jnp.where(pairs, -jax.nn.log_sigmoid(diff), 0.0))
  return total, jnp.sum(pairs)


def pairwise_query_losses(logits, passage_rank, sentence_rank, passage_ids, mask,
                          max_better_rank: int = 0):
  """Return each query's pairwise loss (eq 23) and whether it has any pair, for [Q, N] inputs.

  Data-parallel training needs these per query (a sum and a count, not a batch mean) so that
  the global mean does not depend on how queries are split across devices.

  Args:
    logits, passage_rank, sentence_rank, passage_ids, mask: [Q, N], as `pairwise_global_loss`.
    max_better_rank: as `pairwise_global_loss`.

  Returns:
    (per_query [Q] float32 mean over that query's pairs, 0 without pairs; has_pair [Q] bool).
  """
  logits = jnp.asarray(logits)
  dtype = _compute_dtype(logits)
  totals, counts = jax.vmap(functools.partial(_pairwise_sums, max_better_rank=max_better_rank))(
      logits.astype(dtype), jnp.asarray(passage_rank), jnp.asarray(sentence_rank),
      jnp.asarray(passage_ids), jnp.asarray(mask).astype(bool))  # [Q], [Q]
  return totals / jnp.maximum(counts, 1).astype(dtype), counts > 0


def pairwise_global_loss(logits, passage_rank, sentence_rank, passage_ids, mask,
                         max_better_rank: int = 0):
  """Return the pairwise global loss (eq 23): mean -log sigmoid(l_u - l_v) over D_q.

  D_q = {(u, v): u, v valid, different passages, passage_rank[u] < passage_rank[v]
  (u's passage is better), sentence_rank[u] <= sentence_rank[v]}.

  Inputs are either one query's nodes [N] (mean over its pairs; exactly 0 with zero
  gradient when it has no pair) or a batch [Q, N]: each query's mean is computed
  separately (via vmap) and the result averages over the queries that have >= 1 pair.

  Args:
    logits: float [N] or [Q, N] global logits.
    passage_rank: int/float [N] or [Q, N] gold rank of each node's passage (smaller = better).
    sentence_rank: int/float [N] or [Q, N] gold rank of each node within its passage.
    passage_ids: int [N] or [Q, N] passage index of each node.
    mask: bool [N] or [Q, N], True for real nodes.
    max_better_rank: 0 (the paper): every pair of D_q. K > 0 (not in the paper): only the
      pairs whose better node u is in a passage of rank <= K. For weak labels that order only
      the top of a query's passages (the demo's gold paragraphs; the rest of the permutation
      is BM25 or file order), the other pairs teach noise.

  Returns:
    Scalar loss (float32).
  """
  if jnp.ndim(logits) not in (1, 2):
    raise DataError(f"logits must be [N] or [Q, N], got shape {tuple(jnp.shape(logits))}")
  shape = jnp.shape(logits)
  for name, array in (("passage_rank", passage_rank), ("sentence_rank", sentence_rank),
                      ("passage_ids", passage_ids), ("mask", mask)):
    _check_shape(name, array, shape)
  dtype = _compute_dtype(logits)
  logits = jnp.asarray(logits).astype(dtype)
  mask = jnp.asarray(mask).astype(bool)
  args = (logits, jnp.asarray(passage_rank), jnp.asarray(sentence_rank),
          jnp.asarray(passage_ids), mask)
  if len(shape) == 1:
    total, count = _pairwise_sums(*args, max_better_rank=max_better_rank)
    return total / jnp.maximum(count, 1).astype(dtype)
  per_query, has_pair = pairwise_query_losses(*args, max_better_rank=max_better_rank)  # [Q], [Q]
  return jnp.sum(jnp.where(has_pair, per_query, 0.0)) / jnp.maximum(
      jnp.sum(has_pair), 1).astype(dtype)


def listwise_kl_per_row(student_logits, teacher_scores, mask, temperature=1.0):
  """Per-row KL(softmax(teacher / T) || softmax(student)) over each row's valid entries.

  Not in the paper: the distillation term of the demo recipe (README). A row is one query's
  candidates (passages, or sentences); the teacher's scores (e.g. a bi-encoder's cosines) are
  sharpened by `temperature` into a target distribution, the student's logits are used as
  they are. Rows with fewer than two valid entries carry no ranking and give 0 (`has` False).

  Args:
    student_logits: float [R, C].
    teacher_scores: float [R, C] (masked entries may hold anything, even inf).
    mask: bool [R, C].
    temperature: positive teacher temperature.

  Returns:
    (per_row [R] KL >= 0, 0 where `has` is False; has [R] bool).
  """
  if isinstance(temperature, numbers.Number) and not temperature > 0:
    raise ConfigError(f"listwise_kl_per_row: temperature must be > 0, got {temperature}")
  if jnp.ndim(student_logits) != 2:
    raise DataError(f"student_logits must be [R, C], got shape {tuple(jnp.shape(student_logits))}")
  _check_shape("teacher_scores", teacher_scores, jnp.shape(student_logits))
  _check_shape("mask", mask, jnp.shape(student_logits))
  dtype = _compute_dtype(student_logits, teacher_scores)
  mask = jnp.asarray(mask).astype(bool)
  teacher = jnp.where(mask, jnp.asarray(teacher_scores).astype(dtype), 0.0) / temperature
  log_t = _masked_log_softmax(teacher, mask)                                     # [R, C]
  log_s = _masked_log_softmax(jnp.asarray(student_logits).astype(dtype), mask)   # [R, C]
  t = jnp.where(mask, jnp.exp(log_t), 0.0)
  per_row = jnp.sum(jnp.where(mask, t * (log_t - log_s), 0.0), axis=-1)
  has = jnp.sum(mask, axis=-1) >= 2
  return jnp.where(has, per_row, 0.0), has


def listwise_kl_loss(student_logits, teacher_scores, mask, temperature=1.0):
  """Mean over rows with >= 2 valid entries of `listwise_kl_per_row` (0 when there is none)."""
  per_row, has = listwise_kl_per_row(student_logits, teacher_scores, mask, temperature)
  dtype = per_row.dtype
  return jnp.sum(per_row) / jnp.maximum(jnp.sum(has), 1).astype(dtype)
