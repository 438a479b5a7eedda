"""Bad input across every reader: a one-line library error naming file/line/key, no record lost.

Readers covered (table-driven, one named case per row):
  * training records   `validate_training_file` (strict raises; skip_invalid counts and carries on)
  * inference input    `read_inference_file` and `tools/rerank.py --strict` (one subprocess run
                       over one file holding every bad line between real SciFact pools)
  * pools              `tools/evaluate.py read_pools`, `read_scholarqabench`
  * qrels / TREC runs  `read_qrels`, `read_trec_run`, `rerank_metrics` run checks
  * configs            `tools/train.py` unknown/missing keys, bad values, model_config.json keys
  * model folders      `load_model` on folders missing parts
`CASE_COUNTS` at the bottom is what docs/RELIABILITY.md reports.
"""

import importlib
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

from logrerank_jax.data.inference_input import InferenceRecord, read_inference_file
from logrerank_jax.data.records import validate_training_file
from logrerank_jax.datasets.scholarqabench import read_scholarqabench
from logrerank_jax.errors import CheckpointError, ConfigError, DataError, LogRerankError
from logrerank_jax.evaluation import read_qrels, read_trec_run, rerank_metrics

ROOT = pathlib.Path(__file__).resolve().parent.parent
LONG_TEXT = "Tumour growth was measured in every sample. " * 1137  # 50,031 characters
WORDS_NO_STOP = " ".join(f"word{i}" for i in range(3000))  # one sentence, far beyond a 128 window


def load_tool(name):
  """The module behind tools/<name>.py and `logrerank <name>`."""
  return importlib.import_module(f"logrerank_jax.cli.{name}")


def write_lines(path, lines):
  """Write str/bytes lines joined by newlines; return the path as a string."""
  data = b"\n".join(x if isinstance(x, bytes) else x.encode("utf-8") for x in lines) + b"\n"
  pathlib.Path(path).write_bytes(data)
  return str(path)


def assert_one_line(err, *needles):
  """The error is a library error, one line, and names every needle."""
  msg = str(err)
  assert isinstance(err, LogRerankError), type(err)
  assert "\n" not in msg, msg
  for n in needles:
    assert n in msg, (n, msg)


# ------------------------------------------------------------------------------ training records

def sent(text="The drug lowered blood pressure.", rank=1, role=(0.2, 0.3, 0.5)):
  return {"text": text, "rank": rank, "role": list(role)}


def passage(pid="p1", rank=1, sentences=None, title="A title"):
  return {"id": pid, "title": title, "rank": rank, "sentences": sentences or [sent()]}


def record(qid="q", passages=None, question="Does the drug lower blood pressure?"):
  return {"id": qid, "question": question, "passages": passages or [passage()]}


def js(obj):
  return json.dumps(obj, ensure_ascii=False)


def _with(**kw):
  r = record()
  r.update(kw)
  return js(r)


