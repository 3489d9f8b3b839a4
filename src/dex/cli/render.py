"""What the ``dex`` commands print for people: times in local ISO-8601, tables, and the
waits a person must act on."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
AGO = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def console(stderr: bool = False) -> Console:
    """A console that never cuts a table short when the output is not a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(file=stream, width=None if stream.isatty() else 1_000, highlight=False)


def local_time(unix: float | None) -> str:
    """A Unix time as local ISO-8601 (``2026-05-01T14:03:12+02:00``); empty for None."""
    if unix is None:
        return ""
    return datetime.fromtimestamp(unix).astimezone().isoformat(timespec="seconds")


def parse_time(value: str, now: float | None = None) -> float:
    """A moment a person typed, as Unix seconds: ISO-8601 (local time unless it names its
    zone: ``2026-05-01``, ``2026-05-01T14:00``, ``...Z``), a time ago (``30m``, ``2h``,
    ``7d``), or Unix seconds."""
    ago = AGO.fullmatch(value.strip())
    if ago:
        return (time.time() if now is None else now) - float(ago[1]) * UNITS[ago[2]]
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{value!r} is not a time: give ISO-8601 (2026-05-01T14:00), a time ago (30m, 2h, "
            "7d) or Unix seconds"
        ) from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # a person's time is local
    return moment.timestamp()


