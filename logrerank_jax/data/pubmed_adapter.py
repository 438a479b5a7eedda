"""Weakly-labelled training records from ScholarQABench's PubMedQA file (`pubmed_test.jsonl`).

PubMedQA has no sentence labels, so every label here is *weak* and derived by a
fixed, documented rule (see `docs/DATA.md`, "PubMedQA adapter"):

  * Passage pool: the gold contexts of every record of the file, in file
    order. Gold context j of record i (0-based, blank lines skipped) has id
    "<file stem>:<i>:<j>"; the query's id is "<file stem>:<i>".
  * Passages of query i: its own gold context(s) (rank 1..G, in file order),
    then the BM25 top (P - G) other pool passages for the question (ranks
    G+1..P, in BM25 order; ties -> lower pool index; passages whose text equals
    a gold text are excluded, so a duplicate is never labelled a negative).
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

Everything is deterministic: no randomness, stable sorts only.
"""

import collections
import dataclasses
import math
import os
import re
from typing import Optional, Sequence

from logrerank_jax.data import records as records_lib
from logrerank_jax.data.bm25 import BM25Index
from logrerank_jax.data.bm25 import bm25_tokenize
from logrerank_jax.data.scholarqabench import read_scholarqabench
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
  """The file's gold contexts as a BM25-searchable candidate pool."""

  def __init__(self, path: str | os.PathLike):
    """Read the file and index every gold context.

    Args:
      path: a ScholarQABench single-paper task file (e.g. pubmed_test.jsonl).

    Raises:
      DataError: the file is malformed (from `read_scholarqabench`).
    """
    self.path = os.fspath(path)
    stem = os.path.splitext(os.path.basename(self.path))[0]
    self.queries = read_scholarqabench(self.path)  # [{"query", "answer", "gold": [...]}]
    self.passages: list[_PoolPassage] = []
    self.gold: list[list[int]] = []  # query index -> pool indices of its gold contexts
    for i, q in enumerate(self.queries):
      idx = []
      for j, g in enumerate(q["gold"]):
        idx.append(len(self.passages))
        self.passages.append(_PoolPassage(
            id=f"{stem}:{i}:{j}", title=g["title"], text=g["text"],
            sections=tuple((lab, par) for lab, par in g["sections"])))
      self.gold.append(idx)
    self.index = BM25Index([p.text for p in self.passages])
    # Document frequencies for the sentence-rank signal (same tokenizer as BM25).
    df = collections.Counter()
    for p in self.passages:
      df.update(set(bm25_tokenize(p.text)))
    d = len(self.passages)
    self.idf = {t: math.log(1.0 + (d - n + 0.5) / (n + 0.5)) for t, n in df.items()}

  def candidates(self, qi: int, num_passages: int, banned: frozenset = frozenset()) -> list[int]:
    """Return pool indices for query `qi`: its gold contexts, then BM25 negatives, best first.

    Args:
      qi: 0-based query (record) index.
      num_passages: how many candidates to return (fewer only if the pool runs out).
      banned: pool indices never used as negatives (e.g. other splits' gold contexts).
    """
    gold = self.gold[qi]
    if len(gold) >= num_passages:
      return gold[:num_passages]
    gold_texts = {self.passages[g].text for g in gold}
    exclude = set(gold) | (set(banned) - set(gold))
    out = list(gold)
    want = num_passages - len(gold)
    k = want
    while True:
      # Ask for more when duplicates of a gold text had to be skipped.
      hits = self.index.top_k(self.queries[qi]["query"], k, exclude=tuple(sorted(exclude)))
      negs = [h for h in hits if self.passages[h].text not in gold_texts]
      if len(negs) >= want or len(hits) < k:
        return out + negs[:want]
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


def _ranks_from_scores(scores: Sequence[float]) -> list[int]:
  """Return 1-based ranks: higher score first, ties by position (stable sort)."""
  order = sorted(range(len(scores)), key=lambda j: -scores[j])
  ranks = [0] * len(scores)
  for r, j in enumerate(order, start=1):
    ranks[j] = r
  return ranks


def build_training_record(pool: PubMedPool, qi: int, num_passages: int, stats: AdapterStats,
                          banned: frozenset = frozenset()) -> records_lib.TrainingRecord:
  """Build the weakly-labelled training record of query `qi` (see the module docstring)."""
  question = pool.queries[qi]["query"]
  passages = []
  for prank, pi in enumerate(pool.candidates(qi, num_passages, banned), start=1):
    p = pool.passages[pi]
    pairs = _passage_sentences(p, stats)
    if not pairs:
      raise DataError(f"{pool.path}: passage {p.id} (candidate of query {qi}) has no sentences")
    ranks = _ranks_from_scores(pool.sentence_scores(question, [s for s, _ in pairs]))
    passages.append(records_lib.TrainingPassage(
        id=p.id, title=p.title, rank=prank,
        sentences=tuple(records_lib.TrainingSentence(text=s, rank=r, role=role)
                        for (s, role), r in zip(pairs, ranks))))
    stats.passages += 1
    stats.sentences += len(pairs)
  stats.queries += 1
  stem = os.path.splitext(os.path.basename(pool.path))[0]
  rec = records_lib.TrainingRecord(id=f"{stem}:{qi}", question=question, passages=tuple(passages))
  # The adapter's output must satisfy the same schema a user's file does.
  records_lib.parse_training_record(rec.to_json(), where=f"{pool.path} query {qi}")
  return rec


def build_training_records(pool: PubMedPool, query_indices: Sequence[int], num_passages: int = 8,
                           banned: frozenset = frozenset()
                           ) -> tuple[list[records_lib.TrainingRecord], AdapterStats]:
  """Build weakly-labelled training records for the given queries of the pool.

  Args:
    pool: the indexed file.
    query_indices: 0-based record indices of the queries to build, in output order.
    num_passages: passages per query (gold contexts first, then BM25 negatives).
    banned: pool indices never used as negatives (e.g. held-out queries' gold contexts).

  Returns:
    (records, stats).

  Raises:
    DataError: a query index is out of range, `num_passages` < 1, or a chosen
      passage has no sentences.
  """
  if num_passages < 1:
    raise DataError(f"num_passages must be >= 1, got {num_passages}")
  stats = AdapterStats()
  out = []
  for qi in query_indices:
    if not 0 <= qi < len(pool.queries):
      raise DataError(f"{pool.path}: query index {qi} out of range [0, {len(pool.queries)})")
    out.append(build_training_record(pool, qi, num_passages, stats, banned))
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
  cands = pool.candidates(qi, num_passages, banned)
  question = pool.queries[qi]["query"]
  scores = pool.index.scores(question)
  order = sorted(cands, key=lambda j: (-float(scores[j]), j))
  stem = os.path.splitext(os.path.basename(pool.path))[0]
  rec = {"id": f"{stem}:{qi}", "input": question,
         "ctxs": [{"id": pool.passages[j].id, "title": pool.passages[j].title,
                   "text": pool.passages[j].text} for j in order]}
  return rec, [pool.passages[g].id for g in pool.gold[qi] if g in cands]
