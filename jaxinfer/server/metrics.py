"""Prometheus metrics of the server (``GET /metrics``): vLLM's names, under both ``vllm:`` and ``jaxinfer:``.

Every series that vLLM also has is exposed twice with the same value: as ``vllm:NAME``, so dashboards and
routers made for vLLM read it unmodified (SMG reads ``vllm:num_requests_running``, ``vllm:num_requests_waiting``
and ``vllm:kv_cache_usage_perc`` for its load-aware policies), and as ``jaxinfer:NAME``. Series vLLM does not
have (``num_compilations*``, ``engine_dead``) are ``jaxinfer:`` only. Every series carries a ``model_name``
label. Two sources:

* engine state, read at scrape time from the snapshot the engine thread publishes after each step
  (``AsyncLLMEngine.stats()``): ``num_requests_running`` / ``num_requests_waiting`` (sequences),
  ``kv_cache_usage_perc`` (1 - free / usable KV blocks; blocks held only by the prefix cache count as free),
  ``prefix_cache_queries_total`` / ``prefix_cache_hits_total`` (prompt tokens), ``num_preemptions_total``,
  ``spec_decode_num_draft_tokens_total`` / ``spec_decode_num_accepted_tokens_total``, and jaxinfer's own
  ``num_compilations_total`` / ``num_compilations_after_start_total`` and ``engine_dead``;
* per-request observations from ``AsyncLLMEngine.generate`` (``RequestObserver``): ``prompt_tokens_total``,
  ``generation_tokens_total``, ``request_success_total{finished_reason}``, and the histograms
  ``time_to_first_token_seconds``, ``inter_token_latency_seconds``,
  ``request_time_per_output_token_seconds``, ``e2e_request_latency_seconds``, ``request_prompt_tokens``,
  ``request_generation_tokens``.

Each server owns its registry (no process-global state), so several apps can live in one process.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from jaxinfer.server.async_engine import AsyncLLMEngine, RequestTimes

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                    20.0, 40.0, 80.0)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
P = "jaxinfer:"
VLLM = "vllm:"
# families vLLM exposes under the same name (without prefix; counters without their _total suffix)
VLLM_NAMES = frozenset({
    "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_queries",
    "prefix_cache_hits", "num_preemptions", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens",
    "prompt_tokens", "generation_tokens", "request_success", "time_to_first_token_seconds",
    "inter_token_latency_seconds", "request_time_per_output_token_seconds", "e2e_request_latency_seconds",
    "request_prompt_tokens", "request_generation_tokens",
})


class ServerMetrics:
    """The registry of one server; also the ``RequestObserver`` of its ``AsyncLLMEngine``."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]

        def hist(name, doc, buckets):
            return Histogram(P + name, doc, labels, registry=r, buckets=buckets).labels(model_name)

        def counter(name, doc):
            return Counter(P + name, doc, labels, registry=r).labels(model_name)

        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished and aborted requests.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens.")
        self._success = Counter(P + "request_success", "Finished requests by finish reason.",
                                labels + ["finished_reason"], registry=r)
        self.ttft = hist("time_to_first_token_seconds", "Time to first token (arrival to first token).",
                         _LATENCY_BUCKETS)
        self.itl = hist("inter_token_latency_seconds", "Time between a request's consecutive outputs.",
                        _LATENCY_BUCKETS)
        self.tpot = hist("request_time_per_output_token_seconds",
                         "Per request: (last token - first token) / (generated tokens - 1).", _LATENCY_BUCKETS)
        self.e2e = hist("e2e_request_latency_seconds", "Arrival to the last token.", _LATENCY_BUCKETS)
        self.req_prompt = hist("request_prompt_tokens", "Prompt tokens per request.", _TOKEN_BUCKETS)
        self.req_generation = hist("request_generation_tokens", "Generated tokens per request.", _TOKEN_BUCKETS)
        for reason in ("stop", "length", "abort"):
            self._success.labels(model_name, reason)
        self._engine: AsyncLLMEngine | None = None
        # what /metrics shows: every family of the registry, and the vLLM ones again under vllm:
        self._exposition = CollectorRegistry(auto_describe=False)
        self._exposition.register(_Renamed(self.registry, None))
        self._exposition.register(_Renamed(self.registry, VLLM))

    def attach(self, engine: AsyncLLMEngine) -> None:
        """Read the engine's state at each scrape and observe its requests."""
        self._engine = engine
        engine.observer = self
        self.registry.register(_EngineCollector(engine, self.model_name))

    def render(self) -> bytes:
        return generate_latest(self._exposition)

    # RequestObserver
    def on_tokens(self, num_new: int, since_last_s: float | None, ttft_s: float | None) -> None:
        self.generation_tokens.inc(num_new)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        if since_last_s is not None:
            self.itl.observe(since_last_s)

    def on_finished(self, reason: str, times: RequestTimes) -> None:
        self._success.labels(self.model_name, reason).inc()
        self.prompt_tokens.inc(times.num_prompt_tokens)
        self.req_prompt.observe(times.num_prompt_tokens)
        self.req_generation.observe(times.num_generation_tokens)
        if times.finished is not None and times.first_token is not None:
            self.e2e.observe(times.finished - times.arrival)
            if times.num_generation_tokens > 1 and times.last_token is not None:
                self.tpot.observe((times.last_token - times.first_token) / (times.num_generation_tokens - 1))


