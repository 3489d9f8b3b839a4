"""Hypothesis over sequences of Worker-protocol frames, not single frames, against a real
in-process node: Workers connect, reconnect with and without their resume token (or a
forged one), take over a live connection, send results twice, after a hand-back, for
another connection's attempt, for attempts long settled, and heartbeat what they like,
while clients send messages to interleaved sessions.

What a user relies on, checked after every run: no attempt settled twice (a Step has at
most one succeeded attempt, a turn's history one result per tool call and one model
answer per RunModel), every ``done``/``fail``/``back`` on a connection that stays open is
answered, no server error is logged, another Worker is still served, and once the
Workers are gone every attempt is settled or held: an honest Worker then ends every
session's turn (idle, or failed where a fuzzing Worker's ``fail`` was final).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from starlette.testclient import TestClient

from dex.wire import ModelResponse, ModelToolCall, ToolOutcome
from tests.integration.conftest import AGENT, Api, FakeWorker, fastapi_of, make_api_app

SESSIONS = ["s1", "s2", "s3"]
ENDED = {"idle", "failed"}
"""A session's statuses with no turn running."""
WORKER_IDS = ["w-a", "w-b"]
GRACE = 0.2
FORGED = "s1/1.1/1"
"""An attempt id of the right shape that may never have been handed out."""


