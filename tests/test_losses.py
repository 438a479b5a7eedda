"""Tests of the listwise, role-KL and pairwise losses against NumPy references and by hand."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from logrerank_jax import losses
from logrerank_jax.errors import ConfigError, DataError

# float32 forward values vs float64 NumPy references. Derivation: a loss is a log-sum-exp / mean
# over <= ~40 O(1) terms; float32 rounds each op to eps = 1.19e-7 relative and the sums add
# ~sqrt(n) eps: ~1e-6 relative/absolute on O(1) losses; 2e-6 bounds it. Measured <= 2.8e-7
# (ratio to the bound <= 0.054) with the default, AVX2 and SSE4.2 kernels.
F32_RTOL, F32_ATOL = 2e-6, 2e-6
# float64 analytic gradients vs central finite differences (step h = 1e-6): truncation
# h^2 |f'''| / 6 ~ 1e-13 plus cancellation eps64 |f| / h ~ 2e-16 / 1e-6 = 2e-10, so 1e-7 is
# derived with a 500x margin (measured 2.2e-10). float64 throughout: ISA-independent.
FD_STEP, FD_ATOL = 1e-6, 1e-7
# Known answers (log 2, log 3, entropies) in float32: a handful of rounded ops on O(1) values,
# each <= eps = 1.19e-7 relative: rtol 1e-6 (measured <= 1.3e-7 relative, 7.7x).
KNOWN_RTOL = 1e-6

# Value tests call jitted losses (one compile per shape instead of one per primitive);
# test_jit_matches_eager checks the un-jitted path.
LISTWISE = jax.jit(losses.listwise_rank_loss, static_argnames="tau")
ROLE_KL = jax.jit(losses.role_kl_loss)
PAIRWISE = jax.jit(losses.pairwise_global_loss)


# ---------------------------------------------------------------- NumPy references (float64)


def np_listwise(logits, ranks, mask, tau):
  """Listwise loss with explicit loops over passages."""
  per_passage = []
  for p in range(logits.shape[0]):
    idx = np.flatnonzero(mask[p])
    if idx.size == 0:
      continue
    t = np.exp(-ranks[p, idx].astype(np.float64) / tau)
    t /= t.sum()
    x = logits[p, idx].astype(np.float64)
    log_p = x - x.max() - np.log(np.sum(np.exp(x - x.max())))
    per_passage.append(-np.sum(t * log_p))
  return float(np.mean(per_passage)) if per_passage else 0.0


def np_role_kl(role_logits, target, mask):
  """Role KL with explicit loops over valid sentences."""
  values = []
  for p, m in zip(*np.nonzero(mask)):
    x = role_logits[p, m].astype(np.float64)
    log_q = x - x.max() - np.log(np.sum(np.exp(x - x.max())))
    kl = 0.0
    for c in range(x.size):
      if target[p, m, c] > 0:
        kl += target[p, m, c] * (math.log(target[p, m, c]) - log_q[c])
    values.append(kl)
  return float(np.mean(values)) if values else 0.0


def np_pairwise(logits, prank, srank, pids, mask):
  """Pairwise global loss with a double loop over node pairs."""
  values = []
  n = logits.shape[0]
  for u in range(n):
    for v in range(n):
      if (mask[u] and mask[v] and pids[u] != pids[v] and prank[u] < prank[v]
          and srank[u] <= srank[v]):
        d = float(logits[u]) - float(logits[v])
        values.append(math.log1p(math.exp(-d)))  # -log sigmoid(d)
  return float(np.mean(values)) if values else 0.0


# ---------------------------------------------------------------- random inputs


def listwise_inputs(seed, p=5, m=7, dtype=np.float32):
  """Random logits, tied ranks, a ragged mask with one fully masked passage."""
  rng = np.random.default_rng(seed)
  logits = rng.normal(scale=2.0, size=(p, m)).astype(dtype)
  ranks = rng.integers(1, 4, size=(p, m)).astype(np.int32)  # many ties
  lengths = rng.integers(1, m + 1, size=p)
  lengths[1] = 0  # a fully masked passage
  mask = np.arange(m)[None, :] < lengths[:, None]
  return logits, ranks, mask


def role_inputs(seed, p=4, m=6, dtype=np.float32):
  """Random role logits, targets with exact zeros (one-hot and soft), ragged mask."""
  rng = np.random.default_rng(seed)
  logits = rng.normal(scale=2.0, size=(p, m, 3)).astype(dtype)
  target = rng.dirichlet(np.ones(3), size=(p, m))
  onehot = np.eye(3)[rng.integers(0, 3, size=(p, m))]
  target = np.where(rng.random((p, m, 1)) < 0.4, onehot, target).astype(dtype)
  lengths = rng.integers(0, m + 1, size=p)
  lengths[0] = 0  # a fully masked passage
  lengths[-1] = max(lengths[-1], 1)  # and at least one valid sentence
  mask = np.arange(m)[None, :] < lengths[:, None]
  return logits, target, mask


def pairwise_inputs(seed, n=12, dtype=np.float32):
  """Random logits over 4 passages with tied passage and sentence ranks, some masked nodes."""
  rng = np.random.default_rng(seed)
  logits = rng.normal(scale=2.0, size=n).astype(dtype)
  pids = np.sort(rng.integers(0, 4, size=n)).astype(np.int32)
  prank = np.array([2, 1, 3, 1], np.int32)[pids]  # passages 1 and 3 tie
  srank = rng.integers(1, 4, size=n).astype(np.int32)
  mask = rng.random(n) < 0.8
  return logits, prank, srank, pids, mask


# ---------------------------------------------------------------- values vs NumPy


@pytest.mark.parametrize("seed,tau", [(0, 1.0), (1, 0.5), (2, 3.0)], ids=["tau1", "tau0.5", "tau3"])
def test_listwise_matches_numpy(seed, tau):
  logits, ranks, mask = listwise_inputs(seed)
  got = LISTWISE(logits, ranks, mask, tau=tau)
  assert got.dtype == jnp.float32 and got.shape == ()
  np.testing.assert_allclose(float(got), np_listwise(logits, ranks, mask, tau),
                             rtol=F32_RTOL, atol=F32_ATOL)


@pytest.mark.parametrize("seed", [0, 1, 2], ids=["seed0", "seed1", "seed2"])
def test_role_kl_matches_numpy(seed):
  logits, target, mask = role_inputs(seed)
  got = ROLE_KL(logits, target, mask)
  assert got.dtype == jnp.float32 and got.shape == ()
  np.testing.assert_allclose(float(got), np_role_kl(logits, target, mask),
                             rtol=F32_RTOL, atol=F32_ATOL)


@pytest.mark.parametrize("seed", [0, 1, 2], ids=["seed0", "seed1", "seed2"])
def test_pairwise_matches_numpy(seed):
  args = pairwise_inputs(seed)
  want = np_pairwise(*args)
  assert want > 0  # the random query does have pairs
  got = PAIRWISE(*args)
  assert got.dtype == jnp.float32 and got.shape == ()
  np.testing.assert_allclose(float(got), want, rtol=F32_RTOL, atol=F32_ATOL)


def test_pairwise_batched_averages_queries_with_pairs():
  queries = [pairwise_inputs(s) for s in range(3)]
  no_pair = list(pairwise_inputs(9))
  no_pair[1] = np.ones_like(no_pair[1])  # every passage tied: no pair at all
  queries.append(tuple(no_pair))
  stacked = [np.stack(parts) for parts in zip(*queries)]
  got = PAIRWISE(*stacked)
  want = np.mean([np_pairwise(*q) for q in queries[:3]])
  assert np_pairwise(*queries[3]) == 0.0
  np.testing.assert_allclose(float(got), want, rtol=F32_RTOL, atol=F32_ATOL)


# ---------------------------------------------------------------- known answers by hand


def test_listwise_known_answers():
  # Uniform prediction over 2 sentences: cross-entropy = log 2 whatever the target.
  got = LISTWISE(jnp.zeros((1, 2)), jnp.array([[1, 2]]), jnp.ones((1, 2), bool))
  np.testing.assert_allclose(float(got), math.log(2.0), rtol=KNOWN_RTOL)
  # Prediction equal to the target: loss = entropy of softmax([-1, -2]).
  t1 = 1.0 / (1.0 + math.exp(-1.0))
  entropy = -(t1 * math.log(t1) + (1 - t1) * math.log(1 - t1))
  got = LISTWISE(jnp.array([[-1.0, -2.0, 55.0]]), jnp.array([[1, 2, 3]]),
                 jnp.array([[True, True, False]]))
  np.testing.assert_allclose(float(got), entropy, rtol=KNOWN_RTOL)
  # Two passages average: log 2 and log 3 (uniform logits, any targets).
  mask = jnp.array([[True, True, False], [True, True, True]])
  got = LISTWISE(jnp.zeros((2, 3)), jnp.ones((2, 3)), mask)
  np.testing.assert_allclose(float(got), (math.log(2) + math.log(3)) / 2, rtol=KNOWN_RTOL)


def test_role_kl_known_answers():
  one_hot = jnp.array([[[1.0, 0.0, 0.0]]])
  got = ROLE_KL(jnp.zeros((1, 1, 3)), one_hot, jnp.ones((1, 1), bool))
  np.testing.assert_allclose(float(got), math.log(3.0), rtol=KNOWN_RTOL)
  logits = jnp.array([[[0.3, -1.2, 2.0]]])
  got = ROLE_KL(logits, jax.nn.softmax(logits), jnp.ones((1, 1), bool))
  assert abs(float(got)) < 1e-6  # KL(p || p) = 0 up to ~3 rounded terms of O(1): measured 5e-8
  # Mean over the two valid sentences: (log 3 + 0) / 2.
  both = jnp.concatenate([jnp.zeros((1, 1, 3)), logits], axis=1)
  targets = jnp.concatenate([one_hot, jax.nn.softmax(logits)], axis=1)
  got = ROLE_KL(both, targets, jnp.ones((1, 2), bool))
  np.testing.assert_allclose(float(got), math.log(3.0) / 2, rtol=KNOWN_RTOL)


def test_pairwise_known_answers():
  ones = jnp.ones(2, bool)
  # One pair (0, 1) with equal logits: -log sigmoid(0) = log 2.
  got = PAIRWISE(jnp.zeros(2), jnp.array([1, 2]), jnp.array([1, 1]), jnp.array([0, 1]), ones)
  np.testing.assert_allclose(float(got), math.log(2.0), rtol=KNOWN_RTOL)
  # Same pair, l_0 - l_1 = 2: log(1 + e^-2).
  got = PAIRWISE(jnp.array([1.0, -1.0]), jnp.array([1, 2]), jnp.array([1, 1]),
                 jnp.array([0, 1]), ones)
  np.testing.assert_allclose(float(got), math.log1p(math.exp(-2.0)), rtol=KNOWN_RTOL)


@pytest.mark.parametrize(
    "prank,srank,pids",
    [([1, 1], [1, 2], [0, 1]), ([1, 2], [2, 1], [0, 1]), ([1, 2], [1, 1], [0, 0])],
    ids=["passages_tied", "sentence_rank_worse", "same_passage"])
def test_pairwise_no_pair_is_exact_zero(prank, srank, pids):
  def loss(logits):
    return PAIRWISE(logits, jnp.array(prank), jnp.array(srank), jnp.array(pids),
                    jnp.ones(2, bool))
  value, grad = jax.value_and_grad(loss)(jnp.array([0.7, -3.0]))
  assert float(value) == 0.0
  assert np.all(np.asarray(grad) == 0.0)


def test_all_masked_is_exact_zero():
  mask = jnp.zeros((2, 3), bool)
  assert float(LISTWISE(jnp.ones((2, 3)), jnp.ones((2, 3)), mask)) == 0.0
  assert float(ROLE_KL(jnp.ones((2, 3, 3)), jnp.ones((2, 3, 3)) / 3, mask)) == 0.0


# ---------------------------------------------------------------- gradients


def _central_difference(fn, x, step):
  """Return the central finite-difference gradient of scalar fn at x (float64)."""
  x = np.asarray(x, np.float64)
  grad = np.zeros_like(x)
  for i in np.ndindex(x.shape):
    up, down = x.copy(), x.copy()
    up[i] += step
    down[i] -= step
    grad[i] = (float(fn(up)) - float(fn(down))) / (2 * step)
  return grad


def _loss_fn(name, seed):
  """Return (scalar fn of the differentiated input, that input in float64, its mask)."""
  if name == "listwise":
    logits, ranks, mask = listwise_inputs(seed, p=3, m=4, dtype=np.float64)
    return lambda x: losses.listwise_rank_loss(x, ranks, mask, tau=0.7), logits, mask
  if name == "role_kl":
    logits, target, mask = role_inputs(seed, p=2, m=3, dtype=np.float64)
    return lambda x: losses.role_kl_loss(x, target, mask), logits, np.repeat(
        mask[..., None], 3, axis=-1)
  logits, prank, srank, pids, mask = pairwise_inputs(seed, n=8, dtype=np.float64)
  return lambda x: losses.pairwise_global_loss(x, prank, srank, pids, mask), logits, mask


@pytest.mark.parametrize("name", ["listwise", "role_kl", "pairwise"])
def test_gradients_match_finite_differences(name):
  with jax.enable_x64(True):
    fn, x, mask = _loss_fn(name, seed=3)
    assert fn(x).dtype == jnp.float64  # float64 in, float64 out: the FD check is meaningful
    analytic = np.asarray(jax.jit(jax.grad(fn))(jnp.asarray(x)))
    numeric = _central_difference(jax.jit(fn), x, FD_STEP)  # one compile, many calls
  assert np.any(analytic != 0)
  np.testing.assert_allclose(analytic, numeric, atol=FD_ATOL, rtol=0)
  assert np.all(analytic[~mask] == 0.0)


@pytest.mark.parametrize("garbage", [1e30, -1e30, np.inf], ids=["big", "neg_big", "inf"])
@pytest.mark.parametrize("name", ["listwise", "role_kl", "pairwise"])
def test_masked_entries_get_exact_zero_gradient(name, garbage):
  fn, x, mask = _loss_fn(name, seed=4)
  x = np.asarray(x, np.float32)
  assert np.any(~mask) and np.any(mask)
  dirty = np.where(mask, x, np.float32(garbage))
  clean = np.where(mask, x, np.float32(0.0))
  value, grad = jax.jit(jax.value_and_grad(fn))(jnp.asarray(dirty))
  grad = np.asarray(grad)
  assert np.all(np.isfinite(grad)) and np.isfinite(float(value))
  assert np.all(grad[~mask] == 0.0)
  assert np.any(grad[mask] != 0.0)
  assert float(value) == float(jax.jit(fn)(jnp.asarray(clean)))


# ---------------------------------------------------------------- jit, dtypes, errors


@pytest.mark.parametrize("name", ["listwise", "role_kl", "pairwise"])
def test_jit_matches_eager(name):
  fn, x, _ = _loss_fn(name, seed=5)
  x = jnp.asarray(x, jnp.float32)
  with jax.disable_jit():
    nojit_value, nojit_grad = jax.value_and_grad(fn)(x)
  jit_value, jit_grad = jax.jit(jax.value_and_grad(fn))(x)
  # jit vs eager: two float32 evaluation orders (XLA fuses; not bit-exact). Values: the F32
  # derivation (~1e-6 relative of O(1) losses), measured 2.4e-7 abs (ratio 0.14, 7x). Gradients:
  # one more rounded pass (softmax - target, |g| <~ 1/n): rtol 1e-5 + atol 1e-7 (~1 eps of O(1));
  # measured 6e-8 (ratio 0.018). Default, AVX2 and SSE4.2 kernels alike.
  np.testing.assert_allclose(float(jit_value), float(nojit_value), rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(np.asarray(jit_grad), np.asarray(nojit_grad), rtol=1e-5, atol=1e-7)


def test_bfloat16_inputs_compute_in_float32():
  logits, ranks, mask = listwise_inputs(0)
  got = LISTWISE(jnp.asarray(logits, jnp.bfloat16), ranks, mask)
  assert got.dtype == jnp.float32
  rounded = np.asarray(jnp.asarray(logits, jnp.bfloat16).astype(jnp.float32))
  np.testing.assert_allclose(float(got), np_listwise(rounded, ranks, mask, 1.0),
                             rtol=F32_RTOL, atol=F32_ATOL)
  r_logits, target, r_mask = role_inputs(0)
  got = ROLE_KL(jnp.asarray(r_logits, jnp.bfloat16), target, r_mask)
  assert got.dtype == jnp.float32
  args = list(pairwise_inputs(0))
  args[0] = jnp.asarray(args[0], jnp.bfloat16)
  assert PAIRWISE(*args).dtype == jnp.float32


def test_bad_inputs_raise_library_errors():
  with pytest.raises(ConfigError, match="tau"):
    losses.listwise_rank_loss(jnp.zeros((1, 2)), jnp.ones((1, 2)), jnp.ones((1, 2), bool), tau=0)
  with pytest.raises(DataError, match="mask"):
    losses.listwise_rank_loss(jnp.zeros((1, 2)), jnp.ones((1, 2)), jnp.ones((1, 3), bool))
  with pytest.raises(DataError, match="target_probs"):
    losses.role_kl_loss(jnp.zeros((1, 2, 3)), jnp.ones((1, 2, 4)), jnp.ones((1, 2), bool))
  with pytest.raises(DataError, match="passage_ids"):
    losses.pairwise_global_loss(jnp.zeros(3), jnp.ones(3), jnp.ones(3), jnp.ones(4),
                                jnp.ones(3, bool))


def test_pairwise_query_losses_match_the_batched_mean():
  """Per-query losses and pair flags reproduce the [Q, N] batch mean of pairwise_global_loss."""
  rs = np.random.RandomState(7)
  q, n = 4, 9
  logits = rs.randn(q, n).astype(np.float32)
  prank = rs.randint(1, 4, size=(q, n))
  srank = rs.randint(1, 4, size=(q, n))
  pids = prank.copy()  # one passage per rank
  mask = rs.rand(q, n) < 0.8
  mask[2] = False  # a query with no valid node, hence no pair
  per_query, has_pair = losses.pairwise_query_losses(logits, prank, srank, pids, mask)
  assert not bool(has_pair[2]) and float(per_query[2]) == 0.0
  # Same float32 pair terms summed in another grouping (<= 36 pairs per query): ~sqrt(36) eps
  # relative ~ 7e-7 < 1e-6 (measured 0).
  for i in range(q):
    np.testing.assert_allclose(per_query[i], losses.pairwise_global_loss(
        logits[i], prank[i], srank[i], pids[i], mask[i]), rtol=1e-6)
  batch_mean = float(jnp.sum(jnp.where(has_pair, per_query, 0.0)) / jnp.sum(has_pair))
  np.testing.assert_allclose(batch_mean, losses.pairwise_global_loss(logits, prank, srank, pids, mask),
                             rtol=1e-6)


def np_pairwise_top(logits, prank, srank, pids, mask, max_better_rank):
  """The pairwise loss restricted to pairs whose better node's passage ranks <= K."""
  values = []
  n = logits.shape[0]
  for u in range(n):
    for v in range(n):
      if (mask[u] and mask[v] and pids[u] != pids[v] and prank[u] < prank[v]
          and srank[u] <= srank[v] and prank[u] <= max_better_rank):
        values.append(math.log1p(math.exp(-(float(logits[u]) - float(logits[v])))))
  return float(np.mean(values)) if values else 0.0


