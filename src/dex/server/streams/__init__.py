"""Stream backends: where a session's live events wait for their subscribers."""

from dex.server.streams.memory import Event, MemoryStreams

__all__ = ["Event", "MemoryStreams"]