class _Renamed:
    """The families of ``registry`` as they are (``prefix=None``), or only vLLM's, renamed to ``prefix + NAME``."""

    def __init__(self, registry: CollectorRegistry, prefix: str | None):
        self.registry, self.prefix = registry, prefix

    def describe(self):
        return []

    def collect(self):
        for family in self.registry.collect():
            if self.prefix is None:
                yield family
                continue
            base = family.name[len(P):]
            if base not in VLLM_NAMES:
                continue
            renamed = Metric(self.prefix + base, family.documentation, family.type, family.unit)
            renamed.samples = [s._replace(name=self.prefix + s.name[len(P):]) for s in family.samples]
            yield renamed


class _EngineCollector:
    """Engine state as Prometheus families, computed at scrape time."""

    def __init__(self, engine: AsyncLLMEngine, model_name: str):
        self.engine, self.model_name = engine, model_name

    def describe(self):
        return []  # unchecked collector: the families are built per scrape

    def collect(self):
        s = self.engine.stats()
        name = [self.model_name]

        def gauge(key, doc, value):
            g = GaugeMetricFamily(P + key, doc, labels=["model_name"])
            g.add_metric(name, value)
            return g

        def counter(key, doc, value):
            c = CounterMetricFamily(P + key, doc, labels=["model_name"])
            c.add_metric(name, value)
            return c

        total = s["total_blocks"] or 1
        yield gauge("num_requests_running", "Sequences in the running batch.", s["num_running"])
        yield gauge("num_requests_waiting", "Sequences waiting for a slot (queued or preempted).",
                    s["num_waiting"] + s["num_queued"])
        yield gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0..1).",
                    1.0 - s["free_blocks"] / total)
        yield gauge("engine_dead", "1 once a step raised and the engine stopped.", float(self.engine.is_dead))
        yield counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                      s["prefix_cache_query_tokens"])
        yield counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.", s["prefix_cache_hit_tokens"])
        yield counter("num_preemptions", "Sequences preempted (blocks freed, recomputed later).",
                      s["num_preemptions"])
        yield counter("spec_decode_num_draft_tokens", "Speculative tokens proposed.", s["num_draft_tokens"])
        yield counter("spec_decode_num_accepted_tokens", "Speculative tokens accepted.", s["num_accepted_tokens"])
        yield counter("num_compilations", "Executables compiled or loaded from the disk cache.",
                      s["num_compilations"])
        yield counter("num_compilations_after_start", "Compilations while serving (0 with eager compilation).",
                      s["num_compilations_after_start"])
