"""The console's conversation (``dex.server.console.conversation``) from a session the
engine's own handlers drove: what was said in order, each tool call with its record and
who acted on its waits, without a server."""

from __future__ import annotations

from typing import Any

from dex.server import views
from dex.server.console.conversation import conversation, shown
from dex.server.engine import handlers
from dex.server.engine.state import SessionState, Turn
from dex.wire import (
    AgentSpec,
    Approval,
    Item,
    ModelResponse,
    ModelToolCall,
    ToolKind,
    ToolOutcome,
    ToolSpec,
)

SPEC = AgentSpec(
    name="helper",
    tools=[
        ToolSpec(name="lookup", kind=ToolKind.READ),
        ToolSpec(name="charge", kind=ToolKind.WRITE, approval=Approval.ALWAYS),
        ToolSpec(name="order", kind=ToolKind.IDEMPOTENT_WRITE),
    ],
)


class Session:
    """A session driven through the handlers, keeping its history and ended turns."""

    def __init__(self) -> None:
        self.state = SessionState(id="s1", agent="helper", created_at=1.0)
        self.history: list[Item] = []
        self.ended: list[Turn] = []
        self.now = 1.0

    def apply(self, t: handlers.Transition) -> handlers.Transition:
        self.history += t.history
        self.state.history_length = len(self.history)
        if t.ended_turn is not None:
            self.ended.append(t.ended_turn)
        return t

    def model(self, text: str = "", *calls: tuple[str, dict[str, Any]]) -> None:
        """The queued RunModel Step runs and answers; the model reuses its call ids."""
        self.now += 1
        (step,) = [s for s in self.state.queued_steps() if s.type == "RunModel"]
        handlers.assign(self.state, step.id, "w1", self.now)
        asked = [ModelToolCall(id="c0", name=n, arguments=a) for n, a in calls]
        response = ModelResponse(text=text, tool_calls=asked)
        self.apply(handlers.complete_model(self.state, SPEC, step.id, 1, response, self.now))

    def tool(self, outcome: ToolOutcome) -> None:
        self.now += 1
        (step,) = [s for s in self.state.queued_steps() if s.type != "RunModel"]
        handlers.assign(self.state, step.id, "w1", self.now)
        self.apply(handlers.complete_tool(self.state, SPEC, step.id, 1, outcome, self.now))

    def act(self, entry: dict[str, Any]) -> None:
        self.now += 1
        handlers.record_input(self.state, entry, self.now)
        self.apply(handlers.apply_input(self.state, SPEC, self.now))

    def said(self, status: str) -> list[dict[str, Any]]:
        turns = shown(
            [views.plain(t) for t in [*self.ended, *filter(None, [self.state.turn])]], status
        )
        history = [item.model_dump(mode="json") for item in self.history]
        queued = views.plain(self.state.queued)
        return conversation(history, turns, queued)


def test_calls_with_their_records_waits_and_who_acted_in_the_order_they_came() -> None:
    s = Session()
    s.apply(handlers.receive_message(s.state, SPEC, "charge me", None, 1.0)[0])
    s.model("Let me look.", ("lookup", {"key": "k"}))
    s.tool(ToolOutcome(status="succeeded", result={"balance": 5}))
    s.model("It needs approval.", ("charge", {"amount": 5}))  # the model's id c0 again
    s.act({"kind": "approve", "call_id": "1.2", "by": "ana"})
    s.tool(ToolOutcome(status="succeeded", result="charged"))
    s.model("Done.")
    s.apply(handlers.receive_message(s.state, SPEC, "order a shirt", None, s.now)[0])
    s.model("", ("order", {"item": "shirt"}))
    s.tool(ToolOutcome(status="asked", question="Which size?", choices=["S", "M"]))
    s.apply(handlers.receive_message(s.state, SPEC, "and socks", None, s.now)[0])

    said = s.said("waiting")

    assert [(e["kind"], e.get("text")) for e in said] == [
        ("user", "charge me"),
        ("assistant", "Let me look."),
        ("assistant", "It needs approval."),
        ("assistant", "Done."),
        ("user", "order a shirt"),
        ("assistant", ""),
        ("queued", "and socks"),
    ]  # no tool result twice: each call shows its own
    assert [(e["turn"], e["status"]) for e in said if e["kind"] == "user"] == [
        (1, "completed"),
        (2, "waiting"),  # the running turn reads as the session does
    ]
    [lookup], [charge], [order] = (
        e["calls"] for e in said if e["kind"] == "assistant" and e["calls"]
    )
    assert (lookup["id"], lookup["name"], lookup["result"]) == ("1.1", "lookup", {"balance": 5})
    assert (charge["id"], charge["status"], charge["result"]) == ("1.2", "succeeded", "charged")
    [approval] = charge["waits"]
    assert (approval["kind"], approval["open"], approval["ended"], approval["by"]) == (
        "approval",
        False,
        "approve",
        "ana",
    )
    [question] = order["waits"]
    assert (question["question"], question["choices"], question["open"]) == (
        "Which size?",
        ["S", "M"],
        True,
    )

    s.act({"kind": "answer", "call_id": "2.1", "answer": "M", "by": "console:bo"})
    calls = [c for e in s.said("running") if e["kind"] == "assistant" for c in e["calls"]]
    [question] = next(c for c in calls if c["id"] == "2.1")["waits"]
    assert (question["open"], question["answer"], question["by"]) == (False, "M", "console:bo")


def test_a_failed_turn_says_so_after_its_last_item() -> None:
    s = Session()
    s.apply(handlers.receive_message(s.state, SPEC, "hello", None, 1.0)[0])
    s.apply(handlers.cancel_turn(s.state, SPEC, 2.0, "enough"))

    said = s.said("idle")

    assert [e["kind"] for e in said] == ["user", "turn_end"]
    assert (said[0]["status"], said[1]["status"]) == ("cancelled", "cancelled")
    assert "enough" in said[1]["error"]
