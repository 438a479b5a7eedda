"""LoG's evidence for one query's documents, from a running server or an in-process `Reranker`;
the framework-free half of the LangChain and LlamaIndex classes (no framework imported here).

Both sources give the same "log" record (`logrerank_jax.results`): the server's
`POST /log/rerank` answers what `Reranker.rerank_records` returns in process. `rerank` turns it
into the kept documents, best first, each with the metadata both framework classes attach:

    log_score      the document's LoG score (its best sentence's final score; None: no usable text)
    log_rank       1 = best
    log_index      its position in the documents given
    log_sentences  its relevant sentences, best first: {"text", "start", "end", "score", "rank",
                   "role"}; `text == document_text[start:end]` (Python string offsets)
    log_context    the structured context units headed by one of its sentences: the "log"
                   record's unit ({"passage", "sentence", "text", "score", "role" and, unless a
                   flat-list model, "predecessor", "successor", "similar"}) plus "unit", its
                   position in the query's context; `passage` indices are `log_index` values
"""

import dataclasses
from typing import Any, Dict, List, Optional, Sequence

# The one "log" route of the server (serving/routers/log.py).
LOG_ROUTE = "/log/rerank"


class LogEvidenceError(RuntimeError):
  """A server that did not answer with a "log" record, or a record with an error."""


@dataclasses.dataclass(frozen=True)
class Kept:
  """One kept document: its position in the input and the metadata to attach to it."""
  index: int
  score: Optional[float]
  metadata: Dict[str, Any]


def check_source(base_url: Optional[str], reranker: Any) -> None:
  """Exactly one source: a one-line ValueError naming the keys otherwise."""
  if (base_url is None) == (reranker is None):
    raise ValueError("give exactly one of base_url= (a running `logrerank serve`) or "
                     f"reranker= (an in-process logrerank_jax.Reranker); got "
                     f"{'both' if base_url is not None else 'neither'}")


def check_options(top_n: Optional[int], min_sentence_score: float,
                  max_sentences: Optional[int]) -> None:
  """One-line ValueErrors naming the option."""
  if top_n is not None and top_n < 1:
    raise ValueError(f"top_n: must be at least 1 or None (all documents), got {top_n}")
  if not 0.0 <= min_sentence_score <= 1.0:
    raise ValueError(f"min_sentence_score: must be in [0, 1], got {min_sentence_score}")
  if max_sentences is not None and max_sentences < 1:
    raise ValueError(f"max_sentences: must be at least 1 or None (all), got {max_sentences}")


def server_record(base_url: str, api_key: Optional[str], query: str, texts: Sequence[str],
                  timeout: float) -> Dict[str, Any]:
  """The server's "log" record of `query` over `texts` (POST /log/rerank)."""
  import httpx  # pylint: disable=g-import-not-at-top  (both extras install it)
  url = base_url.rstrip("/") + LOG_ROUTE
  headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
  body = {"query": query, "ctxs": [{"text": t} for t in texts]}
  try:
    r = httpx.post(url, json=body, headers=headers, timeout=timeout)
  except httpx.HTTPError as e:
    raise LogEvidenceError(f"{url}: {type(e).__name__}: {e}") from None
  if r.status_code != 200:
    try:
      message = r.json().get("message", r.text)
    except ValueError:
      message = r.text
    raise LogEvidenceError(f"{url}: HTTP {r.status_code}: {message}")
  return r.json()


def reranker_record(reranker: Any, query: str, texts: Sequence[str]) -> Dict[str, Any]:
  """The in-process `Reranker`'s "log" record: the same record the server answers."""
  return reranker.rerank_records([{"query": query, "ctxs": [{"text": t} for t in texts]}])[0]


def rerank(record: Dict[str, Any], n_texts: int, top_n: Optional[int],
           min_sentence_score: float, max_sentences: Optional[int]) -> List[Kept]:
  """The kept documents of one "log" record, best first (see the module docstring)."""
  if record.get("error"):
    raise LogEvidenceError(f"LoG could not rerank these documents: {record['error']}")
  order = record["passage_ranking"]
  if sorted(order) != list(range(n_texts)):
    raise LogEvidenceError(f"the record ranks passages {order}, not the {n_texts} documents sent")
  by_passage: Dict[int, List[dict]] = {}
  for s in record["ranked_sentences"]:  # best first
    by_passage.setdefault(s["passage"], []).append(s)
  units: Dict[int, List[dict]] = {}
  for i, unit in enumerate(record["context"]):
    units.setdefault(unit["passage"], []).append(dict(unit, unit=i))
  kept = []
  for rank, p in enumerate(order[:top_n] if top_n else order, start=1):
    ranked = by_passage.get(p, [])
    score = ranked[0]["score"] if ranked else None
    sentences = [{k: s[k] for k in ("text", "start", "end", "score", "rank", "role")}
                 for s in ranked if s["score"] >= min_sentence_score]
    kept.append(Kept(index=p, score=score, metadata={
        "log_score": score, "log_rank": rank, "log_index": p,
        "log_sentences": sentences[:max_sentences] if max_sentences else sentences,
        "log_context": units.get(p, [])}))
  return kept


def evidence(query: str, texts: Sequence[str], *, base_url: Optional[str] = None,
             api_key: Optional[str] = None, reranker: Any = None, top_n: Optional[int] = None,
             min_sentence_score: float = 0.1, max_sentences: Optional[int] = None,
             timeout: float = 120.0) -> List[Kept]:
  """Rerank `texts` for `query` with LoG (a server at `base_url`, or `reranker` in process) and
  return the kept documents with their evidence metadata, best first."""
  check_source(base_url, reranker)
  check_options(top_n, min_sentence_score, max_sentences)
  if not texts:
    return []
  record = (server_record(base_url, api_key, query, texts, timeout) if base_url is not None
            else reranker_record(reranker, query, texts))
  return rerank(record, len(texts), top_n, min_sentence_score, max_sentences)


def evidence_with(options: Any, query: str, texts: Sequence[str]) -> List[Kept]:
  """`evidence` with the settings of a framework class's fields (`base_url`, `api_key` as a
  pydantic `SecretStr` or None, `reranker`, `top_n`, `min_sentence_score`, `max_sentences`,
  `timeout`): the LangChain compressor and the LlamaIndex postprocessor share them."""
  api_key = options.api_key.get_secret_value() if options.api_key else None
  return evidence(query, texts, base_url=options.base_url, api_key=api_key,
                  reranker=options.reranker, top_n=options.top_n,
                  min_sentence_score=options.min_sentence_score,
                  max_sentences=options.max_sentences, timeout=options.timeout)
