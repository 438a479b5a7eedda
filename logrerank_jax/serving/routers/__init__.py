"""The routes of the HTTP door, one router per ecosystem (field names in `serving.schemas`).

  cohere     POST /v2/rerank   Cohere v2, with `relevant_spans`
  jina_vllm  POST /v1/rerank   Jina / vLLM (also takes `relevant_spans`)
  tei        POST /rerank      TEI (`texts`) or Jina / vLLM (`documents`), told apart by the body
  log        POST /log/rerank  one OpenScholar record -> the "log" record of `tools/rerank.py`
  ops        GET /, /health, /info, /metrics

Each route takes its app's `ServingState` through the `state.serving_state` dependency and
calls the engine through `serving.scoring`; `ROUTERS` is the order `app.create_app` includes
them in (the order of the OpenAPI document).
"""

from logrerank_jax.serving.routers import cohere, jina_vllm, log, ops, tei

ROUTERS = (cohere.router, jina_vllm.router, tei.router, log.router, ops.router)
