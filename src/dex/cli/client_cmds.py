"""The ``dex`` commands that talk to a running server as a client: sessions, messages,
turns, waits and reconciliation. Each prints a summary for people; ``--json`` prints the
whole object the API answered."""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dex._address import DEFAULT_ADDRESS
from dex.errors import DexError

if TYPE_CHECKING:  # loaded by the commands that use them
    from dex.client import SyncClient

app = typer.Typer()
"""Merged into the ``dex`` command (``dex.cli.main``)."""

Address = Annotated[str, typer.Option(envvar="DEX_ADDRESS", help="Server address(es).")]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON.")]


class OnBusyChoice(StrEnum):
    """``dex send --on-busy`` (``dex.wire.OnBusy``)."""

    ENQUEUE = "enqueue"
    REJECT = "reject"
    INTERRUPT = "interrupt"
    STEER = "steer"


OnBusyOption = Annotated[
    OnBusyChoice | None,
    typer.Option(
        "--on-busy",
        envvar="DEX_ON_BUSY",
        help="If a turn runs: enqueue (wait for it), reject (refuse), interrupt (cancel it, "
        "start a turn with this message), steer (join it). Default: the agent's policy.",
    ),
]


class StatusFilter(StrEnum):
    IDLE = "idle"
    RUNNING = "running"
    WAITING = "waiting"
    FAILED = "failed"
    OUTCOME_UNKNOWN = "outcome_unknown"


class Order(StrEnum):
    CREATED = "created"
    UPDATED = "updated"


TIME_HELP = "ISO-8601 (local time unless it says), a time ago (30m, 2h, 7d) or Unix seconds."
# Client commands send DEX_CLIENT_TOKEN when the server has auth on (dex.Client reads it).
By = Annotated[str | None, typer.Option(help="Who does it (recorded).")]
MaxTokens = Annotated[
    int | None,
    typer.Option(min=1, help="Budget: the session's input and output tokens in all."),
]
MaxCost = Annotated[
    float | None,
    typer.Option(help="Budget: what its model calls may cost, in USD (more than 0)."),
]


def _call(address: str, action: Callable[[SyncClient], Any], token: str | None = None) -> None:
    """Run one client call and print its JSON; a Dex error is a message, not a traceback.
    ``token``: the one to send (default: the Client's, ``DEX_CLIENT_TOKEN``)."""
    from dex.client import SyncClient

    with SyncClient(address, token=token) as client:
        try:
            value = action(client)
            if value is not None:
                print_json(value)
        except DexError as e:
            typer.echo(f"error: {_explained(e)}", err=True)
            raise typer.Exit(1) from None


def _explained(e: DexError) -> str:
    """The error's message, with each problem the server found in the request."""
    problems = e.details.get("problems") or []
    found = "; ".join(f"{p.get('where')}: {p.get('problem')}" for p in problems)
    return f"{e.message} ({found})" if found else e.message


@app.command()
def workers(address: Address = DEFAULT_ADDRESS, json_output: JsonFlag = False) -> None:
    """The Workers connected to the server: agents, tools, capacity, running attempts."""

    def show(client: SyncClient) -> Any:
        found = client.list_workers()
        if json_output:
            return found
        if not found:
            typer.echo("no Worker is connected: start one with `dex worker MODULE`")
            return None
        for w in found:
            agents = ", ".join(
                f"{a['name']} ({', '.join(a['tools']) or 'no tools'})" for a in w["agents"]
            )
            node = f"  node {w['node']}" if w.get("node") else ""
            typer.echo(
                f"{w['worker_id']}{node}  capacity {w['capacity']}  running {len(w['running'])}"
                f"{'  draining' if w['draining'] else ''}\n  serves {agents}"
            )
        return None

    _call(address, show)


@app.command()
def cluster(address: Address = DEFAULT_ADDRESS, json_output: JsonFlag = False) -> None:
    """The nodes of the cluster and the partitions each owns now."""

    def show(client: SyncClient) -> Any:
        found = client.get_cluster()
        if json_output:
            return found
        if not found["members"]:
            typer.echo("a single node: it serves every session itself (no cluster)")
            return None
        typer.echo(f"{len(found['members'])} nodes, {found['partition_count']} partitions")
        for m in found["members"]:
            role = "standby" if m["standby"] else "active"
            here = "  (answered)" if m["here"] else ""
            typer.echo(
                f"{m['node_id']}  {m['address']}  {role}  {len(m['partitions'])} partitions{here}"
            )
        return None

    _call(address, show)


