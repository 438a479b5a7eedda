"""Tests of the training-record schema and validator (logrerank_jax.data.records)."""

import copy
import json
import math

import hypothesis
from hypothesis import strategies as st
import pytest

from logrerank_jax.data import records as R
from logrerank_jax.errors import DataError


def _good(qid="q1"):
  """Return a valid training record dict with 2 passages of 2 and 1 sentences."""
  return {
      "id": qid,
      "question": "Does aspirin reduce the risk of stroke?",
      "passages": [
          {"id": "p1", "title": "Aspirin trial", "rank": 2, "sentences": [
              {"text": "We enrolled 400 patients.", "rank": 2, "role": [0.0, 1.0, 0.0]},
              {"text": "Aspirin reduced stroke by 20%.", "rank": 1, "role": [0.0, 0.0, 1.0]}]},
          {"id": "p2", "title": "", "rank": 1, "sentences": [
              {"text": "Stroke is a leading cause of death.", "rank": 1,
               "role": [0.5, 0.25, 0.25]}]},
      ],
  }


def _line(obj):
  """Serialise one record the way a producer would."""
  return json.dumps(obj).encode("utf-8")


def _mutated(fn):
  """Return the bytes of a good record 'q_bad' after `fn` edits it in place."""
  obj = _good("q_bad")
  fn(obj)
  return _line(obj)


def _set(path, value):
  """Return an edit that sets obj[path[0]][path[1]]... = value."""
  def fn(obj):
    for k in path[:-1]:
      obj = obj[k]
    obj[path[-1]] = value
  return fn


def _delete(path):
  """Return an edit that deletes obj[path[0]]...[path[-1]]."""
  def fn(obj):
    for k in path[:-1]:
      obj = obj[k]
    del obj[path[-1]]
  return fn


S0 = ("passages", 0, "sentences", 0)
# (id, bytes of line 3, violation class, fragment of the reason)
VIOLATION_CASES = [
    ("non_utf8", b'{"id": "q\xff\xfe"}', "non_utf8", "byte 0xff"),
    ("truncated_json", b'{"id": "q_bad", "question": ', "malformed_json", "malformed JSON"),
    ("two_values", b'{"id": "x"} {"id": "y"}', "malformed_json", "Extra data"),
    ("top_level_list", b"[1, 2]", "wrong_type", "expected a JSON object, got list"),
    ("missing_question", _mutated(_delete(("question",))), "missing_field", "'question'"),
    ("missing_role", _mutated(_delete(S0 + ("role",))), "missing_field", "'role'"),
    ("unknown_field", _mutated(_set(("passages", 1, "sentence"), [])), "unknown_field",
     "'sentence'"),
    ("text_nan", _mutated(_set(S0 + ("text",), "@@")).replace(b'"@@"', b"NaN"), "wrong_type",
     "got nan"),
    ("text_none", _mutated(_set(S0 + ("text",), None)), "wrong_type", "got null"),
    ("text_number", _mutated(_set(S0 + ("text",), 3.5)), "wrong_type", "got number"),
    ("text_dict", _mutated(_set(S0 + ("text",), {"contexts": ["a"]})), "wrong_type", "got object"),
    ("text_empty", _mutated(_set(S0 + ("text",), "")), "empty_text", "empty string"),
    ("text_whitespace", _mutated(_set(S0 + ("text",), " \t ")), "empty_text", "empty string"),
    ("question_empty", _mutated(_set(("question",), "")), "empty_text", "record.question"),
    ("title_none", _mutated(_set(("passages", 0, "title"), None)), "wrong_type",
     "passages[0].title"),
    ("passage_rank_repeat", _mutated(_set(("passages", 0, "rank"), 1)), "rank_not_permutation",
     "[1, 1]"),
    ("passage_rank_gap", _mutated(_set(("passages", 0, "rank"), 3)), "rank_not_permutation",
     "1..2"),
    ("sentence_rank_zero_based", _mutated(lambda o: [
        s.update(rank=s["rank"] - 1) for s in o["passages"][0]["sentences"]]),
     "rank_not_permutation", "[0, 1]"),
    ("rank_float", _mutated(_set(S0 + ("rank",), 2.0)), "wrong_type", "expected an integer"),
    ("rank_bool", _mutated(_set(("passages", 1, "rank"), True)), "wrong_type",
     "expected an integer, got bool"),
    ("no_passages", _mutated(_set(("passages",), [])), "no_passages", "no passages"),
    ("no_sentences", _mutated(_set(("passages", 1, "sentences"), [])), "no_sentences",
     "passages[1]"),
    ("sentences_not_list", _mutated(_set(("passages", 1, "sentences"), "abc")), "wrong_type",
     "expected a list"),
    ("role_sum", _mutated(_set(S0 + ("role",), [0.3, 0.3, 0.3])), "role_not_simplex", "sums to"),
    ("role_negative", _mutated(_set(S0 + ("role",), [-0.5, 0.5, 1.0])), "role_not_simplex",
     "negative"),
    ("role_len2", _mutated(_set(S0 + ("role",), [0.5, 0.5])), "role_not_simplex", "got 2"),
    ("role_nan", _mutated(_set(S0 + ("role",), [0.5, 0.5, "@@"])).replace(b'"@@"', b"NaN"),
     "role_not_simplex", "not finite"),
    ("role_inf", _mutated(_set(S0 + ("role",), [0.5, 0.5, "@@"])).replace(b'"@@"', b"Infinity"),
     "role_not_simplex", "not finite"),
    ("role_strings", _mutated(_set(S0 + ("role",), ["0.5", "0.5", "0"])), "wrong_type",
     "expected numbers"),
    ("duplicate_query_id", _line(_good("q1")), "duplicate_id", "line 1"),
    ("duplicate_passage_id", _mutated(_set(("passages", 1, "id"), "p1")), "duplicate_id",
     "repeats passages[0].id"),
]


