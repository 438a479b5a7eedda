"""Sentence splitting: exact offsets, no lost text, scientific abbreviations, on real abstracts."""

import sys
import time

import hypothesis
import hypothesis.strategies as st
import pytest

from logrerank_jax.data import sentences
from logrerank_jax.data.sentences import Sentence, split_sentences
from logrerank_jax.errors import ConfigError, DataError


def _assert_partition(text, sents):
  """Every non-whitespace character lies in exactly one sentence; offsets are exact."""
  covered = [0] * len(text)
  prev_end = 0
  for s in sents:
    assert isinstance(s, Sentence)
    assert text[s.start:s.end] == s.text
    assert s.text and s.text == s.text.strip()
    assert s.start >= prev_end, "sentences overlap or are out of order"
    prev_end = s.end
    for i in range(s.start, s.end):
      covered[i] += 1
  for i, ch in enumerate(text):
    if not ch.isspace():
      assert covered[i] == 1, f"character {i} {ch!r} covered {covered[i]} times"


def _real_texts(records):
  """All gold texts of the slice: plain strings, PubMed paragraphs and joined paragraphs."""
  out = []
  for r in records:
    for c in r["gold_ctx"]:
      t = c["text"]
      if isinstance(t, dict):
        out.extend(t["contexts"])
        out.append("\n".join(t["contexts"]))
      else:
        out.append(t)
    out.append(r["input"])
  return out


@pytest.mark.parametrize("text,expected", [
    ("Smith et al. found an effect. It was large.", ["Smith et al. found an effect.", "It was large."]),
    ("As shown in Fig. 2, cells grew. They died later.", ["As shown in Fig. 2, cells grew.", "They died later."]),
    ("Some drugs, e.g. aspirin, help. Others do not.", ["Some drugs, e.g. aspirin, help.", "Others do not."]),
    ("The dose, i.e. 5 mg, was safe. No harm was seen.", ["The dose, i.e. 5 mg, was safe.", "No harm was seen."]),
    ("The threshold was 0.05 in all tests. Power was 0.8.", ["The threshold was 0.05 in all tests.",
                                                             "Power was 0.8."]),
    ("Mortality fell (p < .001). Costs rose.", ["Mortality fell (p < .001).", "Costs rose."]),
    ("Drug A vs. placebo was tested. A won.", ["Drug A vs. placebo was tested.", "A won."]),
    ("Tumours had H3F3A mutations encoding p.Lys27Met substitutions. P53 was mutated.",
     ["Tumours had H3F3A mutations encoding p.Lys27Met substitutions.", "P53 was mutated."]),
    ("BACKGROUND The disease is common. METHODS We ran a trial.",
     ["BACKGROUND The disease is common.", "METHODS We ran a trial."]),
    ("First paragraph ends here.\nSecond paragraph starts.", ["First paragraph ends here.",
                                                              "Second paragraph starts."]),
    ("  Leading and trailing space.  ", ["Leading and trailing space."]),
    ("No final period", ["No final period"]),
], ids=["et_al", "fig", "eg", "ie", "decimal", "p_value", "vs", "hgvs", "inline_headings", "newline",
        "strip", "no_period"])
def test_known_splits(text, expected):
  got = split_sentences(text)
  assert [s.text for s in got] == expected
  _assert_partition(text, got)


@pytest.mark.parametrize("text", ["", "   ", "\n\t \n"], ids=["empty", "spaces", "newlines_tabs"])
def test_blank_text_gives_no_sentences(text):
  assert split_sentences(text) == []


@pytest.mark.parametrize("bad", [None, 3, ["a sentence."], b"bytes."], ids=["none", "int", "list", "bytes"])
def test_non_string_is_data_error(bad):
  with pytest.raises(DataError, match="expects a str"):
    split_sentences(bad)


