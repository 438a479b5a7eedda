"""Sentence splitting of scientific text with exact character offsets.

Two segmenters, chosen with `split_sentences(text, backend=...)`:
  * "sentencex" (default, `DEFAULT_BACKEND`): the compiled (Rust) `sentencex`
    segmenter, ~0.02 ms per abstract; its pieces tile the text exactly, so
    offsets are cumulative lengths;
  * "pysbd": the previous segmenter (rule-based, pure Python, ~70x slower),
    kept for comparison (tools/splitter_report.py, docs/SENTENCES.md); an
    optional dependency (`pip install "logrerank_jax[compare]"`).  pysbd
    returns sentence strings; their offsets are recovered by aligning the
    non-whitespace characters of each segment to the input, so offsets are
    exact even where pysbd's own `char_span` mode is not.

Guarantees of `split_sentences(text)` (either backend):
  * every sentence is stripped and `text[s.start:s.end] == s.text`;
  * sentences are in order and do not overlap;
  * every non-whitespace character of `text` lies in exactly one sentence.

Post-fixes on top of either segmenter (each seen on real ScholarQABench
abstracts) undo a split
  * right after an abbreviation that never ends a sentence ("e.g.", "i.e.",
    "vs.", "Fig.", ...) or a lone lowercase letter ("encoding p. Lys27Met");
  * after "et al.", "spp.", "No.", "ca.", "resp.", "ref." or a single letter
    ("m. puborectalis") when the next piece starts with a lowercase letter, a
    digit or a bracket;
  * inside a token ("p.Lys27Met", "(P(s)<0.014)"), unless the left piece ends
    in sentence punctuation and the right one starts with a capital;
  * on one line where the left piece has no final punctuation (enumerations:
    "The aim was to (a) estimate ...").
Inline section headings ("BACKGROUND The ...", "METHODS AND FINDINGS Data ...")
start a new sentence (the previous one ended with a period) and stay attached
to the sentence they introduce.

sentencex-only repairs (its bugs, found on the same abstracts; see `_masked`
and `_forced_breaks`): it sees ASCII stand-ins for non-ASCII characters, "="
for "<"/">" and blanks for "(1)"-style list markers (all same-length, so
offsets hold); it is overruled where it misses a sentence end before a capital
after a unit or acronym ("12 mo. Glomerular", "cells lacking HR. Treatment"),
a plain word or a number/bracket, and at line breaks; and "twofold: 1. to
determine" is not split after "1.".

Splits are cached per (text, backend); `clear_cache()` forgets them.
"""

import functools
import re
from typing import NamedTuple, Optional, Sequence

from logrerank_jax.errors import ConfigError, DataError


class Sentence(NamedTuple):
  """One sentence: its stripped text and [start, end) character offsets in the source."""
  text: str
  start: int
  end: int


# Abbreviations after which a sentence never ends in scientific prose.
# A lone lowercase letter ("p. Lys27Met", "c. 35G>A") is an abbreviation, not a sentence end.
_NEVER_FINAL = re.compile(
    r"(?:\b(?i:e\.g|i\.e|vs|cf|Figs?|Eqs?|approx|Suppl|Tab)\.|(?:^|[^A-Za-z.])[a-z]\.)$")
# Abbreviations that end a sentence only when the next piece looks like a new one
# ("et al.", "spp.", "No.", single letters as in "m. puborectalis").
_MAYBE_FINAL = re.compile(r"(?:\b(?:et al|No|resp|ca|refs?|spp?)|(?:^|[^A-Za-z])[A-Za-z])\.$", re.IGNORECASE)
_CONTINUATION_START = re.compile(r"^[a-z0-9(\[]")
# A single-letter abbreviation glued to the next word, e.g. HGVS "p.Lys27Met".
_GLUED_INITIAL = re.compile(r"(?:^|[^A-Za-z])[A-Za-z]\.$")
# Sentence-final punctuation, possibly followed by closing quotes or brackets.
_TERMINAL = re.compile(r"[.!?:;\u2026][\"'\u201d\u2019)\]]*$")

