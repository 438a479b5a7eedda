"""The API key (`--api-key` / `$LOGRERANK_API_KEY`): `Authorization: Bearer KEY` on every
scoring route and /info, as vLLM, TEI and Infinity check it.

Open without the key: /health (load balancers and orchestrators probe it), /metrics (request
counts and latencies only, no request content; Prometheus scrapers rarely carry a bearer
token), / (the page; its form's requests are scoring requests, so they need the key) and the
OpenAPI docs (/docs, /openapi.json: the API's shape, no data). No key set: every route is open.
"""

import hmac
import ipaddress
from typing import Optional

from fastapi import Request

from logrerank_jax.serving.http_errors import HttpError

ENV_VAR = "LOGRERANK_API_KEY"


def bearer_token(header: Optional[str]) -> Optional[str]:
  """The token of an `Authorization: Bearer TOKEN` header (scheme case-insensitive), else None."""
  if not header:
    return None
  scheme, _, token = header.strip().partition(" ")
  return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def key_matches(sent: Optional[str], key: str) -> bool:
  """Constant-time comparison (`hmac.compare_digest`): the time taken says nothing of how much
  of the key a guess got right."""
  return sent is not None and hmac.compare_digest(sent.encode("utf-8"), key.encode("utf-8"))


async def require_key(request: Request) -> None:
  """The dependency of the protected routers: 401 (the one error body) without the right key."""
  key = request.app.state.serving.settings.api_key
  if not key:
    return
  sent = bearer_token(request.headers.get("authorization"))
  if not key_matches(sent, key):
    raise HttpError(401, "missing API key: send 'Authorization: Bearer KEY'" if sent is None
                    else "invalid API key", {"WWW-Authenticate": "Bearer"})


def is_loopback(host: str) -> bool:
  """Whether `host` (an interface to listen on) is reachable from this machine only."""
  if host == "localhost":
    return True
  try:
    return ipaddress.ip_address(host).is_loopback
  except ValueError:
    return False  # a hostname: assume it is reachable from elsewhere
