"""RunModel through a real provider SDK: a Worker SIGKILLed while the provider's stream is
open (output already reached Dex) runs that model call again, and the turn completes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dex.testing import wait_until
from dex.testing.fake_providers import FakeAnthropic, FakeOpenAI, FakeProvider, Reply
from tests.crash.helpers import WORKER_KILL
from tests.support.rig import Rig, attempts

PROVIDER_AGENTS = str(Path(__file__).parent.parent / "support" / "provider_agents.py")
ANSWER = "the first answer streams for a while"


@pytest.mark.crash("run_model.after_output", WORKER_KILL)
@pytest.mark.parametrize("provider", ["anthropic", "openai-responses", "openai-chat"])
def test_worker_killed_with_a_provider_stream_open_runs_the_model_call_again(
    rig: Rig, provider: str
) -> None:
    # the first reply stalls after its first chunk, holding the stream open
    script = [Reply(ANSWER, pause_after=1), Reply(ANSWER)]
    server: FakeProvider = FakeAnthropic(script) if provider == "anthropic" else FakeOpenAI(script)
    with server.in_thread():
        env = {
            "DEX_TEST_PROVIDER": provider,
            "DEX_TEST_PROVIDER_URL": server.base_url,
            "DEX_TEST_PROVIDER_KEY": server.api_key or "",
        }
        rig.start_server()
        worker = rig.start_worker(module=PROVIDER_AGENTS, env=env)
        sid = rig.session("provider")
        turn = rig.client.send_message(sid, "hello")["turn"]

        def output_reached_dex() -> bool:
            running = rig.client.get_agent_snapshot(sid)["running"]
            return server.paused == 1 and any(r["output_chars"] > 0 for r in running)

        wait_until(output_reached_dex, 20, what="the stream is open and its output reached Dex")
        worker.kill()
        rig.start_worker(module=PROVIDER_AGENTS, env=env)
        t = rig.wait_turn(sid, turn)

        assert t["status"] == "completed"
        assert t["text"] == ANSWER
        assert attempts(t, "RunModel") == [[(1, "failed"), (2, "succeeded")]]
        assert len(server.requests) == 2  # the model call ran again, once
        usage = t["steps"][0]["usage"]
        assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
        history = rig.client.get_agent_snapshot(sid)["history"]
        assert [i["type"] for i in history] == ["user", "assistant"]
