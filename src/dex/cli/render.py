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
    return table(
        ["ID", "AGENT", "STATUS", "CREATED", "UPDATED", "WAITING SINCE", "UNKNOWN"],
        [
            [
                s["id"],
                s["agent"],
                s["status"],
                local_time(s["created_at"]),
                local_time(s["updated_at"]),
                local_time(s["waiting_since"]),
                str(s["outcome_unknown"] or ""),
            ]
            for s in sessions
        ],
    )


def call_text(wait: dict[str, Any]) -> str:
    """A tool call as a person reads it: ``charge(amount=5)``."""
    args = ", ".join(f"{k}={json.dumps(v)}" for k, v in wait["arguments"].items())
    return f"{wait['tool']}({args})"


def wait_text(wait: dict[str, Any]) -> str:
    """What a wait asks of a person, in a few words."""
    if wait["kind"] == "approval":
        return f"approve {call_text(wait)}"
    choices = f" [{'/'.join(wait['choices'])}]" if wait.get("choices") else ""
    return f"answer {wait['question']}{choices} (asked by {call_text(wait)})"


def inbox_table(items: list[dict[str, Any]]) -> Table:
    return table(
        ["SESSION", "CALL", "WAITS FOR", "SINCE"],
        [[i["session_id"], i["call_id"], wait_text(i), local_time(i["since"])] for i in items],
    )


def how_to_act(wait: dict[str, Any]) -> str:
    """The commands that end a wait."""
    sid, call = wait["session_id"], wait["call_id"]
    if wait["kind"] == "approval":
        return f"dex approve {sid} {call}   (or: dex deny {sid} {call} REASON)"
    return f"dex answer {sid} {call} ANSWER"
