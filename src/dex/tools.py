"""Tools: plain Python functions that an agent may call, and the context they run in.

An ``async def`` tool runs on the Worker's event loop; a plain ``def`` tool (and a ``def``
poll or check) runs in a thread of its own, so blocking code in it (``time.sleep``, a
blocking HTTP client, CPU work) never stalls the Worker's heartbeats or its other Steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import re
import threading
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic.fields import FieldInfo

from dex import _docstring
from dex.errors import ToolError
from dex.wire import Approval, RetryPolicy, ToolKind, ToolOutcome, ToolSpec


class Interrupt(BaseException):
    """A tool pauses its call: it asked a question or sleeps. A ``BaseException``, so a
    tool's ``except Exception`` cannot swallow it."""

    def __init__(self, outcome: ToolOutcome) -> None:
        super().__init__(outcome.status)
        self.outcome = outcome


@dataclass
class ToolContext:
    """What a running tool knows about its call. The first parameter typed ``ToolContext``
    receives it.

    An ``async def`` tool awaits ``heartbeat``, ``ask`` and ``sleep``. A plain ``def``
    tool runs in its own thread and calls ``heartbeat_sync``, ``ask_sync`` and
    ``sleep_sync`` instead (same meaning); the async ones there raise a ``TypeError``
    that says so. The fields can be read from either."""

    session_id: str
    call_id: str
    tool: str
    idempotency_key: str
    """Stable for this call across attempts and servers: pass it to the system you call."""
    attempt: int
    _heartbeat: Callable[[], Awaitable[None]]
    answers: list[str] = field(default_factory=list)
    """Answers to the questions this call asked so far, in order."""
    sleeps_done: int = 0
    _asked: int = 0
    _slept: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    """The Worker's loop, set once a ``def`` function of the tool runs with this context
    in a thread (``heartbeat_sync`` sends through it)."""

    def heartbeat(self) -> Awaitable[None]:
        """Tell Dex the tool is alive now: ``await ctx.heartbeat()``. Optional: the Worker
        heartbeats every attempt it holds on its own, whatever the tool does."""
        self._refuse_in_thread("heartbeat")
        return self._heartbeat()

    def heartbeat_sync(self) -> None:
        """``heartbeat`` for a ``def`` tool, from its thread."""
        loop = self._loop
        if loop is None:
            raise TypeError(
                f"tool {self.tool}: ctx.heartbeat_sync() is for def tools; "
                "in an async def tool, await ctx.heartbeat()"
            )

        async def beat() -> None:
            await self._heartbeat()

        asyncio.run_coroutine_threadsafe(beat(), loop).result()

    def ask(self, question: str, choices: list[str] | None = None) -> Awaitable[str]:
        """Ask the user; the call resumes with the answer: ``await ctx.ask(...)``.

        The first time, this ends the tool's Step with the question, and the session waits
        for an answer (``AwaitQuestionAnswer``). Then the tool is called again from the
        start, and this same ``ask`` returns the answer. So the code before it must be
        harmless to run again."""
        self._refuse_in_thread("ask")
        return _ready(self.ask_sync(question, choices))

    def ask_sync(self, question: str, choices: list[str] | None = None) -> str:
        """``ask`` for a ``def`` tool: returns the answer, or ends the call with the
        question (by raising ``Interrupt``, which the tool must let through)."""
        index = self._asked
        self._asked += 1
        if index < len(self.answers):
            return self.answers[index]
        raise Interrupt(ToolOutcome(status="asked", question=question, choices=choices))

    def sleep(self, seconds: float) -> Awaitable[None]:
        """Sleep durably (``AwaitTimer``): ``await ctx.sleep(...)``. The timer lives in the
        server and fires once, even across crashes; then the tool is called again and
        this ``sleep`` returns at once."""
        self._refuse_in_thread("sleep")
        self.sleep_sync(seconds)
        return _ready(None)

    def sleep_sync(self, seconds: float) -> None:
        """``sleep`` for a ``def`` tool: returns at once once the timer fired, or ends the
        call to start it (by raising ``Interrupt``, which the tool must let through)."""
        if seconds < 0:
            raise ValueError("cannot sleep a negative time")
        index = self._slept
        self._slept += 1
        if index < self.sleeps_done:
            return
        raise Interrupt(ToolOutcome(status="sleep", sleep_seconds=seconds))

    def _refuse_in_thread(self, method: str) -> None:
        if self._loop is not None:
            raise TypeError(
                f"tool {self.tool} is a plain function (def), so it runs in a thread: "
                f"call ctx.{method}_sync(...) instead of ctx.{method}(...)"
            )


