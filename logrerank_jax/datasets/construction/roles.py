"""Role sources for consolidated sentences, behind one `RoleAnnotator` boundary.

The paper labels sentence roles (background, method, result) with a scientific
facet model. None is available offline, so three interchangeable sources exist:
  * `JsonlRoleSource`: per-sentence distributions an external facet model wrote
    to JSONL (`{"passage_id": str, "sentences": [{"text": str, "role": [b, m, r]}]}`);
  * `WindowedFacetAnnotator`: wraps any `FacetModel` (a callable over a list of
    sentences) and feeds long passages to it in overlapping windows, so every
    sentence gets a role whatever the model's input limit;
  * `SectionCueAnnotator`: the offline heuristic. A structured-abstract section
    label ("BACKGROUND:", "Methods and results:") sets the role of the sentences
    after it through `pubmed_adapter.section_role`; an unlabelled sentence gets
    a soft role from cue-phrase counts; with no cue it gets the uniform
    distribution ("no information"). It is a weak substitute for a facet model
    and is documented as such in docs/TRAINING_DATA.md.
"""

import collections
import math
import os
import re
from typing import Protocol, Sequence

from logrerank_jax.data.jsonl import read_json_lines
from logrerank_jax.datasets.pubmed_adapter import UNIFORM_ROLE
from logrerank_jax.datasets.pubmed_adapter import section_role
from logrerank_jax.errors import DataError

Role = tuple[float, float, float]


class RoleAnnotator(Protocol):
  """Anything that gives each sentence span of a passage a role distribution."""

  def annotate(self, passage_id: str, title: str, text: str,
               spans: Sequence[tuple[int, int]]) -> list[Role]:
    """Return one (background, method, result) distribution per [start, end) span of `text`.

    Raises:
      DataError: a role cannot be given (the message names the passage and sentence).
    """


class FacetModel(Protocol):
  """A sentence-level facet classifier with a bounded input (an external model)."""

  def __call__(self, sentences: Sequence[str]) -> list[Role]:
    """Return one role distribution per sentence."""


def normalize_space(text: str) -> str:
  """Collapse whitespace runs to one space and strip (the key for text matching)."""
  return " ".join(text.split())


def check_role(role, where: str) -> Role:
  """Return `role` as a float triple after checking it is a distribution.

  Raises:
    DataError: not 3 finite non-negative numbers summing to 1 (within 1e-4).
  """
  if (not isinstance(role, (list, tuple)) or len(role) != 3
      or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in role)):
    raise DataError(f"{where}: role must be 3 numbers, got {role!r}")
  vals = tuple(float(x) for x in role)
  if not all(math.isfinite(x) and x >= 0.0 for x in vals) or abs(math.fsum(vals) - 1.0) > 1e-4:
    raise DataError(f"{where}: role {list(role)} is not a probability distribution")
  return vals


class JsonlRoleSource:
  """Roles read from an external facet model's JSONL, matched by passage id and sentence text."""

  def __init__(self, path: str | os.PathLike):
    """Load and check every distribution in `path`.

    Raises:
      DataError: a line is malformed or a role is not a distribution.
    """
    self.path = os.fspath(path)
    self.table: dict[tuple[str, str], Role] = {}
    for lineno, obj, error in read_json_lines(
        self.path, lambda why: f"{self.path}: cannot read roles ({why})"):
      where = f"{self.path}:{lineno}"
      if error is not None:
        raise DataError(f"{where}: malformed JSON: {error.msg}") from None
      if (not isinstance(obj, dict) or not isinstance(obj.get("passage_id"), str)
          or not isinstance(obj.get("sentences"), list)):
        raise DataError(f"{where}: expected {{'passage_id': str, 'sentences': [...]}}")
      for j, s in enumerate(obj["sentences"]):
        if not isinstance(s, dict) or not isinstance(s.get("text"), str):
          raise DataError(f"{where}: sentences[{j}] needs a 'text' string")
        self.table[(obj["passage_id"], normalize_space(s["text"]))] = check_role(
            s.get("role"), f"{where} sentences[{j}]")

  def annotate(self, passage_id, title, text, spans):
    """Look up each span's role; a sentence without one is an error naming it."""
    out = []
    for s, e in spans:
      key = (passage_id, normalize_space(text[s:e]))
      if key not in self.table:
        raise DataError(f"{self.path}: no role for passage {passage_id!r} sentence "
                        f"{text[s:e][:60]!r}")
      out.append(self.table[key])
    return out


