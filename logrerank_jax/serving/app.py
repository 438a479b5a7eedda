"""The HTTP app of `tools/serve.py`: LoG where RAG pipelines call rerankers.

Routes (field names of each ecosystem, `serving.schemas`):
  POST /v2/rerank   Cohere v2, with `relevant_spans` (LoG's ranked sentences of each document)
  POST /v1/rerank   Jina / vLLM (also takes `relevant_spans`)
  POST /rerank      TEI (`texts`) or Jina / vLLM (`documents`), told apart by the body
  POST /log/rerank  one OpenScholar record -> the "log" record `tools/rerank.py` writes for it
  GET  /            the explanation page (`logrerank_jax.explain.form_page`): paste a question
                    and passages or pick a shipped demo pool; the `/log/rerank` answer is drawn
                    by the same renderer as `tools/rerank.py --html`
  GET  /health      503 while the model loads and compiles (and while stopping), then 200
  GET  /info        model folder, backbone, buckets, devices, limits, version
  GET  /metrics     Prometheus text: requests by route and status, latency, batch sizes, queue
                    depth, tokens, XLA compilations
  GET  /docs        OpenAPI docs (FastAPI)

Every request goes through the one engine: parsed and split into sentences on a worker thread
(`data.inference_input`, as the CLI reads a line), scored by the dynamic batcher
(`serving.batcher`: the engine's bucketed calls shared with concurrent requests), turned into
the typed result by `results.make_result` (as the CLI and `Reranker.rank`), and only then into
each ecosystem's JSON. A document's `relevance_score` is LoG's passage score, its best
sentence's final score (in [0, 1]); a document with no usable text (empty) is kept, ranked last,
with score 0.

Status codes: 400 malformed JSON; 413 body over `max_body_bytes`; 422 a missing, mistyped or
out-of-range field, too many documents, or a record the engine cannot score (the message names
the field or reason); 429 queue full (with Retry-After); 503 warming up or shutting down; 504
the request's `timeout` passed before its answer; 500 an internal fault only (logged with its
request id, which every response carries in `x-request-id`). Each request gets one access-log
line.
"""

import asyncio
import copy
import dataclasses
import logging
import math
import threading
import time
import traceback
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

from fastapi import Body, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.requests import ClientDisconnect
from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               generate_latest)

from logrerank_jax import explain
from logrerank_jax.data.inference_input import parse_inference_record
from logrerank_jax.data.pool_files import expand_pools
from logrerank_jax.errors import DataError, LogRerankError
from logrerank_jax.results import RankedResults, RecordError, make_result, ranked_results
from logrerank_jax.serving import schemas
from logrerank_jax.engine.batcher import (DEFAULT_MAX_BATCH_TOKENS, DEFAULT_MAX_QUEUE,
                                           DEFAULT_WINDOW_S, Batcher, Closed, QueueFull)

log = logging.getLogger("logrerank_jax.serving")
access_log = logging.getLogger("logrerank_jax.serving.access")

ROUTES = ("/v2/rerank", "/v1/rerank", "/rerank", "/log/rerank", "/health", "/info", "/metrics")
# A 60-document request of long abstracts is ~200 KB of JSON; 16 MiB leaves room for 1,000.
DEFAULT_MAX_BODY_BYTES = 16 << 20
DEFAULT_MAX_DOCUMENTS = 1000
# Seconds from arrival to answer; a CPU under full load scores a 50-passage pool in ~1-2 s.
DEFAULT_TIMEOUT_S = 120.0
# float32's resolution next to 1: a sigmoid score clipped here before its logit is taken.
_EPS32 = 2.0 ** -24


@dataclasses.dataclass(frozen=True)
class ServeSettings:
  """Limits and names of one server (the `tools/serve.py` flags)."""
  model_name: str = "logrerank"
  max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
  max_queue: int = DEFAULT_MAX_QUEUE
  max_documents: int = DEFAULT_MAX_DOCUMENTS
  timeout_s: float = DEFAULT_TIMEOUT_S
  window_s: float = DEFAULT_WINDOW_S
  max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


