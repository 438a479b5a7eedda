"""tools/convert_torch.py end to end: torch checkpoint -> model folder -> tools/rerank.py scores."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

import torch_reference as tr
from logrerank_jax.cli import convert as convert_tool  # tools/convert_torch.py's module
from logrerank_jax.data.packing import pack_for_model
from logrerank_jax.convert import load_torch_state_dict, modernbert_params_from_torch
from logrerank_jax.data.inference_input import parse_inference_record
from logrerank_jax.data.packing import QueryInput
from logrerank_jax.datasets.wordpiece import train_wordpiece_tokenizer
from logrerank_jax.engine import default_packing_config
from logrerank_jax.models.config_io import load_log_config, save_log_config
from logrerank_jax.models.log_reranker import LoGConfig
from logrerank_jax.models.encoders.modernbert import ModernBertConfig, ModernBertSequenceClassifier

transformers.logging.set_verbosity_error()

ROOT = pathlib.Path(__file__).resolve().parents[1]
# float32, torch reference vs converted model through the CLIs: the same tiny models and bound
# as tests/test_convert_modernbert.py / tests/test_convert_log.py (~4 eps x (depth + 2) x scale).
PARITY_ATOL = 1e-5
ROW_LEN = 128
QUERIES_PER_BATCH = 2


def _run_cli(tool, *args):
  """Run a tool as a real subprocess (a fresh interpreter, as a user would)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, str(ROOT / "tools" / tool), *map(str, args)],
                        capture_output=True, text=True, env=env, timeout=120, check=False)


@pytest.fixture(scope="module")
def work(scifact_records, tmp_path_factory):
  """A torch reference checkpoint, its config JSON, a tokenizer and an input file of real text."""
  tmp = tmp_path_factory.mktemp("convert_cli")
  texts = [r["input"] for r in scifact_records] + [
      c["text"] for r in scifact_records for c in r["gold_ctx"]]
  tokenizer = train_wordpiece_tokenizer(texts, vocab_size=1500, out_dir=str(tmp / "tokenizer"))
  cfg = LoGConfig.tiny(vocab_size=len(tokenizer))
  cfg = dataclasses.replace(cfg, graph=dataclasses.replace(cfg.graph, tau_sim=0.3, delta=0.5))
  save_log_config(str(tmp / "log_config.json"), cfg)
  torch.manual_seed(0)
  model = tr.randomise_(tr.TorchLoGReranker(cfg), seed=11)
  torch.save(model.state_dict(), str(tmp / "log.pt"))
  ctx = lambda i: {"title": scifact_records[i]["gold_ctx"][0].get("title", ""),  # noqa: E731
                   "text": " ".join(scifact_records[i]["gold_ctx"][0]["text"].split()[:90])}
  records = [{"input": scifact_records[1]["input"], "ctxs": [ctx(1), ctx(2), ctx(3)]},
             {"question": scifact_records[6]["input"], "passages": [ctx(6), ctx(7)]}]
  with open(tmp / "queries.jsonl", "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")
  return dict(tmp=tmp, cfg=cfg, model=model, records=records, tokenizer=tokenizer,
              sd={k: v.detach().numpy().copy() for k, v in model.state_dict().items()})


@pytest.fixture(scope="module")
def model_dir(work):
  """The torch checkpoint converted by the real CLI (subprocess)."""
  out = work["tmp"] / "model"
  res = _run_cli("convert_torch.py", "--log-checkpoint", work["tmp"] / "log.pt", "--log-config",
                 work["tmp"] / "log_config.json", "--tokenizer", work["tmp"] / "tokenizer",
                 "--output", out)
  assert res.returncode == 0, res.stderr
  return out