# (id, line, violation class, substring of the message)
TRAINING_BAD = [
    ("malformed-json", '{"id": "q", "question": ', "malformed_json", "malformed JSON"),
    ("trailing-garbage", js(record()) + " x", "malformed_json", "malformed JSON"),
    ("non-utf8", b'{"id": "q\xff", "question": "x", "passages": []}', "non_utf8", "not UTF-8"),
    ("huge-int", '{"id": ' + "9" * 5000 + "}", "malformed_json", "malformed JSON"),
    ("deep-nesting", "[" * 100000 + "]" * 100000, "malformed_json", "malformed JSON"),
    ("top-level-list", "[1, 2]", "wrong_type", "expected a JSON object, got list"),
    ("top-level-number", "3", "wrong_type", "expected a JSON object, got number"),
    ("top-level-string", '"text"', "wrong_type", "expected a JSON object, got string"),
    ("nan-question", _with(question=float("nan")), "wrong_type", "record.question: expected a string, got nan"),
    ("null-question", _with(question=None), "wrong_type", "got null"),
    ("number-question", _with(question=7), "wrong_type", "got number"),
    ("dict-question", _with(question={"a": 1}), "wrong_type", "got object"),
    ("list-question", _with(question=["a"]), "wrong_type", "got list"),
    ("empty-question", _with(question=""), "empty_text", "record.question: empty string"),
    ("blank-id", _with(id="   "), "empty_text", "record.id: empty string"),
    ("nan-sentence-text", js(record(passages=[passage(sentences=[sent(float("nan"))])])),
     "wrong_type", "passages[0].sentences[0].text"),
    ("dict-sentence-text", js(record(passages=[passage(sentences=[sent({"t": 1})])])),
     "wrong_type", "got object"),
    ("empty-sentence-text", js(record(passages=[passage(sentences=[sent("")])])),
     "empty_text", "passages[0].sentences[0].text: empty string"),
    ("number-title", js(record(passages=[passage(title=5)])), "wrong_type", "passages[0].title"),
    ("zero-passages", _with(passages=[]), "no_passages", "no passages"),
    ("passages-not-list", _with(passages={"p": 1}), "wrong_type", "record.passages"),
    ("zero-sentences", js(record(passages=[{"id": "p", "title": "", "rank": 1, "sentences": []}])),
     "no_sentences", "passage has no sentences"),
    ("passage-rank-duplicate", js(record(passages=[passage("a", 1), passage("b", 1)])),
     "rank_not_permutation", "not a permutation of 1..2"),
    ("passage-rank-zero-based", js(record(passages=[passage("a", 0), passage("b", 1)])),
     "rank_not_permutation", "not a permutation"),
    ("passage-rank-gap", js(record(passages=[passage("a", 1), passage("b", 3)])),
     "rank_not_permutation", "not a permutation"),
    ("sentence-rank-gap", js(record(passages=[passage(sentences=[sent(rank=2), sent(rank=3)])])),
     "rank_not_permutation", "sentence ranks"),
    ("float-rank", js(record(passages=[passage(rank=1.0)])), "wrong_type", "expected an integer"),
    ("bool-rank", js(record(passages=[passage(rank=True)])), "wrong_type", "got bool"),
    ("role-sum-0.9", js(record(passages=[passage(sentences=[sent(role=(0.3, 0.3, 0.3))])])),
     "role_not_simplex", "sums to 0.9"),
    ("role-negative", js(record(passages=[passage(sentences=[sent(role=(1.5, -0.5, 0.0))])])),
     "role_not_simplex", "negative probability"),
    ("role-two-values", js(record(passages=[passage(sentences=[sent(role=(0.5, 0.5))])])),
     "role_not_simplex", "expected 3 probabilities"),
    ("role-nan", js(record(passages=[passage(sentences=[sent(role=(float("nan"), 0.5, 0.5))])])),
     "role_not_simplex", "not finite"),
    ("role-strings", js(record(passages=[passage(sentences=[sent(role=("a", "b", "c"))])])),
     "wrong_type", "expected numbers"),
    ("role-huge-int", js(record(passages=[passage(sentences=[sent(role=(10 ** 400, 0, 0))])])),
     "role_not_simplex", "out of float range"),
    ("duplicate-passage-id", js(record(passages=[passage("a", 1), passage("a", 2)])),
     "duplicate_id", "repeats passages[0].id"),
    ("unknown-field", js(dict(record(), sentence=[])), "unknown_field", "unknown field 'sentence'"),
    ("missing-field", js({"id": "q", "question": "x"}), "missing_field", "missing field 'passages'"),
    ("missing-sentence-rank", js(record(passages=[passage(sentences=[{"text": "x.", "role": [1, 0, 0]}])])),
     "missing_field", "missing field 'rank'"),
]