@app.command()
def events(
    session_id: str,
    address: Address = DEFAULT_ADDRESS,
    json_output: JsonFlag = False,
) -> None:
    """Follow a session's events as they happen (turns, waits, history items, model text)
    until interrupted."""
    import asyncio

    from dex.client import Client

    async def follow() -> None:
        async with Client(address) as client:
            async for event in client.stream_events(session_id):
                if json_output:
                    typer.echo(json.dumps(event, sort_keys=True))
                elif event["type"] == "model.delta":
                    typer.echo(event["data"].get("text", ""), nl=False)
                else:
                    data = {k: v for k, v in event["data"].items() if k != "type"}
                    typer.echo(f"\n[{event['id']}] {event['type']} {json.dumps(data)}")

    try:
        asyncio.run(follow())
    except DexError as e:
        typer.echo(f"error: {e.message}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        pass


@app.command()
def new(
    agent: str,
    address: Address = DEFAULT_ADDRESS,
    session_id: Annotated[
        str | None, typer.Option(help="The session's id (default: a new random one).")
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option(
            help="Whose session it is, for good (default: a tenant-scoped token's tenant, "
            "else none)."
        ),
    ] = None,
    priority: Annotated[
        int, typer.Option(help="Its Steps go ahead of its tenant's lower-priority sessions'.")
    ] = 0,
    max_tokens: MaxTokens = None,
    max_cost_usd: MaxCost = None,
    json_output: JsonFlag = False,
) -> None:
    """Create a session with AGENT and say how to talk to it."""
    limits = {"max_tokens": max_tokens, "max_cost_usd": max_cost_usd}
    budget = limits if max_tokens is not None or max_cost_usd is not None else None
    _call(
        address,
        lambda c: _session(
            c.create_session(agent, session_id, tenant=tenant, priority=priority, budget=budget),
            json_output,
        ),
    )


def _session(session: dict[str, Any], json_output: bool) -> dict[str, Any] | None:
    """A session for ``_call``: whole with ``--json``, else its summary, printed here."""
    from dex.cli import render

    if json_output:
        return session
    _lines(render.session_summary(session))
    return None


def _lines(lines: list[str]) -> None:
    typer.echo("\n".join(lines))


@app.command()
def fork(
    session_id: str,
    turn: Annotated[
        int,
        typer.Option(
            help="The first turn the fork does not have: it keeps the history before this "
            "turn's message (one past the last turn: all of it)."
        ),
    ],
    new_id: Annotated[str | None, typer.Option("--session-id", help="The fork's id.")] = None,
    address: Address = DEFAULT_ADDRESS,
    json_output: JsonFlag = False,
) -> None:
    """Fork a session at a turn: a new session to try that turn again, differently. The
    original does not change."""
    _call(address, lambda c: _session(c.fork_session(session_id, turn, new_id), json_output))


@app.command()
def snapshot(session_id: str, address: Address = DEFAULT_ADDRESS) -> None:
    """Print a session's agent snapshot as JSON."""
    _call(address, lambda c: c.get_agent_snapshot(session_id))


@app.command()
def send(
    session_id: str,
    text: str,
    address: Address = DEFAULT_ADDRESS,
    wait: Annotated[
        float,
        typer.Option(help="Seconds to wait for the turn to end or to wait for a person."),
    ] = 60.0,
    on_busy: OnBusyOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Send a message to a session and sum its turn up (its tool calls and their outcomes,
    its text): once it ends, or as soon as it waits for a person (an approval, an answer),
    saying what it waits for. ``--on-busy`` decides what the message does if a turn runs
    (docs/mid-turn.md); a message that did not start its turn says what it did (on
    stderr)."""
    from dex.cli import render

    def sent(client: SyncClient) -> Any:
        policy = on_busy.value if on_busy is not None else None
        turn = client.send_message(session_id, text, on_busy=policy, wait=wait > 0, timeout=wait)
        err = render.console(stderr=True)
        if turn.get("outcome", "started") != "started":  # queued, interrupted, steered
            err.print(render.sent_line(turn), markup=False)
        for w in turn.get("waiting_for", []):
            err.print(f"turn {turn['turn']} waits: {render.wait_text(w)}", markup=False)
            err.print(f"  {render.how_to_act(w)}", markup=False)
        if json_output:
            return turn
        _lines(render.turn_summary(turn))
        return None

    _call(address, sent)


@app.command("turn")
def turn_command(
    session_id: str,
    number: Annotated[int, typer.Argument(help="The turn's number (1 is the first).")],
    address: Address = DEFAULT_ADDRESS,
    json_output: JsonFlag = False,
) -> None:
    """Show a turn: its tool calls and outcomes, and each Step with its attempts (number,
    outcome, Worker, time taken, error)."""
    from dex.cli import render

    def show(client: SyncClient) -> Any:
        turn = client.wait_turn(session_id, number, timeout=0)
        if turn["status"] == "running":  # its Steps so far are in the snapshot
            current = client.get_agent_snapshot(session_id)["current_turn"]
            if current is not None and current["number"] == number:
                turn = {**current, "session_id": session_id, "turn": number}
        if json_output:
            return turn
        _lines(render.turn_summary(turn, hint=False))
        if turn.get("steps"):
            render.console().print(render.steps_table(turn))
        return None

    _call(address, show)


@app.command()
def sessions(
    address: Address = DEFAULT_ADDRESS,
    agent: Annotated[str | None, typer.Option(help="Only this agent's sessions.")] = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's sessions.")] = None,
    status: Annotated[
        StatusFilter | None,
        typer.Option(
            help="waiting: for a person; failed: the last turn; outcome_unknown: a tool "
            "call's outcome is unknown, not reconciled."
        ),
    ] = None,
    created_since: Annotated[str | None, typer.Option(help=TIME_HELP)] = None,
    created_before: Annotated[str | None, typer.Option(help=TIME_HELP)] = None,
    updated_since: Annotated[str | None, typer.Option(help=TIME_HELP)] = None,
    updated_before: Annotated[str | None, typer.Option(help=TIME_HELP)] = None,
    order: Annotated[
        Order, typer.Option(help="Newest created first, or the latest changed first.")
    ] = Order.CREATED,
    limit: Annotated[int, typer.Option(help="Sessions per page.")] = 50,
    cursor: Annotated[str | None, typer.Option(help="Where the previous page ended.")] = None,
    json_output: JsonFlag = False,
) -> None:
    """Sessions newest first, filtered: one page, and how to ask for the next."""
    from dex.cli import render

    times = {
        name: _time(name, value)
        for name, value in (
            ("created_since", created_since),
            ("created_before", created_before),
            ("updated_since", updated_since),
            ("updated_before", updated_before),
        )
    }

    def show(client: SyncClient) -> Any:
        page = client.list_sessions(
            agent=agent,
            tenant=tenant,
            status=status.value if status else None,
            order=order.value,
            limit=limit,
            cursor=cursor,
            **times,
        )
        if json_output:
            return page
        if not page["sessions"]:
            typer.echo("no session matches")
        else:
            render.console().print(render.sessions_table(page["sessions"]))
        _next_page(page["next_cursor"])
        return None

    _call(address, show)


@app.command()
def inbox(
    address: Address = DEFAULT_ADDRESS,
    limit: Annotated[int, typer.Option(help="Sessions per page.")] = 50,
    cursor: Annotated[str | None, typer.Option(help="Where the previous page ended.")] = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's sessions.")] = None,
    json_output: JsonFlag = False,
) -> None:
    """What waits for a person across sessions: tool calls to approve, questions to answer."""
    from dex.cli import render

    def show(client: SyncClient) -> Any:
        page = client.list_inbox(limit=limit, cursor=cursor, tenant=tenant)
        if json_output:
            return page
        items = page["items"]
        if not items:
            typer.echo("nothing waits for a person")
        else:
            render.console().print(render.inbox_table(items))
            typer.echo("approve: dex approve SESSION CALL   deny: dex deny SESSION CALL REASON")
            typer.echo("answer:  dex answer SESSION CALL ANSWER")
            if any(i["kind"] == "budget" for i in items):
                typer.echo("budget:  dex budget SESSION --max-tokens N | --max-cost-usd USD")
        _next_page(page["next_cursor"])
        return None

    _call(address, show)


def _time(name: str, value: str | None) -> float | None:
    from dex.cli.render import parse_time

    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--" + name.replace("_", "-")) from None


def _next_page(cursor: str | None) -> None:
    if cursor is not None:
        typer.echo(f"more: the same command with --cursor {cursor}", err=True)


@app.command()
def approvals(
    session_id: str, address: Address = DEFAULT_ADDRESS, json_output: JsonFlag = False
) -> None:
    """List the tool calls that wait for approval."""
    from dex.cli import render

    def show(client: SyncClient) -> Any:
        found = client.list_approvals(session_id)
        if json_output:
            return found
        if not found:
            typer.echo(f"no tool call of {session_id} waits for approval")
            return None
        render.console().print(render.approvals_table(found))
        typer.echo(f"approve: dex approve {session_id} CALL")
        typer.echo(f"deny:    dex deny {session_id} CALL REASON")
        return None

    _call(address, show)


@app.command()
def approve(
    session_id: str,
    call_id: str,
    address: Address = DEFAULT_ADDRESS,
    by: By = None,
    arguments_hash: Annotated[
        str | None, typer.Option(help="The arguments_hash you reviewed: refuse any other.")
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Approve a tool call: it runs once."""
    said = f"approved {call_id}: it runs once"
    _act(
        address,
        json_output,
        said,
        lambda c: c.approve(session_id, call_id, by=by, arguments_hash=arguments_hash),
    )


@app.command()
def deny(
    session_id: str,
    call_id: str,
    reason: str,
    address: Address = DEFAULT_ADDRESS,
    by: By = None,
    json_output: JsonFlag = False,
) -> None:
    """Deny a tool call: the model sees REASON."""
    said = f"denied {call_id}: it does not run, and the model sees why"
    _act(address, json_output, said, lambda c: c.deny(session_id, call_id, reason, by=by))


@app.command()
def answer(
    session_id: str,
    call_id: str,
    text: str,
    address: Address = DEFAULT_ADDRESS,
    by: By = None,
    json_output: JsonFlag = False,
) -> None:
    """Answer the question a tool asked."""
    said = f"answered {call_id}: the tool goes on with the answer"
    _act(address, json_output, said, lambda c: c.answer(session_id, call_id, text, by=by))


@app.command()
def cancel(
    session_id: str,
    address: Address = DEFAULT_ADDRESS,
    reason: Annotated[str, typer.Option()] = "cancelled from the command line",
    json_output: JsonFlag = False,
) -> None:
    """Cancel the running turn of a session."""

    def cancelled(client: SyncClient) -> Any:
        done = client.cancel_turn(session_id, reason)
        return _said(done, json_output, f"cancelled turn {done['turn']} of {session_id}")

    _call(address, cancelled)


@app.command()
def budget(
    session_id: str,
    max_tokens: MaxTokens = None,
    max_cost_usd: MaxCost = None,
    remove: Annotated[bool, typer.Option("--remove", help="No limit any more.")] = False,
    address: Address = DEFAULT_ADDRESS,
    by: By = None,
    json_output: JsonFlag = False,
) -> None:
    """Set a session's budget (tokens, USD or both; --remove: no limit), or show it and
    what the session used. A turn that waits for its budget goes on once it is not used
    up."""
    from dex.cli import render

    if remove and (max_tokens is not None or max_cost_usd is not None):
        raise typer.BadParameter("either --remove or new limits, not both", param_hint="--remove")

    def change(client: SyncClient) -> Any:
        if remove:
            done = client.remove_budget(session_id, by=by)
        elif max_tokens is not None or max_cost_usd is not None:
            done = client.set_budget(
                session_id, max_tokens=max_tokens, max_cost_usd=max_cost_usd, by=by
            )
        else:
            session = client.get_agent_snapshot(session_id)["session"]
            done = {k: session.get(k) for k in ("budget", "usage", "status")}
            done["session_id"] = session_id
        if json_output:
            return done
        used = render.usage_text(done["usage"]) or "nothing"
        typer.echo(
            f"session {session_id}: {render.budget_text(done['budget'])}; used {used}; "
            f"{done['status']}"
        )
        return None

    _call(address, change)


def _act(
    address: str, json_output: bool, sentence: str, action: Callable[[SyncClient], dict[str, Any]]
) -> None:
    """Run one action (``_call``) and print what it answered: whole with ``--json``, else
    ``sentence``."""
    _call(address, lambda c: _said(action(c), json_output, sentence))


def _said(answer: dict[str, Any], json_output: bool, sentence: str) -> dict[str, Any] | None:
    """What an action answered, for ``_call``: whole with ``--json``, else ``sentence``."""
    if json_output:
        return answer
    typer.echo(sentence)
    return None


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@app.command()
def reconcile(
    session_id: str,
    call_id: str,
    status: Annotated[Outcome, typer.Option(help="What really happened.")],
    address: Address = DEFAULT_ADDRESS,
    result: Annotated[
        str | None, typer.Option(help="What it returned, as JSON (with --status succeeded).")
    ] = None,
    error: Annotated[
        str | None, typer.Option(help="What went wrong (with --status failed).")
    ] = None,
    by: By = None,
    json_output: JsonFlag = False,
) -> None:
    """Record what really happened to an outcome_unknown tool call: the model is told."""
    from dex.cli import render

    if status == Outcome.FAILED and result is not None:
        raise typer.BadParameter(
            "a call that failed has no result: say what went wrong with --error",
            param_hint="--result",
        )
    if status == Outcome.SUCCEEDED and error is not None:
        raise typer.BadParameter(
            "a call that succeeded has no error: give what it returned with --result",
            param_hint="--error",
        )
    try:
        value = json.loads(result) if result is not None else None
    except json.JSONDecodeError as e:
        raise typer.BadParameter(f"not JSON: {e}", param_hint="--result") from None

    def settle(client: SyncClient) -> Any:
        call = client.reconcile(
            session_id, call_id, status=status.value, result=value, error=error, by=by
        )
        if json_output:
            return call
        typer.echo(f"reconciled: {render.tool_call_line(call)}")
        return None

    _call(address, settle)


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True))
