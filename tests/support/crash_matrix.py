"""The seed's crash matrix, and the page ``docs/crash-matrix.md`` generated from the tests.

Each crash test carries ``@pytest.mark.crash(ROW, COLUMN)``; a cell names the files
of the tests that carry its mark, or reads "Not tested". Write the page with

    .venv/bin/pytest --collect-only -q tests/crash --write-crash-matrix docs/crash-matrix.md

and ``tests/unit/test_crash_matrix_page.py`` fails when the committed page is stale.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

COLUMNS = ("Worker kill", "Server restart", "Takeover")

# key: (Step, Interrupted, What happens) — the seed's rows, in the seed's order.
ROWS: dict[str, tuple[str, str, str]] = {
    "run_model.before_output": (
        "RunModel",
        "Before any output reaches Dex",
        "That model call runs again, up to 3 attempts within 30 minutes. Then the turn fails. "
        "If tools already ran, a note in the history tells the next turn's model not to "
        "repeat them.",
    ),
    "run_model.after_output": ("RunModel", "After output reached Dex", "The same."),
    "idempotent_write.before_heartbeat": (
        "CallTool, for an idempotent write",
        "Before the first heartbeat reaches Dex",
        "The call runs again with the same idempotency key.",
    ),
    "idempotent_write.running": (
        "CallTool, for an idempotent write",
        "While the tool runs",
        "The same.",
    ),
    "read.running": ("CallTool, for a read", "While the tool runs", "The call runs again."),
    "call_tool.every_attempt": (
        "CallTool",
        "Every attempt",
        "After the last attempt, a read records failed and a write records outcome_unknown.",
    ),
    "single_attempt.before_heartbeat": (
        "CallSingleAttemptTool",
        "Before the first heartbeat reaches Dex",
        "The call records outcome_unknown and does not run again. The model sees that the "
        "outcome is unknown.",
    ),
    "single_attempt.running": ("CallSingleAttemptTool", "While the tool runs", "The same."),
    "await_tool_approval.waiting": (
        "AwaitToolApproval",
        "While it waits",
        "Nothing runs again. The wait lives in Dex Server. A later approval runs the tool once.",
    ),
    "await_question_answer.waiting": (
        "AwaitQuestionAnswer",
        "While it waits",
        "Nothing runs again. A later answer resumes the turn.",
    ),
    "await_timer.waiting": (
        "AwaitTimer",
        "While it waits",
        "Nothing runs again. The Timer fires once. A Timer that came due during an outage "
        "fires when Dex Server is back.",
    ),
    "poll_tool_task.between_polls": (
        "PollToolTask",
        "Between two polls",
        "Polling goes on with the same task. No second task starts.",
    ),
    "poll_tool_task.during_poll": (
        "PollToolTask",
        "During a poll",
        "The poll runs again. No second task starts.",
    ),
    "compact_context.during_summary": (
        "CompactContext",
        "During the summary call",
        "Only the summary call runs again, up to 3 attempts within 30 minutes. The session "
        "stores one summary. If every attempt fails, the turn fails, and the next user "
        "message compacts again.",
    ),
    "idle.waiting_for_message": (
        "A wait for a user message",
        "While the session is idle",
        "Nothing runs again. The next message starts a turn.",
    ),
    "any_step.queued": (
        "Any Step",
        "Queued, before Dex hands it to a Worker",
        "The Step stays in the queue and uses no attempt. It runs as attempt 1 when a Worker "
        "takes it.",
    ),
    "read_poll_compact.before_heartbeat": (
        "CallTool for a read, PollToolTask, CompactContext",
        "Before the first heartbeat reaches Dex",
        "By design, the same as the rows above for that Step.",
    ),
    "wait_handler.running": (
        "AwaitToolApproval, AwaitQuestionAnswer, AwaitTimer",
        "After the wait ended, while the handler that moves the turn on runs",
        "By design, the handler runs again. The resolved approval, answer, or Timer stays "
        "recorded.",
    ),
    "any_step.result_sent": (
        "Any Step",
        "After the Worker sent the result, before Dex committed it",
        "By design, Dex either commits the result or fails the attempt. A failed attempt "
        "follows the row for that Step.",
    ),
    "framework_tool.running": (
        "A tool the framework cannot defer",
        "While it runs",
        "The tool runs inside RunModel and repeats when RunModel runs again. It is at-least-once.",
    ),
    "claude_agent_sdk.segment": (
        "A Claude Agent SDK turn segment",
        "While it runs",
        "Deferred custom tools run in their own CallTool or CallSingleAttemptTool Steps, as "
        "above. Model calls, inline read tools, and CLI tools such as Bash, Write, Edit, and "
        "Task run inside RunModel and repeat when it runs again. They are at-least-once.",
    ),
}

H = "dex.server.engine.handlers."
S = "dex.server.sessions.Sessions."
A = "dex.server.attempts.Attempts."
DECIDED_BY: dict[str, tuple[str, ...]] = {
    "run_model.before_output": (H + "fail_attempt", H + "recover", H + "_failed_turn_note"),
    "run_model.after_output": (H + "fail_attempt", H + "recover"),
    "idempotent_write.before_heartbeat": (H + "fail_attempt", H + "complete_model"),
    "idempotent_write.running": (H + "fail_attempt", H + "complete_model"),
    "read.running": (H + "fail_attempt",),
    "call_tool.every_attempt": (H + "_settle_failed_call",),
    "single_attempt.before_heartbeat": (H + "_queue_tool", H + "_settle_failed_call"),
    "single_attempt.running": (
        H + "_queue_tool",
        H + "_settle_failed_call",
        "dex.worker.worker.Worker._run_tool",
    ),
    "await_tool_approval.waiting": (H + "record_input", H + "apply_input"),
    "await_question_answer.waiting": (H + "record_input", H + "apply_input"),
    "await_timer.waiting": (S + "fire_timer", S + "start"),
    "poll_tool_task.between_polls": (H + "complete_tool", S + "start"),
    "poll_tool_task.during_poll": (H + "fail_attempt", H + "complete_tool"),
    "compact_context.during_summary": (H + "complete_summary", H + "fail_attempt"),
    "idle.waiting_for_message": (H + "receive_message",),
    "any_step.queued": (H + "assign", H + "hand_back", S + "start"),
    "read_poll_compact.before_heartbeat": (H + "fail_attempt",),
    "wait_handler.running": (S + "resolve", S + "_process_inbox", H + "apply_input"),
    "any_step.result_sent": (A + "complete", H + "recover"),
}
"""For each row, the functions whose code decides what happens (shown on the page; each
must exist, so a rename regenerates the page)."""


def decided_by(key: str) -> str:
    shown = []
    for dotted in DECIDED_BY.get(key, ()):
        _resolve(dotted)
        parts = dotted.split(".")
        shown.append(f"`{'.'.join(parts[-3:] if parts[-2][0].isupper() else parts[-2:])}`")
    return ", ".join(shown) or "—"


def _resolve(dotted: str) -> object:
    """The object a dotted path names; raises if it does not exist."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ImportError(dotted)