# Valid edge cases: they must parse and round-trip exactly.
TRAINING_EDGE = [
    ("one-passage", record()),
    ("200-passages", record(passages=[passage(f"p{i}", i + 1) for i in range(200)])),
    ("50k-char-sentence", record(passages=[passage(sentences=[sent(LONG_TEXT)])])),
    ("sentence-longer-than-window", record(passages=[passage(sentences=[sent(WORDS_NO_STOP)])])),
    ("empty-title", record(passages=[passage(title="")])),
    ("non-ascii", record(question="Wirkt β-Blocker bei Ödem? 抗体", passages=[passage(
        sentences=[sent("Die Dosis betrug 5 µg/kg — siehe Tab. 2.")])])),
]


def _unique_id(line, i):
  """Give JSON-object lines distinct ids so a mixed file's duplicate-id check stays quiet."""
  if isinstance(line, bytes):
    return line
  try:
    obj = json.loads(line)
  except (ValueError, RecursionError):
    return line
  if isinstance(obj, dict) and isinstance(obj.get("id"), str) and obj["id"].strip():
    obj["id"] = f"{obj['id']}-{i}"
    return js(obj)
  return line


@pytest.mark.parametrize("line, kind, needle", [c[1:] for c in TRAINING_BAD],
                         ids=[c[0] for c in TRAINING_BAD])
def test_training_bad_line_is_named(tmp_path, line, kind, needle):
  path = write_lines(tmp_path / "train.jsonl", [line])
  with pytest.raises(DataError) as info:
    validate_training_file(path)
  assert_one_line(info.value, f"{path}:1:", needle)
  assert info.value.report.counts[kind] == 1 and info.value.report.n_invalid == 1


@pytest.mark.parametrize("rec", [c[1] for c in TRAINING_EDGE], ids=[c[0] for c in TRAINING_EDGE])
def test_training_edge_record_is_kept_exactly(tmp_path, rec):
  path = write_lines(tmp_path / "train.jsonl", [js(rec)])
  records, report = validate_training_file(path)
  assert report.n_records == 1 and records[0].to_json() == rec


def test_training_mixed_file_loses_nothing(tmp_path):
  """Every bad line between good ones: strict names them all; skip_invalid keeps every good one."""
  lines, good_ids, bad_lines = [], [], []
  for i, (_, line, _, _) in enumerate(TRAINING_BAD):
    lines.append(js(record(f"good{i}")))
    good_ids.append(f"good{i}")
    lines.append(_unique_id(line, i))
    bad_lines.append(len(lines))
  lines.append(js(record("good0")))  # a query id repeated across lines
  bad_lines.append(len(lines))
  lines.insert(3, "   ")  # blank lines are not records
  bad_lines = [n + 1 if n > 3 else n for n in bad_lines]
  path = write_lines(tmp_path / "train.jsonl", lines)
  with pytest.raises(DataError) as info:
    validate_training_file(path)
  assert_one_line(info.value, f"bad lines: {','.join(map(str, bad_lines))};", "duplicate_id: 2")
  records, report = validate_training_file(path, skip_invalid=True)
  assert [r.id for r in records] == good_ids
  assert report.n_invalid == len(bad_lines) and report.n_lines == len(lines) - 1
  assert report.n_records + report.n_invalid == report.n_lines  # records lost = 0
  assert [int(e.split(":")[1]) for e in report.errors] == bad_lines


def test_training_file_missing_is_named(tmp_path):
  with pytest.raises(DataError) as info:
    validate_training_file(tmp_path / "nope.jsonl")
  assert_one_line(info.value, "nope.jsonl: cannot read training file")


# ------------------------------------------------------------------------------ inference input

GOOD_CTX = {"id": "d1", "title": "T", "text": "Aspirin reduced pain. The effect lasted a day."}


def inf(**kw):
  r = {"id": "r", "input": "Does aspirin reduce pain?", "ctxs": [GOOD_CTX]}
  r.update(kw)
  return js(r)


