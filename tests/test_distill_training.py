"""Distillation and pool validation in the trainer (tiny model, real demo records): the KL and
gold-masked cross-passage terms against NumPy, validation on 50-passage pools with qrels, the
global stage with a teacher, the validation features the local stage hands the global stage,
and the refusals."""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from logrerank_jax.errors import ConfigError, DataError
from logrerank_jax.evaluation import read_qrels, rerank_metrics, write_qrels
from logrerank_jax.training import data as data_lib
from logrerank_jax.training import feature_cache as fc
from logrerank_jax.training import stages, trainer
from logrerank_jax.training.config_files import load_config_module

ROOT = pathlib.Path(__file__).resolve().parents[1]
PARAS = ROOT / "logrerank_jax" / "demo_data" / "paragraphs"
TEMPERATURE = 0.05


def _config(stage, **overrides):
  cfg = load_config_module(str(ROOT / "configs" / f"{stage}_stage.py")).get_config("tiny")
  cfg.progress_bar = False
  for k, v in overrides.items():
    setattr(cfg, k, v)
  return cfg


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """Three evidence queries (10 paragraphs each), a teacher file (one labelled, one teacher-only
  query), two 50-paragraph validation pools and a tokenizer."""
  from logrerank_jax.datasets.wordpiece import train_wordpiece_tokenizer
  d = tmp_path_factory.mktemp("distill")
  lines = PARAS.joinpath("train.jsonl").read_text().splitlines()[:3]
  (d / "train.jsonl").write_text("\n".join(lines) + "\n")
  recs = [json.loads(l) for l in lines]
  rng = np.random.default_rng(0)
  with open(d / "teacher.jsonl", "w") as f:
    for rec, labelled in zip(recs[:2], (True, False)):
      scores = {p["id"]: float(s) for p, s in zip(rec["passages"], rng.uniform(-1, 1, 10))}
      f.write(json.dumps({"id": rec["id"], "scores": scores, "labelled": labelled}) + "\n")
  # Two validation pools cut to their first 24 paragraphs, gold kept (cheaper than 50, and still
  # more than the 10 a recall@10 needs to move).
  qrels = read_qrels(str(PARAS / "val_pools.qrels"))
  pools = [json.loads(p) for p in PARAS.joinpath("val_pools.jsonl").read_text().splitlines()[:2]]
  for p in pools:
    gold = [i for i in p["ctx_ids"] if i in qrels[p["id"]]]
    p["ctx_ids"] = gold + [i for i in p["ctx_ids"] if i not in gold][:24 - len(gold)]
  (d / "val_pools.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pools))
  write_qrels(str(d / "val.qrels"), {p["id"]: qrels[p["id"]] for p in pools})
  texts = [r["question"] for r in recs] + [s["text"] for r in recs for p in r["passages"]
                                           for s in p["sentences"]]
  train_wordpiece_tokenizer(texts, 600, str(d / "tok"))
  return d


def _overrides(data, **kw):
  base = dict(train_file=str(data / "train.jsonl"), val_file="", tokenizer=str(data / "tok"),
              dropout=0.0, micro_batch_size=10, local_passage_weight=1.0, max_seq_len=128,
              teacher_file=str(data / "teacher.jsonl"), distill_weight=1.0,
              distill_temperature=TEMPERATURE)
  base.update(kw)
  return base


def np_kl(student, teacher):
  t = teacher / TEMPERATURE
  p = np.exp(t - t.max())
  p /= p.sum()
  log_q = student - student.max() - np.log(np.sum(np.exp(student - student.max())))
  return float(np.sum(p * (np.log(p) - log_q)))


def test_local_terms_match_numpy(data, tmp_path):
  """Each query's KL uses its slots' best sentence logits; the cross-passage gold term skips
  the teacher-only query; a query without teacher scores has no KL."""
  from logrerank_jax.data.records import validate_training_file
  config = _config("local", **_overrides(data))
  records, _ = validate_training_file(config.train_file)
  stage = stages.make_stage(config, str(tmp_path), records)
  groups = stage.micro_batch_groups(30, 0)  # all three queries in one micro-batch
  batch = stage.micro_batches(groups, lambda g: [g])[0][0]
  dev = {k: jnp.asarray(v) for k, v in batch.items() if k != "real_tokens"}
  params = stage.init_params(dev, jax.random.PRNGKey(0))
  loss_fn, coefs = stage.loss()
  assert coefs["distill"] == 1.0 and coefs["passage"] == 1.0
  terms = jax.jit(loss_fn)(params, dev, jax.random.PRNGKey(1))
  # Jitted (the batch an argument): eager, every op of the forward compiles on its own.
  local = jax.jit(lambda p, b: fc.local_features(stage.cfg, p, b)["local_logit"])
  logit = np.asarray(local(params["local"], dev), np.float64)
  mask = batch["node_mask"]
  best = np.where(mask, logit, -np.inf).max(-1)[:30].reshape(3, 10)  # slots beyond: padding
  teacher = json.loads((data / "teacher.jsonl").read_text().splitlines()[0])
  kls, golds = [], []
  for q, qid in enumerate(stage.units[i].qid for i in groups[0][::10]):
    units = [u for u in stage.units if u.qid == qid]
    slot = {u.passage_ids[0]: k for k, u in enumerate(units)}
    t = np.asarray(units[0].teacher and [u.teacher[0] for u in units] or [], np.float64)
    if len(t):
      kls.append(np_kl(best[q], t))
    if units[0].gold:
      gold = slot[next(u.passage_ids[0] for u in units if u.passage_rank[0] == 1)]
      golds.append(-(best[q][gold] - best[q].max() - np.log(np.sum(np.exp(best[q] - best[q].max())))))
  assert len(kls) == 2 and len(golds) == 2  # teacher: q0, q1; gold: q0 and the teacher-free q2
  assert teacher["labelled"] is True
  # float32 forward vs float64 NumPy on O(20) log-probabilities (logits / 0.05): ~20 eps
  # relative per term, 1e-4 relative bounds the sums (measured ~1e-6).
  np.testing.assert_allclose(np.asarray(terms["distill"]), [sum(kls), 2.0], rtol=1e-4)
  np.testing.assert_allclose(np.asarray(terms["passage"]), [sum(golds), 2.0], rtol=1e-4)


@pytest.fixture(scope="module")
def local_run(data, tmp_path_factory):
  work = tmp_path_factory.mktemp("local")
  config = _config("local", **_overrides(data, max_steps=2, val_pools=str(data / "val_pools.jsonl"),
                                         val_qrels=str(data / "val.qrels"),
                                         val_corpus=str(PARAS / "corpus.jsonl")))
  return config, trainer.train_and_evaluate(config, str(work)), work


def test_validation_on_pools_uses_their_qrels(data, local_run):
  config, summary, work = local_run
  log = [json.loads(l) for l in (work / "metrics.jsonl").read_text().splitlines()]
  assert any("distill" in r for r in log if r["event"] == "train")
  val = summary["val"]
  # Independent of the trainer's bucketed packing: one query per pack, no padding.
  from logrerank_jax.models.model_folder import load_model
  params, cfg, tok = load_model(summary["model_dir"])
  units, qrels = data_lib.pool_units(config.val_pools, config.val_qrels, config.val_corpus)
  assert len(units) == 2 and all(len(u.passage_ids) == 24 for u in units)
  run = {}
  local = jax.jit(lambda p, b: fc.local_features(cfg, p, b)["local_logit"])  # as above
  for u in units:
    b = data_lib.pack_units([u], tok, stages.forward_packing(stages.packing_config(config, cfg)))
    logit = np.asarray(local(params["local"], {
        k: jnp.asarray(v) for k, v in b.items() if k != "real_tokens"}))[0]
    best = np.full(24, -np.inf)
    for n in np.flatnonzero(b["node_mask"][0]):
      best[b["node_passage"][0, n]] = max(best[b["node_passage"][0, n]], logit[n])
    run[u.qid] = [u.passage_ids[p] for p in np.argsort(-best, kind="stable")]
  want = rerank_metrics(run, qrels, k=10)
  assert val["ndcg@10"] == pytest.approx(want["ndcg@10"], abs=1e-9)
  assert val["recall@10"] == pytest.approx(want["recall@10"], abs=1e-9)


def test_global_stage_with_teacher_and_pool_validation(data, local_run, tmp_path):
  config, _, work = local_run
  # One micro-batch of all three queries (two with teacher scores) per step.
  g = _config("global", **_overrides(data, max_steps=2, micro_batch_size=4, eval_every_steps=1,
                                     local_checkpoint=str(work), val_pools=config.val_pools,
                                     val_qrels=config.val_qrels, val_corpus=config.val_corpus,
                                     validate_at_start=True))
  summary = trainer.train_and_evaluate(g, str(tmp_path / "global"))
  log = [json.loads(l) for l in (tmp_path / "global" / "metrics.jsonl").read_text().splitlines()]
  train = [r for r in log if r["event"] == "train"]
  assert train and all(np.isfinite(r["distill"]) and r["distill"] > 0 for r in train)
  assert 0.0 <= summary["val"]["ndcg@10"] <= 100.0
  # The exported model's info names its checkpoint and carries that checkpoint's validation
  # (the best one's), and the last validation apart.
  vals = {r["step"]: {k: v for k, v in r.items() if k not in ("event", "step", "epoch")}
          for r in log if r["event"] == "val"}
  assert sorted(vals) == [0, 1, 2]  # step 0: the initial params (validate_at_start)
  info = json.loads((tmp_path / "global" / "model" / "info.json").read_text())
  step = int(info["source"].rsplit(" ", 1)[1])
  assert info["source"].startswith("best step") and info["val"] == vals[step] == summary["model_val"]
  assert info["selected_step"] == step and info["selected_by"] == "ndcg@10"
  assert info["validations"] == {str(s): v["ndcg@10"] for s, v in vals.items()}
  assert info["last_val"] == vals[2] == summary["val"]
  assert vals[step]["ndcg@10"] == max(v["ndcg@10"] for v in vals.values())
  # Its validation features came from the local stage's run (the next test: they are equal).
  assert log[0]["event"] == "start" and log[0]["val_features_from_local_stage"] is True


def test_global_stage_calibrates_from_its_validation_logits(data, local_run, tmp_path):
  """The global stage fits calibration.json on the validation pools from the logits its own
  validation computes (cached frozen-local features + the GAT), not from a second pass of the
  exported model. With no validation query over the query cut (64 tokens here, the engine's
  default for 128-token rows too) those logits and labels are the engine's on the exported
  folder, the ones `logrerank calibrate` fits on, and so is the fit."""
  from logrerank_jax.data.encoding import encode_texts
  from logrerank_jax.data.records import validate_training_file
  from logrerank_jax.engine import Reranker
  from logrerank_jax.engine import calibration as engine_cal
  from logrerank_jax.models.model_folder import load_model
  from logrerank_jax.results import calibration as cal_lib
  from logrerank_jax.training.stages.validation import validation_passage_logits
  config, _, work = local_run
  g = _global_config(data, config, work, max_query_tokens=64)
  trainer.train_and_evaluate(g, str(tmp_path / "global"))
  model = tmp_path / "global" / "model"
  records, _ = validate_training_file(config.train_file)
  units, qrels = data_lib.pool_units(config.val_pools, config.val_qrels, config.val_corpus)
  stage = stages.make_stage(g, str(tmp_path / "global"), records)
  _, q_len = encode_texts(stage.tokenizer, [u.query.query for u in units])
  assert max(q_len) <= 64  # the fast path's condition holds for these pools
  stage.make_eval(units, qrels)
  params, _, _ = load_model(str(model))
  z, y = validation_passage_logits(units, stage._val_logits[2](params["global"]), qrels)
  rr = Reranker.from_pretrained(str(model))
  assert rr.packing.max_query_tokens == 64
  z_engine, y_engine = engine_cal.passage_logits(
      rr, *engine_cal.labelled_pools(config.val_pools, config.val_qrels, config.val_corpus))
  assert z.size == z_engine.size == 48 and np.array_equal(y, y_engine) and y.sum() >= 2
  # Same features, same GAT; the engine batches the queries otherwise. Measured difference
  # 0.0 on the demo's model; 1e-4 absolute allows float32 reassociation of logits of size ~10.
  np.testing.assert_allclose(z, z_engine, rtol=0, atol=1e-4)
  path = model / "calibration.json"
  try:
    a, b = cal_lib.fit_platt(z_engine, y_engine)
  except DataError:  # a tiny model can rank the gold last: then nothing is written
    assert not path.exists()
  else:
    cal = json.loads(path.read_text())
    assert cal["n"] == 48 and cal["positives"] == int(y.sum())
    assert cal["a"] == pytest.approx(a, rel=1e-3) and cal["b"] == pytest.approx(b, rel=1e-3, abs=1e-3)


def _global_config(data, config, work, **kw):
  return _config("global", **_overrides(data, max_steps=1, micro_batch_size=4,
                                        local_checkpoint=str(work), val_pools=config.val_pools,
                                        val_qrels=config.val_qrels, val_corpus=config.val_corpus,
                                        **kw))


def test_local_stage_leaves_the_global_stage_its_validation_features(data, local_run, tmp_path):
  """The local stage keeps the node features behind its newest validation and, when they are
  the exported model's, leaves them (LocalStage.save) for the global stage, which reads them
  instead of running the frozen model over the pools again. They equal, bit for bit, what the
  global stage computes itself (same engine path, same params); the fingerprint keeps them
  from a global stage packing otherwise, and from params other than the ones they were computed
  with: saving other params writes none, and the file already there does not match them."""
  from logrerank_jax.data.records import validate_training_file
  from logrerank_jax.models.model_folder import load_model
  config, _, work = local_run
  assert (work / fc.LOCAL_VAL_FEATURES).exists()
  records, _ = validate_training_file(config.train_file)
  units, _ = data_lib.pool_units(config.val_pools, config.val_qrels, config.val_corpus)
  sources = fc.val_sources(config)
  g = _global_config(data, config, work)
  stage = stages.make_stage(g, str(tmp_path / "g"), records)
  read, hit = stage._features(units, sources[0], "val", sources[1])
  assert not hit and stage.cache_info["val_features_from_local_stage"] is True
  own = fc.engine_features(stage.cfg, stage.frozen_local, units, stage.tokenizer,
                           g.max_seq_len, g.max_query_tokens)
  assert len(read) == len(own) == 2
  for a, b in zip(read, own):
    assert sorted(a) == sorted(b)
    for k in a:
      assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
  # Another query cut packs the pools otherwise: its features are computed, not read.
  other = stages.make_stage(_global_config(data, config, work, max_query_tokens=16),
                            str(tmp_path / "g16"), records)
  other._features(units, sources[0], "val", sources[1])
  assert other.cache_info["val_features_from_local_stage"] is False
  # Params the newest validation did not score write nothing; the file there (these params')
  # does not match them, so a global stage on the moved params computes its own.
  params, _, _ = load_model(str(work / "model"))
  local = stages.make_stage(config, str(tmp_path / "l"), records)
  path = tmp_path / "l" / fc.LOCAL_VAL_FEATURES
  local._val_features = (fc.frozen_local_base(params["local"], local.cfg.local, config.max_seq_len,
                                              config.max_query_tokens), own)
  local.save(str(tmp_path / "l" / "model"), params, {})
  assert fc.read_features(str(path), fc.cache_fingerprint(stage.fp_base, *sources)) is not None
  written = path.read_bytes()
  moved = jax.tree_util.tree_map(lambda x: x + 1.0, params)
  local.save(str(tmp_path / "l" / "model"), moved, {})
  assert path.read_bytes() == written
  moved_base = fc.frozen_local_base(moved["local"], local.cfg.local, config.max_seq_len,
                                    config.max_query_tokens)
  assert fc.read_features(str(path), fc.cache_fingerprint(moved_base, *sources)) is None


def test_refusals(data, tmp_path):
  from logrerank_jax.data.records import validate_training_file
  records, _ = validate_training_file(str(data / "train.jsonl"))
  with pytest.raises(ConfigError, match="teacher_file"):
    stages.make_stage(_config("local", **_overrides(data, teacher_file="")), str(tmp_path), records)
  bad = tmp_path / "teacher.jsonl"
  entry = json.loads((data / "teacher.jsonl").read_text().splitlines()[0])
  entry["scores"].pop(next(iter(entry["scores"])))
  bad.write_text(json.dumps(entry) + "\n")
  with pytest.raises(DataError, match="lack passage"):
    stages.make_stage(_config("local", **_overrides(data, teacher_file=str(bad))), str(tmp_path),
                      records)
  short = records[:2] + [records[2].__class__(id=records[2].id, question=records[2].question,
                                              passages=records[2].passages[:9])]
  stage = stages.make_stage(_config("local", **_overrides(data, distill_weight=0.0)),
                            str(tmp_path), short)
  with pytest.raises(ConfigError, match="same number of passages"):
    stage.micro_batch_groups(10, 0)


def test_validation_pools_with_one_id_twice_are_refused(tmp_path):
  """Two validation pools of one query id (given, or the position a pool without an id is named
  by) would share one qrels entry and one metric: a one-line DataError naming both lines."""
  ctxs = [{"id": "a", "text": "Aspirin lowers the risk of stroke."},
          {"id": "b", "text": "Statins lower cholesterol."}]
  pools = tmp_path / "pools.jsonl"
  qrels = tmp_path / "pools.qrels"
  write_qrels(str(qrels), {"q1": {"a"}, "1": {"b"}})
  pools.write_text("\n".join(json.dumps({"id": "q1", "input": "aspirin", "ctxs": ctxs})
                             for _ in range(2)) + "\n")
  with pytest.raises(DataError, match=r"pools.jsonl:2: query id 'q1' is also the id of line 1"):
    data_lib.pool_units(str(pools), str(qrels))
  # A pool named "1" after an id-less pool at position 1 (0-based) collides the same way.
  pools.write_text(json.dumps({"id": "q1", "input": "aspirin", "ctxs": ctxs}) + "\n"
                   + json.dumps({"input": "statins", "ctxs": ctxs}) + "\n"
                   + json.dumps({"id": "1", "input": "statins", "ctxs": ctxs}) + "\n")
  with pytest.raises(DataError, match=r"pools.jsonl:3: query id '1' is also the id of line 2"):
    data_lib.pool_units(str(pools), str(qrels))
  pools.write_text("\n".join(json.dumps({"id": q, "input": "aspirin", "ctxs": ctxs})
                             for q in ("q1", "1")) + "\n")
  units, got = data_lib.pool_units(str(pools), str(qrels))
  assert [u.qid for u in units] == ["q1", "1"] and got == {"q1": {"a"}, "1": {"b"}}


def test_cached_features_of_another_sentence_split_are_refused():
  """Features cached before the input path split a query's passages otherwise (a splitter
  change keeps the cache key) are refused by name, not left to fail as a shape error."""
  import types
  from logrerank_jax.training.stages import global_
  unit = types.SimpleNamespace(qid="q7", query=types.SimpleNamespace(passages=[["a", "b"], ["c"]]))
  global_._check_node_counts([{"local_score": np.zeros(3)}], [unit], "wd/feature_cache/val-p0.npz")
  with pytest.raises(DataError, match=r"query 'q7' hold 4 sentence nodes.*splits into 3"):
    global_._check_node_counts([{"local_score": np.zeros(4)}], [unit], "wd/feature_cache/val-p0.npz")


def test_global_stage_without_distillation_leaves_teacher_only_queries_out(data, local_run,
                                                                          tmp_path, capsys):
  """Without distillation a teacher-ranked query (labelled false) has no term in eq 23: the global
  stage leaves it out, says so and keys its feature cache to the kept queries; with distillation
  every query stays; a file of teacher-ranked queries only is refused by name."""
  from logrerank_jax.data.records import validate_training_file
  config, _, work = local_run
  records, _ = validate_training_file(str(data / "train.jsonl"))
  teacher_only = {json.loads(l)["id"] for l in (data / "teacher.jsonl").read_text().splitlines()
                  if not json.loads(l)["labelled"]}
  assert len(teacher_only) == 1
  keep = stages.make_stage(_global_config(data, config, work), str(tmp_path / "a"), records)
  assert len(keep.units) == 3 and keep._train_subset == ""
  g = _global_config(data, config, work, distill_weight=0.0)
  drop = stages.make_stage(g, str(tmp_path / "b"), records)
  assert [u.qid for u in drop.units] == [r.id for r in records if r.id not in teacher_only]
  assert drop.cache_info["teacher_only_left_out"] == 1 and drop._train_subset
  assert "1 of 3 training queries are teacher-ranked only" in capsys.readouterr().out
  # A cache filled for all three queries is not read back for the two kept ones (a new key).
  full = stages.make_stage(_global_config(data, config, work, distill_weight=0.0), str(tmp_path),
                           records)
  full._train_subset = ""
  full.micro_batches([[0]], lambda grp: [grp])
  drop.workdir = str(tmp_path)
  drop.micro_batches([[0]], lambda grp: [grp])
  assert full.cache_info["train_cache_hit"] is False and drop.cache_info["train_cache_hit"] is False
  # Trained: the run's start record says what was left out.
  trainer.train_and_evaluate(g, str(tmp_path / "run"))
  start = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
  assert start["event"] == "start" and start["teacher_only_left_out"] == 1
  only = tmp_path / "only.jsonl"
  only.write_text("".join(l + "\n" for l in (data / "train.jsonl").read_text().splitlines()
                          if json.loads(l)["id"] in teacher_only))
  only_teacher = tmp_path / "only_teacher.jsonl"
  only_teacher.write_text("".join(l + "\n" for l in (data / "teacher.jsonl").read_text().splitlines()
                                  if json.loads(l)["id"] in teacher_only))
  one, _ = validate_training_file(str(only))
  with pytest.raises(DataError, match="every training query is teacher-ranked only"):
    stages.make_stage(_global_config(data, config, work, distill_weight=0.0, train_file=str(only),
                                     teacher_file=str(only_teacher)), str(tmp_path / "c"), one)
