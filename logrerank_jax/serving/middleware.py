"""The edge of the app (pure ASGI middleware): a request id, the body-size limit (413), the one
access-log line, the request metrics, and the last line of defence against internal faults."""

import logging
import time
import traceback
import uuid

from starlette.requests import ClientDisconnect

from logrerank_jax.serving.http_errors import json_error
from logrerank_jax.serving.metrics import Metrics
from logrerank_jax.serving.settings import ServeSettings

log = logging.getLogger("logrerank_jax.serving")
access_log = logging.getLogger("logrerank_jax.serving.access")

ROUTES = ("/v2/rerank", "/v1/rerank", "/rerank", "/log/rerank", "/health", "/info", "/metrics")


class Edge:
  """Pure ASGI middleware around the app: a request id, the body-size limit (413), the one
  access-log line, the request metrics, and the last line of defence (an internal fault
  answers 500 with the request id, is logged with its traceback, and the server carries on)."""

  def __init__(self, app, settings: ServeSettings, metrics: Metrics):
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
        await json_error(413, f"request body over the {self.settings.max_body_bytes}-byte "
                         "limit (--max-body-bytes)", rid)(scope, _no_body, send_wrapped)
      elif receive != "gone":
        await self.app(scope, receive, send_wrapped)
    except ClientDisconnect:
      pass  # the client went away mid-request: nothing to answer, nothing broken (499 below)
    except Exception:  # pylint: disable=broad-except  (an internal fault: 500, logged, carry on)
      log.error("request %s %s failed (request id %s):\n%s", scope["method"], scope["path"],
                rid, traceback.format_exc())
      if sent["status"] is None:
        await json_error(500, "internal error; the server log has its traceback under this "
                         "request id", rid)(scope, _no_body, send_wrapped)
    finally:
      self.metrics.in_flight.dec()
      self._record(scope, sent, time.perf_counter() - t0, rid)

  def _record(self, scope, sent, seconds: float, rid: str) -> None:
    """The request's metrics and its one access-log line."""
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