# (id, line, substring of the error)
INFERENCE_BAD = [
    ("malformed-json", '{"input": "q", "ctxs": [', "malformed JSON"),
    ("non-utf8", b'{"input": "caf\xe9", "ctxs": []}', "not UTF-8 (byte 0xe9"),
    ("huge-int", '{"input": ' + "1" * 5000 + "}", "malformed JSON"),
    ("deep-nesting", "[" * 100000 + "]" * 100000, "malformed JSON"),
    ("not-object", "[1, 2, 3]", "expected a JSON object, got list"),
    ("nan-query", inf(input=float("nan")), "'input' must be a non-empty string, got NaN"),
    ("empty-query", inf(input=""), "(empty)"),
    ("missing-query", js({"ctxs": [GOOD_CTX]}), "missing query"),
    ("zero-passages", inf(ctxs=[]), "zero passages"),
    ("ctxs-not-list", inf(ctxs={"a": GOOD_CTX}), "'ctxs' must be a list, got dict"),
    ("no-passages-field", js({"input": "q"}), "no passages"),
]

# Records with one unusable passage (after a good one): kept, that passage skipped with its
# reason, the rest reranked. (id, line, reason)
INFERENCE_SKIPPED = [
    ("nan-text", inf(ctxs=[GOOD_CTX, {"title": "t", "text": float("nan")}]), "text is NaN"),
    ("null-text", inf(ctxs=[GOOD_CTX, {"title": "t", "text": None}]), "text is null"),
    ("number-text", inf(ctxs=[GOOD_CTX, {"title": "t", "text": 12}]), "text is int"),
    ("dict-text", inf(ctxs=[GOOD_CTX, {"title": "t", "text": {"contexts": ["a"]}}]), "text is dict"),
    ("list-text", inf(ctxs=[GOOD_CTX, {"title": "t", "text": ["a", "b"]}]), "text is list"),
    ("missing-text", inf(ctxs=[GOOD_CTX, {"title": "t"}]), "no 'text' field"),
    ("number-title", inf(ctxs=[GOOD_CTX, {"title": 3, "text": "x."}]), "title is int, not a string"),
    ("ctx-not-object", inf(ctxs=[GOOD_CTX, 3]), "passage is int, not an object"),
    ("empty-text", inf(ctxs=[GOOD_CTX, {"title": "E", "text": "  "}]), "text is empty"),
]

# Valid edge records the reader must accept: (id, line, number of sentences per passage).
INFERENCE_EDGE = [
    ("one-passage", inf(), [2]),
    ("plain-string-passages", inf(ctxs=["One sentence here. And a second one.", "Third."]), [2, 1]),
    ("200-passages", inf(ctxs=[dict(GOOD_CTX, id=f"d{i}") for i in range(200)]), [2] * 200),
    ("50k-char-passage", inf(ctxs=[{"title": "L", "text": LONG_TEXT}]), [1137]),
    ("sentence-longer-than-window", inf(ctxs=[{"title": "W", "text": WORDS_NO_STOP}]), [1]),
]


def test_inference_reader_gives_one_entry_per_line(tmp_path):
  """Every non-blank line gives exactly one entry: a record, or an error naming file:line."""
  lines = []
  expect = []  # (line number, needle or sentence counts)
  for i, (_, line, needle) in enumerate(INFERENCE_BAD):
    lines += [line, inf(id=f"good{i}")]
    expect += [(len(lines) - 1, needle), (len(lines), [2])]
  for _, line, counts in INFERENCE_EDGE:
    lines.append(line)
    expect.append((len(lines), counts))
  for _, line, reason in INFERENCE_SKIPPED:
    lines.append(line)
    expect.append((len(lines), ("skipped", reason)))
  lines.append("")
  path = write_lines(tmp_path / "in.jsonl", lines)
  got = read_inference_file(path)
  assert len(got) == len(expect)  # records lost = 0
  for entry, (lineno, want) in zip(got, expect):
    assert entry.line == lineno
    if isinstance(want, str):
      assert_one_line(entry.record, f"{path}:{lineno}", want)
    elif isinstance(want, tuple):  # a record whose second passage is skipped, nothing lost
      assert isinstance(entry.record, InferenceRecord), entry.record
      assert entry.record.skipped == [(1, want[1])]
      assert len(entry.record.passages[0].sentences) == 2
    else:
      assert isinstance(entry.record, InferenceRecord), entry.record
      assert [len(p.sentences) for p in entry.record.passages] == want


