"""Weakly-labelled training records from ScholarQABench's PubMedQA file (`pubmed_test.jsonl`).

PubMedQA has no sentence labels, so every label here is *weak* and derived by a
fixed, documented rule (see `docs/DATA.md`, "PubMedQA adapter"):

  * Passage unit (`PubMedPool(path, unit=...)`):
    - "abstract": a passage is a whole gold context. Gold context j of record i
      (0-based, blank lines skipped) has id "<file stem>:<i>:<j>"; the query's
      id is "<file stem>:<i>". The question's own abstract is its gold.
    - "paragraph" (evidence pools): a passage is one paragraph ("contexts"
      entry) of a gold context, id "<file stem>:<i>:<j>:<k>" (k = paragraph
      index). The question's gold passages are its own abstract's *evidence*
      paragraphs, those whose section label is at least half "result"
      (`is_evidence_label`: RESULTS, FINDINGS, "METHODS AND RESULTS", ...);
      its other own paragraphs (background, methods) are on-topic but hold no
      finding. A question whose abstract has no evidence paragraph (plain-
      string or unlabelled text) has no gold: `has_gold(i)` is False and it is
      never a query, though its paragraphs stay candidates of other queries.
  * Passage pool: every passage of that unit over the file, in file order.
  * Passages of query i: its gold passages (rank 1..G, in file order), then its
    other own passages (paragraph unit only; ranks G+1..G+O, in file order),
    then the BM25 top (P - G - O) other pool passages for the question (in BM25
    order; ties -> lower pool index; passages whose text equals a text of the
    query's own are excluded, so a duplicate is never labelled a negative).
  * Sentences: each paragraph ("contexts" entry, or the whole plain-string text)
    is split with `split_sentences`; a sentence never spans two paragraphs.
  * Sentence roles: from the paragraph's real section label through
    `section_role` (keyword map below); a label with no keyword and a plain-
    string text without labels get the uniform distribution (1/3, 1/3, 1/3),
    i.e. "no information"; both cases are counted in `AdapterStats`.
  * Sentence ranks within a passage: IDF-weighted question overlap
    score(s) = sum over distinct question tokens t present in s of
    idf(t) = log(1 + (D - df(t) + 0.5) / (df(t) + 0.5)), with df over the D
    pool passages and the BM25 tokenizer (`bm25_tokenize`: lowercase
    alphanumeric runs);
    higher score = better rank, ties -> earlier sentence first.
    In the paragraph unit D counts paragraphs.

Everything is deterministic: no randomness, stable sorts only.
"""

import collections
import dataclasses
import math
import os
import re
from typing import Optional, Sequence

from logrerank_jax.data import records as records_lib
from logrerank_jax.datasets.bm25 import BM25Index
from logrerank_jax.datasets.bm25 import bm25_tokenize
from logrerank_jax.datasets.scholarqabench import read_scholarqabench
from logrerank_jax.data.sentences import split_sentence_texts
from logrerank_jax.errors import DataError

UNIFORM_ROLE = (1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0)
# Words of a section label (upper-cased, split on non-letters) that name a role.
# A label's role is the average of the one-hot roles its words name, so
# "METHODS AND RESULTS" -> (0, 0.5, 0.5). Derived from every label in
# pubmed_test.jsonl (the table in docs/DATA.md lists each one with its role).
SECTION_KEYWORDS = {
    0: frozenset({  # background: why the study was done
        "BACKGROUND", "INTRODUCTION", "OBJECTIVE", "OBJECTIVES", "PURPOSE", "PURPOSES", "AIM",
        "AIMS", "GOAL", "GOALS", "OBJECT", "CONTEXT", "RATIONALE", "HYPOTHESIS", "HYPOTHESES",
        "IMPORTANCE"}),
    1: frozenset({  # method: how it was done, on whom, what was measured
        "METHOD", "METHODS", "METHODOLOGY", "DESIGN", "SETTING", "SETTINGS", "PATIENT",
        "PATIENTS", "PARTICIPANTS", "SUBJECTS", "PROBANDS", "POPULATION", "SAMPLE", "MATERIAL",
        "MATERIALS", "INTERVENTION", "INTERVENTIONS", "MEASURE", "MEASURES", "MEASUREMENT",
        "MEASUREMENTS", "MEASURED", "OUTCOME", "OUTCOMES", "ENDPOINT", "ENDPOINTS", "VARIABLES",
        "SOURCE", "SOURCES", "EXTRACTION", "SELECTION", "SYNTHESIS", "COLLECTION", "LOCATION",
        "EXPERIMENTAL", "PROCEDURE", "PROCEDURES", "DEFINITION"}),
    2: frozenset({  # result: what was found and what it means
        "RESULT", "RESULTS", "FINDINGS", "CONCLUSION", "CONCLUSIONS", "DISCUSSION",
        "LIMITATIONS", "OBSERVATIONS", "INTERPRETATION", "IMPLICATIONS"}),
}
# Whole labels whose words mislead the keyword rule.
SECTION_OVERRIDES = {
    "END POINT": (0.0, 1.0, 0.0),  # "POINT" alone is no keyword; an end point is a measure
}
UNITS = ("abstract", "paragraph")


