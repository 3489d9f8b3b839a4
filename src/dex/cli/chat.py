"""``dex chat``: talk to an agent in the terminal.

The model's text streams into a live region at the bottom of the screen, with the tool
calls that run and what the turn waits for; what is durable (the session's history
items) is printed above it, each exactly once, by its index in the history. So whatever
happens to the connection, the chat prints only what Dex committed: after a server
restart it reads the snapshot, prints the items it had not shown, and streams on. Live
text is never printed for good: the region shows the current attempt's text (a
``model.discard`` event, or the next attempt of the same Step, drops a failed attempt's), and
the assistant's item replaces it once committed.

Approvals and questions are asked inline. Ctrl-C during a turn cancels it; at the prompt
(or Ctrl-D) it leaves the chat. While a turn waits for a person, ``/steer MESSAGE`` adds a
message to it (it goes on waiting, and its next model call sees the message) and
``/interrupt MESSAGE`` cancels it and starts a turn with the message (docs/mid-turn.md); at
the message prompt they send with that ``on_busy``, and a plain message does what the
agent's ``on_busy`` says. A line that starts with ``/`` is one of the chat's
commands (``COMMANDS``: ``/help`` lists them), at any prompt, and is never sent to the agent.
Messages carry an id, so a send cut off by a node's death is sent again safely.

The prompts read the terminal in the main thread while the event loop runs on in a thread
of its own (``Loop``): a person may take minutes to decide, and the client's connections
stay sound meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import getpass
import json
import signal
import threading
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.spinner import Spinner
from rich.text import Text

from dex.cli.render import call_text, sent_line, tenant_raise_text, wait_text
from dex.client import Client
from dex.errors import Conflict, DexError, NotFound, Unavailable

if TYPE_CHECKING:
    from dex.wire import OnBusy

PERSON_WAITS = ("AwaitToolApproval", "AwaitQuestionAnswer", "AwaitBudget")
ENDED = ("completed", "failed", "cancelled")
RECONNECT = (0.1, 0.2, 0.5, 1.0, 2.0)
"""Seconds between tries to reach the server again; the last repeats."""
T = TypeVar("T")


class Resync(Exception):
    """The stream missed something: read the snapshot again."""


@dataclass
class Chat:
    client: Client
    session_id: str
    console: Console
    by: str = field(default_factory=getpass.getuser)
    shown: int = 0
    """How many history items are printed (they are printed in order, by index)."""
    typed: list[str] = field(default_factory=list)
    """Messages typed here whose history item has not come yet: the prompt showed them."""
    asked: set[str] = field(default_factory=set)
    """Tool calls whose approval or question was asked here (each once)."""
    partial: dict[str, str] = field(default_factory=dict)
    """Live text by step id: the attempt that streams it, and its text so far."""
    attempt_of: dict[str, str] = field(default_factory=dict)
    discarded: set[str] = field(default_factory=set)
    """Attempts whose text a ``model.discard`` voided: a late delta of theirs is dropped."""
    running: dict[str, str] = field(default_factory=dict)
    """Tool calls of the latest model answer without a result yet: model call id -> text."""
    status: str = "thinking"
    live: Live | None = None

    # --- what is printed for good: history items -------------------------------------------

    def show_history(self, items: list[dict[str, Any]], start: int = 0) -> None:
        """Print the items of ``items`` (``items[0]`` is history index ``start``) not shown
        yet; a gap means the stream missed one."""
        for index, item in enumerate(items, start):
            if item["type"] == "assistant":
                # its text is in the item: live text before it is old, and any late text of
                # those attempts (a stream that replays its buffer) is void
                self.discarded.update(self.attempt_of.values())
                self.partial.clear()
                self.attempt_of.clear()
            if index < self.shown:
                continue
            if index > self.shown:
                raise Resync()
            self._print_item(item)
            self.shown += 1

    def _print_item(self, item: dict[str, Any]) -> None:
        kind = item["type"]
        if kind == "user":
            if self.typed and self.typed[0] == item["text"]:
                self.typed.pop(0)  # the prompt shows it already
            else:
                self._print(Text.assemble(("you> ", "bold cyan"), item["text"]))
        elif kind == "assistant":
            self.status = "running tools" if item["tool_calls"] else "thinking"
            if item["text"]:
                self._print(Text.assemble(("agent> ", "bold green"), item["text"]))
            for call in item["tool_calls"]:
                text = call_text({"tool": call["name"], "arguments": call["arguments"]})
                self.running[call["id"]] = text
                self._print(Text(f"  → {text}", style="magenta"))
        elif kind == "tool_result":
            self.running.pop(item["call_id"], None)
            status = item["status"]
            style = {"succeeded": "green", "outcome_unknown": "yellow"}.get(status, "red")
            detail = json.dumps(item["result"]) if status == "succeeded" else item["error"]
            self._print(Text(f"  ← {item['name']} {status}: {detail}", style=style))
        elif kind == "note":
            self._print(Text(f"note: {item['text']}", style="dim"))
        else:
            self._print(Text("(the conversation before this was summarized)", style="dim"))

    def _print(self, renderable: RenderableType) -> None:
        (self.live.console if self.live is not None else self.console).print(renderable)

    # --- what is live: the region at the bottom ---------------------------------------------

    def _view(self) -> RenderableType:
        parts: list[RenderableType] = []
        for text in self.partial.values():
            parts.append(Text.assemble(("agent> ", "bold green"), text))
        for text in self.running.values():
            parts.append(Text(f"  ⋯ {text}", style="dim"))
        parts.append(Spinner("dots", Text(self.status, style="dim")))
        return Group(*parts)

    def _refresh(self) -> None:
        if self.live is not None:
            self.live.update(self._view())

    def _delta(self, data: dict[str, Any]) -> None:
        step, attempt = data.get("step_id"), data.get("attempt_id")
        if step is None or attempt in self.discarded:
            return  # late text of a void attempt (a node that lost its lead sent it)
        if self.attempt_of.get(step) != attempt:  # a new attempt: the last one's text is void
            self.attempt_of[step] = str(attempt)
            self.partial[step] = ""
        self.partial[step] += data.get("text", "")
        self.status = "streaming"

    def _discard(self, data: dict[str, Any]) -> None:
        attempt = data.get("attempt_id")
        if attempt is not None:
            self.discarded.add(attempt)
        for step, of in list(self.attempt_of.items()):
            if attempt is None or of == attempt:
                self.partial.pop(step, None)
                self.attempt_of.pop(step, None)

    # --- a turn ------------------------------------------------------------------------------

    async def send(self, text: str, on_busy: OnBusy | None = None) -> dict[str, Any]:
        """Send a message (``on_busy``: what it does if a turn runs; None: the agent's
        policy); what the server answered. What it did is said, unless it started a turn."""
        self.typed.append(text)
        sent = await self.client.send_message(
            self.session_id, text, message_id=uuid.uuid4().hex, on_busy=on_busy
        )
        if sent["outcome"] != "started":
            self.console.print(Text(sent_line(sent), style="dim"))
        return sent

    async def follow(self, turn: int) -> list[dict[str, Any]]:
        """Show the turn until it ends (returns ``[]``) or waits for a person (returns what
        it waits for that was not asked here yet)."""
        self.status = "thinking"
        with Live(
            self._view(), console=self.console, transient=True, refresh_per_second=12
        ) as live:
            self.live = live
            try:
                return await self._follow(turn)
            finally:
                self.live = None
                self.partial.clear()
                self.attempt_of.clear()

    async def _follow(self, turn: int) -> list[dict[str, Any]]:
        tries = 0
        while True:
            try:
                return await self._sync_and_stream(turn)
            except Resync:
                continue
            except Unavailable:
                self.status = "the server does not answer: reconnecting"
                # the node's live text is gone; the retry streams anew (a reclaimed attempt
                # goes on streaming from where it is)
                self.partial.clear()
                self.attempt_of.clear()
                self._refresh()
                await asyncio.sleep(RECONNECT[min(tries, len(RECONNECT) - 1)])
                tries += 1

    async def _sync_and_stream(self, turn: int) -> list[dict[str, Any]]:
        """Print what the snapshot has that was not shown, then stream what follows (the
        stream starts with the events the node still buffers: a restarted node numbers
        them anew, so they are told apart by history index and turn, not by event id)."""
        if (state := await self._settled(turn)) is not None:
            return state
        self.status = "thinking"
        self._refresh()
        # Not the client's own reconnect: after a break the snapshot is read again first,
        # since what happened in the gap (a turn that ended, an item committed by a node
        # that died) is in no new node's stream.
        stream = self.client.stream_events(self.session_id, reconnect=False)
        async with contextlib.aclosing(stream) as events:
            async for event in events:
                if (state := await self._on(turn, event)) is not None:
                    return state
        raise Unavailable("the event stream ended")

    async def _on(self, turn: int, event: dict[str, Any]) -> list[dict[str, Any]] | None:
        kind, data = event["type"], event["data"]
        if kind == "history.item":
            self.show_history([data["item"]], data["index"])
        elif kind == "model.delta":
            if str(data.get("step_id", "")).split(".")[0] == str(turn):
                self._delta(data)
        elif kind == "model.discard":
            self._discard(data)
        elif kind in ("stream.gap", "stream.dropped"):
            raise Resync()  # the stream lost events: the snapshot has what is durable
        elif data.get("turn") == turn and (
            kind in {f"turn.{s}" for s in ENDED}
            or (kind == "wait.started" and data.get("wait") in PERSON_WAITS)
        ):
            # a replayed event may be old news: the turn's record says where it is now
            return await self._settled(turn)
        self._refresh()
        return None

    async def _settled(self, turn: int) -> list[dict[str, Any]] | None:
        """Where the turn is now: ``[]`` if it ended, the waits not asked here yet if it
        waits for a person (everything the history has up to then printed first), or
        None while it runs on."""
        record = await self.client.wait_turn(self.session_id, turn, timeout=0)
        status = record["status"]
        waits = [w for w in record.get("waiting_for", []) if wait_key(w) not in self.asked]
        if status not in ENDED and not waits:
            self.status = "waiting for a person" if status == "waiting" else self.status
            return None
        snapshot = await self.client.get_agent_snapshot(self.session_id)  # has all of it
        self.show_history(snapshot["history"])
        if status == "failed":
            self._print(Text(f"the turn failed: {record['error']}", style="bold red"))
        elif status == "cancelled":
            self._print(Text(f"the turn was {record['error']}", style="yellow"))
        return waits

    # --- a person's part ---------------------------------------------------------------------

    async def resolve(self, wait: dict[str, Any], verb: str, args: dict[str, Any]) -> None:
        """Record the person's decision. If the server did not take it, it is asked again."""
        sid, call = wait["session_id"], wait["call_id"]
        try:
            if verb == "approve":
                await self.client.approve(sid, call, by=self.by, **args)
            elif verb == "deny":
                await self.client.deny(sid, call, args["reason"], by=self.by)
            else:
                await self.client.answer(sid, call, args["answer"], by=self.by)
        except Conflict as e:  # somebody else was first, or the turn moved on
            self.console.print(Text(f"not recorded: {e.message}", style="yellow"))
        except DexError as e:
            self.asked.discard(call)
            self.console.print(Text(f"not recorded, asking again: {e.message}", style="red"))

    async def cancel(self) -> None:
        """Cancel the session's running turn (Ctrl-C during a turn, or ``/cancel``)."""
        self.console.print(Text("cancelling the turn ...", style="yellow"))
        try:
            await self.client.cancel_turn(self.session_id, "cancelled in dex chat")
        except Conflict:
            self.console.print(Text("no turn runs", style="dim"))

    async def show_snapshot(self) -> None:
        """``/snapshot``: where the session is, in a few lines."""
        snapshot = await self.client.get_agent_snapshot(self.session_id)
        session, current = snapshot["session"], snapshot["current_turn"]
        lines = [
            f"session {session['id']} with {session['agent']}: {session['status']}, "
            f"{session['messages_received']} messages, {len(snapshot['history'])} history items"
        ]
        if current is not None:
            record = await self.client.wait_turn(self.session_id, current["number"], timeout=0)
            lines.append(f"turn {record['turn']}: {record['status']}")
            lines += [f"  waits: {wait_text(w)}" for w in record.get("waiting_for", [])]
        lines += [f"  call {c['id']} {c['name']}: {c['status']}" for c in snapshot["tool_calls"]]
        lines.append(f"all of it, as JSON: dex snapshot {session['id']}")
        self.console.print(Text("\n".join(lines), style="dim"))


