"""The ready Steps of a queue, shared fairly between tenants (``dispatch.queues``)."""

from __future__ import annotations

from collections import Counter

from dex.server.dispatch.queues import FairQueue, Queued


def step(n: int, tenant: str = "", priority: int = 0) -> Queued:
    return Queued(f"{tenant}-s{n}", "1.1", "model:a", None, tenant, priority)


def test_without_tenants_it_is_first_come_first_served() -> None:
    queue = FairQueue(lambda tenant: 1.0)
    for n in range(5):
        queue.push(step(n))
    assert [queue.pop().session_id for _ in range(5)] == [f"-s{n}" for n in range(5)]
    assert len(queue) == 0


def test_a_tenant_with_a_thousand_queued_delays_anothers_step_by_one_at_most() -> None:
    queue = FairQueue(lambda tenant: 1.0)
    for n in range(1000):
        queue.push(step(n, "a"))
    for _ in range(10):
        queue.pop()  # it has been served a while
    queue.push(step(0, "b"))
    served = [queue.pop().tenant for _ in range(2)]
    assert "b" in served
    assert len(queue) == 989


def test_active_tenants_share_by_weight() -> None:
    queue = FairQueue(lambda tenant: {"big": 3.0}.get(tenant, 1.0))
    for n in range(1000):
        queue.push(step(n, "big"))
        queue.push(step(n, "small"))
    served = Counter(queue.pop().tenant for _ in range(400))
    assert served == {"big": 300, "small": 100}


def test_a_sessions_priority_goes_first_within_its_tenant_only() -> None:
    queue = FairQueue(lambda tenant: 1.0)
    queue.push(step(1, "a"))
    queue.push(step(2, "a"))
    queue.push(step(3, "b"))
    queue.push(step(9, "a", priority=5))
    order = [queue.pop().session_id for _ in range(4)]
    assert order == ["a-s9", "b-s3", "a-s1", "a-s2"]


def test_a_step_put_back_in_front_goes_first_of_its_tenant() -> None:
    queue = FairQueue(lambda tenant: 1.0)
    queue.push(step(1, "a", priority=7))
    queue.push(step(2, "a"), front=True)
    assert [queue.pop().session_id for _ in range(2)] == ["a-s2", "a-s1"]
