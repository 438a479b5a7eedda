"""Tolerant parsing of annotator output: code fences, surrounding prose and minor JSON damage.

Repairs are tried one at a time, cumulatively, and each one applied is named so
the consolidator can report it; text that still does not parse is an error.
"""

import json
import re
from typing import Any

from logrerank_jax.errors import DataError

_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)(?:```|$)", re.DOTALL)
_TRAILING_COMMA = re.compile(r",(\s*[}\]])")
_SMART_QUOTES = str.maketrans({"\u201c": '"', "\u201d": '"'})
_PY_LITERALS = ((re.compile(r"\bTrue\b"), "true"), (re.compile(r"\bFalse\b"), "false"),
                (re.compile(r"\bNone\b"), "null"))


def _close_brackets(text: str) -> str:
  """Append the closers of brackets (and a string) left open, as in truncated output."""
  stack = []
  in_str = False
  escape = False
  for ch in text:
    if in_str:
      if escape:
        escape = False
      elif ch == "\\":
        escape = True
      elif ch == '"':
        in_str = False
    elif ch == '"':
      in_str = True
    elif ch in "[{":
      stack.append("]" if ch == "[" else "}")
    elif ch in "]}" and stack and stack[-1] == ch:
      stack.pop()
  tail = '"' if in_str else ""
  # A dangling comma before the closers would still be invalid.
  body = (text + tail).rstrip()
  if body.endswith(","):
    body = body[:-1]
  return body + "".join(reversed(stack))


def _outer_json(text: str) -> str:
  """Return the span from the first "{" (else "[") to the last matching closer (or the end)."""
  # Both annotation schemas are objects, so an object wins over a "[k]" in surrounding prose.
  start = text.find("{")
  if start < 0:
    start = text.find("[")
  if start < 0:
    raise DataError("no JSON object or array in the response")
  closer = "}" if text[start] == "{" else "]"
  end = text.rfind(closer)
  return text[start:end + 1] if end > start else text[start:]


def loads_lenient(text: str) -> tuple[Any, list[str]]:
  """Parse annotator output as JSON, repairing minor damage.

  Args:
    text: the model's message content.

  Returns:
    (value, repairs): the parsed value and the names of the repairs applied
    ("code_fence", "surrounding_text", "smart_quotes", "trailing_comma",
    "python_literal", "unclosed_bracket"); [] when the text was strict JSON.

  Raises:
    DataError: the text cannot be parsed even after every repair.
  """
  if not isinstance(text, str) or not text.strip():
    raise DataError("empty response content")
  repairs: list[str] = []
  s = text.strip()
  try:
    return json.loads(s), repairs
  except json.JSONDecodeError:
    pass
  m = _FENCE.search(s)
  if m:
    s = m.group(1).strip()
    repairs.append("code_fence")
  core = _outer_json(s)
  if core != s:
    repairs.append("surrounding_text")
  s = core
  steps = [
      ("smart_quotes", lambda t: t.translate(_SMART_QUOTES)),
      ("trailing_comma", lambda t: _TRAILING_COMMA.sub(r"\1", t)),
      ("python_literal", lambda t: _apply_literals(t)),
      ("unclosed_bracket", _close_brackets),
  ]
  last_err = None
  for name, fix in [(None, None)] + steps:
    if fix is not None:
      fixed = fix(s)
      if fixed == s:
        continue
      s = fixed
      repairs.append(name)
    try:
      return json.loads(s), repairs
    except json.JSONDecodeError as e:
      last_err = e
  raise DataError(f"unparseable JSON after repairs {repairs or '[]'}: {last_err.msg} "
                  f"at line {last_err.lineno} column {last_err.colno}")


def _apply_literals(text: str) -> str:
  """Replace Python's True/False/None with JSON literals."""
  for pat, rep in _PY_LITERALS:
    text = pat.sub(rep, text)
  return text
