"""``dex chat`` through a pseudo-terminal, against a real server and Worker: the model's
text streams in live, tool calls and their results show, approvals and questions are
answered inline, and a server's SIGKILL mid-answer costs nothing on screen (no line
twice, nothing lost). What the terminal shows is read with a terminal emulator (pyte),
as a person would see it."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator

import pexpect
import pyte
import pytest

from dex.testing import wait_until
from tests.support.rig import Rig

ROWS, COLUMNS = 60, 160


class Terminal:
    """``dex ARGS`` in a pseudo-terminal, and the screen it draws."""

    def __init__(self, *args: str) -> None:
        self.screen = pyte.Screen(COLUMNS, ROWS)
        self._stream = pyte.ByteStream(self.screen)
        self.raw = bytearray()
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "dex", *args],
            dimensions=(ROWS, COLUMNS),
            env={
                "TERM": "xterm-256color",
                "PATH": "/usr/bin:/bin",
                "LANG": "C.UTF-8",
                # the code under test, when it is not the installed one
                **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"},
            },
            timeout=60,
        )

    def text(self) -> str:
        return "\n".join(line.rstrip() for line in self.screen.display).rstrip()

    def last_line(self) -> str:
        return self.text().splitlines()[-1] if self.text() else ""

    def wait(self, condition: Callable[[str], bool], timeout: float = 60, what: str = "") -> str:
        """Read what the program draws until the screen meets ``condition``."""
        deadline = time.monotonic() + timeout
        while not condition(self.text()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the screen never showed {what}:\n{self.text()}")
            try:
                data = self.child.read_nonblocking(65536, timeout=0.1)
            except pexpect.TIMEOUT:
                continue
            except pexpect.EOF:
                raise AssertionError(f"dex chat exited:\n{self.text()}") from None
            raw = data if isinstance(data, bytes) else data.encode()
            self.raw += raw
            self._stream.feed(raw)
        return self.text()

    def prompt(self, timeout: float = 60) -> str:
        """Wait until the chat asks for the next message (its turn is over)."""
        return self.wait(lambda _: self.last_line() == "you>", timeout, "the prompt")

    def asks(self, question: str, timeout: float = 60) -> None:
        self.wait(lambda _: question in self.last_line(), timeout, repr(question))

    def type(self, line: str) -> None:
        """Type a line, and wait until the terminal echoes it."""
        before = self.text()
        self.child.sendline(line)
        self.wait(lambda screen: screen != before, what=f"the echo of {line!r}")

    def close(self) -> None:
        if self.child.isalive():
            self.child.sendeof()
            try:
                self.child.expect(pexpect.EOF, timeout=10)
            finally:
                self.child.close(force=True)


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    started: list[Terminal] = []
    yield started
    for terminal in started:
        terminal.close()


def chat(rig: Rig, terminals: list[Terminal], *args: str) -> Terminal:
    terminal = Terminal("chat", *args, "--address", rig.server.address)
    terminals.append(terminal)
    terminal.prompt()
    return terminal


def calls(*wanted: tuple[str, dict[str, object]]) -> str:
    return "call: " + json.dumps([list(c) for c in wanted])


def test_approvals_questions_and_denials_are_answered_inline(
    rig: Rig, terminals: list[Terminal]
) -> None:
    rig.start_server()
    rig.start_worker()
    rig.session("waiter")  # the agent is registered
    term = chat(rig, terminals, "waiter")

    term.type(calls(("delete_all", {})))
    term.asks("approve delete_all()? [y/n]")
    assert rig.ledger.entries("delete_all") == []  # nothing ran while it waited
    term.type("y")
    screen = term.prompt()
    assert "→ delete_all()" in screen
    assert '← delete_all succeeded: "deleted"' in screen
    assert len(rig.ledger.entries("delete_all")) == 1

    term.type(calls(("order", {"item": "shirt"})))
    term.asks("order asks: Which size of shirt? [S/M/L]")
    term.type("XL")  # not a choice: asked again
    term.asks("order asks: Which size of shirt? [S/M/L]")
    term.type("M")
    screen = term.prompt()
    assert "ordered shirt in M" in screen

    term.type(calls(("transfer", {"amount": 500})))
    term.asks("approve transfer(amount=500)? [y/n]")
    term.type("n")
    term.asks("reason:")
    term.type("too much money")
    screen = term.prompt()
    assert "← transfer denied: denied: too much money" in screen
    assert rig.ledger.entries("transfer") == []

    session_id = screen.splitlines()[0].split()[1]
    recorded = rig.client.get_agent_snapshot(session_id)["tool_calls"]
    assert [(c["name"], c["status"]) for c in recorded] == [
        ("delete_all", "succeeded"),
        ("order", "succeeded"),
        ("transfer", "denied"),
    ]
    assert recorded[0]["approval"]["by"] and recorded[2]["approval"]["reason"] == "too much money"
    lines = screen.splitlines()
    assert sum(line.startswith("you> ") for line in lines) == 3  # each message once
    assert sum(line.startswith("agent> ") for line in lines) == 3  # each answer once


def test_text_streams_live_and_a_server_restart_mid_answer_shows_each_line_once(
    rig: Rig, terminals: list[Terminal]
) -> None:
    rig.start_server()
    rig.start_worker()
    rig.session("streamer")
    term = chat(rig, terminals, "streamer")
    term.type("hello")
    term.prompt()
    long = "stream me " * 200  # 2,000 characters, about 5 s of streaming

    term.type(long)
    # the text arrives while the turn runs: the prompt is not back yet
    term.wait(
        lambda screen: "agent> echo: stream me stream me" in screen and term.last_line() != "you>",
        what="streamed text while the turn runs",
    )
    rig.restart_server()  # SIGKILL mid-answer; the same node again on its data
    screen = term.prompt(timeout=90)

    assert screen.count("agent> echo: hello") == 1
    assert screen.count("agent> echo: stream me") == 1  # the answer, shown once
    assert screen.count("you> hello") == 1 and screen.count("you> stream me") == 1
    session_id = screen.splitlines()[0].split()[1]
    snapshot = rig.client.get_agent_snapshot(session_id)
    assert snapshot["history"][-1]["text"] == f"echo: {long}"
    turn = rig.client.wait_turn(session_id, 2, timeout=0)
    attempts = turn["steps"][0]["attempts"]
    # the Worker lived through the restart and reclaimed the model call: one attempt,
    # its text streamed on to the node that came back
    assert [a["outcome"] for a in attempts] == ["succeeded"]
    # below the message, the screen shows the whole answer and nothing else
    lines = screen.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("agent> echo: stream"))
    assert lines[-1] == "you>"
    assert " ".join(lines[start:-1]).split() == f"agent> echo: {long}".split()
    term.type("/exit")
    term.child.expect(pexpect.EOF, timeout=10)


def test_going_on_with_a_session_shows_its_history_once(
    rig: Rig, terminals: list[Terminal]
) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("assistant")
    rig.client.send_message(sid, calls(("lookup", {"key": "k"})), wait=True)

    term = chat(rig, terminals, "--session", sid)

    screen = term.text()
    assert screen.count('you> call: [["lookup", {"key": "k"}]]') == 1
    assert '← lookup succeeded: {"key": "k", "value": "K"}' in screen
    assert screen.count("agent> results:") == 1
    term.type("and now?")
    assert term.prompt().count("agent> echo: and now?") == 1


SLOW_PERSON = 10.0
"""Seconds a person takes to decide: twice the server's keep-alive (5 s), after which it
closes the chat's idle connection."""


