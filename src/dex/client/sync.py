"""``dex.SyncClient``: the async ``Client`` run on a private event loop thread."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

from dex.client.client import Client


class SyncClient:
    """Every public coroutine method of ``Client``, callable without ``await``."""

    def __init__(self, address: str | Sequence[str] | None = None, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="dex-client", daemon=True
        )
        self._thread.start()
        self._client = Client(address, **options)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._client, name)
        if name.startswith("_") or not asyncio.iscoroutinefunction(method):
            return method  # type: ignore[no-any-return]

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            future = asyncio.run_coroutine_threadsafe(method(*args, **kwargs), self._loop)
            return future.result()

        return call

    def close(self) -> None:
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._client.close(), self._loop).result()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
