"""The typed results: what one reranked query is inside the library, and its notebook view.

A reranked query is a `RerankResult` (its `RankedSentence`s, `PassageInfo`s, `ContextUnit`s of
`SentenceRef`s, and the derived `SentenceGraph` of those units), or a `RecordError`; every one
turns into its "log" format with `to_dict()` (the format is described in `logrerank_jax.results`).
`RankedResults` / `RankedPassage` view a `RerankResult` as reranked passages (`Reranker.rank`).
"""

import dataclasses
import functools
import math
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from logrerank_jax.errors import DataError
from logrerank_jax.schema import (EDGE_TYPE_NAMES, ROLE_NAMES, SIMILARITY_EDGE_TYPE,
                                  adjacency_edge_type)


def finite(x: float) -> float:
  """Return `x` as float, raising DataError on NaN/Inf (JSON cannot hold them honestly)."""
  x = float(x)
  if not math.isfinite(x):
    raise DataError(f"model produced a non-finite score ({x})")
  return x


@dataclasses.dataclass(frozen=True)
class SentenceRef:
  """A sentence named by its passage and sentence index, with its text."""
  passage: int
  sentence: int
  text: str

  def to_dict(self) -> Dict[str, Any]:
    return {"passage": self.passage, "sentence": self.sentence, "text": self.text}


@dataclasses.dataclass(frozen=True)
class RankedSentence:
  """One scored sentence, in ranked order."""
  rank: int                       # 1 = best
  passage: int                    # index into the input passages
  sentence: int                   # index into that passage's sentences
  start: int                      # character offsets into the passage text
  end: int
  text: str
  role_probs: Tuple[float, ...]   # in `schema.ROLE_NAMES` order
  local_score: float
  global_score: Optional[float]   # None without a global stage
  score: float                    # the final score the ranking uses
  truncated: bool                 # the sentence was cut to fit the row

  @property
  def role(self) -> str:
    """Argmax role name (ties to the lower index, as the graph builder)."""
    return ROLE_NAMES[max(range(len(self.role_probs)), key=lambda i: (self.role_probs[i], -i))]

  def to_dict(self) -> Dict[str, Any]:
    return {"rank": self.rank, "passage": self.passage, "sentence": self.sentence,
            "start": self.start, "end": self.end, "text": self.text,
            "role_probs": dict(zip(ROLE_NAMES, self.role_probs)), "role": self.role,
            "local_score": self.local_score, "global_score": self.global_score,
            "score": self.score, "truncated": self.truncated}


@dataclasses.dataclass(frozen=True)
class PassageInfo:
  """What became of one input passage."""
  index: int
  id: Optional[str]
  title: str
  num_sentences: int
  num_windows: int                        # sequences its sentences were packed into
  truncated_sentences: Tuple[int, ...]    # sentences cut to fit a row
  empty_sentences: Tuple[int, ...]        # sentences with no tokens
  skipped: Optional[str] = None           # why it was not scored (unusable text), else None

  def to_dict(self) -> Dict[str, Any]:
    return {"index": self.index, "id": self.id, "title": self.title,
            "num_sentences": self.num_sentences, "num_windows": self.num_windows,
            "truncated_sentences": list(self.truncated_sentences),
            "empty_sentences": list(self.empty_sentences), "skipped": self.skipped}


@dataclasses.dataclass(frozen=True)
class ContextUnit:
  """One structured context unit (eq 17-18): a top sentence and its expansions."""
  sentence: SentenceRef
  score: float
  role: Optional[str]
  predecessor: Optional[SentenceRef] = None      # in-passage neighbours (adjacency edges)
  successor: Optional[SentenceRef] = None
  similar: Optional[Tuple[SentenceRef, ...]] = None  # None: a flat-list unit (no expansion)

  def to_dict(self) -> Dict[str, Any]:
    out = self.sentence.to_dict()
    out["score"], out["role"] = self.score, self.role
    if self.similar is not None:
      ref = lambda r: None if r is None else r.to_dict()  # noqa: E731
      out["predecessor"], out["successor"] = ref(self.predecessor), ref(self.successor)
      out["similar"] = [r.to_dict() for r in self.similar]
    return out