def test_a_person_who_takes_ten_seconds_to_decide_is_recorded_once(
    rig: Rig, terminals: list[Terminal]
) -> None:
    rig.start_server()
    rig.start_worker()
    rig.session("waiter")
    term = chat(rig, terminals, "waiter")

    term.type(calls(("delete_all", {})))
    term.asks("approve delete_all()? [y/n]")
    time.sleep(SLOW_PERSON)  # the person thinks it over: the scenario, not a wait for a state
    term.type("y")
    screen = term.wait(lambda s: "not recorded" in s or term.last_line() == "you>")
    assert "not recorded" not in screen
    assert '← delete_all succeeded: "deleted"' in screen
    assert len(rig.ledger.entries("delete_all")) == 1

    term.type(calls(("order", {"item": "shirt"})))
    term.asks("order asks: Which size of shirt? [S/M/L]")
    time.sleep(SLOW_PERSON)
    term.type("L")
    screen = term.wait(lambda s: "not recorded" in s or term.last_line() == "you>")
    assert "not recorded" not in screen
    assert "ordered shirt in L" in screen
    assert [e["size"] for e in rig.ledger.entries("order")] == ["L"]

    session_id = screen.splitlines()[0].split()[1]
    recorded = rig.client.get_agent_snapshot(session_id)["tool_calls"]
    assert [(c["name"], c["status"]) for c in recorded] == [
        ("delete_all", "succeeded"),
        ("order", "succeeded"),
    ]
    assert recorded[0]["approval"]["by"] and recorded[1]["answers"] == ["L"]