# --- the terminal: prompts, and the commands typed at them -----------------------------------

COMMANDS = {
    "help": "these commands",
    "approve": "approve the tool call the chat asks about (as y)",
    "deny": "deny it (as n); /deny REASON gives the reason at once",
    "cancel": "cancel the running turn (as Ctrl-C during a turn)",
    "steer": "/steer MESSAGE: add it to the turn that waits here; its next model call sees it",
    "interrupt": "/interrupt MESSAGE: cancel the turn that waits here, start one with it",
    "snapshot": "where the session is: its turn, what it waits for, its tool calls",
    "exit": "leave the chat (as Ctrl-D); the session stays: dex chat --session ID goes on",
}
"""What a line that starts with ``/`` can say, at any prompt of the chat. Such a line is
never sent to the agent (nor taken as an answer); ``//`` sends a line that starts with
``/``."""
ALIASES = {"quit": "exit"}


class Leave(Exception):
    """The person typed ``/exit``."""


@dataclass
class Command:
    name: str
    """A name of ``COMMANDS``, or what was typed if it is none."""
    rest: str
    """What follows the name (the reason of ``/deny``)."""


def command(line: str) -> Command | None:
    """The command a typed line gives, or None for text (``//`` escapes a ``/``)."""
    text = line.strip()
    if not text.startswith("/") or text.startswith("//"):
        return None
    name, _, rest = text[1:].partition(" ")
    name = name.lower()
    return Command(ALIASES.get(name, name), rest.strip())


