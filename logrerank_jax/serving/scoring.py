"""The one path of every rerank route into the engine, and the scores each route reports.

A request's documents are parsed and split into sentences on a worker thread
(`data.inference_input`, as the CLI reads a line), scored by the dynamic batcher
(`engine.batcher`: the engine's bucketed calls shared with concurrent requests) and turned into
the typed result by `results.make_result` (as the CLI and `Reranker.rank`); the routers only
turn that into each ecosystem's JSON.
"""

import asyncio
import math
from typing import Any, Dict, List, Optional, Tuple

from fastapi.concurrency import run_in_threadpool

from logrerank_jax.data.inference_input import parse_inference_record
from logrerank_jax.engine.batcher import Closed, QueueFull
from logrerank_jax.errors import DataError, LogRerankError
from logrerank_jax.results import RankedResults, RecordError, make_result, ranked_results
from logrerank_jax.serving import schemas
from logrerank_jax.serving.http_errors import HttpError
from logrerank_jax.serving.state import ServingState
from logrerank_jax.serving.truncation import cut


def require_ready(state: ServingState) -> None:
  """503 (with Retry-After while warming) unless the model is loaded and compiled."""
  if not state.ready:
    raise HttpError(503, "shutting down" if state.stopping else
                    (f"model failed to load: {state.error}" if state.error else
                     "warming up (loading and compiling the model); retry when /health is 200"),
                    {"Retry-After": "1"} if not state.stopping else None)


async def score(state: ServingState, query: str, docs: List[Dict[str, str]],
                max_tokens: Optional[int] = None) -> Tuple[RankedResults, int, Any]:
  """One query's documents through the engine: (reranked passages, tokens, typed result)."""
  require_ready(state)
  settings = state.settings
  if not docs:
    raise HttpError(422, "documents: empty list (at least one document is needed)")
  if len(docs) > settings.max_documents:
    raise HttpError(422, f"documents: {len(docs)} documents, more than the server's limit of "
                    f"{settings.max_documents} (--max-documents)")
  if max_tokens:
    texts = await run_in_threadpool(cut, state, [d["text"] for d in docs], max_tokens)
    docs = [dict(d, text=t) for d, t in zip(docs, texts)]
  raw = {"query": query, "ctxs": docs}
  try:
    record = await run_in_threadpool(parse_inference_record, raw, "request")
  except DataError as e:
    raise HttpError(422, str(e).replace("request: 'query'", "query")) from None
  result, tokens = await through_batcher(state, record)
  return ranked_results(result, docs), tokens, result


async def through_batcher(state: ServingState, record):
  """A parsed record scored by the dynamic batcher: (typed result, tokens); 429 queue full,
  503 closed, 504 past the timeout, 422 a record the engine cannot score."""
  try:
    fut = state.batcher.submit(record)
  except QueueFull as e:
    raise HttpError(429, f"{e}; retry later", {"Retry-After": str(e.retry_after)}) from None
  except Closed as e:
    raise HttpError(503, str(e)) from None
  timeout_s = state.settings.timeout_s
  try:
    scored = await asyncio.wait_for(asyncio.wrap_future(fut), timeout_s)
  except asyncio.TimeoutError:
    raise HttpError(504, f"no answer within the server's timeout of {timeout_s:g} s "
                    "(--timeout)") from None
  if isinstance(scored.scores, LogRerankError):
    raise HttpError(422, f"the engine cannot score this request: {scored.scores}")
  result = make_result(scored.scores, line=1)
  if isinstance(result, RecordError):
    raise RuntimeError(f"scoring produced an unusable result: {result.error}")
  return result, scored.tokens


def spans(passage, opts: Optional[schemas.RelevantSpansRequest]) -> Optional[List[dict]]:
  """LoG's ranked sentences of one reranked passage as Cohere spans: best first, at or above
  the threshold, at most `max_spans`; None (the field left out, as Cohere does) when none."""
  if opts is None or opts.mode != "enabled":
    return None
  out = [{"start": s.start, "end": s.end, "score": s.score}
         for s in passage.sentences if s.score >= opts.threshold]
  return (out[:opts.max_spans] if opts.max_spans else out) or None


def relevance(passage) -> float:
  """A passage's relevance score: its best sentence's final score; 0 for no usable text."""
  return passage.score if math.isfinite(passage.score) else 0.0


# float32's resolution next to 1: a sigmoid score clipped here before its logit is taken.
_EPS32 = 2.0 ** -24


def raw_logit(state: ServingState, p: float) -> float:
  """LoG's final logit z of a served score p = sigmoid(a z + b) (a = 1, b = 0 uncalibrated;
  `engine.calibration`): what TEI's `raw_scores` asks for."""
  c = min(max(p, _EPS32), 1.0 - _EPS32)
  _, a, b = state.reranker.engine.score_map
  return (math.log(c) - math.log1p(-c) - b) / a