@pytest.mark.parametrize("seed,k", [(0, 1), (1, 1), (2, 2), (3, 3)],
                         ids=["seed0-top1", "seed1-top1", "seed2-top2", "seed3-top3"])
def test_pairwise_max_better_rank_matches_numpy(seed, k):
  """`max_better_rank` (not in the paper) keeps only the pairs led by a top-K passage; K at or
  above every rank but the worst keeps eq 23's D_q whole."""
  args = pairwise_inputs(seed)
  want = np_pairwise_top(*args, k)
  assert want > 0
  np.testing.assert_allclose(float(losses.pairwise_global_loss(*args, max_better_rank=k)), want,
                             rtol=F32_RTOL, atol=F32_ATOL)
  if k == 3:  # ranks are 1..3: rank-3 nodes never lead a pair, so this is the paper's loss
    np.testing.assert_allclose(float(losses.pairwise_global_loss(*args, max_better_rank=k)),
                               np_pairwise(*args), rtol=F32_RTOL, atol=F32_ATOL)
  batched = [pairwise_inputs(s) for s in (seed, seed + 10)]
  stacked = [np.stack([q[i] for q in batched]) for i in range(5)]
  got, has = losses.pairwise_query_losses(*stacked, max_better_rank=k)
  np.testing.assert_allclose(np.asarray(got), [np_pairwise_top(*q, k) for q in batched],
                             rtol=F32_RTOL, atol=F32_ATOL)
  assert bool(np.all(np.asarray(has)))


