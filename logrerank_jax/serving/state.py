"""What the routes of one app share: its settings, the engine once loaded, readiness, metrics.

One `ServingState` per app, at `app.state.serving`; a route reaches it through the
`serving_state` dependency (`Depends(serving_state)`), so routers hold no closures over it.
"""

import dataclasses
import threading
from typing import Any, Optional

from fastapi import Request

from logrerank_jax.engine.batcher import Batcher
from logrerank_jax.serving.settings import ServeSettings


@dataclasses.dataclass
class ServingState:
  settings: ServeSettings = ServeSettings()
  version: str = "unknown"                   # what /info reports
  metrics: Any = None                        # the app's `metrics.Metrics`
  reranker: Any = None
  batcher: Optional[Batcher] = None
  ready: bool = False
  stopping: bool = False
  error: Optional[str] = None
  warmup_s: Optional[float] = None
  # /health's progress while warming: {"stage": "loading"|"compiling", "done": n, "total": n}
  warmup: dict = dataclasses.field(
      default_factory=lambda: {"stage": "loading", "done": 0, "total": None})
  precompiled: Optional[dict] = None
  cut_tokenizer: Any = None                  # for max_tokens_per_doc, under cut_lock
  cut_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
  home_page: Optional[str] = None            # GET /'s page, built on its first request


async def serving_state(request: Request) -> ServingState:
  """The dependency every route takes its app's state from (async: no thread hop)."""
  return request.app.state.serving
