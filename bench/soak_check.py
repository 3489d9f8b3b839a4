"""The soak's invariant checker: what the tools' own ledger, the clients' record of
their sends and approvals, and Dex's snapshots and turn records must agree on.

``check(evidence)`` is a pure function: it reads nothing and starts nothing, so each
invariant can be shown to fail on made-up evidence (``tests/unit/test_soak_check.py``).

The invariants (each violation names one of these kinds):

- ``write_ran_twice``: a ``write`` call's body started more than once.
- ``key_changed``: a run of a call used another idempotency key than the call's one key
  (or ran as another call).
- ``foreign_run``: the ledger shows a run (or a task's poll) no call of Dex accounts for.
- ``succeeded_without_run``: ``succeeded``, yet the ledger shows no completed run.
- ``not_run_but_ran``: ``failed`` with the "did not run" prefix, yet the ledger shows a run.
- ``denied_but_ran``: ``denied`` (or denied by the client), yet the ledger shows a run.
- ``approval_ignored``: denied though the client approved, or though nobody denied.
- ``timer_not_once``: a timer set or fired more or less than once, or before it was due.
- ``message_not_once``: an acknowledged message is not in its session's history exactly
  once, an unacknowledged one is there twice, or the history holds a message nobody sent.
- ``step_running_unheld``: a Step is ``running`` but no Worker holds its attempt, or an
  ended turn has a Step that did not end.
- ``client_error``: a call of ``dex.Client`` failed with something other than a
  ``DexError`` (the SDK's promise), or could not be tried again safely.
- ``stuck``: a session still busy, or an acknowledged turn not ended, after the settle
  deadline.

Not a violation, counted apart: ``write`` calls recorded ``outcome_unknown`` whose body
completed anyway, the documented at-most-once window (docs/at-most-once.md).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from dex import TOOL_CALL_NOT_RUN_ERROR_PREFIX

WRITES = {"charge", "transfer"}
STARTS = {
    "lookup": "lookup",
    "upsert": "upsert",
    "charge": "charge",
    "transfer": "transfer",
    "render": "render.start",
    "nap": "nap",
}
"""The ledger entry each tool's body writes first."""
COMPLETES = {
    "lookup": "lookup",
    "upsert": "upsert.done",
    "charge": "charge.done",
    "transfer": "transfer.done",
    "nap": "nap.fired",
}
"""The ledger entry that shows a body ran to its end (``render``: a poll of its task)."""
TIMER_TOLERANCE = 0.05
"""Seconds a timer may seem to fire early: the ledger's clock and the server's are the
same machine's, read at different moments."""


@dataclass
class Send:
    """One user message a client sent (and sent again with the same message id until
    the server acknowledged it)."""

    session: str
    message_id: str
    text: str
    tags: dict[str, str]
    """Each call's tag and tool name."""
    turn: int | None = None
    """The turn the server acknowledged; None if no send was ever acknowledged."""


@dataclass
class Evidence:
    sends: list[Send]
    snapshots: dict[str, dict[str, Any]]
    """Session id: ``get_agent_snapshot`` after the settle."""
    turns: dict[tuple[str, int], dict[str, Any]]
    """(session id, turn): the turn record (``wait_turn``) of every acknowledged send."""
    ledger: list[dict[str, Any]]
    decisions: dict[str, str]
    """Tag: ``approve`` or ``deny``, what the approving client decided."""
    unheld: dict[str, str] = field(default_factory=dict)
    """Attempt id: session, for the attempts seen ``running`` with no Worker holding them
    in snapshots taken during the chaos, and still so on a later look (``Watch``)."""
    client_errors: list[str] = field(default_factory=list)
    """Client calls that failed with something other than a ``DexError``."""


@dataclass(frozen=True)
class Violation:
    kind: str
    session: str
    what: str