PROSE = """\
## What the page promises, in Dex's words

A crash repeats at most the one call that was running. For each Step above, and for
each of three failures, the cell names the test file that kills a real process at that
moment and checks the outcome against the tool's own ledger of side effects:

- **Worker kill**: the Worker gets SIGKILL and a new Worker starts.
- **Server restart**: the Dex Server node gets SIGKILL and restarts on its data
  directory; the Worker keeps running and reconnects by itself.
- **Takeover**: two nodes on one PostgreSQL database; the active node gets SIGKILL and
  the hot standby takes the lease, recovers and serves; the Worker and the client follow
  it by themselves (they know both addresses), and the killed node rejoins as the standby.

The Server restart cells are tested on SQLite and again on PostgreSQL (one node,
`--database postgresql://...`).

A cell names the Workers its test ran against: a test file followed by "(Workers:
Python, TypeScript, Go)" runs the same test, with the same assertions, against a Worker
written with the [TypeScript SDK](typescript-worker.md) and one written with the
[Go SDK](go-worker.md) too, each serving its port of the same test agents; a file
without the note runs against the Python Worker only. Every SDK cell runs the Worker
kill, the Server restart (on SQLite; the restart on PostgreSQL differs only on the
server's side, and runs against the Python Worker) and, in the rows that have it, the
Takeover.

"Not tested" means no test covers the cell yet, so its text states the design, not a
checked result. "Decided by" names the functions whose code decides the row (handlers
live in `src/dex/server/engine/handlers.py`, `Sessions` in `src/dex/server/sessions.py`,
`Attempts` in `src/dex/server/attempts.py`). The page is generated from the tests' `crash` marks; a unit test fails
when it is stale.

A running Worker survives both server failures: it reconnects, and the restarted node
has already failed every attempt that was handed out and not committed
(`NOT_COMPLETED`), so the row for that Step applies. The Worker's late result for such
an attempt is refused and dropped; its heartbeat is answered "stop", so the code still
running for it is cancelled. Live model output of the failed node is gone; the durable
history is not.

### A call that never ran

When a tool Step fails for good, the failure route reads `attempt_progress` from the
recovery error:

| attempt_progress | What the call records |
|---|---|
| `NOT_STARTED` | No attempt reached a Worker, so the tool did not run. The call records `failed`, and its error starts with `TOOL_CALL_NOT_RUN_ERROR_PREFIX` ("the tool did not run, so it is safe to call again"). |
| `NOT_COMPLETED`, or `UNSPECIFIED` | The tool may have run. A read records `failed`; any other call records `outcome_unknown` and the session never runs that call again. |

`NOT_COMPLETED` is conservative: a call whose attempt was recorded as handed out but
never reached the Worker (the node died in between) still records `outcome_unknown`.
See [failure-and-redelivery.md](failure-and-redelivery.md) and
[at-most-once.md](at-most-once.md).
"""


