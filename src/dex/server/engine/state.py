"""The durable state of one session, as the engine sees it.

msgspec structs: the handlers read and change them on every input, so they cost what a
Python attribute costs (slots), they are made in C, and ``dex.server.records`` encodes
them for storage (about 1.8x faster than the same records as dataclasses, measured).
A session's state holds the current turn with every Step, attempt and tool call; the
store keeps each Step and tool call in a row of its own, so a commit writes the ones a
transition changed, not the whole turn. Ended turns stay in the archive.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from enum import StrEnum
from typing import Any, TypeVar

import msgspec
from msgspec import field

from dex.server.engine.budget import Budget, Usage
from dex.wire import (
    AttemptOutcome,
    AttemptProgress,
    RetryPolicy,
    StepStatus,
    StepType,
    ToolCallStatus,
    ToolKind,
)

T = TypeVar("T")
"""A history item, or its JSON form: ``context`` selects from either."""

TERMINAL_STEP = frozenset((StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.CANCELLED))
"""A Step in one of these never changes again."""


class AttemptError(msgspec.Struct, kw_only=True):
    """Why an attempt failed, and how far it got (``dex.wire.RecoveryError`` on the wire)."""

    message: str
    attempt_progress: AttemptProgress = AttemptProgress.UNSPECIFIED
    retryable: bool = True


class Retry(msgspec.Struct, kw_only=True, frozen=True):
    """A Step's retry policy, copied from its agent's or tool's ``RetryPolicy`` when the
    Step is made, so a Worker registering a changed agent does not change running Steps."""

    max_attempts: int = 3
    within_seconds: float = 1800.0
    initial_backoff_seconds: float = 1.0
    max_backoff_seconds: float = 30.0
    backoff_multiplier: float = 2.0

    def backoff(self, failed_attempts: int) -> float:
        """Seconds to wait before attempt ``failed_attempts + 1``."""
        delay = self.initial_backoff_seconds * self.backoff_multiplier ** (failed_attempts - 1)
        return float(min(delay, self.max_backoff_seconds))

    @staticmethod
    def of(policy: RetryPolicy) -> Retry:
        return _retry(
            policy.max_attempts,
            policy.within_seconds,
            policy.initial_backoff_seconds,
            policy.max_backoff_seconds,
            policy.backoff_multiplier,
        )


@functools.lru_cache(maxsize=1024)
def _retry(
    max_attempts: int, within: float, initial: float, most: float, multiplier: float
) -> Retry:
    return Retry(
        max_attempts=max_attempts,
        within_seconds=within,
        initial_backoff_seconds=initial,
        max_backoff_seconds=most,
        backoff_multiplier=multiplier,
    )


SINGLE_ATTEMPT = Retry(max_attempts=1)


class Attempt(msgspec.Struct, kw_only=True):
    number: int
    worker_id: str
    started_at: float
    proof: str = ""
    """A digest of the resume token of the Worker connection it was handed out on: after
    a restart or a takeover, the Worker process proves with that token that this attempt
    is its own, and reclaims it (``Dispatcher.await_reclaim``)."""
    ended_at: float | None = None
    outcome: AttemptOutcome = AttemptOutcome.RUNNING
    error: AttemptError | None = None


class Wait(msgspec.Struct, kw_only=True):
    """What a server-side wait waits for, and how it ended."""

    since: float
    deadline: float | None = None
    """For a timer: when it fires."""
    question: str | None = None
    choices: list[str] | None = None
    reason: str | None = None
    """For a budget wait: how much of the budget is used, in words."""
    tenant: str | None = None
    """For a budget wait on its tenant's budget (not its session's): the tenant."""
    resolved_at: float | None = None
    resolution: dict[str, Any] | None = None


class Step(msgspec.Struct, kw_only=True):
    id: str
    type: StepType
    status: StepStatus = StepStatus.QUEUED
    queue: str = ""
    retry: Retry
    created_at: float
    not_before: float | None = None
    tool_call_id: str | None = None
    attempts: list[Attempt] = field(default_factory=list)
    handed_back: int = 0
    rate_limited: int = 0
    """RunModel and CompactContext: how many times the model provider refused the call for
    its rate limit (each handed the Step back: ``handlers.rate_limited``)."""
    ended_at: float | None = None
    error: AttemptError | None = None
    usage: dict[str, int] | None = None
    cost_usd: float | None = None
    """RunModel and CompactContext: what the call cost (its usage at its model's price)."""
    stop_reason: str | None = None
    """Why the model stopped (RunModel): end_turn, tool_use, max_tokens, ..."""
    wait: Wait | None = None
    polls: int = 0
    """For PollToolTask: how many polls found the task still running."""
    poll_start: int = 0
    """For PollToolTask: index in ``attempts`` of the current poll's first attempt (the
    retry policy counts per poll; every attempt stays on record)."""

    @property
    def current(self) -> Attempt | None:
        if self.attempts and self.attempts[-1].outcome == AttemptOutcome.RUNNING:
            return self.attempts[-1]
        return None

    @property
    def final(self) -> bool:
        """It ended, and nothing changes it any more."""
        return self.status in TERMINAL_STEP


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    model_call_id: str
    name: str
    arguments: dict[str, Any]
    kind: ToolKind | None
    idempotency_key: str
    status: ToolCallStatus = ToolCallStatus.PENDING
    result: Any = None
    error: str | None = None
    step_id: str | None = None
    """The latest Step that runs or waits for this call."""
    arguments_hash: str = ""
    started: bool = False
    """An attempt of this call reached a Worker: from now on its tool may have run."""
    approval: dict[str, Any] | None = None
    questions: list[dict[str, Any]] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    sleeps_done: int = 0
    task_handle: Any = None
    checking: bool = False
    """A check probe is settling this call's outcome_unknown."""
    reconciled: dict[str, Any] | None = None

    @property
    def settled(self) -> bool:
        """Terminal, and no check is still running for it."""
        return self.status.terminal and not self.checking

    @property
    def final(self) -> bool:
        """Nothing changes it any more: settled with a known outcome (an outcome_unknown
        may still be checked or reconciled)."""
        return self.settled and self.status != ToolCallStatus.OUTCOME_UNKNOWN


class TurnStatus(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Turn(msgspec.Struct, kw_only=True):
    number: int
    message_id: str | None = None
    history_start: int = 0
    """Index of the turn's user message in the history: a compaction summarizes what came
    before it and keeps the turn's own items as they are."""
    history_chars: int = 0
    """Estimated size of the history items this turn appended."""
    trace: str | None = None
    """The W3C ``traceparent`` of the turn's span, when tracing is on: a node that
    recovers the turn continues its trace."""
    status: TurnStatus = TurnStatus.RUNNING
    started_at: float
    ended_at: float | None = None
    error: str | None = None
    text: str | None = None
    steps: list[Step] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    batch: list[str] = field(default_factory=list)
    """The tool calls of the latest model response, in the model's order."""
    usage: Usage = field(default_factory=Usage)
    """The tokens and cost of the turn's model calls whose results committed."""
    steered: list[str] = field(default_factory=list)
    """User messages steered into the turn (``on_busy`` steer) while its model call ran or
    its tool calls had not all settled: they join the history just before its next model
    call (``turn.call_model``), where every model API accepts a user message."""

    def step(self, step_id: str) -> Step | None:
        """A Step by id (``{turn}.{n}``: the n-th Step of the turn)."""
        return _by_id(self.steps, step_id, self.number)

    def tool_call(self, call_id: str) -> ToolCall | None:
        """A tool call by id (``{turn}.{n}``: the n-th call of the turn)."""
        return _by_id(self.tool_calls, call_id, self.number)


Numbered = TypeVar("Numbered", Step, ToolCall)
"""What a turn numbers ``{turn}.{n}``, in the order it makes them."""


def _by_id(items: Sequence[Numbered], item_id: str, turn: int) -> Numbered | None:
    """The item of ``turn`` with id ``item_id``: most often the latest; else the one the id
    names by position, if the id has that shape; else any with that id."""
    if items and items[-1].id == item_id:
        return items[-1]
    head, _, tail = item_id.partition(".")
    if head == str(turn) and tail.isdigit() and 0 < int(tail) <= len(items):
        item = items[int(tail) - 1]
        if item.id == item_id:
            return item
    return next((item for item in reversed(items) if item.id == item_id), None)


class QueuedMessage(msgspec.Struct, kw_only=True):
    number: int
    text: str
    message_id: str | None = None


class SendOutcome(StrEnum):
    """What a user message did (``handlers.receive_message``)."""

    STARTED = "started"
    """The session was idle: the message started its turn."""
    QUEUED = "queued"
    """A turn ran: the message starts its turn once the turns before it have ended."""
    INTERRUPTED = "interrupted"
    """A turn ran: it was cancelled, and the message started its turn at once."""
    STEERED = "steered"
    """A turn ran: the message joined it, and that turn answers it."""


class Sent(msgspec.Struct, kw_only=True, frozen=True):
    """What a user message did: ``turn`` answers it; ``interrupted``: the turn it
    cancelled."""

    turn: int
    outcome: SendOutcome
    interrupted: int | None = None


class ForkedFrom(msgspec.Struct, kw_only=True):
    """The session a fork was made from, and the first of its turns the fork does not have."""

    session_id: str
    turn: int


class SessionStatus(StrEnum):
    IDLE = "idle"
    RUNNING = "running"


class FleetStatus(StrEnum):
    """A session's status as the API shows it (and the store indexes it): the engine's
    ``SessionStatus`` told apart further."""

    IDLE = "idle"
    """No turn runs; the last one completed or was cancelled (or there was none)."""
    RUNNING = "running"
    """A turn runs and waits for no person."""
    WAITING = "waiting"
    """A turn waits for a person: an approval, an answer to a question, or a bigger budget."""
    FAILED = "failed"
    """No turn runs, and the last one failed."""


PERSON_WAITS = (
    StepType.AWAIT_TOOL_APPROVAL,
    StepType.AWAIT_QUESTION_ANSWER,
    StepType.AWAIT_BUDGET,
)
"""The waits that a person ends (a timer ends by itself)."""


class SessionState(msgspec.Struct, kw_only=True):
    id: str
    agent: str
    created_at: float
    tenant: str | None = None
    """Whose session it is, given at creation and never changed (a fork keeps it); a
    tenant-scoped client token sees only its tenant's sessions. None: no tenant."""
    priority: int = 0
    """Its Steps go ahead of those of its tenant's sessions of a lower priority, for good
    (the queues still share the Workers fairly between tenants: docs/flow-control.md)."""
    status: SessionStatus = SessionStatus.IDLE
    turn: Turn | None = None
    queued: list[QueuedMessage] = field(default_factory=list)
    messages_received: int = 0
    history_length: int = 0
    context_start: int = 0
    """The model sees the history from this index on (after the latest summary, if any)."""
    summary_at: int | None = None
    """Index of the latest summary, which the model sees first; None before the first."""
    context_chars: int = 0
    """Estimated size of what the model sees, for compaction."""
    inbox: list[dict[str, Any]] = field(default_factory=list)
    """Recorded inputs (an approval, an answer, a fired timer) whose handler has not run."""
    forked_from: ForkedFrom | None = None
    updated_at: float = 0.0
    """When the latest transition was committed."""
    last_turn_status: TurnStatus | None = None
    """How the latest ended turn ended."""
    unknown_ended: int = 0
    """Tool calls of ended turns that are ``outcome_unknown`` and not reconciled yet."""
    usage: Usage = field(default_factory=Usage)
    """The tokens and cost of every model call of the session whose result committed."""
    budget: Budget | None = None
    """What the session may use in all; None: no limit."""

    def context(self, history: Sequence[T], end: int | None = None) -> list[T]:
        """What the model sees: the latest summary, then the history from ``context_start``
        on (up to ``end``)."""
        items = [
            item
            for i, item in enumerate(history[self.context_start : end], self.context_start)
            if i != self.summary_at
        ]
        return ([history[self.summary_at]] if self.summary_at is not None else []) + items

    def to_compact(self, history: Sequence[T]) -> list[T]:
        """What a compaction summarizes: what the model sees, up to the current turn."""
        return self.context(history, self.turn.history_start if self.turn else None)

    def running_steps(self) -> list[Step]:
        if self.turn is None:
            return []
        return [s for s in self.turn.steps if s.status == StepStatus.RUNNING]

    def queued_steps(self) -> list[Step]:
        if self.turn is None:
            return []
        return [s for s in self.turn.steps if s.status == StepStatus.QUEUED]

    def waiting_steps(self) -> list[Step]:
        if self.turn is None:
            return []
        return [s for s in self.turn.steps if s.status == StepStatus.WAITING]

    def person_waits(self, start: int = 0) -> list[Step]:
        """The waits for a person (an approval, an answer) whose resolution is not recorded
        yet: what the turn waits for until somebody acts. ``start``: the Steps before it
        are known to have ended (a commit looks at the others only)."""
        if self.turn is None:
            return []
        steps = self.turn.steps
        waits = [
            step
            for i in range(start, len(steps))
            if (step := steps[i]).status == StepStatus.WAITING and step.type in PERSON_WAITS
        ]
        if waits and self.inbox:  # each commit asks: the set only when a wait is found
            recorded = {e["step_id"] for e in self.inbox}
            waits = [step for step in waits if step.id not in recorded]
        return waits

    def waiting_since(self, waits: list[Step] | None = None) -> float | None:
        """Since when the turn waits for a person (its oldest such wait); None if it does
        not. ``waits``: its ``person_waits()``, when known."""
        found = self.person_waits() if waits is None else waits
        since = [s.wait.since if s.wait else s.created_at for s in found]
        return min(since) if since else None

    def fleet_status(self, waits: list[Step] | None = None) -> FleetStatus:
        if self.turn is not None:
            found = self.person_waits() if waits is None else waits
            return FleetStatus.WAITING if found else FleetStatus.RUNNING
        if self.last_turn_status == TurnStatus.FAILED:
            return FleetStatus.FAILED
        return FleetStatus.IDLE

    def outcome_unknown(self, start: int = 0) -> int:
        """How many of the session's tool calls are ``outcome_unknown``, not reconciled.
        ``start``: the current turn's calls before it are known to be settled otherwise."""
        live = 0
        if self.turn is not None:
            calls = self.turn.tool_calls
            for i in range(start, len(calls)):
                if calls[i].status == ToolCallStatus.OUTCOME_UNKNOWN:
                    live += 1
        return self.unknown_ended + live


def attempt_id(session_id: str, step_id: str, number: int) -> str:
    return f"{session_id}/{step_id}/{number}"


def parse_attempt_id(value: str) -> tuple[str, str, int]:
    session_id, step_id, number = value.rsplit("/", 2)
    return session_id, step_id, int(number)