def message(line: str) -> str:
    """The message a typed line sends: as typed, with ``//`` for a leading ``/``."""
    return line.replace("//", "/", 1) if line.lstrip().startswith("//") else line


def help_text() -> Text:
    width = max(len(name) for name in COMMANDS) + 2
    lines = [f"/{name:<{width}}{what}" for name, what in COMMANDS.items()]
    lines.append("a line that starts with // is sent with one / less")
    return Text("\n".join(lines), style="dim")


class Loop:
    """The chat's event loop, in a thread of its own, so that it runs on while the main
    thread waits for the person at a prompt: the client sees the server close an idle
    connection and never writes the next request on it. The main thread reads the terminal
    (readline keeps the line editing, and puts the terminal back on Ctrl-C or Ctrl-D), and
    Ctrl-C is a KeyboardInterrupt there, at a prompt or while it waits for ``run``."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="dex-chat")

    def _serve(self) -> None:
        if hasattr(signal, "pthread_sigmask"):
            # Ctrl-C must wake the main thread (the kernel may give a SIGINT to any thread
            # that does not block it); the threads the loop starts inherit this
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        self._loop.run_forever()

    def __enter__(self) -> Loop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._loop.shutdown_asyncgens(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """What ``coro`` returns, run on the loop. Ctrl-C cancels it and, once it has wound
        up (the live region cleared), raises KeyboardInterrupt."""
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        tasks: list[asyncio.Task[T]] = []

        def start() -> None:
            task = self._loop.create_task(coro)
            tasks.append(task)
            task.add_done_callback(lambda t: _settle(t, done))

        self._loop.call_soon_threadsafe(start)
        try:
            return done.result()
        except KeyboardInterrupt:
            self._loop.call_soon_threadsafe(lambda: tasks[0].cancel())  # after start: FIFO
            with contextlib.suppress(concurrent.futures.CancelledError):
                done.exception()  # it has wound up (not futures.wait: it misses a cancel)
            raise


def _settle(task: asyncio.Task[T], done: concurrent.futures.Future[T]) -> None:
    if task.cancelled():
        done.cancel()
    elif (error := task.exception()) is not None:
        done.set_exception(error)
    else:
        done.set_result(task.result())


async def open_session(
    client: Client, agent: str | None, session_id: str | None, tenant: str | None = None
) -> str:
    """The session to chat in: ``session_id``'s, or a new one with ``agent`` (the only
    agent a Worker serves, when none is named), of ``tenant``."""
    if session_id is not None:
        snapshot = await client.get_agent_snapshot(session_id)
        if agent is not None and snapshot["session"]["agent"] != agent:
            raise DexError(
                f"session {session_id} talks to {snapshot['session']['agent']}, not {agent}"
            )
        return session_id
    if agent is None:
        names = sorted(a["name"] for a in await client.list_agents())
        if len(names) != 1:
            raise NotFound(
                "name the agent to talk to: " + (", ".join(names) or "no Worker serves one yet")
            )
        agent = names[0]
    created = await client.create_session(agent, tenant=tenant)
    return str(created["id"])


def run(address: str, agent: str | None, session_id: str | None, tenant: str | None = None) -> None:
    """The chat's loop: read a line, follow its turn, ask what the turn waits for."""
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (line editing and history at the prompt)
    console = Console(highlight=False)
    with Loop() as loop:
        client = Client(address)
        try:
            sid = loop.run(open_session(client, agent, session_id, tenant))
            chat = Chat(client, sid, console)
            snapshot = loop.run(client.get_agent_snapshot(sid))
            who = snapshot["session"]["agent"]
            console.print(
                Text(
                    f"session {sid} with {who}: Ctrl-D or /exit leaves, Ctrl-C cancels a "
                    "turn, /help lists the commands",
                    style="dim",
                )
            )
            chat.show_history(snapshot["history"])
            current = snapshot["current_turn"]
            if current is not None:
                _turn(loop, chat, int(current["number"]))
            while True:
                try:
                    line = console.input("[bold cyan]you>[/] ")
                except (EOFError, KeyboardInterrupt):
                    console.print()
                    return
                if (typed := command(line)) is not None:
                    _command(loop, chat, typed)
                elif line.strip() and (sent := _send(loop, chat, message(line))) is not None:
                    _turn(loop, chat, int(sent["turn"]))
        except Leave:
            return
        finally:
            loop.run(client.close())


