"""Tricky scientific splitting cases: the default splitter gets all right, and no fewer than pysbd."""

import collections

import pytest

from logrerank_jax.data.sentences import split_sentences
from logrerank_jax.datasets.splitter_cases import CASES

CLASSES = sorted({c for c, _, _ in CASES})


def _correct(backend):
  """Per class, how many cases `backend` splits exactly as expected (offsets checked too)."""
  out = collections.Counter()
  for cls, text, expected in CASES:
    got = split_sentences(text, backend)
    assert all(text[s.start:s.end] == s.text for s in got)
    out[cls] += [s.text for s in got] == expected
  return out


def test_each_class_has_at_least_three_cases():
  counts = collections.Counter(c for c, _, _ in CASES)
  assert all(n >= 3 for n in counts.values()), counts


@pytest.mark.parametrize("cls,text,expected", CASES, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(CASES)])
def test_default_splitter_gets_case_right(cls, text, expected):
  del cls
  assert [s.text for s in split_sentences(text)] == expected


def test_default_at_least_as_good_as_pysbd_per_class():
  pytest.importorskip("pysbd")  # the `compare` extra (dev installs it)
  new, old = _correct("sentencex"), _correct("pysbd")
  for cls in CLASSES:
    assert new[cls] >= old[cls], (cls, new[cls], old[cls])
  assert sum(new.values()) >= sum(old.values())