@dataclass
class Findings:
    turns: Counter[str] = field(default_factory=Counter)
    calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(tool, status): how many calls."""
    runs: int = 0
    """Ledger entries of bodies starting (every attempt that reached a tool's code)."""
    window: Counter[str] = field(default_factory=Counter)
    """``write`` calls in the documented at-most-once window, by what failed the attempt
    (``cause``)."""
    unknown: Counter[str] = field(default_factory=Counter)
    """``write`` calls recorded ``outcome_unknown``, whether their body completed or not,
    by what failed the attempt (``cause``)."""
    violations: list[Violation] = field(default_factory=list)

    def add(self, kind: str, session: str, what: str) -> None:
        self.violations.append(Violation(kind, session, what))


def check(evidence: Evidence) -> Findings:
    found = Findings()
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    polls: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for entry in evidence.ledger:
        if entry["effect"] == "render.poll":
            polls[entry["handle_key"]].append(entry)
        else:
            runs[entry["tag"]].append(entry)
    found.runs = sum(
        1
        for e in evidence.ledger
        if e["effect"] in STARTS.values() and e.get("sleeps_done", 0) == 0
    )
    calls = _calls(evidence)
    for tag, entries in runs.items():
        if tag not in calls:
            found.add("foreign_run", entries[0]["session"], f"tag {tag} ran: {entries[0]}")
    keys = {call["idempotency_key"] for _, call in calls.values()}
    for key, entries in polls.items():
        if key not in keys:
            found.add("foreign_run", entries[0]["session"], f"a poll of unknown task {key}")
    for tag, (session, call) in calls.items():
        _check_call(found, evidence, session, call, runs[tag], polls[call["idempotency_key"]])
    _check_messages(found, evidence)
    _check_steps(found, evidence)
    for error in evidence.client_errors:
        found.add("client_error", "", error)
    return found


def _calls(evidence: Evidence) -> dict[str, tuple[str, dict[str, Any]]]:
    calls: dict[str, tuple[str, dict[str, Any]]] = {}
    for session, snapshot in evidence.snapshots.items():
        for call in snapshot["tool_calls"]:
            calls[call["arguments"]["tag"]] = (session, call)
    return calls


def _check_call(
    found: Findings,
    evidence: Evidence,
    session: str,
    call: dict[str, Any],
    runs: list[dict[str, Any]],
    polls: list[dict[str, Any]],
) -> None:
    name, status, tag = call["name"], call["status"], call["arguments"]["tag"]
    what = f"call {call['id']} ({name}, tag {tag}) of turn {call['turn']}"
    found.calls[(name, status)] += 1
    starts = [r for r in runs if r["effect"] == STARTS[name]]
    if name in COMPLETES:
        completed = any(r["effect"] == COMPLETES[name] for r in runs)
    else:  # a task: started, and polled with its handle
        completed = bool(starts) and bool(polls)
    for run in [*runs, *polls]:
        if run["key"] != call["idempotency_key"]:
            found.add("key_changed", session, f"{what} ran with key {run['key']}")
        if (run["session"], run["call"]) != (session, call["id"]):
            found.add("key_changed", session, f"{what} ran as {run['session']}/{run['call']}")
    if name in WRITES and len(starts) > 1:
        found.add("write_ran_twice", session, f"{what} started {len(starts)} times: {starts}")
    if name in WRITES and status == "outcome_unknown":
        found.unknown[cause(call["error"] or "")] += 1
        if completed:
            found.window[cause(call["error"] or "")] += 1
    if status == "succeeded" and not completed:
        found.add("succeeded_without_run", session, f"{what}: ledger {runs} polls {len(polls)}")
    not_run = (call["error"] or "").startswith(TOOL_CALL_NOT_RUN_ERROR_PREFIX)
    if status == "failed" and not_run and (runs or polls):
        found.add("not_run_but_ran", session, f"{what}: {call['error']!r}, ran {runs}")
    decision = evidence.decisions.get(tag)
    if status == "denied":
        if runs:
            found.add("denied_but_ran", session, f"{what} ran {runs}")
        if decision != "deny":
            found.add("approval_ignored", session, f"{what} denied; the client said {decision}")
    elif decision == "deny" and runs:
        found.add("denied_but_ran", session, f"{what} is {status} and ran {runs}")
    if name == "nap":
        turn = evidence.turns.get((session, call["turn"]))
        if turn is not None:
            _check_timer(found, session, what, call, turn, runs)


def cause(error: str) -> str:
    """What failed a call's last attempt, from its error: ``not_reclaimed`` (after a
    node restart or a takeover, its Worker did not reclaim it within the reclaim
    window), ``node_restart`` (failed by a node's recovery: it had no proof to reclaim
    it by), ``connection_closed`` (no reconnect within the grace), ``heartbeat_timeout``,
    ``result_refused`` (its result could not be recorded: a full disk) or ``other``."""
    if "was refused" in error:
        return "result_refused"
    if "did not reclaim" in error:
        return "not_reclaimed"
    if any(why in error for why in ("restarted", "taken over")):
        return "node_restart"
    if "did not reconnect" in error:
        return "connection_closed"
    if "no heartbeat" in error:
        return "heartbeat_timeout"
    return "other"


def _check_timer(
    found: Findings,
    session: str,
    what: str,
    call: dict[str, Any],
    turn: dict[str, Any],
    runs: list[dict[str, Any]],
) -> None:
    timers = [
        s for s in turn["steps"] if s["type"] == "AwaitTimer" and s["tool_call_id"] == call["id"]
    ]
    fired = [r for r in runs if r["effect"] == "nap.fired"]
    if len(timers) > 1:
        found.add("timer_not_once", session, f"{what}: {len(timers)} timers set")
    if any(r.get("sleeps_done") != 1 for r in fired) or any(
        r.get("sleeps_done", 0) > 1 for r in runs
    ):
        found.add("timer_not_once", session, f"{what}: woke with {runs}")
    if call["status"] != "succeeded":
        return
    if len(timers) != 1 or timers[0]["status"] != "succeeded":
        found.add("timer_not_once", session, f"{what} succeeded; its timers: {timers}")
        return
    wait = timers[0]["wait"] or {}
    if wait.get("resolved_at") is None:
        found.add("timer_not_once", session, f"{what} succeeded; its timer never fired: {wait}")
    elif fired and min(r["at"] for r in fired) < wait["deadline"] - TIMER_TOLERANCE:
        found.add("timer_not_once", session, f"{what} woke before {wait['deadline']}: {fired}")


def _check_messages(found: Findings, evidence: Evidence) -> None:
    in_history: dict[str, Counter[str]] = {
        session: Counter(i["text"] for i in snapshot["history"] if i["type"] == "user")
        for session, snapshot in evidence.snapshots.items()
    }
    sent: dict[str, set[str]] = defaultdict(set)
    for send in evidence.sends:
        sent[send.session].add(send.text)
        times = in_history.get(send.session, Counter())[send.text]
        if send.turn is not None and times != 1:
            found.add(
                "message_not_once",
                send.session,
                f"message {send.message_id} (turn {send.turn}) is in the history {times} times",
            )
        elif send.turn is None and times > 1:
            found.add(
                "message_not_once",
                send.session,
                f"unacknowledged message {send.message_id} is in the history {times} times",
            )
        if send.turn is not None:
            turn = evidence.turns.get((send.session, send.turn))
            status = turn["status"] if turn else "missing"
            found.turns[status] += 1
            if status in ("running", "waiting", "missing"):
                found.add("stuck", send.session, f"turn {send.turn} ({send.message_id}) {status}")
    for session, texts in in_history.items():
        for text in texts:
            if text not in sent[session]:
                found.add("message_not_once", session, f"history holds unsent {text[:80]!r}")


def unheld(session: str, snapshot: dict[str, Any]) -> list[str]:
    """The attempts of the snapshot's running Steps that no Worker holds."""
    held = {r["attempt_id"] for r in snapshot["running"]}
    return [
        f"{session}/{step['id']}/{step['attempts'][-1]['number']} ({step['type']})"
        for step in (snapshot["current_turn"] or {}).get("steps", [])
        if step["status"] == "running"
        and step["attempts"]
        and f"{session}/{step['id']}/{step['attempts'][-1]['number']}" not in held
    ]


def _check_steps(found: Findings, evidence: Evidence) -> None:
    for attempt, session in evidence.unheld.items():
        found.add("step_running_unheld", session, f"during the chaos: {attempt}")
    for session, snapshot in evidence.snapshots.items():
        for attempt in unheld(session, snapshot):
            found.add("step_running_unheld", session, attempt)
        turn = snapshot["current_turn"]
        state = snapshot["session"]
        if (
            state["status"] not in ("idle", "failed")
            or turn is not None
            or state["queued_messages"]
        ):
            found.add(
                "stuck",
                session,
                f"session {state['status']}, turn {(turn or {}).get('number')}, "
                f"{len(state['queued_messages'])} queued, waits {snapshot['waits']}",
            )
    for (session, number), turn in evidence.turns.items():
        if turn["status"] in ("running", "waiting"):
            continue
        for step in turn["steps"]:
            if step["status"] in ("running", "queued", "waiting"):
                found.add(
                    "step_running_unheld",
                    session,
                    f"turn {number} ended {turn['status']} with {step['type']} {step['status']}",
                )
