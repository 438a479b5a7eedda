"""Full LoG-Reranker torch <-> Flax conversion: parity with a torch reference, round trips, keys."""

import dataclasses

import jax
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

import torch_reference as tr
from logrerank_jax.data.packing import pack_for_model
from logrerank_jax.convert import (apply_rename_table, load_torch_state_dict, log_key_table,
                                   log_params_from_torch, log_params_to_torch, parse_rename_table)
from logrerank_jax.data.packing import PackingConfig, QueryInput
from logrerank_jax.data.sentences import split_sentences
from logrerank_jax.datasets.wordpiece import train_wordpiece_tokenizer
from logrerank_jax.errors import CheckpointError, ConfigError
from logrerank_jax.graph.build import SIMILARITY_EDGE_TYPE
from logrerank_jax.models.log_reranker import (LoGConfig, ablation, device_batch, init_params,
                                               log_forward)

transformers.logging.set_verbosity_error()

# float32 parity bound between the torch reference and the converted Flax model: both evaluate
# the same float32 model in different orders; the tiny encoder (3 layers) contributes
# ~4 eps x (depth + 2) x scale ~ 1e-5 (derivation in tests/test_modernbert_parity.py), the heads
# and GAT on O(1) activations a few eps more. Measured <= 5.4e-7 with the default, AVX2 and
# SSE4.2 XLA CPU kernels (18x).
PARITY_ATOL = 1e-5
PACK = PackingConfig(row_len=128, row_buckets=(8, 16), span_buckets=(64, 128), node_buckets=(32,),
                     query_buckets=(2,), max_query_tokens=32)
_FORWARD_JIT = jax.jit(log_forward, static_argnames=("cfg", "deterministic", "freeze_local"))


def _tiny_cfg(vocab_size):
  """Tiny config; a lower similarity threshold so the random-weight graph has similarity edges."""
  cfg = LoGConfig.tiny(vocab_size=vocab_size)
  return dataclasses.replace(cfg, graph=dataclasses.replace(cfg.graph, tau_sim=0.3, delta=0.5))


@pytest.fixture(scope="module")
def setup(scifact_records):
  """Real SciFact sentences, split and packed by our packer; tiny config; tokenizer."""
  texts = [r["input"] for r in scifact_records] + [
      c["text"] for r in scifact_records for c in r["gold_ctx"]]
  tokenizer = train_wordpiece_tokenizer(texts, vocab_size=1500)
  passages = [[s.text for s in split_sentences(r["gold_ctx"][0]["text"])][:6]
              for r in scifact_records]
  queries = [QueryInput(scifact_records[1]["input"], passages[1:4]),
             QueryInput(scifact_records[6]["input"], passages[6:8])]
  cfg = _tiny_cfg(len(tokenizer))
  batch, _ = pack_for_model(queries, tokenizer, PACK, cfg.contextual_encoding)
  return dict(tokenizer=tokenizer, queries=queries, cfg=cfg, batch=batch)


