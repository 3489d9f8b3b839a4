"""The gates of flow control (``dex.server.dispatch.limits``), on a clock the test moves."""

from __future__ import annotations

import time
from typing import Any, cast

import pytest

from dex.server.dispatch.dispatcher import Dispatcher, Held, WorkerConn
from dex.server.dispatch.limits import BURST, Ask, Limit, Limits
from dex.server.dispatch.queues import Queued
from dex.server.flow import DEMAND, ModelLimits
from dex.server.handouts import concurrency_key, model_group
from dex.testing import wait_until_async
from dex.wire import AgentSpec


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


def limits_with(clock: Clock, **limit: float) -> Limits:
    limits = Limits(clock)
    limits.set("g", Limit(**limit))
    return limits


def run_for(limits: Limits, clock: Clock, seconds: float, ask: Ask, step: float = 0.01) -> int:
    """Admit calls of ``ask`` as fast as the gate lets them for ``seconds`` (each ends at
    once); how many it admitted."""
    admitted, n, end = 0, 0, clock.t + seconds
    while clock.t < end:
        n += 1
        if limits.admit("s", f"step-{n}", ask) is None:
            admitted += 1
            limits.release("s", f"step-{n}")
        else:
            clock.t += step
    return admitted


def test_calls_at_once_wait_for_a_call_to_end_and_go_in_order(clock: Clock) -> None:
    limits = limits_with(clock, concurrency=1)
    ask = Ask("g")
    assert limits.admit("s1", "a", ask) is None
    blocked = limits.admit("s2", "b", ask)
    assert blocked is not None and (blocked.limit, blocked.until) == ("concurrency", None)
    limits.park(Queued("s2", "b", "model:x", ask), blocked)
    assert limits.blocked("s2", "b") == blocked
    assert list(limits.due()) == []  # nothing ended

    limits.release("s1", "a")
    # a Step that comes now does not pass the one that waited
    assert limits.admit("s3", "c", ask) is not None
    assert list(limits.due()) == [Queued("s2", "b", "model:x", ask)]
    assert limits.admit("s2", "b", ask) is None
    assert limits.blocked("s2", "b") is None
    assert limits.running("g") == 1


def test_requests_per_minute_hold_the_rate_over_any_minute(clock: Clock) -> None:
    limits = limits_with(clock, rpm=600)
    admitted = run_for(limits, clock, 120, Ask("g"))
    # 10 a second for two minutes, plus the burst the gate allows at once
    assert 1200 <= admitted <= 1200 + 10 * BURST + 1


def test_a_request_held_by_the_rate_says_until_when(clock: Clock) -> None:
    limits = limits_with(clock, rpm=60)
    assert limits.admit("s", "1", Ask("g")) is None
    assert limits.admit("s", "2", Ask("g")) is None  # the burst: one second's worth
    blocked = limits.admit("s", "3", Ask("g"))
    assert blocked is not None and blocked.limit == "rpm"
    assert blocked.until == pytest.approx(clock.t + 1)
    limits.park(Queued("s", "3", "q", Ask("g")), blocked)
    clock.t += 1
    assert [e[1] for e in limits.due()] == ["3"]
    assert limits.admit("s", "3", Ask("g")) is None


def test_tokens_are_estimated_then_corrected_by_the_usage_reported(clock: Clock) -> None:
    limits = limits_with(clock, tpm=600)  # 10 tokens a second
    assert limits.admit("s", "1", Ask("g", tokens=10)) is None
    limits.settle("s", "1", 100)  # it used ten times what was estimated
    limits.release("s", "1")
    blocked = limits.admit("s", "2", Ask("g", tokens=10))
    assert blocked is not None and blocked.limit == "tpm"
    assert blocked.until == pytest.approx(clock.t + 10 - BURST)


def test_tokens_per_minute_hold_over_time_whatever_the_estimates(clock: Clock) -> None:
    limits = limits_with(clock, tpm=60_000)
    used, n, end = 0, 0, clock.t + 120
    while clock.t < end:
        n += 1
        if limits.admit("s", str(n), Ask("g", tokens=100)) is None:
            limits.settle("s", str(n), 1000)  # every estimate ten times too low
            limits.release("s", str(n))
            used += 1000
        else:
            clock.t += 0.01
    assert 120_000 <= used <= 120_000 + 2 * 1000 + 1000 * BURST


