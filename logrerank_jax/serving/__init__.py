"""The HTTP door (optional `[serve]` extra): a FastAPI app over the same engine the CLI uses.

  app          the app factory of `logrerank serve`: builds the state, includes the routers,
               the middleware and the lifespan (warm-up, drain)
  routers/     one router per ecosystem: cohere (/v2/rerank), jina_vllm (/v1/rerank), tei
               (/rerank), log (/log/rerank); ops (/, /health, /info, /metrics)
  schemas      the Pydantic request/response models of those routes
  settings     `ServeSettings`, the limits of one server, and their defaults
  auth         the API key (`Authorization: Bearer KEY`) of the scoring routes
  state        `ServingState`, what the routes of one app share (`app.state.serving`)
  scoring      the one path of every route into the engine (`logrerank_jax.engine`)
  truncation   Cohere's `max_tokens_per_doc`
  http_errors  the one error body and the messages of malformed requests
  middleware   request id, body limit, access log, request metrics, the 500 of last resort
  metrics      the Prometheus series
  demo_pools   the shipped pools the home page offers

Nothing below this package imports it or its HTTP stack (`.importlinter` checks it).
"""
