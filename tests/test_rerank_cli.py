"""`tools/rerank.py` end to end: a subprocess run and the in-process CLI, on real SciFact pools."""

import importlib
import json
import os
import pathlib
import re
import stat
import subprocess
import sys

import pytest

from test_inference import check_output, make_pools, make_tiny_model

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "rerank.py"

# Bad lines mixed into the input, with the message each must produce; a record whose only
# passage is unusable is kept with that passage skipped (`("skipped", reason)`).
BAD_LINES = [
    ('{"input": "q", "ctxs": [', "malformed JSON"),
    ('{"id": "nan", "input": "q", "ctxs": [{"title": "t", "text": NaN}]}', ("skipped", "text is NaN")),
    ('{"id": "num", "input": "q", "ctxs": [{"title": "t", "text": 3.5}]}', ("skipped", "text is float")),
    ('{"id": "none", "input": "q", "ctxs": []}', "zero passages"),
    ('{"id": "noq", "ctxs": [{"title": "t", "text": "A sentence."}]}', "missing query"),
]


def load_tool():
  """The module behind tools/rerank.py and `logrerank rerank`."""
  return importlib.import_module("logrerank_jax.cli.rerank")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """A tiny model folder and an input file: 3 real pools with the bad lines between them."""
  tmp = tmp_path_factory.mktemp("rerank_cli")
  pools = make_pools(pool_size=4, limit=3)[0]
  model = make_tiny_model(tmp / "model", pools)
  good = [json.dumps(p) for p in pools]
  lines = [good[0], BAD_LINES[0][0], BAD_LINES[1][0], good[1], "", BAD_LINES[2][0],
           BAD_LINES[3][0], BAD_LINES[4][0], good[2]]
  path = tmp / "in.jsonl"
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  # Expected output, one entry per non-blank line: a pool dict or an error message.
  expected = [pools[0], BAD_LINES[0][1], BAD_LINES[1][1], pools[1], BAD_LINES[2][1],
              BAD_LINES[3][1], BAD_LINES[4][1], pools[2]]
  return tmp, model, path, expected


def read_jsonl(path):
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def test_subprocess_strict_run(setup):
  tmp, model, inp, expected = setup
  out, cache = tmp / "out.jsonl", tmp / "cache" / "xla"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run(
      [sys.executable, str(TOOL), "--checkpoint", model, "--input", str(inp), "--output", str(out),
       "--strict", "--queries-per-batch", "2", "--row-len", "128", "--compilation-cache", str(cache),
       "--no-progress"], capture_output=True, text=True, env=env, timeout=240, check=False)
  assert proc.returncode == 2, proc.stderr  # errors -> 2, after writing everything
  results = read_jsonl(out)
  assert len(results) == len(expected)
  for i, (res, exp) in enumerate(zip(results, expected)):
    if isinstance(exp, str):
      assert exp in res["error"], (i, res)
    elif isinstance(exp, tuple):  # --strict: a skipped passage makes the record an error
      assert res["error"] == f"passages skipped: ctxs[0] {exp[1]}", (i, res)
    else:
      check_output(res, exp)
  # Line numbers are those of the file (the blank line 5 is skipped, not a record).
  assert [r["line"] for r in results] == [1, 2, 3, 4, 6, 7, 8, 9]
  assert not [p for p in os.listdir(tmp) if p.startswith(".tmp-")]  # temp file renamed away
  assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
  m = re.search(r"XLA compilations: (\d+) \(persistent-cache hits (\d+).*forward calls (\d+)",
                proc.stderr)
  assert m and int(m.group(1)) >= 1 and int(m.group(3)) >= 2, proc.stderr
  assert "3 of 8 records fully processed, 0 with 0 skipped passage(s), 5 error(s); first lines: " \
      "2, 3, 6, 7, 8" in proc.stderr
  # A second process finds the executables in the persistent cache and writes the same output.
  out2 = tmp / "out2.jsonl"
  proc2 = subprocess.run(
      [sys.executable, str(TOOL), "--checkpoint", model, "--input", str(inp), "--output", str(out2),
       "--queries-per-batch", "2", "--row-len", "128", "--compilation-cache", str(cache),
       "--no-progress"], capture_output=True, text=True, env=env, timeout=240, check=False)
  assert proc2.returncode == 2, proc2.stderr  # not every record fully processed
  assert "3 of 8 records fully processed, 2 with 2 skipped passage(s), 3 error(s)" in proc2.stderr
  m2 = re.search(r"XLA compilations: (\d+) \(persistent-cache hits (\d+)", proc2.stderr)
  assert m2 and int(m2.group(2)) == int(m2.group(1)) >= 1, proc2.stderr
  results2 = read_jsonl(out2)
  for res, res2, exp in zip(results, results2, expected):
    if isinstance(exp, tuple):  # without --strict: kept, the passage skipped with its reason
      assert res2["error"] is None and res2["passages"][0]["skipped"] == exp[1]
      assert res2["passage_ranking"] == [0] and res2["ranked_sentences"] == []
    else:
      assert res2 == res