def test_a_refusal_closes_the_group_until_retry_after_and_halves_its_rate(clock: Clock) -> None:
    limits = limits_with(clock, rpm=600)
    assert limits.admit("s", "1", Ask("g")) is None
    limits.refused("s", "1", 30)
    limits.release("s", "1")
    blocked = limits.admit("s", "2", Ask("g"))
    assert blocked is not None and (blocked.limit, blocked.until) == ("retry_after", clock.t + 30)
    assert limits.lowered("g") == 0.5
    clock.t += 30
    assert run_for(limits, clock, 60, Ask("g")) <= 300 + 5 * BURST + 1  # half of 600 a minute
    # calls that succeed give the rate back, a tenth at a time
    for n in range(6):
        clock.t += 1
        assert limits.admit("s", f"ok-{n}", Ask("g")) is None
        limits.settle("s", f"ok-{n}", 0)
        limits.release("s", f"ok-{n}")
        assert limits.lowered("g") == pytest.approx(min(1, 0.5 + 0.1 * (n + 1)))
    assert limits.lowered("g") == 1


def test_a_refusal_without_limits_lowers_the_calls_at_once_seen(clock: Clock) -> None:
    limits = Limits(clock)
    for n in range(8):
        assert limits.admit("s", str(n), Ask("p/m")) is None
    limits.refused("s", "0", None)
    for n in range(8):
        limits.release("s", str(n))
    admitted = [n for n in range(8) if limits.admit("t", str(n), Ask("p/m")) is None]
    assert len(admitted) == 4  # half of the eight that ran when it was refused


def test_a_node_admits_its_share_of_the_calls_at_once(clock: Clock) -> None:
    limits = limits_with(clock, concurrency=4)
    limits.share = lambda: 0.5
    assert [limits.admit("s", str(n), Ask("g")) is None for n in range(3)] == [True, True, False]
    limits.share = lambda: 0.1  # a node with few partitions still admits one
    limits.release("s", "0")
    limits.release("s", "1")
    assert limits.admit("s", "x", Ask("g")) is None


def test_raising_a_limit_lets_the_waiting_go(clock: Clock) -> None:
    limits = limits_with(clock, concurrency=1)
    assert limits.admit("s", "1", Ask("g")) is None
    blocked = limits.admit("s", "2", Ask("g"))
    assert blocked is not None
    limits.park(Queued("s", "2", "q", Ask("g")), blocked)
    limits.set("g", Limit(concurrency=2))
    assert [e[1] for e in limits.due()] == ["2"]
    assert limits.admit("s", "2", Ask("g")) is None


def test_a_limit_set_at_run_time_counts_the_calls_of_its_group_running(clock: Clock) -> None:
    """A group with no limit has no gate, its calls only counted; a limit set while they
    run counts them: the running count is right, and they hold the new limit."""
    limits = Limits(clock)
    for n in range(3):
        assert limits.admit("s", str(n), Ask("p/m", tokens=10)) is None
    limits.count("s", "reclaimed", Ask("p/m"))  # one left running by a restart
    assert limits.running("p/m") == 4
    assert limits.tally() == {"p/m": (4, 0)}
    limits.set("p/m", Limit(concurrency=5))
    assert limits.running("p/m") == 4
    assert limits.admit("s", "4", Ask("p/m")) is None
    assert limits.admit("s", "5", Ask("p/m")) is not None  # five at once
    limits.settle("s", "0", 20)
    for step in ["0", "1", "2", "reclaimed"]:
        limits.release("s", step)
    assert limits.running("p/m") == 1
    limits.set("p/m", None)
    limits.release("s", "4")
    assert limits.running("p/m") == 0
    assert limits.tally() == {} and limits.groups() == []
    # without a limit again, its calls are counted and forgotten as before
    assert limits.admit("s", "6", Ask("p/m")) is None
    assert limits.tally() == {"p/m": (1, 0)}
    limits.release("s", "6")
    assert limits.tally() == {}


def test_the_tally_counts_running_and_waiting_by_key(clock: Clock) -> None:
    limits = limits_with(clock, concurrency=1)
    assert limits.admit("s", "1", Ask("g")) is None
    blocked = limits.admit("s", "2", Ask("g"))
    assert blocked is not None
    limits.park(Queued("s", "2", "q", Ask("g")), blocked)
    assert limits.admit("s", "3", Ask("p/m")) is None
    assert limits.admit("s", "4", Ask("tool:a/book=alice", concurrency=1)) is None
    assert limits.tally() == {"g": (1, 1), "p/m": (1, 0), "tool:a/book=alice": (1, 0)}
    assert limits.running("p/m") == 1


def test_tool_keys_limit_each_key_apart_and_are_forgotten_when_idle(clock: Clock) -> None:
    limits = Limits(clock)
    alice, bob = Ask("tool:a/book=alice", concurrency=1), Ask("tool:a/book=bob", concurrency=1)
    assert limits.admit("s1", "1", alice) is None
    assert limits.admit("s2", "1", bob) is None
    assert limits.admit("s3", "1", alice) is not None
    limits.release("s1", "1")
    limits.release("s2", "1")
    assert limits.groups() == []


