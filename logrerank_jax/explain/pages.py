"""The explanation pages: one record's page, the run's index page and the empty form page.

A record page is a fixed HTML shell around three inline blocks: the record's "log" JSON
(`RerankResult.to_dict()` / `RecordError.to_dict()`, exactly what `tools/rerank.py` writes) in a
`<script type="application/json">` block, the stylesheet and the JS renderer
(`static/explain.js`), which draws everything from that JSON. There is no second formatter:
`form_page` ships the same renderer for answers of the HTTP server's `POST /log/rerank`.

Offline by construction: nothing is linked, and each page's Content-Security-Policy allows only
its own inline script and stylesheet (by SHA-256), no image, font, frame or request (the form
page may call its own origin). Text is escaped twice over: the JSON block cannot be closed by
any string (`<`, `>`, `&`, U+2028/9 are written as \\u escapes) and the renderer only inserts
text as text.
"""

import base64
import functools
import hashlib
import html
import importlib.resources
import json
import os
import string
import tempfile
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from logrerank_jax.errors import DataError

INDEX_FILE = "index.html"
# Keys a processed record's JSON must hold for the renderer (RerankResult.to_dict()).
RECORD_KEYS = ("query", "ranked_sentences", "passage_ranking", "passages", "context", "graph")

_PAGE = string.Template("""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="$csp">
<title>$title</title>
<style>$css</style>
</head>
<body>
$skip<div id="app">$body</div>
$data<script type="application/json" id="log-page">$conf</script>
<script>$js</script>
</body>
</html>
""")

_NOSCRIPT = ("<noscript><p>This page is drawn by its inline JavaScript, which is switched off; "
             "the record's JSON is in the page source.</p></noscript>")

_FORM = """<main class="log-page"><header class="page-head"><h1>LoG-Reranker: see why it ranked it</h1>
</header>
<form class="rerank-form">
<label>A shipped demo pool <select name="pool"><option value="">(choose one, or paste below)</option>
</select></label>
<label>Question<br><textarea name="question" rows="2" required></textarea></label>
<label>Passages, separated by a blank line<br>
<textarea name="passages" rows="12" required></textarea></label>
<button type="submit">Rerank</button>
</form>
<div id="result"></div></main>"""


@functools.lru_cache(maxsize=None)
def asset(name: str) -> str:
  """The text of a packaged static file (`explain.js`, `explain.css`)."""
  return (importlib.resources.files(__package__) / "static" / name).read_text(encoding="utf-8")


def _sha256(text: str) -> str:
  return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


def _csp(connect: str = "'none'") -> str:
  return ("default-src 'none'; script-src " + _sha256(asset("explain.js")) + "; style-src " +
          _sha256(asset("explain.css")) + "; img-src 'none'; connect-src " + connect +
          "; base-uri 'none'; form-action 'none'")


def script_json(obj: Any) -> str:
  """`obj` as JSON safe inside a <script> block: no string in it can close the block.

  `<`, `>` and `&` occur in JSON only inside strings, where their \\u escapes mean the same;
  U+2028/U+2029 are escaped too (they end a line in older JS parsers).

  Raises:
    DataError: `obj` holds NaN or Infinity (not JSON).
  """
  try:
    text = json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
  except ValueError as e:
    raise DataError(f"explanation page: the record is not valid JSON ({e})") from None
  for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                       ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
    text = text.replace(char, escape)
  return text


def record_dict(record: Any) -> Dict[str, Any]:
  """The "log" JSON of a `RerankResult` / `RecordError` (or such a dict), checked for the keys
  the renderer reads.

  Raises:
    DataError: naming the record and the missing key.
  """
  rec = record.to_dict() if hasattr(record, "to_dict") else record
  if not isinstance(rec, Mapping):
    raise DataError(f"explanation page: expected a result or its dict, got {type(record).__name__}")
  if rec.get("error") is None:
    missing = [k for k in RECORD_KEYS if k not in rec]
    if missing:
      raise DataError(f"explanation page: record at line {rec.get('line')} (id {rec.get('id')}) "
                      f"has no {', '.join(repr(k) for k in missing)}")
  return dict(rec)


def _page(title: str, body: str, conf: Mapping[str, Any], data: str = "",
          connect: str = "'none'", skip: bool = False) -> str:
  return _PAGE.substitute(
      csp=_csp(connect), title=html.escape(title), css=asset("explain.css"), js=asset("explain.js"),
      skip='<a class="skip" href="#graph">Skip to the sentence graph</a>\n' if skip else "",
      body=body, data=data, conf=script_json(dict(conf)))


