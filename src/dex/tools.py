"""Tools: plain Python functions that an agent may call, and the context they run in."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from dex.errors import ToolError
from dex.wire import RetryPolicy, ToolKind, ToolSpec


@dataclass
class ToolContext:
    """What a running tool knows about its call. The first parameter typed ``ToolContext``
    receives it."""

    session_id: str
    call_id: str
    tool: str
    idempotency_key: str
    """Stable for this call across attempts and servers: pass it to the system you call."""
    attempt: int
    _heartbeat: Callable[[], Awaitable[None]]

    async def heartbeat(self) -> None:
        """Tell Dex the tool is alive now (Workers also heartbeat on their own)."""
        await self._heartbeat()


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
    ) -> None:
        self.fn = fn
        self.kind = ToolKind(kind)
        self.name = name or fn.__name__
        self.description = description or inspect.getdoc(fn) or ""
        self.retry = retry or RetryPolicy()
        self._context_param: str | None = None
        self._arguments = self._model(fn)

    def _model(self, fn: Callable[..., Any]) -> type[BaseModel]:
        hints = typing.get_type_hints(fn)
        fields: dict[str, Any] = {}
        for param in inspect.signature(fn).parameters.values():
            annotation = hints.get(param.name, Any)
            if annotation is ToolContext:
                self._context_param = param.name
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"tool {self.name}: *args and **kwargs cannot be described")
            default = ... if param.default is param.empty else param.default
            fields[param.name] = (annotation, default)
        config = ConfigDict(extra="forbid")
        model: type[BaseModel] = create_model(  # type: ignore[call-overload]
            f"{self.name}_arguments", __config__=config, **fields
        )
        return model

    def spec(self) -> ToolSpec:
        schema = self._arguments.model_json_schema()
        schema.pop("title", None)
        return ToolSpec(
            name=self.name,
            description=self.description,
            kind=self.kind,
            parameters=schema,
            retry=self.retry,
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
        kwargs = self.validate(arguments)
        if self._context_param is not None:
            kwargs[self._context_param] = ctx
        result = self.fn(**kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    *,
    kind: ToolKind | str = ToolKind.WRITE,
    name: str | None = None,
    description: str | None = None,
    retry: RetryPolicy | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    kind: ToolKind | str = ToolKind.WRITE,
    name: str | None = None,
    description: str | None = None,
    retry: RetryPolicy | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a function a tool. ``kind`` decides what a crash does to it:

    - ``"read"``: runs again; after the last attempt the call records ``failed``.
    - ``"idempotent_write"``: runs again with the same ``ctx.idempotency_key``.
    - ``"write"`` (the default, the safest): runs at most once; a crash records
      ``outcome_unknown``.
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(f, kind=ToolKind(kind), name=name, description=description, retry=retry)

    return wrap(fn) if fn is not None else wrap


__all__ = ["Tool", "ToolContext", "ToolError", "tool"]
