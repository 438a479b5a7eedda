"""Training-data construction (Appendix B): extract, prepare, consolidate, roles, statistics.

The end-to-end test runs the CLI on `tests/data/openscholar_sample.jsonl` (hand-made
OpenScholar-style instances) with scripted annotator responses that contain each
defect the consolidator must catch, and compares defects, records and the
statistics report with counts made by hand (written next to each figure).
"""

import json
import pathlib
import sys

import numpy as np
import pytest

from logrerank_jax.data import records as records_lib
from logrerank_jax.datasets.construction import consolidate as consolidate_lib
from logrerank_jax.datasets.construction import extract as extract_lib
from logrerank_jax.datasets.construction import prompts
from logrerank_jax.datasets.construction import requests as requests_lib
from logrerank_jax.datasets.construction import roles as roles_lib
from logrerank_jax.datasets.construction.lenient_json import loads_lenient
from logrerank_jax.errors import DataError

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "data" / "openscholar_sample.jsonl"
sys.path.insert(0, str(ROOT / "tools"))
import build_training_data  # pylint: disable=g-import-not-at-top,wrong-import-position


def _unit(uid, text, rank=None, fragment=False, score=None):
  """Return one scripted sentence unit (rank omitted when None)."""
  u = {"id": uid, "text": text, "fragment": fragment, "rationale": "scripted"}
  if rank is not None:
    u["rank"] = rank
  if score is not None:
    u["score"] = score
  return u


def _units(*units):
  """Return the strict-JSON content of a sentence response."""
  return json.dumps({"units": list(units)})


def _batch_line(custom_id, content):
  """Return one line of the OpenAI batch output format."""
  return {"id": f"batch_req_{custom_id}", "custom_id": custom_id, "error": None,
          "response": {"status_code": 200, "request_id": "r",
                       "body": {"choices": [{"index": 0, "message": {
                           "role": "assistant", "content": content}}]}}}


