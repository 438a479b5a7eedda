"""Tests of the PubMedQA weak-label adapter, the demo-data builder and the shipped demo data."""

import importlib.util
import json
import math
import pathlib
import re

import numpy as np
import pytest

import logrerank_jax
from logrerank_jax.datasets import pubmed_adapter as A
from logrerank_jax.data import records as R
from logrerank_jax.data.sentences import split_sentence_texts
from logrerank_jax.errors import DataError
from logrerank_jax.evaluation import read_qrels

DATA = pathlib.Path(__file__).parent / "data"
SLICE = DATA / "pubmed_slice.jsonl"
DEMO = pathlib.Path(logrerank_jax.__file__).parent / "demo_data"
ROOT = pathlib.Path(__file__).parent.parent
B, M, RES = (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)
U = (1 / 3, 1 / 3, 1 / 3)


@pytest.fixture(scope="module")
def pool():
  """The slice as an indexed pool (12 queries)."""
  return A.PubMedPool(SLICE)


@pytest.fixture(scope="module")
def built(pool):
  """Training records for all 12 slice queries, 4 passages each."""
  return A.build_training_records(pool, range(len(pool.queries)), num_passages=4)


@pytest.mark.parametrize("label,role,source", [
    ("RESULTS", RES, "keyword"),
    ("METHODS", M, "keyword"),
    ("BACKGROUND", B, "keyword"),
    ("OBJECTIVE", B, "keyword"),
    ("MATERIALS AND METHODS", M, "keyword"),
    ("DESIGN, SETTING AND PATIENTS", M, "keyword"),
    ("BACKGROUND AND PURPOSE", B, "keyword"),
    ("MAIN OUTCOME MEASURES", M, "keyword"),
    ("SUMMARY OF BACKGROUND DATA", B, "keyword"),
    ("METHODS AND RESULTS", (0.0, 0.5, 0.5), "keyword"),
    ("MEASUREMENTS AND MAIN RESULTS", (0.0, 0.5, 0.5), "keyword"),
    ("results", RES, "keyword"),
    ("END POINT", M, "override"),
    ("UNLABELLED", U, "unknown"),
    (", FSAII", U, "unknown"),
    (None, U, "unlabelled"),
], ids=["results", "methods", "background", "objective", "materials_and_methods",
        "design_setting_patients", "background_and_purpose", "main_outcome_measures",
        "summary_of_background_data", "methods_and_results", "measurements_and_main_results",
        "lowercase", "end_point_override", "unlabelled_string", "junk_label", "no_label"])
def test_section_role_known_answers(label, role, source):
  got, got_source = A.section_role(label)
  assert got_source == source
  # float64 section-role mixtures (values <= 1, ulp 2.2e-16): a few roundings stay below
  # 1e-15; the fsum to 1 likewise << 1e-12. Host NumPy, ISA-independent.
  np.testing.assert_allclose(got, role, rtol=0, atol=1e-15)
  assert math.isclose(math.fsum(got), 1.0, abs_tol=1e-12)


def test_records_validate(built, tmp_path):
  recs, stats = built
  path = tmp_path / "slice_train.jsonl"
  R.write_training_file(path, recs)
  back, report = R.validate_training_file(path)
  assert back == recs
  assert (report.n_lines, report.n_records, report.n_invalid) == (12, 12, 0)
  assert stats.queries == 12 and stats.passages == 48
  assert stats.sentences == sum(len(p.sentences) for r in recs for p in r.passages)