@dataclasses.dataclass(frozen=True)
class GraphNode:
  """One sentence of the context units' graph."""
  id: int                         # its position in `SentenceGraph.nodes`
  passage: int
  sentence: int
  text: str
  role: str                       # argmax role (ties to the lower index)
  local_score: float
  global_score: Optional[float]   # None without a global stage
  score: float
  rank: int                       # its rank among all the query's sentences (1 = best)
  unit: Optional[int]             # the context unit it heads; None: only an expansion

  def to_dict(self) -> Dict[str, Any]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class GraphEdge:
  """One link a context unit was expanded along."""
  source: int      # node ids
  target: int
  kind: str        # "adjacency" (source -> target in text order) or "similarity" (two-way)
  type: int        # edge type (schema: 0..6 adjacency by roles, 7 similarity)

  @property
  def type_name(self) -> str:
    return EDGE_TYPE_NAMES[self.type]

  def to_dict(self) -> Dict[str, Any]:
    return {"source": self.source, "target": self.target, "kind": self.kind,
            "type": self.type, "type_name": self.type_name}


@dataclasses.dataclass(frozen=True)
class SentenceGraph:
  """The sentence graph of a query's context units (see the module docstring)."""
  nodes: Tuple[GraphNode, ...]
  edges: Tuple[GraphEdge, ...]

  def to_dict(self) -> Dict[str, Any]:
    return {"nodes": [n.to_dict() for n in self.nodes], "edges": [e.to_dict() for e in self.edges]}


def context_graph(context: Sequence[ContextUnit], ranked: Sequence[RankedSentence],
                  passage_ranking: Sequence[int]) -> SentenceGraph:
  """Build the sentence graph of the context units: their sentences and expansion links.

  Args:
    context: the context units, in generator order.
    ranked: every ranked sentence of the query (the nodes' roles and scores come from here).
    passage_ranking: passage indices, best first (the node groups' order).

  Returns:
    The `SentenceGraph`.

  Raises:
    DataError: a unit names a sentence that is not among the ranked ones.
  """
  by_key = {(s.passage, s.sentence): s for s in ranked}

  def key(ref: SentenceRef) -> Tuple[int, int]:
    k = (ref.passage, ref.sentence)
    if k not in by_key:
      raise DataError(f"context unit names passage {ref.passage} sentence {ref.sentence}, "
                      "which is not a ranked sentence")
    return k

  heads: Dict[Tuple[int, int], int] = {}
  links: List[Tuple[str, Tuple[int, int], Tuple[int, int]]] = []  # (kind, source, target)
  for i, unit in enumerate(context):
    n = key(unit.sentence)
    heads.setdefault(n, i)
    if unit.predecessor is not None:
      links.append(("adjacency", key(unit.predecessor), n))
    if unit.successor is not None:
      links.append(("adjacency", n, key(unit.successor)))
    links.extend(("similarity", n, key(v)) for v in unit.similar or ())
  members = set(heads) | {k for _, a, b in links for k in (a, b)}
  position = {p: i for i, p in enumerate(passage_ranking)}
  order = sorted(members, key=lambda k: (position.get(k[0], len(position)), k))
  ids = {k: i for i, k in enumerate(order)}
  nodes = tuple(GraphNode(id=ids[k], passage=k[0], sentence=k[1], text=by_key[k].text,
                          role=by_key[k].role, local_score=by_key[k].local_score,
                          global_score=by_key[k].global_score, score=by_key[k].score,
                          rank=by_key[k].rank, unit=heads.get(k))
                  for k in order)
  edges, seen = [], set()
  for kind, a, b in links:
    # An adjacency link has a direction (text order); a similarity link is two-way.
    ident = (kind, a, b) if kind == "adjacency" else (kind, frozenset((a, b)))
    if ident in seen:
      continue
    seen.add(ident)
    if kind == "adjacency":
      etype = int(adjacency_edge_type(ROLE_NAMES.index(by_key[a].role),
                                      ROLE_NAMES.index(by_key[b].role)))
    else:
      etype = SIMILARITY_EDGE_TYPE
    edges.append(GraphEdge(source=ids[a], target=ids[b], kind=kind, type=etype))
  return SentenceGraph(nodes=nodes, edges=tuple(edges))


