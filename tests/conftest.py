"""Shared pytest set-up: one compilation cache per test run, and fixtures over the real-text
slices shipped with the tests.

Compilation cache.  XLA compilation is most of this suite's CPU time, and the same programs are
compiled again and again by the tools and multi-device workers the tests run in subprocesses (six
tiny training runs of one config, for instance). JAX's persistent cache, in one temporary folder
per test run (created here, before anything imports JAX, removed when the run ends), lets every
such process load an executable that another process of the run compiled before. It is passed on
through JAX's own environment variables, so subprocesses and xdist workers inherit it. Entries are
cached whatever their compile time (tiny models compile in well under JAX's default 1 s
threshold), and a size limit turns on JAX's file lock, so two processes never read an entry
another is writing. A run under an explicit `JAX_COMPILATION_CACHE_DIR` uses that folder and
leaves it in place.

Compiler optimisation.  The tiny models here spend far more time in XLA's back end than in
running. Unless the caller chose (`.ci/run` reruns the float parity files with full optimisation,
so they are also checked as users compile them), every process of the run compiles with
`JAX_DISABLE_MOST_OPTIMIZATIONS=1` (LLVM at -O0, no expensive passes; measured 20.3 -> 8.9 CPU-s
for a tiny LoG's jitted init) and XLA CPU's older fusion code generator
(`--xla_cpu_use_fusion_emitters=false`; with the cache change below, an eager tiny-LoG init went
from 29.6 s to 14.7 s). Both change how XLA generates machine code, not the program: without
fast-math neither may reassociate floating-point, and every tolerance here is a bound on rounding
anyway. XLA CPU also splits each program's LLVM module into 32 parts to generate code on several
threads (`--xla_cpu_parallel_codegen_split_count`); here three workers and their subprocesses
already fill both cores, so the split is only overhead: one part per program
(`--xla_cpu_parallel_codegen_split_count=1`, the same kernels in one module) took four
compilation-heavy files (graph reranker, LoG pipeline, ablations, losses; 106 tests, serial, a
fresh cache each run) from 57.5 to 51.8 CPU-s, the means of 7 and 6 runs on 2 quiet cores (ranges
54.2-61.9 and 49.7-54.4). The flags are checked once in a throw-away process, because XLA aborts
on a flag it does not know.

The processes the tests start write every program to the cache; the test processes themselves
write only their large programs (see the note below).
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

_CACHE_OWNER = "LOGRERANK_TEST_CACHE_OWNER"


def _test_run_compilation_cache() -> None:
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return  # the user's own folder, or the one the controlling pytest process made
  path = tempfile.mkdtemp(prefix="logrerank-test-xla-")
  os.environ.update({
      "JAX_COMPILATION_CACHE_DIR": path,
      "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
      "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
      # Any limit turns on the cache's file lock (and LRU eviction, which 8 GiB never reaches).
      "JAX_COMPILATION_CACHE_MAX_SIZE": str(8 << 30),
      # The tools' own default cache (tools/rerank.py, tools/evaluate.py) is this one too, so a
      # test run writes nothing under ~/.cache.
      "LOGRERANK_JAX_COMPILATION_CACHE": path,
      _CACHE_OWNER: str(os.getpid()),
  })


_FAST_FLAGS = ("--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1")
_FAST_CHECKED = "LOGRERANK_TEST_FAST_COMPILE_CHECKED"


def _fast_compilation() -> None:
  """-O0, XLA CPU's older fusion code generator and one LLVM module per program, for this process
  and every process it starts, unless the caller chose the optimisation level (`.ci/run`'s AVX2
  rerun does)."""
  if "JAX_DISABLE_MOST_OPTIMIZATIONS" in os.environ:
    return
  os.environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"
  flags = os.environ.get("XLA_FLAGS", "")
  if os.environ.get(_FAST_CHECKED):
    return
  # The caller's own setting of either flag wins.
  mine = [f for f in _FAST_FLAGS if f.split("=")[0] not in flags]
  if not mine:
    return
  # XLA aborts the process on an unknown flag: check once, in a throw-away process, that this
  # jaxlib still has them (xdist workers inherit the result through the environment).
  fast = " ".join([flags, *mine]).strip()
  probe = subprocess.run(
      [sys.executable, "-c", "import jax.numpy as j; j.zeros(1).block_until_ready()"],
      env=dict(os.environ, XLA_FLAGS=fast, JAX_PLATFORMS="cpu"), capture_output=True,
      timeout=120, check=False)
  os.environ[_FAST_CHECKED] = "1"
  if probe.returncode == 0:
    os.environ["XLA_FLAGS"] = fast


def _one_thread_per_library() -> None:
  """torch's OpenMP pool and NumPy's OpenBLAS to one thread each, in this process and every
  process it starts (unless the caller set them): the three xdist workers and the subprocesses
  the tests start already keep both cores busy, and a second thread per library only adds
  spinning and switching. Measured on four torch-heavy files (parity, conversion, MiniLM), two
  interleaved pairs: 130.5 / 133.9 CPU-s with the libraries' defaults, 123.9 / 125.5 with one
  thread (68.5 / 69.8 s -> 65.0 / 65.0 s). One thread is another valid summation order, which
  every tolerance here bounds; tools/benchmark.py sets its own thread counts."""
  for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(var, "1")


_test_run_compilation_cache()
_fast_compilation()
_one_thread_per_library()

import jax  # noqa: E402  (after the environment is set)
import pytest  # noqa: E402

# In the test processes themselves (the xdist workers) most compilations are new and small, and
# writing each one to the cache costs more than compiling it at -O0 (measured: the whole suite with
# every entry written, 883 s against 717 s without the cache, one profiled run each). Their large
# programs (whole engines, training steps: 0.5 s and more) do recur across the workers, which
# build the same tiny models in different files, so the workers write only those and read all.
# Measured on 2 quiet cores, whole suite, one run per line: d4e3c30 620 s without, 520 s with;
# e5c64b4 580 s without, 619 s and 518 s with (this host's runs spread by up to 15 %).
# The processes the tests start keep the environment's threshold (0: every entry), since they
# mostly repeat programs an earlier process compiled.
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


# Test files, heaviest first, by their CPU seconds in a whole-suite run on 2 cores (commit c6889ea,
# per-test CPU of the worker and its subprocesses; later cuts changed some figures). pytest-xdist
# hands whole files to workers in collection order (setup.cfg: --no-loadscope-reorder; its
# default order, most tests first, started the four-test training file among the last), so the
# long files start first and the many short ones fill the workers' ends (longest job first).
# Files not listed keep their order after these. Only the order changes: every test still runs.
HEAVIEST_FIRST = (
    "test_data_parallel.py",         # 155 CPU-s
    "test_training.py",              # 146
    "test_inference_devices.py",     # 131
    "test_real_use.py",              # 111
    "test_benchmark_smoke.py",       # 89
    "test_bert_backbone.py",         # 81
    "test_serving.py",               # 75
    "test_modernbert_parity.py",     # 59
    "test_tokenization.py",          # 53
    "test_reliability_inputs.py",    # 47
    "test_dense_prior.py",           # 45
    "test_inference_pipeline.py",    # 40
    "test_minilm_demo.py",           # 35
    "test_log_pipeline.py",          # 30
    "test_frameworks.py",            # about 20 (added after the measurement; mostly waiting for
                                     # its server and the LangChain subprocess)
    "test_reliability_faults.py",    # 28
    "test_distill_training.py",      # 27
    "test_host_packing.py",          # about 25 (added after the measurement; 31.7 CPU-s niced
                                     # beside other work)
    "test_rerank_cli.py",            # 26
    "test_graph_reranker.py",        # 25
    "test_ablations.py",             # 22
    "test_inference.py",             # 21
)


def pytest_collection_modifyitems(session, config, items):
  """Order test files heaviest first (HEAVIEST_FIRST); a stable sort keeps each file's tests
  together and in their own order."""
  del session, config
  gone = [name for name in HEAVIEST_FIRST if not (pathlib.Path(__file__).parent / name).exists()]
  if gone:  # a renamed file would silently lose its place
    raise pytest.UsageError(f"tests/conftest.py HEAVIEST_FIRST names missing test files: {gone}")
  rank = {name: i for i, name in enumerate(HEAVIEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_unconfigure(config):
  """The process that made the run's cache folder removes it at the end."""
  del config
  if os.environ.get(_CACHE_OWNER) == str(os.getpid()):
    shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


