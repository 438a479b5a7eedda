"""Issue 43, parts 1-2: the API key and calibrated scores, against the app served by uvicorn on
a real loopback socket (the official `cohere` SDK for the right key), plus the calibration math
(Platt fit, ECE) against hand computations.

One tiny random LoG model serves the module; its folder gets a hand-made calibration.json
(a, b chosen, not fitted: the fit is tested on synthetic data where the truth is known).
"""

import json
import math
import threading
import time

import httpx
import numpy as np
import pytest

from logrerank_jax import engine as inference
from logrerank_jax.data.inference_input import parse_inference_record
from logrerank_jax.engine.calibration import apply_calibration, passage_logits
from logrerank_jax.results import calibration as cal_lib
from test_inference import make_pools, make_tiny_model
from test_serving import _free_port

KEY = "s3cret-key-43"
# A slope below 1 spreads the tiny model's logits; b shifts them so some land below 0.5.
CAL = {"method": "platt", "a": 0.5, "b": -0.25, "fitted_on": "by hand", "n": 0}
SETTINGS = dict(row_len=256, row_buckets=(16,), node_buckets=(256,), queries_per_batch=2,
                max_query_tokens=24)


# ------------------------------------------------------------------ the calibration math


def test_platt_fit_recovers_known_slope_and_bias():
  rng = np.random.default_rng(0)
  z = rng.normal(2.0, 4.0, 200_000)
  y = rng.random(z.size) < cal_lib.calibrated(z, 0.3, -1.2)
  a, b = cal_lib.fit_platt(z, y)
  # 200k draws: the standard errors of a and b are ~0.002 and ~0.01.
  assert abs(a - 0.3) < 0.01 and abs(b + 1.2) < 0.05, (a, b)


def test_platt_fit_refuses_one_class_and_reversed_scores():
  with pytest.raises(Exception, match="one class"):
    cal_lib.fit_platt([1.0, 2.0, 3.0], [True, True, True])
  with pytest.raises(Exception, match="not positive"):
    cal_lib.fit_platt(np.arange(20.0), np.arange(20) < 10)  # high scores are the irrelevant


def test_ece_against_a_hand_computation():
  p = [0.05, 0.15, 0.12, 0.95, 1.0, 0.55]
  y = [0, 1, 0, 1, 1, 0]
  # bins of width 0.1: [0,.1): {.05|0} -> |.05-0|; [.1,.2): {.15|1, .12|0} -> |.135-.5|;
  # [.5,.6): {.55|0} -> .55; [.9,1]: {.95|1, 1.0|1} -> |.975-1|.
  want = (1 * 0.05 + 2 * 0.365 + 1 * 0.55 + 2 * 0.025) / 6
  assert cal_lib.expected_calibration_error(p, y) == pytest.approx(want, abs=1e-12)


def test_calibration_json_is_checked(tmp_path):
  assert cal_lib.read_calibration(str(tmp_path)) is None
  (tmp_path / "calibration.json").write_text(json.dumps({"method": "platt", "a": -1, "b": 0}))
  with pytest.raises(Exception, match="'a' must be > 0"):
    cal_lib.read_calibration(str(tmp_path))
  (tmp_path / "calibration.json").write_text(json.dumps({"method": "platt", "a": 1}))
  with pytest.raises(Exception, match="'b' must be a finite number"):
    cal_lib.read_calibration(str(tmp_path))


# ------------------------------------------------------- a server with a key and a calibration


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  pools = make_pools()[0]
  model = make_tiny_model(tmp_path_factory.mktemp("keys") / "model", pools)
  cal_lib.write_calibration(model, CAL)
  return model, pools


@pytest.fixture(scope="module")
def server(setup):
  """The app (key and calibration as `logrerank serve` sets them) on a uvicorn thread."""
  import uvicorn  # pylint: disable=g-import-not-at-top
  from logrerank_jax.serving import app as app_lib  # pylint: disable=g-import-not-at-top

  def load():
    rr = inference.Reranker.from_pretrained(setup[0], **SETTINGS)
    apply_calibration(rr)
    return rr
  app = app_lib.create_app(load, app_lib.ServeSettings(api_key=KEY))
  port = _free_port()
  srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
  thread = threading.Thread(target=srv.run, daemon=True)
  thread.start()
  url = f"http://127.0.0.1:{port}"
  seen = []
  deadline = time.monotonic() + 120
  while time.monotonic() < deadline:
    try:
      r = httpx.get(url + "/health")
      seen.append((r.status_code, r.json()))
      if r.status_code == 200:
        break
    except httpx.TransportError:
      pass
    time.sleep(0.02)
  else:
    raise AssertionError(f"server not ready: {seen[-3:]}")
  try:
    yield url, seen
  finally:
    srv.should_exit = True
    thread.join(30)


