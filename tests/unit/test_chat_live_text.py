"""dex chat's live text: by attempt, dropped on the attempt's ``model.discard``, and a late
delta of a discarded attempt (sent by a node that lost its lead) never brings it back."""

from __future__ import annotations

import io
from typing import Any, cast

from rich.console import Console

from dex.cli.chat import Chat


def chat() -> Chat:
    return Chat(client=cast(Any, None), session_id="s", console=Console(file=io.StringIO()))


def delta(attempt: int, text: str) -> dict[str, Any]:
    return {"step_id": "1.1", "attempt_id": f"s/1.1/{attempt}", "text": text}


def test_a_discarded_attempt_s_text_goes_and_its_late_deltas_stay_out() -> None:
    c = chat()
    c._delta(delta(1, "half an ans"))
    assert c.partial == {"1.1": "half an ans"}
    c._discard({"step_id": "1.1", "attempt_id": "s/1.1/1"})
    assert c.partial == {}
    c._delta(delta(1, "wer"))  # late, from the old node
    assert c.partial == {}
    c._delta(delta(2, "the whole answer"))
    assert c.partial == {"1.1": "the whole answer"}
