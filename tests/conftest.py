"""Shared pytest fixtures: paths to the real-text slices shipped with the tests."""

import json
import pathlib

import pytest

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
