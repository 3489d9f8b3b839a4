"""The plain data that crosses between the server, Workers and clients.

Everything here is JSON: pydantic models with no behaviour beyond validation.
Live objects (a model client, a tool function) never cross the wire; a Worker
rebuilds them from its own registry by name.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

TOOL_CALL_NOT_RUN_ERROR_PREFIX = "the tool did not run, so it is safe to call again"


class Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


# --- tools and agents -------------------------------------------------------


class ToolKind(StrEnum):
    READ = "read"
    IDEMPOTENT_WRITE = "idempotent_write"
    WRITE = "write"
    TASK = "task"
    """Starts external work (an idempotent, keyed call returning a handle), then polls it."""


class Approval(StrEnum):
    NEVER = "never"
    ALWAYS = "always"
    PREDICATE = "predicate"
    """The Worker decides per call, from the tool's predicate on its arguments."""


class RetryPolicy(Wire):
    """How often a Step may be handed to a Worker before it fails for good."""

    max_attempts: int = Field(3, ge=1, le=100)
    within_seconds: float = Field(1800.0, gt=0)
    initial_backoff_seconds: float = Field(1.0, ge=0)
    max_backoff_seconds: float = Field(30.0, ge=0)
    backoff_multiplier: float = Field(2.0, ge=1)

    def backoff(self, failed_attempts: int) -> float:
        """Seconds to wait before attempt ``failed_attempts + 1``."""
        delay = self.initial_backoff_seconds * self.backoff_multiplier ** (failed_attempts - 1)
        return float(min(delay, self.max_backoff_seconds))


SINGLE_ATTEMPT = RetryPolicy(max_attempts=1)


class ToolSpec(Wire):
    name: str = Field(min_length=1, max_length=128)
    description: str = ""
    kind: ToolKind = ToolKind.WRITE
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    approval: Approval = Approval.NEVER
    poll_interval_seconds: float = Field(1.0, gt=0)
    """For kind ``task``: the time between two polls."""
    has_check: bool = False
    """The tool defines a check (a read) that settles an ``outcome_unknown`` by itself."""
    concurrency_key: str | None = Field(None, max_length=256)
    """Calls of this tool under one key run at most ``concurrency_limit`` at once, across
    every Worker: a template of the call's arguments, ``{name}`` standing for argument
    ``name``'s value (``"{customer_id}"``: one booking at a time per customer; ``""``: one
    key for every call of the tool). The server holds the others queued."""
    concurrency_limit: int = Field(1, ge=1)


OnBusy = Literal["enqueue", "reject", "interrupt", "steer"]
"""What a user message does when it arrives while a turn of its session runs
(docs/mid-turn.md): ``enqueue`` waits for the turn to end and starts the next one;
``reject`` is refused (409); ``interrupt`` cancels the running turn and starts a new one
with the message, in one commit; ``steer`` joins the running turn, whose next model call
sees it."""

ON_BUSY: tuple[OnBusy, ...] = ("enqueue", "reject", "interrupt", "steer")


class AgentSpec(Wire):
    """What a Worker tells the server about an agent it serves."""

    name: str = Field(min_length=1, max_length=128)
    model: dict[str, Any] = Field(default_factory=dict)
    instructions: str = ""
    tools: list[ToolSpec] = Field(default_factory=list)
    model_retry: RetryPolicy = Field(default_factory=RetryPolicy)
    compact_threshold_chars: int | None = Field(None, ge=100)
    """Summarize the history before RunModel once it holds more than this many characters."""
    on_busy: OnBusy = Field("enqueue", exclude_if=lambda v: v == "enqueue")
    """What a user message does while a turn runs, unless its send says otherwise. Left
    out when it is the default, so a Worker that keeps it registers with a server that
    does not know the field."""

    def tool(self, name: str) -> ToolSpec | None:
        for spec in self.tools:
            if spec.name == name:
                return spec
        return None


# --- history ---------------------------------------------------------------


class ModelToolCall(Wire):
    """One tool call as the model asked for it."""

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCallStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    OUTCOME_UNKNOWN = "outcome_unknown"
    DENIED = "denied"

    @property
    def terminal(self) -> bool:
        return self not in (ToolCallStatus.PENDING, ToolCallStatus.RUNNING)


class UserItem(Wire):
    type: Literal["user"] = "user"
    text: str


def _absent(value: Any) -> bool:
    return value is None


class AssistantItem(Wire):
    type: Literal["assistant"] = "assistant"
    text: str = ""
    tool_calls: list[ModelToolCall] = Field(default_factory=list)
    state: Any = Field(None, exclude_if=_absent)
    """What a framework adapter needs to resume its turn after these tool calls (e.g. an
    OpenAI Agents ``RunState``), as its model returned it in ``ModelResponse.state``.
    Stored with the history, so any Worker can resume; model providers ignore it."""


