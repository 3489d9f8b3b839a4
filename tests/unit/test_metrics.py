"""The node's counters and histograms are plain numbers exported at each scrape: what
Prometheus reads must be what ``prometheus_client``'s own ``Counter`` and ``Histogram``
would have shown for the same updates."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from dex.server.metrics import SECONDS, Counts, Durations


def _exposed(registry: CollectorRegistry) -> list[str]:
    """The samples, without comments and the ``_created`` series only the library keeps."""
    return [
        line
        for line in generate_latest(registry).decode().splitlines()
        if line and not line.startswith("#") and "_created" not in line
    ]


def test_a_histogram_exports_what_prometheus_clients_own_would() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    durations = Durations("dex_wait_seconds", "Waits.", ("queue",))
    ours.register(durations)
    histogram = Histogram("dex_wait_seconds", "Waits.", ["queue"], buckets=SECONDS, registry=theirs)
    # on a bound (le: at most), between bounds, past the last one, zero
    for seconds, queue in [(0.005, "a"), (0.007, "a"), (1, "a"), (2000.0, "a"), (0.0, "b")]:
        durations.observe(seconds, queue)
        histogram.labels(queue).observe(seconds)
    assert _exposed(ours) == _exposed(theirs)
    assert 'dex_wait_seconds_bucket{le="0.005",queue="a"} 1.0' in _exposed(ours)
    assert 'dex_wait_seconds_bucket{le="+Inf",queue="a"} 4.0' in _exposed(ours)


def test_an_unlabelled_histogram_and_counter_show_zero_before_any_update() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    ours.register(Durations("dex_turn_seconds", "Turns."))
    ours.register(Counts("dex_lost", "Lost."))
    Histogram("dex_turn_seconds", "Turns.", buckets=SECONDS, registry=theirs)
    Counter("dex_lost", "Lost.", registry=theirs)
    assert _exposed(ours) == _exposed(theirs)


def test_a_counter_counts_by_labels_as_prometheus_clients_own_would() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    counts = Counts("dex_attempts", "Attempts.", ("step_type", "outcome"))
    ours.register(counts)
    counter = Counter("dex_attempts", "Attempts.", ["step_type", "outcome"], registry=theirs)
    for labels in [("RunModel", "succeeded"), ("CallTool", "failed"), ("RunModel", "succeeded")]:
        counts.inc(*labels)
        counter.labels(*labels).inc()
    assert _exposed(ours) == _exposed(theirs)
    assert 'dex_attempts_total{outcome="succeeded",step_type="RunModel"} 2.0' in _exposed(ours)