def test_pairwise_max_better_rank_gradient_matches_finite_differences():
  logits, prank, srank, pids, mask = pairwise_inputs(4, n=8, dtype=np.float64)
  with jax.enable_x64(True):
    f = lambda x: losses.pairwise_global_loss(x, prank, srank, pids, mask, max_better_rank=1)
    x = jnp.asarray(logits, jnp.float64)
    grad = np.asarray(jax.grad(f)(x))
    eps = 1e-6
    fd = np.array([(float(f(x.at[i].add(eps))) - float(f(x.at[i].add(-eps)))) / (2 * eps)
                   for i in range(len(logits))])
  np.testing.assert_allclose(grad, fd, atol=1e-8)
  # Nodes in no top-1-led pair (masked, or ranked 2-3 with no top-1 node above them) get 0.
  top = (prank == 1) & mask
  involved = np.zeros(len(logits), bool)
  for u in range(len(logits)):
    for v in range(len(logits)):
      if (top[u] and mask[v] and pids[u] != pids[v] and prank[u] < prank[v]
          and srank[u] <= srank[v]):
        involved[u] = involved[v] = True
  assert np.all(grad[~involved] == 0.0) and np.any(grad[involved] != 0.0)


# ---------------------------------------------------------------- distillation KL (not the paper)

