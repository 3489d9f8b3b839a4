"""Run an OpenAI Agents SDK agent on Dex, its Dex tools as Dex Steps.

    from agents import Agent as SDKAgent
    from dex.adapters.openai_agents import OpenAIAgents

    sdk_agent = SDKAgent(name="concierge", instructions="...", model="gpt-4.1",
                         tools=[get_time])             # the SDK's own tools run inline
    agent = dex.Agent(name="concierge", model=OpenAIAgents(sdk_agent),
                      tools=[book_table])               # @dex.tool functions: Dex Steps

How a turn runs. One RunModel Step runs one *segment*: ``Runner.run_streamed`` until the
model calls a Dex tool. Every Dex tool is given to the SDK as a function tool that needs
approval, so the SDK stops there with an interruption per call. The segment returns
those calls as the ModelResponse's tool calls, with the SDK's ``RunState`` (JSON) as its
``state``; the server stores it in the history (``AssistantItem.state``). Dex runs each
call as its own ``CallTool`` or ``CallSingleAttemptTool`` Step, by the tool's kind, the
calls of one segment in parallel. The next RunModel, on any Worker, restores the
``RunState`` from the history, approves each call (or rejects one that Dex recorded as
denied) and resumes the run; the SDK then "invokes" the tool, which returns the result
Dex recorded without running anything.

Everything else runs inside the segment and repeats when RunModel runs again (a crash,
a retry): model calls, the SDK agent's own function tools, hosted tools, handoffs,
guardrails and MCP tools. They are at-least-once; see docs/agent-frameworks.md.

A new turn starts from the Dex history (translated to Responses input items), so a
summary, a note or an earlier turn's Dex tool calls reach the model; the inline tool
calls of earlier turns do not, only the answers they led to.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

try:
    import agents
    import openai
    from agents import (
        Agent as SDKAgent,
    )
    from agents import (
        FunctionTool,
        RunConfig,
        Runner,
        RunResultStreaming,
        RunState,
        ToolApprovalItem,
        TResponseInputItem,
    )
    from agents.exceptions import (
        AgentsException,
        InputGuardrailTripwireTriggered,
        MaxTurnsExceeded,
        ModelBehaviorError,
        OutputGuardrailTripwireTriggered,
        UserError,
    )
    from agents.tool_context import ToolContext as SDKToolContext
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "dex.adapters.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'dex-runtime[openai-agents]'"
    ) from e
from pydantic import BaseModel

from dex.models import _translate as tr
from dex.models.base import SUMMARY_INSTRUCTIONS, SUMMARY_REQUEST, Model, ModelError, ModelRequest
from dex.models.openai import OpenAI
from dex.wire import (
    AssistantItem,
    Item,
    ModelResponse,
    ModelToolCall,
    Summary,
    ToolCallStatus,
    ToolResultItem,
    ToolSpec,
    Usage,
    UserItem,
)

__all__ = ["PROVIDER", "STATE_KEY", "OpenAIAgents"]

PROVIDER = "openai-agents"
_LAZY_MODULES = (
    "openai.resources.responses.responses",
    "openai.resources.chat.completions.completions",
)
STATE_KEY = "openai_agents"
"""The key of this adapter's data in ``AssistantItem.state``."""


