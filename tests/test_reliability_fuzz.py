"""Property-based fuzzing of the readers and validators: only the library's own errors escape.

Every property runs a bounded number of examples (`EXAMPLES`, deadline off: the shared CPUs are
slow) over arbitrary JSON values, structured mutations of valid records (one field replaced by
an arbitrary value, so the fuzzer reaches the deep checks) and arbitrary bytes for whole files.
A reader may accept the input or raise a `LogRerankError` subclass; anything else fails.
"""

import copy
import json
import os
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logrerank_jax.data.inference_input import (InferenceRecord, parse_inference_line,
                                                parse_inference_record, read_inference_file)
from logrerank_jax.data.records import TrainingRecord, parse_training_record, validate_training_file
from logrerank_jax.datasets.scholarqabench import read_scholarqabench
from logrerank_jax.errors import ConfigError, DataError, LogRerankError
from logrerank_jax.evaluation import read_qrels, read_trec_run, rerank_metrics
from logrerank_jax.models import log_reranker as lr
from logrerank_jax.models.config_io import log_config_from_dict, log_config_to_dict

# LOGRERANK_FUZZ_EXAMPLES=N runs N random (not derandomized) examples per property, for a deeper
# search than CI's fixed, reproducible 150.
EXAMPLES = int(os.environ.get("LOGRERANK_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None,
                derandomize="LOGRERANK_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=10 ** 300)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8) | st.sampled_from(
        ["id", "question", "passages", "title", "rank", "sentences", "text", "role", "input",
         "ctxs", "gold_ctx", "answer"]), inner, max_size=5),
    max_leaves=20)

VALID_TRAINING = {
    "id": "q1", "question": "Does aspirin reduce pain?",
    "passages": [
        {"id": "a", "title": "", "rank": 2, "sentences": [
            {"text": "Aspirin reduced pain.", "rank": 1, "role": [0.1, 0.2, 0.7]}]},
        {"id": "b", "title": "T", "rank": 1, "sentences": [
            {"text": "We gave aspirin.", "rank": 2, "role": [0.0, 1.0, 0.0]},
            {"text": "Pain fell.", "rank": 1, "role": [0.2, 0.2, 0.6]}]}]}
VALID_INFERENCE = {"id": 3, "input": "Does aspirin reduce pain?", "ctxs": [
    {"id": "d1", "title": "T", "text": "Aspirin reduced pain. It lasted."},
    {"title": None, "text": ""}]}


def _paths(obj, prefix=()):
  """Every path (tuple of keys/indices) into a nested JSON value, the root included."""
  yield prefix
  if isinstance(obj, dict):
    for k, v in obj.items():
      yield from _paths(v, prefix + (k,))
  elif isinstance(obj, list):
    for i, v in enumerate(obj):
      yield from _paths(v, prefix + (i,))


def _replace(obj, path, value):
  """Return a copy of `obj` with the value at `path` replaced (or deleted when value is ...)."""
  if not path:
    return None if value is ... else value
  out = copy.deepcopy(obj)
  node = out
  for k in path[:-1]:
    node = node[k]
  if value is ...:
    del node[path[-1]]
  else:
    node[path[-1]] = value
  return out


def mutations(valid):
  """Strategy: `valid` with one field replaced by an arbitrary JSON value or deleted."""
  paths = list(_paths(valid))
  return st.tuples(st.sampled_from(paths), json_values | st.just(...)).map(
      lambda pv: _replace(valid, *pv))


def _tmp_file(data: bytes) -> str:
  fd, path = tempfile.mkstemp(suffix=".jsonl")
  with os.fdopen(fd, "wb") as f:
    f.write(data)
  return path


def _only_library_errors(fn, *args):
  """Call fn; return its result, or the LogRerankError it raised (anything else fails the test)."""
  try:
    return fn(*args)
  except LogRerankError as e:
    assert "\n" not in str(e), str(e)
    return e