@pytest.fixture(scope="module")
def torch_model(setup):
  """A randomised torch reference, its state dict and its outputs on the real batch."""
  torch.manual_seed(0)
  model = tr.randomise_(tr.TorchLoGReranker(setup["cfg"]), seed=7)
  sd = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
  out, graph = tr.reference_forward(model, setup["batch"], setup["cfg"])
  return dict(model=model, sd=sd, out=out, graph=graph)


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "no_jit"])
def test_torch_reference_to_flax_parity(setup, torch_model, jit):
  """Converted torch weights give the same local, role, intent and global outputs in Flax."""
  cfg, batch = setup["cfg"], setup["batch"]
  params = log_params_from_torch(torch_model["sd"], cfg)
  forward = _FORWARD_JIT if jit else log_forward
  out = jax.tree_util.tree_map(np.asarray, forward(params, device_batch(batch), cfg))
  ref, ref_graph = torch_model["out"], torch_model["graph"]
  mask = batch.node_mask.reshape(-1)
  assert mask.sum() == sum(len(p) for q in setup["queries"] for p in q.passages)

  # Same graph from both models' local outputs, and it has both edge kinds.
  g = out["graph"]
  for name, a, b in (("senders", g.senders, ref_graph.senders),
                     ("receivers", g.receivers, ref_graph.receivers),
                     ("type", g.edges["type"], ref_graph.edges["type"]),
                     ("mask", g.edges["mask"], ref_graph.edges["mask"])):
    np.testing.assert_array_equal(a, b, err_msg=name)
  valid_types = g.edges["type"][g.edges["mask"]]
  assert (valid_types == SIMILARITY_EDGE_TYPE).sum() > 0
  assert (valid_types < SIMILARITY_EDGE_TYPE).sum() > 0

  for key in ("local_logit", "local_score", "role_logits", "role_probs", "intent_probs", "h",
              "global_logit"):
    np.testing.assert_allclose(out[key][mask], ref[key][mask], rtol=0, atol=PARITY_ATOL,
                               err_msg=key)
  # Not a vacuous comparison: scores are spread, not constant.
  assert np.std(ref["global_logit"][mask]) > 1e-2 and np.std(ref["local_logit"][mask]) > 1e-2


@pytest.mark.parametrize("fmt", ["safetensors", "torch_save"], ids=["safetensors", "torch_save"])
def test_reference_checkpoint_files_convert(setup, torch_model, tmp_path, fmt):
  """Checkpoints written by the torch reference load (safely) and convert to the same params."""
  model, sd = torch_model["model"], torch_model["sd"]
  if fmt == "safetensors":
    path = tmp_path / "log.safetensors"
    safetensors.numpy.save_file(sd, str(path))
  else:
    path = tmp_path / "log.pt"
    torch.save(model.state_dict(), str(path))
  loaded = load_torch_state_dict(path)
  assert sorted(loaded) == sorted(sd)
  a = log_params_from_torch(loaded, setup["cfg"])
  b = log_params_from_torch(sd, setup["cfg"])
  jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)


ABLATED = ["full", "w/o role head", "w/o intent head", "w/o global", "w/o edge types"]


@pytest.mark.parametrize("name", ABLATED, ids=[n.replace("w/o ", "no_").replace(" ", "_")
                                                for n in ABLATED])
def test_flax_to_torch_round_trip_bit_exact(setup, name):
  """Flax -> torch -> Flax is bit-exact and the torch side loads with strict=True."""
  cfg = setup["cfg"] if name == "full" else ablation(setup["cfg"], name)
  params = jax.tree_util.tree_map(np.asarray,
                                  init_params(cfg, setup["batch"], jax.random.PRNGKey(3)))
  sd = log_params_to_torch(params, cfg)
  torch_ref = tr.TorchLoGReranker(cfg)
  assert sorted(sd) == sorted(torch_ref.state_dict())
  torch_ref.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=True)
  back = log_params_from_torch(sd, cfg)
  assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(params)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(params),
                          jax.tree_util.tree_leaves(back)):
    assert b.dtype == np.float32 and a.shape == b.shape, path
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), path
  assert ("global" in params) == cfg.use_global


def test_flax_params_exported_to_torch_score_the_same(setup):
  """Flax-initialised params, exported, give the same global logits in the torch reference."""
  cfg, batch = setup["cfg"], setup["batch"]
  params = init_params(cfg, batch, jax.random.PRNGKey(5))
  model = tr.TorchLoGReranker(cfg).eval()
  sd = log_params_to_torch(params, cfg)
  model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=True)
  ref, _ = tr.reference_forward(model, batch, cfg)
  out = _FORWARD_JIT(params, device_batch(batch), cfg)
  mask = batch.node_mask.reshape(-1)
  for key in ("local_logit", "global_logit"):
    np.testing.assert_allclose(np.asarray(out[key])[mask], ref[key][mask], rtol=0,
                               atol=PARITY_ATOL, err_msg=key)