# Scripted annotator output, one entry per request (see the module docstring of each defect).
RESPONSES = [
    # os-s-001: code-fenced passage JSON; one fragment unit.
    ("passage|os-s-001", '```json\n{"passages": [{"ref": 0, "rank": 1, "score": 5, '
     '"evidence": "Reports the 38% improvement."}]}\n```'),
    ("sentence|os-s-001|0", _units(
        _unit(1, "BACKGROUND:", 7, fragment=True),
        _unit(2, "Intermittent fasting is widely promoted for metabolic health.", 6),
        _unit(3, "However, its effect on hepatic insulin signalling remains unclear.", 5),
        _unit(4, "METHODS: Male mice were fed on alternate days for eight weeks and compared "
                 "with ad libitum controls.", 3),
        _unit(5, "Hepatic insulin sensitivity was measured with hyperinsulinaemic clamps.", 4),
        _unit(6, "RESULTS: Alternate-day feeding improved hepatic insulin sensitivity by 38% "
                 "relative to controls.", 1),
        _unit(7, "The improvement was associated with lower hepatic triglyceride content.", 2))),
    # os-s-002: duplicate passage ranks (score breaks the tie); trailing-comma damage;
    # duplicate sentence ranks (original position breaks the tie).
    ("passage|os-s-002", json.dumps({"passages": [
        {"ref": 0, "rank": 1, "score": 4, "evidence": "rejection"},
        {"ref": 1, "rank": 1, "score": 5, "evidence": "permeance"}]})),
    ("sentence|os-s-002|0", '{"units": [\n'
     '{"id": 1, "text": "Graphene oxide membranes can sieve ions by the size of their interlayer '
     'channels.", "fragment": false, "rank": 2, "score": 4, "rationale": "mechanism",},\n'
     '{"id": 2, "text": "We fabricated membranes with interlayer spacing controlled by epoxy '
     'cross-linking.", "fragment": false, "rank": 3, "score": 3, "rationale": "method"},\n'
     '{"id": 3, "text": "Salt rejection exceeded 97% for sodium chloride at a spacing of 0.64 nm.", '
     '"fragment": false, "rank": 1, "score": 5, "rationale": "answer"},\n]}'),
    ("sentence|os-s-002|1", _units(
        _unit(1, "Water permeance decreased as the interlayer spacing was reduced.", 1),
        _unit(2, "Cross-linked membranes remained stable after 120 hours of filtration.", 2),
        _unit(3, "These results suggest a trade-off between permeance and selectivity.", 1))),
    # os-m-003: duplicate ranks, a short unit, a unit not in the passage; unparseable response.
    ("passage|os-m-003", json.dumps({"passages": [
        {"ref": 0, "rank": 1, "score": 5, "evidence": "prevalence"},
        {"ref": 1, "rank": 3, "score": 2, "evidence": "sampling"},
        {"ref": 2, "rank": 2, "score": 4, "evidence": "harm"}]})),
    ("sentence|os-m-003|0", _units(
        _unit(1, "Microplastic particles were detected in the gut of 64% of sampled "
                 "freshwater fish.", 1),
        _unit(2, "Fibres were the most common particle type.", 1),
        _unit(3, "See Fig. 2.", 3),
        _unit(4, "Plastic ingestion reduced survival in all fish species.", 2))),
    ("sentence|os-m-003|1", 'Ranking: {"units": [{"id" 1, "text" "Surface trawls with 330 '
     'micrometre nets underestimate small particles."}]}'),
    ("sentence|os-m-003|2", _units(
        _unit(1, "Juvenile perch exposed to polyethylene particles grew more slowly than "
                 "unexposed fish.", 1, score=5),
        _unit(2, "Exposure also changed feeding behaviour.", 2, score=3))),
    # os-m-004: prose around the JSON; a passage without rank; an unknown reference;
    # a sentence unit without rank (both sort last).
    ("passage|os-m-004", 'Here is my ranking.\n{"passages": [{"ref": 0, "score": 5, '
     '"evidence": "precision"}, {"ref": 1, "rank": 1, "score": 4, "evidence": "single"}, '
     '{"ref": 5, "rank": 3, "score": 1, "evidence": "none"}]}\nThanks.'),
    ("sentence|os-m-004|0", _units(
        _unit(1, "Attention-based models predict residue contacts from multiple sequence "
                 "alignments.", 2),
        _unit(2, "Contact precision reached 0.82 on the benchmark set.", 1),
        _unit(3, "Training used 30,000 protein families.", 3))),
    ("sentence|os-m-004|1", _units(
        _unit(1, "Language models trained on single sequences capture evolutionary constraints "
                 "without alignments."),
        _unit(2, "Their structure predictions are less accurate for orphan proteins.", 1))),
    # os-s-006: the passage response is missing; its sentence response alone cannot be used.
    ("sentence|os-s-006|0", _units(
        _unit(1, "Participants deprived of sleep recalled 40% fewer word pairs the next day.", 1))),
    # Noise: a request nobody made, and a second answer to an answered request.
    ("sentence|os-x-999|0", _units(_unit(1, "Nothing to see here at all.", 1))),
    ("passage|os-s-001", json.dumps({"passages": [{"ref": 0, "rank": 1, "score": 1}]})),
]

# Scripted facet-model roles (background, method, result) for every kept sentence.
B, Mth, R, TIE = (0.8, 0.1, 0.1), (0.1, 0.8, 0.1), (0.1, 0.1, 0.8), (0.2, 0.4, 0.4)
ROLES = {
    "os-s-001:0": [("Intermittent fasting is widely promoted for metabolic health.", B),
                   ("However, its effect on hepatic insulin signalling remains unclear.", B),
                   ("METHODS: Male mice were fed on alternate days for eight weeks and compared "
                    "with ad libitum controls.", Mth),
                   ("Hepatic insulin sensitivity was measured with hyperinsulinaemic clamps.", Mth),
                   ("RESULTS: Alternate-day feeding improved hepatic insulin sensitivity by 38% "
                    "relative to controls.", R),
                   ("The improvement was associated with lower hepatic triglyceride content.", R)],
    "os-s-002:0": [("Graphene oxide membranes can sieve ions by the size of their interlayer "
                    "channels.", B),
                   ("We fabricated membranes with interlayer spacing controlled by epoxy "
                    "cross-linking.", Mth),
                   ("Salt rejection exceeded 97% for sodium chloride at a spacing of 0.64 nm.", R)],
    "os-s-002:1": [("Water permeance decreased as the interlayer spacing was reduced.", R),
                   ("Cross-linked membranes remained stable after 120 hours of filtration.", R),
                   ("These results suggest a trade-off between permeance and selectivity.", R)],
    "os-m-003:0": [("Microplastic particles were detected in the gut of 64% of sampled "
                    "freshwater fish.", R),
                   ("Fibres were the most common particle type.", R)],
    "os-m-003:2": [("Juvenile perch exposed to polyethylene particles grew more slowly than "
                    "unexposed fish.", R),
                   ("Exposure also changed feeding behaviour.", TIE)],
    "os-m-004:0": [("Attention-based models predict residue contacts from multiple sequence "
                    "alignments.", Mth),
                   ("Contact precision reached 0.82 on the benchmark set.", R),
                   ("Training used 30,000 protein families.", Mth)],
    "os-m-004:1": [("Language models trained on single sequences capture evolutionary "
                    "constraints without alignments.", B),
                   ("Their structure predictions are less accurate for orphan proteins.", R)],
}