def table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    out = Table(*columns, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    for row in rows:
        out.add_row(*row)
    return out


def sessions_table(sessions: list[dict[str, Any]]) -> Table:
    """The sessions, one a row; a TENANT column when some session has a tenant."""
    tenants = any(s.get("tenant") for s in sessions)
    tenant = ["TENANT"] if tenants else []
    return table(
        [
            "ID",
            "AGENT",
            *tenant,
            "STATUS",
            "CREATED",
            "UPDATED",
            "WAITING SINCE",
            "UNKNOWN",
            "USAGE",
        ],
        [
            [
                s["id"],
                s["agent"],
                *([s.get("tenant") or ""] if tenants else []),
                s["status"],
                local_time(s["created_at"]),
                local_time(s["updated_at"]),
                local_time(s["waiting_since"]),
                str(s["outcome_unknown"] or ""),
                usage_text(s.get("usage")),
            ]
            for s in sessions
        ],
    )


def usage_text(usage: dict[str, Any] | None) -> str:
    """``1,234 tokens $0.0123``: what a session's model calls used; empty for none."""
    if not usage:
        return ""
    tokens = int(usage["input_tokens"]) + int(usage["output_tokens"])
    if not tokens and not usage["cost_usd"]:
        return ""
    return f"{tokens:,} tokens ${usage['cost_usd']:.4f}"


def budget_text(budget: dict[str, Any] | None) -> str:
    """``20,000 tokens, $1``: a session's budget; ``no budget`` for none."""
    if not budget:
        return "no budget"
    limits = []
    if budget.get("max_tokens") is not None:
        limits.append(f"{budget['max_tokens']:,} tokens")
    if budget.get("max_cost_usd") is not None:
        limits.append(f"${budget['max_cost_usd']:g}")
    return ", ".join(limits)


def tenant_budget_text(budget: dict[str, Any] | None) -> str:
    """``10,000 tokens a day, $5 a month``: a tenant's budget; ``no budget`` for none."""
    if not budget:
        return "no budget"
    limits = []
    for period in ("day", "month"):
        tokens, cost = (
            budget.get(f"max_tokens_per_{period}"),
            budget.get(f"max_cost_usd_per_{period}"),
        )
        if tokens is not None:
            limits.append(f"{tokens:,} tokens a {period}")
        if cost is not None:
            limits.append(f"${cost:g} a {period}")
    return ", ".join(limits)


def tenant_line(tenant: dict[str, Any]) -> str:
    """A tenant in one line: its budget, what it used today and this month (UTC), and how
    its budget is used up, if it is."""
    used = [
        f"{period} {u['tokens']:,} tokens ${u['cost_usd']:.4f}"
        for period, u in (("today", tenant["today"]), ("this month", tenant["this_month"]))
    ]
    line = f"{tenant['tenant']}  {tenant_budget_text(tenant['budget'])}  {'  '.join(used)}"
    return f"{line}  used up: {tenant['reached']}" if tenant.get("reached") else line


def tenant_raise_text(tenant: str) -> str:
    """The admin's command that raises a tenant's budget, with its other choices."""
    return (
        f"dex tenants budget {tenant} --max-tokens-per-day N (or --max-cost-usd-per-day, "
        "--max-tokens-per-month, --max-cost-usd-per-month, or --remove; an admin's command)"
    )


def call_text(wait: dict[str, Any]) -> str:
    """A tool call as a person reads it: ``charge(amount=5)``."""
    args = ", ".join(f"{k}={json.dumps(v)}" for k, v in wait["arguments"].items())
    return f"{wait['tool']}({args})"


def wait_text(wait: dict[str, Any]) -> str:
    """What a wait asks of a person, in a few words."""
    if wait["kind"] == "approval":
        return f"approve {call_text(wait)}"
    if wait["kind"] == "budget":
        return f"a bigger budget: {wait.get('reason') or budget_text(wait.get('budget'))}"
    choices = f" [{'/'.join(wait['choices'])}]" if wait.get("choices") else ""
    return f"answer {wait['question']}{choices} (asked by {call_text(wait)})"


def inbox_table(items: list[dict[str, Any]]) -> Table:
    return table(
        ["SESSION", "CALL", "WAITS FOR", "SINCE"],
        [
            [i["session_id"], i["call_id"] or "-", wait_text(i), local_time(i["since"])]
            for i in items
        ],
    )


def how_to_act(wait: dict[str, Any]) -> str:
    """The commands that end a wait."""
    sid, call = wait["session_id"], wait["call_id"]
    if wait["kind"] == "budget" and wait.get("tenant"):
        return f"{tenant_raise_text(wait['tenant'])}   (or: dex cancel {sid})"
    if wait["kind"] == "budget":
        return (
            f"dex budget {sid} --max-tokens N | --max-cost-usd USD   (or: dex budget {sid} "
            f"--remove, or dex cancel {sid})"
        )
    if wait["kind"] == "approval":
        return f"dex approve {sid} {call}   (or: dex deny {sid} {call} REASON)"
    return f"dex answer {sid} {call} ANSWER"


def clip(text: str, width: int = 100) -> str:
    """``text`` on one line, cut to ``width`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def _took(start: float | None, end: float | None) -> str:
    return f"{end - start:.2f}s" if start is not None and end is not None else ""


def session_summary(session: dict[str, Any]) -> list[str]:
    """A created or forked session, and what to do next."""
    sid = session["id"]
    tenant = f" of tenant {session['tenant']}" if session.get("tenant") else ""
    lines = [f"session {sid}{tenant} with agent {session['agent']}: {session['status']}"]
    forked = session.get("forked_from")
    if forked:
        lines.append(f"  forked from {forked['session_id']} before turn {forked['turn']}")
    lines.append(f"send it a message: dex send {sid} TEXT")
    return lines


def tool_call_line(call: dict[str, Any]) -> str:
    """``1.2 charge(amount=5)  succeeded: "ch_1"``: a call, its status and outcome."""
    head = f"{call['id']} {call_text({'tool': call['name'], 'arguments': call['arguments']})}"
    status = call["status"]
    if call.get("reconciled"):
        status += f" (reconciled by {call['reconciled'].get('by') or 'a person'})"
    if call["status"] == "succeeded":
        outcome = json.dumps(call["result"])
    else:
        outcome = call.get("error") or ""
    return clip(f"{head}  {status}{': ' + outcome if outcome else ''}", 160)


def sent_line(sent: dict[str, Any]) -> str:
    """What a sent message did (``outcome``, docs/mid-turn.md), in words."""
    number = sent["turn"]
    return {
        "started": f"the message started turn {number}",
        "queued": f"the message is queued: turn {number} starts when the running turn ends",
        "interrupted": f"turn {sent.get('interrupted')} was interrupted (cancelled): "
        f"the message started turn {number}",
        "steered": f"the message was steered into turn {number}: its next model call sees it",
    }.get(sent.get("outcome", ""), f"the message is turn {number}")


def turn_summary(turn: dict[str, Any], hint: bool = True) -> list[str]:
    """A turn in a few lines: its status, its tool calls and outcomes, its text or error;
    with ``hint``, the command that shows its Steps."""
    sid, number = turn["session_id"], turn["turn"]
    took = _took(turn.get("started_at"), turn.get("ended_at"))
    lines = [f"turn {number} {turn['status']}{' in ' + took if took else ''}"]
    for call in turn.get("tool_calls", []):
        lines.append("  " + tool_call_line(call))
        if call["status"] == "outcome_unknown" and not call.get("checking"):
            reconcile = f"dex reconcile {sid} {call['id']} --status succeeded|failed"
            lines.append(f"    reconcile: {reconcile}")
    if turn.get("text"):
        lines.append(f"text: {turn['text']}")
    if turn.get("error"):
        lines.append(f"error: {turn['error']}")
    if hint and (turn.get("steps") or turn["status"] == "running"):
        lines.append(f"its Steps and attempts: dex turn {sid} {number}")
    return lines


def steps_table(turn: dict[str, Any]) -> Table:
    """One row per attempt of each Step (a Step that made none has one row)."""
    calls = {c["id"]: c for c in turn.get("tool_calls", [])}
    rows = []
    for step in turn.get("steps", []):
        call = calls.get(step.get("tool_call_id") or "")
        what = ""
        if call is not None:
            what = clip(f"{call['id']} {call['name']}({_args(call['arguments'])})", 60)
        head = [step["id"], step["type"], step["status"], what]
        note = _step_note(step)
        attempts = step.get("attempts") or []
        if not attempts:
            rows.append([*head, "", "", "", "", note])
        for i, attempt in enumerate(attempts):
            error = attempt.get("error") or {}
            outcome = attempt["outcome"]
            if error.get("attempt_progress") not in (None, "UNSPECIFIED"):
                outcome += f" {error['attempt_progress']}"
            last = i == len(attempts) - 1
            detail = clip(error.get("message") or "", 240) or (note if last else "")
            rows.append(
                [
                    *(head if i == 0 else ["", "", "", ""]),
                    str(attempt["number"]),
                    outcome,
                    attempt.get("worker_id") or "",
                    _took(attempt.get("started_at"), attempt.get("ended_at")),
                    detail,
                ]
            )
    return table(
        ["STEP", "TYPE", "STATUS", "TOOL CALL", "ATTEMPT", "OUTCOME", "WORKER", "TOOK", "ERROR"],
        rows,
    )


def _args(arguments: dict[str, Any]) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in arguments.items())


def _step_note(step: dict[str, Any]) -> str:
    """What a Step without an attempt error says: its own error, or how its wait ended."""
    if step.get("error"):
        return clip(step["error"].get("message") or "", 240)
    wait = step.get("wait")
    if wait and wait.get("resolution"):
        resolution = wait["resolution"]
        who = f" by {resolution['by']}" if resolution.get("by") else ""
        return clip(f"{resolution.get('kind', 'resolved')}{who}", 80)
    return ""


def approvals_table(approvals: list[dict[str, Any]]) -> Table:
    return table(
        ["CALL", "TOOL CALL", "SINCE", "ARGUMENTS HASH"],
        [
            [
                a["call_id"],
                call_text(a),
                local_time(a["since"]),
                a["arguments_hash"],
            ]
            for a in approvals
        ],
    )
