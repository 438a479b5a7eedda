"""Sentence splitting of scientific text with exact character offsets.

The segmenter is `pysbd` (rule-based, handles abbreviations, decimals, citations
such as "et al.", "Fig. 2", "e.g.", "p < .001").  pysbd returns sentence strings;
their offsets are recovered here by aligning the non-whitespace characters of
each segment to the input, so offsets are exact even where pysbd's own
`char_span` mode is not (it searches for repeated sentences by content).

Guarantees of `split_sentences(text)`:
  * every sentence is stripped and `text[s.start:s.end] == s.text`;
  * sentences are in order and do not overlap;
  * every non-whitespace character of `text` lies in exactly one sentence.

Post-fixes on top of pysbd (each seen on real ScholarQABench abstracts) undo
a split
  * right after an abbreviation that never ends a sentence ("e.g.", "i.e.",
    "vs.", "Fig.", ...) or a lone lowercase letter ("encoding p. Lys27Met");
  * after "et al.", "spp.", "No.", "ca.", "resp.", "ref." or a single letter
    ("m. puborectalis") when the next piece starts with a lowercase letter, a
    digit or a bracket;
  * inside a token ("p.Lys27Met", "(P(s)<0.014)"), unless the left piece ends
    in sentence punctuation and the right one starts with a capital;
  * on one line where the left piece has no final punctuation (pysbd splits
    enumerations: "The aim was to (a) estimate ...").  Inline section headings
("BACKGROUND The ...") stay attached to their sentence.
"""

import functools
import re
from typing import NamedTuple

from logrerank_jax.errors import DataError


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


@functools.lru_cache(maxsize=1)
def _segmenter():
  """Return the shared pysbd segmenter (construction is cheap but rules compile once)."""
  import pysbd  # pylint: disable=g-import-not-at-top
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


def _raw_spans(text: str) -> list[tuple[int, int]]:
  """Return [start, end) spans of pysbd segments, covering all non-whitespace characters."""
  spans: list[tuple[int, int]] = []
  cursor = 0
  for piece in _segmenter().segment(text):
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
  out = []
  for s, e in spans:
    seg = text[s:e]
    ls = len(seg) - len(seg.lstrip())
    rs = len(seg) - len(seg.rstrip())
    if e - rs > s + ls:
      out.append((s + ls, e - rs))
  return out


def _is_false_split(text: str, prev: tuple[int, int], nxt: tuple[int, int]) -> bool:
  """Whether pysbd's boundary between spans `prev` and `nxt` is not a sentence end."""
  left, right = text[prev[0]:prev[1]], text[nxt[0]:nxt[1]]
  gap = text[prev[1]:nxt[0]]
  if _NEVER_FINAL.search(left):
    return True
  if _MAYBE_FINAL.search(left) and _CONTINUATION_START.match(right):
    return True
  terminal = _TERMINAL.search(left) is not None
  if not gap:  # split inside a token: "p.Lys27Met", "(P(s)<0.014)"
    return bool(_GLUED_INITIAL.search(left)) or not (terminal and right[0].isupper())
  # No final punctuation and no line break: an enumeration "(a) ..." or similar, not an end.
  return not terminal and "\n" not in gap


def _merge_false_splits(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
  """Undo pysbd splits that are not sentence ends (abbreviations, glued tokens, enumerations)."""
  merged: list[tuple[int, int]] = []
  for s, e in spans:
    if merged and _is_false_split(text, merged[-1], (s, e)):
      merged[-1] = (merged[-1][0], e)
    else:
      merged.append((s, e))
  return merged


def split_sentences(text: str) -> list[Sentence]:
  """Split `text` into sentences with exact character offsets.

  Args:
    text: the passage text.

  Returns:
    The sentences in order; [] for empty or whitespace-only text.

  Raises:
    DataError: `text` is not a string.
  """
  if not isinstance(text, str):
    raise DataError(f"split_sentences expects a str, got {type(text).__name__}")
  if not text.strip():
    return []
  return list(_split_cached(text))


@functools.lru_cache(maxsize=8192)
def _split_cached(text: str) -> tuple[Sentence, ...]:
  """Split `text`; cached because evaluation pools repeat the same passages across queries."""
  spans = _merge_false_splits(text, _raw_spans(text))
  return tuple(Sentence(text[s:e], s, e) for s, e in spans)


def split_sentence_texts(text: str) -> list[str]:
  """Return only the sentence strings of `split_sentences(text)`."""
  return [s.text for s in split_sentences(text)]
