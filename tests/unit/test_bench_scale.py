"""``bench.scale`` writes its idle sessions as copies of a template session's rows: a copy
must be a session Dex loads and serves like the template, under its own id."""

from __future__ import annotations

from pathlib import Path

from bench.scale import TEMPLATE, Database, Restart, Size, parse_args, report

from dex.server.dispatch.dispatcher import Dispatcher
from dex.server.sessions import Sessions
from dex.server.store.sqlite import SqliteStore
from dex.wire import AgentSpec


async def test_a_copy_of_the_template_loads_as_the_template_does(tmp_path: Path) -> None:
    path = tmp_path / "dex.sqlite3"
    store = SqliteStore(path)
    await store.open()
    try:
        sessions = Sessions(store, Dispatcher(heartbeat_timeout=5))
        await sessions.register_agents([AgentSpec(name="a")])
        await sessions.create("a", TEMPLATE)
        await sessions.send(TEMPLATE, "hello", "m1")  # a turn (no Worker: it waits) ...
        await sessions.cancel(TEMPLATE, "done")  # ... that ended: history, turn and rows
        template = await sessions.reads.snapshot(TEMPLATE)
    finally:
        await store.close()

    Database(f"sqlite:///{path}").copy(["s_0001", "s_0002"])

    store = SqliteStore(path)
    await store.open()
    try:
        sessions = Sessions(store, Dispatcher(heartbeat_timeout=5))
        await sessions.start()
        copy = await sessions.reads.snapshot("s_0002")
        found = await store.find_message("s_0002", "m1")
        assert found is not None and found.number == 1
        sent, created = await sessions.send("s_0002", "more", None)
        assert (sent.turn, created) == (2, True)
    finally:
        await store.close()
    assert copy["session"]["id"] == "s_0002"
    assert str(copy).replace("s_0002", TEMPLATE) == str(template)
    assert copy["history"] and copy["current_turn"] is None


def test_the_report_names_each_sizes_count_of_touched_sessions() -> None:
    """The memory rows name what each size touched (a small baseline touches fewer idle
    sessions than the large size), not the baseline's counts for both columns."""
    restart = Restart(1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 80_000, 10, 0)
    sizes = []
    for n, half in ((10_000, "3,499"), (1_000_000, "20,000")):
        size = Size(n, restarts=[restart], created=1, create_seconds=1.0)
        size.rss_touched_kib = [(f"read half ({half} more)", 90_000), ("turns in 5,000", 99_000)]
        size.pages = {"first": (0.001, 0.001)}
        size.create_cpu = dict.fromkeys(("server", "client", "worker", "machine"), 1.0)
        sizes.append(size)
    text = report(sizes, parse_args([]))
    assert "after read half (3,499 / 20,000 more)" in text
    assert "after turns in 5,000 " in text