KL = jax.jit(losses.listwise_kl_loss, static_argnames="temperature")


def np_kl(student, teacher, mask, temperature):
  """Mean over rows with >= 2 valid entries of KL(softmax(t / T) || softmax(s)), float64."""
  values = []
  for r in range(student.shape[0]):
    idx = np.flatnonzero(mask[r])
    if idx.size < 2:
      continue
    t = teacher[r, idx].astype(np.float64) / temperature
    p = np.exp(t - t.max())
    p /= p.sum()
    s = student[r, idx].astype(np.float64)
    log_q = s - s.max() - np.log(np.sum(np.exp(s - s.max())))
    values.append(float(np.sum(p * (np.log(p) - log_q))))
  return float(np.mean(values)) if values else 0.0


def kl_inputs(seed, r=4, c=6, dtype=np.float32):
  """Student logits, teacher cosines in [-1, 1], a mask with a 1-entry row and an empty row."""
  rng = np.random.default_rng(seed)
  student = rng.normal(scale=2.0, size=(r, c)).astype(dtype)
  teacher = rng.uniform(-1, 1, size=(r, c)).astype(dtype)
  lengths = rng.integers(2, c + 1, size=r)
  lengths[0], lengths[1] = 1, 0  # no ranking in one entry or none: those rows give 0
  mask = np.arange(c)[None, :] < lengths[:, None]
  return student, teacher, mask