class HttpError(Exception):
  """An answer other than 200, with its one-line message."""

  def __init__(self, status: int, message: str, headers: Optional[Dict[str, str]] = None):
    super().__init__(message)
    self.status, self.message, self.headers = status, message, headers or {}


@dataclasses.dataclass
class _State:
  reranker: Any = None
  batcher: Optional[Batcher] = None
  ready: bool = False
  stopping: bool = False
  error: Optional[str] = None
  warmup_s: Optional[float] = None
  precompiled: Optional[dict] = None
  cut_tokenizer: Any = None                  # for max_tokens_per_doc, under cut_lock
  cut_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


class _Metrics:
  """The Prometheus series of one app (its own registry: several apps may share a process)."""

  def __init__(self, state: _State):
    self.registry = r = CollectorRegistry()
    self.requests = Counter("logrerank_requests", "HTTP requests by route and status",
                            ("route", "status"), registry=r)
    self.latency = Histogram("logrerank_request_seconds", "request latency, arrival to answer",
                             ("route",), registry=r,
                             buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120))
    self.batch = Histogram("logrerank_batch_requests", "requests per engine batch", registry=r,
                           buckets=(1, 2, 4, 8, 16, 32, 64, 128))
    self.batch_seconds = Histogram("logrerank_batch_seconds", "engine time per batch",
                                   registry=r, buckets=(.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30))
    self.tokens = Counter("logrerank_tokens", "real tokens run by the local stage", registry=r)
    self.in_flight = Gauge("logrerank_requests_in_flight", "HTTP requests being handled",
                           registry=r)
    queue = Gauge("logrerank_queue_depth", "requests waiting for a batch", registry=r)
    queue.set_function(lambda: state.batcher.queue_depth() if state.batcher else 0)
    comp = Gauge("logrerank_xla_compilations", "XLA compilations of the engine since start",
                 registry=r)
    comp.set_function(lambda: (state.reranker.compile_stats()["xla_compilations"]
                               if state.reranker is not None else 0))

  def on_batch(self, requests: int, tokens: int, seconds: float) -> None:
    self.batch.observe(requests)
    self.batch_seconds.observe(seconds)
    self.tokens.inc(tokens)


# TEI's `error_type` of each status (TEI clients, e.g. Haystack's, read `error`/`error_type`).
_ERROR_TYPES = {400: "Validation", 413: "Validation", 422: "Validation", 429: "Overloaded",
                503: "Unhealthy", 504: "Overloaded", 500: "Backend"}


def _json_error(status: int, message: str, request_id: str,
                headers: Optional[Dict[str, str]] = None) -> JSONResponse:
  """The one error body: Cohere's `message`, TEI's `error` / `error_type`, our request id."""
  body = {"message": message, "error": message,
          "error_type": _ERROR_TYPES.get(status, "Validation" if status < 500 else "Backend"),
          "request_id": request_id}
  return JSONResponse(body, status_code=status, headers=headers)


