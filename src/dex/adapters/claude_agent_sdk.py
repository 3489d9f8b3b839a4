"""Run a Claude Agent SDK agent (the Claude Code CLI) on Dex, its Dex tools as Dex Steps.

    from claude_agent_sdk import ClaudeAgentOptions
    from dex.adapters.claude_agent_sdk import ClaudeAgent

    options = ClaudeAgentOptions(model="claude-sonnet-4-5", allowed_tools=["Read"], cwd="/srv")
    agent = dex.Agent(name="coder", model=ClaudeAgent(options), tools=[open_ticket])

How a turn runs. One RunModel Step runs one *segment*: one ``query()`` of the CLI until
the model calls a Dex tool. Dex tools reach the CLI through an in-process SDK MCP server
(``mcp__dex__<tool>``); a ``PreToolUse`` hook answers ``defer`` for a call Dex has not
run yet, so the CLI ends the segment with that call (``ResultMessage.deferred_tool_use``).
The segment returns it as the ModelResponse's tool call with the session transcript as
its ``state``: the transcript every segment's CLI wrote (mirrored through the SDK's
``session_store``), compressed, which the server stores in the history. Dex runs the
call as its own ``CallTool`` or ``CallSingleAttemptTool`` Step, by the tool's kind. The
next segment, on any Worker, loads that transcript into the store and resumes the
session (``resume=...``, ``fork_session=True``: a fresh session id per attempt, so a
crashed attempt leaves nothing behind) with the prompt stream open and empty; the CLI
runs the deferred call again, the hook allows it, and the MCP tool answers with what Dex
recorded, without running anything. A new turn resumes the last segment's session with
the user's message as the prompt.

Parallel calls. The bundled CLI defers only the last of several deferred calls of one
response and drops the others on resume. So the hook defers only the first Dex call of a
segment and refuses the others with a result that says they did not run
(``TOOL_CALL_NOT_RUN_ERROR_PREFIX``): the model calls them again, one per segment.

Everything else runs inside the segment and repeats when RunModel runs again: model
calls, the CLI's built-in tools (Bash, Write, Edit, Task...), other MCP servers, hosted
tools. They are at-least-once; see docs/agent-frameworks.md.

The CLI runs with a fresh ``CLAUDE_CONFIG_DIR`` per segment, and ``DEFAULT_ENV``: telemetry,
update checks, error reporting and other non-essential traffic off, its own retries off,
tool search off (the options' ``env`` overrides any of them).
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import tempfile
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any, cast

try:
    from claude_agent_sdk import (
        AssistantMessage,
        ClaudeAgentOptions,
        HookContext,
        HookInput,
        HookJSONOutput,
        HookMatcher,
        ResultMessage,
        SdkMcpTool,
        TextBlock,
        create_sdk_mcp_server,
        query,
    )
    from claude_agent_sdk import __version__ as sdk_version
    from claude_agent_sdk._errors import ClaudeSDKError, ResultError
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "dex.adapters.claude_agent_sdk needs the Claude Agent SDK: "
        "pip install 'dex-runtime[claude-agent-sdk]'"
    ) from e

from dex.models import _translate as tr
from dex.models.base import SUMMARY_INSTRUCTIONS, SUMMARY_REQUEST, Model, ModelError, ModelRequest
from dex.wire import (
    TOOL_CALL_NOT_RUN_ERROR_PREFIX,
    AssistantItem,
    Item,
    ModelResponse,
    ModelToolCall,
    NoteItem,
    Summary,
    SummaryItem,
    ToolCallStatus,
    ToolResultItem,
    ToolSpec,
    Usage,
    UserItem,
)

__all__ = ["DEFAULT_ENV", "PROVIDER", "SERVER", "STATE_KEY", "ClaudeAgent"]

PROVIDER = "claude-agent-sdk"
STATE_KEY = "claude_agent_sdk"
"""The key of this adapter's data in ``AssistantItem.state``."""
SERVER = "dex"
"""The in-process MCP server's name: the CLI calls a Dex tool ``mcp__dex__<tool>``."""
PREFIX = f"mcp__{SERVER}__"

DEFAULT_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
    "CLAUDE_CODE_MAX_RETRIES": "0",
    "ENABLE_TOOL_SEARCH": "false",
}
"""The CLI's environment by default: no traffic but the model calls; no retries of its
own (Dex's retry policy of RunModel is the only one); every tool's schema in the prompt
(with tool search on, the CLI lists MCP tools, the Dex tools among them, by name only)."""