def test_chat_commands_are_never_sent_to_the_agent(rig: Rig, terminals: list[Terminal]) -> None:
    rig.start_server()
    rig.start_worker()
    rig.session("waiter")
    term = chat(rig, terminals, "waiter")
    session_id = term.text().splitlines()[0].split()[1]

    term.type("/help")
    screen = term.prompt()
    for name in ("/help", "/approve", "/deny", "/cancel", "/snapshot", "/exit"):
        assert name in screen
    term.type("/frobnicate")
    assert "no command /frobnicate: the commands are" in term.prompt()
    term.type("/snapshot")
    assert f"session {session_id} with waiter: idle, 0 messages" in term.prompt()
    term.type("/approve")
    assert "nothing waits for a decision" in term.prompt()

    term.type(calls(("delete_all", {})))
    term.asks("approve delete_all()? [y/n]")
    term.type("/help")  # at an approval's prompt: the commands, then the question again
    term.wait(
        lambda screen: (
            "/snapshot" in screen.split("[y/n] /help")[-1]
            and term.last_line() == "approve delete_all()? [y/n]"
        ),
        what="the commands, then the approval asked again",
    )
    term.type("/deny not today")
    screen = term.prompt()
    assert "← delete_all denied: denied: not today" in screen

    term.type(calls(("transfer", {"amount": 500})))
    term.asks("approve transfer(amount=500)? [y/n]")
    term.type("n")
    term.asks("reason:")
    term.type("/snapshot")  # at the reason's prompt: not the reason
    term.wait(
        lambda screen: (
            "  waits: approve transfer(amount=500)" in screen and term.last_line() == "reason:"
        ),
        what="the snapshot, then the reason asked again",
    )
    term.type("too much money")
    assert "← transfer denied: denied: too much money" in term.prompt()

    term.type("//etc is a folder")  # // sends a line that starts with /
    term.prompt()

    snapshot = rig.client.get_agent_snapshot(session_id)
    users = [item["text"] for item in snapshot["history"] if item["type"] == "user"]
    assert users == [
        calls(("delete_all", {})),
        calls(("transfer", {"amount": 500})),
        "/etc is a folder",
    ]
    assert snapshot["session"]["messages_received"] == 3
    assert rig.ledger.entries("delete_all") == rig.ledger.entries("transfer") == []

    # a turn another client started waits: /approve at the message prompt follows it
    waiting = rig.client.send_message(session_id, calls(("delete_all", {})), wait=True)
    assert waiting["status"] == "waiting"
    term.type("/approve")
    term.asks("approve delete_all()? [y/n]")
    term.type("y")
    assert '← delete_all succeeded: "deleted"' in term.prompt()
    assert len(rig.ledger.entries("delete_all")) == 1
    term.type("/exit")
    term.child.expect(pexpect.EOF, timeout=10)


