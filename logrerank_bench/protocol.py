"""A timing protocol that cannot mislead: interleaved reps, medians with spread, load recorded.

Rules (DESIGN §8): every contender is timed in the same process, interleaved A B A B ... so that
a change of machine load hits all of them alike; results are waited for (JAX
`block_until_ready`, CUDA torch `synchronize`) so asynchronous dispatch is not taken for speed;
each figure is a median over >= 5 repetitions after warm-up, reported with its min, max and
inter-quartile range and the raw samples; the load average before and after is recorded, and
a run whose load exceeded half the CPUs is marked `reliable=False`.

Also what every suite's JSON records and how it is written: the machine and thread settings
(`machine_info`; `set_threads` fixes them before JAX and torch start) and `write_json`; and
the simpler one-contender-at-a-time medians of the pipeline suites (`timed`, `percentiles`).
Light: nothing here imports JAX or torch before it is called.
"""

import json
import os
import platform
import statistics
import time
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import numpy as np

MIN_REPS = 5
# Idle time before each timed call (see `interleaved`).
PAUSE_S = 0.3


def block(x: Any) -> Any:
  """Wait for every JAX array in `x` (and for CUDA torch work); return `x`."""
  try:
    import jax  # pylint: disable=g-import-not-at-top
    jax.block_until_ready(x)
  except ImportError:
    pass
  try:
    import torch  # pylint: disable=g-import-not-at-top
    if torch.cuda.is_available():
      torch.cuda.synchronize()
  except ImportError:
    pass
  return x


def spread(samples) -> Dict[str, Any]:
  """Median, min, max, quartiles and IQR of a list of seconds (or any positive figures)."""
  v = np.asarray(samples, np.float64)
  q1, q3 = np.percentile(v, [25, 75])
  return {"median": float(np.median(v)), "min": float(v.min()), "max": float(v.max()),
          "q1": float(q1), "q3": float(q3), "iqr": float(q3 - q1), "n": int(v.size),
          "samples": [float(x) for x in v]}


def interleaved(fns: Mapping[str, Callable[[], Any]], reps: int = MIN_REPS, warmup: int = 1,
                pause_s: float = PAUSE_S) -> Dict[str, Dict[str, Any]]:
  """Time several callables interleaved: warm-up rounds, then `reps` rounds of A B C ...

  The order inside a round rotates (A B C, B C A, ...) so that no contender always runs
  right after the same other one (cache and frequency effects).

  Args:
    fns: name -> zero-argument callable; its result is blocked on before the clock stops.
    reps: timed rounds (>= 5).
    warmup: untimed rounds first (compilation, allocator warm-up).
    pause_s: sleep before each timed call, so that the previous contender's worker threads
      (OpenMP and Eigen pools spin-wait for a while after their work) have gone idle and do
      not steal CPU from the next one.

  Returns:
    name -> `spread` of its wall seconds, plus `cpu_s_median` / `cpu_s_samples` (process CPU
    seconds per call).
  """
  if reps < MIN_REPS:
    raise ValueError(f"interleaved needs reps >= {MIN_REPS}, got {reps}")
  names = list(fns)
  for _ in range(warmup):
    for n in names:
      block(fns[n]())
  samples = {n: [] for n in names}
  cpu = {n: [] for n in names}
  for r in range(reps):
    order = names[r % len(names):] + names[:r % len(names)]
    for n in order:
      if pause_s:
        time.sleep(pause_s)
      c0, t0 = time.process_time(), time.perf_counter()
      block(fns[n]())
      samples[n].append(time.perf_counter() - t0)
      cpu[n].append(time.process_time() - c0)
  out = {}
  for n in names:
    out[n] = spread(samples[n])
    # CPU seconds of this process per call (all its threads): when wall x threads is well
    # above it, the process was waiting for CPUs that other jobs held.
    out[n]["cpu_s_median"] = float(np.median(cpu[n]))
    out[n]["cpu_s_samples"] = [float(x) for x in cpu[n]]
  return out


def throughput(timing: Mapping[str, Any], work: float) -> Dict[str, float]:
  """Work per second (e.g. real tokens/s) from a `spread` of seconds: median, min, max."""
  return {"median": work / timing["median"], "min": work / timing["max"],
          "max": work / timing["min"], "q1": work / timing["q3"], "q3": work / timing["q1"]}


def ratio(num: Mapping[str, Any], den: Mapping[str, Any]) -> Dict[str, float]:
  """Ratio of two throughputs: median / median, and the extreme ratios of their ranges."""
  return {"median": num["median"] / den["median"], "min": num["min"] / den["max"],
          "max": num["max"] / den["min"]}


