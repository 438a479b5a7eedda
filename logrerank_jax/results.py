"""Typed reranking results, and the output formats made from them.

Inside the library a reranked query travels as a `RerankResult` (or a `RecordError`), frozen
dataclasses; the JSON that `tools/rerank.py` writes is `result.to_dict()` ("log" format) or
`to_openscholar(raw, result)` (the input written back with its passages reordered). The
notebook API (`Reranker.rank`) returns `RankedResults`, a view of the same result as reranked
passages.

"log" format of one record (`RerankResult.to_dict()`):
    {"line", "id", "query", "error": None, "query_truncated",
     "ranked_sentences": [{"rank", "passage", "sentence", "start", "end", "text",
                           "role_probs": {"background", "method", "result"}, "role",
                           "local_score", "global_score", "score", "truncated"}, ...],
     "passage_ranking": [passage index, ...],
     "passages": [{"index", "id", "title", "num_sentences", "num_windows",
                   "truncated_sentences", "empty_sentences"}, ...],
     "context": [{"passage", "sentence", "text", "score", "role",
                  "predecessor", "successor", "similar"}, ...],
     "graph": {"nodes": [{"id", "passage", "sentence", "text", "role", "local_score",
                          "global_score", "score", "rank", "unit"}, ...],
               "edges": [{"source", "target", "kind", "type", "type_name"}, ...]}}
and of a record that cannot be processed (`RecordError.to_dict()`):
    {"line", "id", "query", "error": "<one line>"}.
`passage`/`sentence` are indices into the input's passage list and the passage's sentences;
`text == passage_text[start:end]`; `score` is the final score used for ranking (the global
one, or the local one for a model without a global stage, whose `global_score` is None).
Sentences are ranked by decreasing score, ties by passage order; `passage_ranking` lists
passages by their best sentence (`logrerank_jax.ranking`), then passages without sentences,
so every input passage appears exactly once. A passage whose text was unusable (NaN, null,
a number, empty) is kept, unranked, at the end, with its reason in `passages[i]["skipped"]`.
Context units of the flat-list ablation have no predecessor/successor/similar fields.

`graph` is the sentence graph of the context units (`SentenceGraph`), what an explanation page
draws: its nodes are the units' sentences and their expansions, each once, grouped by passage
(passages in `passage_ranking` order, sentences in text order), with the sentence's role,
scores and `rank` (in `ranked_sentences`); `unit` is the index of the context unit the node
heads, None for a node that is only an expansion. Its edges are the links the units were
expanded along: `kind` "adjacency" (predecessor -> sentence -> successor, source -> target in
text order) or "similarity" (unit sentence -- similar sentence, two-way in the model, listed
once); `source`/`target` are node ids (positions in `nodes`). `type` is the edge type by the
rule of `graph/build.py` (`schema.adjacency_edge_type` of the two argmax roles, 0..6; 7 for
similarity) and `type_name` its name (`schema.EDGE_TYPE_NAMES`); a model trained "w/o edge
types" gave every edge type 0 instead. Flat-list units give nodes and no edges.
"""

import dataclasses
import functools
import math
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from logrerank_jax.errors import DataError
from logrerank_jax.ranking import passage_order, run_file_passage_scores, sentence_order
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


def to_openscholar(raw: Any, result: Result) -> dict:
  """Write an input record back with its passages reordered (OpenScholar generation input).

  Every input field is kept; the passage list (`ctxs` or `passages`, whichever the input used)
  is reordered by `passage_ranking`, each passage object unchanged. Added keys:
  `log_passage_order` (original indices, best first) and `log_context` (the context units: their
  `passage` is the ORIGINAL index, and `ctx_position` the unit's position in the reordered
  list written here). A failed record is written back unchanged with an `error` field (a line
  that was not a JSON object becomes {"error", "line"}).

  Args:
    raw: the parsed input object.
    result: its `RerankResult` / `RecordError` (or their `to_dict()`).

  Returns:
    The output object.
  """
  res = result.to_dict() if hasattr(result, "to_dict") else result
  if res.get("error") is not None:
    if isinstance(raw, dict):
      return {**raw, "error": res["error"]}
    return {"error": res["error"], "line": res.get("line")}
  out = dict(raw)
  pkey = "ctxs" if "ctxs" in raw else "passages"
  out[pkey] = [raw[pkey][p] for p in res["passage_ranking"]]
  out["log_passage_order"] = list(res["passage_ranking"])
  position = {p: i for i, p in enumerate(res["passage_ranking"])}
  out["log_context"] = [dict(u, ctx_position=position[u["passage"]]) for u in res["context"]]
  return out