DATA_DIR = pathlib.Path(__file__).parent / "data"


def read_jsonl(path):
  """Return the parsed records of a JSONL file."""
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="session")
def scifact_records():
  """Real SciFact claims with their gold abstracts."""
  return read_jsonl(DATA_DIR / "scifact_slice.jsonl")


@pytest.fixture(scope="session")
def pubmed_records():
  """Real PubMedQA questions; most contexts are dicts with section labels."""
  return read_jsonl(DATA_DIR / "pubmed_slice.jsonl")


@pytest.fixture(scope="session")
def train_six(tmp_path_factory):
  """Six real training queries (36 passages) of the shipped demo data, three validation queries
  and a WordPiece tokenizer trained on the six: the data of every tiny training run
  (tests/test_training.py, tests/test_data_parallel.py), built once per test run."""
  from logrerank_jax.datasets.wordpiece import train_wordpiece_tokenizer
  demo = pathlib.Path(__file__).resolve().parents[1] / "logrerank_jax" / "demo_data"
  d = tmp_path_factory.mktemp("train_six")
  lines = (demo / "train.jsonl").read_text().splitlines()[:6]
  (d / "train.jsonl").write_text("\n".join(lines) + "\n")
  (d / "val.jsonl").write_text("\n".join((demo / "val.jsonl").read_text().splitlines()[:3]) + "\n")
  recs = [json.loads(line) for line in lines]
  texts = [r["question"] for r in recs] + [s["text"] for r in recs for p in r["passages"]
                                           for s in p["sentences"]]
  train_wordpiece_tokenizer(texts, 600, str(d / "tok"))
  return d