@pytest.mark.parametrize("seed,temperature", [(0, 1.0), (1, 0.05), (2, 0.3)])
def test_listwise_kl_matches_numpy_and_is_zero_at_the_teacher(seed, temperature):
  student, teacher, mask = kl_inputs(seed)
  got = KL(student, teacher, mask, temperature=temperature)
  assert got.dtype == jnp.float32 and got.shape == ()
  # F32 derivation above, relative to the loss: logits / 0.05 reach |20|, so the log-softmax
  # terms are O(20) and their rounding scales with them (measured <= 3e-6 at T = 0.05).
  np.testing.assert_allclose(float(got), np_kl(student, teacher, mask, temperature),
                             rtol=F32_RTOL * 10, atol=F32_ATOL * 10)
  per_row, has = losses.listwise_kl_per_row(student, teacher, mask, temperature)
  assert has.tolist() == [False, False, True, True]
  assert float(per_row[0]) == 0.0 and float(per_row[1]) == 0.0
  # A student equal to the sharpened teacher (any shift) has KL 0 up to float32 rounding of
  # O(20) log-probabilities (~20 eps; 1e-5 bounds it).
  shifted = teacher / temperature + 3.0
  assert abs(float(KL(shifted, teacher, mask, temperature=temperature))) < 1e-5


