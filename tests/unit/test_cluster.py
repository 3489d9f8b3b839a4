"""How nodes share the partitions out (``plan``, ``share``: pure functions of the view)
and where a session's call goes (``Cluster.route``)."""

from __future__ import annotations

import itertools

import pytest

from dex.errors import Unavailable
from dex.server.ha.cluster import Cluster, Member, Plan, View, plan, share
from dex.server.store.partitions import partition_of

COUNT = 64


def view(
    owners: dict[int, str],
    live: list[str],
    standby: tuple[str, ...] = (),
    leader: str | None = None,
) -> View:
    """A view with ``live`` nodes (addresses ``http://{id}``) and ``owners``."""
    members = {
        n: Member(
            n, f"http://{n}", n in standby, tuple(sorted(p for p, o in owners.items() if o == n))
        )
        for n in live
    }
    return View(members, dict(owners), leader)


def owned_by(owners: dict[int, str], node: str) -> set[int]:
    return {p for p, o in owners.items() if o == node}


def converge(
    owners: dict[int, str], live: list[str], standby: tuple[str, ...] = ()
) -> dict[int, str]:
    """Run every node's plan at each ping, as ``Node._on_view`` does (a take is granted
    if the partition is still free when the node asks, as a lock is; a give frees at once)
    until nobody wants a change. Returns the owners."""
    owners = dict(owners)
    for _ in range(20):
        changed = False
        for node in live:
            p = plan(
                view(owners, live, standby), node, node in standby, COUNT, owned_by(owners, node)
            )
            for part in p.give:
                assert owners.pop(part) == node
                changed = True
            for part in p.take:
                if part not in owners:
                    owners[part] = node
                    changed = True
        if not changed:
            return owners
    raise AssertionError("the plans never settle")


def counts(owners: dict[int, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for node in owners.values():
        out[node] = out.get(node, 0) + 1
    return out


@pytest.mark.parametrize(
    ("nodes", "shares"),
    [(["a"], [64]), (["a", "b"], [32, 32]), (["a", "b", "c"], [22, 21, 21])],
)
def test_shares_of_64_partitions_are_even_within_one_and_cover_all(
    nodes: list[str], shares: list[int]
) -> None:
    assert [share(COUNT, nodes, n) for n in nodes] == shares
    assert [share(COUNT, list(reversed(nodes)), n) for n in nodes] == shares  # sorted ids
    assert share(COUNT, nodes, "stranger") == 0
    assert counts(converge({}, nodes)) == dict(zip(nodes, shares, strict=True))


def test_a_lone_node_takes_every_free_partition() -> None:
    assert plan(view({}, ["a"]), "a", False, COUNT, set()) == Plan(list(range(COUNT)), [])


def test_a_joining_node_makes_each_over_share_node_give_exactly_its_surplus() -> None:
    owners = {p: "a" if p < 32 else "b" for p in range(COUNT)}
    live = ["a", "b", "c"]
    v = view(owners, live)

    a = plan(v, "a", False, COUNT, owned_by(owners, "a"))
    b = plan(v, "b", False, COUNT, owned_by(owners, "b"))
    c = plan(v, "c", False, COUNT, set())

    assert a == Plan([], list(range(22, 32)))  # 32 - 22: its highest ten
    assert b == Plan([], list(range(53, 64)))  # 32 - 21
    assert c == Plan([], [])  # nothing free yet: it waits for the hand-over
    # once they are freed, the newcomer takes them, and nobody moves again
    after = {p: o for p, o in owners.items() if p not in a.give and p not in b.give}
    assert plan(view(after, live), "c", False, COUNT, set()) == Plan(sorted(a.give + b.give), [])
    settled = converge(after, live)
    assert counts(settled) == {"a": 22, "b": 21, "c": 21}
    assert {p for p, o in settled.items() if o != owners[p]} == set(a.give + b.give)


def test_a_dead_nodes_partitions_are_taken_by_the_nodes_under_their_share() -> None:
    owners = {p: "abc"[min(p // 22, 2)] for p in range(COUNT)}  # a 22, b 22, c 20
    dead = owned_by(owners, "c")
    alive = {p: o for p, o in owners.items() if o != "c"}  # c's locks are free at once
    live = ["a", "b"]
    v = view(alive, live)

    a = plan(v, "a", False, COUNT, owned_by(alive, "a"))
    b = plan(v, "b", False, COUNT, owned_by(alive, "b"))

    assert a.give == [] and b.give == []
    assert len(a.take) == 10 and len(b.take) == 10  # 32 - 22 each
    assert set(a.take) <= dead and set(b.take) <= dead  # the same ones: a lock decides
    settled = converge(alive, live)
    assert counts(settled) == {"a": 32, "b": 32}
    assert {p for p, o in settled.items() if o != owners[p]} == dead


def test_a_standby_takes_nothing_while_another_node_lives() -> None:
    owners = {p: "a" for p in range(COUNT - 1)}  # one partition free
    v = view(owners, ["a", "s"], standby=("s",), leader=None)

    assert plan(v, "s", True, COUNT, set()) == Plan([], [], lead=False)
    # and a standby that stood in gives everything back when a node comes
    mine = {p: "s" for p in range(COUNT)}
    back = view(mine, ["a", "s"], standby=("s",), leader="s")
    assert plan(back, "s", True, COUNT, set(mine)) == Plan([], list(range(COUNT)))
    assert converge({}, ["a", "s"], standby=("s",)) == {p: "a" for p in range(COUNT)}


def test_a_standby_asks_to_lead_when_nobody_leads_and_takes_everything_once_it_leads() -> None:
    alone = view({}, ["s", "t"], standby=("s", "t"))
    assert plan(alone, "s", True, COUNT, set()) == Plan([], [], lead=True)

    led_by_t = view({}, ["s", "t"], standby=("s", "t"), leader="t")
    assert plan(led_by_t, "s", True, COUNT, set()) == Plan([], [], lead=False)
    assert plan(led_by_t, "t", True, COUNT, set()) == Plan(list(range(COUNT)), [])


def test_partitions_being_taken_are_not_asked_for_twice() -> None:
    pending = set(range(10))
    v = view({}, ["a", "b"])

    first = plan(v, "a", False, COUNT, set(), pending)

    assert first.take == list(range(10, 32))  # 32 - 10 more, none of those pending
    everything = plan(v, "a", False, COUNT, set(), set(range(32)))
    assert everything == Plan([], [])
    # owned and pending together make the share: nothing more
    assert plan(v, "a", False, COUNT, set(range(20)), set(range(20, 32))) == Plan([], [])


def id_in(partition: int) -> str:
    return next(
        s for s in (f"s{i}" for i in itertools.count()) if partition_of(s, COUNT) == partition
    )


def test_route_serves_here_sends_to_the_owner_or_says_unavailable() -> None:
    cluster = Cluster("a", COUNT, standby=False)
    cluster.serving = {0}
    cluster.draining = {1}
    cluster.recovering = {2}
    cluster.view = view({0: "a", 1: "a", 2: "a", 3: "b", 5: "gone"}, ["a", "b"])
    cluster.view.members["c"] = Member("c", "", False, (4,))
    cluster.view.owners[4] = "c"

    assert cluster.route(id_in(0)) is None  # serving
    assert cluster.route(id_in(1)) is None  # draining: still answers for it
    assert cluster.route(id_in(3)) == "http://b"
    for p in (2, 4, 5, 6):  # recovering; an owner with no address; not live; nobody's
        with pytest.raises(Unavailable) as e:
            cluster.route(id_in(p))
        assert e.value.details == {"session_id": id_in(p)}