ONE_AT_A_TIME = (
    f"{TOOL_CALL_NOT_RUN_ERROR_PREFIX}: Dex runs one call of its tools at a time; call it "
    "again after the result of the call before it"
)


class ClaudeAgent(Model):
    """A Claude Agent SDK agent as a Dex model.

    ``options`` are the SDK's ``ClaudeAgentOptions`` (model, system prompt, allowed
    built-in tools, permission mode, working directory, other MCP servers, hooks,
    ``max_turns``...). The ``dex.Agent``'s tools are added as the MCP server ``dex``;
    the ``dex.Agent``'s instructions become the system prompt when the options set none.
    """

    def __init__(self, options: ClaudeAgentOptions | None = None) -> None:
        options = options or ClaudeAgentOptions()
        if not isinstance(options, ClaudeAgentOptions):
            raise TypeError(f"ClaudeAgent takes ClaudeAgentOptions, not {type(options).__name__}")
        if not isinstance(options.mcp_servers, dict):
            raise TypeError("give ClaudeAgent mcp_servers as a dict, not a config file path")
        if SERVER in options.mcp_servers:
            raise ValueError(f"the MCP server name {SERVER!r} is Dex's: rename yours")
        if options.resume or options.continue_conversation or options.session_store:
            raise ValueError(
                "resume, continue_conversation and session_store are Dex's: leave them unset"
            )
        self.options = options

    def __repr__(self) -> str:
        return f"ClaudeAgent(model={self.options.model!r})"

    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"provider": PROVIDER, "sdk_version": sdk_version}
        if self.options.model:
            spec["model"] = self.options.model
        if self.options.max_turns is not None:
            spec["max_turns"] = self.options.max_turns
        spec["inline_tools"] = list(self.options.allowed_tools)
        return spec

    async def stream(self, request: ModelRequest) -> AsyncIterator[str | ModelResponse]:
        start = _Start.of(request.history)
        segment = _Segment(start, {t.name for t in request.tools})
        config = tempfile.mkdtemp(prefix="dex-claude-")  # no state survives the segment
        try:
            options = self._options(request, segment, config)
            text: list[str] = []
            result: ResultMessage | None = None
            done = asyncio.Event()
            try:
                async for message in query(prompt=_prompt(start.prompt, done), options=options):
                    if isinstance(message, AssistantMessage):
                        for block in message.content:
                            if isinstance(block, TextBlock) and block.text:
                                text.append(block.text)
                                yield block.text
                    elif isinstance(message, ResultMessage):
                        result = message
                        done.set()  # the prompt stream ends: the CLI exits
            except ResultError as e:
                raise _result_error(e) from e
            except ClaudeSDKError as e:
                raise ModelError(
                    f"{PROVIDER}: {type(e).__name__}: {e}; retryable",
                    retryable=True,
                    provider=PROVIDER,
                ) from e
            finally:
                done.set()
            if result is None:
                raise tr.incomplete_stream(PROVIDER)
            yield segment.response(result, "".join(text))
        finally:
            await asyncio.to_thread(shutil.rmtree, config, True)

    async def summarize(self, request: ModelRequest) -> Summary:
        """The CLI's model, with no tools and a session of its own, asked to summarize the
        history (a CompactContext Step). Dex's summary shortens what a new session would
        start from; a resumed CLI session keeps its own context and compacts it itself."""
        config = tempfile.mkdtemp(prefix="dex-claude-")
        options = replace(
            self.options,
            tools=[],
            allowed_tools=[],
            mcp_servers={},
            hooks=None,
            system_prompt=SUMMARY_INSTRUCTIONS,
            max_turns=1,
            env={**DEFAULT_ENV, **self.options.env, "CLAUDE_CONFIG_DIR": config},
        )
        conversation = json.dumps(tr.to_anthropic(request.history), ensure_ascii=False)
        prompt = f"{SUMMARY_REQUEST}\n\nThe conversation (Messages API JSON):\n{conversation}"
        done = asyncio.Event()
        result: ResultMessage | None = None
        try:
            async for message in query(prompt=_prompt(prompt, done), options=options):
                if isinstance(message, ResultMessage):
                    result = message
                    done.set()
        except ResultError as e:
            raise _result_error(e) from e
        except ClaudeSDKError as e:
            raise ModelError(
                f"{PROVIDER}: {e}; retryable", retryable=True, provider=PROVIDER
            ) from e
        finally:
            done.set()
            await asyncio.to_thread(shutil.rmtree, config, True)
        if result is None or not result.result:
            raise ModelError("the model returned no summary", retryable=True, provider=PROVIDER)
        return Summary(text=result.result, usage=_usage(result))

    def _options(self, request: ModelRequest, segment: _Segment, config: str) -> ClaudeAgentOptions:
        base = self.options
        hooks = dict(base.hooks or {})
        hooks["PreToolUse"] = [
            HookMatcher(hooks=[segment.pre_tool_use]),
            *hooks.get("PreToolUse", []),
        ]
        tools = [_mcp_tool(spec, segment) for spec in request.tools]
        servers = dict(cast(dict[str, Any], base.mcp_servers))
        servers[SERVER] = create_sdk_mcp_server(SERVER, tools=tools)
        overrides: dict[str, Any] = {
            "mcp_servers": servers,
            "hooks": hooks,
            "allowed_tools": [*base.allowed_tools, *(PREFIX + t.name for t in request.tools)],
            "env": {**DEFAULT_ENV, **base.env, "CLAUDE_CONFIG_DIR": config},
            "session_store": segment.store,
            "session_store_flush": "eager",
        }
        if segment.start.saved is not None:
            overrides["resume"] = segment.start.saved["session_id"]
            overrides["fork_session"] = True  # a fresh session per attempt
            segment.store.load_saved(segment.start.saved)
        if base.system_prompt is None and request.instructions:
            overrides["system_prompt"] = request.instructions
        return replace(base, **overrides)


