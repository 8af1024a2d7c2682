"""``GET /metrics`` exposes vLLM's series under ``vllm:`` and ``jaxinfer:`` with equal values (what SMG and vLLM
dashboards read), and jaxinfer's own series only under ``jaxinfer:``. No engine: a stand-in with ``stats()``."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from jaxinfer.server.async_engine import RequestTimes  # noqa: E402
from jaxinfer.server.metrics import VLLM_NAMES, ServerMetrics  # noqa: E402


class _Engine:
    is_dead = False
    observer = None

    def stats(self):
        return {"total_blocks": 100, "free_blocks": 75, "num_running": 3, "num_waiting": 2, "num_queued": 1,
                "prefix_cache_query_tokens": 640, "prefix_cache_hit_tokens": 512, "num_preemptions": 4,
                "num_draft_tokens": 9, "num_accepted_tokens": 5, "num_compilations": 11,
                "num_compilations_after_start": 0}


def _samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_vllm_names_mirror_jaxinfer_names():
    m = ServerMetrics("tiny")
    m.attach(_Engine())
    m.on_tokens(1, None, 0.25)
    m.on_tokens(2, 0.01, None)
    m.on_finished("length", RequestTimes(arrival=1.0, num_prompt_tokens=7, first_token=1.25, last_token=1.5,
                                         finished=1.5, num_generation_tokens=3))
    samples = _samples(m.render().decode())
    label = (("model_name", "tiny"),)
    assert samples[("vllm:num_requests_running", label)] == 3
    assert samples[("vllm:num_requests_waiting", label)] == 3  # waiting + queued
    assert samples[("vllm:kv_cache_usage_perc", label)] == pytest.approx(0.25)
    assert samples[("vllm:prefix_cache_hits_total", label)] == 512
    assert samples[("vllm:generation_tokens_total", label)] == 3
    assert samples[("vllm:prompt_tokens_total", label)] == 7
    assert samples[("vllm:time_to_first_token_seconds_count", label)] == 1
    assert samples[("vllm:request_success_total", (("finished_reason", "length"), ("model_name", "tiny")))] == 1
    vllm = {k for k in samples if k[0].startswith("vllm:")}
    assert len(vllm) > 50  # histogram buckets included
    for name, labels in vllm:
        assert samples[("jaxinfer:" + name[len("vllm:"):], labels)] == samples[(name, labels)]
    families = {name.split(":", 1)[1] for name, _ in vllm}
    assert {"num_requests_running", "kv_cache_usage_perc", "e2e_request_latency_seconds_sum"} <= families
    # jaxinfer's own series are not passed off as vLLM's
    assert ("jaxinfer:engine_dead", label) in samples and not any("engine_dead" in k[0] for k in vllm)
    assert ("jaxinfer:num_compilations_total", label) in samples
    assert not any("compilations" in k[0] for k in vllm)
    assert "num_compilations" not in VLLM_NAMES
