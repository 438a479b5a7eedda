"""The environment of a test's subprocess that sees N CPU devices."""

import os


def cpu_devices_env(ndev: int, **extra: str) -> dict:
  """This process's environment with JAX on the CPU and `ndev` host devices.

  The device count is added to XLA_FLAGS, not put in its place: the flags there are the test
  run's compile settings (tests/conftest.py), which the workers and tools must compile with too.
  JAX reads the count once, at start-up, hence a fresh process per device count.
  """
  flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={ndev}"
  return dict(os.environ, XLA_FLAGS=flags.strip(), JAX_PLATFORMS="cpu", **extra)