def test_convert_then_rerank_matches_torch_reference(work, model_dir):
  """convert_torch.py then rerank.py scores every real sentence as the torch reference does."""
  out_path = work["tmp"] / "reranked.jsonl"
  res = _run_cli("rerank.py", "--checkpoint", model_dir, "--input", work["tmp"] / "queries.jsonl",
                 "--output", out_path, "--row-len", ROW_LEN, "--queries-per-batch",
                 QUERIES_PER_BATCH, "--no-compilation-cache", "--no-progress", "--strict")
  assert res.returncode == 0, res.stderr
  results = [json.loads(line) for line in out_path.read_text(encoding="utf-8").splitlines()]
  assert len(results) == 2 and all(r["error"] is None for r in results)

  # The reference sees the same sentences, packed with the same settings rerank.py uses.
  cfg = work["cfg"]
  recs = [parse_inference_record(r) for r in work["records"]]
  packing = dataclasses.replace(default_packing_config(cfg, ROW_LEN),
                                query_buckets=(QUERIES_PER_BATCH,))
  batch, _ = pack_for_model([QueryInput(r.query, r.sentence_texts) for r in recs],
                             work["tokenizer"], packing, cfg.contextual_encoding)
  ref, _ = tr.reference_forward(work["model"], batch, cfg)
  sig = lambda x: 1.0 / (1.0 + np.exp(-x.astype(np.float64)))  # noqa: E731
  n_slots = batch.node_mask.shape[1]
  compared, errs = 0, []
  for qi, res_q in enumerate(results):
    got = {(s["passage"], s["sentence"]): s for s in res_q["ranked_sentences"]}
    assert len(got) == sum(len(p) for p in recs[qi].sentence_texts)
    for n in np.flatnonzero(batch.node_mask[qi]):
      key = (int(batch.node_passage[qi, n]), int(batch.node_sentence[qi, n]))
      node = qi * n_slots + n
      errs.append(abs(got[key]["global_score"] - sig(ref["global_logit"][node])))
      errs.append(abs(got[key]["local_score"] - sig(ref["local_logit"][node])))
      compared += 1
  assert compared == sum(len(got) for got in [r["ranked_sentences"] for r in results])
  assert max(errs) <= PARITY_ATOL, max(errs)


def test_to_torch_round_trip_through_the_cli(work, model_dir):
  """--to-torch writes safetensors that equal the original checkpoint and load strictly."""
  out = work["tmp"] / "back"
  assert convert_tool.main(["--to-torch", str(model_dir), "--output", str(out)]) == 0
  assert sorted(os.listdir(out)) == ["model.safetensors", "model_config.json", "tokenizer"]
  sd = load_torch_state_dict(out / "model.safetensors")
  assert sorted(sd) == sorted(work["sd"])
  for k, v in work["sd"].items():
    assert np.array_equal(sd[k].view(np.uint32), v.view(np.uint32)), k
  cfg = load_log_config(str(out / "model_config.json"))
  assert cfg == work["cfg"]
  tr.TorchLoGReranker(cfg).load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()},
                                           strict=True)


def test_rename_table_through_the_cli(work, tmp_path):
  """A differently-named checkpoint fails with named keys, and converts with a rename table."""
  renamed = {("encoder." + k[len("local.encoder."):] if k.startswith("local.encoder.") else k): v
             for k, v in work["sd"].items()}
  safetensors.numpy.save_file(renamed, str(tmp_path / "renamed.safetensors"))
  args = ["--log-checkpoint", str(tmp_path / "renamed.safetensors"), "--log-config",
          str(work["tmp"] / "log_config.json"), "--tokenizer", str(work["tmp"] / "tokenizer")]
  assert convert_tool.main(args + ["--output", str(tmp_path / "bad")]) == 1
  assert not (tmp_path / "bad").exists()
  (tmp_path / "table.json").write_text(json.dumps({"regex": [["^encoder\\.", "local.encoder."]]}))
  assert convert_tool.main(args + ["--output", str(tmp_path / "good"), "--rename-table",
                                   str(tmp_path / "table.json")]) == 0
  assert convert_tool.main(["--to-torch", str(tmp_path / "good"), "--output",
                            str(tmp_path / "good_torch")]) == 0
  back = load_torch_state_dict(tmp_path / "good_torch" / "model.safetensors")
  for k, v in work["sd"].items():
    np.testing.assert_array_equal(back[k], v, err_msg=k)


def test_errors_are_named_and_leave_no_output(work, tmp_path, capsys):
  sd = dict(work["sd"])
  sd["global.scorer.out.bias"] = np.zeros((2,), np.float32)
  del sd["local.proj_g.weight"]
  safetensors.numpy.save_file(sd, str(tmp_path / "broken.safetensors"))
  out = tmp_path / "out"
  rc = convert_tool.main(["--log-checkpoint", str(tmp_path / "broken.safetensors"),
                          "--log-config", str(work["tmp"] / "log_config.json"), "--tokenizer",
                          str(work["tmp"] / "tokenizer"), "--output", str(out)])
  err = capsys.readouterr().err
  assert rc == 1
  assert "missing keys ['local.proj_g.weight']" in err
  assert "global.scorer.out.bias: expected (1,), got (2,)" in err
  assert sorted(os.listdir(tmp_path)) == ["broken.safetensors"]  # no output, no temp folder