# sentencex-only repairs.  A list marker "(1) ", "(ii) ", "(a) " at the start of a
# segment makes sentencex stop splitting the rest of it, so markers are blanked
# before segmenting.
_ENUMERATOR = re.compile(r"\((?:\d{1,2}|[ivx]{1,4}|[a-h])\)(?=\s)")
_ANGLE_TO_EQUALS = str.maketrans("<>", "==")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_QUOTES = {"\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u00ab": '"', "\u00bb": '"',
           "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2026": ".",
           "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\u2212": "-"}


@functools.lru_cache(maxsize=4096)
def _ascii_char(ch: str) -> str:
  """One ASCII character that plays the role of `ch` for sentence splitting."""
  if ch in _QUOTES:
    return _QUOTES[ch]
  if ch.isspace():
    return " "
  if ch.isupper():
    return "X"
  if ch.isdigit():
    return "0"
  return "x"


def _ascii_stand_in(m: re.Match) -> str:
  return _ascii_char(m.group())
# Sentence ends sentencex misses: a line break; and a period before a capital
# after a unit or an acronym ("12 mo. Glomerular", "30 min. The", "lacking HR.
# Treatment"): sentencex's abbreviation list holds units that do end sentences
# in scientific text.  Candidates are found first (fast literal scan), then the
# token before the period is checked on a short window.
_PERIOD_BEFORE_CAPITAL = re.compile(r"(\.[\"'\u201d\u2019)\]]*)[ \t\u00a0]+(?=[A-Z][a-z0-9]|[A-Z]{2,}\b)")
_LINE_BREAK = re.compile(r"\n\s*(?=\S)")
_UNIT_OR_ACRONYM = re.compile(r"(?:\d\s?[A-Za-z\u00b5][A-Za-z\u00b5/]{0,5}|(?<![A-Za-z.])[A-Z][A-Z0-9]+)$")
# A plain word (3+ lowercase letters) or a number/closing bracket before the
# period: sentencex leaves these unsplit only through its bugs (a piece that
# starts like a list marker, "cm) (P<.001). The ...", or an unclosed "(" as in
# "(range: a total ... achieved. Rates"), so they are split here, except after
# abbreviations of that shape that sentencex rightly keeps.
_PLAIN_END = re.compile(r"(?:(?<![A-Za-z])[A-Za-z]?[a-z]{3,}|[0-9%])[)\]]*$")
_KEPT_ABBREV = re.compile(
    r"(?i:\b(?:approx|suppl|figs?|eqs?|refs?|tab|resp|spp|prof|inc|ltd|corp|dept|univ|assoc|vol|viz|"
    r"sect|ca|cf|vs|al|no|nos|jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec))$")
# "twofold: 1. to determine ... and 2. to assess": a numbered item, not a sentence end.
_LIST_NUMBER = re.compile(r"(?:^|\s)\d{1,2}\.$")


BACKENDS = ("sentencex", "pysbd")
DEFAULT_BACKEND = "sentencex"


class _SentencexSegmenter:
  """`sentencex` (compiled, Rust) behind the `segment(text) -> pieces` interface of pysbd."""

  def __init__(self):
    import sentencex  # pylint: disable=g-import-not-at-top
    self._segment = sentencex.segment

  def segment(self, text: str):
    try:
      return list(self._segment("en", text))
    except BaseException as e:  # pylint: disable=broad-except
      # pyo3 panics derive from BaseException; never let one stop a query:
      # fall back to one piece (the post-fixes still split at line breaks).
      if type(e).__name__ != "PanicException":
        raise
      return [text]


@functools.lru_cache(maxsize=None)
def _segmenter(backend: str = DEFAULT_BACKEND):
  """Return the shared segmenter of `backend` (rules compile once)."""
  if backend == "sentencex":
    return _SentencexSegmenter()
  # pysbd is optional (the `compare` extra): imported only when its backend is asked for.
  try:
    import pysbd  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ConfigError('the "pysbd" sentence splitter backend needs pysbd, which is not installed: '
                      'pip install "logrerank_jax[compare]"') from e
  return pysbd.Segmenter(language="en", clean=False, char_span=False)


