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

from logrerank_jax.results.formats import to_openscholar
from logrerank_jax.results.scores import QueryScores, make_result
from logrerank_jax.results.typed import (ContextUnit, GraphEdge, GraphNode, PassageInfo,
                                         RankedPassage, RankedResults, RankedSentence,
                                         RecordError, RerankResult, Result, SentenceGraph,
                                         SentenceRef, context_graph, finite, ranked_results,
                                         record_error)

__all__ = ["ContextUnit", "GraphEdge", "GraphNode", "PassageInfo", "QueryScores", "RankedPassage",
           "RankedResults", "RankedSentence", "RecordError", "RerankResult", "Result",
           "SentenceGraph", "SentenceRef", "context_graph", "finite", "make_result",
           "ranked_results", "record_error", "to_openscholar"]