# Every defect the run must report, as (kind, id), counted by hand from RESPONSES.
EXPECTED_DEFECTS = sorted([
    ("malformed_response_line", "line:16"),
    ("unknown_custom_id", "sentence|os-x-999|0"),
    ("duplicate_response", "passage|os-s-001"),
    ("json_repaired", "passage|os-s-001"),          # code fence
    ("fragment", "sentence|os-s-001|0"),
    ("duplicate_rank", "passage|os-s-002"),
    ("json_repaired", "sentence|os-s-002|0"),       # trailing commas
    ("duplicate_rank", "sentence|os-s-002|1"),
    ("duplicate_rank", "sentence|os-m-003|0"),
    ("short_unit", "sentence|os-m-003|0"),
    ("unit_not_in_passage", "sentence|os-m-003|0"),
    ("unparseable_response", "sentence|os-m-003|1"),
    ("passage_dropped", "os-m-003:1"),
    ("json_repaired", "passage|os-m-004"),          # surrounding prose
    ("unknown_ref", "passage|os-m-004"),
    ("missing_rank", "passage|os-m-004"),
    ("missing_rank", "sentence|os-m-004|1"),
    ("missing_response", "passage|os-s-006"),
    ("instance_dropped", "os-s-006"),
])

# Hand count of the Table 6 statistics for this run.
EXPECTED_STATS = {
    "instances_extracted": 5,       # os-s-001, os-s-002, os-m-003, os-m-004, os-s-006
    "instances": 4,                 # os-s-006 dropped (no passage response)
    "single_paper": 2, "multi_paper": 2,
    "passage_pairs": 7,             # 1 + 2 + 2 (os-m-003:1 dropped) + 2
    "units_before": 24,             # 7 + 3 + 3 + 4 + 2 + 3 + 2 (parsed responses of kept instances)
    "units_after": 21,              # 24 - 1 fragment - 1 short - 1 unfaithful
    "removed": {"fragment": 1, "short": 1, "unfaithful": 1, "duplicate": 0, "malformed": 0,
                "no_role": 0},
    "hard_labels": {"background": 4, "method": 5, "result": 11, "tie": 1},
    "role_shares_percent": {"background": 100 * 4 / 21, "method": 100 * 5 / 21,
                            "result": 100 * 11 / 21, "tie": 100 * 1 / 21},
}

# Expected (passage id, passage rank, [sentence ranks in passage order]) per record.
EXPECTED_RANKS = {
    "os-s-001": [("os-s-001:0", 1, [6, 5, 3, 4, 1, 2])],
    "os-s-002": [("os-s-002:0", 2, [2, 3, 1]), ("os-s-002:1", 1, [1, 3, 2])],
    "os-m-003": [("os-m-003:0", 1, [1, 2]), ("os-m-003:2", 2, [1, 2])],
    "os-m-004": [("os-m-004:0", 2, [2, 1, 3]), ("os-m-004:1", 1, [2, 1])],
}


def _write_responses(path):
  """Write RESPONSES as batch output, with one non-JSON line (line 16)."""
  lines = [json.dumps(_batch_line(cid, content)) for cid, content in RESPONSES]
  lines.insert(15, "this line is not JSON")
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _write_roles(path):
  """Write ROLES in the facet-model roles JSONL format."""
  with open(path, "w", encoding="utf-8") as f:
    for pid, sents in ROLES.items():
      f.write(json.dumps({"passage_id": pid, "sentences": [
          {"text": t, "role": list(r)} for t, r in sents]}) + "\n")