class _Edge:
  """Pure ASGI middleware around the app: a request id, the body-size limit (413), the one
  access-log line, the request metrics, and the last line of defence (an internal fault
  answers 500 with the request id, is logged with its traceback, and the server carries on)."""

  def __init__(self, app, settings: ServeSettings, metrics: _Metrics):
    self.app, self.settings, self.metrics = app, settings, metrics

  async def __call__(self, scope, receive, send):
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    rid = uuid.uuid4().hex
    scope.setdefault("state", {})["request_id"] = rid
    t0 = time.perf_counter()
    sent = {"status": None, "bytes": 0}
    self.metrics.in_flight.inc()

    async def send_wrapped(message):
      if message["type"] == "http.response.start":
        sent["status"] = message["status"]
        message = dict(message, headers=list(message.get("headers", []))
                       + [(b"x-request-id", rid.encode())])
      elif message["type"] == "http.response.body":
        sent["bytes"] += len(message.get("body", b""))
      await send(message)

    try:
      receive = await self._limited(scope, receive)
      if receive == "too large":
        await _json_error(413, f"request body over the {self.settings.max_body_bytes}-byte "
                          "limit (--max-body-bytes)", rid)(scope, _no_body, send_wrapped)
      elif receive != "gone":
        await self.app(scope, receive, send_wrapped)
    except ClientDisconnect:
      pass  # the client went away mid-request: nothing to answer, nothing broken (499 below)
    except Exception:  # pylint: disable=broad-except  (an internal fault: 500, logged, carry on)
      log.error("request %s %s failed (request id %s):\n%s", scope["method"], scope["path"],
                rid, traceback.format_exc())
      if sent["status"] is None:
        await _json_error(500, "internal error; the server log has its traceback under this "
                          "request id", rid)(scope, _no_body, send_wrapped)
    finally:
      self.metrics.in_flight.dec()
      seconds = time.perf_counter() - t0
      route = scope["path"] if scope["path"] in ROUTES else "other"
      status = sent["status"] or 499  # 499: the client went away before an answer
      self.metrics.requests.labels(route, str(status)).inc()
      self.metrics.latency.labels(route).observe(seconds)
      client = scope.get("client") or ("-", 0)
      access_log.info('%s:%s "%s %s" %s %dB %.1fms id=%s', client[0], client[1], scope["method"],
                      scope["path"], status, sent["bytes"], 1000 * seconds, rid)

  async def _limited(self, scope, receive):
    """The body read up front and replayed to the app; "too large" over the limit, "gone"
    when the client disconnected before sending all of it."""
    limit = self.settings.max_body_bytes
    for name, value in scope.get("headers", []):
      if name == b"content-length" and value.isdigit() and int(value) > limit:
        return "too large"
    chunks, size = [], 0
    while True:
      message = await receive()
      if message["type"] != "http.request":  # http.disconnect
        return "gone"
      size += len(message.get("body", b""))
      if size > limit:
        return "too large"
      chunks.append(message)
      if not message.get("more_body"):
        break
    replay = iter(chunks)

    async def receive_again():
      nxt = next(replay, None)
      return nxt if nxt is not None else await receive()
    return receive_again


async def _no_body():
  return {"type": "http.request", "body": b"", "more_body": False}


def _field(loc) -> str:
  """('body', 'documents', 3, 'text') -> 'documents[3].text' (tags of a union dropped)."""
  out = ""
  for part in loc:
    if part in ("body", "tei", "jina", "str", "TextDocument"):
      continue
    out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
  return out or "body"


def _validation_message(exc: RequestValidationError) -> Tuple[int, str]:
  errors = exc.errors()
  first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
  if first.get("type") == "json_invalid":
    return 400, f"malformed JSON: {first.get('ctx', {}).get('error', first['msg'])}"
  if first.get("type") == "missing" and tuple(first.get("loc", ())) == ("body",):
    return 400, "missing JSON body"
  field = _field(first.get("loc", ()))
  got = first.get("input")
  got_text = "" if first.get("type") == "missing" else f" (got {_type_name(got)})"
  more = f"; {len(errors) - 1} more error(s)" if len(errors) > 1 else ""
  return 422, f"{field}: {first['msg']}{got_text}{more}"


def _type_name(x: Any) -> str:
  if x is None:
    return "null"
  return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
          float: "number"}.get(type(x), type(x).__name__)


def _cut(state: _State, texts: List[str], max_tokens: Optional[int]) -> List[str]:
  """Each text cut after its first `max_tokens` tokens of the model's tokenizer (Cohere's
  `max_tokens_per_doc`); a prefix, so offsets still index the text the client sent."""
  if not max_tokens:
    return texts
  with state.cut_lock:
    enc = state.cut_tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
  out = []
  for text, offsets in zip(texts, enc["offset_mapping"]):
    out.append(text if len(offsets) <= max_tokens else text[:offsets[max_tokens - 1][1]])
  return out


def _spans(passage, opts: Optional[schemas.RelevantSpansRequest]) -> Optional[List[dict]]:
  """LoG's ranked sentences of one reranked passage as Cohere spans: best first, at or above
  the threshold, at most `max_spans`; None (the field left out, as Cohere does) when none."""
  if opts is None or opts.mode != "enabled":
    return None
  spans = [{"start": s.start, "end": s.end, "score": s.score}
           for s in passage.sentences if s.score >= opts.threshold]
  return (spans[:opts.max_spans] if opts.max_spans else spans) or None


