"""Every answer other than 200 in one shape, and the 400/422 messages of a malformed request.

The one error body carries Cohere's `message`, TEI's `error` / `error_type` and our request id;
a validation error names the field (`documents[3].text`) and what was sent instead.
"""

from typing import Any, Dict, Optional, Tuple

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


class HttpError(Exception):
  """An answer other than 200, with its one-line message."""

  def __init__(self, status: int, message: str, headers: Optional[Dict[str, str]] = None):
    super().__init__(message)
    self.status, self.message, self.headers = status, message, headers or {}


# TEI's `error_type` of each status (TEI clients, e.g. Haystack's, read `error`/`error_type`).
_ERROR_TYPES = {400: "Validation", 401: "Unauthorized", 413: "Validation", 422: "Validation", 429: "Overloaded",
                503: "Unhealthy", 504: "Overloaded", 500: "Backend"}


def json_error(status: int, message: str, request_id: str,
               headers: Optional[Dict[str, str]] = None) -> JSONResponse:
  """The one error body: Cohere's `message`, TEI's `error` / `error_type`, our request id."""
  body = {"message": message, "error": message,
          "error_type": _ERROR_TYPES.get(status, "Validation" if status < 500 else "Backend"),
          "request_id": request_id}
  return JSONResponse(body, status_code=status, headers=headers)


def _field(loc) -> str:
  """('body', 'documents', 3, 'text') -> 'documents[3].text' (tags of a union dropped)."""
  out = ""
  for part in loc:
    if part in ("body", "tei", "jina", "str", "TextDocument"):
      continue
    out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
  return out or "body"


def validation_message(exc: RequestValidationError) -> Tuple[int, str]:
  """The status (400 malformed or missing JSON, else 422) and message of a validation error."""
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


async def on_validation(request: Request, exc: RequestValidationError):
  status, message = validation_message(exc)
  return json_error(status, message, request.state.request_id)


async def on_http_error(request: Request, exc: HttpError):
  return json_error(exc.status, exc.message, request.state.request_id, exc.headers)


def add_error_handlers(app: FastAPI) -> None:
  """Malformed requests and `HttpError`s answered in the one error body."""
  app.add_exception_handler(RequestValidationError, on_validation)
  app.add_exception_handler(HttpError, on_http_error)