def test_end_to_end_defects_validator_and_hand_counted_stats(tmp_path, capsys):
  """Must-show: every scripted defect reported by id, output valid, statistics = hand count."""
  inst = tmp_path / "instances.jsonl"
  reqs = tmp_path / "requests.jsonl"
  resp = tmp_path / "responses.jsonl"
  roles = tmp_path / "roles.jsonl"
  out = tmp_path / "train.jsonl"
  _write_responses(resp)
  _write_roles(roles)
  assert build_training_data.main(["extract", "--input", str(SAMPLE), "--output", str(inst)]) == 0
  assert build_training_data.main(["prepare", "--instances", str(inst), "--output", str(reqs)]) == 0
  assert build_training_data.main([
      "consolidate", "--instances", str(inst), "--responses", str(resp), "--output", str(out),
      "--roles", str(roles)]) == 0
  # Every request of the scripted run is one this pipeline prepared.
  prepared = {json.loads(l)["custom_id"] for l in reqs.read_text().splitlines()}
  assert {cid for cid, _ in RESPONSES} - prepared == {"sentence|os-x-999|0"}

  defects = [json.loads(l) for l in (tmp_path / "train.jsonl.defects.jsonl").read_text().splitlines()]
  assert sorted((d["kind"], d["id"]) for d in defects) == EXPECTED_DEFECTS
  assert all(d["detail"] for d in defects)

  records, report = records_lib.validate_training_file(out)
  assert report.n_invalid == 0 and report.n_records == 4
  got = {r.id: [(p.id, p.rank, [s.rank for s in p.sentences]) for p in r.passages] for r in records}
  assert got == EXPECTED_RANKS
  # Faithfulness: every sentence is its passage's own text, in passage order.
  sample = {i.id: i for i in extract_lib.extract_instances(SAMPLE)[0]}
  for r in records:
    for p in r.passages:
      text = next(x.text for x in sample[r.id].passages if r.id + ":" + str(x.ref) == p.id)
      offsets = [text.index(s.text) for s in p.sentences]
      assert offsets == sorted(offsets)

  stats = json.loads((tmp_path / "train.jsonl.stats.json").read_text())
  for key, want in EXPECTED_STATS.items():
    if key == "role_shares_percent":
      for k, v in want.items():
        # float64 host arithmetic (Python/NumPy, no XLA) on values <= 100: each op rounds to 2.2e-16
        # relative, a few dozen ops stay < 1e-13; the bound is >= 10x that on any CPU.
        assert stats[key][k] == pytest.approx(v, abs=1e-9), k
    else:
      assert stats[key] == want, key
  table = (tmp_path / "train.jsonl.stats.md").read_text()
  rows = {cells[1].strip(): cells[2].strip()
          for cells in (line.split("|") for line in table.splitlines()[2:])}
  assert rows["Sentence units before filtering"] == "24"
  assert rows["Sentence units after filtering"] == "21"
  assert rows["Fragments removed"] == "1" and rows["Short units removed"] == "1"
  assert rows["Hard-label role share: result"] == "52.4%"  # 11 / 21
  assert "consolidate: 4 valid records" in capsys.readouterr().out


def test_extract_counts_and_parsing():
  """Extraction keeps the QA subsets, reports the malformed instance and skips other datasets."""
  instances, report = extract_lib.extract_instances(SAMPLE)
  assert [i.id for i in instances] == ["os-s-001", "os-s-002", "os-m-003", "os-m-004", "os-s-006"]
  assert report.to_json()["single_paper"] == 3 and report.to_json()["multi_paper"] == 2
  assert report.passages == 9 and dict(report.skipped_datasets) == {"tulu_v2_mix": 1}
  assert [(k, i) for k, i, _ in report.defects] == [("malformed_instance", "os-m-bad")]
  m4 = instances[3]
  assert m4.passages[1].title == "" and m4.passages[1].text.startswith("Language models trained")
  assert m4.passages[0].title == "Transformer models for protein structure"
  assert instances[0].answer.startswith("Yes. In mice") and "[Response_End]" not in instances[0].answer
  assert instances[0].question.endswith("in mice?")  # the trailing "Answer:" marker is gone
  assert [i.cited for i in instances] == [(0,), (0, 1), (0, 2), (0, 1), (0,)]


