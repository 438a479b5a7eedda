"""Which attention kernel a ModernBERT layer runs: `attention_impl` resolved for the backend.

Paths (all exact on real tokens; `reference.reference_attention` is the ground truth):
  "xla"         full masked [L, L] logits (the reference itself); any backend.
  "blocked"     window layers over neighbouring key blocks (XLA); global layers as "xla".
  "tiled"       one (row, head group) tile at a time, flash-style backward (XLA; fastest on CPU).
  "pallas_gpu"  block-skipping flash attention, Pallas Triton kernels (`models/attention/pallas_gpu.py`);
                NVIDIA GPUs with compute capability >= 8.0.
  "splash_tpu"  JAX's splash attention (`models/attention/splash_tpu.py`); TPUs.
"auto" picks, by JAX's default backend: "tiled" on CPU, "pallas_gpu" on GPU, "splash_tpu" on TPU,
"xla" elsewhere. A kernel that cannot run (its import fails, another backend, an older GPU, a
head width its tiles cannot take, or its one-time self-check on the device fails: it does not
compile with this JAX, or differs from the reference) falls back to the backend's XLA path
("tiled" on CPU, "xla" elsewhere) with one logged warning per (path, reason), never silently.

Setting the environment variable `LOGRERANK_PALLAS_INTERPRET=1` runs the Pallas kernels in
interpret mode on any backend (slow; for tests and CPU rehearsals of the GPU/TPU code path).
"""

import concurrent.futures
import functools
import logging
import os
from typing import Optional

import jax

logger = logging.getLogger(__name__)

IMPLS = ("auto", "xla", "blocked", "tiled", "pallas_gpu", "splash_tpu")
# Kernel -> the backend it is compiled for.
ACCELERATOR_KERNELS = {"pallas_gpu": "gpu", "splash_tpu": "tpu"}
AUTO = {"cpu": "tiled", "gpu": "pallas_gpu", "tpu": "splash_tpu"}
INTERPRET_ENV = "LOGRERANK_PALLAS_INTERPRET"
_MIN_COMPUTE_CAPABILITY = 8.0  # Pallas Triton: Ampere and newer
_reported = set()


def interpret_kernels() -> bool:
  """True when the Pallas kernels should run in interpret mode (see the module doc)."""
  return os.environ.get(INTERPRET_ENV, "").strip() not in ("", "0", "false", "False")


@functools.lru_cache(maxsize=None)
def _import_error(impl: str) -> Optional[str]:
  """The import failure of a kernel's Pallas modules (None when they import)."""
  try:
    if impl == "pallas_gpu":
      from jax.experimental.pallas import triton  # pylint: disable=g-import-not-at-top,unused-import
    elif impl == "splash_tpu":
      from jax.experimental.pallas.ops.tpu import splash_attention  # pylint: disable=g-import-not-at-top,unused-import
  except Exception as e:  # pylint: disable=broad-except
    return f"its Pallas module does not import ({type(e).__name__}: {e})"
  return None


def gpu_compute_capability() -> Optional[float]:
  """Compute capability of JAX's first device (None when it is not a CUDA GPU)."""
  cc = getattr(jax.devices()[0], "compute_capability", None)
  try:
    return float(cc)
  except (TypeError, ValueError):
    return None


@functools.lru_cache(maxsize=None)
def _probe_error(impl: str) -> Optional[str]:
  """Compile and run the kernel once on a small packed batch, forward and gradient, against
  the reference: a kernel that does not lower on this JAX/GPU, or computes something else,
  is reported unavailable instead of failing (or erring) inside the model. None if it passes.

  Runs in a fresh thread: the dispatch is asked while a model is being traced, and JAX's trace
  state is per thread, so the check there compiles and runs for real instead of being staged
  into the model's trace."""
  with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
    return pool.submit(_self_check, impl).result()


