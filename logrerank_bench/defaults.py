"""The benchmarks' defaults: their sizes, and where their inputs are (ScholarQABench files, the
library's shipped demo data).

Light (no JAX, no torch), so the command lines can name their defaults before threads are set.
The demo data is found through the installed `logrerank_jax` package, so a clean install runs
without the repository; the ScholarQABench slices in tests/data (the default inputs) exist only
in a checkout, and `--data` names the full files anywhere.
"""

import os
import pathlib
from typing import List

# "tiny" is for the smoke tests (tests/test_benchmark_smoke.py): it runs every code path in seconds
# and its figures mean nothing.
SIZES = ("tiny", "small", "base")
REPO = pathlib.Path(__file__).resolve().parent.parent
# The ScholarQABench slices the smoke tests use (their corpora hold 12 passages).
SLICE_FILES = (str(REPO / "tests" / "data" / "scifact_slice.jsonl"),
               str(REPO / "tests" / "data" / "pubmed_slice.jsonl"))
# The full files a `--data` folder holds.
FULL_FILE_NAMES = ("scifact_test.jsonl", "pubmed_test.jsonl")


def data_files(data_dir: str = "") -> List[str]:
  """The full ScholarQABench files present in `data_dir`, or the slices when none is named."""
  if not data_dir:
    return list(SLICE_FILES)
  return [os.path.join(data_dir, f) for f in FULL_FILE_NAMES
          if os.path.exists(os.path.join(data_dir, f))]


def demo_data_dir() -> pathlib.Path:
  """The installed package's `logrerank_jax/demo_data` (real pools, corpora, training records)."""
  import logrerank_jax  # pylint: disable=g-import-not-at-top
  return pathlib.Path(logrerank_jax.__file__).parent / "demo_data"