@pytest.mark.parametrize("obj,msg", [
    ({"dataset": "os_single", "id": "a", "input": "Q?", "output": "A [3].",
      "ctxs": [{"title": "t", "text": "x"}]}, "cites references [3]"),
    ({"dataset": "os_single", "id": "a", "messages": [{"role": "user", "content": "Q?"},
                                                    {"role": "assistant", "content": "A"}]},
     "no 'References:'"),
    ({"dataset": "os_multi", "id": "a", "messages": [
        {"role": "user", "content": "References:\n[0] x\n[0] y\nQuestion: q"},
        {"role": "assistant", "content": "A"}]}, "repeats: [0]"),
    ({"dataset": "os_multi", "messages": []}, "'id'"),
], ids=["cites-unknown-ref", "no-reference-list", "duplicate-ref-index", "no-id"])
def test_parse_instance_errors(obj, msg):
  """Malformed instances raise DataError naming the problem."""
  with pytest.raises(DataError, match=msg.replace("[", r"\[").replace("]", r"\]")):
    extract_lib.parse_instance(obj, extract_lib.SubsetRule(), "x")


def test_structured_ctxs_form_and_subset_rule():
  """The structured `ctxs` form parses; the subset rule is configurable and rejects ambiguity."""
  obj = {"dataset": "OS-MP", "id": "k", "input": " Q? ", "output": "A [1].",
         "ctxs": [{"title": "T0", "text": "x0"}, {"title": None, "text": "x1"}]}
  inst = extract_lib.parse_instance(obj, extract_lib.SubsetRule(multi=("-mp",)), "x")
  assert (inst.subset, inst.question, inst.cited) == ("multi_paper", "Q?", (1,))
  assert [(p.ref, p.title) for p in inst.passages] == [(0, "T0"), (1, "")]
  assert extract_lib.parse_instance(obj, extract_lib.SubsetRule(), "x") is None  # not a QA subset
  with pytest.raises(DataError, match="both"):
    extract_lib.SubsetRule().subset("single_and_multi")


def test_prepare_requests_format_and_gold_answer_rule(tmp_path):
  """One passage request per instance, one sentence request per passage; gold answer rule."""
  instances, _ = extract_lib.extract_instances(SAMPLE)
  reqs = requests_lib.build_requests(instances)
  assert len(reqs) == 5 + 9
  for r in reqs:
    assert set(r) == {"custom_id", "method", "url", "body"}
    assert r["method"] == "POST" and r["url"] == "/v1/chat/completions"
    assert r["body"]["model"] and [m["role"] for m in r["body"]["messages"]] == ["system", "user"]
  with_gold = {r["custom_id"] for r in reqs if "Reference answer (written from this passage"
               in r["body"]["messages"][1]["content"]}
  assert with_gold == {"sentence|os-s-001|0", "sentence|os-s-006|0"}  # single-paper, one cited
  p3 = next(r for r in reqs if r["custom_id"] == "passage|os-m-003")["body"]["messages"][1]["content"]
  assert p3.index("[0] Title: Microplastics") < p3.index("[1] Title: Sampling") < p3.index("[2] Title:")
  assert "How common is microplastic ingestion" in p3 and "juvenile perch [2]" in p3
  manifest = json.loads(open(requests_lib.write_requests(tmp_path / "r.jsonl", reqs)).read())
  assert manifest["prompt_version"] == prompts.PROMPT_VERSION
  assert (manifest["passage_requests"], manifest["sentence_requests"]) == (5, 9)


@pytest.mark.parametrize("cid,want", [
    ("passage|a|b", ("passage", "a|b", None)),
    ("sentence|a|b|12", ("sentence", "a|b", 12)),
], ids=["passage-with-pipe", "sentence-with-pipe"])
def test_custom_id_round_trip(cid, want):
  """custom_ids parse back even when instance ids contain the separator."""
  assert requests_lib.parse_custom_id(cid) == want


@pytest.mark.parametrize("bad", ["sentence|a|x", "passage|", "other|a", None],
                         ids=["non-int-ref", "empty-id", "unknown-kind", "not-a-string"])
def test_custom_id_rejects(bad):
  """Malformed custom_ids raise DataError."""
  with pytest.raises(DataError):
    requests_lib.parse_custom_id(bad)


