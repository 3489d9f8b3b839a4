"""What a node counts, for Prometheus (``GET /metrics``), through ``prometheus_client``.

Counters and histograms are updated where things happen (after a commit: an attempt
settled, a turn ended, a Step handed out), as plain numbers in the event loop's thread
(``Counts``, ``Durations``), and exported when Prometheus scrapes, as ``prometheus_client``
collectors do for values kept elsewhere: its own ``Counter`` and ``Histogram`` take a
lock per update, and a histogram walks its buckets in Python, about 3 % of the event
loop's time a turn (cProfile at 64 sessions). Gauges and the store's and dispatcher's
own counts are read at the scrape too, so they cost nothing in between. Each node (each
app) has its own registry.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from dex.wire import ToolCallStatus

if TYPE_CHECKING:
    from dex.server.engine.state import Turn
    from dex.server.ha.node import Node
    from dex.server.store.base import TenantUsage

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
_BOUNDS = (*map(floatToGoString, SECONDS), "+Inf")
"""Each bucket's ``le``, written as ``prometheus_client``'s own histograms write it."""


class Counts(Collector):
    """A counter, by labels, kept as plain numbers (updated, and read by the scrape, in the
    event loop's thread: no lock)."""

    def __init__(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> None:
        self.name, self.doc, self.labels = name, doc, labels
        self.values: dict[tuple[str, ...], float] = {} if labels else {(): 0.0}

    def inc(self, *labels: str) -> None:
        values = self.values
        values[labels] = values.get(labels, 0.0) + 1.0

    def add(self, amount: float, *labels: str) -> None:
        values = self.values
        values[labels] = values.get(labels, 0.0) + amount

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.doc, labels=list(self.labels))
        for labels, value in list(self.values.items()):
            family.add_metric(list(labels), value)
        yield family


class Durations(Collector):
    """A histogram of seconds (buckets ``SECONDS``), by labels, kept as plain numbers."""

    def __init__(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> None:
        self.name, self.doc, self.labels = name, doc, labels
        self.rows: dict[tuple[str, ...], list[float]] = {}
        """Labels -> the count in each bucket (the last one +Inf), then the sum."""
        if not labels:
            self._row(())

    def _row(self, labels: tuple[str, ...]) -> list[float]:
        row = self.rows[labels] = [0.0] * (len(SECONDS) + 2)
        return row

    def observe(self, seconds: float, *labels: str) -> None:
        row = self.rows.get(labels) or self._row(labels)
        row[bisect_left(SECONDS, seconds)] += 1.0  # the first bucket whose bound >= it
        row[-1] += seconds

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.doc, labels=list(self.labels))
        for labels, row in list(self.rows.items()):
            buckets, total = [], 0.0
            for bound, count in zip(_BOUNDS, row, strict=False):
                total += count
                buckets.append((bound, total))
            family.add_metric(list(labels), buckets, sum_value=row[-1])
        yield family


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.attempts = Counts(
            "dex_attempts",
            "Attempts that ended, by Step type, outcome (succeeded, failed, handed_back, "
            "rate_limited) and, for a failure, attempt_progress.",
            ("step_type", "outcome", "attempt_progress"),
        )
        self.turns = Counts("dex_turns", "Turns that ended, by status.", ("status",))
        self.turn_seconds = Durations(
            "dex_turn_seconds", "Time from a turn's user message to its end."
        )
        self.step_seconds = Durations(
            "dex_step_seconds",
            "Time from a Step's creation to its end, by type (waits included).",
            ("step_type",),
        )
        self.queue_wait = Durations(
            "dex_queue_wait_seconds",
            "Time a Step waited in its queue before a Worker took it, by queue.",
            ("queue",),
        )
        self.tool_calls = Counts(
            "dex_tool_calls",
            "Tool calls of ended turns, by kind and recorded status.",
            ("kind", "status"),
        )
        self.outcome_unknown = Counts(
            "dex_outcome_unknown",
            "Tool calls whose turn ended with their outcome unknown (a write that may have "
            "run): each needs a person or a program to reconcile it.",
        )
        self.model_tokens = Counts(
            "dex_model_tokens",
            "Tokens of the model calls whose results committed, by agent, model and "
            "direction (input, output).",
            ("agent", "model", "direction"),
        )
        self.model_cost = Counts(
            "dex_model_cost_usd",
            "What the model calls whose results committed cost (US dollars, at the "
            "server's prices), by agent and model.",
            ("agent", "model"),
        )
        self.tenant_tokens = Counts(
            "dex_tenant_tokens",
            "Tokens of the model calls whose results committed on this node, by tenant and "
            "direction (input, output); sessions without a tenant are not counted here.",
            ("tenant", "direction"),
        )
        self.tenant_cost = Counts(
            "dex_tenant_cost_usd",
            "What the model calls whose results committed on this node cost (US dollars, at "
            "the server's prices), by tenant.",
            ("tenant",),
        )
        for family in (
            self.attempts,
            self.model_tokens,
            self.model_cost,
            self.tenant_tokens,
            self.tenant_cost,
            self.turns,
            self.turn_seconds,
            self.step_seconds,
            self.queue_wait,
            self.tool_calls,
            self.outcome_unknown,
        ):
            self.registry.register(family)

    def turn_ended(self, turn: Turn) -> None:
        self.turns.inc(turn.status)  # a StrEnum: its own value
        if turn.ended_at is not None:
            self.turn_seconds.observe(max(0.0, turn.ended_at - turn.started_at))
        for step in turn.steps:
            if step.ended_at is not None:
                self.step_seconds.observe(max(0.0, step.ended_at - step.created_at), step.type)
        for call in turn.tool_calls:
            status = call.status
            self.tool_calls.inc(call.kind or "unknown", status)
            if status == ToolCallStatus.OUTCOME_UNKNOWN:
                self.outcome_unknown.inc()

    def model_used(self, agent: str, model: str, usage: dict[str, int], cost_usd: float) -> None:
        """A model call's result committed: count its tokens and cost."""
        self.model_tokens.add(usage.get("input_tokens", 0), agent, model, "input")
        self.model_tokens.add(usage.get("output_tokens", 0), agent, model, "output")
        self.model_cost.add(cost_usd, agent, model)

    def tenant_used(self, used: TenantUsage) -> None:
        """A model call of a tenant's session committed: count its tokens and cost."""
        self.tenant_tokens.add(used.input_tokens, used.tenant, "input")
        self.tenant_tokens.add(used.output_tokens, used.tenant, "output")
        self.tenant_cost.add(used.cost_usd, used.tenant)

    def attempt_ended(self, step_type: str, outcome: str, progress: str = "") -> None:
        self.attempts.inc(step_type, outcome, progress)

    def watch(self, read: Callable[[], Iterator[Metric]]) -> None:
        """Add gauges (and outside counters) read at each scrape."""
        self.registry.register(_Read(read))


class _Read(Collector):
    def __init__(self, read: Callable[[], Iterator[Metric]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        return self.read()


def gauge(name: str, doc: str, value: float, **labels: str) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


ROLES = ("standby", "recovering", "active", "draining", "stopped", "stepped-down")


def node_gauges(node: Node) -> Iterator[Metric]:
    """What a node reads at each scrape: Workers, attempts, queues, the store, its role."""
    dispatcher, sessions = node.dispatcher, node.sessions
    store = node.store.counters()
    yield gauge("dex_workers_connected", "Worker connections.", len(dispatcher.workers))
    yield gauge("dex_attempts_running", "Attempts Workers hold now.", len(dispatcher.held))
    yield gauge(
        "dex_turn_waits", "Requests waiting for a turn to end now.", sessions.reads.turn_waits
    )
    depth = GaugeMetricFamily(
        "dex_queue_depth", "Steps waiting for a Worker, by queue.", labels=["queue"]
    )
    for queue, count in sorted(dispatcher.queued().items()):
        depth.add_metric([queue], count)
    yield depth
    held = GaugeMetricFamily(
        "dex_limit_waiting",
        "Steps held queued by a model group's limits, or by a tool's concurrency keys (all "
        "its keys together: tool:AGENT/TOOL), by key (docs/flow-control.md).",
        labels=["key"],
    )
    running = GaugeMetricFamily(
        "dex_limit_running", "Calls running under a limited key, by key.", labels=["key"]
    )
    counts: dict[str, list[int]] = {}
    for key, (calls, parked) in dispatcher.limits.tally().items():
        label = key.split("=", 1)[0] if key.startswith("tool:") else key
        sums = counts.setdefault(label, [0, 0])
        sums[0] += parked
        sums[1] += calls
    for label, (parked, calls) in sorted(counts.items()):
        held.add_metric([label], parked)
        running.add_metric([label], calls)
    yield held
    yield running
    yield counter(
        "dex_store_commits",
        "Durable transactions committed (each holds one or more operations).",
        store.commits,
    )
    yield counter(
        "dex_store_operations",
        "Store operations (transitions and reads) run; over commits: the group-commit size.",
        store.operations,
    )
    yield counter(
        "dex_store_busy_seconds",
        "Wall time the store's one writer spent committing batches. Its rate is how busy "
        "the writer is: near 1, commits queue behind it and it sets the node's pace.",
        store.busy_seconds,
    )
    yield counter(
        "dex_store_commit_failures",
        "Group commits that failed (a full disk, an I/O error): every write in them was "
        "refused, nothing of them written.",
        store.commit_failures,
    )
    yield counter(
        "dex_store_written_bytes",
        "Characters of JSON committed (session states, history items, turns).",
        store.bytes_written,
    )
    yield counter(
        "dex_worker_sent_bytes",
        "Bytes of frames sent to Workers (hand-outs, acknowledgements, cancels).",
        dispatcher.bytes_sent,
    )
    yield counter(
        "dex_worker_messages_refused",
        "Worker messages about an attempt the sending connection does not hold.",
        dispatcher.refused,
    )
    yield counter(
        "dex_attempts_reclaimed",
        "Attempts left running by a restart or takeover that their Worker reclaimed and "
        "ran on (instead of failing them).",
        dispatcher.reclaimed,
    )
    yield counter(
        "dex_background_retries",
        "Background writes (a timer firing, an expired attempt's failure, a recorded "
        "input's handler) that failed to commit and were tried again.",
        dispatcher.supervisor.failures,
    )
    streams = sessions.streams
    yield gauge("dex_stream_subscribers", "Subscribers of live events now.", streams.subscribers)
    yield counter(
        "dex_stream_subscribers_dropped",
        "Subscribers dropped (stream.dropped) because they fell behind the buffer.",
        streams.dropped,
    )
    yield counter(
        "dex_stream_events_lost",
        "Live events dropped before the stream store had them (Redis away, queue full).",
        getattr(streams, "lost", 0),
    )
    role = GaugeMetricFamily("dex_node_role", "1 for this node's role.", labels=["role"])
    for name in ROLES:
        role.add_metric([name], 1.0 if node.role == name else 0.0)
    yield role
    yield gauge(
        "dex_lease_epoch",
        "The highest epoch of the partitions this node took (0: none).",
        node.epoch,
    )
    cluster = node.cluster
    if cluster is not None:
        owned = GaugeMetricFamily(
            "dex_partitions", "The partitions this node holds, by state.", labels=["state"]
        )
        for state, partitions in (
            ("serving", cluster.serving),
            ("recovering", cluster.recovering),
            ("draining", cluster.draining),
        ):
            owned.add_metric([state], float(len(partitions)))
        yield owned
        yield gauge(
            "dex_cluster_nodes", "The live nodes of the cluster.", len(cluster.view.members)
        )