def test_real_slices_partition_and_speed(scifact_records, pubmed_records):
  texts = _real_texts(scifact_records) + _real_texts(pubmed_records)
  sentences.clear_cache()  # time real splitting, not cache hits
  start = time.perf_counter()
  results = [split_sentences(t) for t in texts]
  elapsed = time.perf_counter() - start
  n_chars = sum(len(t) for t in texts)
  n_sents = sum(len(r) for r in results)
  print(f"split {len(texts)} texts, {n_chars} chars -> {n_sents} sentences in {elapsed:.3f} s")
  for t, r in zip(texts, results):
    _assert_partition(t, r)
  # Real abstracts have several sentences each; a splitter that never splits would give ~1.
  assert n_sents > 3 * len(scifact_records)
  assert elapsed < 10.0


def test_scifact_first_abstract_sentences(scifact_records):
  text = scifact_records[0]["gold_ctx"][0]["text"]
  got = [s.text for s in split_sentences(text)]
  # The URL and "(minor allele frequency >0.05)" must not split a sentence.
  assert got[0].endswith("hundreds of which have been convincingly replicated.")
  assert "(http://www.genome.gov/gwastudies)" in got[0]
  assert got[1].startswith("It is generally thought") and ">0.05) causal site" in got[1]


def test_segmenter_and_results_are_cached():
  assert sentences._segmenter() is sentences._segmenter()
  text = "A cached sentence. Another one."
  first = split_sentences(text)
  second = split_sentences(text)
  assert first == second and first is not second  # callers get their own list


_ALPHABET = st.sampled_from(list("abcXYZ019 .!?;:,()[]\"'-\n\t") + ["e.g.", "et al.", "Fig.", " 0.05", "\u00a0",
                                                                    "\u2028", "é", "µ", "...", "p.", "\r\n"])


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(st.lists(_ALPHABET, max_size=80).map("".join))
def test_random_text_loses_nothing(text):
  _assert_partition(text, split_sentences(text))


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.given(st.text(max_size=120))
def test_arbitrary_unicode_loses_nothing(text):
  _assert_partition(text, split_sentences(text))


class _AlteringSegmenter:
  """A stand-in segmenter that changes or drops characters, as buggy segmenters do."""

  def __init__(self, pieces):
    self.pieces = pieces

  def segment(self, text):
    del text
    return self.pieces


@pytest.mark.parametrize("pieces,expected", [
    (["One two. ", "THREE four. ", "Five six."], ["One two.", "three four. Five six."]),
    (["One two. ", "Five six."], ["One two. three four.", "Five six."]),
    (["One two. ", "three four. "], ["One two.", "three four.", "Five six."]),
], ids=["altered_piece_not_found", "skipped_piece", "dropped_tail"])
def test_segmenter_that_alters_text_loses_nothing(monkeypatch, pieces, expected):
  text = "One two. three four. Five six."
  monkeypatch.setattr(sentences, "_segmenter", lambda backend="sentencex": _AlteringSegmenter(pieces))
  sentences.clear_cache()  # results are cached per text
  try:
    got = split_sentences(text)
  finally:
    sentences.clear_cache()
  assert [s.text for s in got] == expected
  _assert_partition(text, got)


@pytest.mark.parametrize("pieces,expected", [
    (["Deinococcus spp. ", "are renowned. ", "They survive."], ["Deinococcus spp. are renowned.", "They survive."]),
    (["The m. ", "puborectalis became shorter."], ["The m. puborectalis became shorter."]),
    (["Mutations encoding p.", "Lys27Met substitutions. ", "P53 was mutated."],
     ["Mutations encoding p.Lys27Met substitutions.", "P53 was mutated."]),
    (["Scores were higher (P", "(s)<0.014). ", "Next."], ["Scores were higher (P(s)<0.014).", "Next."]),
    (["The aim was to ", "(a) estimate and ", "(b) compare. ", "We did."],
     ["The aim was to (a) estimate and (b) compare.", "We did."]),
    (["Smith et al. ", "Found nothing."], ["Smith et al.", "Found nothing."]),
    (["Outcome was death.\n", "Japan.\n", "Body mass index"], ["Outcome was death.", "Japan.", "Body mass index"]),
    (["DATA SOURCES/\n", "Health records."], ["DATA SOURCES/", "Health records."]),
    (["It ends here.", "Then a glued start."], ["It ends here.", "Then a glued start."]),
], ids=["spp", "single_letter_lowercase", "glued_hgvs", "glued_paren", "enumeration", "et_al_then_capital",
        "newline_items", "newline_no_punct", "glued_real_boundary"])