def normalize_label(label: str) -> str:
  """Return the label upper-cased with runs of non-letters collapsed to one space."""
  return " ".join(re.findall(r"[A-Z]+", label.upper()))


def section_role(label: Optional[str]) -> tuple[tuple[float, float, float], str]:
  """Map a PubMed section label to a role distribution.

  Args:
    label: the section label, e.g. "MATERIALS AND METHODS"; None when the text
      had no labels.

  Returns:
    (role, source): the (background, method, result) distribution and how it
    was found: "keyword", "override", "unknown" (uniform fallback: no keyword
    in the label) or "unlabelled" (uniform fallback: no label at all).
  """
  if label is None:
    return UNIFORM_ROLE, "unlabelled"
  norm = normalize_label(label)
  if norm in SECTION_OVERRIDES:
    return SECTION_OVERRIDES[norm], "override"
  hits = sorted({r for w in norm.split() for r, kw in SECTION_KEYWORDS.items() if w in kw})
  if not hits:
    return UNIFORM_ROLE, "unknown"
  role = [0.0, 0.0, 0.0]
  for r in hits:
    role[r] = 1.0 / len(hits)
  return tuple(role), "keyword"


def is_evidence_label(label: Optional[str]) -> bool:
  """True when a section label is at least half "result" (the paragraph reports findings)."""
  return section_role(label)[0][2] >= 0.5


@dataclasses.dataclass
class AdapterStats:
  """Counts of how the weak labels were obtained, for the build log and the docs."""
  queries: int = 0
  passages: int = 0
  sentences: int = 0
  sentences_by_source: collections.Counter = dataclasses.field(
      default_factory=collections.Counter)  # keyword / override / unknown / unlabelled
  unknown_labels: collections.Counter = dataclasses.field(
      default_factory=collections.Counter)  # label -> sentences that fell back to uniform


@dataclasses.dataclass(frozen=True)
class _PoolPassage:
  """One gold context of the file, as a candidate for every query."""
  id: str
  title: str
  text: str
  sections: tuple  # ((label or None, paragraph), ...)


