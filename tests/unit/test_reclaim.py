"""Who may reclaim an attempt left running by a restart (``Dispatcher.await_reclaim``):
only the Worker process it was handed to, proven by its resume token, within the window."""

from __future__ import annotations

import asyncio

from dex.server.dispatch.dispatcher import Dispatcher, Held, WorkerConn, proof_of
from dex.server.engine.state import attempt_id

TOKEN = "the-token-of-the-old-connection"
AID = attempt_id("s", "1.2", 1)


def left_running(window: float = 3.0) -> Dispatcher:
    """A node just started: storage says attempt ``AID`` of Worker w runs, handed out on a
    connection whose resume token was ``TOKEN``."""
    dispatcher = Dispatcher(heartbeat_timeout=10, reclaim_window=window)
    dispatcher.await_reclaim(
        AID, session_id="s", step_id="1.2", number=1, worker_id="w", proof=proof_of(TOKEN)
    )
    return dispatcher


def conn(worker_id: str = "w") -> WorkerConn:
    return WorkerConn(id=worker_id, queues={"q"}, capacity=4, send=lambda message: None)


def expire_due(dispatcher: Dispatcher) -> list[Held]:
    """Run the dispatcher's expiry once; the attempts it fails."""
    expired: list[Held] = []

    async def expire(held: Held) -> None:
        expired.append(held)

    async def run() -> None:
        dispatcher._expire = expire
        dispatcher._expire_attempts()
        await asyncio.sleep(0)  # the expiries it spawned run
        await dispatcher.supervisor.stop()

    asyncio.run(run())
    return expired


def test_the_process_it_was_handed_to_reclaims_it_and_keeps_its_token() -> None:
    dispatcher = left_running()
    worker = conn()

    stop, unnamed = dispatcher.connect(worker, [AID], TOKEN)

    assert (stop, unnamed) == ([], [])
    assert dispatcher.owned(worker, AID) is not None  # its heartbeats and result count
    assert dispatcher.reclaimed == 1
    assert worker.resume == TOKEN and worker.proof == proof_of(TOKEN)
    assert expire_due(dispatcher) == []


def test_another_process_with_the_same_id_cannot_reclaim_it() -> None:
    dispatcher = left_running()
    impostor = conn()

    stop, _ = dispatcher.connect(impostor, [AID], "a-token-of-another-process")

    assert stop == [AID]  # told to stop: it is not its attempt
    assert dispatcher.owned(impostor, AID) is None
    assert dispatcher.reclaimed == 0
    assert impostor.resume != "a-token-of-another-process"


def test_a_process_that_proves_itself_but_does_not_name_it_fails_it_at_once() -> None:
    dispatcher = left_running(window=3600)
    worker = conn()

    stop, unnamed = dispatcher.connect(worker, [], TOKEN)

    # never handed back unused (its body may have run): it fails now, not in an hour
    assert (stop, unnamed) == ([], [])
    (expired,) = expire_due(dispatcher)
    assert (expired.step_id, expired.proof) == ("1.2", proof_of(TOKEN))


def test_once_the_window_passed_it_fails_and_a_late_claim_is_told_to_stop() -> None:
    dispatcher = left_running(window=0.0)
    (expired,) = expire_due(dispatcher)
    dispatcher.unhold(AID, expired)  # its failure committed

    stop, _ = dispatcher.connect(conn(), [AID], TOKEN)

    assert stop == [AID]
    assert dispatcher.reclaimed == 0


def test_a_reclaim_binds_only_the_attempts_its_token_proves() -> None:
    dispatcher = left_running()
    other = attempt_id("t", "1.2", 1)  # the same Worker id's, handed out on another node
    dispatcher.await_reclaim(
        other, session_id="t", step_id="1.2", number=1, worker_id="w", proof=proof_of("other")
    )
    worker = conn()

    stop, _ = dispatcher.connect(worker, [AID, other], TOKEN)

    assert dispatcher.owned(worker, AID) is not None
    assert dispatcher.owned(worker, other) is None and stop == [other]
    assert dispatcher.held[other].proof == proof_of("other")  # it still waits for its own


def test_a_refused_result_s_attempt_a_reconnect_does_not_name_fails_and_never_goes_back() -> None:
    dispatcher = Dispatcher(heartbeat_timeout=3600)
    first = conn()
    dispatcher.connect(first, [], None)
    first.reserved = 1
    dispatcher.hold(first, AID, Held("s", "1.2", 1, first, deadline=float("inf")))
    # a bad result: refused (the Worker forgets the attempt), nothing else changes
    dispatcher.let_go(first, AID, "the result does not fit", fail=False)
    assert dispatcher.owned(first, AID) is not None
    dispatcher.disconnect(first)

    stop, unnamed = dispatcher.connect(conn(), [], first.resume)

    # its body ran: not a hand-out the Worker never received
    assert (stop, unnamed) == ([], [])
    (expired,) = expire_due(dispatcher)
    assert expired.refused == "the result does not fit"


# --- in a cluster: a claim on another node's connection (``Dispatcher.claim``) --------


def test_a_claim_with_the_token_it_was_handed_out_under_binds_it_to_the_claiming_connection() -> (
    None
):
    dispatcher = left_running()
    worker = conn()
    dispatcher.connect(worker, [], "the-token-of-its-connection-to-this-node")

    assert dispatcher.claim(worker, AID, TOKEN) is True

    assert dispatcher.owned(worker, AID) is not None  # its heartbeats and result count here
    assert dispatcher.reclaimed == 1
    assert dispatcher.claim(worker, AID, TOKEN) is True  # asked again: still its own
    assert dispatcher.reclaimed == 1
    assert expire_due(dispatcher) == []


def test_a_claim_with_another_token_or_from_another_worker_is_told_to_stop() -> None:
    dispatcher = left_running()
    worker, other = conn(), conn("other")
    dispatcher.connect(worker, [], None)
    dispatcher.connect(other, [], None)

    assert dispatcher.claim(worker, AID, "a-token-of-another-process") is False
    assert dispatcher.claim(other, AID, TOKEN) is False

    assert dispatcher.owned(worker, AID) is None and dispatcher.owned(other, AID) is None
    assert dispatcher.held[AID].proof == proof_of(TOKEN)  # it still waits for its own
    assert dispatcher.claim(worker, AID, TOKEN) is True


def test_a_claim_after_the_window_passed_is_told_to_stop() -> None:
    dispatcher = left_running(window=0.0)
    (expired,) = expire_due(dispatcher)
    worker = conn()
    dispatcher.connect(worker, [], None)

    assert dispatcher.claim(worker, AID, TOKEN) is False  # failing: it may not go on
    dispatcher.unhold(AID, expired)  # its failure committed
    assert dispatcher.claim(worker, AID, TOKEN) is False
    assert dispatcher.reclaimed == 0


def test_a_claim_of_an_attempt_its_dropped_connection_here_holds_waits_for_that_grace() -> None:
    dispatcher = Dispatcher(heartbeat_timeout=3600, reconnect_grace=3600)
    first = conn()
    dispatcher.connect(first, [], None)
    first.reserved = 1
    dispatcher.hold(first, AID, Held("s", "1.2", 1, first, deadline=float("inf")))
    dispatcher.disconnect(first)
    second = conn()
    dispatcher.connect(second, [], None)  # not proven: the attempt stays with the first

    assert dispatcher.claim(second, AID, first.resume) is None  # undecided: no answer
    assert dispatcher.owned(second, AID) is None
