"""Local fake model servers that speak the providers' HTTP protocols and play a script.

``FakeAnthropic`` speaks the Anthropic Messages API (``POST /v1/messages``) and
``FakeOpenAI`` speaks OpenAI Chat Completions (``POST /v1/chat/completions``) and
Responses (``POST /v1/responses``), streamed as Server-Sent Events the way the real
services send them (or as one JSON body when ``stream`` is off). Point the real SDK
client, or a ``dex.models`` model, at ``server.base_url``:

    async with FakeAnthropic([Reply(tool_calls=[ScriptedCall("lookup", {"key": "a"})]),
                              Fail(429),
                              Reply("done")]) as server:
        model = Anthropic(model="claude-test", base_url=server.base_url,
                          api_key=server.api_key)

Each request takes the next entry of the script (or the script is a function of the
request body). ``server.requests`` records every request. The servers check what the
real APIs check and that a translation bug would break (the API key; every tool call
answered by a result right after it, and no result without its call) and answer 400
like the real API when a request breaks those rules.

A ``Reply`` can misbehave part way: ``drop_after=n`` cuts the connection after ``n``
content chunks (text pieces and tool-argument pieces), ``truncate_after=n`` ends the
body cleanly without the final events, and ``pause_after=n`` waits for ``resume`` (an
``asyncio.Event``; without one, until the server closes) before sending the rest;
``server.paused`` counts the replies that reached that point.

``rate_limit=RateLimit(rpm=..., fraction=...)`` refuses requests with HTTP 429 and a
``Retry-After`` as a provider's rate limit does: those faster than a rate, and (or) a
set part of them, before they take an entry of the script.

Use ``async with server:`` in an async test, or ``with server.in_thread():`` to serve
from a background thread (a synchronous test, or Workers in other processes).

Inside: ``_script`` (what a server plays), ``_server`` (the skeleton every provider
shares: the HTTP server, one scripted request, the stream), and one module per API:
``_anthropic`` (Messages), ``_chat`` (Chat Completions), ``_responses`` (Responses),
with ``_openai`` serving the last two.
"""

from __future__ import annotations

from dex.testing.fake_providers._anthropic import FakeAnthropic
from dex.testing.fake_providers._openai import FakeOpenAI
from dex.testing.fake_providers._script import (
    Entry,
    Fail,
    RateLimit,
    RecordedRequest,
    Reply,
    Script,
    ScriptedCall,
)
from dex.testing.fake_providers._server import FakeProvider

__all__ = [
    "Entry",
    "Fail",
    "FakeAnthropic",
    "FakeOpenAI",
    "FakeProvider",
    "RateLimit",
    "RecordedRequest",
    "Reply",
    "Script",
    "ScriptedCall",
]