@pytest.mark.parametrize("text,repairs", [
    ('{"a": [1, 2]}', []),
    ('```json\n{"a": [1, 2]}\n```', ["code_fence"]),
    ('```\n{"a": [1, 2]}\n```', ["code_fence"]),
    ('Sure! {"a": [1, 2]} Hope this helps.', ["surrounding_text"]),
    ('Units [see below]: {"a": [1, 2]}', ["surrounding_text"]),
    ('{"a": [1, 2,],}', ["trailing_comma"]),
    ('{\u201ca\u201d: [1, 2]}', ["smart_quotes"]),
    ('{"a": [1, 2], "b": True, "c": None}', ["python_literal"]),
    ('{"a": [1, 2', ["unclosed_bracket"]),
    ('{"a": [1, 2], "s": "trunc', ["unclosed_bracket"]),
], ids=["strict", "fence-json", "fence-bare", "prose", "brackets-in-prose", "trailing-comma", "smart-quotes",
        "python-literals", "truncated", "truncated-string"])
def test_loads_lenient_repairs(text, repairs):
  """Each kind of minor damage is repaired and named."""
  obj, got = loads_lenient(text)
  assert obj["a"] == [1, 2] and got == repairs


@pytest.mark.parametrize("text", ["", "no json here", '{"a" 1}', '{"a": [1, 2}]'],
                         ids=["empty", "no-json", "missing-colon", "crossed-brackets"])
def test_loads_lenient_rejects(text):
  """Text that no repair fixes raises DataError."""
  with pytest.raises(DataError):
    loads_lenient(text)


def _one_instance():
  """Return a one-passage instance for focused consolidation tests."""
  text = ("Aspirin lowered the risk of colorectal adenoma by 20%.  The trial enrolled "
          "1,121 adults.\nAdherence was high in both arms.")
  return extract_lib.Instance(id="q1", dataset="os_single", subset="single_paper",
                              question="Does aspirin prevent adenoma?", answer="Yes [0].",
                              passages=(extract_lib.Passage(0, "T", text),), cited=(0,))


def _responses(units, passages=None):
  """Return {custom_id: content} for `_one_instance`."""
  return {"passage|q1": json.dumps({"passages": passages or [{"ref": 0, "rank": 1, "score": 5}]}),
          "sentence|q1|0": _units(*units)}


def test_consolidate_whitespace_tolerant_match_keeps_passage_text():
  """Units match across whitespace differences; the record keeps the passage's own span."""
  inst = _one_instance()
  res = consolidate_lib.consolidate(
      [inst], _responses([_unit(1, "The trial enrolled 1,121   adults.", 2),
                          _unit(2, "Adherence was high in both arms.", 3),
                          _unit(3, "Aspirin lowered the risk of colorectal adenoma by 20%.", 1)]),
      roles_lib.SectionCueAnnotator())
  (rec,) = res.records
  sents = rec.passages[0].sentences
  assert [s.text for s in sents] == ["Aspirin lowered the risk of colorectal adenoma by 20%.",
                                     "The trial enrolled 1,121 adults.",
                                     "Adherence was high in both arms."]
  assert [s.rank for s in sents] == [1, 2, 3]
  assert [d.kind for d in res.defects] == ["unit_out_of_order"]  # unit 3 came after units 1-2


def test_consolidate_duplicate_unit_invalid_rank_and_role_failure():
  """Repeated units are removed, invalid ranks sort last, a failing role source drops the passage."""
  inst = _one_instance()
  units = [_unit(1, "Aspirin lowered the risk of colorectal adenoma by 20%.", 2, score=9),
           _unit(2, "Aspirin lowered the risk of colorectal adenoma by 20%.", 1),
           _unit(3, "The trial enrolled 1,121 adults.", 1.5),
           "not a unit"]
  res = consolidate_lib.consolidate([inst], _responses(units), roles_lib.SectionCueAnnotator())
  kinds = sorted(d.kind for d in res.defects)
  assert kinds == ["duplicate_unit", "invalid_rank", "invalid_score", "malformed_unit"]
  assert [s.rank for s in res.records[0].passages[0].sentences] == [1, 2]
  assert res.stats.removed["duplicate"] == 1 and res.stats.removed["malformed"] == 1

  class Failing:
    def annotate(self, passage_id, title, text, spans):
      raise DataError(f"no role for {passage_id}")

  res = consolidate_lib.consolidate([inst], _responses(units[:1]), Failing())
  assert res.records == []
  assert [(d.kind, d.id) for d in res.defects if d.kind != "invalid_score"] == [
      ("role_missing", "q1:0"), ("passage_dropped", "q1:0"), ("instance_dropped", "q1")]
  assert res.stats.units_before == res.stats.units_after + sum(res.stats.removed.values())