@pytest.fixture(scope="module")
def rerank_run(tmp_path_factory):
  """One strict tools/rerank.py run over every bad and edge line between two real SciFact pools."""
  from test_inference import make_pools, make_tiny_model
  tmp = tmp_path_factory.mktemp("rel_rerank")
  pools = make_pools(pool_size=3, limit=2)[0]
  model = make_tiny_model(tmp / "model", pools)
  lines = [js(pools[0])] + [c[1] for c in INFERENCE_BAD] + [c[1] for c in INFERENCE_EDGE] \
      + [c[1] for c in INFERENCE_SKIPPED] + [js(pools[1])]
  inp = write_lines(tmp / "in.jsonl", lines)
  out = tmp / "out.jsonl"
  proc = subprocess.run(
      [sys.executable, str(ROOT / "tools" / "rerank.py"), "--checkpoint", model, "--input", inp,
       "--output", str(out), "--strict", "--queries-per-batch", "2", "--row-len", "128",
       "--no-compilation-cache", "--no-progress"],
      capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300,
      check=False)
  with open(out, encoding="utf-8") as f:
    results = [json.loads(x) for x in f]
  return proc, results, pools, len(lines)


def test_rerank_cli_strict_keeps_every_record(rerank_run):
  proc, results, pools, n_lines = rerank_run
  assert proc.returncode == 2, proc.stderr[-2000:]  # errors -> 2, after writing all
  assert len(results) == n_lines  # output count = input count
  assert [r["line"] for r in results] == list(range(1, n_lines + 1))
  n_bad = len(INFERENCE_BAD)
  for r, (name, _, needle) in zip(results[1:1 + n_bad], INFERENCE_BAD):
    assert r["error"] and needle in r["error"] and "\n" not in r["error"], (name, r)
  n_edge = len(INFERENCE_EDGE)
  skipped = results[1 + n_bad + n_edge:-1]
  for r, (name, _, reason) in zip(skipped, INFERENCE_SKIPPED):
    # --strict: a record with a skipped passage is not fully processed -> an error naming it.
    assert r["error"] == f"passages skipped: ctxs[1] {reason}", (name, r)
  for r in (results[0], results[-1]):
    assert r["error"] is None and r["ranked_sentences"]
  n_err = n_bad + len(INFERENCE_SKIPPED)
  assert (f"{n_lines - n_err} of {n_lines} records fully processed, 0 with 0 skipped passage(s), "
          f"{n_err} error(s)") in proc.stderr


def test_rerank_cli_edge_records(rerank_run):
  """Edge records are scored or, if they exceed the largest bucket, get their own error."""
  _, results, _, _ = rerank_run
  edge = dict(zip([c[0] for c in INFERENCE_EDGE], results[1 + len(INFERENCE_BAD):-1]))
  for name in ("one-passage", "plain-string-passages", "sentence-longer-than-window"):
    assert edge[name]["error"] is None, edge[name]
  assert [p["num_sentences"] for p in edge["plain-string-passages"]["passages"]] == [2, 1]
  longest = edge["sentence-longer-than-window"]
  assert longest["ranked_sentences"][0]["truncated"] and longest["passages"][0]["truncated_sentences"] == [0]
  assert edge["200-passages"]["error"] is None and len(edge["200-passages"]["ranked_sentences"]) == 400
  # 1137 sentences need more rows than the largest bucket: the engine grows the buckets for it.
  assert edge["50k-char-passage"]["error"] is None
  assert len(edge["50k-char-passage"]["ranked_sentences"]) == 1137


