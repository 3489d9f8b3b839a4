"""A cluster under load: nodes join and take their share, a node steps down and hands its
partitions over after draining them, a node that hangs is taken over and can change
nothing once resumed. Every turn a client sent completes once, whatever moved."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psycopg

import dex
from dex.testing import wait_until
from tests.e2e.test_step_down import step_down
from tests.support.rig import PARTITIONS, Rig, partitions_served


class Load:
    """One thread per session, each sending its next message once the last turn ended,
    through any node (every node answers: the call is forwarded to the owner), each
    message with an id of its own so that a send repeated across a gap counts once."""

    def __init__(self, address: str, sessions: list[str]) -> None:
        self.address = address
        self.sent: dict[str, int] = dict.fromkeys(sessions, 0)
        self.problems: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(s,)) for s in sessions]

    def start(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def _run(self, session_id: str) -> None:
        with dex.SyncClient(self.address, timeout=60) as client:
            n = 0
            while not self._stop.is_set():
                n += 1
                text = f"m{n}"
                try:
                    turn = client.send_message(
                        session_id, text, message_id=f"{session_id}-{n}", wait=True
                    )
                except dex.DexError as e:
                    self.problems.append(f"{session_id} {text}: {e}")
                    return
                if turn.get("status") != "completed" or turn.get("text") != f"echo: {text}":
                    self.problems.append(f"{session_id} {text}: {turn}")
                    return
                self.sent[session_id] = n

    def turns(self) -> int:
        return sum(self.sent.values())

    def wait_more(self, turns: int) -> None:
        """Until ``turns`` more turns have completed than now."""
        goal = self.turns() + turns
        wait_until(lambda: self.turns() >= goal, 30, what=f"{turns} more turns")

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


def served(rig: Rig) -> list[int]:
    """How many partitions each live node serves, fewest first (-1: one in hand)."""
    counts = [partitions_served(n) for n in rig.nodes if n.alive]
    return sorted(-1 if count is None else count for count in counts)


def test_nodes_join_and_step_down_under_load_and_every_turn_completes_once(
    tmp_path: Path, postgres_url: str
) -> None:
    rig = Rig(tmp_path, postgres_url, standby=False, cluster=3)
    a, b, c = rig.nodes
    try:
        a.start()
        # a node that owns no partition yet answers a creation with a 503, which a client
        # does not repeat (a POST without an id): A serves once it took them (under load,
        # a second or two after it answers /readyz)
        wait_until(lambda: partitions_served(a) == PARTITIONS, 20, what="A took every partition")
        rig.start_worker()
        sessions = [rig.session() for _ in range(6)]
        load = Load(rig.address, sessions).start()
        wait_until(lambda: load.turns() >= 30, 30, what="turns on one node")

        for joining in (b, c):  # each joins under load and takes its share
            joining.start()
            wait_until(lambda: rig.settled(balanced=True), 30, what="the shares evened out")
            load.wait_more(30)
        assert served(rig) == [21, 21, 22]

        done = step_down(b.address)  # a planned stop: it drains, then hands over
        assert done.returncode == 0, done.stderr
        assert b.proc is not None and b.proc.wait(30) == 0
        wait_until(lambda: rig.settled(balanced=True), 30, what="A and C took B's share")
        assert served(rig) == [32, 32]
        load.wait_more(30)
        load.stop()

        assert load.problems == []
        assert "handed over" in a.output() and "node.partitions_taken" in c.output()
        assert "failed_attempts=0" in b.output() and "drained" in b.output()
        for node in (a, c):  # every move was planned: no attempt was cut off by one
            taken = [line for line in node.output().splitlines() if "partitions_taken" in line]
            assert taken and all("failed_attempts=0" in line for line in taken), taken
        with dex.SyncClient(a.address) as client:
            for session_id, sent in load.sent.items():  # each message counted once
                session = client.get_agent_snapshot(session_id)["session"]
                assert session["messages_received"] in (sent, sent + 1)  # one in flight
                assert session["status"] != "running"
    finally:
        rig.close()


def test_a_hung_owner_is_taken_over_and_once_resumed_changes_nothing(
    tmp_path: Path, postgres_url: str
) -> None:
    """SIGSTOP the node that owns a session: within seconds the others take its
    partitions (PostgreSQL ends its silent lock session) and serve the session; resumed,
    the old owner finds its lease lost and leaves, and wrote nothing after the takeover."""
    rig = Rig(tmp_path, postgres_url, standby=False, cluster=3)
    try:
        rig.start_server()
        rig.start_worker()
        sid = rig.session()
        assert rig.client.send_message(sid, "before", wait=True)["text"] == "echo: before"
        owner = rig.server
        others = [n for n in rig.nodes if n is not owner]

        os.kill(owner.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        with dex.SyncClient(others[0].address, timeout=30) as client:
            turn = client.send_message(sid, "during", message_id="during", wait=True)
        took = time.monotonic() - stopped
        assert turn["text"] == "echo: during"
        assert took < 10, f"served again after {took:.1f}s"  # about 3 s: the session timeout

        os.kill(owner.pid, signal.SIGCONT)
        assert owner.proc is not None and owner.proc.wait(15) == 4  # stepped down: exit 4
        assert "lease lost" in owner.output()
        with psycopg.connect(postgres_url) as conn:
            holders = conn.execute(
                "SELECT count(DISTINCT owner) FROM dex_partitions WHERE owner <> ''"
            ).fetchone()
        assert holders is not None and holders[0] == 2
        with dex.SyncClient(others[1].address) as client:
            assert client.get_agent_snapshot(sid)["session"]["messages_received"] == 2
    finally:
        rig.close()