def test_read_responses_failed_request_and_envelope(tmp_path):
  """Error lines and envelopes without content are reported and count as no response."""
  p = tmp_path / "resp.jsonl"
  lines = [{"custom_id": "passage|q1", "response": None, "error": {"code": "500", "message": "x"}},
           {"custom_id": "sentence|q1|0", "response": {"status_code": 200, "body": {"choices": []}}}]
  p.write_text("\n".join(json.dumps(l) for l in lines) + "\n")
  defects = []
  got = consolidate_lib.read_responses(p, defects)
  assert got == {"passage|q1": None, "sentence|q1|0": None}
  assert [(d.kind, d.id) for d in defects] == [("failed_request", "passage|q1"),
                                               ("malformed_envelope", "sentence|q1|0")]
  res = consolidate_lib.consolidate([_one_instance()], got, roles_lib.SectionCueAnnotator(),
                                    defects=defects)
  assert [d.kind for d in res.defects][2:] == ["instance_dropped"]


def test_section_cue_annotator_known_answer():
  """Section labels set the role of the sentences they head; cues and uniform elsewhere."""
  text = ("BACKGROUND: Obesity is common. OBJECTIVE: To test X. METHODS AND RESULTS: We used a cohort "
          "and found lower risk. The sky is blue.")
  spans = []
  for s in ["Obesity is common.", "OBJECTIVE: To test X.", "METHODS AND RESULTS: We used a cohort "
            "and found lower risk.", "The sky is blue."]:
    k = text.index(s)
    spans.append((k, k + len(s)))
  ann = roles_lib.SectionCueAnnotator()
  got = ann.annotate("p", "", text, spans)
  assert got == [(1.0, 0.0, 0.0), (1.0, 0.0, 0.0), (0.0, 0.5, 0.5), (0.0, 0.5, 0.5)]
  # Without labels: cue phrases (one result cue -> 1.25 / 1.75), none -> uniform.
  got = ann.annotate("p", "", "We found lower risk. The sky is blue.", [(0, 20), (21, 37)])
  # float64 host arithmetic (Python/NumPy, no XLA) on values <= 100: each op rounds to 2.2e-16
  # relative, a few dozen ops stay < 1e-13; the bound is >= 10x that on any CPU.
  assert got[0] == pytest.approx((0.25 / 1.75, 0.25 / 1.75, 1.25 / 1.75), abs=1e-12)
  assert got[1] == pytest.approx((1 / 3, 1 / 3, 1 / 3), abs=1e-12)
  assert dict(ann.sources) == {"label": 4, "cue": 1, "none": 1}


@pytest.mark.parametrize("n,max_sentences,overlap", [(1, 4, 1), (4, 4, 1), (10, 4, 1), (11, 5, 2),
                                                     (7, 3, 0)],
                         ids=["single", "exact", "three-windows", "overlap-2", "no-overlap"])
def test_windowed_facet_annotator_matches_numpy(n, max_sentences, overlap):
  """Every sentence gets a role; overlaps are averaged exactly as a NumPy reference does."""
  rng = np.random.default_rng(n * 100 + max_sentences)
  calls = []

  def model(sents):
    assert 1 <= len(sents) <= max_sentences
    calls.append(len(sents))
    # Depends on the window's content and position, so averaging is observable.
    return [tuple(np.asarray(rng.dirichlet([1.0, 1.0, 1.0]), dtype=float)) for _ in sents]

  ann = roles_lib.WindowedFacetAnnotator(model, max_sentences=max_sentences, overlap=overlap)
  text = " ".join(f"Sentence number {i}." for i in range(n))
  spans, k = [], 0
  for i in range(n):
    s = f"Sentence number {i}."
    k = text.index(s, k)
    spans.append((k, k + len(s)))
  # Reference: replay the same random draws window by window and average with NumPy.
  rng_ref = np.random.default_rng(n * 100 + max_sentences)
  acc, cnt = np.zeros((n, 3)), np.zeros(n)
  for a, b in ann.windows(n):
    for i in range(a, b):
      acc[i] += rng_ref.dirichlet([1.0, 1.0, 1.0])
      cnt[i] += 1
  want = acc / cnt[:, None]
  got = np.asarray(ann.annotate("p", "", text, spans))
  assert got.shape == (n, 3) and cnt.min() >= 1
  # float64 host arithmetic (Python/NumPy, no XLA) on values <= 100: each op rounds to 2.2e-16
  # relative, a few dozen ops stay < 1e-13; the bound is >= 10x that on any CPU.
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
  assert sum(calls) == int(cnt.sum()) and max(calls) <= max_sentences


