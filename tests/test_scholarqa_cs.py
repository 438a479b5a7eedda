"""ScholarQA-CS evaluation pools (`datasets/scholarqa_cs.py`, `tools/build_cs_pools.py`) and SciFact
snippet pools (`data/pools.build_chunk_pools`) on real slices."""

import json
import pathlib

import pytest

from logrerank_jax.datasets import scholarqa_cs
from logrerank_jax.datasets.bm25 import BM25Index
from logrerank_jax.datasets.pools import build_chunk_pools, chunk_passages
from logrerank_jax.datasets.scholarqabench import read_scholarqabench
from logrerank_jax.errors import ConfigError, DataError

DATA = pathlib.Path(__file__).parent / "data"
SLICE = DATA / "scholarqa_cs_slice.json"


def test_reader_keeps_rubric_order_and_dedupes():
  raw = json.loads(SLICE.read_text())
  qs = scholarqa_cs.read_scholarqa_cs(SLICE)
  assert [q.qid for q in qs] == [r["case_id"] for r in raw]
  for q, r in zip(qs, raw):
    assert q.question == r["initial_prompt"].strip()
    want = []
    for item in r["metric_config"]["config"]["other_properties"]:
      for s in item.get("evidence") or []:
        s = " ".join(s.split())
        if s not in want:
          want.append(s)
    assert list(q.snippets) == want


def test_pools_gold_cap_negatives_and_order():
  qs = scholarqa_cs.read_scholarqa_cs(SLICE)
  pools, qrels, corpus, stats = scholarqa_cs.build_cs_pools(qs, pool_size=30, max_gold=12)
  by_id = {c["id"]: c["text"] for c in corpus}
  assert len(corpus) == len(by_id) == len({c["text"] for c in corpus})
  bm25 = BM25Index([c["text"] for c in corpus])
  for q, pool in zip(qs, pools):
    ids = pool["ctx_ids"]
    assert len(ids) == len(set(ids)) == 30 and pool["input"] == q.question
    gold = qrels[q.qid]
    # Gold: the first 12 snippets in rubric order; the rest of its own are in no role.
    assert [by_id[i] for i in sorted(gold, key=lambda i: q.snippets.index(by_id[i]))] == \
        list(q.snippets[:12])
    own = set(q.snippets)
    negatives = [i for i in ids if i not in gold]
    assert not {by_id[i] for i in negatives} & own
    # Pool order: decreasing BM25 over the whole corpus, ties by corpus index.
    scores = bm25.scores(q.question)
    idx = [int(i.split(":")[1]) for i in ids]
    assert idx == sorted(idx, key=lambda i: (-scores[i], i))
    # Negatives are the BM25 top of the snippets that are not its own.
    best_other = [i for i in sorted(range(len(corpus)), key=lambda i: (-scores[i], i))
                  if corpus[i]["text"] not in own][:len(negatives)]
    assert sorted(best_other) == sorted(int(i.split(":")[1]) for i in negatives)
  assert stats["questions_capped"] == sum(len(q.snippets) > 12 for q in qs) >= 1
  with pytest.raises(ConfigError, match="max_gold"):
    scholarqa_cs.build_cs_pools(qs, pool_size=25, max_gold=25)


def test_cli_is_deterministic_and_bad_input_is_named(tmp_path):
  from importlib import util
  spec = util.spec_from_file_location("build_cs_pools", DATA.parent.parent / "tools" / "build_cs_pools.py")
  tool = util.module_from_spec(spec)
  spec.loader.exec_module(tool)
  for out in ("a", "b"):
    assert tool.main(["--input", str(SLICE), "--out", str(tmp_path / out), "--pool-size", "40"]) == 0
  for name in ("pools.jsonl", "pools.qrels", "corpus.jsonl", "manifest.json"):
    assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
  bad = json.loads(SLICE.read_text())[:2]
  bad[1]["metric_config"]["config"]["other_properties"][0]["evidence"] = ["ok snippet", 7]
  (tmp_path / "bad.json").write_text(json.dumps(bad))
  with pytest.raises(DataError, match=r"record 1: other_properties\[0\]\.evidence\[1\]"):
    scholarqa_cs.read_scholarqa_cs(tmp_path / "bad.json")


def test_scifact_chunk_pools():
  recs = read_scholarqabench(str(DATA / "scifact_slice.jsonl"))
  pools, qrels, corpus = build_chunk_pools(recs, [3, 0], sentences_per_chunk=3, pool_size=15)
  assert [p["id"] for p in pools] == ["3", "0"]
  text = {c["id"]: c["text"] for c in corpus}
  for rec, pool in zip([recs[3], recs[0]], pools):
    gold = qrels[pool["id"]]
    # Gold: every chunk of the claim's abstract, whose words are the abstract's, in order.
    abstract = " ".join(text[i] for i in sorted(gold, key=lambda i: int(i.split(":")[1])))
    assert abstract.split() == rec["gold"][0]["text"].split()
    assert gold <= set(pool["ctx_ids"]) and len(pool["ctx_ids"]) == 15
    prefix = next(iter(gold)).split(":")[0]
    assert all(i.split(":")[0] != prefix for i in set(pool["ctx_ids"]) - gold)
  chunks = chunk_passages("One. Two. Three. Four.", 3)
  assert chunks == ["One. Two. Three. Four."]  # a 1-sentence tail joins the chunk before it
