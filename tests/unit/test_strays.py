"""In a cluster an attempt outlives the node that handed it out: the Worker keeps running
it as a stray and claims it on every connection until the node that took its session
over answers (``Runner.strays``, ``Attempts.claim``); nodes that do not own its session
say nothing about it, in heartbeat replies as in claims."""

from __future__ import annotations

from typing import Any, cast

import msgspec

import dex
from dex.models import Scripted, say
from dex.server.attempts import Attempts
from dex.server.dispatch.dispatcher import Dispatcher, WorkerConn, proof_of
from dex.server.engine.state import attempt_id
from dex.wire import StepType
from dex.wire.server_frames import Claimed, HeartbeatReply, Step, Welcome
from dex.wire.worker_frames import Done, WorkerMessage
from dex.worker.history import HistoryCache
from dex.worker.runner import Attempt, Runner

AID = attempt_id("s", "1.2", 1)
TOKEN = "the-token-of-the-dead-node-s-connection"


# --- the node ------------------------------------------------------------------------


def node(owns: str) -> tuple[Attempts, WorkerConn]:
    """A node that took over the partition of session ``owns`` only, where attempt
    ``AID`` (of session s) waits to be reclaimed; and a Worker's connection to it."""
    dispatcher = Dispatcher(heartbeat_timeout=10, reclaim_window=3)
    dispatcher.await_reclaim(
        AID, session_id="s", step_id="1.2", number=1, worker_id="w", proof=proof_of(TOKEN)
    )
    attempts = Attempts(
        cast(Any, None), dispatcher, cast(Any, None), cast(Any, None), cast(Any, str)
    )
    attempts.recovered = lambda session_id: session_id == owns
    worker = WorkerConn(id="w", queues=set(), capacity=4, send=lambda message: None)
    dispatcher.connect(worker, [], None)
    return attempts, worker


def test_the_node_that_recovered_the_session_answers_a_claim() -> None:
    attempts, worker = node(owns="s")

    assert attempts.claim(worker, {AID: "a-token-of-another-process"}) == {AID: "stop"}
    assert attempts.claim(worker, {AID: TOKEN}) == {AID: "ok"}
    assert attempts.heartbeat(worker, [AID]) == {AID: "ok"}


def test_a_node_that_does_not_own_the_session_says_nothing_about_its_attempts() -> None:
    attempts, worker = node(owns="t")

    assert attempts.claim(worker, {AID: TOKEN}) == {}
    assert attempts.heartbeat(worker, [AID]) == {}  # not "stop": it may run elsewhere
    assert attempts.dispatcher.held[AID].proof == proof_of(TOKEN)  # still waits


# --- the Worker ----------------------------------------------------------------------


class Origin:
    """One of the Worker's connections: what the runner sends on it."""

    def __init__(self, address: str, resume: str) -> None:
        self.address = address
        self.resume: str | None = resume
        self.histories = HistoryCache()
        self.sent: list[WorkerMessage] = []

    def send(self, message: WorkerMessage) -> None:
        self.sent.append(message)


AGENT = dex.Agent(name="a", model=Scripted(lambda history: say("x")), tools=[])


def holding(result: bool) -> tuple[Runner, Origin, Origin]:
    """A Worker connected to nodes a and b that holds attempt ``AID``, handed out by a
    under ``TOKEN`` (``result``: it has its result, not yet acknowledged)."""
    runner = Runner("w", {"a": AGENT}, capacity=4)
    a, b = Origin("http://a", TOKEN), Origin("http://b", "b-token")
    handout = Step(
        attempt_id=AID, session_id="s", step_id="1.2", step_type=StepType.CALL_TOOL,
        attempt=1, agent="a",
    )  # fmt: skip
    attempt = Attempt(handout, a, resume=a.resume)
    if result:
        attempt.result = Done(AID, msgspec.Raw(b'{"status":"succeeded"}'))
    runner.attempts[AID] = attempt
    return runner, a, b


def test_an_attempt_whose_connection_dropped_is_claimed_and_moves_to_the_node_that_says_ok() -> (
    None
):
    runner, a, b = holding(result=True)
    assert runner.strays() == {}

    runner.lost(a)
    assert runner.strays() == {AID: TOKEN}  # claimed with the token it was handed out under
    runner.on_message(Claimed(status={AID: "ok"}), b)

    assert runner.attempts[AID].origin is b and runner.strays() == {}
    assert [type(m) for m in b.sent] == [Done]  # its result goes to its new node at once


def test_an_attempt_left_out_of_the_reply_to_its_node_s_beat_is_a_stray() -> None:
    runner, a, _ = holding(result=False)

    beat = runner.beat(a)
    assert beat is not None and beat.attempts == [AID] and beat.seq is not None
    runner.on_message(HeartbeatReply(status={}, seq=beat.seq), a)  # a gave the session up
    assert runner.strays() == {AID: TOKEN}
    runner.on_message(HeartbeatReply(status={AID: "ok"}), a)  # a (back) holds it again
    assert runner.strays() == {}


def test_replies_to_other_heartbeats_that_leave_it_out_do_not_make_a_stray() -> None:
    runner, a, _ = holding(result=False)
    beat = runner.beat(a)
    assert beat is not None and beat.seq is not None

    runner.on_message(HeartbeatReply(status={"s/1.5/1": "ok"}), a)  # a tool's own beat
    runner.on_message(HeartbeatReply(status={}, seq=beat.seq + 1), a)  # another's ask

    assert runner.strays() == {}


def test_a_stray_s_result_waits_for_the_node_that_takes_it() -> None:
    runner, a, b = holding(result=True)
    runner.lost(a)

    runner.on_message(HeartbeatReply(status={AID: "ok"}), b)  # not b's: changes nothing
    assert a.sent == [] and b.sent == []
    runner.on_message(HeartbeatReply(status={AID: "ok"}), a)  # a, back, runs it again

    assert runner.strays() == {} and [type(m) for m in a.sent] == [Done]


def test_a_stray_told_to_stop_is_dropped_and_answers_from_others_do_not_count() -> None:
    runner, a, b = holding(result=False)
    runner.lost(a)

    runner.on_message(Claimed(status={"t/1.1/1": "ok"}), b)  # not one it holds
    runner.on_message(HeartbeatReply(status={AID: "stop"}), b)  # not b's attempt
    assert AID in runner.attempts
    runner.on_message(Claimed(status={AID: "stop"}), b)

    assert AID not in runner.attempts


def test_a_welcome_of_the_node_back_stops_only_what_it_lists() -> None:
    runner, a, _ = holding(result=False)
    runner.lost(a)

    runner.welcomed(Welcome(worker_id="w", heartbeat_timeout=10, reconnect_grace=1, resume="x"), a)

    assert runner.strays() == {AID: TOKEN}  # still claimed: another node may own it
