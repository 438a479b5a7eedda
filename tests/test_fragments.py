"""Sentence fragments (< 3 words) merged into a neighbour in the input path, offsets exact
(`data.sentences.merge_fragments`, applied by `data.inference_input`)."""

import json
import os

import pytest

from logrerank_jax.data.inference_input import parse_inference_record
from logrerank_jax.data.sentences import Sentence, is_fragment, merge_fragments, split_sentences

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    "logrerank_jax", "demo_data")


def _words(text):
  return len([t for t in text.split() if any(c.isalnum() for c in t)])


def _merge(text):
  return merge_fragments(text, split_sentences(text))


@pytest.mark.parametrize("text, expected", [
    # A trailing pointer joins the sentence before it.
    ("The model converges quickly. Fig. 2. Training is stable across seeds.",
     ["The model converges quickly. Fig. 2.", "Training is stable across seeds."]),
    # A list number leads in: it joins the sentence after it.
    ("We make three contributions. 1. We propose a graph reranker. 2. We test it on CS questions.",
     ["We make three contributions.", "1. We propose a graph reranker.",
      "2. We test it on CS questions."]),
    # A markdown heading at the start joins the first sentence.
    ("## 2. Our method builds a sentence graph over passages.",
     ["## 2. Our method builds a sentence graph over passages."]),
    # Only fragments: one sentence. One short sentence: kept.
    ("Fig. 2. Table 3.", ["Fig. 2. Table 3."]),
    ("Yes.", ["Yes."]),
    # Nothing to merge: unchanged; a two-word sentence of its own stays one.
    ("Cats sleep a lot. Dogs bark at night.", ["Cats sleep a lot.", "Dogs bark at night."]),
    ("Cells grew. Results held.", ["Cells grew.", "Results held."]),
])
def test_known_merges(text, expected):
  got = _merge(text)
  assert [s.text for s in got] == expected
  assert all(text[s.start:s.end] == s.text for s in got)


def test_offsets_and_characters_kept_on_real_pdf_text():
  """The shipped ScholarQA-CS snippets (PDF-extracted): 194 of 5,082 split sentences (3.8 %)
  have fewer than three words, 174 of them fragments (the rest two-word sentences of their own:
  a capital, two words, a stop). After merging no fragment is left, 15 two-word sentences are,
  every offset slices its text, and every non-space character is in exactly one sentence."""
  before = after = short_before = short_after = frag_before = frag_after = 0
  with open(os.path.join(DATA, "scholarqa_cs", "corpus.jsonl"), encoding="utf-8") as f:
    for line in f:
      text = json.loads(line)["text"]
      split = split_sentences(text)
      merged = merge_fragments(text, split)
      before, after = before + len(split), after + len(merged)
      short_before += sum(_words(s.text) < 3 for s in split)
      short_after += sum(_words(s.text) < 3 for s in merged)
      frag_before += sum(is_fragment(s.text) for s in split)
      frag_after += sum(is_fragment(s.text) for s in merged)
      assert all(text[s.start:s.end] == s.text for s in merged)
      assert all(a.end <= b.start for a, b in zip(merged, merged[1:]))
      assert "".join(text.split()) == "".join("".join(s.text.split()) for s in merged)
  assert (before, short_before, frag_before) == (5082, 194, 174)
  assert (frag_after, short_after) == (0, 15) and after == before - frag_before


def test_input_path_merges():
  rec = parse_inference_record({"question": "q", "ctxs": [
      {"text": "Graph methods help ranking. [12]. They add context across passages."}]})
  sents = rec.passages[0].sentences
  assert [s.text for s in sents] == ["Graph methods help ranking. [12].",
                                     "They add context across passages."]
  assert all(isinstance(s, Sentence) for s in sents)