def test_steer_and_interrupt_a_turn_that_waits_for_an_approval(
    rig: Rig, terminals: list[Terminal]
) -> None:
    rig.start_server()
    rig.start_worker()
    rig.session("waiter")
    term = chat(rig, terminals, "waiter")
    session_id = term.text().splitlines()[0].split()[1]

    term.type(calls(("delete_all", {})))
    term.asks("approve delete_all()? [y/n]")
    term.type("/steer and then say hi")  # the turn goes on waiting: asked again
    term.wait(
        lambda screen: (
            "the message was steered into turn 1" in screen
            and term.last_line() == "approve delete_all()? [y/n]"
        ),
        what="the steer said, then the approval asked again",
    )
    term.type("y")
    screen = term.prompt()
    assert '← delete_all succeeded: "deleted"' in screen
    assert "agent> echo: and then say hi" in screen  # the next model call saw it

    term.type(calls(("delete_all", {})))
    term.asks("approve delete_all()? [y/n]")
    term.type("/interrupt never mind")
    screen = term.prompt()
    assert "turn 2 was interrupted (cancelled): the message started turn 3" in screen
    assert "agent> echo: never mind" in screen
    turns = [rig.client.wait_turn(session_id, n, timeout=0)["status"] for n in (1, 2, 3)]
    assert turns == ["completed", "cancelled", "completed"]
    assert len(rig.ledger.entries("delete_all")) == 1  # the interrupted call never ran
    lines = screen.splitlines()
    assert sum(line.startswith("agent> ") for line in lines) == 2  # each answer once


def test_ctrl_c_or_cancel_ends_the_turn_and_ctrl_c_at_the_prompt_leaves(
    rig: Rig, terminals: list[Terminal]
) -> None:
    rig.start_server()
    rig.start_worker()
    rig.session("waiter")
    term = chat(rig, terminals, "waiter")
    session_id = term.text().splitlines()[0].split()[1]

    term.type(calls(("delete_all", {})))
    term.asks("approve delete_all()? [y/n]")
    term.type("/cancel")
    assert "the turn was cancelled: cancelled in dex chat" in term.prompt()

    term.type(calls(("transfer", {"amount": 5, "gate": "never"})))  # runs until cancelled
    wait_until(lambda: rig.ledger.entries("transfer"), 30, what="the transfer running")
    term.child.sendintr()
    screen = term.prompt()
    cancelled = "the turn was cancelled: cancelled in dex chat"
    assert [line for line in screen.splitlines() if line.startswith("the turn")] == [cancelled] * 2
    turns = [rig.client.wait_turn(session_id, n, timeout=0)["status"] for n in (1, 2)]
    assert turns == ["cancelled", "cancelled"]
    assert rig.ledger.entries("delete_all") == []

    term.child.sendintr()
    term.child.expect(pexpect.EOF, timeout=10)


def test_a_turn_that_waits_for_its_budget_says_how_to_raise_it_and_goes_on(
    rig: Rig, terminals: list[Terminal]
) -> None:
    rig.start_server()
    rig.start_worker()
    rig.session("spender")  # the agent is registered
    sid = rig.client.create_session("spender", budget={"max_tokens": 1_000})["id"]
    term = chat(rig, terminals, "--session", sid)

    term.type(calls(("lookup", {"key": "k"})))
    screen = term.wait(
        lambda s: f"raise it: dex budget {sid} --max-tokens N" in s, what="the budget wait"
    )
    assert "the turn waits for a bigger budget: 1100 tokens used of a budget of 1000" in screen
    rig.client.set_budget(sid, max_tokens=10_000)
    screen = term.prompt()
    assert "results: " in screen  # the turn went on: the model answered
    assert rig.wait_turn(sid, 1)["status"] == "completed"
    assert screen.count("the turn waits for a bigger budget") == 1


def test_a_turn_that_waits_for_its_tenant_s_budget_names_the_admin_s_command(
    rig: Rig, terminals: list[Terminal]
) -> None:
    rig.start_server()
    rig.start_worker()
    rig.session("spender")  # the agent is registered
    rig.client.set_tenant_budget("acme", max_tokens_per_day=1_000)
    sid = rig.client.create_session("spender", tenant="acme")["id"]
    term = chat(rig, terminals, "--session", sid)

    term.type(calls(("lookup", {"key": "k"})))
    screen = term.wait(
        lambda s: "dex tenants budget acme --max-tokens-per-day N" in s, what="the budget wait"
    )
    assert "the turn waits for a bigger budget: tenant acme: 1100 tokens used today of 1000" in (
        " ".join(screen.split())
    )
    assert "raise tenant acme's budget" in screen and f"dex budget {sid}" not in screen
    rig.client.set_tenant_budget("acme", max_tokens_per_day=10_000)
    screen = term.prompt()
    assert "results: " in screen  # the turn went on: the model answered
    assert rig.wait_turn(sid, 1)["status"] == "completed"