class Errors(logging.Handler):
    """Every ERROR a ``dex`` logger writes: a server error is a bug, whatever caused it."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class Conn:
    """One connection of a fuzzing Worker, as the test sees it."""

    def __init__(self, worker_id: str, fake: FakeWorker, stack: contextlib.ExitStack) -> None:
        self.worker_id = worker_id
        self.fake = fake
        self.stack = stack
        self.resume: str = fake.welcome["resume"]
        self.handed: dict[str, dict[str, Any]] = {}
        """Attempt id -> the hand-out, for every step message this connection received."""
        self.asked = 0
        """done/fail/back messages sent; each must be answered by an ack."""
        self.acks: list[dict[str, Any]] = []
        self.closed_by_server = False

    def pump(self, timeout: float = 0.0) -> None:
        """Take in what the server sent, waiting up to ``timeout`` for a first frame."""
        while True:
            try:
                self.fake._receive_frame(timeout)
            except TimeoutError:
                break
            except ConnectionError:
                self.closed_by_server = True
                break
            timeout = 0.0
        for message in self.fake.inbox:
            if message["t"] == "step":
                self.handed[message["attempt_id"]] = message
            elif message["t"] == "ack":
                self.acks.append(message)
        self.fake.inbox.clear()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stack.close()


def result_for(handout: dict[str, Any] | None, choice: int) -> dict[str, Any]:
    """A result that fits the Step (or, for an unknown attempt, any model answer)."""
    if handout is None or handout["step_type"] == "RunModel":
        if choice == 0:
            calls = [ModelToolCall(id="c1", name="lookup", arguments={})]
            return ModelResponse(tool_calls=calls).model_dump(mode="json")
        if choice == 1:
            calls = [ModelToolCall(id="c1", name="charge", arguments={})]
            return ModelResponse(tool_calls=calls).model_dump(mode="json")
        return ModelResponse(text=f"answer {choice}").model_dump(mode="json")
    if handout["step_type"] == "CompactContext":
        return {"text": "summary"}
    return ToolOutcome(status="succeeded", result=choice).model_dump(mode="json")


class WorkerProtocol(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.stack = contextlib.ExitStack()
        directory = Path(self.stack.enter_context(tempfile.TemporaryDirectory()))
        app = make_api_app(directory / "data", reconnect_grace=GRACE)
        self.http = self.stack.enter_context(TestClient(app))
        self.api = Api(self.http, fastapi_of(app))
        self.api.register(AGENT)
        for sid in SESSIONS:
            self.api.create(sid)
        self.errors = Errors()
        logging.getLogger("dex").addHandler(self.errors)
        self.conns: dict[str, Conn] = {}
        self.seen: set[str] = {FORGED}
        """Every attempt id any connection was handed, and a forged one."""
        self.sent_messages = 0
        self.opened: list[Conn] = []
        # another Worker, serving nothing, that must be served throughout
        self.bystander = self._open("bystander", agents=[])

    def _open(self, worker_id: str, agents: list[Any] | None = None, **hello: Any) -> Conn:
        stack = contextlib.ExitStack()
        ws = stack.enter_context(self.http.websocket_connect("/v1/workers/connect"))
        fake = FakeWorker(ws)
        specs = [a.model_dump(mode="json") for a in ([AGENT] if agents is None else agents)]
        fake.send({"t": "hello", "worker_id": worker_id, "agents": specs, "capacity": 4, **hello})
        try:
            fake.welcome = fake.expect("welcome", timeout=5)
        except BaseException:
            stack.close()  # a connection left open would keep the app from stopping
            raise
        conn = Conn(worker_id, fake, stack)
        self.opened.append(conn)  # closed at the end whatever happens: an open one hangs
        conn.pump()
        return conn

    # --- what clients do ------------------------------------------------------------------

    @rule(session=st.sampled_from(SESSIONS))
    def send_message(self, session: str) -> None:
        self.sent_messages += 1
        self.api.send(session, f"message {self.sent_messages}")

    # --- what Workers do ---------------------------------------------------------------

    @rule(worker_id=st.sampled_from(WORKER_IDS))
    def connect(self, worker_id: str) -> None:
        """A new Worker process: no resume token. Refused while a live one has the id."""
        try:
            conn = self._open(worker_id)
        except ConnectionError as refused:
            assert worker_id in self.conns and "4409" in str(refused), refused
            return
        old = self.conns.get(worker_id)
        if old is not None:  # the server had closed it: the id was free again
            old.pump()
            assert old.closed_by_server, worker_id
            old.close()
        self.conns[worker_id] = conn

    @precondition(lambda self: self.conns)
    @rule(
        data=st.data(),
        close_first=st.booleans(),
        token=st.sampled_from(["own", "none", "forged"]),
    )
    def reconnect(self, data: st.DataObject, close_first: bool, token: str) -> None:
        """The same Worker again, naming some of what it holds; with its resume token it
        re-claims them (and supersedes a live connection), without it it is a new one."""
        worker_id = data.draw(st.sampled_from(sorted(self.conns)))
        old = self.conns[worker_id]
        old.pump()
        claimed = data.draw(st.lists(st.sampled_from(sorted(self.seen)), max_size=4, unique=True))
        resume = {"own": old.resume, "none": None, "forged": "not-the-token"}[token]
        if close_first:
            old.close()
            del self.conns[worker_id]
        try:
            conn = self._open(worker_id, attempts=claimed, resume=resume)
        except ConnectionError as refused:
            assert not close_first and token != "own", refused
            return
        # a claimed attempt it does not hold any more is named in the welcome's stop
        assert set(conn.fake.welcome["stop"]) <= set(claimed)
        if not close_first:
            if token == "own":  # superseded: the server closes the old connection
                deadline = time.monotonic() + 5
                while not old.closed_by_server:
                    assert time.monotonic() < deadline, "the old connection was not closed"
                    old.pump(0.1)
            old.close()
        if token == "own":
            conn.handed.update({a: old.handed[a] for a in claimed if a in old.handed})
        self.conns[worker_id] = conn

    @precondition(lambda self: self.conns)
    @rule(worker_id=st.sampled_from(WORKER_IDS))
    def disconnect(self, worker_id: str) -> None:
        conn = self.conns.pop(worker_id, None)
        if conn is not None:
            conn.close()

    @precondition(lambda self: self.conns)
    @rule(
        data=st.data(),
        kinds=st.lists(st.sampled_from(["done", "fail", "back", "hb"]), min_size=1, max_size=4),
        own=st.booleans(),
        choice=st.integers(0, 3),
    )
    def send_frame(self, data: st.DataObject, kinds: list[str], own: bool, choice: int) -> None:
        """One frame of results and heartbeats: for attempts this connection holds, or
        (``own`` false) for any attempt ever handed out, and the same one twice."""
        worker_id = data.draw(st.sampled_from(sorted(self.conns)))
        conn = self.conns[worker_id]
        conn.pump(0.02)
        if conn.closed_by_server:
            conn.close()
            del self.conns[worker_id]
            return
        pool = sorted(conn.handed) if own and conn.handed else sorted(self.seen)
        messages = []
        for kind in kinds:
            attempt = data.draw(st.sampled_from(pool))
            handout = conn.handed.get(attempt)
            if kind == "done":
                messages.append(
                    {"t": "done", "attempt_id": attempt, "result": result_for(handout, choice)}
                )
            elif kind == "fail":
                error = {"message": "fuzz", "retryable": choice != 3}
                messages.append({"t": "fail", "attempt_id": attempt, "error": error})
            elif kind == "back":
                messages.append({"t": "back", "attempt_id": attempt})
            else:
                messages.append({"t": "hb", "attempts": [attempt]})
        conn.asked += sum(m["t"] != "hb" for m in messages)
        conn.fake.send(*messages)
        conn.pump(0.02)

    @rule()
    def pump_all(self) -> None:
        for conn in self.conns.values():
            conn.pump(0.02)

    @invariant()
    def attempts_seen(self) -> None:
        for conn in self.conns.values():
            self.seen.update(conn.handed)

    # --- after every run ---------------------------------------------------------------

    def teardown(self) -> None:
        try:
            self._check()
        finally:
            for conn in self.opened:
                conn.close()
            logging.getLogger("dex").removeHandler(self.errors)
            self.stack.close()

    def _check(self) -> None:
        # every result on a connection still open is answered, never met with silence
        for conn in self.conns.values():
            deadline = time.monotonic() + 10
            while len(conn.acks) < conn.asked and not conn.closed_by_server:
                assert time.monotonic() < deadline, (conn.worker_id, conn.asked, conn.acks)
                conn.pump(0.1)
        # the bystander was served all along, and still is
        assert self.bystander.fake.heartbeat() == {}
        assert self.http.get("/healthz").status_code == 200
        # the fuzzing Workers leave; what they held fails after the grace (or was settled)
        for conn in self.conns.values():
            conn.close()
        self.conns.clear()
        self._drive_to_idle()
        for sid in SESSIONS:
            self._no_double_settlement(sid)
        problems = [r.getMessage() for r in self.errors.records]
        assert not problems, problems

    def _drive_to_idle(self) -> None:
        """An honest Worker answers every hand-out with a final answer: every session must
        end up with no turn running (idle; or failed, where a fuzzing Worker's ``fail`` of
        the session's attempt was final), so no attempt was left running without a
        holder."""
        honest = self._open("honest")
        deadline = time.monotonic() + 60  # a bound for a loaded machine; idle comes in ~1 s
        answered: set[tuple[str, int]] = set()
        while True:
            snapshots = {sid: self.api.snapshot(sid) for sid in SESSIONS}
            if all(s["session"]["status"] in ENDED for s in snapshots.values()):
                break
            assert time.monotonic() < deadline, _summary(snapshots, honest)
            for sid, snapshot in snapshots.items():
                held = {r["attempt_id"] for r in snapshot["running"]}
                turn = snapshot["current_turn"] or {"steps": []}
                for step in turn["steps"]:
                    if step["status"] == "running":
                        number = step["attempts"][-1]["number"]
                        aid = f"{sid}/{step['id']}/{number}"
                        assert aid in held or _within_grace(step), (aid, snapshot)
            honest.pump(0.1)
            for aid, handout in list(honest.handed.items()):
                key = (aid, handout.get("attempt", 0))
                if key in answered:
                    continue
                answered.add(key)
                honest.fake.send({"t": "done", "attempt_id": aid, "result": result_for(handout, 3)})
            honest.handed.clear()

    def _no_double_settlement(self, sid: str) -> None:
        """Each turn's history holds one model answer per succeeded RunModel and one result
        per tool call; each Step at most one succeeded attempt, numbered without gaps."""
        snapshot = self.api.snapshot(sid)
        turns: list[list[dict[str, Any]]] = []
        for item in snapshot["history"]:
            if item["type"] == "user":
                turns.append([])
            turns[-1].append(item)
        assert len(turns) == snapshot["session"]["messages_received"], snapshot
        for number, items in enumerate(turns, start=1):
            turn = self.api.turn(sid, number)
            for step in turn["steps"]:
                numbers = [a["number"] for a in step["attempts"]]
                assert numbers == list(range(1, len(numbers) + 1)), (sid, number, step)
                outcomes = Counter(a["outcome"] for a in step["attempts"])
                assert outcomes["succeeded"] <= 1, (sid, number, step)
            answers = [i for i in items if i["type"] == "assistant"]
            models = [
                s for s in turn["steps"] if s["type"] == "RunModel" and s["status"] == "succeeded"
            ]
            assert len(answers) == len(models), (sid, number, items, turn["steps"])
            results = Counter(i["call_id"] for i in items if i["type"] == "tool_result")
            assert all(n == 1 for n in results.values()), (sid, number, items)


def _summary(snapshots: dict[str, dict[str, Any]], honest: Conn) -> str:
    lines = []
    for sid, s in snapshots.items():
        turn = s["current_turn"] or {"steps": [], "number": None}
        steps = [
            (
                st["id"],
                st["type"],
                st["status"],
                [(a["number"], a["outcome"]) for a in st["attempts"]],
            )
            for st in turn["steps"]
        ]
        lines.append(
            f"{sid} {s['session']['status']} turn {turn['number']} steps {steps} "
            f"running {s['running']} waiting {s['waiting']}"
        )
    lines.append(f"honest handed {sorted(honest.handed)} acks {honest.acks}")
    return "\n".join(lines)


def _within_grace(step: dict[str, Any]) -> bool:
    """A running attempt no connection holds is fine only for the reconnect grace (and
    the moment its failure takes to commit)."""
    started = float(step["attempts"][-1]["started_at"])
    return time.time() - started < GRACE + 5


WorkerProtocol.TestCase.settings = settings(
    max_examples=12,
    stateful_step_count=20,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    phases=[Phase.generate],  # no shrinking: a failure is reported within the timeout
)
TestWorkerProtocolSequences = WorkerProtocol.TestCase
