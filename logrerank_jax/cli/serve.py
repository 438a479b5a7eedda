"""Serve a LoG-Reranker model over HTTP where RAG pipelines call rerankers.

  logrerank serve --checkpoint DIR [--host 127.0.0.1] [--port 8000] \
      [--max-batch-tokens N] [--max-queue N] [--max-documents N] [--timeout S] \
      [--batch-window-ms MS] [--max-body-bytes N] [--queries-per-batch 4] [--row-len N] \
      [--row-buckets 1,2,...] [--node-buckets ...] [--max-query-tokens N] [--local-slots N] \
      [--model-name NAME] [--compilation-cache DIR | --no-compilation-cache] [--api-key KEY]

DIR is a model folder or a training workdir (as `Reranker.from_pretrained` takes). The server
listens at once; the model loads and every bucket shape compiles on a thread (`GET /health` is
503 until then, 200 after), so live traffic compiles nothing. Routes: `POST /v2/rerank` (Cohere
v2, with `relevant_spans`), `POST /v1/rerank` (Jina / vLLM), `POST /rerank` (TEI `texts` or
Jina `documents`), `POST /log/rerank` (LoG's full record), `GET /info`, `GET /metrics`,
`GET /docs`; see docs/SERVING.md. One process serves all of its host's local devices.

`--api-key KEY` (or $LOGRERANK_API_KEY, which keeps the key off the command line; the flag
wins): the scoring routes and /info answer 401 without `Authorization: Bearer KEY`
(`serving.auth`). A model folder with a `calibration.json` (`logrerank calibrate`) serves
calibrated probabilities as `relevance_score`.

SIGTERM or Ctrl-C: intake stops, in-flight requests are answered, exit status 0. Exit status 1:
the model could not be loaded (the message names why), or the port could not be bound.
Needs the `serve` extra: pip install -e ".[serve]". `python tools/serve.py ARGS` runs this
command too (same flags and exit status).
"""

import argparse
import logging
import os
import signal
import sys


def parse_args(argv=None, prog=None):
  """Parse the command line."""
  # The defaults' homes import neither JAX nor the HTTP stack: `--help` answers at once.
  from logrerank_jax.engine import defaults  # pylint: disable=g-import-not-at-top
  from logrerank_jax.serving import settings  # pylint: disable=g-import-not-at-top
  p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
  p.add_argument("--checkpoint", required=True, help="model folder or training workdir")
  p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
  p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
  p.add_argument("--max-batch-tokens", type=int, default=defaults.DEFAULT_MAX_BATCH_TOKENS,
                 help="real tokens gathered into one engine batch (default "
                      f"{defaults.DEFAULT_MAX_BATCH_TOKENS}); a larger request goes alone")
  p.add_argument("--max-queue", type=int, default=defaults.DEFAULT_MAX_QUEUE,
                 help="requests waiting for the engine before new ones get 429 (default "
                      f"{defaults.DEFAULT_MAX_QUEUE})")
  p.add_argument("--max-documents", type=int, default=settings.DEFAULT_MAX_DOCUMENTS,
                 help=f"documents per request (default {settings.DEFAULT_MAX_DOCUMENTS}); more: 422")
  p.add_argument("--timeout", type=float, default=settings.DEFAULT_TIMEOUT_S,
                 help="seconds from arrival to answer before a request gets 504 (default "
                      f"{settings.DEFAULT_TIMEOUT_S:g})")
  p.add_argument("--batch-window-ms", type=float, default=1000 * defaults.DEFAULT_WINDOW_S,
                 help="how long an idle engine waits for more requests after the first "
                      f"(default {1000 * defaults.DEFAULT_WINDOW_S:g})")
  p.add_argument("--max-body-bytes", type=int, default=settings.DEFAULT_MAX_BODY_BYTES,
                 help=f"largest request body (default {settings.DEFAULT_MAX_BODY_BYTES}); more: 413")
  p.add_argument("--model-name", default="",
                 help="the name responses report as `model` (default: the folder's name)")
  p.add_argument("--queries-per-batch", type=int, default=4, help="queries per global-stage call")
  p.add_argument("--row-len", type=int, default=None, help="packed row length (as tools/rerank.py)")
  p.add_argument("--row-buckets", default=None, help="comma-separated rows per local call")
  p.add_argument("--node-buckets", default=None, help="comma-separated node buckets")
  p.add_argument("--max-query-tokens", type=int, default=None, help="query token limit")
  p.add_argument("--local-slots", type=int, default=None, help="query slots per local call")
  p.add_argument("--compilation-cache", default=None,
                 help="folder of the compiled programs a restart loads (default "
                      "$LOGRERANK_JAX_COMPILATION_CACHE or ~/.cache/logrerank_jax/xla)")
  p.add_argument("--no-compilation-cache", action="store_true",
                 help="keep no compiled program: every start compiles")
  p.add_argument("--api-key", default=None,
                 help="require 'Authorization: Bearer KEY' on the scoring routes and /info "
                      "(default $LOGRERANK_API_KEY; unset: open)")
  p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
  return p.parse_args(argv)


def _int_list(text, flag):
  try:
    return tuple(int(x) for x in text.split(",") if x.strip())
  except ValueError:
    raise SystemExit(f"serve: error: {flag} must be comma-separated integers, got {text!r}")