def _nonspace_positions(text: str, start: int, piece: str):
  """Align `piece`'s non-whitespace characters to `text` from `start`.

  Returns (first, last_exclusive, cursor) offsets in `text`, or None when the
  characters do not match (pysbd altered the text).
  """
  pos = start
  first = None
  last = None
  n = len(text)
  for ch in piece:
    if ch.isspace():
      continue
    while pos < n and text[pos].isspace():
      pos += 1
    if pos >= n or text[pos] != ch:
      return None
    if first is None:
      first = pos
    pos += 1
    last = pos
  if first is None:
    return (start, start, start)
  return (first, last, pos)


def _trimmed(text: str, spans) -> list[tuple[int, int]]:
  """The spans without leading/trailing whitespace; whitespace-only spans dropped."""
  out = []
  for s, e in spans:
    seg = text[s:e]
    ls = len(seg) - len(seg.lstrip())
    rs = len(seg) - len(seg.rstrip())
    if e - rs > s + ls:
      out.append((s + ls, e - rs))
  return out


def _masked(text: str) -> str:
  """`text` as sentencex should see it; same length, so offsets carry over.

  Non-ASCII characters get a one-character ASCII stand-in: sentencex 1.0.32
  mixes byte and character positions, so multi-byte characters ("±", "µ",
  thin spaces) made it miss boundaries, and some strings made it panic
  ("end byte index 7 is not a char boundary").  List markers "(1)", "(ii)",
  "(a)" are blanked, and "<", ">" become "=": sentencex skips text between
  "<" and ">" as if it were markup, so "pH of<5.5. The mean ... had>or =3"
  lost every boundary in between.
  """
  if not text.isascii():
    text = _NON_ASCII.sub(_ascii_stand_in, text)
  if "<" in text or ">" in text:
    text = text.translate(_ANGLE_TO_EQUALS)
  if "(" not in text:
    return text
  def blank(m):
    at = m.start()
    return " " * len(m.group()) if at == 0 or text[at - 1].isspace() else m.group()
  return _ENUMERATOR.sub(blank, text)


