"""The HTTP app of `tools/serve.py`: LoG where RAG pipelines call rerankers.

Routes (field names of each ecosystem, `serving.schemas`):
  POST /v2/rerank   Cohere v2, with `relevant_spans` (LoG's ranked sentences of each document)
  POST /v1/rerank   Jina / vLLM (also takes `relevant_spans`)
  POST /rerank      TEI (`texts`) or Jina / vLLM (`documents`), told apart by the body
  POST /log/rerank  one OpenScholar record -> the "log" record `tools/rerank.py` writes for it
  GET  /            the explanation page (`logrerank_jax.explain.form_page`): paste a question
                    and passages or pick a shipped demo pool; the `/log/rerank` answer is drawn
                    by the same renderer as `tools/rerank.py --html`
  GET  /health      503 while the model loads and compiles (with the warm-up's progress) and
                    while stopping, then 200
  GET  /info        model folder, backbone, buckets, devices, limits, version
  GET  /metrics     Prometheus text: requests by route and status, latency, batch sizes, queue
                    depth, tokens, XLA compilations
  GET  /docs        OpenAPI docs (FastAPI)

Every request goes through the one engine: parsed and split into sentences on a worker thread
(`data.inference_input`, as the CLI reads a line), scored by the dynamic batcher
(`engine.batcher`: the engine's bucketed calls shared with concurrent requests), turned into
the typed result by `results.make_result` (as the CLI and `Reranker.rank`), and only then into
each ecosystem's JSON. A document's `relevance_score` is LoG's passage score, its best
sentence's final score (in [0, 1]; the calibrated probability when the model folder has a
calibration.json, `engine.calibration`); a document with no usable text (empty) is kept, ranked
last, with score 0. With an API key (`ServeSettings.api_key`, `serving.auth`) the scoring
routes and /info answer 401 without `Authorization: Bearer KEY`.

Status codes: 400 malformed JSON; 401 no or a wrong API key; 413 body over `max_body_bytes`; 422 a missing, mistyped or
out-of-range field, too many documents, or a record the engine cannot score (the message names
the field or reason); 429 queue full (with Retry-After); 503 warming up or shutting down; 504
the request's `timeout` passed before its answer; 500 an internal fault only (logged with its
request id, which every response carries in `x-request-id`). Each request gets one access-log
line.

This module is the app factory (state, routers, middleware, lifespan); the parts it joins:
  settings     `ServeSettings`, the limits of one server, and their defaults
  auth         the API key check
  state        `ServingState`, what the routes of one app share (`app.state.serving`)
  routers/     one router per ecosystem (cohere, jina_vllm, tei, log) and ops (/, /health, ...)
  scoring      the one path of every route into the engine
  truncation   `max_tokens_per_doc`
  http_errors  the one error body, validation messages
  middleware   request id, body limit, access log, request metrics, the 500 of last resort
  metrics      the Prometheus series
  demo_pools   the shipped pools the home page offers
"""

import copy
import logging
import threading
import time
from typing import Any, Callable, Optional

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool

from logrerank_jax.engine.batcher import Batcher
from logrerank_jax.serving.demo_pools import DEMO_POOLS_PER_SET, demo_pools
from logrerank_jax.serving.http_errors import HttpError, add_error_handlers
from logrerank_jax.serving.metrics import Metrics
from logrerank_jax.serving.middleware import ROUTES, Edge
from logrerank_jax.serving.routers import ROUTERS
from logrerank_jax.serving.settings import (DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_DOCUMENTS,
                                            DEFAULT_TIMEOUT_S, ServeSettings)
from logrerank_jax.serving.state import ServingState

# `tools/serve.py` and the tests take the settings, their defaults and the demo pools from here.
__all__ = ["DEFAULT_MAX_BODY_BYTES", "DEFAULT_MAX_DOCUMENTS", "DEFAULT_TIMEOUT_S",
           "DEMO_POOLS_PER_SET", "HttpError", "ROUTES", "ServeSettings", "create_app",
           "demo_pools", "warm_up"]

log = logging.getLogger("logrerank_jax.serving")


def warm_up(state: ServingState, load: Callable[[], Any],
            on_fatal: Optional[Callable[[BaseException], None]]) -> None:
  """Load the model, precompile every shape, start the batcher, then turn /health to 200 (on
  the warm-up thread; a failure is kept for /health and handed to `on_fatal`)."""
  settings = state.settings
  t0 = time.perf_counter()
  try:
    rr = load()
    state.reranker = rr

    def progress(done: int, total: int) -> None:
      state.warmup = {"stage": "compiling", "done": done, "total": total}
      log.info("warm-up: %d/%d programs ready (%.1fs)", done, total, time.perf_counter() - t0)
    state.precompiled = rr.precompile(on_progress=progress)
    state.cut_tokenizer = copy.deepcopy(rr.tokenizer)
    state.batcher = Batcher(rr, max_batch_tokens=settings.max_batch_tokens,
                            max_queue=settings.max_queue, window_s=settings.window_s,
                            on_batch=state.metrics.on_batch)
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


def _lifespan(state: ServingState, load: Callable[[], Any],
              on_fatal: Optional[Callable[[BaseException], None]]):
  """The app's lifespan: warm up on a thread at start; at stop, close the batcher."""

  async def lifespan(_app):
    threading.Thread(target=warm_up, args=(state, load, on_fatal), name="warm-up",
                     daemon=True).start()
    yield
    # Uvicorn has stopped intake and answered every in-flight request; the batcher has nothing
    # left but is closed the same way (admitted requests scored first).
    state.stopping, state.ready = True, False
    if state.batcher is not None:
      await run_in_threadpool(state.batcher.close, 60.0)
  return lifespan


def _installed_version() -> str:
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  try:
    return importlib.metadata.version("logrerank_jax")
  except importlib.metadata.PackageNotFoundError:
    return "unknown"


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
    version = _installed_version()
  state = ServingState(settings=settings, version=version)
  state.metrics = Metrics(state)
  app = FastAPI(title="logrerank_jax", version=version,
                lifespan=_lifespan(state, load, on_fatal),
                description="LoG-Reranker over HTTP: Cohere v2 (with relevant_spans), "
                "Jina/vLLM and TEI rerank routes, and the full LoG record.")
  add_error_handlers(app)
  for router in ROUTERS:
    app.include_router(router)
  app.add_middleware(Edge, settings=settings, metrics=state.metrics)
  app.state.serving = state  # for the routes (`state.serving_state`), tests and tools
  return app