# ------------------------------------------------------------------------------ pools, qrels, runs

SQA_BAD = [
    ("malformed-json", '{"input": ', "invalid JSON"),
    ("non-utf8", b'{"input": "\xff"}', "not UTF-8"),
    ("huge-int", '{"input": ' + "1" * 5000 + "}", "invalid JSON"),
    ("not-object", "[]", "expected a JSON object"),
    ("missing-input", js({"gold_ctx": [{"title": "", "text": "x"}]}), "missing or empty 'input'"),
    ("empty-gold", js({"input": "q", "gold_ctx": []}), "'gold_ctx' must be a non-empty list"),
    ("number-answer", js({"input": "q", "gold_ctx": [{"text": "x"}], "answer": 3}), "'answer'"),
    ("nan-text", js({"input": "q", "gold_ctx": [{"text": float("nan")}]}), "got float"),
    ("null-text", js({"input": "q", "gold_ctx": [{"text": None}]}), "got NoneType"),
    ("list-text", js({"input": "q", "gold_ctx": [{"text": ["a"]}]}), "got list"),
    ("dict-text-bad-contexts", js({"input": "q", "gold_ctx": [{"text": {"contexts": 3}}]}),
     "text.contexts must be a list of strings"),
    ("dict-text-label-mismatch", js({"input": "q", "gold_ctx": [{"text": {"contexts": ["a"],
                                                                          "labels": []}}]}),
     "text.labels must be a list as long"),
    ("number-title", js({"input": "q", "gold_ctx": [{"title": 1, "text": "x"}]}), "title must be a string"),
]


@pytest.mark.parametrize("line, needle", [c[1:] for c in SQA_BAD], ids=[c[0] for c in SQA_BAD])
def test_scholarqabench_bad_line_is_named(tmp_path, scifact_records, line, needle):
  path = write_lines(tmp_path / "sqa.jsonl", [js(scifact_records[0]), line])
  with pytest.raises(DataError) as info:
    read_scholarqabench(path)
  assert_one_line(info.value, f"{path}:2", needle)


# tools/evaluate.py read_pools: strict (metrics need every query), the first bad line is named.
POOL_BAD = [(c[0], c[1], c[2]) for c in INFERENCE_BAD] + [
    (name, line, f"ctxs[1]: {reason}") for name, line, reason in INFERENCE_SKIPPED] + [
    ("duplicate-query-id", inf(id="g"), "query id 'g' repeats the id of line 1"),
    ("duplicate-passage-id", inf(id="x", ctxs=[GOOD_CTX, GOOD_CTX]), "passage ids repeat"),
]


@pytest.mark.parametrize("line, needle", [c[1:] for c in POOL_BAD], ids=[c[0] for c in POOL_BAD])
def test_evaluate_pool_bad_line_is_named(tmp_path, line, needle):
  path = write_lines(tmp_path / "pools.jsonl", [inf(id="g"), line])
  with pytest.raises(DataError) as info:
    load_tool("evaluate").read_pools(path)
  assert_one_line(info.value, f"{path}:2", needle)


TREC_BAD = [
    ("run-too-few-fields", "run", "q1 Q0 d1 1 0.5", "expected 'qid Q0 docid rank score tag'"),
    ("run-score-text", "run", "q1 Q0 d1 1 high tag", "score 'high' is not a number"),
    ("run-score-nan", "run", "q1 Q0 d1 1 nan tag", "score 'nan' is not finite"),
    ("run-score-inf", "run", "q1 Q0 d1 1 inf tag", "score 'inf' is not finite"),
    ("run-duplicate-doc", "run", "q0 Q0 d0 2 0.1 tag", "doc 'd0' listed twice"),
    ("run-non-utf8", "run", b"q1 Q0 d\xff 1 0.5 tag", "not UTF-8"),
    ("qrels-too-many-fields", "qrels", "q1 0 d1 1 extra", "expected 'qid 0 docid rel'"),
    ("qrels-rel-text", "qrels", "q1 0 d1 yes", "relevance 'yes' is not a number"),
    ("qrels-rel-nan", "qrels", "q1 0 d1 nan", "relevance 'nan' is not finite"),
    ("qrels-non-utf8", "qrels", b"q\xfe 0 d1 1", "not UTF-8"),
]


