"""Teacher files (distillation) against the training units: entries that match no query are a
stale or mistyped file and are refused, unless skipped training lines explain them."""

import json
import logging

import ml_collections
import pytest

from logrerank_jax.data.packing import QueryInput
from logrerank_jax.errors import DataError
from logrerank_jax.training import data as data_lib
from logrerank_jax.training import stages


def _unit(qid, passages=("p1", "p2")):
  return data_lib.Unit(qid=qid, query=QueryInput("q?", [["s."] for _ in passages]),
                       passage_ids=tuple(passages), passage_rank=(1, 2), sentence_rank=((1,), (1,)),
                       role=(((1.0, 0.0, 0.0),),) * 2)


def _entry(qid, labelled=True):
  return {"id": qid, "scores": {"p1": 0.9, "p2": 0.1}, "labelled": labelled}


def test_unmatched_entries_are_refused(tmp_path):
  units = [_unit("a"), _unit("b")]
  teacher = {"a": {"scores": {"p1": 0.9, "p2": 0.1}, "labelled": False},
             "x1": {"scores": {"p1": 0.5}, "labelled": True},
             "x2": {"scores": {"p1": 0.5}, "labelled": True}}
  with pytest.raises(DataError, match=r"^t.jsonl: 2 of 3 teacher entries match no training "
                                      r"query \(first: 'x1'\); is it the teacher file"):
    data_lib.attach_teacher(units, teacher, source="t.jsonl")
  # Every entry matched: attached; a unit without an entry keeps no teacher.
  out = data_lib.attach_teacher(units, {"a": teacher["a"]})
  assert (out[0].teacher, out[0].gold, out[1].teacher, out[1].gold) == ((0.9, 0.1), False, (), True)


def test_skip_invalid_logs_unmatched_entries_instead(tmp_path, caplog):
  """The trainer's path: a teacher file naming a query whose line skip_invalid dropped trains
  with a logged count; without skip_invalid the same file is refused, naming the file."""
  path = tmp_path / "teacher.jsonl"
  path.write_text("".join(json.dumps(e) + "\n" for e in (_entry("a", False), _entry("dropped"))))
  units = [_unit("a"), _unit("b")]
  config = ml_collections.ConfigDict({"teacher_file": str(path), "skip_invalid": False})
  with pytest.raises(DataError, match=f"^{path}: 1 of 2 teacher entries match no training query "
                                      r"\(first: 'dropped'\)"):
    stages.with_teacher(units, config)
  config.skip_invalid = True
  with caplog.at_level(logging.WARNING, logger=data_lib.__name__):
    out = stages.with_teacher(units, config)
  assert "1 of 2 teacher entries match no training query (first: 'dropped')" in caplog.text
  assert out[0].teacher == (0.9, 0.1) and out[1].teacher == ()