def test_in_process_openscholar_round_trip(setup, capsys):
  tmp, model, inp, expected = setup
  out = tmp / "openscholar.jsonl"
  rc = load_tool().main(["--checkpoint", model, "--input", str(inp), "--output", str(out),
                         "--format", "openscholar", "--row-len", "128", "--no-compilation-cache",
                         "--no-progress"])
  assert rc == 2  # exit 0 only when every record was fully processed
  assert "3 of 8 records fully processed, 2 with 2 skipped passage(s), 3 error(s)" in \
      capsys.readouterr().err
  raw_lines = [line for line in inp.read_text(encoding="utf-8").splitlines() if line.strip()]
  results = read_jsonl(out)
  assert len(results) == len(expected)
  for line, res, exp in zip(raw_lines, results, expected):
    if isinstance(exp, tuple):  # kept: its one (unusable) passage is written back unchanged
      assert res["log_passage_order"] == [0]
      assert json.dumps(res["ctxs"]) == json.dumps(json.loads(line)["ctxs"])
      continue
    if isinstance(exp, str):
      assert exp in res["error"]
      if exp != "malformed JSON":
        # Compared as JSON text: the NaN record's NaN is not equal to itself.
        kept = {k: v for k, v in res.items() if k != "error"}
        assert json.dumps(kept, sort_keys=True) == json.dumps(json.loads(line), sort_keys=True)
      continue
    assert {k: res[k] for k in exp if k != "ctxs"} == {k: v for k, v in exp.items() if k != "ctxs"}
    order = res["log_passage_order"]
    assert sorted(order) == list(range(len(exp["ctxs"])))
    assert res["ctxs"] == [exp["ctxs"][p] for p in order]  # every ctx kept, unchanged, reordered
    assert res["log_context"] and all(
        exp["ctxs"][u["passage"]]["text"].find(u["text"]) >= 0 for u in res["log_context"])


def test_id_only_pools_with_corpus(setup, tmp_path, capsys):
  """Id-only records (`ctx_ids`, as logrerank_jax/demo_data ships its pools) rerank with
  --corpus as the same pools with their passages inline; an id the corpus lacks is that
  record's one-line error naming it; without --corpus the records' error says to pass one."""
  from logrerank_jax.data.inference_input import InferenceRecord, read_inference_file
  from logrerank_jax.data.pool_files import read_corpus
  tmp, model, _, expected = setup
  pools = [e for e in expected if isinstance(e, dict)]  # the fixture's 3 real SciFact pools
  corpus = {c["id"]: {"id": c["id"], "title": c["title"], "text": c["text"]}
            for p in pools for c in p["ctxs"]}
  (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(c) + "\n" for c in corpus.values()))
  id_only = [{"id": p["id"], "input": p["input"], "ctx_ids": [c["id"] for c in p["ctxs"]]}
             for p in pools]
  bad = {"id": "stale", "input": "q", "ctx_ids": [pools[0]["ctxs"][0]["id"], "p-gone"]}
  inline = {"id": pools[0]["id"], "input": pools[0]["input"],
            "ctxs": [corpus[c["id"]] for c in pools[0]["ctxs"]]}
  lines = [json.dumps(r) for r in id_only + [bad, inline]]
  inp = tmp_path / "ids.jsonl"
  inp.write_text("\n".join(lines) + "\n")
  out = tmp_path / "out.jsonl"
  common = ["--checkpoint", model, "--input", str(inp), "--output", str(out), "--row-len", "128",
            "--no-compilation-cache", "--no-progress"]
  rc = load_tool().main(common + ["--corpus", str(tmp_path / "corpus.jsonl")])
  err = capsys.readouterr().err
  assert rc == 2, err  # the stale record is an error
  results = read_jsonl(out)
  for res, pool in zip(results[:3], pools):
    check_output(res, {"id": pool["id"], "input": pool["input"],
                       "ctxs": [corpus[c["id"]] for c in pool["ctxs"]]})
  assert results[3]["error"] == (f"{inp}:4: pool 'stale': passage id 'p-gone' is not in the "
                                 "corpus (1 of its 2 ids missing)")
  assert f"rerank: record at line 4: {results[3]['error']}\n" in err
  # The id-only record and the same pool inline: the same passages, ranking and scores.
  same, ref = results[0], results[4]
  assert same["passages"] == ref["passages"] and same["passage_ranking"] == ref["passage_ranking"]
  assert [(r["passage"], r["sentence"]) for r in same["ranked_sentences"]] == \
      [(r["passage"], r["sentence"]) for r in ref["ranked_sentences"]]
  assert max(abs(a["score"] - b["score"]) for a, b in
             zip(same["ranked_sentences"], ref["ranked_sentences"])) <= 1e-6
  # Without --corpus: every id-only record is an error that names --corpus; the inline one runs.
  rc = load_tool().main(common)
  assert rc == 2
  results = read_jsonl(out)
  assert [r["error"] is None for r in results] == [False] * 4 + [True]
  assert all("passages given by id only ('ctx_ids')" in r["error"] and "--corpus" in r["error"]
             and "\n" not in r["error"] for r in results[:4])
  capsys.readouterr()
  # The demo's id-only CS pools resolve in full against their corpus (no model needed).
  demo = ROOT / "logrerank_jax" / "demo_data" / "scholarqa_cs"
  resolved = load_tool().with_corpus(read_inference_file(str(demo / "pools.jsonl")),
                                     read_corpus(str(demo / "corpus.jsonl")), "pools.jsonl")
  assert len(resolved) == 110
  assert all(isinstance(ln.record, InferenceRecord) and not ln.record.skipped
             and len(ln.record.passages) == len(ln.raw["ctxs"]) for ln in resolved)
