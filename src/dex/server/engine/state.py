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
    trace: str | None = None
    """The W3C ``traceparent`` of the turn's span, when tracing is on: a node that
    recovers the turn continues its trace."""
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


class ForkedFrom(Wire):
    """The session a fork was made from, and the first of its turns the fork does not have."""

    session_id: str
    turn: int


class SessionStatus(StrEnum):
    IDLE = "idle"
    RUNNING = "running"


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
    forked_from: ForkedFrom | None = None

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


def attempt_id(session_id: str, step_id: str, number: int) -> str:
    return f"{session_id}/{step_id}/{number}"


def parse_attempt_id(value: str) -> tuple[str, str, int]:
    session_id, step_id, number = value.rsplit("/", 2)
    return session_id, step_id, int(number)
