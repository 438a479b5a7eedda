"""The Prometheus series of one app: requests by route and status, latency, batch sizes, queue
depth, tokens, XLA compilations (GET /metrics)."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
  """The Prometheus series of one app (its own registry: several apps may share a process)."""

  def __init__(self, state):
    self.registry = r = CollectorRegistry()
    self.requests = Counter("logrerank_requests", "HTTP requests by route and status",
                            ("route", "status"), registry=r)
    self.latency = Histogram("logrerank_request_seconds", "request latency, arrival to answer",
                             ("route",), registry=r,
                             buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120))
    self.batch = Histogram("logrerank_batch_requests", "requests per engine batch", registry=r,
                           buckets=(1, 2, 4, 8, 16, 32, 64, 128))
    self.batch_seconds = Histogram("logrerank_batch_seconds", "engine time per batch",
                                   registry=r, buckets=(.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30))
    self.tokens = Counter("logrerank_tokens", "real tokens run by the local stage", registry=r)
    self.in_flight = Gauge("logrerank_requests_in_flight", "HTTP requests being handled",
                           registry=r)
    queue = Gauge("logrerank_queue_depth", "requests waiting for a batch", registry=r)
    queue.set_function(lambda: state.batcher.queue_depth() if state.batcher else 0)
    comp = Gauge("logrerank_xla_compilations", "XLA compilations of the engine since start",
                 registry=r)
    comp.set_function(lambda: (state.reranker.compile_stats()["xla_compilations"]
                               if state.reranker is not None else 0))

  def on_batch(self, requests: int, tokens: int, seconds: float) -> None:
    self.batch.observe(requests)
    self.batch_seconds.observe(seconds)
    self.tokens.inc(tokens)