def _command(loop: Loop, chat: Chat, typed: Command) -> None:
    """A command typed at the message prompt."""
    if typed.name in ("approve", "deny"):
        current = loop.run(chat.client.get_agent_snapshot(chat.session_id))["current_turn"]
        if current is None:
            chat.console.print(Text("nothing waits for a decision", style="dim"))
        else:  # a turn started elsewhere: follow it, and ask what it waits for
            _turn(loop, chat, int(current["number"]))
    elif typed.name == "cancel":
        loop.run(chat.cancel())
    elif typed.name in ON_BUSY_COMMANDS:
        if not typed.rest:
            chat.console.print(Text(f"type /{typed.name} MESSAGE", style="yellow"))
        elif (sent := _send(loop, chat, typed.rest, ON_BUSY_COMMANDS[typed.name])) is not None:
            _turn(loop, chat, int(sent["turn"]))
    else:
        _common(loop, chat, typed)


ON_BUSY_COMMANDS: dict[str, OnBusy] = {"steer": "steer", "interrupt": "interrupt"}
"""The commands that send a message with their ``on_busy``."""


def _common(loop: Loop, chat: Chat, typed: Command) -> None:
    """A command that does the same at every prompt."""
    if typed.name == "exit":
        sid = chat.session_id
        chat.console.print(Text(f"left {sid}: dex chat --session {sid} goes on", style="dim"))
        raise Leave()
    if typed.name == "snapshot":
        loop.run(chat.show_snapshot())
        return
    if typed.name != "help":
        chat.console.print(Text(f"no command /{typed.name}: the commands are", style="yellow"))
    chat.console.print(help_text())