class PubMedPool:
  """The file's gold contexts (or their paragraphs) as a BM25-searchable candidate pool."""

  def __init__(self, path: str | os.PathLike, unit: str = "abstract"):
    """Read the file and index every passage of the given unit.

    Args:
      path: a ScholarQABench single-paper task file (e.g. pubmed_test.jsonl).
      unit: "abstract" (a passage is a gold context; the question's own is its gold) or
        "paragraph" (a passage is one paragraph; the question's own evidence paragraphs
        are its gold; module docstring).

    Raises:
      DataError: the file is malformed (from `read_scholarqabench`) or `unit` is unknown.
    """
    if unit not in UNITS:
      raise DataError(f"unknown passage unit {unit!r}; known: {', '.join(UNITS)}")
    self.path = os.fspath(path)
    self.unit = unit
    stem = os.path.splitext(os.path.basename(self.path))[0]
    self.queries = read_scholarqabench(self.path)  # [{"query", "answer", "gold": [...]}]
    self.passages: list[_PoolPassage] = []
    self.gold: list[list[int]] = []  # query index -> pool indices of its gold passages
    self.own: list[list[int]] = []   # query index -> pool indices of all its own passages
    for i, q in enumerate(self.queries):
      gold, own = [], []
      for j, g in enumerate(q["gold"]):
        if unit == "abstract":
          parts = [(f"{stem}:{i}:{j}", g["text"], tuple(g["sections"]), True)]
        else:
          parts = [(f"{stem}:{i}:{j}:{k}", par, ((lab, par),), is_evidence_label(lab))
                   for k, (lab, par) in enumerate(g["sections"])]
        for pid, text, sections, is_gold in parts:
          own.append(len(self.passages))
          if is_gold:
            gold.append(len(self.passages))
          self.passages.append(_PoolPassage(id=pid, title=g["title"], text=text,
                                            sections=sections))
      self.gold.append(gold)
      self.own.append(own)
    self._not_evidence = {i for i, p in enumerate(self.passages)
                          if unit != "paragraph" or not is_evidence_label(p.sections[0][0])}
    self.index = BM25Index([p.text for p in self.passages])
    # Document frequencies for the sentence-rank signal (same tokenizer as BM25).
    df = collections.Counter()
    for p in self.passages:
      df.update(set(bm25_tokenize(p.text)))
    d = len(self.passages)
    self.idf = {t: math.log(1.0 + (d - n + 0.5) / (n + 0.5)) for t, n in df.items()}

  def has_gold(self, qi: int) -> bool:
    """Whether query `qi` has a gold passage in this unit (always, for whole abstracts)."""
    return bool(self.gold[qi])

  def candidates(self, qi: int, num_passages: int, banned: frozenset = frozenset(),
                 evidence_negatives: int = 0) -> list[int]:
    """Return pool indices for query `qi`: its gold passages, its other own passages, then BM25
    negatives, best first.

    Args:
      qi: 0-based query (record) index.
      num_passages: how many candidates to return (fewer only if the pool runs out).
      banned: pool indices never used as negatives (e.g. other splits' own passages).
      evidence_negatives: paragraph unit only: how many of the negatives are the BM25 top
        *evidence* paragraphs of other abstracts (the rest: the BM25 top of all other
        paragraphs); negatives then follow in BM25 order. 0: plain BM25 top, as a first-stage
        retriever gives (the evaluation pools). Training records use > 0 because a 50-passage
        pool is about a third other studies' result paragraphs, and a few BM25 negatives,
        mostly background paragraphs, never show the model one.
    """
    if evidence_negatives and self.unit != "paragraph":
      raise DataError("evidence_negatives needs the paragraph unit")
    gold = self.gold[qi]
    own = gold + [j for j in self.own[qi] if j not in gold]
    if len(own) >= num_passages:
      return own[:num_passages]
    own_texts = {self.passages[g].text for g in own}
    exclude = set(own) | set(banned)
    want = num_passages - len(own)
    if not evidence_negatives:
      return own + self._negatives(qi, want, exclude, own_texts)  # top_k's BM25 order already
    ev = self._negatives(qi, min(evidence_negatives, want), exclude | self._not_evidence,
                         own_texts)
    negs = ev + self._negatives(qi, want - len(ev), exclude | set(ev), own_texts)
    # Two BM25 lists merged: back into one BM25 order (ties -> lower index, as top_k).
    scores = self.index.scores(self.queries[qi]["query"])
    return own + sorted(negs, key=lambda j: (-float(scores[j]), j))

  def bm25_candidates(self, qi: int, num_passages: int, banned: frozenset = frozenset()
                      ) -> list[int]:
    """The BM25 top `num_passages` pool indices for query `qi` outside `banned`, the query's
    own passages included where BM25 puts them (an unlabelled first-stage pool; ties -> lower
    index)."""
    return self.index.top_k(self.queries[qi]["query"], num_passages, exclude=tuple(sorted(banned)))

  def _negatives(self, qi: int, want: int, exclude: set, own_texts: set) -> list[int]:
    """The BM25 top `want` pool indices for query `qi` outside `exclude` whose text is not one
    of its own texts (ties -> lower index)."""
    if want <= 0:
      return []
    k = want
    while True:
      # Ask for more when duplicates of an own text had to be skipped.
      hits = self.index.top_k(self.queries[qi]["query"], k, exclude=tuple(sorted(exclude)))
      negs = [h for h in hits if self.passages[h].text not in own_texts]
      if len(negs) >= want or len(hits) < k:
        return negs[:want]
      k *= 2

  def sentence_scores(self, question: str, sentences: Sequence[str]) -> list[float]:
    """Return the IDF-weighted overlap of each sentence with the question."""
    q = set(bm25_tokenize(question))
    return [math.fsum(self.idf.get(t, 0.0) for t in q & set(bm25_tokenize(s))) for s in sentences]