def _write(tmp_path, lines, name="train.jsonl"):
  """Write byte lines to a file and return its path."""
  path = tmp_path / name
  path.write_bytes(b"\n".join(lines) + b"\n")
  return path


@pytest.mark.parametrize("bad,kind,fragment", [c[1:] for c in VIOLATION_CASES],
                         ids=[c[0] for c in VIOLATION_CASES])
def test_each_violation_is_caught_with_its_line_number(tmp_path, bad, kind, fragment):
  lines = [_line(_good("q1")), _line(_good("q2")), bad, _line(_good("q4"))]
  path = _write(tmp_path, lines)
  # Default: refuse, naming file:line and the reason.
  with pytest.raises(DataError) as exc:
    R.validate_training_file(path)
  msg = str(exc.value)
  assert f"{path}:3: " in msg and fragment in msg, msg
  assert f"{kind}: 1" in msg, msg
  assert "\n" not in msg
  # skip_invalid: the three good lines survive, the bad one is counted in its class.
  recs, report = R.validate_training_file(path, skip_invalid=True)
  assert [r.id for r in recs] == ["q1", "q2", "q4"]
  assert (report.n_lines, report.n_records, report.n_invalid) == (4, 3, 1)
  assert report.counts[kind] == 1
  assert sum(report.counts.values()) >= 1
  assert len(report.errors) == 1 and report.errors[0].startswith(f"{path}:3: ")
  assert fragment in report.errors[0]


def test_known_answer_parse(tmp_path):
  path = _write(tmp_path, [_line(_good("q1"))])
  recs, report = R.validate_training_file(path)
  assert report.n_invalid == 0 and report.counts == {v: 0 for v in R.VIOLATIONS}
  (rec,) = recs
  assert rec == R.TrainingRecord(
      id="q1", question="Does aspirin reduce the risk of stroke?",
      passages=(
          R.TrainingPassage("p1", "Aspirin trial", 2, (
              R.TrainingSentence("We enrolled 400 patients.", 2, (0.0, 1.0, 0.0)),
              R.TrainingSentence("Aspirin reduced stroke by 20%.", 1, (0.0, 0.0, 1.0)))),
          R.TrainingPassage("p2", "", 1, (
              R.TrainingSentence("Stroke is a leading cause of death.", 1, (0.5, 0.25, 0.25)),)),
      ))
  assert rec.to_json() == _good("q1")


@pytest.mark.parametrize("role,ok", [
    ([1, 0, 0], True),                       # ints are numbers
    ([0.5, 0.5, 0.00009], True),             # sum 1.00009: inside the 1e-4 tolerance
    ([0.5, 0.5, 0.00011], False),            # sum 1.00011: outside
    ([0.333333, 0.333333, 0.333333], True),  # rounded thirds, sum 0.999999
    ([0.0, 0.0, 0.0], False),
], ids=["ints", "sum_1.00009", "sum_1.00011", "rounded_thirds", "all_zero"])
def test_role_tolerance_boundary(role, ok):
  obj = _good()
  obj["passages"][0]["sentences"][0]["role"] = role
  if ok:
    rec = R.parse_training_record(obj)
    assert math.isclose(sum(rec.passages[0].sentences[0].role), sum(role))
  else:
    with pytest.raises(DataError, match="role_not_simplex|sums to"):
      R.parse_training_record(obj)