def test_a_concurrency_key_is_the_template_with_the_arguments() -> None:
    args = {"customer_id": "c-42", "date": {"d": 1}, "n": 3}
    assert concurrency_key("{customer_id}", args) == "c-42"
    assert concurrency_key("{customer_id}:{n}:{date}", args) == 'c-42:3:{"d":1}'
    assert concurrency_key("", args) == ""
    assert concurrency_key("{missing}", args) == ""
    assert concurrency_key("per-{n}-{n}", args) == "per-3-3"
    assert concurrency_key("{n", args) == "{n"  # not a placeholder: kept as it is


def test_a_model_group_follows_a_new_version_of_the_spec() -> None:
    """The group is worked out once per spec object; a spec registered again with another
    model config is a new object, and its calls count against its new group."""
    first = AgentSpec(name="grouped", model={"provider": "p", "model": "m"})
    assert model_group(first) == model_group(first) == "p/m"
    assert model_group(AgentSpec(name="grouped", model={"group": "pool"})) == "pool"
    assert model_group(first) == "p/m"


def test_limits_refuse_bad_values() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        Limit(concurrency=0)
    with pytest.raises(ValueError, match="rpm"):
        Limit(rpm=-1)
    with pytest.raises(ValueError, match="extra"):
        Limit.model_validate({"tokens": 5})


async def test_a_second_offer_of_a_running_step_leaves_its_count_alone() -> None:
    """A Step offered twice (its first offer handed out and running) is found not queued
    by its second hand-out: its call still counts once, until its attempt ends."""
    dispatcher = Dispatcher(heartbeat_timeout=10)
    dispatcher.limits.set("g", Limit(concurrency=2))
    worker = WorkerConn(id="w", queues={"q"}, capacity=4, send=lambda message: None)
    dispatcher.connect(worker, [], None)
    handed: list[bool] = []

    async def assign(session_id: str, step_id: str, conn: WorkerConn) -> Any:
        first = not handed
        handed.append(first)
        if not first:
            return None  # running already: not queued
        deadline = time.monotonic() + 10
        dispatcher.hold(conn, "s/1.1/1", Held(session_id, step_id, 1, conn, deadline))
        return cast(Any, "the step frame")

    async def nothing(*args: Any) -> None:
        pass

    dispatcher.start(assign, nothing, nothing)
    try:
        step = Queued("s", "1.1", "q", Ask("g"))
        dispatcher.offer(step)
        dispatcher.offer(step)

        async def both() -> bool:
            return len(handed) == 2

        await wait_until_async(both, 10, what="both hand-outs")
        assert handed == [True, False]
        assert dispatcher.limits.running("g") == 1
        assert dispatcher.limits.counts("s", "1.1")
        dispatcher.unhold("s/1.1/1")
        assert dispatcher.limits.running("g") == 0
    finally:
        await dispatcher.stop()


class DemandStore:
    """The part of a store ``ModelLimits.share_by_demand`` uses: the other nodes' demand."""

    def __init__(self, others: list[tuple[str, str, int]]) -> None:
        self.others = others
        self.reported: dict[str, int] = {}

    async def exchange_demand(
        self, node: str, demand: dict[str, int], at: float, since: float
    ) -> list[tuple[str, str, int]]:
        self.reported = dict(demand)
        return self.others


async def test_nodes_share_a_groups_limits_by_their_demand(clock: Clock) -> None:
    limits = limits_with(clock, concurrency=10, rpm=600)
    limits.share = lambda: 0.5  # half the partitions
    for n in range(3):  # this node runs three calls of the group
        assert limits.admit("s", str(n), Ask("g")) is None
    store = DemandStore([("other", "g", 12), ("other", "unlimited", 9)])
    flow = ModelLimits(cast(Any, store), limits, {"g": Limit(concurrency=10, rpm=600)})
    flow.node_id = lambda: "me"
    await flow.share_by_demand()
    assert store.reported == {"g": 3}
    assert limits.shares == {"g": pytest.approx(DEMAND * 3 / 15 + (1 - DEMAND) * 0.5)}
    # a node alone with its demand takes nearly all; without any demand, the partitions
    store.others = []
    await flow.share_by_demand()
    assert limits.shares["g"] == pytest.approx(DEMAND + (1 - DEMAND) * 0.5)
    for n in range(3):
        limits.release("s", str(n))
    await flow.share_by_demand()
    assert limits.shares == {}