def _passage_sentences(p: _PoolPassage, stats: AdapterStats) -> list[tuple[str, tuple]]:
  """Split a passage paragraph by paragraph; return (sentence, role) pairs in order."""
  out = []
  for label, paragraph in p.sections:
    role, source = section_role(label)
    for s in split_sentence_texts(paragraph):
      out.append((s, role))
      stats.sentences_by_source[source] += 1
      if source == "unknown":
        stats.unknown_labels[label] += 1
  return out


def _training_passage(pool, pi, qi, question, prank, stats):
  """Pool passage `pi` as candidate `prank` of query `qi`: its sentences ranked by their
  IDF-weighted overlap with the question (`sentence_scores`), with their section roles; counted
  in `stats`."""
  p = pool.passages[pi]
  pairs = _passage_sentences(p, stats)
  if not pairs:
    raise DataError(f"{pool.path}: passage {p.id} (candidate of query {qi}) has no sentences")
  ranks = _ranks_from_scores(pool.sentence_scores(question, [t for t, _ in pairs]))
  stats.passages += 1
  stats.sentences += len(pairs)
  return records_lib.TrainingPassage(
      id=p.id, title=p.title, rank=prank,
      sentences=tuple(records_lib.TrainingSentence(text=t, rank=r, role=role)
                      for (t, role), r in zip(pairs, ranks)))


def _ranks_from_scores(scores: Sequence[float]) -> list[int]:
  """Return 1-based ranks: higher score first, ties by position (stable sort)."""
  order = sorted(range(len(scores)), key=lambda j: -scores[j])
  ranks = [0] * len(scores)
  for r, j in enumerate(order, start=1):
    ranks[j] = r
  return ranks


def build_training_record(pool: PubMedPool, qi: int, num_passages: int, stats: AdapterStats,
                          banned: frozenset = frozenset(),
                          evidence_negatives: int = 0) -> records_lib.TrainingRecord:
  """Build the weakly-labelled training record of query `qi` (see the module docstring)."""
  question = pool.queries[qi]["query"]
  passages = []
  for prank, pi in enumerate(pool.candidates(qi, num_passages, banned, evidence_negatives),
                             start=1):
    passages.append(_training_passage(pool, pi, qi, question, prank, stats))
  stats.queries += 1
  stem = os.path.splitext(os.path.basename(pool.path))[0]
  rec = records_lib.TrainingRecord(id=f"{stem}:{qi}", question=question, passages=tuple(passages))
  # The adapter's output must satisfy the same schema a user's file does.
  records_lib.parse_training_record(rec.to_json(), where=f"{pool.path} query {qi}")
  return rec


