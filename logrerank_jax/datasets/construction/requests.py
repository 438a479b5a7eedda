"""Batch-request JSONL in the OpenAI-compatible batch format, and an optional endpoint client.

One line per request: {"custom_id", "method": "POST", "url": "/v1/chat/completions",
"body": {"model", "messages", "temperature", "response_format"}}.
custom_id names what the request annotates:
  "passage|<instance id>"              one passage-ranking request per instance;
  "sentence|<instance id>|<ref index>" one sentence-ranking request per passage.
"""

import dataclasses
import json
import os
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Optional, Sequence

from logrerank_jax.datasets.construction import prompts
from logrerank_jax.datasets.construction.extract import Instance
from logrerank_jax.errors import DataError

CHAT_URL = "/v1/chat/completions"


def passage_custom_id(instance_id: str) -> str:
  """Return the custom_id of an instance's passage-ranking request."""
  return f"passage|{instance_id}"


def sentence_custom_id(instance_id: str, ref: int) -> str:
  """Return the custom_id of the sentence-ranking request of reference `ref`."""
  return f"sentence|{instance_id}|{ref}"


def parse_custom_id(custom_id: str) -> tuple[str, str, Optional[int]]:
  """Split a custom_id into (kind, instance id, ref or None).

  Raises:
    DataError: the id follows neither scheme.
  """
  if not isinstance(custom_id, str):
    raise DataError(f"custom_id must be a string, got {type(custom_id).__name__}")
  if custom_id.startswith("passage|") and len(custom_id) > len("passage|"):
    return "passage", custom_id[len("passage|"):], None
  if custom_id.startswith("sentence|"):
    # Instance ids may contain "|"; the reference index is always the last field.
    iid, _, ref = custom_id[len("sentence|"):].rpartition("|")
    if iid and ref.isdigit():
      return "sentence", iid, int(ref)
  raise DataError(f"custom_id {custom_id!r} is neither 'passage|<id>' nor 'sentence|<id>|<ref>'")


@dataclasses.dataclass(frozen=True)
class RequestOptions:
  """Model settings written into every request body."""
  model: str = "gpt-4o-2024-08-06"
  temperature: float = 0.0
  max_tokens: int = 4096
  json_mode: bool = True  # response_format {"type": "json_object"} where the server supports it


def _request(custom_id: str, messages: list[dict], opts: RequestOptions) -> dict[str, Any]:
  """Return one batch line."""
  body: dict[str, Any] = {"model": opts.model, "messages": messages,
                          "temperature": opts.temperature, "max_tokens": opts.max_tokens}
  if opts.json_mode:
    body["response_format"] = {"type": "json_object"}
  return {"custom_id": custom_id, "method": "POST", "url": CHAT_URL, "body": body}


def build_requests(instances: Sequence[Instance], opts: RequestOptions = RequestOptions()
                   ) -> list[dict[str, Any]]:
  """Return the batch lines: per instance its passage request, then one sentence request per passage."""
  out = []
  for inst in instances:
    out.append(_request(
        passage_custom_id(inst.id),
        prompts.passage_messages(inst.question, inst.answer,
                                 [(p.ref, p.title, p.text) for p in inst.passages]), opts))
    gold = inst.answer if prompts.include_gold_answer(inst.subset, len(inst.cited)) else None
    for p in inst.passages:
      out.append(_request(sentence_custom_id(inst.id, p.ref),
                          prompts.sentence_messages(inst.question, p.title, p.text, gold), opts))
  return out


def write_requests(path: str | os.PathLike, requests: Sequence[dict[str, Any]],
                   opts: RequestOptions = RequestOptions()) -> str:
  """Write the batch JSONL and `<path>.manifest.json` (prompt version, model, counts); return its path."""
  with open(path, "w", encoding="utf-8") as f:
    for r in requests:
      f.write(json.dumps(r, ensure_ascii=False) + "\n")
  kinds = [parse_custom_id(r["custom_id"])[0] for r in requests]
  manifest = {"prompt_version": prompts.PROMPT_VERSION, "model": opts.model,
              "temperature": opts.temperature, "requests": len(requests),
              "passage_requests": kinds.count("passage"),
              "sentence_requests": kinds.count("sentence")}
  mpath = os.fspath(path) + ".manifest.json"
  with open(mpath, "w", encoding="utf-8") as f:
    json.dump(manifest, f, indent=2)
  return mpath


def send_requests(requests: Sequence[dict[str, Any]], endpoint: str, out_path: str | os.PathLike,
                  api_key: Optional[str] = None, max_retries: int = 5,
                  requests_per_second: float = 2.0, timeout_s: float = 120.0,
                  post: Optional[Callable[[str, bytes, dict], bytes]] = None,
                  backoff_s: float = 1.0) -> dict[str, int]:
  """Send requests one by one to an OpenAI-compatible server; write batch-output-style lines.

  Optional: no test or pipeline step needs a server. Each output line has the
  shape of the OpenAI batch output (`custom_id`, `response.status_code`,
  `response.body`, `error`), so `consolidate` reads it unchanged.

  Args:
    requests: batch lines from `build_requests`.
    endpoint: server base URL, e.g. "http://localhost:8000" (the request's url is appended).
    out_path: where the responses go (JSONL, appended per request, so a crash loses nothing sent).
    api_key: sent as a Bearer token when given.
    max_retries: attempts per request beyond the first, for 429/5xx and network errors.
    requests_per_second: client-side rate limit.
    timeout_s: per-request socket timeout.
    post: injectable transport (url, data, headers) -> response bytes; default urllib.
    backoff_s: first retry delay; it doubles per attempt, capped at 30 s.

  Returns:
    {"ok": n, "failed": n}.
  """
  def _urllib_post(url: str, data: bytes, headers: dict) -> bytes:
    req = urllib.request.Request(url, data=data, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 (user-given URL)
      return resp.read()

  post = post or _urllib_post
  headers = {"Content-Type": "application/json"}
  if api_key:
    headers["Authorization"] = f"Bearer {api_key}"
  min_gap = 1.0 / requests_per_second if requests_per_second > 0 else 0.0
  last = 0.0
  counts = {"ok": 0, "failed": 0}
  with open(out_path, "a", encoding="utf-8") as f:
    for r in requests:
      line: dict[str, Any] = {"custom_id": r["custom_id"], "response": None, "error": None}
      for attempt in range(max_retries + 1):
        wait = last + min_gap - time.monotonic()
        if wait > 0:
          time.sleep(wait)
        last = time.monotonic()
        try:
          body = json.loads(post(endpoint.rstrip("/") + r["url"],
                                 json.dumps(r["body"]).encode("utf-8"), headers))
          line["response"] = {"status_code": 200, "body": body}
          line["error"] = None
          break
        except urllib.error.HTTPError as e:
          line["error"] = {"code": str(e.code), "message": str(e.reason)}
          if e.code != 429 and e.code < 500:
            break  # a client error will not succeed on retry
        except (urllib.error.URLError, TimeoutError, OSError, json.JSONDecodeError) as e:
          line["error"] = {"code": "transport", "message": str(e)}
        if attempt < max_retries:
          # Exponential back-off before the next attempt.
          time.sleep(min(backoff_s * 2.0 ** attempt, 30.0))
      counts["ok" if line["error"] is None else "failed"] += 1
      f.write(json.dumps(line, ensure_ascii=False) + "\n")
      f.flush()
  return counts