def test_every_bad_line_listed_first_five_in_full(tmp_path):
  lines = []
  bad_linenos = []
  for i in range(12):
    if i % 3 == 1 or i >= 9:
      lines.append(b"{not json")
      bad_linenos.append(i + 1)
    else:
      lines.append(_line(_good(f"q{i}")))
  lines.insert(4, b"   ")  # a blank line still counts for the numbering
  bad_linenos = [n + 1 if n >= 5 else n for n in bad_linenos]
  path = _write(tmp_path, lines)
  with pytest.raises(DataError) as exc:
    R.validate_training_file(path)
  msg = str(exc.value)
  assert bad_linenos == [2, 6, 9, 11, 12, 13]
  assert f"6 of 12 lines invalid (malformed_json: 6)" in msg, msg
  assert "bad lines: 2,6,9,11,12,13;" in msg
  for n in bad_linenos[:5]:
    assert f"{path}:{n}: malformed JSON" in msg
  assert f"{path}:13:" not in msg and "and 1 more" in msg
  assert exc.value.report.errors[-1].startswith(f"{path}:13: ")


def test_parse_record_lists_every_problem():
  obj = _good()
  obj["question"] = None
  obj["passages"][1]["sentences"][0]["role"] = [1, 1, 1]
  del obj["passages"][0]["title"]
  with pytest.raises(DataError) as exc:
    R.parse_training_record(obj, where="train.jsonl:7")
  msg = str(exc.value)
  assert msg.startswith("train.jsonl:7: ")
  assert "record.question: expected a string, got null" in msg
  assert "passages[0]: missing field 'title'" in msg
  assert "passages[1].sentences[0].role: [1, 1, 1] sums to 3" in msg


def test_unreadable_path_raises_data_error(tmp_path):
  with pytest.raises(DataError, match="cannot read training file"):
    R.validate_training_file(tmp_path / "missing.jsonl")


def test_write_then_validate_round_trip(tmp_path):
  recs = [R.parse_training_record(_good(f"q{i}")) for i in range(3)]
  path = tmp_path / "rt.jsonl"
  R.write_training_file(path, recs)
  back, report = R.validate_training_file(path)
  assert back == recs and report.n_records == 3


def test_write_refuses_invalid_record(tmp_path):
  rec = R.parse_training_record(_good())
  bad = R.TrainingRecord(rec.id, rec.question, rec.passages[:1])  # ranks now {2}: not 1..1
  with pytest.raises(DataError, match="rank_not_permutation|not a permutation"):
    R.write_training_file(tmp_path / "x.jsonl", [bad])


# --- fuzz: whatever the bytes, only DataError (or a clean report) comes out ---------------------

_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                       st.text(max_size=8))
_json_value = st.recursive(
    _json_leaf,
    lambda kids: st.one_of(st.lists(kids, max_size=4),
                           st.dictionaries(st.sampled_from(
                               ["id", "question", "passages", "title", "rank", "sentences",
                                "text", "role", "x"]), kids, max_size=5)),
    max_leaves=20)


def _paths(obj, prefix=()):
  """Yield the paths of every nested value of a JSON object."""
  yield prefix
  if isinstance(obj, dict):
    for k, v in obj.items():
      yield from _paths(v, prefix + (k,))
  elif isinstance(obj, list):
    for i, v in enumerate(obj):
      yield from _paths(v, prefix + (i,))


@st.composite
def _fuzz_line(draw):
  """Draw one line: random bytes, a random JSON value, or a good record with one value replaced."""
  kind = draw(st.sampled_from(["bytes", "json", "mutated"]))
  if kind == "bytes":
    return draw(st.binary(max_size=40)).replace(b"\n", b" ")
  if kind == "json":
    return json.dumps(draw(_json_value)).encode()
  obj = _good(draw(st.sampled_from(["q1", "q2"])))
  paths = [p for p in _paths(obj) if p]
  path = draw(st.sampled_from(paths))
  target = obj
  for k in path[:-1]:
    target = target[k]
  target[path[-1]] = draw(_json_value)
  return json.dumps(obj).encode()


@hypothesis.settings(max_examples=150, deadline=None,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(lines=st.lists(_fuzz_line(), min_size=1, max_size=5))
def test_fuzz_validator_raises_only_data_error(tmp_path, lines):
  path = tmp_path / "fuzz.jsonl"
  path.write_bytes(b"\n".join(lines))
  try:
    recs, report = R.validate_training_file(path)
    assert report.n_invalid == 0 and len(recs) == report.n_lines
  except DataError as e:
    assert e.report.n_invalid >= 1
  recs, report = R.validate_training_file(path, skip_invalid=True)
  assert report.n_records + report.n_invalid == report.n_lines
  assert len(report.errors) == report.n_invalid
  for rec in recs:  # whatever survives is a valid record that round-trips
    assert R.parse_training_record(copy.deepcopy(rec.to_json())) == rec