def render(marks: Iterable[tuple[str, str, str, str]]) -> str:
    """``marks``: (row key, column, test file, Worker language) for every crash-marked
    test. A file whose test of the cell runs against Workers of other SDKs too names them."""
    cells: dict[tuple[str, str], set[str]] = {}
    others: dict[tuple[str, str, str], set[str]] = {}
    for row, column, path, worker in marks:
        cells.setdefault((row, column), set()).add(path)
        if worker != "python":
            others.setdefault((row, column, path), set()).add(worker)
    lines = [
        "# Crash matrix",
        "",
        "Generated from the crash tests' marks by "
        "`.venv/bin/pytest --collect-only -q tests/crash --write-crash-matrix "
        "docs/crash-matrix.md`. Do not edit by hand.",
        "",
        "| Step | Interrupted | What happens | Decided by | " + " | ".join(COLUMNS) + " |",
        "|---|---|---|---|" + "---|" * len(COLUMNS),
    ]
    for key, (step, interrupted, what) in ROWS.items():
        tested = [
            ", ".join(
                f"`{p}`" + _workers(others.get((key, c, p), set()))
                for p in sorted(cells.get((key, c), ()))
            )
            or "Not tested"
            for c in COLUMNS
        ]
        lines.append(
            f"| {step} | {interrupted} | {what} | {decided_by(key)} | " + " | ".join(tested) + " |"
        )
    return "\n".join(lines) + "\n\n" + PROSE


def check_mark(row: str, column: str) -> None:
    if row not in ROWS:
        raise ValueError(f"crash mark names unknown row {row!r}; rows: {sorted(ROWS)}")
    if column not in COLUMNS:
        raise ValueError(f"crash mark names unknown column {column!r}; columns: {COLUMNS}")


LANGUAGES = {"typescript": "TypeScript", "go": "Go"}
"""The other Worker SDKs a crash test runs against, as the page names them."""


def _workers(others: set[str]) -> str:
    """The note after a test file that runs against other SDKs' Workers too, such as
    `` (Workers: Python, TypeScript, Go)``."""
    if not others:
        return ""
    names = ["Python"] + [LANGUAGES[o] for o in sorted(others, key=list(LANGUAGES).index)]
    return f" (Workers: {', '.join(names)})"