# --- where the turn stands ----------------------------------------------------------------


@dataclass
class _Start:
    """How a segment starts: resuming ``saved`` (a session a segment left) or not, with
    ``prompt`` (None: mid-turn, the CLI resumes the deferred call) and the results Dex
    recorded for the calls since."""

    saved: dict[str, Any] | None = None
    prompt: str | None = None
    results: dict[str, ToolResultItem] = field(default_factory=dict)

    @classmethod
    def of(cls, history: list[Item]) -> _Start:
        last_user = max(
            (i for i, item in enumerate(history) if isinstance(item, UserItem)), default=-1
        )
        for index in range(len(history) - 1, -1, -1):
            item = history[index]
            if not isinstance(item, AssistantItem):
                continue
            saved = item.state.get(STATE_KEY) if isinstance(item.state, dict) else None
            if not isinstance(saved, dict) or "session_id" not in saved:
                continue
            after = history[index + 1 :]
            results = {r.call_id: r for r in after if isinstance(r, ToolResultItem)}
            if index > last_user and saved.get("deferred"):  # mid-turn, after a Dex call
                return cls(saved, None, results)
            # a new turn in the session a segment left (if that turn ended at a deferred
            # call, a failed or cancelled turn, the CLI resumes that call first)
            return cls(saved, _text(after), results)
        return cls(None, _text(history))


def _text(items: list[Item]) -> str:
    """What the user (and Dex: notes, summaries) said in ``items``, as one prompt."""
    parts: list[str] = []
    for item in items:
        if isinstance(item, UserItem):
            parts.append(item.text)
        elif isinstance(item, NoteItem | SummaryItem):
            parts.append(tr.context_text(item))
    return "\n\n".join(parts)


