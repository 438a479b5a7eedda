"""The data-parallel step as it was before the gradient fix, for one run of a worker process."""

import contextlib

from logrerank_jax.training import step as step_lib


@contextlib.contextmanager
def gradient_reduced_twice(active: bool = True):
  """Within the block (when `active`), the per-device step lacks its varying cast of the params:
  under checked shard_map the implicit cast of the invariant params transposes to a psum, and the
  step's own psum then reduces the gradient a second time (tests/test_data_parallel.py proves its
  bounds catch this). The real step is restored on leaving, so the next run of the process gets it.
  """
  pcast = step_lib.jax.lax.pcast
  if active:
    step_lib.jax.lax.pcast = lambda x, *args, **kwargs: x
  try:
    yield
  finally:
    step_lib.jax.lax.pcast = pcast
