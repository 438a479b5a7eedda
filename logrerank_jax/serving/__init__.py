"""The HTTP door (optional `[serve]` extra): a FastAPI app over the same engine the CLI uses.

  app        the app factory of `logrerank serve`: Cohere/Jina/vLLM/TEI rerank routes,
             /log/rerank, /health, /info, /metrics
  schemas    the Pydantic request/response models of those routes

Nothing below this package imports it or its HTTP stack (`.importlinter` checks it).
"""