def _self_check(impl: str) -> Optional[str]:
  """See `_probe_error`."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from logrerank_jax.models.attention import pallas_gpu, reference, splash_tpu  # pylint: disable=g-import-not-at-top
  kernel = {"pallas_gpu": pallas_gpu.pallas_attention,
            "splash_tpu": splash_tpu.splash_attention}[impl]
  length = 256
  seg = np.zeros((1, length), np.int32)
  seg[0, :100], seg[0, 100:230] = 1, 2
  pos = np.where(seg[0] == 1, np.arange(length), np.arange(length) - 100)[None].astype(np.int32)
  pos[seg == 0] = 0
  rng = np.random.default_rng(0)
  q, k, v, dout = (rng.standard_normal((1, length, 2, 64)).astype(np.float32) for _ in range(4))
  dout *= (seg > 0)[..., None, None]
  exact = lambda *a: reference.reference_attention(*a, lambda p: p)

  def run(f, window, *args):  # arrays as arguments: as constants XLA would fold it all
    q, k, v, seg, pos, dout = args
    out, vjp = jax.vjp(lambda q, k, v: f(q, k, v, seg, pos, window), q, k, v)
    return (out,) + vjp(dout)

  args = (q, k, v, seg, pos, dout)
  try:
    for window in (None, 8):
      got = jax.jit(run, static_argnums=(0, 1))(kernel, window, *args)
      # Full float32 products for the reference (GPUs may use TF32 for float32 by default).
      with jax.default_matmul_precision("highest"):
        want = jax.jit(run, static_argnums=(0, 1))(exact, window, *args)
      for g, w in zip(got, want):
        real = (seg > 0)[..., None, None]
        err = float(jnp.max(jnp.abs(jnp.where(real, g - w, 0.0))))
        scale = max(float(jnp.max(jnp.abs(w))), 1.0)
        # Exact float32 kernels differ from the reference by a few ulps (~1e-6 of the scale,
        # tests/test_attention_kernels.py); even TF32 products stay under ~1e-2 of it, while a
        # missed key block or a wrong mask is off by O(scale): 3e-2 tells them apart.
        if not err <= 3e-2 * scale:
          return f"its self-check on this device is off by {err:.2e} (window={window})"
  except Exception as e:  # pylint: disable=broad-except
    return f"its self-check on this device failed ({type(e).__name__}: {str(e)[:200]})"
  return None


def unavailable_reason(impl: str, backend: str, head_dim: int) -> Optional[str]:
  """Why kernel `impl` cannot run here (None if it can, and for the XLA paths)."""
  target = ACCELERATOR_KERNELS.get(impl)
  if target is None:
    return None
  reason = _import_error(impl)
  if reason or interpret_kernels():
    return reason
  if backend != target:
    return f"it needs the {target} backend, JAX's default backend is {backend}"
  if impl == "pallas_gpu":
    cc = gpu_compute_capability()
    if cc is None or cc < _MIN_COMPUTE_CAPABILITY:
      return f"it needs a CUDA GPU of compute capability >= 8.0, found {cc}"
    from logrerank_jax.models.attention import pallas_gpu as pallas_attention  # pylint: disable=g-import-not-at-top
    reason = pallas_attention.unsupported_reason(head_dim)
    if reason:
      return reason
  return _probe_error(impl)


def _report_fallback(impl: str, reason: str, to: str) -> None:
  """Log one warning per (path, reason): a fallback is never silent, nor repeated per layer."""
  if (impl, reason) in _reported:
    return
  _reported.add((impl, reason))
  logger.warning("attention_impl=%r is unavailable: %s; using %r instead", impl, reason, to)


def resolve(impl: str, backend: str, head_dim: int) -> str:
  """The attention path that runs for `impl` on `backend` (see the module doc).

  Args:
    impl: one of `IMPLS`.
    backend: JAX backend name ("cpu", "gpu", "tpu", ...).
    head_dim: attention head width.

  Returns:
    A path other than "auto".
  """
  wanted = AUTO.get(backend, "xla") if impl == "auto" else impl
  reason = unavailable_reason(wanted, backend, head_dim)
  if reason is None:
    return wanted
  fallback = "tiled" if backend == "cpu" else "xla"
  _report_fallback(wanted, reason, fallback)
  return fallback