class _Store:
    """The SDK's session store for one segment: the transcript Dex keeps in the history
    in, the one the CLI writes out."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], list[dict[str, Any]]] = {}

    def load_saved(self, saved: dict[str, Any]) -> None:
        session = saved["session_id"]
        for subpath, entries in _unpack(saved["transcript"]).items():
            self.entries[(session, subpath)] = entries

    def transcript(self, session: str) -> dict[str, list[dict[str, Any]]]:
        return {sub: list(e) for (sid, sub), e in self.entries.items() if sid == session}

    async def append(self, key: Any, entries: list[Any]) -> None:
        self.entries.setdefault((key["session_id"], key.get("subpath", "")), []).extend(entries)

    async def load(self, key: Any) -> list[Any] | None:
        return self.entries.get((key["session_id"], key.get("subpath", "")))

    async def list_subkeys(self, key: Any) -> list[str]:
        return [sub for (sid, sub) in self.entries if sid == key["session_id"] and sub]


class _Segment:
    """One segment's decisions: which Dex call to defer, and what a resumed call returns."""

    def __init__(self, start: _Start, dex_tools: set[str]) -> None:
        self.start = start
        self.dex_tools = dex_tools
        self.store = _Store()
        self.deferred: str | None = None
        self.answering: dict[str, list[str]] = {}
        """Per tool, the ids of resumed calls allowed to run, in order: the MCP tool (which
        is not told its call id) answers for the first."""

    async def pre_tool_use(
        self, hook: HookInput, tool_use_id: str | None, context: HookContext
    ) -> HookJSONOutput:
        hook_input = cast(dict[str, Any], hook)
        name = str(hook_input.get("tool_name", ""))
        if not name.startswith(PREFIX) or name.removeprefix(PREFIX) not in self.dex_tools:
            return {}  # not a Dex tool: no opinion
        call_id = tool_use_id or str(hook_input.get("tool_use_id", ""))
        if self.start.saved is not None and call_id == self.start.saved.get("deferred"):
            self.answering.setdefault(name.removeprefix(PREFIX), []).append(call_id)
            return _decision("allow")
        if self.deferred is None:
            self.deferred = call_id
            return _decision("defer")
        return _decision("deny", ONE_AT_A_TIME)

    def answer(self, tool: str) -> dict[str, Any]:
        """What the MCP tool returns for a resumed call: the result Dex recorded."""
        queue = self.answering.get(tool) or []
        call_id = queue.pop(0) if queue else None
        result = self.start.results.get(call_id or "")
        if result is None:
            text = f"{ToolCallStatus.OUTCOME_UNKNOWN.value}: {tr.MISSING_RESULT}"
            return {"content": [{"type": "text", "text": text}], "is_error": True}
        answer: dict[str, Any] = {"content": [{"type": "text", "text": tr.result_text(result)}]}
        if tr.is_error(result):
            answer["is_error"] = True
        return answer

    def response(self, result: ResultMessage, text: str) -> ModelResponse:
        usage = _usage(result)
        deferred = result.deferred_tool_use
        saved: dict[str, Any] = {
            "session_id": result.session_id,
            "transcript": _pack(self.store.transcript(result.session_id)),
        }
        if not saved["transcript"]:
            raise ModelError(
                f"{PROVIDER}: the CLI left no transcript for session {result.session_id}",
                retryable=True,
                provider=PROVIDER,
            )
        if deferred is None:
            return ModelResponse(text=result.result or text, usage=usage, state={STATE_KEY: saved})
        saved["deferred"] = deferred.id
        call = ModelToolCall(
            id=deferred.id, name=deferred.name.removeprefix(PREFIX), arguments=deferred.input
        )
        return ModelResponse(
            text=text,
            tool_calls=[call],
            stop_reason="tool_use",
            usage=usage,
            state={STATE_KEY: saved},
        )


def _usage(result: ResultMessage) -> Usage:
    return Usage(
        input_tokens=int((result.usage or {}).get("input_tokens") or 0),
        output_tokens=int((result.usage or {}).get("output_tokens") or 0),
    )


def _mcp_tool(spec: ToolSpec, segment: _Segment) -> SdkMcpTool[Any]:
    async def recorded(arguments: dict[str, Any]) -> dict[str, Any]:
        return segment.answer(spec.name)

    return SdkMcpTool(
        name=spec.name,
        description=spec.description,
        input_schema=spec.parameters,
        handler=recorded,
    )


def _decision(decision: str, reason: str | None = None) -> HookJSONOutput:
    output: dict[str, Any] = {"hookEventName": "PreToolUse", "permissionDecision": decision}
    if reason is not None:
        output["permissionDecisionReason"] = reason
    return cast(HookJSONOutput, {"hookSpecificOutput": output})


async def _prompt(text: str | None, done: asyncio.Event) -> AsyncIterator[dict[str, Any]]:
    """The prompt stream: the user's message (none when resuming a deferred call), then
    open until the segment's result, as the CLI needs to finish a resumed call."""
    if text is not None:
        yield {"type": "user", "message": {"role": "user", "content": text}}
    await done.wait()


def _pack(transcript: dict[str, list[dict[str, Any]]]) -> str:
    if not any(transcript.values()):
        return ""
    raw = json.dumps(transcript, separators=(",", ":")).encode()
    return base64.b64encode(zlib.compress(raw, 6)).decode()


def _unpack(packed: str) -> dict[str, list[dict[str, Any]]]:
    if not packed:
        return {}
    value: dict[str, list[dict[str, Any]]] = json.loads(zlib.decompress(base64.b64decode(packed)))
    return value


def _result_error(e: ResultError) -> ModelError:
    if e.api_error_status is not None:
        return tr.http_error(PROVIDER, e.api_error_status, e.result or str(e))
    if e.subtype == "error_max_turns":
        return ModelError(
            f"{PROVIDER}: the segment reached max_turns; not retryable",
            retryable=False,
            provider=PROVIDER,
        )
    message = "; ".join(e.errors) or e.result or str(e)
    return ModelError(f"{PROVIDER}: {message}; retryable", retryable=True, provider=PROVIDER)