def test_jsonl_role_source_errors(tmp_path):
  """A missing sentence or a non-distribution role is a DataError naming it."""
  p = tmp_path / "roles.jsonl"
  p.write_text(json.dumps({"passage_id": "a:0", "sentences": [
      {"text": "One  two three.", "role": [0.2, 0.3, 0.5]}]}) + "\n")
  src = roles_lib.JsonlRoleSource(p)
  assert src.annotate("a:0", "", "One two three.", [(0, 14)]) == [(0.2, 0.3, 0.5)]
  with pytest.raises(DataError, match="no role for passage 'a:1'"):
    src.annotate("a:1", "", "One two three.", [(0, 14)])
  p.write_text(json.dumps({"passage_id": "a:0", "sentences": [
      {"text": "x", "role": [0.5, 0.6, 0.1]}]}) + "\n")
  with pytest.raises(DataError, match="not a probability distribution"):
    roles_lib.JsonlRoleSource(p)


def test_send_requests_retries_then_writes_batch_output(tmp_path):
  """The optional client retries server errors and writes lines `read_responses` accepts."""
  import urllib.error  # pylint: disable=g-import-not-at-top
  attempts = []

  def post(url, data, headers):
    attempts.append(url)
    if len(attempts) == 1:
      raise urllib.error.HTTPError(url, 503, "busy", {}, None)
    body = json.loads(data)
    return json.dumps({"choices": [{"message": {"content": body["messages"][-1]["content"][:5]}}]}
                      ).encode()

  reqs = requests_lib.build_requests([_one_instance()])
  out = tmp_path / "resp.jsonl"
  counts = requests_lib.send_requests(reqs, "http://x", out, requests_per_second=0, post=post,
                                      backoff_s=0.0)
  assert counts == {"ok": 2, "failed": 0} and len(attempts) == 3
  assert attempts[0] == "http://x/v1/chat/completions"
  defects = []
  got = consolidate_lib.read_responses(out, defects)
  assert set(got) == {"passage|q1", "sentence|q1|0"} and defects == []


def test_cli_heuristic_roles_output_is_valid(tmp_path):
  """With the default heuristic roles the output validates and every role has a counted source."""
  inst, resp, out = tmp_path / "i.jsonl", tmp_path / "r.jsonl", tmp_path / "t.jsonl"
  _write_responses(resp)
  assert build_training_data.main(["extract", "--input", str(SAMPLE), "--output", str(inst)]) == 0
  assert build_training_data.main(["consolidate", "--instances", str(inst), "--responses",
                                   str(resp), "--output", str(out)]) == 0
  records, report = records_lib.validate_training_file(out)
  stats = json.loads((tmp_path / "t.jsonl.stats.json").read_text())
  assert report.n_records == 4 and sum(stats["role_sources"].values()) == stats["units_after"] == 21
  # os-s-001 is a structured abstract: its six sentences take their section's role.
  roles = [s.role for s in records[0].passages[0].sentences]
  assert roles == [(1.0, 0.0, 0.0)] * 2 + [(0.0, 1.0, 0.0)] * 2 + [(0.0, 0.0, 1.0)] * 2


def test_cli_reports_unreadable_input(tmp_path, capsys):
  """A missing input file is a one-line error and exit status 1."""
  assert build_training_data.main(["prepare", "--instances", str(tmp_path / "none.jsonl"),
                                   "--output", str(tmp_path / "r.jsonl")]) == 1
  assert "build_training_data: error:" in capsys.readouterr().err
