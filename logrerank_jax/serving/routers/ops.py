"""The operator's routes: GET / (the explanation page), /health, /info and /metrics."""

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from logrerank_jax import explain
from logrerank_jax.serving.auth import require_key
from logrerank_jax.serving.demo_pools import demo_pools
from logrerank_jax.serving.state import ServingState, serving_state

router = APIRouter()


@router.get("/", response_class=HTMLResponse,
            summary="explanation page: rerank a question and passages, or a demo pool")
async def home_page(state: ServingState = Depends(serving_state)):
  # Built once (it embeds the demo pools); answers while warming too: the form's request is
  # what waits for the model.
  if state.home_page is None:
    state.home_page = await run_in_threadpool(explain.form_page, "/log/rerank", demo_pools())
  return HTMLResponse(state.home_page)


@router.get("/health", summary="200 once the model is loaded and compiled; while warming, "
            "503 with the warm-up's progress")
async def health(state: ServingState = Depends(serving_state)):
  if state.ready:
    return {"status": "ok"}
  status = "stopping" if state.stopping else ("failed" if state.error else "warming")
  body = {"status": status, **({"error": state.error} if state.error else {})}
  if status == "warming":
    # stage "loading" (the folder read, no programs known yet), then "compiling": `done` of
    # `total` programs compiled or loaded from the persistent cache.
    body["warmup"] = dict(state.warmup)
  return JSONResponse(body, status_code=503)


@router.get("/info", summary="model, backbone, buckets, devices, limits, version",
            dependencies=[Depends(require_key)])
async def info(state: ServingState = Depends(serving_state)):
  settings = state.settings
  out = {"version": state.version, "model": settings.model_name, "ready": state.ready,
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


@router.get("/metrics", summary="Prometheus text")
async def prometheus(state: ServingState = Depends(serving_state)):
  return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