@dataclasses.dataclass(frozen=True)
class RerankResult:
  """One reranked query."""
  line: Optional[int]
  id: Optional[str]
  query: str
  query_truncated: bool
  ranked_sentences: Tuple[RankedSentence, ...]
  passage_ranking: Tuple[int, ...]     # input passage indices, best first
  passages: Tuple[PassageInfo, ...]    # in input order
  context: Tuple[ContextUnit, ...]
  error = None                         # the field every output record has

  @property
  def skipped(self) -> List[Tuple[int, str]]:
    """(passage index, reason) of the passages that could not be scored."""
    return [(p.index, p.skipped) for p in self.passages if p.skipped is not None]

  @functools.cached_property
  def graph(self) -> SentenceGraph:
    """The sentence graph of the context units (derived, so it always agrees with them)."""
    return context_graph(self.context, self.ranked_sentences, self.passage_ranking)

  def to_dict(self) -> Dict[str, Any]:
    return {"line": self.line, "id": self.id, "query": self.query, "error": None,
            "query_truncated": self.query_truncated,
            "ranked_sentences": [s.to_dict() for s in self.ranked_sentences],
            "passage_ranking": list(self.passage_ranking),
            "passages": [p.to_dict() for p in self.passages],
            "context": [u.to_dict() for u in self.context],
            "graph": self.graph.to_dict()}


@dataclasses.dataclass(frozen=True)
class RecordError:
  """A record that could not be processed, with its one-line reason."""
  line: Optional[int]
  id: Optional[str]
  query: Optional[str]
  error: str

  def to_dict(self) -> Dict[str, Any]:
    return {"line": self.line, "id": self.id, "query": self.query, "error": self.error}


Result = Union[RerankResult, RecordError]


def record_error(raw: Any, message: str, line: Optional[int] = None) -> RecordError:
  """The result of a record that could not be processed (id and query echoed when usable)."""
  rid = query = None
  if isinstance(raw, dict):
    rid = raw.get("id") if isinstance(raw.get("id"), (str, int)) else None
    rid = None if rid is None or isinstance(rid, bool) else str(rid)
    q = raw.get("input", raw.get("question"))
    query = q if isinstance(q, str) else None
  return RecordError(line=line, id=rid, query=query, error=str(message))


# ------------------------------------------------------------------------ the notebook view

@dataclasses.dataclass(frozen=True)
class RankedPassage:
  """One passage in reranked order (`Reranker.rank`)."""
  rank: int                                 # 1 = best
  index: int                                # index into the `passages` given to `rank`
  score: float                              # its best sentence's score
  text: str
  title: str
  sentences: Tuple[RankedSentence, ...]     # its sentences, best first


@dataclasses.dataclass(frozen=True)
class RankedResults(Sequence):
  """`Reranker.rank`'s answer: reranked passages (a sequence, best first) plus the structured
  context of the whole query. Like sentence-transformers' `CrossEncoder.rank` (each entry
  carries its input index and score) and the `rerankers` library's `RankedResults`."""
  query: str
  results: Tuple[RankedPassage, ...]
  context: Tuple[ContextUnit, ...]
  query_truncated: bool

  def __getitem__(self, i):
    return self.results[i]

  def __len__(self) -> int:
    return len(self.results)

  def __iter__(self) -> Iterator[RankedPassage]:
    return iter(self.results)

  def top_k(self, k: int) -> List[RankedPassage]:
    """The k best passages."""
    return list(self.results[:k])


def ranked_results(result: RerankResult, passages: Sequence[Mapping[str, str]],
                   top_k: Optional[int] = None) -> RankedResults:
  """View a `RerankResult` as reranked passages (sentences grouped under their passage)."""
  by_passage: Dict[int, List[RankedSentence]] = {}
  for s in result.ranked_sentences:
    by_passage.setdefault(s.passage, []).append(s)
  order = list(result.passage_ranking)[:top_k] if top_k is not None else result.passage_ranking
  out = []
  for rank, p in enumerate(order, start=1):
    sents = tuple(by_passage.get(p, ()))
    out.append(RankedPassage(rank=rank, index=p, score=sents[0].score if sents else -math.inf,
                             text=passages[p]["text"], title=passages[p].get("title", ""),
                             sentences=sents))
  return RankedResults(query=result.query, results=tuple(out), context=result.context,
                       query_truncated=result.query_truncated)