def test_health_is_open_and_reports_warm_up_progress(server):
  url, seen = server
  assert seen[-1] == (200, {"status": "ok"})
  for status, body in seen[:-1]:  # every warming answer says where the warm-up is
    assert status == 503 and body["status"] == "warming", body
    w = body["warmup"]
    assert w["stage"] in ("loading", "compiling"), w
    if w["stage"] == "compiling":
      assert 0 <= w["done"] <= w["total"] and w["total"] >= 2, w


@pytest.mark.parametrize("path,body", [
    ("/v2/rerank", {"model": "m", "query": "q", "documents": ["a"]}),
    ("/v1/rerank", {"query": "q", "documents": ["a"]}),
    ("/rerank", {"query": "q", "texts": ["a"]}),
    ("/log/rerank", {"input": "q", "ctxs": [{"text": "a"}]})])
def test_scoring_routes_need_the_key(server, path, body):
  url, _ = server
  for headers, why in (({}, "missing API key"), ({"Authorization": "Bearer wrong"}, "invalid"),
                       ({"Authorization": KEY}, "missing API key")):  # no Bearer scheme
    r = httpx.post(url + path, json=body, headers=headers)
    assert r.status_code == 401, (path, headers, r.text)
    assert r.headers["www-authenticate"] == "Bearer"
    err = r.json()
    assert why in err["message"] and err["error"] == err["message"], err
    assert err["error_type"] == "Unauthorized" and err["request_id"]
  assert httpx.get(url + "/info").status_code == 401
  ok = httpx.post(url + path, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
  assert ok.status_code == 200, ok.text
  # Open without the key: the probe, the metrics and the API's shape.
  for open_path in ("/health", "/metrics", "/openapi.json"):
    assert httpx.get(url + open_path).status_code == 200, open_path


def test_cohere_sdk_with_the_key_gets_calibrated_distinct_scores_in_logs_order(server, setup):
  import cohere  # pylint: disable=g-import-not-at-top
  url, _ = server
  model, pools = setup
  rr = inference.Reranker.from_pretrained(model, **SETTINGS)  # passage_logits reads logits
  with pytest.raises(Exception) as wrong:
    cohere.ClientV2(api_key="wrong", base_url=url).rerank(model="log", query="q", documents=["a"])
  assert getattr(wrong.value, "status_code", None) == 401
  co = cohere.ClientV2(api_key=KEY, base_url=url)
  for pool in pools:
    docs = [c["text"] for c in pool["ctxs"]]
    got = co.rerank(model="log", query=pool["input"], documents=docs).results
    record = parse_inference_record({"input": pool["input"],
                                                "ctxs": [{"text": d} for d in docs]})
    z, _ = passage_logits(rr, [record], [np.zeros(len(docs), bool)])
    # LoG's order is its logits' (a > 0: calibration keeps it) ...
    assert [r.index for r in got] == list(np.argsort(-z, kind="stable")), (z, got)
    scores = [r.relevance_score for r in got]
    # ... the score is the calibrated probability (float32 on the device) ...
    want = cal_lib.calibrated(np.sort(z)[::-1], CAL["a"], CAL["b"])
    np.testing.assert_allclose(scores, want, atol=1e-5)
    # ... distinct, and none at 1.0.
    assert len(set(scores)) == len(scores) and max(scores) < 1.0, scores


def test_tei_raw_scores_keep_the_logit(server, setup):
  url, _ = server
  model, pools = setup
  pool = pools[0]
  texts = [c["text"] for c in pool["ctxs"]]
  h = {"Authorization": f"Bearer {KEY}"}
  probs = httpx.post(url + "/rerank", json={"query": pool["input"], "texts": texts},
                     headers=h, timeout=60).json()
  raw = httpx.post(url + "/rerank", json={"query": pool["input"], "texts": texts,
                                          "raw_scores": True}, headers=h, timeout=60).json()
  rr = inference.Reranker.from_pretrained(model, **SETTINGS)
  record = parse_inference_record({"input": pool["input"],
                                              "ctxs": [{"text": t} for t in texts]})
  z, _ = passage_logits(rr, [record], [np.zeros(len(texts), bool)])
  for p, r in zip(probs, raw):
    assert p["index"] == r["index"]
    assert r["score"] == pytest.approx(z[r["index"]], abs=1e-3)
    assert p["score"] == pytest.approx(1 / (1 + math.exp(-(CAL["a"] * r["score"] + CAL["b"]))),
                                       abs=1e-5)


def test_key_from_env_flag_wins_and_a_warning_without_one_off_loopback(monkeypatch, caplog):
  import argparse  # pylint: disable=g-import-not-at-top
  from logrerank_jax.cli import serve  # pylint: disable=g-import-not-at-top
  from logrerank_jax.serving import auth  # pylint: disable=g-import-not-at-top
  args = lambda key, host: argparse.Namespace(api_key=key, host=host)  # noqa: E731
  monkeypatch.setenv(auth.ENV_VAR, "from-env")
  assert serve._api_key(args(None, "127.0.0.1")) == "from-env"
  assert serve._api_key(args("from-flag", "127.0.0.1")) == "from-flag"
  assert serve._api_key(args("  ", "127.0.0.1")) is None  # an empty --api-key is refused
  monkeypatch.delenv(auth.ENV_VAR)
  with caplog.at_level("WARNING", logger="logrerank_jax.serving"):
    for host in ("127.0.0.1", "localhost", "::1"):
      assert serve._api_key(args(None, host)) == ""
    assert not caplog.records
    assert serve._api_key(args(None, "0.0.0.0")) == ""
  assert "no API key" in caplog.text and "0.0.0.0" in caplog.text
  assert auth.bearer_token("bearer  abc ") == "abc" and auth.bearer_token("Basic abc") is None


def test_from_pretrained_reports_the_folders_calibrated_scores(setup, tmp_path):
  """The Python API (and `logrerank rerank`) report what the server does: with a calibration.json
  the final score is sigmoid(a z + b) of the final logit and the local score the same map of the
  local logit; `calibrated=False` keeps the raw sigmoid; the order is the logits' either way."""
  from logrerank_jax.errors import DataError  # pylint: disable=g-import-not-at-top
  model, pools = setup
  pool = pools[0]
  docs = [c["text"] for c in pool["ctxs"]]
  cal = inference.Reranker.from_pretrained(model, **SETTINGS)
  raw = inference.Reranker.from_pretrained(model, calibrated=False, **SETTINGS)
  assert cal.calibration["a"] == CAL["a"] and raw.calibration is None
  record = parse_inference_record({"input": pool["input"], "ctxs": [{"text": d} for d in docs]})
  z, _ = passage_logits(raw, [record], [np.zeros(len(docs), bool)])
  for rr, a, b in ((cal, CAL["a"], CAL["b"]), (raw, 1.0, 0.0)):
    ranked = rr.rank(pool["input"], docs)
    assert [p.index for p in ranked] == list(np.argsort(-z, kind="stable"))
    # float32 on the device against float64 here: sigmoid's float32 rounding is < 1e-7 absolute.
    np.testing.assert_allclose([p.score for p in ranked], cal_lib.calibrated(np.sort(z)[::-1], a, b),
                               atol=1e-5)
    res = rr.score([record])[0]
    np.testing.assert_allclose(res.local_score, cal_lib.calibrated(res.local_logit, a, b), atol=1e-6)
  # A calibration.json beside a model without a global stage is named, not ignored.
  import dataclasses  # pylint: disable=g-import-not-at-top
  from logrerank_jax.models import model_folder  # pylint: disable=g-import-not-at-top
  params, cfg, tok = model_folder.load_model(model)
  model_folder.save_model(str(tmp_path / "localonly"), {"local": params["local"]},
                          dataclasses.replace(cfg, use_global=False), tok)
  cal_lib.write_calibration(str(tmp_path / "localonly"), CAL)
  with pytest.raises(DataError, match="no global stage"):
    inference.Reranker.from_pretrained(str(tmp_path / "localonly"), **SETTINGS)