class ToolResultItem(Wire):
    type: Literal["tool_result"] = "tool_result"
    call_id: str
    name: str
    status: ToolCallStatus
    result: Any = None
    error: str | None = None


class NoteItem(Wire):
    type: Literal["note"] = "note"
    text: str


class SummaryItem(Wire):
    type: Literal["summary"] = "summary"
    text: str


Item = Annotated[
    UserItem | AssistantItem | ToolResultItem | NoteItem | SummaryItem,
    Field(discriminator="type"),
]
ITEMS = TypeAdapter(list[Item])
ITEM = TypeAdapter(Item)


# --- model output ------------------------------------------------------------


class Usage(Wire):
    input_tokens: int = 0
    output_tokens: int = 0


class ModelResponse(Wire):
    """What a RunModel Step produced: the model's text, the tool calls it asks for, and
    why it stopped (``end_turn``, ``tool_use``: kept for the record)."""

    text: str = ""
    tool_calls: list[ModelToolCall] = Field(default_factory=list)
    stop_reason: str = "end_turn"
    usage: Usage = Field(default_factory=Usage)
    approval_required: list[str] = Field(default_factory=list)
    """Set by the Worker, not the model: ids of the tool calls whose approval predicate
    asked for approval."""
    state: Any = Field(None, exclude_if=_absent)
    """JSON a framework adapter needs to resume after these tool calls: the server stores
    it in the history's ``AssistantItem.state``; a plain model leaves it None."""


# --- steps, attempts, recovery -------------------------------------------------


class StepType(StrEnum):
    RUN_MODEL = "RunModel"
    CALL_TOOL = "CallTool"
    CALL_SINGLE_ATTEMPT_TOOL = "CallSingleAttemptTool"
    POLL_TOOL_TASK = "PollToolTask"
    CHECK_TOOL_CALL = "CheckToolCall"
    COMPACT_CONTEXT = "CompactContext"
    AWAIT_TOOL_APPROVAL = "AwaitToolApproval"
    AWAIT_QUESTION_ANSWER = "AwaitQuestionAnswer"
    AWAIT_TIMER = "AwaitTimer"
    AWAIT_BUDGET = "AwaitBudget"

    @property
    def is_wait(self) -> bool:
        """Waits live in the server and use no Worker."""
        return self in (
            StepType.AWAIT_TOOL_APPROVAL,
            StepType.AWAIT_QUESTION_ANSWER,
            StepType.AWAIT_TIMER,
            StepType.AWAIT_BUDGET,
        )


class StepStatus(StrEnum):
    QUEUED = "queued"
    WAITING = "waiting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class AttemptProgress(StrEnum):
    UNSPECIFIED = "UNSPECIFIED"
    NOT_STARTED = "NOT_STARTED"
    NOT_COMPLETED = "NOT_COMPLETED"


class RecoveryError(Wire):
    """Why an attempt failed, and how far it got."""

    message: str
    attempt_progress: AttemptProgress = AttemptProgress.UNSPECIFIED
    retryable: bool = True


class AttemptOutcome(StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ToolOutcome(Wire):
    """What a tool Step produced.

    ``succeeded`` / ``failed``: a result, or a definite failure (``ToolError``).
    ``asked``: the tool asked the user a question (``ctx.ask``) and must be called again
    with the answer. ``sleep``: the tool sleeps (``ctx.sleep``) and must be called again
    when the timer fires. ``pending``: a task poll found the task still running.
    ``checked``: a check probe's verdict (``happened`` true, false, or null for unknown).
    """

    status: Literal["succeeded", "failed", "asked", "sleep", "pending", "checked"]
    result: Any = None
    error: str | None = None
    question: str | None = None
    choices: list[str] | None = None
    sleep_seconds: float | None = None
    happened: bool | None = None


class Summary(Wire):
    """What a CompactContext Step produced."""

    text: str
    usage: Usage = Field(default_factory=Usage)


MAX_JSON_DEPTH = 64
"""How deeply a value from outside (a tool result, a tool call's arguments) may nest. The
stored session state wraps it in a few more levels, and every level must still parse."""


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether a JSON value nests deeper than ``limit`` lists and objects."""
    level = [value]
    for _ in range(limit + 1):
        nested: list[Any] = []
        for v in level:
            if isinstance(v, dict):
                nested.extend(v.values())
            elif isinstance(v, list):
                nested.extend(v)
        if not nested:
            return False
        level = nested
    return True


def error_body(code: str, message: str, **details: Any) -> dict[str, Any]:
    """The JSON body of every error the API returns."""
    body: dict[str, Any] = {"code": code, "message": message}
    if details:
        body["details"] = details
    return {"error": body}