class OpenAIAgents(Model):
    """An OpenAI Agents SDK agent as a Dex model.

    ``agent`` is the SDK agent, with its own model, instructions, tools, handoffs and
    guardrails. The ``dex.Agent``'s tools are added to it as function tools that need
    approval (a name both define is an error). ``run_config`` and ``max_turns`` (model
    calls per segment) go to ``Runner.run_streamed`` as they are. The SDK model's client
    and its retries are the agent's own: set ``max_retries=0`` on an ``AsyncOpenAI``
    you give it, so that Dex's retry policy is the only one.
    """

    def __init__(
        self,
        agent: SDKAgent[Any],
        *,
        run_config: RunConfig | None = None,
        max_turns: int = 10,
    ) -> None:
        if not isinstance(agent, SDKAgent):
            raise TypeError(f"OpenAIAgents wraps an agents.Agent, not {type(agent).__name__}")
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self.agent = agent
        self.run_config = run_config
        self.max_turns = max_turns

    def __repr__(self) -> str:
        return f"OpenAIAgents(agent={self.agent.name!r})"

    def warm_up(self) -> None:
        """Import the openai SDK's API modules (loaded lazily on first use) and build its
        stream event schemas now: over a second on first use, blocking the event loop and
        so the heartbeats of every attempt the Worker holds."""
        for module in _LAZY_MODULES:
            importlib.import_module(module)
        for api in ("responses", "chat"):
            OpenAI("warm-up", api=api).warm_up()

    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "provider": PROVIDER,
            "agent": self.agent.name,
            "sdk_version": agents.__version__,
            "max_turns": self.max_turns,
            "inline_tools": [_tool_name(t) for t in self.agent.tools],
        }
        model = self.agent.model
        if isinstance(model, str):
            spec["model"] = model
        elif model is not None:
            spec["model"] = str(getattr(model, "model", type(model).__name__))
        return spec

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        segment = _Segment.of(request.history)
        agent = self._agent(request, segment.results)
        run_input: str | list[TResponseInputItem] | RunState[Any]
        if segment.saved is not None:
            state = await _restore(agent, segment)
            run_input, before = state, segment.usage
        else:
            run_input = cast(list[TResponseInputItem], tr.to_responses(request.history))
            before = Usage()
        run = Runner.run_streamed(
            agent, run_input, run_config=self.run_config, max_turns=self.max_turns
        )
        text: list[str] = []
        try:
            async for event in run.stream_events():
                if event.type == "raw_response_event" and (
                    event.data.type == "response.output_text.delta"
                ):
                    delta: str = event.data.delta
                    if delta:
                        text.append(delta)
                        yield delta
        except ModelError:
            raise
        except Exception as e:
            raise _model_error(e) from e
        total = _usage(run)
        usage = Usage(
            input_tokens=max(0, total.input_tokens - before.input_tokens),
            output_tokens=max(0, total.output_tokens - before.output_tokens),
        )
        if run.interruptions:
            yield ModelResponse(
                text="".join(text),
                tool_calls=_calls(run.interruptions, {t.name for t in request.tools}),
                stop_reason="tool_use",
                usage=usage,
                state={
                    STATE_KEY: {
                        "run_state": run.to_state().to_json(),
                        "usage": total.model_dump(),
                    }
                },
            )
        else:
            yield ModelResponse(text=_final_text(run.final_output), usage=usage)

    async def summarize(self, request: ModelRequest) -> Summary:
        """The SDK agent's model, without tools, asked for a summary of the history."""
        summarizer = self.agent.clone(
            instructions=SUMMARY_INSTRUCTIONS,
            tools=[],
            handoffs=[],
            mcp_servers=[],
            input_guardrails=[],
            output_guardrails=[],
            output_type=None,
        )
        history = [*request.history, UserItem(text=SUMMARY_REQUEST)]
        try:
            result = await Runner.run(
                summarizer,
                cast(list[TResponseInputItem], tr.to_responses(history)),
                run_config=self.run_config,
                max_turns=1,
            )
        except Exception as e:
            raise _model_error(e) from e
        text = _final_text(result.final_output)
        if not text:
            raise ModelError("the model returned no summary", retryable=True, provider=PROVIDER)
        usage = result.context_wrapper.usage
        return Summary(
            text=text,
            usage=Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens),
        )

    def _agent(self, request: ModelRequest, results: Mapping[str, ToolResultItem]) -> SDKAgent[Any]:
        """The SDK agent of this segment: its own tools plus a function tool per Dex tool,
        answering with the results Dex recorded."""
        own = {_tool_name(t) for t in self.agent.tools}
        clash = sorted(own & {t.name for t in request.tools})
        if clash:
            raise ModelError(
                f"{PROVIDER}: the SDK agent {self.agent.name!r} and the dex.Agent both define "
                f"the tool(s) {clash}: give each tool one home (a @dex.tool runs as a Dex Step)",
                retryable=False,
                provider=PROVIDER,
            )
        tools = [*self.agent.tools, *(_deferred(spec, results) for spec in request.tools)]
        overrides: dict[str, Any] = {"tools": tools}
        if self.agent.instructions is None and request.instructions:
            overrides["instructions"] = request.instructions
        return self.agent.clone(**overrides)


# --- the segment ---------------------------------------------------------------------------


@dataclass
class _Segment:
    """Where the current turn stands in the history: the RunState the last segment left
    (None: the turn starts a fresh run) and the results Dex recorded for its calls."""

    saved: dict[str, Any] | None = None
    results: dict[str, ToolResultItem] = field(default_factory=dict)

    @property
    def usage(self) -> Usage:
        return Usage.model_validate((self.saved or {}).get("usage") or {})

    @classmethod
    def of(cls, history: list[Item]) -> _Segment:
        # the turn's latest assistant item: after it come only its calls' results
        for index in range(len(history) - 1, -1, -1):
            item = history[index]
            if isinstance(item, UserItem):
                break
            if isinstance(item, AssistantItem):
                saved = item.state.get(STATE_KEY) if isinstance(item.state, dict) else None
                if not isinstance(saved, dict) or "run_state" not in saved:
                    break
                results = {
                    r.call_id: r for r in history[index + 1 :] if isinstance(r, ToolResultItem)
                }
                return cls(saved, results)
        return cls()