def _send(
    loop: Loop, chat: Chat, text: str, on_busy: OnBusy | None = None
) -> dict[str, Any] | None:
    """What the server answered the message (its ``turn`` answers it), or None if it did
    not acknowledge it (said why: it may still have been recorded, and then the snapshot
    and ``dex chat --session`` show it)."""
    try:
        return loop.run(chat.send(text, on_busy))
    except (DexError, KeyboardInterrupt) as e:
        chat.typed.remove(text)
        why = e.message if isinstance(e, DexError) else "interrupted"
        chat.console.print(Text(f"the message was not acknowledged: {why}", style="red"))
        return None


def wait_key(wait: dict[str, Any]) -> str:
    """What a wait is told apart by: its tool call, or (a budget wait) its Step."""
    return str(wait["call_id"] or wait["step_id"])


def _tell_budget(chat: Chat, wait: dict[str, Any]) -> None:
    """A turn that waits for a bigger budget: say so, and how to raise it (elsewhere: the
    chat follows the turn on once it goes on, and Ctrl-C cancels it)."""
    chat.asked.add(wait_key(wait))
    sid, tenant = wait["session_id"], wait.get("tenant")
    if tenant:  # its tenant's budget: the tenant's admin raises it, not the session's owner
        how = f"raise tenant {tenant}'s budget: {tenant_raise_text(tenant)}, or in the console"
    else:
        how = (
            f"raise it: dex budget {sid} --max-tokens N (or --max-cost-usd USD, or --remove),"
            " or in the console"
        )
    chat.console.print(
        Text(
            f"the turn waits for a bigger budget: {wait.get('reason')}\n"
            f"{how}; Ctrl-C cancels the turn",
            style="bold yellow",
        )
    )


