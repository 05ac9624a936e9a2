"""The /metrics text parses as Prometheus and carries the values the server recorded."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.factories import make_request
from tropical.core.request import Request
from tropical.serve.metrics import ServerMetrics


def samples(metrics: ServerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the rendered text, keyed by name and sorted labels."""
    body, _ = metrics.render()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode()) for s in family.samples}


def value(metrics: ServerMetrics, name: str, **labels: str) -> float:
    return samples(metrics)[(name, tuple(sorted(labels.items())))]


def finished(output: int, error: str | None = None) -> Request:
    """Arrives at 0, prefill starts at 0.5, first token at 1.0, finishes 2 seconds later."""
    req = make_request(output=output)
    req.prefill_start, req.first_token, req.finish, req.error = 0.5, 1.0, 3.0, error
    return req


def test_render_has_the_prometheus_content_type() -> None:
    body, content_type = ServerMetrics().render()
    assert content_type.startswith("text/plain") and b"tropical_ttft_seconds" in body


def test_a_finished_request_feeds_all_four_latency_histograms() -> None:
    metrics = ServerMetrics()
    metrics.observe_finished(finished(output=5))
    for name, seconds in [("ttft", 1.0), ("tpot", 0.5), ("queueing", 0.5), ("e2e", 3.0)]:
        assert value(metrics, f"tropical_{name}_seconds_count") == 1
        assert value(metrics, f"tropical_{name}_seconds_sum") == pytest.approx(seconds)
    assert value(metrics, "tropical_tpot_seconds_bucket", le="0.5") == 1
    assert value(metrics, "tropical_tpot_seconds_bucket", le="0.25") == 0


def test_one_token_requests_add_no_tpot_sample() -> None:
    metrics = ServerMetrics()
    metrics.observe_finished(finished(output=1))
    assert value(metrics, "tropical_tpot_seconds_count") == 0
    assert value(metrics, "tropical_ttft_seconds_count") == 1


def test_failed_and_unfinished_requests_add_no_latency() -> None:
    metrics = ServerMetrics()
    metrics.observe_finished(finished(output=5, error="worker died"))
    metrics.observe_finished(make_request())
    assert value(metrics, "tropical_e2e_seconds_count") == 0


def test_a_request_without_milestones_adds_only_what_is_defined() -> None:
    """A request finished before its prefill started (say, refused late) has only an E2E time."""
    metrics = ServerMetrics()
    req = make_request()
    req.finish = 2.0
    metrics.observe_finished(req)
    assert value(metrics, "tropical_e2e_seconds_count") == 1
    assert value(metrics, "tropical_ttft_seconds_count") == 0
    assert value(metrics, "tropical_queueing_seconds_count") == 0


def test_counters_count_by_label() -> None:
    metrics = ServerMetrics()
    for path in ("multiplex", "multiplex", "prefill"):
        metrics.record_path(path)
    metrics.record_rejection("queue_full")
    metrics.record_request("finished")
    metrics.record_request("aborted")
    metrics.record_request("finished")
    assert value(metrics, "tropical_path_decisions_total", path="multiplex") == 2
    assert value(metrics, "tropical_path_decisions_total", path="prefill") == 1
    assert value(metrics, "tropical_rejected_total", reason="queue_full") == 1
    assert value(metrics, "tropical_requests_total", outcome="finished") == 2
    assert value(metrics, "tropical_requests_total", outcome="aborted") == 1


def test_migrations_count_time_and_tokens() -> None:
    metrics = ServerMetrics()
    metrics.record_migration(0.002, 300)
    metrics.record_migration(0.004, 100)
    assert value(metrics, "tropical_migrations_total") == 2
    assert value(metrics, "tropical_migrated_tokens_total") == 400
    assert value(metrics, "tropical_migration_seconds_count") == 2
    assert value(metrics, "tropical_migration_seconds_sum") == pytest.approx(0.006)


def test_worker_gauges_show_the_latest_state() -> None:
    metrics = ServerMetrics()
    metrics.set_worker(0, "prefill", running=3, waiting=1, kv_used_fraction=0.25, alive=True)
    metrics.set_worker(0, "prefill", running=2, waiting=0, kv_used_fraction=0.5, alive=True)
    metrics.set_worker(1, "multiplex", running=0, waiting=0, kv_used_fraction=0.0, alive=False, node="n2")
    labels = {"worker": "0", "role": "prefill", "node": "local"}
    assert value(metrics, "tropical_worker_running", **labels) == 2
    assert value(metrics, "tropical_worker_waiting", **labels) == 0
    assert value(metrics, "tropical_worker_kv_usage", **labels) == 0.5
    assert value(metrics, "tropical_worker_up", **labels) == 1
    assert value(metrics, "tropical_worker_up", worker="1", role="multiplex", node="n2") == 0


def test_a_worker_that_changes_role_keeps_one_series() -> None:
    metrics = ServerMetrics()
    metrics.set_worker(0, "prefill", running=1, waiting=0, kv_used_fraction=0.1, alive=True)
    metrics.set_worker(0, "decode", running=4, waiting=2, kv_used_fraction=0.3, alive=True)
    running = {labels: v for (name, labels), v in samples(metrics).items() if name.endswith("_running")}
    assert running == {(("node", "local"), ("role", "decode"), ("worker", "0")): 4}


def test_servers_do_not_share_metrics() -> None:
    first, second = ServerMetrics(), ServerMetrics()
    first.record_request("finished")
    assert ("tropical_requests_total", (("outcome", "finished"),)) not in samples(second)