async def _restore(agent: SDKAgent[Any], segment: _Segment) -> RunState[Any]:
    """The stored RunState with each Dex call approved, or rejected when Dex denied it."""
    assert segment.saved is not None
    try:
        state: RunState[Any] = await RunState.from_json(agent, segment.saved["run_state"])
    except Exception as e:
        raise ModelError(
            f"{PROVIDER}: cannot restore the stored RunState ({type(e).__name__}: {e}); the "
            "Worker's SDK agent or SDK version differs from the one that saved it",
            retryable=False,
            provider=PROVIDER,
        ) from e
    for item in state.get_interruptions():
        result = segment.results.get(_call_id(item))
        if result is not None and result.status == ToolCallStatus.DENIED:
            state.reject(item, rejection_message=tr.result_text(result))
        else:
            state.approve(item)
    return state


def _deferred(spec: ToolSpec, results: Mapping[str, ToolResultItem]) -> FunctionTool:
    """A Dex tool as the SDK sees it: it needs approval, so the SDK stops at each call;
    once approved (the call ran as a Dex Step) it returns what Dex recorded."""

    async def recorded(ctx: SDKToolContext[Any], arguments: str) -> str:
        result = results.get(ctx.tool_call_id)
        if result is None:  # not expected: every approved call has its result
            return f"{ToolCallStatus.OUTCOME_UNKNOWN.value}: {tr.MISSING_RESULT}"
        return tr.result_text(result)

    return FunctionTool(
        name=spec.name,
        description=spec.description,
        params_json_schema=spec.parameters,
        on_invoke_tool=recorded,
        strict_json_schema=False,  # Dex's argument schemas need not meet strict mode
        needs_approval=True,
    )


def _calls(interruptions: list[ToolApprovalItem], dex_tools: set[str]) -> list[ModelToolCall]:
    calls: list[ModelToolCall] = []
    for item in interruptions:
        name = item.tool_name or ""
        if name not in dex_tools:
            raise ModelError(
                f"{PROVIDER}: the SDK agent's tool {name!r} asked for approval; only Dex tools "
                "can wait (declare it with @dex.tool(approval=...) on the dex.Agent instead)",
                retryable=False,
                provider=PROVIDER,
            )
        arguments = _raw(item, "arguments")
        calls.append(
            ModelToolCall(
                id=_call_id(item),
                name=name,
                arguments=tr.decode_arguments(arguments if isinstance(arguments, str) else None),
            )
        )
    return calls


def _raw(item: ToolApprovalItem, key: str) -> Any:
    raw = item.raw_item
    return raw.get(key) if isinstance(raw, dict) else getattr(raw, key, None)


def _call_id(item: ToolApprovalItem) -> str:
    return str(_raw(item, "call_id") or _raw(item, "id") or "")


def _tool_name(tool: Any) -> str:
    return str(getattr(tool, "name", type(tool).__name__))


def _usage(run: RunResultStreaming) -> Usage:
    usage = run.context_wrapper.usage
    return Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)


def _final_text(output: Any) -> str:
    if output is None:
        return ""
    if isinstance(output, str):
        return output
    if isinstance(output, BaseModel):
        return output.model_dump_json()
    return json.dumps(output, ensure_ascii=False, default=str)


def _model_error(e: BaseException) -> ModelError:
    """An exception of a segment as a ModelError whose ``retryable`` follows Dex's rules."""
    if isinstance(e, ModelError):
        return e
    if isinstance(e, openai.APIStatusError):
        body = e.body.get("error", e.body) if isinstance(e.body, dict) else None
        message = body.get("message") if isinstance(body, dict) else None
        return tr.http_error(PROVIDER, e.status_code, str(message or e.message))
    if isinstance(e, openai.APIConnectionError):  # a timeout too
        return tr.connection_error(PROVIDER, e)
    if isinstance(e, InputGuardrailTripwireTriggered | OutputGuardrailTripwireTriggered):
        return ModelError(
            f"{PROVIDER}: a guardrail tripped ({type(e).__name__}); not retryable",
            retryable=False,
            provider=PROVIDER,
        )
    if isinstance(e, MaxTurnsExceeded | UserError):
        return ModelError(f"{PROVIDER}: {e}; not retryable", retryable=False, provider=PROVIDER)
    if isinstance(e, ModelBehaviorError | AgentsException):
        return ModelError(f"{PROVIDER}: {e}; retryable", retryable=True, provider=PROVIDER)
    return ModelError(
        f"{PROVIDER}: {type(e).__name__}: {e}; retryable", retryable=True, provider=PROVIDER
    )