def build_teacher_records(pool: PubMedPool, query_indices: Sequence[int], num_passages: int,
                          teacher, banned: frozenset = frozenset(), id_prefix: str = "teacher:"
                          ) -> tuple[list[records_lib.TrainingRecord], list[dict], AdapterStats]:
  """Unlabelled training records for distillation, and their teacher scores.

  A query's passages are its BM25 top `num_passages` pool passages outside `banned`
  (`PubMedPool.bm25_candidates`: no gold is forced in); the teacher scores each passage's text
  (`teacher(question, texts) -> scores`, e.g. a bi-encoder's cosines); passage ranks follow
  the teacher (ties -> BM25 order), so the record's rank-1 passage is the teacher's pick, not a
  gold label (`"labelled": false` in the teacher entry). Sentences, sentence ranks and roles
  follow the adapter's rules (module docstring). Record ids are `id_prefix` + the adapter's id.

  Returns:
    (records, teacher entries {"id", "scores": {passage id: score}, "labelled": False}, stats).
  """
  stats = AdapterStats()
  stem = os.path.splitext(os.path.basename(pool.path))[0]
  recs, entries = [], []
  for qi in query_indices:
    if not 0 <= qi < len(pool.queries):
      raise DataError(f"{pool.path}: query index {qi} out of range [0, {len(pool.queries)})")
    question = pool.queries[qi]["query"]
    cands = pool.bm25_candidates(qi, num_passages, banned)
    scores = [float(x) for x in teacher(question, [pool.passages[j].text for j in cands])]
    order = sorted(range(len(cands)), key=lambda k: (-scores[k], k))
    passages = []
    for prank, k in enumerate(order, start=1):
      passages.append(_training_passage(pool, cands[k], qi, question, prank, stats))
    stats.queries += 1
    rec = records_lib.TrainingRecord(id=f"{id_prefix}{stem}:{qi}", question=question,
                                     passages=tuple(passages))
    records_lib.parse_training_record(rec.to_json(), where=f"{pool.path} query {qi}")
    recs.append(rec)
    entries.append({"id": rec.id, "labelled": False,
                    "scores": {pool.passages[j].id: s for j, s in zip(cands, scores)}})
  return recs, entries, stats


def _check_has_gold(pool: PubMedPool, qi: int) -> None:
  """A query without a gold passage would be a record whose rank-1 passage is not relevant."""
  if not pool.has_gold(qi):
    raise DataError(f"{pool.path}: query {qi} has no gold {pool.unit} (no paragraph labelled as "
                    "a result); pick queries with PubMedPool.has_gold")


def build_training_records(pool: PubMedPool, query_indices: Sequence[int], num_passages: int = 8,
                           banned: frozenset = frozenset(), evidence_negatives: int = 0
                           ) -> tuple[list[records_lib.TrainingRecord], AdapterStats]:
  """Build weakly-labelled training records for the given queries of the pool.

  Args:
    pool: the indexed file.
    query_indices: 0-based record indices of the queries to build, in output order.
    num_passages: passages per query (gold passages first, then the other own passages,
      then BM25 negatives).
    banned: pool indices never used as negatives (e.g. held-out queries' own passages).
    evidence_negatives: paragraph unit: negatives drawn from other abstracts' evidence
      paragraphs (`PubMedPool.candidates`).

  Returns:
    (records, stats).

  Raises:
    DataError: a query index is out of range or has no gold passage, `num_passages` < 1,
      or a chosen passage has no sentences.
  """
  if num_passages < 1:
    raise DataError(f"num_passages must be >= 1, got {num_passages}")
  stats = AdapterStats()
  out = []
  for qi in query_indices:
    if not 0 <= qi < len(pool.queries):
      raise DataError(f"{pool.path}: query index {qi} out of range [0, {len(pool.queries)})")
    _check_has_gold(pool, qi)
    out.append(build_training_record(pool, qi, num_passages, stats, banned, evidence_negatives))
  return out, stats


def build_inference_record(pool: PubMedPool, qi: int, num_passages: int,
                           banned: frozenset = frozenset()) -> tuple[dict, list[str]]:
  """Build an OpenScholar-style query for query `qi` and its relevant passage ids.

  The ctxs are the same candidates as the training record's, but ordered by
  BM25 score alone (a first-stage retriever's order; ties -> lower pool index),
  so the gold context is not trivially first.

  Returns:
    ({"id", "input", "ctxs": [{"id", "title", "text"}]}, [gold passage ids]).
  """
  if not 0 <= qi < len(pool.queries):
    raise DataError(f"{pool.path}: query index {qi} out of range [0, {len(pool.queries)})")
  _check_has_gold(pool, qi)
  cands = pool.candidates(qi, num_passages, banned)
  question = pool.queries[qi]["query"]
  scores = pool.index.scores(question)
  order = sorted(cands, key=lambda j: (-float(scores[j]), j))
  stem = os.path.splitext(os.path.basename(pool.path))[0]
  rec = {"id": f"{stem}:{qi}", "input": question,
         "ctxs": [{"id": pool.passages[j].id, "title": pool.passages[j].title,
                   "text": pool.passages[j].text} for j in order]}
  return rec, [pool.passages[g].id for g in pool.gold[qi] if g in cands]