async def _ready(value: Any) -> Any:
    return value


class _Pending:
    def __repr__(self) -> str:
        return "dex.PENDING"


PENDING: Any = _Pending()
"""Return it from a task's poll while the task still runs."""


@dataclass(frozen=True)
class Checked:
    """A check probe's verdict: ``happened`` True (with the call's ``result``), False (the
    call took no effect), or None (still unknown)."""

    happened: bool | None
    result: Any = None


class Tool:
    """A function made callable by agents. Build it with ``@dex.tool``."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        kind: ToolKind,
        name: str | None = None,
        description: str | None = None,
        retry: RetryPolicy | None = None,
        approval: bool | Callable[..., bool] = False,
        poll_interval: float = 1.0,
        concurrency_key: str | None = None,
        concurrency_limit: int = 1,
    ) -> None:
        self.fn = fn
        self.kind = ToolKind(kind)
        self.name = name or fn.__name__
        doc = _docstring.parse(inspect.getdoc(fn) or "")
        self.description = description or doc.description
        self.retry = retry or RetryPolicy()
        self.approval = approval
        self.poll_interval = poll_interval
        self.concurrency_key = concurrency_key
        self.concurrency_limit = concurrency_limit
        self.poll_fn: Callable[..., Any] | None = None
        self.check_fn: Callable[..., Any] | None = None
        self._context_param: str | None = None
        self._arguments = self._model(fn, doc.params)
        self._spec: ToolSpec | None = None
        if concurrency_limit < 1:
            raise ValueError(f"tool {self.name}: concurrency_limit must be at least 1")
        named = set(re.findall(r"\{([^{}]*)\}", concurrency_key or ""))
        if unknown := sorted(named - set(self._arguments.model_fields)):
            raise TypeError(f"tool {self.name}: concurrency_key names no argument: {unknown}")

    def poll(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate the poll of a ``task`` tool: ``async def poll(ctx, handle)`` returns the
        result, or ``dex.PENDING`` while the task runs. A poll is a read: it may run again."""
        if self.kind != ToolKind.TASK:
            raise TypeError(f"tool {self.name} is not a task: only tasks have a poll")
        self.poll_fn = fn
        self._spec = None
        return fn

    def check(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Decorate a check probe: ``async def check(ctx, **arguments)`` returns
        ``dex.Checked(...)``, True, False or None. Dex runs it (as a read) to settle an
        ``outcome_unknown`` of this tool by itself."""
        self.check_fn = fn
        self._spec = None
        return fn

    def needs_approval(self, arguments: dict[str, Any]) -> bool:
        """Whether this call waits for a person's approval; a predicate that fails says yes."""
        if not callable(self.approval):
            return bool(self.approval)
        try:
            return bool(self.approval(**arguments))
        except Exception:
            return True

    def _model(self, fn: Callable[..., Any], docs: dict[str, str]) -> type[BaseModel]:
        """The arguments' model: each parameter's type with its ``Annotated`` constraints
        (``Field(ge=1, ...)``) and its description, which reach both the schema and the
        validation."""
        hints = typing.get_type_hints(fn, include_extras=True)
        fields: dict[str, Any] = {}
        for param in inspect.signature(fn).parameters.values():
            annotation = hints.get(param.name, Any)
            if _without_extras(annotation) is ToolContext:
                self._context_param = param.name
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"tool {self.name}: *args and **kwargs cannot be described")
            default = ... if param.default is param.empty else param.default
            fields[param.name] = (_described(annotation, docs.get(param.name)), default)
        config = ConfigDict(extra="forbid")
        model: type[BaseModel] = create_model(f"{self.name}_arguments", __config__=config, **fields)
        return model

    def spec(self) -> ToolSpec:
        """What the server and the model are told about this tool (built once)."""
        if self._spec is None:
            self._spec = self._build_spec()
        return self._spec

    def _build_spec(self) -> ToolSpec:
        schema = self._arguments.model_json_schema()
        schema.pop("title", None)
        if self.kind == ToolKind.TASK and self.poll_fn is None:
            raise TypeError(
                f"task tool {self.name} has no poll: decorate one with @{self.name}.poll"
            )
        approval = (
            Approval.PREDICATE
            if callable(self.approval)
            else Approval.ALWAYS
            if self.approval
            else Approval.NEVER
        )
        return ToolSpec(
            name=self.name,
            description=self.description,
            kind=self.kind,
            parameters=schema,
            retry=self.retry,
            approval=approval,
            poll_interval_seconds=self.poll_interval,
            has_check=self.check_fn is not None,
            concurrency_key=self.concurrency_key,
            concurrency_limit=self.concurrency_limit,
        )

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments for the body; raises ``ToolError`` naming what is wrong."""
        try:
            parsed = self._arguments.model_validate(arguments)
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
                for err in e.errors()
            )
            raise ToolError(f"invalid arguments for tool {self.name!r}: {problems}") from None
        return {name: getattr(parsed, name) for name in type(parsed).model_fields}

    async def call(self, ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        """Validate the arguments, then run the body."""
        return await self.invoke(ctx, self.validate(arguments))

    async def invoke(self, ctx: ToolContext, kwargs: dict[str, Any]) -> Any:
        """Run the body with arguments that ``validate`` returned."""
        if self._context_param is not None:
            kwargs = {**kwargs, self._context_param: ctx}
        return await _run(self.fn, ctx, **kwargs)

    async def call_poll(self, ctx: ToolContext, handle: Any) -> Any:
        assert self.poll_fn is not None
        return await _run(self.poll_fn, ctx, ctx, handle)

    async def call_check(self, ctx: ToolContext, arguments: dict[str, Any]) -> Checked:
        """Run the check with validated ``arguments`` (what ``validate`` returned)."""
        assert self.check_fn is not None
        verdict = await _run(self.check_fn, ctx, ctx, **arguments)
        if isinstance(verdict, Checked):
            return verdict
        if verdict is None or isinstance(verdict, bool):
            return Checked(happened=verdict)
        raise TypeError(f"check of {self.name} returned {verdict!r}: want Checked, bool or None")


def _without_extras(annotation: Any) -> Any:
    if typing.get_origin(annotation) is Annotated:
        return typing.get_args(annotation)[0]
    return annotation


def _described(annotation: Any, doc: str | None) -> Any:
    """``annotation`` with a description: its own ``Field(description=...)`` wins, then a
    plain string in its ``Annotated[...]``, then the docstring's text for the parameter."""
    extras = typing.get_args(annotation)[1:] if typing.get_origin(annotation) is Annotated else ()
    if any(isinstance(e, FieldInfo) and e.description for e in extras):
        return annotation
    text = next((e for e in extras if isinstance(e, str)), doc)
    if not text:
        return annotation
    return Annotated[annotation, Field(description=text)]