def ratio_text(r: Mapping[str, Any]) -> str:
  """A `ratio` as printed: `median (range min-max)`, two decimals."""
  return f"{r['median']:.2f} (range {r['min']:.2f}-{r['max']:.2f})"


def timed(fn: Callable[[], Any], reps: int = 3, warmup: int = 1) -> float:
  """Return the median wall time (s) of `fn()` over `reps` runs after `warmup` runs.

  The simpler timing of the pipeline suites (tools/benchmark.py): one contender at a time,
  results waited for like `interleaved`'s."""
  for _ in range(warmup):
    block(fn())
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    block(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def percentiles(values: Sequence[float]) -> Dict[str, float]:
  """p50 / p95 / mean of a list of seconds."""
  v = np.asarray(values, np.float64)
  return {"p50": float(np.percentile(v, 50)), "p95": float(np.percentile(v, 95)),
          "mean": float(v.mean()), "n": int(v.size)}


def _load() -> Optional[list]:
  return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


class load_report:  # pylint: disable=invalid-name
  """Record the load average around a block: `with load_report(threads) as lr: ...; lr.result`.

  Called plainly, `load_report()` gives a snapshot dict right away. The 1-minute load average
  counts our own runnable threads too (up to `own_threads` while we compute, the default being
  every CPU), so the load left to other jobs is taken as load - own_threads, floored at 0;
  `reliable` is False when that exceeds half the CPUs (nproc / 2) before or after the block.
  """

  def __init__(self, own_threads: Optional[int] = None):
    self.nproc = os.cpu_count() or 1
    self.own = self.nproc if own_threads is None else int(own_threads)
    self.before = _load()
    self.after = None
    self.result = self._make()

  def _make(self) -> Dict[str, Any]:
    loads = [x[0] for x in (self.before, self.after) if x]
    threshold = self.nproc / 2
    others = max(0.0, max(loads) - self.own) if loads else None
    return {"loadavg_before": self.before, "loadavg_after": self.after, "nproc": self.nproc,
            "own_threads": self.own, "threshold_1m": threshold,
            "other_load_1m_max": others,
            "reliable": others is not None and others <= threshold,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}

  def __enter__(self):
    self.before = _load()
    self.result = self._make()
    return self

  def __exit__(self, *exc):
    self.after = _load()
    self.result = self._make()
    return False


def machine_info(threads: Optional[int] = None, load_average: bool = False) -> Dict[str, Any]:
  """The machine, library versions and thread settings of this run.

  The interleaved encoder suites record the OpenMP and torch inter-op thread settings; with
  `load_average` (the other suites: tools/benchmark.py, device_run.py) the 1-minute load average
  takes their place, as those JSON files have always held it.
  """
  info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
          "python": platform.python_version(), "cpu_count": os.cpu_count(),
          "cpu_affinity": (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                           else None),
          "xla_flags": os.environ.get("XLA_FLAGS", ""), "threads": threads}
  if load_average:
    # Other processes on the machine skew CPU timings; record how busy it was.
    info["load_average_1m"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
  else:
    info["omp_num_threads"] = os.environ.get("OMP_NUM_THREADS")
  try:
    import flax  # pylint: disable=g-import-not-at-top
    import jax  # pylint: disable=g-import-not-at-top
    info.update(jax=jax.__version__, flax=flax.__version__, jax_backend=jax.default_backend(),
                jax_devices=[str(d.device_kind) for d in jax.devices()])
  except ImportError:
    info.update(jax=None)
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    info.update(torch=torch.__version__, transformers=transformers.__version__,
                torch_threads=torch.get_num_threads(),
                torch_cuda=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    if not load_average:
      info["torch_interop_threads"] = torch.get_num_interop_threads()
  except ImportError:
    info.update(torch=None, transformers=None)
  return info


def set_threads(n: int) -> int:
  """Bound XLA's and torch's CPU threads to n; call before jax/torch are imported.

  XLA sizes its CPU thread pool from the schedulable CPUs, so the process affinity is cut to n
  CPUs; OMP/MKL variables bound torch's (torch.set_num_threads is called by the suites too).
  """
  allowed = sorted(os.sched_getaffinity(0))
  n = n or len(allowed)
  if n > len(allowed):
    raise SystemExit(f"--threads {n} but only {len(allowed)} CPUs are allowed to this process")
  os.sched_setaffinity(0, allowed[:n])
  for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(n)
  return n


def write_json(path: str, results: Dict[str, Any], indent: int = 2, sort_keys: bool = True) -> None:
  """Write `results` as indented JSON (atomic replace)."""
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(results, f, indent=indent, sort_keys=sort_keys, default=str)
  os.replace(tmp, path)