def _turn(loop: Loop, chat: Chat, turn: int) -> None:
    """Follow a turn to its end, asking what it waits for; Ctrl-C cancels it. A message
    that interrupts it (``/interrupt``) starts a turn that is followed next."""
    following: list[int] = [turn]
    while following:
        turn = following[0]
        try:
            waits = loop.run(chat.follow(turn))
            for wait in waits:
                if wait["kind"] == "budget":
                    _tell_budget(chat, wait)
                    continue
                if (decision := _ask(loop, chat, wait, following)) is None:
                    break  # the turn was cancelled: following it shows how it ended
                loop.run(chat.resolve(wait, *decision))
        except KeyboardInterrupt:
            loop.run(chat.cancel())
            continue
        if not waits:
            following.pop(0)


def _ask(
    loop: Loop, chat: Chat, wait: dict[str, Any], following: list[int]
) -> tuple[str, dict[str, Any]] | None:
    """Ask the person at the terminal: the client method and its arguments, or None if
    they cancelled the turn (``/cancel``, or ``/interrupt MESSAGE``: the turn that answers
    the message joins ``following``). ``/steer MESSAGE`` adds a message to the turn, which
    goes on waiting: the question is asked again."""
    chat.asked.add(wait_key(wait))
    approval = wait["kind"] == "approval"
    if approval:
        prompt = f"[bold yellow]approve {escape(call_text(wait))}?[/] \\[y/n] "
    else:
        choices = f" [{'/'.join(wait['choices'])}]" if wait.get("choices") else ""
        asked = f"{wait['tool']} asks: {wait['question']}{choices}"
        prompt = f"[bold yellow]{escape(asked)}[/] "
    while True:
        line = chat.console.input(prompt)
        typed = command(line)
        if typed is None:
            reply = message(line).strip()
            if approval and reply.lower() in ("y", "yes"):
                return "approve", {"arguments_hash": wait["arguments_hash"]}
            if approval and reply.lower() in ("n", "no"):
                return "deny", {"reason": _reason(loop, chat, "")}
            if not approval and reply and (not wait.get("choices") or reply in wait["choices"]):
                return "answer", {"answer": reply}
        elif typed.name == "cancel":
            loop.run(chat.cancel())
            return None
        elif typed.name in ON_BUSY_COMMANDS and typed.rest:
            sent = _send(loop, chat, typed.rest, ON_BUSY_COMMANDS[typed.name])
            if sent is not None and sent["outcome"] in ("interrupted", "started"):
                following.append(int(sent["turn"]))
                return None  # the waiting turn ended (interrupted, or before the send)
        elif typed.name in ON_BUSY_COMMANDS:
            chat.console.print(Text(f"type /{typed.name} MESSAGE", style="yellow"))
        elif typed.name == "approve" and approval:
            return "approve", {"arguments_hash": wait["arguments_hash"]}
        elif typed.name == "deny" and approval:
            return "deny", {"reason": _reason(loop, chat, typed.rest)}
        elif typed.name in ("approve", "deny"):
            chat.console.print(Text("this is a question: type the answer", style="yellow"))
        else:
            _common(loop, chat, typed)


def _reason(loop: Loop, chat: Chat, given: str) -> str:
    """Why the person denies a call: what they gave with ``/deny``, or asked now (a
    command typed here is not the reason: the model reads it)."""
    while not given:
        line = chat.console.input("reason: ")
        if (typed := command(line)) is None:
            return message(line).strip() or "denied in dex chat"
        if typed.name in ("exit", "help", "snapshot"):
            _common(loop, chat, typed)
        else:
            chat.console.print(Text("type why it is denied (or nothing)", style="yellow"))
    return given
