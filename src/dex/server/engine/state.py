"""The durable state of one session, as the engine sees it.

A session's state is one JSON document (plus its append-only history). It holds
the current turn with every Step, attempt and tool call, so one row write
records any transition. Ended turns move to the turn archive.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import Field

from dex.wire import (
    AttemptOutcome,
    RecoveryError,
    RetryPolicy,
    StepStatus,
    StepType,
    ToolCallStatus,
    ToolKind,
    Wire,
)

T = TypeVar("T")
"""A history item, or its JSON form: ``context`` selects from either."""


class Attempt(Wire):
    number: int
    worker_id: str
    started_at: float
    ended_at: float | None = None
    outcome: AttemptOutcome = AttemptOutcome.RUNNING
    error: RecoveryError | None = None


class Wait(Wire):
    """What a server-side wait waits for, and how it ended."""

    since: float
    deadline: float | None = None
    """For a timer: when it fires."""
    question: str | None = None
    choices: list[str] | None = None
    resolved_at: float | None = None
    resolution: dict[str, Any] | None = None


class Step(Wire):
    id: str
    type: StepType
    status: StepStatus = StepStatus.QUEUED
    queue: str = ""
    retry: RetryPolicy
    created_at: float
    not_before: float | None = None
    tool_call_id: str | None = None
    attempts: list[Attempt] = Field(default_factory=list)
    handed_back: int = 0
    ended_at: float | None = None
    error: RecoveryError | None = None
    usage: dict[str, int] | None = None
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


class ToolCall(Wire):
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
    questions: list[dict[str, Any]] = Field(default_factory=list)
    answers: list[str] = Field(default_factory=list)
    sleeps_done: int = 0
    task_handle: Any = None
    checking: bool = False
    """A check probe is settling this call's outcome_unknown."""
    reconciled: dict[str, Any] | None = None

    @property
    def settled(self) -> bool:
        """Terminal, and no check is still running for it."""
        return self.status.terminal and not self.checking


class TurnStatus(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Turn(Wire):
    number: int
    message_id: str | None = None
    history_start: int = 0
    """Index of the turn's user message in the history: a compaction summarizes what came
    before it and keeps the turn's own items as they are."""
    history_chars: int = 0
    """Estimated size of the history items this turn appended."""
    status: TurnStatus = TurnStatus.RUNNING
    started_at: float
    ended_at: float | None = None
    error: str | None = None
    text: str | None = None
    steps: list[Step] = Field(default_factory=list)
    tool_calls: list[ToolCall] = Field(default_factory=list)
    batch: list[str] = Field(default_factory=list)
    """The tool calls of the latest model response, in the model's order."""

    def step(self, step_id: str) -> Step | None:
        for step in reversed(self.steps):
            if step.id == step_id:
                return step
        return None

    def tool_call(self, call_id: str) -> ToolCall | None:
        for call in self.tool_calls:
            if call.id == call_id:
                return call
        return None


class QueuedMessage(Wire):
    number: int
    text: str
    message_id: str | None = None


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
    """A turn waits for a person: an approval or an answer to a question."""
    FAILED = "failed"
    """No turn runs, and the last one failed."""


PERSON_WAITS = (StepType.AWAIT_TOOL_APPROVAL, StepType.AWAIT_QUESTION_ANSWER)
"""The waits that a person ends (a timer ends by itself)."""


class SessionState(Wire):
    id: str
    agent: str
    created_at: float
    status: SessionStatus = SessionStatus.IDLE
    turn: Turn | None = None
    queued: list[QueuedMessage] = Field(default_factory=list)
    messages_received: int = 0
    history_length: int = 0
    context_start: int = 0
    """The model sees the history from this index on (after the latest summary, if any)."""
    summary_at: int | None = None
    """Index of the latest summary, which the model sees first; None before the first."""
    context_chars: int = 0
    """Estimated size of what the model sees, for compaction."""
    inbox: list[dict[str, Any]] = Field(default_factory=list)
    """Recorded inputs (an approval, an answer, a fired timer) whose handler has not run."""
    updated_at: float = 0.0
    """When the latest transition was committed."""
    last_turn_status: TurnStatus | None = None
    """How the latest ended turn ended."""
    unknown_ended: int = 0
    """Tool calls of ended turns that are ``outcome_unknown`` and not reconciled yet."""

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

    def person_waits(self) -> list[Step]:
        """The waits for a person (an approval, an answer) whose resolution is not recorded
        yet: what the turn waits for until somebody acts."""
        if self.turn is None:
            return []
        recorded = {e["step_id"] for e in self.inbox}
        return [
            s
            for s in self.turn.steps
            if s.status == StepStatus.WAITING and s.type in PERSON_WAITS and s.id not in recorded
        ]

    def waiting_since(self) -> float | None:
        """Since when the turn waits for a person (its oldest such wait); None if it does not."""
        since = [s.wait.since if s.wait else s.created_at for s in self.person_waits()]
        return min(since) if since else None

    def fleet_status(self) -> FleetStatus:
        if self.turn is not None:
            return FleetStatus.WAITING if self.person_waits() else FleetStatus.RUNNING
        if self.last_turn_status == TurnStatus.FAILED:
            return FleetStatus.FAILED
        return FleetStatus.IDLE

    def outcome_unknown(self) -> int:
        """How many of the session's tool calls are ``outcome_unknown``, not reconciled."""
        live = self.turn.tool_calls if self.turn is not None else []
        return self.unknown_ended + sum(c.status == ToolCallStatus.OUTCOME_UNKNOWN for c in live)


def attempt_id(session_id: str, step_id: str, number: int) -> str:
    return f"{session_id}/{step_id}/{number}"


def parse_attempt_id(value: str) -> tuple[str, str, int]:
    session_id, step_id, number = value.rsplit("/", 2)
    return session_id, step_id, int(number)