def test_roles_follow_the_section_labels(pool, built):
  recs, stats = built
  checked = 0
  for i, rec in enumerate(recs):
    gold = rec.passages[0]
    assert gold.rank == 1 and gold.id == f"pubmed_slice:{i}:0"
    # NumPy-free reference: re-split each labelled paragraph and expect its label's role.
    expected = []
    for label, paragraph in pool.queries[i]["gold"][0]["sections"]:
      expected += [(s, A.section_role(label)[0]) for s in split_sentence_texts(paragraph)]
    assert [(s.text, s.role) for s in gold.sentences] == expected
    checked += len(expected)
  # Known answers on the real labels of the slice (first record: PURPOSE, METHODS, RESULTS).
  first = pool.queries[0]["gold"][0]["sections"]
  assert [lab for lab, _ in first] == ["PURPOSE", "METHODS", "RESULTS"]
  roles = [s.role for s in recs[0].passages[0].sentences]
  n_purpose = len(split_sentence_texts(first[0][1]))
  assert roles[0] == B and roles[n_purpose] == M and roles[-1] == RES
  # Records 10 and 11 of the slice have plain-string texts: uniform roles, counted.
  for i in (10, 11):
    assert pool.queries[i]["gold"][0]["sections"][0][0] is None
    assert all(s.role == U for s in recs[i].passages[0].sentences)
  assert stats.sentences_by_source["unlabelled"] >= sum(
      len(recs[i].passages[0].sentences) for i in (10, 11))
  assert sum(stats.sentences_by_source.values()) == stats.sentences
  assert checked > 100


def test_negatives_are_the_bm25_top_ranked_below_gold(pool, built):
  recs, _ = built
  for i, rec in enumerate(recs):
    scores = pool.index.scores(rec.question)  # [D]
    negs = [int(p.id.split(":")[1]) for p in rec.passages[1:]]
    assert [p.rank for p in rec.passages] == [1, 2, 3, 4]
    assert i not in negs and len(set(negs)) == 3
    # Negatives in BM25 order (ties -> lower index), and nobody left out scores higher.
    assert negs == sorted(negs, key=lambda j: (-scores[j], j))
    rest = [j for j in range(len(scores)) if j != i and j not in negs]
    assert max(scores[rest]) <= min(scores[negs])


def _reference_sentence_ranks(question, sentences, docs):
  """NumPy reference of the IDF-weighted question overlap ranks."""
  tok = lambda t: set(re.findall(r"[^\W_]+", t.lower()))
  doc_sets = [tok(d) for d in docs]
  q = tok(question)
  n = len(docs)
  # math.fsum is correctly rounded, so the score does not depend on the set's iteration
  # order (which follows PYTHONHASHSEED): sentences with the same overlapping terms tie
  # exactly and the stable sort breaks the tie by position, as the adapter does. A plain
  # sum() here made the tie order hash-seed dependent (CI, stop 17).
  score = np.array([math.fsum(np.log1p((n - sum(t in d for d in doc_sets) + 0.5)
                                       / (sum(t in d for d in doc_sets) + 0.5))
                              for t in q & tok(s)) for s in sentences])  # [M]
  order = np.argsort(-score, kind="stable")
  ranks = np.empty(len(sentences), int)
  ranks[order] = np.arange(1, len(sentences) + 1)
  return ranks.tolist()


def test_sentence_ranks_match_numpy_reference(pool, built):
  recs, _ = built
  docs = [p.text for p in pool.passages]
  for rec in recs[:6]:
    for p in rec.passages:
      texts = [s.text for s in p.sentences]
      assert [s.rank for s in p.sentences] == _reference_sentence_ranks(rec.question, texts, docs)


def test_banned_passages_are_never_negatives(pool):
  plain = pool.candidates(0, 4)
  banned = frozenset(plain[1:2])  # the best negative
  got = pool.candidates(0, 4, banned)
  assert got[0] == 0 and plain[1] not in got and got[1:3] == plain[2:4]
  assert pool.candidates(0, 4, frozenset({0}))[0] == 0  # a query's own gold is never banned


def test_inference_record_and_qrels(pool, built):
  recs, _ = built
  for i in (0, 5, 11):
    rec, rel = A.build_inference_record(pool, i, 4)
    assert set(rec) == {"id", "input", "ctxs"} and rec["id"] == recs[i].id
    assert rec["input"] == recs[i].question and rel == [f"pubmed_slice:{i}:0"]
    assert {c["id"] for c in rec["ctxs"]} == {p.id for p in recs[i].passages}
    scores = pool.index.scores(rec["input"])
    idx = [int(c["id"].split(":")[1]) for c in rec["ctxs"]]
    assert idx == sorted(idx, key=lambda j: (-scores[j], j))
    for c, j in zip(rec["ctxs"], idx):
      assert c["text"] == pool.passages[j].text and isinstance(c["title"], str)


def test_deterministic_across_runs(pool, built):
  again, _ = A.build_training_records(A.PubMedPool(SLICE), range(12), num_passages=4)
  assert [r.to_json() for r in again] == [r.to_json() for r in built[0]]