@pytest.mark.parametrize("kind, line, needle", [c[1:] for c in TREC_BAD], ids=[c[0] for c in TREC_BAD])
def test_trec_bad_line_is_named(tmp_path, kind, line, needle):
  first = "q0 Q0 d0 1 0.9 tag" if kind == "run" else "q0 0 d0 1"
  path = write_lines(tmp_path / f"x.{kind}", [first, line])
  reader = read_trec_run if kind == "run" else read_qrels
  with pytest.raises(DataError) as info:
    reader(path)
  assert_one_line(info.value, f"{path}:2", needle)


RUN_BAD = [
    ("run-not-dict", ["d1"], "run must be a dict"),
    ("run-docs-string", {"q": "d1"}, "must be a list of doc ids"),
    ("run-duplicate-doc", {"q": ["d1", "d1"]}, "lists doc id 'd1' twice"),
]


@pytest.mark.parametrize("run, needle", [c[1:] for c in RUN_BAD], ids=[c[0] for c in RUN_BAD])
def test_metric_run_misuse_is_named(run, needle):
  with pytest.raises(DataError) as info:
    rerank_metrics(run, {"q": {"d1"}})
  assert_one_line(info.value, needle)


@pytest.mark.parametrize("name", ["missing.qrels", "missing.run"], ids=["qrels", "run"])
def test_missing_trec_file_is_named(tmp_path, name):
  reader = read_qrels if name.endswith("qrels") else read_trec_run
  with pytest.raises(DataError) as info:
    reader(str(tmp_path / name))
  assert_one_line(info.value, name, "cannot read")


# ------------------------------------------------------------------------------ configs, model folders

def run_train(args, timeout=120):
  return subprocess.run([sys.executable, str(ROOT / "tools" / "train.py")] + args,
                        capture_output=True, text=True, cwd=ROOT, timeout=timeout, check=False,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))


MISSING_KEY_CONFIG = '''
import importlib.util, os
def get_config(variant=""):
  spec = importlib.util.spec_from_file_location("ls", {local!r})
  m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
  c = m.get_config(variant)
  del c["learning_rate"]
  c.learnig_rate = 1e-3  # a typo: unknown key
  return c
'''


def test_train_cli_config_errors_are_one_line(tmp_path):
  """Unknown override key, bad value, missing/unknown file keys, no local checkpoint: one line each."""
  cfg_file = tmp_path / "typo_config.py"
  cfg_file.write_text(MISSING_KEY_CONFIG.format(local=str(ROOT / "configs" / "local_stage.py")))
  cases = [
      (["--config", "configs/local_stage.py:tiny", "--config.not_a_key=1"],
       "unknown config key 'not_a_key'"),
      (["--config", "configs/local_stage.py:tiny", "--config.num_epochs=abc"],
       "--config.num_epochs=abc"),
      (["--config", f"{cfg_file}:tiny"],
       "missing ['learning_rate'] unknown ['learnig_rate']"),
      (["--config", "configs/local_stage.py:tiny", "--config.stage=middle"],
       "config.stage must be one of ('local', 'global', 'passage'), got 'middle'"),
      (["--config", "configs/global_stage.py:tiny"],
       "needs --config.local_checkpoint=DIR"),
      (["--config", "configs/global_stage.py:tiny", f"--config.local_checkpoint={tmp_path}"],
       "has no model/ folder; pass the workdir of a finished local-stage run"),
  ]
  for i, (args, needle) in enumerate(cases):
    proc = run_train(args + [f"--workdir={tmp_path / f'w{i}'}"])
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert proc.returncode != 0, (args, proc.stderr)
    assert "Traceback" not in proc.stderr and len(lines) == 1, (args, proc.stderr)
    assert needle in lines[0] and lines[0].startswith("error: "), (args, lines[0])
  # The error comes before any work: no workdir content written for bad flags.
  assert not (tmp_path / "w0").exists()


