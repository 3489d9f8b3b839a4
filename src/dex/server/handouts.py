"""The ``step`` message of the Worker protocol: what a Worker is handed for an attempt.

Built as the ``step`` struct of ``dex.wire.server_frames`` (the outbox encodes it with
msgspec; the Worker decodes it with the same struct): the history's
items were serialized once, when they were appended, and a RunModel hand-out carries
only the items of the model's view that the Worker's connection was not sent before
(``history_base``), so its cost follows the new items, not the conversation.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import msgspec

from dex.server.dispatch.dispatcher import WorkerConn
from dex.server.dispatch.limits import Ask
from dex.server.dispatch.queues import Queued
from dex.server.engine.state import SessionState, Step
from dex.wire import AgentSpec, StepType, server_frames

CHARS_PER_TOKEN = 4
"""What a model call's input tokens are estimated from: its characters."""
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


def step_message(
    state: SessionState,
    history_json: list[dict[str, Any]],
    step: Step,
    aid: str,
    worker: WorkerConn,
    traceparent: str | None = None,
) -> server_frames.Step:
    """The hand-out of ``step``'s latest attempt (``aid``) to ``worker``."""
    what: dict[str, Any]  # the model's view, or the tool call
    if step.type in (StepType.RUN_MODEL, StepType.COMPACT_CONTEXT):
        base, context = (
            _context_for(worker, state, history_json)
            if step.type == StepType.RUN_MODEL
            else (0, state.to_compact(history_json))
        )
        what = {"history": msgspec.Raw(_HISTORY.encode(context)), "history_base": base}
    else:
        assert state.turn is not None and step.tool_call_id is not None
        call = state.turn.tool_call(step.tool_call_id)
        assert call is not None
        what = {
            "tool": call.name,
            "call_id": call.id,
            "arguments": call.arguments,
            "idempotency_key": call.idempotency_key,
            "needs_start_ack": step.type == StepType.CALL_SINGLE_ATTEMPT_TOOL,
            "answers": call.answers,
            "sleeps_done": call.sleeps_done,
            "task_handle": call.task_handle,
        }
    return server_frames.Step(
        attempt_id=aid,
        session_id=state.id,
        step_id=step.id,
        step_type=step.type,
        attempt=step.attempts[-1].number,
        agent=state.agent,
        traceparent=traceparent,
        **what,
    )


_HISTORY = msgspec.json.Encoder()
"""Encodes the history a hand-out carries (the frame embeds its JSON as it is)."""


def _context_for(
    worker: WorkerConn, state: SessionState, history: list[dict[str, Any]]
) -> tuple[int, list[dict[str, Any]]]:
    """What a RunModel hand-out to ``worker`` carries of the model's view of the history:
    (how many items the Worker has from the last hand-out on this connection, the rest).
    The cost is the new items, not the conversation's length."""
    shape = (state.context_start, state.summary_at)
    length = len(history)
    sent = worker.history_sent.get(state.id) if worker.history_cache else None
    if sent is not None and sent[0] == shape and sent[1] <= length:
        base = sent[2]
        tail = [history[i] for i in range(sent[1], length) if i != state.summary_at]
    else:
        base, tail = 0, state.context(history)
    if worker.history_cache:
        worker.history_sent[state.id] = (shape, length, base + len(tail))
        worker.history_sent.move_to_end(state.id)
        while len(worker.history_sent) > worker.history_cache:
            worker.history_sent.popitem(last=False)
    return base, tail


def model_group(spec: AgentSpec) -> str:
    """The model group an agent's model calls count against: the name its model config
    gives (``group``), else the provider and the model (``anthropic/claude-sonnet-4-5``).
    Worked out once per spec: a spec is not changed once registered (a new version is a
    new object), so the group is kept by agent name with the very spec it came from."""
    kept = _GROUPS.get(spec.name)
    if kept is not None and kept[0] is spec:
        return kept[1]
    group = _model_group(spec)
    _GROUPS[spec.name] = (spec, group)
    return group


_GROUPS: dict[str, tuple[AgentSpec, str]] = {}
"""By agent name: the spec last asked about and its model group (``model_group``). One
entry per name, so it holds no more than the agents there are; holding the spec itself
makes the ``is`` test exact."""


def _model_group(spec: AgentSpec) -> str:
    model = spec.model
    group = model.get("group")
    if isinstance(group, str) and group:
        return group
    name = model.get("model") or model.get("name") or ""
    return f"{model.get('provider', 'unknown')}/{name}"


def queued(state: SessionState, step: Step, spec: AgentSpec | None = None) -> Queued:
    """``step`` as the dispatcher queues it: with its session's tenant and priority, and
    what its hand-out asks of the limits (``ask_for``; nothing without the agent's spec)."""
    ask = ask_for(state, step, spec) if spec is not None else None
    return Queued(state.id, step.id, step.queue, ask, state.tenant or "", state.priority)


def ask_for(state: SessionState, step: Step, spec: AgentSpec) -> Ask | None:
    """What the hand-out of ``step`` asks of the limits (``dex.server.dispatch.limits``):
    a model call, its group and its expected input tokens; a call of a tool with a
    concurrency key, that key; anything else, nothing."""
    if step.type in (StepType.RUN_MODEL, StepType.COMPACT_CONTEXT):
        size = state.context_chars + len(spec.instructions)
        return Ask(model_group(spec), tokens=size // CHARS_PER_TOKEN)
    if step.type not in (StepType.CALL_TOOL, StepType.CALL_SINGLE_ATTEMPT_TOOL):
        return None
    assert state.turn is not None and step.tool_call_id is not None
    call = state.turn.tool_call(step.tool_call_id)
    tool = spec.tool(call.name) if call is not None else None
    if call is None or tool is None or tool.concurrency_key is None:
        return None
    key = concurrency_key(tool.concurrency_key, call.arguments)
    return Ask(f"tool:{spec.name}/{tool.name}={key}", concurrency=tool.concurrency_limit)


def concurrency_key(template: str, arguments: dict[str, Any]) -> str:
    """A tool's concurrency key for one call: ``template`` with each ``{name}`` replaced
    by argument ``name``'s value (a string as it is, anything else as JSON; a missing
    argument as nothing)."""
    parts = _template(template)
    if len(parts) == 1:
        return template  # no placeholder
    return "".join(
        _argument(arguments.get(part)) if n % 2 else part for n, part in enumerate(parts)
    )


@functools.lru_cache(maxsize=1024)
def _template(template: str) -> tuple[str, ...]:
    """A concurrency key's template split once: its text, then each placeholder's
    argument name followed by the text after it."""
    return tuple(_PLACEHOLDER.split(template))


def _argument(got: Any) -> str:
    if got is None:
        return ""
    return got if isinstance(got, str) else msgspec.json.encode(got).decode()
