"""An agent whose model is a real provider SDK pointed at a local fake server.

``DEX_TEST_PROVIDER`` is ``anthropic``, ``openai-responses`` or ``openai-chat``;
``DEX_TEST_PROVIDER_URL`` and ``DEX_TEST_PROVIDER_KEY`` say where the fake server is.
"""

from __future__ import annotations

import os
from typing import Literal

import dex
from dex.models import Anthropic, Model, OpenAI

_FAST = dex.RetryPolicy(max_attempts=3, initial_backoff_seconds=0.05)


def _model() -> Model:
    provider = os.environ.get("DEX_TEST_PROVIDER", "anthropic")
    url = os.environ.get("DEX_TEST_PROVIDER_URL", "http://127.0.0.1:9")
    key = os.environ.get("DEX_TEST_PROVIDER_KEY", "test-key")
    if provider == "anthropic":
        return Anthropic(model="claude-test", base_url=url, api_key=key, timeout=30)
    api: Literal["responses", "chat"] = "chat" if provider == "openai-chat" else "responses"
    return OpenAI(model="gpt-test", api=api, base_url=url, api_key=key, timeout=30)


provider = dex.Agent(name="provider", model=_model(), model_retry=_FAST)