def test_listwise_kl_gradient_matches_finite_differences_and_masks():
  with jax.enable_x64(True):
    student, teacher, mask = kl_inputs(3, dtype=np.float64)
    fn = lambda x: losses.listwise_kl_loss(x, teacher, mask, temperature=0.2)  # noqa: E731
    assert fn(student).dtype == jnp.float64
    analytic = np.asarray(jax.jit(jax.grad(fn))(jnp.asarray(student)))
    numeric = _central_difference(jax.jit(fn), student, FD_STEP)
  assert np.any(analytic != 0)
  np.testing.assert_allclose(analytic, numeric, atol=FD_ATOL, rtol=0)
  assert np.all(analytic[~mask] == 0.0)
  # Garbage in masked teacher and student slots changes nothing and gets no gradient.
  dirty_t = np.where(mask, teacher, np.inf).astype(np.float32)
  dirty_s = np.where(mask, student, 1e30).astype(np.float32)
  value, grad = jax.value_and_grad(lambda x: losses.listwise_kl_loss(x, dirty_t, mask, 0.2))(
      jnp.asarray(dirty_s))
  assert np.isfinite(float(value)) and np.all(np.asarray(grad)[~mask] == 0.0)
  clean = losses.listwise_kl_loss(np.where(mask, student, 0).astype(np.float32),
                                  np.where(mask, teacher, 0).astype(np.float32), mask, 0.2)
  assert float(value) == float(clean)
  with pytest.raises(ConfigError, match="temperature"):
    losses.listwise_kl_loss(student, teacher, mask, temperature=0.0)
  with pytest.raises(DataError, match="teacher_scores"):
    losses.listwise_kl_loss(student, teacher[:, :2], mask)
