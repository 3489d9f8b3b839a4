"""A console action on a node that does not serve is refused (a 503 page), as the API's
standby gate refuses /v1: the console calls the API's functions directly, past the gate."""

from __future__ import annotations

import pytest

from tests.integration.conftest import AGENT
from tests.integration.test_standby import Standby, standby

__all__ = ["standby"]


@pytest.mark.parametrize(
    "path",
    [
        "/ui/sessions/s1/cancel",
        "/ui/sessions/s1/calls/1.1/approve",
        "/ui/sessions/s1/calls/1.1/deny",
        "/ui/sessions/s1/calls/1.1/answer",
        "/ui/sessions/s1/calls/1.1/reconcile",
        "/ui/tenants",
    ],
)
def test_a_console_action_on_a_node_that_lost_the_lead_is_refused(
    standby: Standby, path: str
) -> None:
    standby.grant()
    standby.api.register(AGENT)
    standby.api.create("s1")
    assert standby.http.post("/v1/sessions/s1/messages", json={"text": "hi"}).status_code == 201
    standby.take_away()
    before = standby.http.get("/readyz").json()["role"]
    assert before == "stepped-down"
    refused = standby.http.post(path, data={"reason": "r", "answer": "a", "status": "failed"})
    assert refused.status_code == 503, refused.text
    assert "it is stepped-down" in refused.text
    assert "Nothing was changed" in refused.text