class WindowedFacetAnnotator:
  """Run a bounded-input `FacetModel` over overlapping sentence windows and average the overlaps."""

  def __init__(self, model: FacetModel, max_sentences: int = 16, overlap: int = 4):
    """Configure the windows.

    Args:
      model: the facet model.
      max_sentences: the most sentences one call sees.
      overlap: sentences shared by consecutive windows (context for their edges).

    Raises:
      DataError: `max_sentences` < 1 or `overlap` not in [0, max_sentences).
    """
    if max_sentences < 1 or not 0 <= overlap < max_sentences:
      raise DataError(f"need max_sentences >= 1 and 0 <= overlap < max_sentences, got "
                      f"{max_sentences}, {overlap}")
    self.model = model
    self.max_sentences = max_sentences
    self.overlap = overlap

  def windows(self, n: int) -> list[tuple[int, int]]:
    """Return [start, end) sentence windows covering 0..n, each at most `max_sentences` long."""
    if n == 0:
      return []
    stride = self.max_sentences - self.overlap
    out = []
    start = 0
    while True:
      end = min(start + self.max_sentences, n)
      out.append((start, end))
      if end == n:
        return out
      start += stride

  def annotate(self, passage_id, title, text, spans):
    """Return per-sentence roles: the mean over the windows that contain each sentence."""
    sents = [text[s:e] for s, e in spans]
    sums = [[0.0, 0.0, 0.0] for _ in sents]
    hits = [0] * len(sents)
    for a, b in self.windows(len(sents)):
      roles = self.model(sents[a:b])
      if len(roles) != b - a:
        raise DataError(f"facet model returned {len(roles)} roles for {b - a} sentences "
                        f"(passage {passage_id!r}, window {a}:{b})")
      for k, r in enumerate(roles):
        r = check_role(r, f"facet model, passage {passage_id!r} sentence {a + k}")
        for c in range(3):
          sums[a + k][c] += r[c]
        hits[a + k] += 1
    # The mean of distributions is a distribution; renormalise only against rounding.
    out = []
    for s, h in zip(sums, hits):
      tot = math.fsum(s)
      out.append(tuple(x / tot for x in s) if h else UNIFORM_ROLE)
    return out


# A section label at the text start or after a sentence end / newline:
# "BACKGROUND:", "Methods and results:".
_LABEL = re.compile(r"(?:^|(?<=[.!?]\s)|(?<=\n))\s*([A-Z][A-Za-z/&,\- ]{2,40}?)\s*:\s")
# Cue phrases per role (background, method, result); counted case-insensitively.
_CUES = (
    re.compile(r"\b(?:is known|are known|remains? unclear|little is known|unknown|has been|have "
               r"been|widely|commonly|important|recent(?:ly)?|challenge|however)\b", re.I),
    re.compile(r"\b(?:we used|using|used|was performed|were performed|measured|randomi[sz]ed|"
               r"participants|patients were|cohort|dataset|were (?:recruited|enrolled|assigned|"
               r"exposed|fed|trained)|trained on|we (?:trained|collected|analy[sz]ed|designed|"
               r"conducted|propose|fabricated|developed)|protocol|assay|procedure)\b", re.I),
    re.compile(r"\b(?:we found|found that|showed?|shown|demonstrat\w*|revealed?|significant(?:ly)?|"
               r"increased|decreased|reduced|improved|associated with|correlat\w*|suggest\w*|"
               r"conclude\w*|indicat\w*|outperform\w*|reached|(?:higher|lower|more|less) than|"
               r"(?:more|less) accurate)\b|p\s*[<=]\s*0?\.\d|\d\s*%", re.I),
)
_CUE_PRIOR = 0.25  # pseudo-count per role: one cue gives its role 1.25/1.75 ~ 0.71


class SectionCueAnnotator:
  """The offline heuristic: section labels of structured abstracts, else cue phrases, else uniform."""

  def __init__(self):
    self.sources = collections.Counter()  # sentences per source: label / cue / none

  @staticmethod
  def labels(text: str) -> list[tuple[int, Role]]:
    """Return (offset, role) of every recognised section label in `text`, in order."""
    out = []
    for m in _LABEL.finditer(text):
      role, how = section_role(m.group(1))
      if how in ("keyword", "override"):
        out.append((m.start(1), role))
    return out

  @staticmethod
  def cue_role(sentence: str) -> Role | None:
    """Return the soft role of a sentence from its cue phrases, or None without any."""
    counts = [len(p.findall(sentence)) for p in _CUES]
    total = sum(counts)
    if total == 0:
      return None
    return tuple((c + _CUE_PRIOR) / (total + 3 * _CUE_PRIOR) for c in counts)

  def annotate(self, passage_id, title, text, spans):
    """Return each span's role from the last label at or before it, else its cues, else uniform."""
    labels = self.labels(text)
    out = []
    for s, e in spans:
      before = [r for off, r in labels if off < s]
      # A label inside the sentence ("Results: X fell") governs it; else the last one before it.
      inside = [r for off, r in labels if s <= off < e]
      if inside:
        out.append(inside[0])
        self.sources["label"] += 1
      elif before:
        out.append(before[-1])
        self.sources["label"] += 1
      else:
        cue = self.cue_role(text[s:e])
        out.append(cue if cue is not None else UNIFORM_ROLE)
        self.sources["cue" if cue is not None else "none"] += 1
    return out