# ------------------------------------------------------------------------ from scores

@dataclasses.dataclass
class QueryScores:
  """Host-side scores of one query: per node arrays in passage order, plus its context units."""
  record: Any                 # the `data.inference_input.InferenceRecord` scored
  node_passage: np.ndarray    # int32 [n]
  node_sentence: np.ndarray   # int32 [n]
  local_score: np.ndarray     # float32 [n]
  global_score: Optional[np.ndarray]  # float32 [n]; None without a global stage
  final_score: np.ndarray     # float32 [n]
  role_probs: np.ndarray      # float32 [n, 3]
  context: list               # build_context units (node indices)
  passage_info: list          # per passage: (num_windows, truncated sentences, empty sentences)
  query_truncated: bool = False  # the query was cut at `max_query_tokens`

  def passage_scores(self, which: str = "final") -> np.ndarray:
    """Best sentence score per passage ([P], `ranking.passage_scores`); passages without
    sentences get -1, below any sigmoid score (finite, so run files can hold it)."""
    scores = {"final": self.final_score, "local": self.local_score}[which]
    return run_file_passage_scores(self.node_passage, scores, len(self.record.passages))


def make_result(res: QueryScores, line: Optional[int] = None) -> Result:
  """Turn one query's scores into its typed result (or a `RecordError` on a non-finite score)."""
  rec = res.record

  def ref(n) -> Optional[SentenceRef]:
    if n is None:
      return None
    p, s = int(res.node_passage[n]), int(res.node_sentence[n])
    return SentenceRef(p, s, rec.passages[p].sentences[s].text)

  try:
    ranked = []
    for rank, n in enumerate(sentence_order(res.final_score), start=1):
      p, s = int(res.node_passage[n]), int(res.node_sentence[n])
      sent = rec.passages[p].sentences[s]
      ranked.append(RankedSentence(
          rank=rank, passage=p, sentence=s, start=sent.start, end=sent.end, text=sent.text,
          role_probs=tuple(finite(v) for v in res.role_probs[n]),
          local_score=finite(res.local_score[n]),
          global_score=None if res.global_score is None else finite(res.global_score[n]),
          score=finite(res.final_score[n]), truncated=s in res.passage_info[p][1]))
    context = []
    for unit in res.context:
      expanded = "similar" in unit
      context.append(ContextUnit(
          sentence=ref(unit["node"]), score=finite(unit["score"]),
          role=None if unit["role"] is None else ROLE_NAMES[unit["role"]],
          predecessor=ref(unit.get("predecessor")), successor=ref(unit.get("successor")),
          similar=tuple(ref(v) for v in unit["similar"]) if expanded else None))
  except DataError as e:
    return record_error(rec.raw, str(e), line)
  # A passage scores as its best sentence; passages without sentences come last.
  passage_ranking = passage_order(res.passage_scores("final"))
  passages = tuple(PassageInfo(index=p, id=ps.passage_id, title=ps.title,
                               num_sentences=len(ps.sentences), num_windows=res.passage_info[p][0],
                               truncated_sentences=tuple(res.passage_info[p][1]),
                               empty_sentences=tuple(res.passage_info[p][2]),
                               skipped=ps.skipped)
                   for p, ps in enumerate(rec.passages))
  result = RerankResult(line=line, id=rec.record_id, query=rec.query,
                        query_truncated=res.query_truncated, ranked_sentences=tuple(ranked),
                        passage_ranking=tuple(passage_ranking), passages=passages,
                        context=tuple(context))
  try:
    result.graph  # pylint: disable=pointless-statement  (built now: a bad unit is this record's error)
  except DataError as e:
    return record_error(rec.raw, str(e), line)
  return result


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
