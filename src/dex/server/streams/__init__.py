"""Stream backends: where a session's live events wait for their subscribers.

Two backends keep the same promise (docs/streams.md): ``MemoryStreams``, this node's
memory, the default; ``RedisStreams`` (``--streams redis://…``), which survives a restart
or a takeover. The committer publishes each history item and lifecycle event after its
commit; the Worker endpoint publishes ``model.delta`` text as it arrives.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

from dex.server.streams.memory import Event, MemoryStreams, Rings


class Streams(Protocol):
    @property
    def subscribers(self) -> int: ...

    @property
    def dropped(self) -> int:
        """Subscribers dropped because they fell behind."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def end_subscriptions(self) -> None:
        """The node stops serving: every subscription ends now, and each later one at
        once, so that its client resumes on the node that serves next."""
        ...

    def end_sessions(self, which: Callable[[str], bool]) -> None:
        """End the subscriptions of the sessions ``which`` takes (a cluster node handed
        them over), so that their clients resume on the node that serves them now."""
        ...

    def publish(self, session_id: str, type_: str, data: dict[str, Any]) -> None:
        """Send an event to the session's subscribers; never waits."""
        ...

    def publish_history(
        self, session_id: str, history: Sequence[dict[str, Any]], start: int
    ) -> None:
        """``history.item`` events for ``history[start:]``, the items a commit added;
        ``history`` is the session's whole committed history, which only grows."""
        ...

    async def catch_up(self, session_id: str, history: Sequence[dict[str, Any]]) -> None:
        """Before a subscriber starts: publish the committed items the stream lacks."""
        ...

    def subscribe(self, session_id: str, after: str | None = None) -> AsyncIterator[Event | None]:
        """Events after id ``after`` (the buffered ones when None), then live ones; None
        after a quiet while, for a keep-alive."""
        ...


def open_streams(url: str | None) -> Streams:
    """The backend ``url`` names: None or ``memory``, or ``redis://…`` / ``rediss://…``."""
    if url is None or url == "memory":
        return MemoryStreams()
    if url.startswith(("redis://", "rediss://", "unix://")):
        try:
            from dex.server.streams.redis import RedisStreams
        except ImportError as e:
            raise ValueError(
                f"--streams {url} needs the Redis client: pip install 'dex-runtime[redis]'"
            ) from e
        return RedisStreams(url)
    raise ValueError(f"--streams takes memory or redis://HOST:PORT[/DB], not {url!r}")


__all__ = ["Event", "MemoryStreams", "Rings", "Streams", "open_streams"]