async def _run(fn: Callable[..., Any], ctx: ToolContext, /, *args: Any, **kwargs: Any) -> Any:
    """Run one of a tool's functions: an ``async def`` on this loop, a plain ``def`` in a
    thread of its own (so it cannot block the loop), with this task's context variables.

    A thread cannot be stopped: if the attempt is cancelled meanwhile, the function runs
    on to its end and its result is dropped. The thread is a daemon, so a Worker that
    exits does not wait for it."""
    if _is_async(fn):
        return await fn(*args, **kwargs)
    loop = asyncio.get_running_loop()
    settled: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(value: Any, error: BaseException | None) -> None:
        if settled.done():  # the attempt was cancelled meanwhile
            return
        if error is None:
            settled.set_result(value)
        else:
            settled.set_exception(error)

    def body() -> None:
        value: Any = None
        error: BaseException | None = None
        try:  # an Interrupt (ctx.ask_sync, ctx.sleep_sync) is a BaseException: carry it too
            value = context.run(fn, *args, **kwargs)
        except BaseException as e:
            error = e
        # a closed loop: the Worker exited meanwhile, and nobody waits for this result
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, value, error)

    ctx._loop = loop  # the ctx now serves a thread: ``*_sync`` methods, not async ones
    threading.Thread(target=body, name=f"dex-tool-{ctx.tool}", daemon=True).start()
    value = await settled
    if inspect.isawaitable(value):  # a def that returned a coroutine (a plain wrapper)
        ctx._loop = None
        return await value
    return value