def _title(rec: Mapping[str, Any]) -> str:
  query = rec.get("query") or ""
  short = query if len(query) <= 80 else query[:79] + "\u2026"
  return ("LoG: " + short) if rec.get("error") is None else ("LoG (not processed): " + short)


def record_page(record: Any, *, index_href: Optional[str] = None) -> str:
  """The self-contained explanation page of one record.

  Args:
    record: a `RerankResult` or `RecordError`, or its `to_dict()` (e.g. one line of
      `tools/rerank.py`'s output, or a `POST /log/rerank` answer).
    index_href: link target of the page's "All records" link (None: no link).

  Returns:
    The HTML text (UTF-8 when written).
  """
  rec = record_dict(record)
  data = f'<script type="application/json" id="log-record">{script_json(rec)}</script>\n'
  conf = {"indexHref": index_href} if index_href else {}
  return _page(_title(rec), _NOSCRIPT, conf, data=data, skip=rec.get("error") is None)


def form_page(endpoint: str = "/log/rerank", pools: Sequence[Mapping[str, Any]] = ()) -> str:
  """The page with an empty form: a question and passages, or a demo pool, are POSTed as one
  input record (`{"question", "passages": [{"title", "text"}]}`) to `endpoint` (same origin);
  the answer (a "log" record, or a list / `{"results": [...]}` holding one) is drawn by the same
  renderer as `record_page`.

  Args:
    endpoint: the same-origin path the form posts to.
    pools: demo pools offered in the form (`{"id", "input", "ctxs": [{"title", "text"}]}`).
  """
  conf = {"form": {"endpoint": endpoint, "pools": [dict(p) for p in pools]}}
  return _page("LoG-Reranker", _FORM, conf, connect="'self'")


def page_summary(record: Any, href: str) -> Dict[str, Any]:
  """One row of the index page: where the record's page is and what it holds (JSON-safe)."""
  rec = record_dict(record)
  summary = {"href": href, "line": rec.get("line"), "id": rec.get("id"), "query": rec.get("query"),
             "error": rec.get("error")}
  if rec.get("error") is None:
    summary["passages"] = len(rec["passages"])
    summary["skipped"] = [(p["index"], p["skipped"]) for p in rec["passages"] if p.get("skipped")]
    summary["top_passage"] = rec["passage_ranking"][0] if rec["passage_ranking"] else None
  return summary


def index_page(summaries: Iterable[Mapping[str, Any]]) -> str:
  """The index page of a run: one table row per record page (`page_summary` rows, in order)."""
  rows = []
  for s in summaries:
    e = html.escape
    if s.get("error") is not None:
      status = f'<td class="status-error">error: {e(str(s["error"]))}</td>'
    elif s.get("skipped"):
      status = ('<td class="status-skipped">' + str(len(s["skipped"])) + " skipped: " +
                e("; ".join(f"P{i + 1} ({why})" for i, why in s["skipped"])) + "</td>")
    else:
      status = "<td>ok</td>"
    top = s.get("top_passage")
    rows.append(
        f'<tr><td><a href="{e(s["href"], quote=True)}">{e(str(s.get("line")))}</a></td>'
        f'<td>{e(str(s.get("id") or ""))}</td><td>{e(str(s.get("query") or ""))}</td>'
        f'<td>{s.get("passages", "")}</td><td>{"" if top is None else "P" + str(top + 1)}</td>'
        f"{status}</tr>")
  body = ('<main class="log-page"><header class="page-head"><h1>LoG-Reranker: explanation pages'
          '</h1></header><table class="records"><thead><tr><th>input line</th><th>id</th>'
          "<th>question</th><th>passages</th><th>LoG's first</th><th>status</th></tr></thead>"
          "<tbody>" + "".join(rows) + "</tbody></table></main>")
  return _page("LoG-Reranker: explanation pages", body, {})


def page_file(number: int) -> str:
  """File name of the page of output record `number` (0-based position in the output)."""
  return f"record-{number + 1:05d}.html"


def _write_atomic(path: str, text: str) -> None:
  folder = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".html", dir=folder)
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_record_pages(out_dir: str, numbered: Iterable[Tuple[int, Any]]) -> List[Dict[str, Any]]:
  """Write the page of each (output position, result) into `out_dir`; return their index rows."""
  os.makedirs(out_dir, exist_ok=True)
  summaries = []
  for number, result in numbered:
    name = page_file(number)
    _write_atomic(os.path.join(out_dir, name), record_page(result, index_href=INDEX_FILE))
    summaries.append(page_summary(result, name))
  return summaries


def write_index(out_dir: str, summaries: Iterable[Mapping[str, Any]]) -> str:
  """Write `index.html` into `out_dir`; return its path."""
  path = os.path.join(out_dir, INDEX_FILE)
  _write_atomic(path, index_page(summaries))
  return path
