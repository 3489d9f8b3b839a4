"""What the SDK-backed models share: the API key, one SDK client per event loop, closing."""

from __future__ import annotations

import asyncio
import os
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, Generic, Protocol, Self, TypeVar

from dex.models.base import Model, ModelError


class _Closable(Protocol):
    async def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)


class SDKModel(Model, Generic[C]):
    """A model that calls a provider through its official SDK.

    The SDK client is made on first use in the running event loop (an HTTP client
    belongs to one loop) with the SDK's own retries off: Dex's retry policy is the
    only one. ``aclose()`` closes it; ``async with model:`` does that too.
    """

    provider: str
    key_variable: str

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None,
        base_url: str | None,
        timeout: float,
        params: Mapping[str, Any] | None,
        group: str | None = None,
    ) -> None:
        if not model:
            raise ValueError("a model name is needed, e.g. model='...'")
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.model = model
        self.base_url = base_url
        self.timeout = timeout
        self.params: dict[str, Any] = dict(params or {})
        self.group = group
        """The model group whose limits its calls count against (docs/flow-control.md);
        None: the provider and the model."""
        self._api_key = api_key  # never in spec(), never in repr()
        self._client: C | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r})"

    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"provider": self.provider, "model": self.model}
        spec.update(self.settings())
        if self.base_url is not None:
            spec["base_url"] = self.base_url
        spec["timeout"] = self.timeout
        if self.params:
            spec["params"] = self.params
        if self.group is not None:
            spec["group"] = self.group
        return spec

    @abstractmethod
    def settings(self) -> dict[str, Any]:
        """This provider's settings for ``spec()`` (plain data, no secrets)."""

    @abstractmethod
    def make_client(self, api_key: str) -> C: ...

    def api_key(self) -> str:
        key = self._api_key or os.environ.get(self.key_variable)
        if key:
            return key
        if self.base_url is not None and self.provider == "openai":
            # a local OpenAI-compatible server (vLLM, Ollama) often needs no key
            return "no-key"
        raise ModelError(
            f"{self.provider}: no API key: set {self.key_variable} in the Worker's environment"
            " or pass api_key=...",
            retryable=False,
            provider=self.provider,
        )

    def client(self) -> C:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            # a client made in another (finished) loop cannot be closed from here
            self._client = self.make_client(self.api_key())
            self._loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the SDK client (its pooled connections). The model can still be used."""
        client, self._client = self._client, None
        if client is not None and self._loop is asyncio.get_running_loop():
            await client.close()
        self._loop = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