def _relevance(passage) -> float:
  """A passage's relevance score: its best sentence's final score; 0 for no usable text."""
  return passage.score if math.isfinite(passage.score) else 0.0


# Shipped pools the home page offers (package data): the first few of each pool set, as
# (pools file, corpus file) under logrerank_jax/demo_data/.
_DEMO_POOL_FILES = (("paragraphs/test_pools.jsonl", "paragraphs/corpus.jsonl"),
                    ("scholarqa_cs/pools.jsonl", "scholarqa_cs/corpus.jsonl"))
DEMO_POOLS_PER_SET = 3


def demo_pools(per_set: int = DEMO_POOLS_PER_SET) -> List[Dict[str, Any]]:
  """The shipped demo pools the home page offers (full OpenScholar records), `per_set` of each
  pool set present in the installed package."""
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo_data")

  def read(name, limit=None):
    out = []
    with open(os.path.join(root, name), encoding="utf-8") as f:
      for line in f:
        if line.strip():
          out.append(json.loads(line))
          if limit is not None and len(out) == limit:
            break
    return out

  pools = []
  for pools_file, corpus_file in _DEMO_POOL_FILES:
    if os.path.exists(os.path.join(root, pools_file)):
      pools += expand_pools(read(pools_file, per_set), read(corpus_file))
  return pools


