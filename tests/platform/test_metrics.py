"""Metrics: names and values in the exposition, per-app registries, bounded label values."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client.parser import text_string_to_metric_families

from loraplex.engine.stats import AdapterLoad, EngineStats, LoRAStats, ResidentAdapter
from loraplex.platform.metrics import OTHER, Metrics


def _samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.render().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return _samples(metrics).get((name, tuple(sorted(labels.items()))))


def test_request_metrics_rendered() -> None:
    metrics = Metrics()
    metrics.observe_request(
        "acme", "support-bot", "ok", prompt_tokens=12, completion_tokens=5,
        ttft_s=0.2, e2e_s=1.1, inter_token_s=[0.05, 0.07, 0.06, 0.05],
    )  # fmt: skip
    metrics.observe_request("acme", "support-bot", "aborted", prompt_tokens=3)
    metrics.observe_rate_limited("acme", "tokens")
    metrics.observe_ratelimit_fallback()
    metrics.observe_adapter_load(AdapterLoad("support-bot", "gpu", 0.3))
    metrics.request_started("acme")
    text = metrics.render().decode()
    for name in (
        "loraplex_requests_total",
        "loraplex_tokens_total",
        "loraplex_time_to_first_token_seconds_bucket",
        "loraplex_inter_token_latency_seconds_bucket",
        "loraplex_e2e_request_latency_seconds_bucket",
        "loraplex_rate_limited_total",
        "loraplex_ratelimit_fallback_total",
        "loraplex_adapter_load_seconds_bucket",
        "loraplex_requests_in_flight",
    ):
        assert name in text, name
    ta = {"tenant": "acme", "adapter": "support-bot"}
    assert _value(metrics, "loraplex_requests_total", **ta, status="ok") == 1
    assert _value(metrics, "loraplex_requests_total", **ta, status="aborted") == 1
    assert _value(metrics, "loraplex_tokens_total", **ta, kind="prompt") == 15
    assert _value(metrics, "loraplex_tokens_total", **ta, kind="completion") == 5
    assert _value(metrics, "loraplex_inter_token_latency_seconds_count", **ta) == 4
    assert _value(metrics, "loraplex_time_to_first_token_seconds_count", **ta) == 1
    assert _value(metrics, "loraplex_e2e_request_latency_seconds_sum", **ta) == 1.1
    assert _value(metrics, "loraplex_rate_limited_total", tenant="acme", kind="tokens") == 1
    assert _value(metrics, "loraplex_ratelimit_fallback_total") == 1
    assert _value(metrics, "loraplex_requests_in_flight", tenant="acme") == 1
    assert metrics.content_type.startswith("text/plain")


def test_engine_gauges() -> None:
    metrics = Metrics()
    lora = LoRAStats(
        num_registered=6,
        resident=(
            ResidentAdapter(1, "a", "gpu"),
            ResidentAdapter(2, "b", "gpu"),
            *(ResidentAdapter(i, f"c{i}", "cpu") for i in range(3, 8)),
        ),
        num_gpu_loads=6,
        num_gpu_evictions=2,
        num_adapter_waits=3,
        adapter_wait_seconds=0.75,
    )
    stats = EngineStats(
        num_running=4,
        num_waiting=7,
        num_swapped=1,
        num_waiting_tokens=900,
        kv_blocks_used=30,
        kv_blocks_total=120,
        num_preemptions_swap=3,
        num_preemptions_recompute=1,
        prefix_cache_queried_tokens=100,
        prefix_cache_hit_tokens=40,
        throughput_tokens_per_s=512.5,
        num_steps=12,
        num_scheduled_tokens=4000,
        step_seconds=1.5,
        lora=lora,
    )
    metrics.update_engine_gauges(stats)
    assert _value(metrics, "loraplex_engine_num_requests_running") == 4
    assert _value(metrics, "loraplex_engine_num_requests_waiting") == 7
    assert _value(metrics, "loraplex_engine_num_requests_swapped") == 1
    assert _value(metrics, "loraplex_engine_num_waiting_tokens") == 900
    assert _value(metrics, "loraplex_engine_kv_blocks_used") == 30
    assert _value(metrics, "loraplex_engine_kv_blocks_total") == 120
    assert _value(metrics, "loraplex_engine_kv_usage_ratio") == 0.25
    assert _value(metrics, "loraplex_engine_loaded_adapters", tier="gpu") == 2
    assert _value(metrics, "loraplex_engine_loaded_adapters", tier="cpu") == 5
    assert _value(metrics, "loraplex_engine_adapter_resident", adapter="a", tier="gpu") == 1
    assert _value(metrics, "loraplex_engine_preemptions_total", mode="swap") == 3
    assert _value(metrics, "loraplex_engine_prefix_cache_hit_rate") == 0.4
    assert _value(metrics, "loraplex_engine_throughput_tokens_per_second") == 512.5
    assert _value(metrics, "loraplex_engine_adapter_events_total", event="load") == 6
    assert _value(metrics, "loraplex_engine_adapter_waits_total") == 3
    assert _value(metrics, "loraplex_engine_adapter_wait_seconds_total") == 0.75
    assert _value(metrics, "loraplex_engine_steps_total") == 12
    assert _value(metrics, "loraplex_engine_scheduled_tokens_total") == 4000
    assert _value(metrics, "loraplex_engine_step_seconds_total") == 1.5

    # Cumulative counts advance by their increase; a drop means an engine restart.
    stats = replace(
        stats,
        num_preemptions_swap=5,
        lora=replace(lora, num_gpu_loads=2, resident=(ResidentAdapter(2, "b", "gpu"),)),
    )
    metrics.update_engine_gauges(stats)
    assert _value(metrics, "loraplex_engine_preemptions_total", mode="swap") == 5
    assert _value(metrics, "loraplex_engine_preemptions_total", mode="recompute") == 1
    assert _value(metrics, "loraplex_engine_adapter_events_total", event="load") == 8
    assert _value(metrics, "loraplex_engine_adapter_resident", adapter="a", tier="gpu") is None
    assert _value(metrics, "loraplex_engine_adapter_resident", adapter="b", tier="gpu") == 1


def test_adapter_loads_feed_the_histogram() -> None:
    metrics = Metrics()
    metrics.observe_adapter_load(AdapterLoad("support", "cpu", 0.3))
    labels = {"adapter": "support", "tier": "cpu"}
    assert _value(metrics, "loraplex_adapter_load_seconds_count", **labels) == 1
    assert _value(metrics, "loraplex_adapter_load_seconds_sum", **labels) == 0.3


def test_two_apps_have_separate_registries() -> None:
    one, two = Metrics(), Metrics()
    one.observe_request("t", "base", "ok")
    assert _value(one, "loraplex_requests_total", tenant="t", adapter="base", status="ok") == 1
    assert _value(two, "loraplex_requests_total", tenant="t", adapter="base", status="ok") is None


def test_label_values_are_bounded() -> None:
    metrics = Metrics(max_label_values=2)
    for i in range(5):
        metrics.observe_request(f"tenant-{i}", f"adapter-{i}", "ok")
    tenants = {
        dict(labels)["tenant"]
        for (name, labels) in _samples(metrics)
        if name == "loraplex_requests_total"
    }
    assert tenants == {"tenant-0", "tenant-1", OTHER}
    labels = {"tenant": OTHER, "adapter": OTHER, "status": "ok"}
    assert _value(metrics, "loraplex_requests_total", **labels) == 3