def _forced_breaks(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
  """Split spans at line breaks and at the sentence ends sentencex misses (units, acronyms)."""
  starts = []
  cuts = {s for s, _ in spans}  # sentencex boundaries (right after a piece's content)
  for m in _PERIOD_BEFORE_CAPITAL.finditer(text):
    if m.end(1) in cuts:
      continue  # sentencex already split here
    lo = max(0, m.start() - 12)
    if _UNIT_OR_ACRONYM.search(text, lo, m.start()) or (
        _PLAIN_END.search(text, lo, m.start()) and not _KEPT_ABBREV.search(text, lo, m.start())):
      starts.append(m.end())
  if "\n" in text:
    starts = sorted(set(starts).union(m.end() for m in _LINE_BREAK.finditer(text)))
  if not starts:
    return spans
  out, i = [], 0
  for s, e in spans:
    while i < len(starts) and starts[i] <= s:
      i += 1
    while i < len(starts) and starts[i] < e:
      out.append((s, starts[i]))
      s = starts[i]
      i += 1
    out.append((s, e))
  return out


def _raw_spans(text: str, backend: str) -> list[tuple[int, int]]:
  """Return [start, end) spans of the segmenter's pieces, covering all non-whitespace characters."""
  if backend == "sentencex":
    masked = _masked(text)
    pieces = _segmenter(backend).segment(masked)
    if "".join(pieces) == masked:
      # The pieces tile the (masked) text: cut after each piece's content, so
      # trailing blanked list markers open the next sentence, then trim on `text`.
      spans, cursor, pos = [], 0, 0
      for piece in pieces:
        end = pos + len(piece.rstrip())
        pos += len(piece)
        if end > cursor:
          spans.append((cursor, end))
          cursor = end
      # The tail (trailing blanks, or the whole text when it was only markers)
      # joins the last sentence.
      spans[-1:] = [(spans[-1][0] if spans else 0, len(text))]
      return _trimmed(text, _forced_breaks(text, spans))
  else:
    pieces = _segmenter(backend).segment(text)
  pieces = _segmenter(backend).segment(text) if backend == "sentencex" else pieces
  spans: list[tuple[int, int]] = []
  cursor = 0
  for piece in pieces:
    aligned = _nonspace_positions(text, cursor, piece)
    if aligned is None:
      # pysbd changed characters: resynchronise on the stripped piece if it
      # occurs later; otherwise stop trusting pysbd and keep the rest whole.
      stripped = piece.strip()
      found = text.find(stripped, cursor) if stripped else -1
      if found < 0:
        break
      if text[cursor:found].strip():
        # Characters skipped by pysbd join the previous sentence (never dropped).
        if spans:
          spans[-1] = (spans[-1][0], found)
        else:
          spans.append((cursor, found))
      aligned = (found, found + len(stripped), found + len(stripped))
    first, last, cursor = aligned
    if last > first:
      spans.append((first, last))
  if text[cursor:].strip():
    spans.append((cursor, len(text)))
  # Trim: every span must start and end on a non-whitespace character.
  return _trimmed(text, spans)


def _is_false_split(text: str, prev: tuple[int, int], nxt: tuple[int, int], backend: str = "pysbd") -> bool:
  """Whether the segmenter's boundary between spans `prev` and `nxt` is not a sentence end."""
  # Only the tail of the left piece and the head of the right one matter (the
  # patterns are anchored there and short); slicing keeps this O(1) per boundary.
  left, right = text[max(prev[0], prev[1] - 24):prev[1]], text[nxt[0]:min(nxt[1], nxt[0] + 4)]
  gap = text[prev[1]:nxt[0]]
  if backend == "sentencex" and right[0].islower() and "\n" not in gap and _LIST_NUMBER.search(left):
    return True
  if _NEVER_FINAL.search(left):
    return True
  if _MAYBE_FINAL.search(left) and _CONTINUATION_START.match(right):
    return True
  terminal = _TERMINAL.search(left) is not None
  if not gap:  # split inside a token: "p.Lys27Met", "(P(s)<0.014)"
    return bool(_GLUED_INITIAL.search(left)) or not (terminal and right[0].isupper())
  # No final punctuation and no line break: an enumeration "(a) ..." or similar, not an end.
  return not terminal and "\n" not in gap


def _merge_false_splits(text: str, spans: list[tuple[int, int]], backend: str = "pysbd") -> list[tuple[int, int]]:
  """Undo pysbd splits that are not sentence ends (abbreviations, glued tokens, enumerations)."""
  merged: list[tuple[int, int]] = []
  for s, e in spans:
    if merged and _is_false_split(text, merged[-1], (s, e), backend):
      merged[-1] = (merged[-1][0], e)
    else:
      merged.append((s, e))
  return merged


def split_sentences(text: str, backend: Optional[str] = None) -> list[Sentence]:
  """Split `text` into sentences with exact character offsets.

  Args:
    text: the passage text.
    backend: "sentencex" (the default, `DEFAULT_BACKEND`) or "pysbd" (the
      previous, ~300x slower segmenter, kept for comparison).  The same
      scientific post-fixes run on either.

  Returns:
    The sentences in order; [] for empty or whitespace-only text.

  Raises:
    DataError: `text` is not a string, or `backend` is unknown.
    ConfigError: `backend` is "pysbd" and pysbd is not installed.
  """
  if not isinstance(text, str):
    raise DataError(f"split_sentences expects a str, got {type(text).__name__}")
  backend = DEFAULT_BACKEND if backend is None else backend
  if backend not in BACKENDS:
    raise DataError(f"unknown sentence splitter backend {backend!r}; expected one of {BACKENDS}")
  if not text.strip():
    return []
  return list(_split_cached(text, backend))


@functools.lru_cache(maxsize=8192)
def _split_cached(text: str, backend: str) -> tuple[Sentence, ...]:
  """Split `text`; cached because evaluation pools repeat the same passages across queries."""
  spans = _merge_false_splits(text, _raw_spans(text, backend), backend)
  return tuple(Sentence(text[s:e], s, e) for s, e in spans)


# A "word" of `merge_fragments`: a whitespace-separated token holding a letter or a digit.
_WORD = re.compile(r"\S*[A-Za-z0-9]\S*")
MIN_SENTENCE_WORDS = 3
# A fragment that trails what it belongs to: it starts in lowercase or with punctuation or a
# bracket (") (", ", xn.", "[12].", "(p < 0.05)."), or it is a figure, table, equation or
# reference pointer ("Fig. 2", "Table 3."). Any other fragment (a list number "1.", "3.2.", a
# heading "## 2." or "Multi-Model Approach.", a section label "STUDY DESIGN/") leads in.
_TRAILS = re.compile(r"^(?:[^A-Za-z0-9#*]|[a-z]|(?:Figs?|Fig|Tables?|Tab|Eqs?|Refs?|Sec)\b)")


# A short sentence that is still one: a capital, two words of letters, a final stop
# ("Growth doubled.", "Results held.").
_SHORT_SENTENCE = re.compile(r"^[A-Z][A-Za-z'-]*\s+[A-Za-z][A-Za-z'-]+[.!?]$")


def is_fragment(sentence: str, min_words: int = MIN_SENTENCE_WORDS) -> bool:
  """Whether `sentence` is a fragment for `merge_fragments`: fewer than `min_words` words
  (tokens holding a letter or digit) and not a short sentence of its own (`_SHORT_SENTENCE`)."""
  return len(_WORD.findall(sentence)) < min_words and not _SHORT_SENTENCE.match(sentence)


def merge_fragments(text: str, sentences: Sequence[Sentence],
                    min_words: int = MIN_SENTENCE_WORDS) -> list[Sentence]:
  """Merge each sentence of fewer than `min_words` words into a neighbour, offsets exact.

  PDF-extracted text split at every period leaves pieces that are no sentence: ") (", "Fig. 2",
  a bare citation "[12].", a list number "1.", a heading "## 2.". Scored alone they reach a
  generator's context with nothing to say (2.5 % of LoG's top-10 context units on held-out
  synthesis pools). A fragment that trails (`_TRAILS`: a citation, a figure reference, a stray
  bracket) joins the sentence before it; any other (a list number, a heading, a section label)
  leads in and joins the one after it; the passage's first fragment joins the one after it and
  a last lead-in the one before it. The merged
  sentence spans both and the gap between, so `text[s.start:s.end] == s.text` and every
  character stays in exactly one sentence. A passage whose sentences are all fragments becomes
  one sentence; a passage of one short sentence keeps it.

  Args:
    text: the passage text the sentences index.
    sentences: `split_sentences(text)`.
    min_words: sentences with fewer words (tokens holding a letter or digit) are fragments.

  Returns:
    The merged sentences, in order.
  """
  merged: list[tuple[int, int]] = []
  lead_start = None  # start of fragments waiting to join the next full sentence
  for sent in sentences:
    span = (sent.start, sent.end)
    if not is_fragment(sent.text, min_words):
      if lead_start is not None:
        span, lead_start = (lead_start, span[1]), None
      merged.append(span)
    elif lead_start is not None:
      pass  # another fragment before the next sentence: it joins the same one
    elif merged and _TRAILS.match(sent.text):
      merged[-1] = (merged[-1][0], span[1])
    else:
      lead_start = span[0]
  if lead_start is not None:  # trailing lead-ins: the sentence before, else one sentence
    end = sentences[-1].end
    merged[-1:] = [(merged[-1][0], end)] if merged else [(lead_start, end)]
  return [Sentence(text[s:e], s, e) for s, e in merged]


def clear_cache() -> None:
  """Forget all cached splits (e.g. to time real splitting rather than cache hits)."""
  _split_cached.cache_clear()


def split_sentence_texts(text: str, backend: Optional[str] = None) -> list[str]:
  """Return only the sentence strings of `split_sentences(text, backend)`."""
  return [s.text for s in split_sentences(text, backend)]