def create_app(load: Callable[[], Any], settings: ServeSettings = ServeSettings(),
               on_fatal: Optional[Callable[[BaseException], None]] = None,
               version: Optional[str] = None) -> FastAPI:
  """Build the app; the model loads and compiles on a thread once the server starts.

  Args:
    load: returns the loaded `Reranker` (e.g. `Reranker.from_pretrained(...)`); the app then
      precompiles every shape, starts the batcher and turns /health to 200.
    settings: limits and names.
    on_fatal: called with the error when loading fails (the server should exit non-zero).
    version: the version /info reports (default: the installed distribution's).
  """
  if version is None:
    import importlib.metadata  # pylint: disable=g-import-not-at-top
    try:
      version = importlib.metadata.version("logrerank_jax")
    except importlib.metadata.PackageNotFoundError:
      version = "unknown"
  state = _State()
  metrics = _Metrics(state)

  def warm_up():
    t0 = time.perf_counter()
    try:
      rr = load()
      state.reranker = rr
      state.precompiled = rr.precompile()
      state.cut_tokenizer = copy.deepcopy(rr.tokenizer)
      state.batcher = Batcher(rr, max_batch_tokens=settings.max_batch_tokens,
                              max_queue=settings.max_queue, window_s=settings.window_s,
                              on_batch=metrics.on_batch)
    except BaseException as e:  # pylint: disable=broad-except
      state.error = f"{type(e).__name__}: {e}"
      log.error("loading the model failed: %s", state.error)
      if on_fatal is not None:
        on_fatal(e)
      return
    state.warmup_s = time.perf_counter() - t0
    state.ready = True
    log.info("ready: %d shapes compiled (%d XLA compilations) in %.1fs",
             state.precompiled["jit_cache_entries"], state.precompiled["xla_compilations"],
             state.warmup_s)

  async def lifespan(_app):
    threading.Thread(target=warm_up, name="warm-up", daemon=True).start()
    yield
    # Uvicorn has stopped intake and answered every in-flight request; the batcher has nothing
    # left but is closed the same way (admitted requests scored first).
    state.stopping, state.ready = True, False
    if state.batcher is not None:
      await run_in_threadpool(state.batcher.close, 60.0)

  app = FastAPI(title="logrerank_jax", version=version, lifespan=lifespan,
                description="LoG-Reranker over HTTP: Cohere v2 (with relevant_spans), "
                "Jina/vLLM and TEI rerank routes, and the full LoG record.")

  @app.exception_handler(RequestValidationError)
  async def on_validation(request: Request, exc: RequestValidationError):
    status, message = _validation_message(exc)
    return _json_error(status, message, request.state.request_id)

  @app.exception_handler(HttpError)
  async def on_http_error(request: Request, exc: HttpError):
    return _json_error(exc.status, exc.message, request.state.request_id, exc.headers)

  def require_ready():
    if not state.ready:
      raise HttpError(503, "shutting down" if state.stopping else
                      (f"model failed to load: {state.error}" if state.error else
                       "warming up (loading and compiling the model); retry when /health is 200"),
                      {"Retry-After": "1"} if not state.stopping else None)

  async def score(query: str, docs: List[Dict[str, str]], max_tokens: Optional[int] = None
                  ) -> Tuple[RankedResults, int, Any]:
    """One query's documents through the engine: (reranked passages, tokens, typed result)."""
    require_ready()
    if not docs:
      raise HttpError(422, "documents: empty list (at least one document is needed)")
    if len(docs) > settings.max_documents:
      raise HttpError(422, f"documents: {len(docs)} documents, more than the server's limit of "
                      f"{settings.max_documents} (--max-documents)")
    if max_tokens:
      texts = await run_in_threadpool(_cut, state, [d["text"] for d in docs], max_tokens)
      docs = [dict(d, text=t) for d, t in zip(docs, texts)]
    raw = {"query": query, "ctxs": docs}
    try:
      record = await run_in_threadpool(parse_inference_record, raw, "request")
    except DataError as e:
      raise HttpError(422, str(e).replace("request: 'query'", "query")) from None
    result, tokens = await _through_batcher(record)
    return ranked_results(result, docs), tokens, result

  async def _through_batcher(record):
    try:
      fut = state.batcher.submit(record)
    except QueueFull as e:
      raise HttpError(429, f"{e}; retry later", {"Retry-After": str(e.retry_after)}) from None
    except Closed as e:
      raise HttpError(503, str(e)) from None
    try:
      scored = await asyncio.wait_for(asyncio.wrap_future(fut), settings.timeout_s)
    except asyncio.TimeoutError:
      raise HttpError(504, f"no answer within the server's timeout of {settings.timeout_s:g} s "
                      "(--timeout)") from None
    if isinstance(scored.scores, LogRerankError):
      raise HttpError(422, f"the engine cannot score this request: {scored.scores}")
    result = make_result(scored.scores, line=1)
    if isinstance(result, RecordError):
      raise RuntimeError(f"scoring produced an unusable result: {result.error}")
    return result, scored.tokens

  def usage(tokens: int) -> schemas.Usage:
    return schemas.Usage(total_tokens=tokens, prompt_tokens=tokens)

  async def jina(req: schemas.JinaRerankRequest, request: Request) -> schemas.JinaRerankResponse:
    docs = [{"text": d, "title": ""} if isinstance(d, str) else {"text": d.text, "title": d.title or ""}
            for d in req.documents]
    ranked, tokens, _ = await score(req.query, docs, req.max_tokens_per_doc)
    sent = [d if isinstance(d, str) else d.text for d in req.documents]
    results = [schemas.JinaResult(
        index=p.index, relevance_score=_relevance(p),
        document=schemas.DocumentText(text=sent[p.index]) if req.return_documents else None,
        relevant_spans=_spans(p, req.relevant_spans)) for p in ranked.top_k(req.top_n or len(docs))]
    return schemas.JinaRerankResponse(id=request.state.request_id, model=settings.model_name,
                                      usage=usage(tokens), results=results)

  @app.post("/v2/rerank", response_model=schemas.CohereRerankResponse,
            response_model_exclude_none=True, summary="Cohere v2 rerank (with relevant_spans)")
  async def cohere_v2(req: schemas.CohereRerankRequest, request: Request):
    docs = [{"text": d, "title": ""} for d in req.documents]
    ranked, tokens, _ = await score(req.query, docs, req.max_tokens_per_doc)
    results = [schemas.CohereResult(index=p.index, relevance_score=_relevance(p),
                                    relevant_spans=_spans(p, req.relevant_spans))
               for p in ranked.top_k(req.top_n or len(docs))]
    return schemas.CohereRerankResponse(
        id=request.state.request_id, results=results,
        meta=schemas.CohereMeta(tokens=schemas.CohereTokens(input_tokens=tokens)))

  @app.post("/v1/rerank", response_model=schemas.JinaRerankResponse,
            response_model_exclude_none=True, summary="Jina / vLLM rerank")
  async def jina_v1(req: schemas.JinaRerankRequest, request: Request):
    return await jina(req, request)

  @app.post("/rerank", response_model=Any, summary="TEI rerank (texts) or Jina / vLLM (documents)")
  async def rerank(req: schemas.AnyRerankRequest, request: Request):
    if isinstance(req, schemas.JinaRerankRequest):
      out = await jina(req, request)
      return JSONResponse(out.model_dump(exclude_none=True))
    docs = [{"text": t, "title": ""} for t in req.texts]
    ranked, _, _ = await score(req.query, docs)
    out = []
    for p in ranked:
      s = _relevance(p)
      if req.raw_scores:  # the logit of the final score (sigmoid) LoG ranks by
        c = min(max(s, _EPS32), 1.0 - _EPS32)
        s = math.log(c) - math.log1p(-c)
      out.append({"index": p.index, "score": s, **({"text": req.texts[p.index]}
                                                     if req.return_text else {})})
    return JSONResponse(out)

  @app.post("/log/rerank", summary="LoG's full record (what tools/rerank.py writes)")
  async def log_rerank(record: Dict[str, Any] = Body(...)):
    require_ready()
    try:
      parsed = await run_in_threadpool(parse_inference_record, record, "body")
    except DataError as e:
      raise HttpError(422, str(e)) from None
    n = len(parsed.passages)
    if n > settings.max_documents:
      raise HttpError(422, f"{parsed.passage_key}: {n} passages, more than the server's limit "
                      f"of {settings.max_documents} (--max-documents)")
    result, _ = await _through_batcher(parsed)
    return JSONResponse(result.to_dict())

  home = {}

  @app.get("/", response_class=HTMLResponse,
           summary="explanation page: rerank a question and passages, or a demo pool")
  async def home_page():
    # Built once (it embeds the demo pools); answers while warming too: the form's request is
    # what waits for the model.
    if "page" not in home:
      home["page"] = await run_in_threadpool(explain.form_page, "/log/rerank", demo_pools())
    return HTMLResponse(home["page"])

  @app.get("/health", summary="200 once the model is loaded and compiled")
  async def health():
    if state.ready:
      return {"status": "ok"}
    status = "stopping" if state.stopping else ("failed" if state.error else "warming")
    return JSONResponse({"status": status, **({"error": state.error} if state.error else {})},
                        status_code=503)

  @app.get("/info", summary="model, backbone, buckets, devices, limits, version")
  async def info():
    out = {"version": version, "model": settings.model_name, "ready": state.ready,
           "limits": {"max_batch_tokens": settings.max_batch_tokens,
                      "max_queue": settings.max_queue, "max_documents": settings.max_documents,
                      "timeout_s": settings.timeout_s, "batch_window_s": settings.window_s,
                      "max_body_bytes": settings.max_body_bytes}}
    rr = state.reranker
    if rr is not None:
      enc = rr.cfg.local.encoder
      pk = rr.packing
      out.update(
          model_dir=rr.model_dir, backbone=rr.cfg.local.encoder_family,
          encoder={"hidden_size": enc.hidden_size, "layers": enc.num_hidden_layers,
                   "max_positions": enc.max_positions},
          use_global=rr.cfg.use_global, local_only=rr.local_only,
          buckets={"row_len": pk.row_len, "row_buckets": list(pk.row_buckets),
                   "span_buckets": list(pk.span_buckets), "node_buckets": list(pk.node_buckets),
                   "max_query_tokens": pk.max_query_tokens,
                   "queries_per_batch": rr.queries_per_batch, "local_slots": rr.local_slots},
          devices=[str(d) for d in rr.devices], num_devices=rr.num_devices,
          compile_stats=rr.compile_stats(), warmup_s=state.warmup_s)
    return out

  @app.get("/metrics", summary="Prometheus text")
  async def prometheus():
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

  app.add_middleware(_Edge, settings=settings, metrics=metrics)
  app.state.serving = state  # for tests and tools
  return app