def test_existing_output_is_kept_and_interrupted_write_leaves_nothing(work, model_dir, tmp_path,
                                                                       monkeypatch, capsys):
  out = tmp_path / "torch_out"
  out.mkdir()
  (out / "keep.txt").write_text("old")
  assert convert_tool.main(["--to-torch", str(model_dir), "--output", str(out)]) == 1
  assert "--overwrite" in capsys.readouterr().err
  assert (out / "keep.txt").read_text() == "old"

  def interrupted(*args, **kwargs):
    raise KeyboardInterrupt  # as if the user pressed Ctrl-C mid-write
  monkeypatch.setattr(safetensors.numpy, "save_file", interrupted)
  with pytest.raises(KeyboardInterrupt):
    convert_tool.main(["--to-torch", str(model_dir), "--output", str(out), "--overwrite"])
  assert sorted(os.listdir(tmp_path)) == ["torch_out"]  # temp folder removed
  assert sorted(os.listdir(out)) == ["keep.txt"]  # the previous output is untouched
  with pytest.raises(KeyboardInterrupt):
    convert_tool.main(["--to-torch", str(model_dir), "--output", str(tmp_path / "fresh")])
  assert sorted(os.listdir(tmp_path)) == ["torch_out"]
  monkeypatch.undo()
  assert convert_tool.main(["--to-torch", str(model_dir), "--output", str(out), "--overwrite"]) == 0
  assert sorted(os.listdir(out)) == ["model.safetensors", "model_config.json", "tokenizer"]
  assert sorted(os.listdir(tmp_path)) == ["torch_out"]  # the parked old output is gone too


# ----------------------------------------------------------------------- --hf-model (ModernBERT)

HF_TINY = dict(vocab_size=1500, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
               num_attention_heads=2, local_attention=8, global_attn_every_n_layers=2,
               max_position_embeddings=128, pad_token_id=0, bos_token_id=2, eos_token_id=3,
               cls_token_id=2, sep_token_id=3, classifier_pooling="mean", num_labels=1,
               attn_implementation="eager")


@pytest.mark.parametrize("with_head", [True, False], ids=["sequence_classifier", "bare_encoder"])
def test_hf_model_folder_converts(work, tmp_path, with_head):
  """--hf-model: a HF folder becomes a cross-encoder folder that scores like transformers."""
  hf_cfg = transformers.ModernBertConfig(**HF_TINY)
  cls = (transformers.ModernBertForSequenceClassification if with_head
         else transformers.ModernBertModel)
  torch.manual_seed(1)
  model = tr.randomise_(cls(hf_cfg), seed=3)
  hf_dir = tmp_path / "hf"
  model.save_pretrained(str(hf_dir))
  work["tokenizer"].save_pretrained(str(hf_dir))
  out = tmp_path / "converted"
  assert convert_tool.main(["--hf-model", str(hf_dir), "--output", str(out)]) == 0
  params, cfg, tok = convert_tool.load_cross_encoder_folder(str(out))
  assert tok is not None and len(tok) == len(work["tokenizer"])
  assert cfg == ModernBertConfig.from_hf(str(hf_dir))
  if not with_head:
    assert set(params) == {"model"}
    want = modernbert_params_from_torch(load_torch_state_dict(hf_dir), cfg)
    jax.tree_util.tree_map(np.testing.assert_array_equal, params["model"], want)
    return
  enc = tok(["Vitamin D deficiency raises fracture risk."],
            ["Randomised trials of supplementation in older adults report fewer hip fractures."],
            padding="max_length", max_length=40)
  ids = np.asarray(enc["input_ids"], np.int64)
  mask = np.asarray(enc["attention_mask"], np.int64)
  with torch.no_grad():
    want = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits
  got = ModernBertSequenceClassifier(cfg).apply({"params": params}, ids.astype(np.int32),
                                                mask.astype(np.int32))
  np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=0, atol=PARITY_ATOL)