def test_train_config_key_check_accepts_shipped_configs():
  tool = load_tool("train")
  for name in ("local_stage", "global_stage"):
    spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for variant in ("", "tiny"):
      tool.check_config_keys(module.get_config(variant))  # raises on a mismatch


MODEL_CONFIG_BAD = [
    ("unknown-key", lambda d: d["log_config"].update(context_kk=3),
     "log_config: unknown keys ['context_kk']"),
    ("missing-key", lambda d: d["log_config"]["local"]["encoder"].pop("hidden_size"),
     "log_config.local.encoder: missing keys ['hidden_size']"),
    ("bad-format-version", lambda d: d.update(format_version=99), "unsupported format_version 99"),
    ("no-log-config", lambda d: d.pop("log_config"), "'log_config' must be an object, got NoneType"),
    ("not-json", "{not json", "cannot read model config"),
    ("non-utf8", b'{"format_version": "\xff"}', "cannot read model config"),
]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
  from test_inference import make_pools, make_tiny_model
  return make_tiny_model(tmp_path_factory.mktemp("rel_model") / "model",
                         make_pools(pool_size=2, limit=1)[0])


@pytest.mark.parametrize("edit, needle", [c[1:] for c in MODEL_CONFIG_BAD],
                         ids=[c[0] for c in MODEL_CONFIG_BAD])
def test_model_config_bad_keys_are_named(tmp_path, tiny_model, edit, needle):
  import shutil
  from logrerank_jax.models.model_folder import load_model
  folder = tmp_path / "m"
  shutil.copytree(tiny_model, folder)
  path = folder / "model_config.json"
  if isinstance(edit, (str, bytes)):
    path.write_bytes(edit if isinstance(edit, bytes) else edit.encode())
  else:
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data), encoding="utf-8")
  with pytest.raises(ConfigError) as info:
    load_model(str(folder))
  assert_one_line(info.value, needle)


@pytest.mark.parametrize("remove", ["params", "model_config.json", "tokenizer"],
                         ids=["no-params", "no-config", "no-tokenizer"])
def test_incomplete_model_folder_is_named(tmp_path, tiny_model, remove):
  import shutil
  from logrerank_jax.models.model_folder import load_model
  folder = tmp_path / "m"
  shutil.copytree(tiny_model, folder)
  target = folder / remove
  shutil.rmtree(target) if target.is_dir() else target.unlink()
  with pytest.raises(CheckpointError) as info:
    load_model(str(folder))
  assert_one_line(info.value, str(folder), remove)


CASE_COUNTS = {
    "training records (bad lines)": len(TRAINING_BAD) + 1,  # + the cross-line duplicate id
    "training records (valid edge cases)": len(TRAINING_EDGE),
    "inference input (bad lines)": len(INFERENCE_BAD),
    "inference input (valid edge cases)": len(INFERENCE_EDGE),
    "ScholarQABench files": len(SQA_BAD),
    "evaluation pools": len(POOL_BAD),
    "qrels / TREC runs / run dicts": len(TREC_BAD) + len(RUN_BAD) + 2,
    "training configs (tools/train.py)": 6 + 4,  # 6 bad runs + 4 shipped configs accepted
    "model folders (config keys, missing parts)": len(MODEL_CONFIG_BAD) + 3,
}