@pytest.mark.parametrize("kwargs,match", [
    (dict(query_indices=[12], num_passages=4), "out of range"),
    (dict(query_indices=[-1], num_passages=4), "out of range"),
    (dict(query_indices=[0], num_passages=0), "num_passages"),
], ids=["index_past_end", "negative_index", "zero_passages"])
def test_bad_arguments_raise_data_error(pool, kwargs, match):
  with pytest.raises(DataError, match=match):
    A.build_training_records(pool, **kwargs)


def _load_tool():
  """Import tools/build_demo_data.py as a module."""
  spec = importlib.util.spec_from_file_location(
      "build_demo_data", ROOT / "tools" / "build_demo_data.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_build_tool_is_deterministic_and_valid(tmp_path):
  tool = _load_tool()
  outs = []
  for run in ("a", "b"):
    out = tmp_path / run
    tool.main(["--input", str(SLICE), "--out", str(out), "--n-train", "6", "--n-val", "2",
               "--n-test", "4", "--passages", "4"])
    outs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
  assert outs[0] == outs[1]
  assert set(outs[0]) == {"train.jsonl", "val.jsonl", "test.jsonl", "test_queries.jsonl",
                          "test.qrels", "manifest.json"}
  ids = {}
  for split, n in (("train", 6), ("val", 2), ("test", 4)):
    recs, _ = R.validate_training_file(tmp_path / "a" / f"{split}.jsonl")
    assert len(recs) == n
    ids[split] = recs
  _check_splits_disjoint(ids)


def _check_splits_disjoint(splits):
  """No query in two splits; no split's gold passage inside another split's candidates."""
  qids = [r.id for recs in splits.values() for r in recs]
  assert len(qids) == len(set(qids))
  for name, recs in splits.items():
    gold = {r.passages[0].id for r in recs}
    for other, orecs in splits.items():
      if other != name:
        assert not gold & {p.id for r in orecs for p in r.passages}, (name, other)


def test_shipped_demo_data():
  splits = {s: R.validate_training_file(DEMO / f"{s}.jsonl")[0] for s in ("train", "val", "test")}
  args = json.loads((DEMO / "manifest.json").read_text())["args"]
  assert [len(splits[s]) for s in ("train", "val", "test")] == [args["n_train"], args["n_val"],
                                                                 args["n_test"]] == [100, 20, 30]
  _check_splits_disjoint(splits)
  total = sum(p.stat().st_size for p in DEMO.iterdir() if p.is_file())
  assert total < 3_000_000, total  # shipped inside the wheel: keep it small
  assert (DEMO / "LICENSE").read_bytes() == (DATA / "SCHOLARQABENCH_LICENSE").read_bytes()
  assert "MIT" in (DEMO / "README.md").read_text()
  qrels = read_qrels(str(DEMO / "test.qrels"))
  with open(DEMO / "test_queries.jsonl", encoding="utf-8") as f:
    queries = [json.loads(line) for line in f]
  assert [q["id"] for q in queries] == [r.id for r in splits["test"]]
  assert set(qrels) == {q["id"] for q in queries}
  for q, rec in zip(queries, splits["test"]):
    assert q["input"] == rec.question and len(q["ctxs"]) == args["passages"]
    assert qrels[q["id"]] == {rec.passages[0].id}
    assert {c["id"] for c in q["ctxs"]} == {p.id for p in rec.passages}
    assert all(c["text"].strip() for c in q["ctxs"])


# --- Paragraph unit (evidence pools): what tools/demo.sh trains and evaluates on. ---

PARAGRAPHS = DEMO / "paragraphs"


@pytest.fixture(scope="module")
def para_pool():
  """The slice as a paragraph pool: 37 paragraphs, 10 of 12 questions with a result paragraph."""
  return A.PubMedPool(SLICE, unit="paragraph")


@pytest.mark.parametrize("label,evidence", [
    ("RESULTS", True), ("FINDINGS", True), ("METHODS AND RESULTS", True),
    ("CONCLUSIONS", True), ("METHODS", False), ("BACKGROUND", False),
    ("DESIGN, SETTING AND PATIENTS", False), ("UNLABELLED", False), (None, False)],
    ids=["results", "findings", "methods_and_results_half", "conclusions", "methods",
         "background", "design", "unknown_label", "no_label"])
def test_is_evidence_label_known_answers(label, evidence):
  assert A.is_evidence_label(label) is evidence


def test_paragraph_pool_ids_gold_and_own(para_pool):
  """Every paragraph of every abstract is one passage (text = the paragraph, ids in file
  order); a question's gold = its own result paragraphs; questions without one have no gold."""
  raw = [json.loads(line) for line in SLICE.read_text().splitlines() if line.strip()]
  k = 0
  for i, rec in enumerate(raw):
    own = []
    for j, ctx in enumerate(rec["gold_ctx"]):
      text = ctx["text"]
      paras = (list(zip(text["labels"], text["contexts"])) if isinstance(text, dict)
               else [(None, text)])
      for n, (lab, par) in enumerate(paras):
        p = para_pool.passages[k]
        assert p.id == f"pubmed_slice:{i}:{j}:{n}" and p.text == par.strip()
        assert p.sections == ((lab or None, p.text),)
        own.append(k)
        k += 1
    assert para_pool.own[i] == own
    assert para_pool.gold[i] == [o for o in own if A.is_evidence_label(
        para_pool.passages[o].sections[0][0])]
  assert k == len(para_pool.passages) == 37
  assert [para_pool.has_gold(i) for i in range(12)] == [True] * 10 + [False] * 2


def test_paragraph_training_record_ranks_gold_then_own_then_negatives(para_pool):
  recs, stats = A.build_training_records(para_pool, range(10), num_passages=6)
  for qi, rec in enumerate(recs):
    ids = [p.id for p in rec.passages]
    gold = [para_pool.passages[g].id for g in para_pool.gold[qi]]
    own = [para_pool.passages[o].id for o in para_pool.own[qi]]
    rest = [o for o in own if o not in gold]
    assert [p.rank for p in rec.passages] == list(range(1, len(ids) + 1))
    n_own = min(len(own), 6)
    assert ids[:n_own] == (gold + rest)[:n_own]  # gold first, then the rest of its abstract
    negs = ids[n_own:]
    assert not set(negs) & set(own) and len(ids) == 6
    prefixes = {":".join(n.split(":")[:2]) for n in negs}
    assert f"pubmed_slice:{qi}" not in prefixes  # negatives come from other abstracts
    # Every sentence of a passage keeps its paragraph's role.
    for p in rec.passages:
      role = A.section_role(para_pool.passages[[q.id for q in para_pool.passages].index(p.id)]
                            .sections[0][0])[0]
      assert all(s.role == role for s in p.sentences)
  assert stats.queries == 10 and stats.passages == 60


def test_paragraph_query_without_gold_is_named(para_pool):
  with pytest.raises(DataError, match=r"query 10 has no gold paragraph"):
    A.build_training_records(para_pool, [10], num_passages=4)
  with pytest.raises(DataError, match=r"query 11 has no gold paragraph"):
    A.build_inference_record(para_pool, 11, 4)


def test_unknown_unit_is_named():
  with pytest.raises(DataError, match=r"unknown passage unit 'sentence'"):
    A.PubMedPool(SLICE, unit="sentence")


def test_paragraph_inference_record_and_relevance(para_pool):
  rec, rel = A.build_inference_record(para_pool, 1, 10)
  assert rel == ["pubmed_slice:1:0:6"]  # the RESULTS paragraph of question 1's abstract
  ids = [c["id"] for c in rec["ctxs"]]
  assert len(ids) == 10 and len(set(ids)) == 10
  assert {para_pool.passages[o].id for o in para_pool.own[1]} <= set(ids)  # hard negatives in


def test_build_tool_paragraph_unit_is_deterministic_and_disjoint(tmp_path):
  tool = _load_tool()
  outs = []
  for run in ("a", "b"):
    out = tmp_path / run
    tool.main(["--input", str(SLICE), "--out", str(out), "--unit", "paragraph",
               "--n-train", "5", "--n-val", "2", "--n-test", "3", "--passages", "5",
               "--pool-size", "8"])
    outs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
  assert outs[0] == outs[1]
  manifest = json.loads(outs[0]["manifest.json"])
  assert manifest["args"]["unit"] == "paragraph" and manifest["eligible_queries"] == 10
  splits = {s: R.validate_training_file(tmp_path / "a" / f"{s}.jsonl")[0]
            for s in ("train", "val", "test")}
  assert [len(splits[s]) for s in ("train", "val", "test")] == [5, 2, 3]
  _check_abstracts_disjoint(splits)
  with pytest.raises(SystemExit, match="asked for 11 queries but the file has 10"):
    tool.main(["--input", str(SLICE), "--out", str(tmp_path / "c"), "--unit", "paragraph",
               "--n-train", "6", "--n-val", "2", "--n-test", "3"])


def _abstract(pid: str) -> str:
  return ":".join(pid.split(":")[:2])


def _check_abstracts_disjoint(splits):
  """No paragraph of one split's question abstracts is a candidate anywhere in another split."""
  for name, recs in splits.items():
    own = {_abstract(r.passages[0].id) for r in recs}
    assert all(_abstract(r.passages[0].id) == r.id for r in recs)
    for other, orecs in splits.items():
      if other != name:
        assert not own & {_abstract(p.id) for r in orecs for p in r.passages}, (name, other)


def test_shipped_paragraph_demo_data():
  """What tools/demo.sh trains on and evaluates: valid, disjoint by abstract, gold = the
  question's own result paragraphs, every pool holding its whole abstract and 50 passages."""
  manifest = json.loads((PARAGRAPHS / "manifest.json").read_text())
  args = manifest["args"]
  assert args["unit"] == "paragraph" and args["pool_size"] == 50
  splits = {s: R.validate_training_file(PARAGRAPHS / f"{s}.jsonl")[0]
            for s in ("train", "val", "test")}
  assert [len(splits[s]) for s in ("train", "val", "test")] == [
      args["n_train"], args["n_val"], args["n_test"]]
  _check_abstracts_disjoint(splits)
  total = sum(p.stat().st_size for p in PARAGRAPHS.iterdir() if p.is_file())
  assert total < 3_000_000, total  # shipped inside the wheel: keep it small
  assert (PARAGRAPHS / "LICENSE").read_bytes() == (DATA / "SCHOLARQABENCH_LICENSE").read_bytes()
  corpus = {}
  with open(PARAGRAPHS / "corpus.jsonl", encoding="utf-8") as f:
    for line in f:
      c = json.loads(line)
      corpus[c["id"]] = c
  qrels = read_qrels(str(PARAGRAPHS / "test_pools.qrels"))
  with open(PARAGRAPHS / "test_pools.jsonl", encoding="utf-8") as f:
    pools = [json.loads(line) for line in f]
  assert [p["id"] for p in pools] == [r.id for r in splits["test"]] == sorted(qrels, key=[
      p["id"] for p in pools].index)
  for pool, rec in zip(pools, splits["test"]):
    ids = pool["ctx_ids"]
    assert len(ids) == len(set(ids)) == 50 and set(ids) <= set(corpus)
    own = {p.id for p in rec.passages if _abstract(p.id) == rec.id}
    assert own <= set(ids)
    gold = {p.id for p in rec.passages if _abstract(p.id) == rec.id
            and all(s.role[2] >= 0.5 for s in p.sentences)}
    assert qrels[pool["id"]] == gold and gold


def test_evidence_negatives_are_other_abstracts_result_paragraphs(para_pool):
  """Training records may hold other studies' result paragraphs as negatives (a 50-passage pool
  is full of them); the negatives stay in BM25 order and the pools' plain BM25 top is kept
  when the option is 0."""
  for qi in range(10):
    own = para_pool.gold[qi] + [j for j in para_pool.own[qi] if j not in para_pool.gold[qi]]
    plain = para_pool.candidates(qi, len(own) + 4)
    mixed = para_pool.candidates(qi, len(own) + 4, evidence_negatives=3)
    assert plain[:len(own)] == mixed[:len(own)] == own
    negs = mixed[len(own):]
    ev = [j for j in negs if A.is_evidence_label(para_pool.passages[j].sections[0][0])]
    others_ev = [j for i in range(12) if i != qi for j in para_pool.gold[i]]
    assert len(ev) >= min(3, len(others_ev)) and len(negs) == 4
    # Exactly the BM25 top evidence paragraphs of other abstracts are among them.
    scores = para_pool.index.scores(para_pool.queries[qi]["query"])
    best_ev = sorted(others_ev, key=lambda j: (-float(scores[j]), j))[:3]
    assert set(best_ev) <= set(negs)
    assert negs == sorted(negs, key=lambda j: (-float(scores[j]), j))
    assert plain[len(own):] == para_pool.index.top_k(
        para_pool.queries[qi]["query"], 4, exclude=tuple(sorted(para_pool.own[qi])))
  with pytest.raises(DataError, match="evidence_negatives needs the paragraph unit"):
    A.PubMedPool(SLICE).candidates(0, 4, evidence_negatives=1)


def test_teacher_records_rank_by_the_teacher_and_ban_held_out_paragraphs(para_pool):
  """Distillation records: BM25 candidates (own paragraphs where BM25 puts them, banned ones
  never), ranks by the teacher's scores, entries flagged unlabelled."""
  banned = frozenset(para_pool.own[5])
  teacher = lambda q, texts: [len(set(t.split())) / 100.0 for t in texts]  # noqa: E731
  recs, entries, stats = A.build_teacher_records(para_pool, [0, 2], 6, teacher, banned)
  assert stats.queries == 2 and [r.id for r in recs] == ["teacher:pubmed_slice:0",
                                                         "teacher:pubmed_slice:2"]
  for qi, rec, entry in zip([0, 2], recs, entries):
    assert entry["id"] == rec.id and entry["labelled"] is False
    cands = para_pool.bm25_candidates(qi, 6, banned)
    assert [para_pool.passages[j].id for j in cands] == list(entry["scores"])
    assert not set(cands) & banned
    want = sorted(range(6), key=lambda k: (-teacher(None, [para_pool.passages[cands[k]].text])[0], k))
    assert [p.id for p in sorted(rec.passages, key=lambda p: p.rank)] == \
        [para_pool.passages[cands[k]].id for k in want]
    top = para_pool.index.top_k(para_pool.queries[qi]["query"], 6, exclude=sorted(banned))
    assert cands == top


def test_shipped_distill_demo_data():
  """The demo's training file (configs/local_stage.py:minilm): the first 80 evidence records,
  then 80 teacher-ranked pools of questions in no evidence split, none holding a paragraph of a
  validation or test abstract; the teacher file scores every passage of exactly those pools."""
  distill = DEMO / "distill"
  manifest = json.loads((distill / "manifest.json").read_text())
  args = manifest["args"]
  mix = R.validate_training_file(distill / "train_mix.jsonl")[0]
  evidence = R.validate_training_file(PARAGRAPHS / "train.jsonl")[0]
  n = args["n_train"]
  assert [r.id for r in mix[:n]] == [r.id for r in evidence[:n]] and n == 80
  pools = mix[n:]
  assert len(pools) == args["n_queries"] == manifest["distill"]["queries"] == 80
  assert [r.id for r in pools] == [r.id for r in R.validate_training_file(
      distill / "distill.jsonl")[0]]
  assert all(len(r.passages) == args["passages"] for r in pools)
  splits = json.loads((PARAGRAPHS / "manifest.json").read_text())["splits"]
  used = {f"pubmed_test:{q}" for s in splits.values() for q in s["source_records"]}
  held_out = {f"pubmed_test:{q}" for name in ("val", "test") for q in splits[name]["source_records"]}
  assert all(r.id.startswith("teacher:pubmed_test:") for r in pools)
  assert not {r.id.split(":", 1)[1] for r in pools} & used
  assert not {_abstract(p.id) for r in pools for p in r.passages} & held_out
  teacher = [json.loads(line) for line in (distill / "teacher.jsonl").read_text().splitlines()]
  assert [t["id"] for t in teacher] == [r.id for r in pools]
  assert not any(t["labelled"] for t in teacher) and not args["teacher_on_train"]
  for t, r in zip(teacher, pools):
    assert set(t["scores"]) == {p.id for p in r.passages}
    order = sorted(t["scores"], key=t["scores"].get, reverse=True)
    assert order == [p.id for p in r.passages]  # the record's order is the teacher's ranking
