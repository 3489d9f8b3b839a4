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
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

WAITS = {"AwaitToolApproval": "approval", "AwaitQuestionAnswer": "question", "AwaitTimer": "timer"}
"""The Step types that wait on a tool call's behalf, as the page names them."""


def conversation(
    history: list[dict[str, Any]],
    turns: list[dict[str, Any]],
    queued: list[dict[str, Any]] | None = None,
    *,
    current_status: str | None = None,
) -> list[dict[str, Any]]:
    """The page's entries, oldest first. Each has a ``kind``: ``user`` (with its ``turn``
    and the turn's ``status``), ``assistant`` (``text`` and ``calls``: each tool call's
    record with its ``waits``), ``tool_result`` (a result with no record to show it),
    ``note``, ``summary``, ``turn_end`` (a turn that failed or was cancelled, and why)
    and ``queued`` (a message waiting for the running turn to end).
    ``current_status``: the session's status (``running`` or ``waiting``), shown as the
    status of the turn that runs, so that a turn waiting for a person reads waiting."""
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
            entries.append(_user(index, item, turn, current_status))
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


def _user(
    index: int, item: dict[str, Any], turn: dict[str, Any] | None, current_status: str | None
) -> dict[str, Any]:
    status = turn["status"] if turn is not None else None
    if turn is not None and turn["ended_at"] is None and current_status:
        status = current_status
    return {
        "kind": "user",
        "index": index,
        "text": item["text"],
        "turn": turn["number"] if turn is not None else None,
        "status": status,
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