def _prepared(rr, store):
  """The reranker serving its folder's calibrated probability when it has calibration.json,
  and keeping its compiled programs in `store` (a restart loads them)."""
  from logrerank_jax.engine.calibration import apply_calibration  # pylint: disable=g-import-not-at-top
  rr.engine.executable_store = store
  cal = apply_calibration(rr)
  log = logging.getLogger("logrerank_jax.serving")
  if cal is None:
    log.info("no calibration.json: relevance_score is the raw sigmoid of LoG's logit")
  else:
    log.info("calibrated scores: sigmoid(%.4g * logit + %.4g), fitted on %s", cal["a"], cal["b"],
             cal.get("fitted_on", "?"))
  return rr


def _api_key(args):
  """The key (the flag, else $LOGRERANK_API_KEY; "" none), None for an empty --api-key; warns
  when there is none and the host is reachable from other machines."""
  from logrerank_jax.serving import auth  # pylint: disable=g-import-not-at-top
  if args.api_key is not None and not args.api_key.strip():
    return None
  key = (os.environ.get(auth.ENV_VAR, "") if args.api_key is None else args.api_key).strip()
  if not key and not auth.is_loopback(args.host):
    logging.getLogger("logrerank_jax.serving").warning(
        "no API key (--api-key or $%s) while listening on %s: anyone who can reach the port "
        "can use the server", auth.ENV_VAR, args.host)
  return key


def main(argv=None, prog=None) -> int:
  """Run the server until SIGTERM / Ctrl-C; return the exit status."""
  args = parse_args(argv, prog)
  # Our lines (the access log, warm-up, faults) at --log-level; other libraries' INFO chatter
  # (absl, orbax) stays out. `force`: an imported library may have configured the root already.
  logging.basicConfig(level=logging.WARNING, stream=sys.stderr, force=True,
                      format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  logging.getLogger("logrerank_jax").setLevel(args.log_level.upper())
  try:
    import uvicorn  # pylint: disable=g-import-not-at-top  (the serve extra, as fastapi)
    from logrerank_jax.serving import app as app_lib  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise SystemExit(f"serve: error: {e}; install the serving extra: pip install -e \".[serve]\"")
  import logrerank_jax  # pylint: disable=g-import-not-at-top
  from logrerank_jax import compilation  # pylint: disable=g-import-not-at-top
  from logrerank_jax.engine import executable_store  # pylint: disable=g-import-not-at-top
  from logrerank_jax.errors import LogRerankError  # pylint: disable=g-import-not-at-top
  from logrerank_jax.models.model_folder import resolve_model_dir  # pylint: disable=g-import-not-at-top
  for name in ("max_batch_tokens", "max_queue", "max_documents", "max_body_bytes"):
    if getattr(args, name) < 1:
      print(f"serve: error: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
      return 1
  if not args.timeout > 0 or not args.batch_window_ms >= 0:
    print("serve: error: --timeout must be > 0 and --batch-window-ms >= 0", file=sys.stderr)
    return 1
  api_key = _api_key(args)
  if api_key is None:
    print("serve: error: --api-key is empty", file=sys.stderr)
    return 1
  try:
    model_dir = resolve_model_dir(args.checkpoint)  # a wrong path fails now, not in the thread
  except LogRerankError as e:
    print(f"serve: error: {e}", file=sys.stderr)
    return 1
  store = None
  if not args.no_compilation_cache:  # compiled programs kept for a fast restart
    store = executable_store.server_store(
        args.compilation_cache or compilation.default_compilation_cache_dir())
  buckets = {k: _int_list(v, f"--{k.replace('_', '-')}") for k, v in
             (("row_buckets", args.row_buckets), ("node_buckets", args.node_buckets)) if v}

  def load():
    rr = logrerank_jax.Reranker.from_pretrained(
        model_dir, queries_per_batch=args.queries_per_batch, row_len=args.row_len,
        max_query_tokens=args.max_query_tokens, local_slots=args.local_slots, **buckets)
    return _prepared(rr, store)

  name = args.model_name or os.path.basename(os.path.normpath(args.checkpoint))
  settings = app_lib.ServeSettings(
      model_name=name, max_batch_tokens=args.max_batch_tokens, max_queue=args.max_queue,
      max_documents=args.max_documents, timeout_s=args.timeout,
      window_s=args.batch_window_ms / 1000.0, max_body_bytes=args.max_body_bytes,
      api_key=api_key)
  failed = []
  server = None

  def on_fatal(e):
    failed.append(e)
    if server is not None:
      server.should_exit = True  # uvicorn shuts down; main returns 1

  app = app_lib.create_app(load, settings, on_fatal=on_fatal, version=logrerank_jax.__version__)
  config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                          access_log=False,  # the app writes its own line per request
                          timeout_graceful_shutdown=None)  # in-flight requests are answered
  server = uvicorn.Server(config)
  # Uvicorn re-raises the SIGTERM/SIGINT it caught after its graceful shutdown, under the
  # handler that was installed before it started; a no-op one lets the drained server exit 0.
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: None)
  server.run()
  if failed:
    return 1
  return 0 if server.started else 1

