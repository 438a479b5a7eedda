"""Tokenizer training and loading from a HF-format folder."""

import json
import pathlib

import pytest

from logrerank_jax.data.tokenization import SPECIAL_TOKENS, load_tokenizer, train_wordpiece_tokenizer
from logrerank_jax.errors import CheckpointError


def _abstracts(records):
  return [r["gold_ctx"][0]["text"] for r in records]


def test_special_token_ids_are_fixed(scifact_records):
  tok = train_wordpiece_tokenizer(_abstracts(scifact_records), vocab_size=300)
  assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
  assert (tok.pad_token_id, tok.cls_token_id, tok.sep_token_id) == (0, 2, 3)


def test_saved_folder_round_trips(tmp_path, scifact_records):
  texts = _abstracts(scifact_records)
  tok = train_wordpiece_tokenizer(texts, vocab_size=400, out_dir=str(tmp_path))
  loaded = load_tokenizer(str(tmp_path))
  sample = scifact_records[0]["input"]
  assert loaded(sample)["input_ids"] == tok(sample)["input_ids"]
  # The post-processor wraps a single text as [CLS] ... [SEP].
  ids = loaded(sample)["input_ids"]
  assert ids[0] == 2 and ids[-1] == 3 and len(ids) > 5
  assert json.load(open(tmp_path / "tokenizer.json"))["model"]["type"] == "WordPiece"


@pytest.mark.parametrize("make", [
    pytest.param(lambda p: None, id="missing-folder"),
    pytest.param(lambda p: p.mkdir(), id="empty-folder"),
])
def test_load_errors_name_the_folder(tmp_path, make):
  path = tmp_path / "tok"
  make(path)
  with pytest.raises(CheckpointError, match="tok"):
    load_tokenizer(str(path))


def test_vocabulary_is_identical_across_processes(tmp_path):
  """Two fresh processes build the same vocabulary (the tokenizers trainer does not)."""
  import subprocess
  import sys
  code = ("import json,sys; from logrerank_jax.data.tokenization import train_wordpiece_tokenizer as t;"
          "recs=[json.loads(l) for l in open(sys.argv[1])];"
          "tok=t([r['gold_ctx'][0]['text'] for r in recs], 500);"
          "print(json.dumps(sorted(tok.get_vocab().items())))")
  path = str(pathlib.Path(__file__).parent / "data" / "scifact_slice.jsonl")
  outs = [subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True,
                         check=True).stdout for _ in range(2)]
  assert outs[0] == outs[1] and len(json.loads(outs[0])) == 500


def test_unknown_words_decompose_into_characters(scifact_records):
  tok = train_wordpiece_tokenizer(_abstracts(scifact_records), vocab_size=200)
  ids = tok("zyxwv", add_special_tokens=False)["input_ids"]
  assert tok.unk_token_id not in ids and len(ids) == 5