@FUZZ
@given(json_values | mutations(VALID_TRAINING))
def test_training_record_parser(obj):
  out = _only_library_errors(parse_training_record, obj, "fuzz:1")
  assert isinstance(out, (TrainingRecord, DataError))
  if isinstance(out, TrainingRecord):
    assert out.to_json() == obj  # accepted records round-trip exactly


@FUZZ
@given(st.lists(st.binary(max_size=60) | (json_values | mutations(VALID_TRAINING)).map(
    lambda o: json.dumps(o).encode()), max_size=6))
def test_training_file_reader(lines):
  path = _tmp_file(b"\n".join(lines))
  try:
    out = _only_library_errors(validate_training_file, path, True)
    # skip_invalid=True never raises: every non-blank line is a record or a counted error.
    records, report = out
    assert report.n_records + report.n_invalid == report.n_lines
    assert report.n_lines == sum(1 for x in b"\n".join(lines).split(b"\n")
                                 if x.rstrip(b"\r").strip())
  finally:
    os.remove(path)


@FUZZ
@given(json_values | mutations(VALID_INFERENCE))
def test_inference_record_parser(obj):
  out = _only_library_errors(parse_inference_record, obj, "fuzz:1")
  assert isinstance(out, (InferenceRecord, DataError))


@FUZZ
@given(st.text(max_size=80) | (json_values | mutations(VALID_INFERENCE)).map(json.dumps))
def test_inference_line_parser_never_raises(line):
  entry = parse_inference_line(line, 1, "fuzz")
  assert isinstance(entry.record, (InferenceRecord, DataError))


@FUZZ
@given(st.lists(st.binary(max_size=60) | (json_values | mutations(VALID_INFERENCE)).map(
    lambda o: json.dumps(o).encode()), max_size=6))
def test_inference_file_reader_keeps_every_line(lines):
  data = b"\n".join(lines)
  path = _tmp_file(data)
  try:
    entries = read_inference_file(path)  # never raises on content
    assert len(entries) == sum(
        1 for x in data.split(b"\n") if not _decodes_blank(x))  # records lost = 0
    for e in entries:
      assert isinstance(e.record, (InferenceRecord, DataError))
  finally:
    os.remove(path)


def _decodes_blank(raw: bytes) -> bool:
  """Whether a raw line is blank text (undecodable lines are records with an error)."""
  try:
    return not raw.decode("utf-8").strip()
  except UnicodeDecodeError:
    return False


@FUZZ
@given(st.lists(st.binary(max_size=60) | json_values.map(lambda o: json.dumps(o).encode()),
                max_size=5))
def test_scholarqabench_reader(lines):
  path = _tmp_file(b"\n".join(lines))
  try:
    out = _only_library_errors(read_scholarqabench, path)
    assert isinstance(out, (list, DataError))
  finally:
    os.remove(path)


trec_tokens = st.sampled_from(["q1", "Q0", "d1", "d2", "1", "0", "0.5", "nan", "-inf", "tag", "x"])


@FUZZ
@given(st.lists(st.binary(max_size=30) | st.lists(trec_tokens, max_size=7).map(
    lambda t: " ".join(t).encode()), max_size=6), st.booleans())
def test_trec_readers(lines, run):
  path = _tmp_file(b"\n".join(lines))
  try:
    out = _only_library_errors(read_trec_run if run else read_qrels, path)
    assert isinstance(out, (dict, DataError))
    if isinstance(out, dict) and run:
      assert all(v == v for docs in out.values() for v in docs.values())  # no NaN score admitted
  finally:
    os.remove(path)


@FUZZ
@given(json_values, json_values, st.integers(-2, 12) | st.none() | st.text(max_size=3))
def test_rerank_metrics(run, qrels, k):
  out = _only_library_errors(rerank_metrics, run, qrels, k)
  assert isinstance(out, (dict, DataError))


_CONFIG_DICT = log_config_to_dict(lr.LoGConfig.tiny(vocab_size=64))


@FUZZ
@given(mutations(_CONFIG_DICT))
def test_model_config_reader(data):
  out = _only_library_errors(log_config_from_dict, data)
  assert isinstance(out, (lr.LoGConfig, ConfigError))