def test_paper_key_table_matches_param_count():
  """The documented paper-size layout covers exactly the model's 152,519,560 parameters."""
  from logrerank_jax.models.log_reranker import count_params
  cfg = LoGConfig.paper()
  table = dict(log_key_table(cfg))
  assert sum(int(np.prod(s)) for s in table.values()) == count_params(cfg)["total"] == 152_519_560
  assert table["local.encoder.layers.0.attn.Wqkv.weight"] == (2304, 768)
  assert table["global.layers.1.attn.W_rel"] == (8, 256, 256)
  assert table["global.layers.0.attn.att"] == (4, 2 * 64 + 64)
  assert "local.encoder.layers.0.attn_norm.weight" not in table  # layer 0 has no attn norm


def test_missing_unexpected_and_misshaped_keys_are_named(setup, torch_model):
  sd = dict(torch_model["sd"])
  del sd["global.layers.1.attn.W_rel"]
  sd["local.extra_head.weight"] = np.zeros((3, 3), np.float32)
  sd["local.proj_g.weight"] = np.zeros((5, 3), np.float32)
  with pytest.raises(CheckpointError) as e:
    log_params_from_torch(sd, setup["cfg"])
  msg = str(e.value)
  assert "missing keys ['global.layers.1.attn.W_rel']" in msg
  assert "unexpected keys ['local.extra_head.weight']" in msg
  assert "local.proj_g.weight: expected (32, 3), got (5, 3)" in msg


def test_flax_side_errors_name_paths(setup, torch_model):
  params = log_params_from_torch(torch_model["sd"], setup["cfg"])
  del params["global"]["scorer"]
  with pytest.raises(CheckpointError, match=r"missing keys \['global/scorer/hidden/kernel', "
                     r"'global/scorer/hidden/bias', 'global/scorer/out/kernel'"):
    log_params_to_torch(params, setup["cfg"])


def _renamed(sd):
  """A differently-named copy of a checkpoint, as another codebase might save it."""
  out = {}
  for k, v in sd.items():
    k = k.replace("local.encoder.", "backbone.model.")
    k = k.replace("global.layers.", "gat.blocks.") if k.startswith("global.layers.") else k
    out["W_p" if k == "local.proj_g.weight" else k] = v
  return out


def test_rename_table_fixes_a_differently_named_checkpoint(setup, torch_model, tmp_path):
  cfg, sd = setup["cfg"], torch_model["sd"]
  renamed = _renamed(sd)
  with pytest.raises(CheckpointError) as e:
    log_params_from_torch(renamed, cfg)
  assert "W_p" in str(e.value) and "local.proj_g.weight" in str(e.value)
  table_path = tmp_path / "rename.json"
  table_path.write_text('{"exact": {"W_p": "local.proj_g.weight"}, "regex": ['
                        '["^backbone\\\\.model\\\\.", "local.encoder."], '
                        '["^gat\\\\.blocks\\\\.(\\\\d+)\\\\.", "global.layers.\\\\1."]]}')
  got = log_params_from_torch(renamed, cfg, rename=str(table_path))
  want = log_params_from_torch(sd, cfg)
  jax.tree_util.tree_map(np.testing.assert_array_equal, got, want)


@pytest.mark.parametrize("table,error,match", [
    ({"regex": [["(unclosed", "x"]]}, ConfigError, r"regex '\(unclosed' is invalid"),
    ({"rename": {}}, ConfigError, r"unknown keys \['rename'\]"),
    ({"exact": {"not.there": "x"}}, CheckpointError, r"lacks: \['not.there'\]"),
    ({"regex": {r"^local\.proj_g\.weight$": "local.local_mlp.out.bias"}}, CheckpointError,
     r"several keys to one name"),
], ids=["bad_regex", "unknown_key", "absent_exact", "collision"])
def test_bad_rename_tables_are_refused(torch_model, table, error, match):
  with pytest.raises(error, match=match):
    apply_rename_table(torch_model["sd"], parse_rename_table(table))