def _is_async(fn: Callable[..., Any]) -> bool:
    call = getattr(fn, "__call__", None)  # noqa: B004 - a callable object's async __call__
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    kind: ToolKind | str = ToolKind.WRITE,
    name: str | None = None,
    description: str | None = None,
    retry: RetryPolicy | None = None,
    approval: bool | Callable[..., bool] = False,
    poll_interval: float = 1.0,
    concurrency_key: str | None = None,
    concurrency_limit: int = 1,
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    kind: ToolKind | str = ToolKind.WRITE,
    name: str | None = None,
    description: str | None = None,
    retry: RetryPolicy | None = None,
    approval: bool | Callable[..., bool] = False,
    poll_interval: float = 1.0,
    concurrency_key: str | None = None,
    concurrency_limit: int = 1,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a function a tool. ``kind`` decides what a crash does to it:

    - ``"read"``: runs again; after the last attempt the call records ``failed``.
    - ``"idempotent_write"``: runs again with the same ``ctx.idempotency_key``.
    - ``"write"`` (the default, the safest): runs at most once; a crash records
      ``outcome_unknown``.
    - ``"task"``: starts external work and returns a handle (an idempotent, keyed call);
      ``@the_tool.poll`` then polls the handle every ``poll_interval`` seconds.

    ``approval=True`` makes every call wait for a person's approval; a predicate
    (called with the arguments) decides per call.

    ``concurrency_key`` runs at most ``concurrency_limit`` calls under one key at once,
    across every Worker (the server holds the others queued): a template of the
    arguments, ``"{customer_id}"`` for one booking at a time per customer, ``""`` for one
    key for every call of the tool.
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(
            f,
            kind=ToolKind(kind),
            name=name,
            description=description,
            retry=retry,
            approval=approval,
            poll_interval=poll_interval,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
        )

    return wrap(fn) if fn is not None else wrap


class ToolSource(Protocol):
    """Tools known only once a Worker starts (an MCP server's, ``dex.mcp_tools``): the
    Worker opens each source before it says hello, so the tools it registers, and the
    ones its agents offer the model, are the ones listed then, for the life of the
    process."""

    def listed(self) -> list[Tool]:
        """The tools, once opened (``RuntimeError`` before)."""
        ...

    async def open(self) -> None:
        """Connect and list the tools; a second call keeps the first list."""
        ...

    async def aclose(self) -> None: ...


__all__ = [
    "PENDING",
    "Checked",
    "Interrupt",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolSource",
    "timer_tool",
    "tool",
]


def timer_tool(name: str = "set_timer", max_seconds: float = 7 * 24 * 3600) -> Tool:
    """A tool with which the model sets a durable timer for itself (``AwaitTimer``): the
    turn waits in the server, using no Worker, and goes on when the timer fires, once,
    even across crashes and restarts."""

    async def set_timer(seconds: float, ctx: ToolContext) -> str:
        if not 0 <= seconds <= max_seconds:
            raise ToolError(f"seconds must be between 0 and {max_seconds:g}")
        await ctx.sleep(seconds)
        return f"the {seconds:g} s timer fired"

    return Tool(
        set_timer,
        kind=ToolKind.READ,
        name=name,
        description="Wait the given number of seconds, then continue. The wait survives "
        "crashes and restarts.",
    )
