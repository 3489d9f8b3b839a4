"""The conversation a session page shows: its history read together with its turns' records.

The history says what was said, in order (user messages, the agent's replies with the
tool calls they asked for, tool results, notes, summaries). The turns' records say what
became of each tool call (its status and result, who approved or denied it, who
reconciled it) and what its waits were (an approval, a question and its answer, a
timer), with who acted: ``call.approval`` and each wait Step's ``wait.resolution`` keep
the ``by`` the action was recorded with. A pure function of plain data (the snapshot's
history, the turns as ``views.plain`` gives them): no I/O, tested without a server.

The k-th tool call that a turn's replies ask for is the turn's k-th tool call record:
``complete_model`` makes one record per asked call, in order, so the two are matched by
position within their turn (a model's own call ids may repeat from one reply to the
next). A tool result whose call is shown with its record is not repeated.

``live`` tells the page's script which streamed text is not live any more, so that the
page shows the text of the model attempt that runs now only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dex.server.views import TERMINAL_STEP, attempt_id
from dex.wire import StepType

WAITS = {"AwaitToolApproval": "approval", "AwaitQuestionAnswer": "question", "AwaitTimer": "timer"}
"""The Step types that wait on a tool call's behalf, as the page names them."""


def shown(turns: list[dict[str, Any]], session_status: str) -> list[dict[str, Any]]:
    """The turns (plain, oldest first) with the running one's status read as the
    session's: ``waiting`` while it waits for a person, as the session's badge says."""
    if turns and turns[-1]["ended_at"] is None:
        turns[-1]["status"] = session_status
    return turns


def conversation(
    history: list[dict[str, Any]],
    turns: list[dict[str, Any]],
    queued: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The page's entries, oldest first. Each has a ``kind``: ``user`` (with its ``turn``
    and the turn's ``status``), ``assistant`` (``text`` and ``calls``: each tool call's
    record with its ``waits``), ``tool_result`` (a result with no record to show it),
    ``note``, ``summary``, ``turn_end`` (a turn that failed or was cancelled, and why)
    and ``queued`` (a message waiting for the running turn to end). ``turns``: as
    ``shown`` gives them."""
    starts = {t["history_start"]: t for t in turns}
    ends = _last_items(sorted(starts), len(history))
    calls = {t["number"]: iter(t["tool_calls"]) for t in turns}
    steps = {t["number"]: t["steps"] for t in turns}
    pending: set[tuple[int, str]] = set()
    entries: list[dict[str, Any]] = []
    turn: dict[str, Any] | None = None
    for index, item in enumerate(history):
        turn = starts.get(index, turn)
        number = turn["number"] if turn is not None else 0
        kind = item["type"]
        if kind == "user":
            entries.append(_user(index, item, turn))
        elif kind == "assistant":
            shown = []
            for asked in item.get("tool_calls", []):
                record = next(calls.get(number, iter(())), None)
                if record is None:  # no record of it (none should lack one): as asked
                    shown.append({"name": asked["name"], "arguments": asked["arguments"]})
                    continue
                pending.add((number, asked["id"]))
                shown.append({**record, "waits": _waits(record["id"], steps[number])})
            text = item.get("text", "")
            entries.append({"kind": "assistant", "index": index, "text": text, "calls": shown})
        elif kind == "tool_result":
            if (number, item["call_id"]) in pending:
                pending.discard((number, item["call_id"]))
                continue  # its call shows it, with what became of it since
            entries.append({**item, "kind": "tool_result", "index": index})
        else:  # note, summary
            entries.append({"kind": kind, "index": index, "text": item["text"]})
        if turn is not None and ends.get(turn["history_start"]) == index:
            entries.extend(_ending(turn))
    entries.extend({**message, "kind": "queued"} for message in queued or [])
    return entries


def _user(index: int, item: dict[str, Any], turn: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "kind": "user",
        "index": index,
        "text": item["text"],
        "turn": turn["number"] if turn is not None else None,
        "status": turn["status"] if turn is not None else None,
        "at": turn["started_at"] if turn is not None else None,
    }


def _last_items(starts: list[int], length: int) -> dict[int, int]:
    """For each turn (by the index of its user message), the index of its last item: the
    one before the next turn's user message, or the history's last."""
    return {start: end - 1 for start, end in zip(starts, [*starts[1:], length], strict=False)}


def _ending(turn: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if turn["status"] in ("failed", "cancelled"):
        yield {
            "kind": "turn_end",
            "turn": turn["number"],
            "status": turn["status"],
            "error": turn.get("error"),
        }


def _waits(call_id: str, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The waits of one tool call, in order: what each waited for, and how it ended."""
    found = []
    for step in steps:
        kind = WAITS.get(step["type"])
        if kind is None or step.get("tool_call_id") != call_id:
            continue
        wait = step.get("wait") or {}
        resolution = wait.get("resolution") or {}
        found.append(
            {
                "kind": kind,
                "step_id": step["id"],
                "since": wait.get("since", step["created_at"]),
                "question": wait.get("question"),
                "choices": wait.get("choices"),
                "deadline": wait.get("deadline"),
                "open": step["status"] == "waiting" and not resolution,
                "ended": resolution.get("kind"),
                "answer": resolution.get("answer"),
                "reason": resolution.get("reason"),
                "by": resolution.get("by"),
            }
        )
    return found


LIVE_STEPS = (StepType.RUN_MODEL, StepType.COMPACT_CONTEXT)
"""The Steps whose attempts stream text."""


def live(session: dict[str, Any], current: dict[str, Any] | None) -> dict[str, Any]:
    """What the page needs to show the streamed text of the model attempt that runs now
    only: the event stream replays what the node still buffers, earlier turns' text and
    ended attempts' included, and their text is in the conversation already (or void).
    A delta is live unless its turn is before ``turn``, its Step has ended, or its attempt
    has; an attempt that starts after the page was rendered is live."""
    if current is None:
        return {"turn": session["messages_received"] + 1, "ended_steps": [], "ended": []}
    steps = [s for s in current["steps"] if s["type"] in LIVE_STEPS]
    return {
        "turn": current["number"],
        "ended_steps": [s["id"] for s in steps if s["status"] in TERMINAL_STEP],
        "ended": [
            attempt_id(session["id"], s["id"], a["number"])
            for s in steps
            for a in s["attempts"]
            if a["outcome"] != "running"
        ],
    }