def test_false_split_repairs(monkeypatch, pieces, expected):
  """pysbd boundaries seen on real abstracts are repaired (or kept) as documented."""
  text = "".join(pieces)
  monkeypatch.setattr(sentences, "_segmenter", lambda backend="sentencex": _AlteringSegmenter(pieces))
  sentences.clear_cache()
  try:
    got = split_sentences(text)
  finally:
    sentences.clear_cache()
  assert [s.text for s in got] == expected
  _assert_partition(text, got)


def test_real_hgvs_notation_not_split(scifact_records):
  # The abstract writes "encoding p. Lys27Met substitutions" (with a space).
  texts = [c["text"] for r in scifact_records for c in r["gold_ctx"] if "p. Lys27Met" in c["text"]]
  assert texts, "fixture slice should contain the HGVS example"
  for t in texts:
    got = split_sentences(t)
    assert any("encoding p. Lys27Met substitutions." in s.text for s in got)
    assert not any(s.text.startswith("Lys27Met") for s in got)


@pytest.mark.parametrize("text", [
    "(1) ", "(ii)\n", ".9\u200aY\u200a.\u00a0(1) (<\u00b5[", "\u2028;1\u00b19The  1. to Y\u2028. \u00e9",
    " c\u00e9\t)1,HR. '...Y\u00a0\u00a0.]..\t:a",
], ids=["only_marker", "only_marker_newline", "sentencex_panic_1", "sentencex_panic_2", "sentencex_panic_3"])
def test_sentencex_edge_inputs_lose_nothing(text):
  """Inputs that made sentencex panic or left only a blanked list marker: nothing lost, no crash."""
  for backend in sentences.BACKENDS:
    if backend == "pysbd":
      pytest.importorskip("pysbd")  # the `compare` extra (dev installs it); sentencex ran above
    _assert_partition(text, split_sentences(text, backend))


_SCI_ALPHABET = st.sampled_from(list("abcXYZ019 .!?;:,()[]<>-\n") + [
    "(1) ", "(ii) ", " 12 mo. ", "HR. ", "The ", " 1. to ", "\u00b1", "\u200a", "\u00a0", "\u201d", "\u2026",
    "\u2028", "\u00b5", "et al.", "p < 0.05. ", "(P<.001). "])


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.lists(_SCI_ALPHABET, max_size=60).map("".join))
def test_random_scientific_text_loses_nothing(text):
  _assert_partition(text, split_sentences(text))


def test_unknown_backend_is_data_error():
  with pytest.raises(DataError, match="unknown sentence splitter backend"):
    split_sentences("A. B.", backend="nltk")


def test_pysbd_backend_without_pysbd_is_one_line_config_error(monkeypatch):
  """pysbd is optional: asking for its backend without it names the extra to install."""
  monkeypatch.setitem(sys.modules, "pysbd", None)  # `import pysbd` now raises ImportError
  sentences._segmenter.cache_clear()  # a pysbd segmenter made earlier would hide the import
  sentences.clear_cache()
  try:
    with pytest.raises(ConfigError) as err:
      split_sentences("A. B.", backend="pysbd")
  finally:
    sentences._segmenter.cache_clear()
    sentences.clear_cache()
  assert 'pip install "logrerank_jax[compare]"' in str(err.value)
  assert "\n" not in str(err.value)
  assert split_sentences("A b. C d.")  # the default backend needs no pysbd


def test_clear_cache_forces_a_real_split(monkeypatch):
  text = "Cache me. Twice."
  first = split_sentences(text)
  monkeypatch.setattr(sentences, "_segmenter", lambda backend="sentencex": _AlteringSegmenter([text]))
  assert split_sentences(text) == first  # served from the cache
  sentences.clear_cache()
  try:
    assert [s.text for s in split_sentences(text)] == [text]  # the stand-in segmenter ran
  finally:
    sentences.clear_cache()
