"""The seed's crash matrix, and the page ``docs/crash-matrix.md`` written from a run of the
crash tests.

Each crash test carries ``@pytest.mark.crash(ROW, COLUMN)`` (and ``worker=`` for a
TypeScript or Go Worker). The page is written from the run's results, not from the
collection: for each Worker language, a cell names the test files of its cases only when
each of them passed in that run; a case that failed or skipped is listed as "did not
pass", one left out of the run is not on the page, and a cell without a passed case reads
"Not tested". Regenerate the page
with a run of every crash test (about 250 cases; ``-n 2`` runs them in two processes):

    .venv/bin/pytest -n 2 -p no:cacheprovider tests/crash --write-crash-matrix docs/crash-matrix.md

Two checks keep it honest: ``tests/unit/test_crash_matrix_page.py`` fails when the page is
not the one a run in which every marked case passed would write (a mark added, moved or
removed), and ``scripts/test`` runs the suite with ``--check-crash-matrix
docs/crash-matrix.md``, which fails the run when the page its results would write differs
from the committed one (a marked case that failed or skipped). ``render`` is the one place
that writes the page; ``CrashResults`` gathers the cases from the test reports (in
pytest-xdist's controller, which receives every report).

The "What happens" and "Decided by" columns come from ``ROWS`` and ``DECIDED_BY``, not from
results: after a change to them (or to ``PROSE``), ``python -m tests.support.crash_matrix
docs/crash-matrix.md`` writes those columns and the prose anew and keeps every result cell
(``redecide``), with no run.
"""

from __future__ import annotations

import difflib
import importlib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import pytest

COLUMNS = ("Worker kill", "Server restart", "Takeover")

# key: (Step, Interrupted, What happens) — the seed's rows, in the seed's order.
ROWS: dict[str, tuple[str, str, str]] = {
    "run_model.before_output": (
        "RunModel",
        "Before any output reaches Dex",
        "That model call runs again, up to 3 attempts within 30 minutes. Then the turn fails. "
        "If tools already ran, a note in the history tells the next turn's model not to "
        "repeat them. After a server restart or a takeover, a Worker that lives on reclaims "
        "the attempt: its result is kept and the call does not run again.",
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
        "The same; after a server restart or a takeover, a Worker that lives on reclaims the "
        "attempt, and the call runs once.",
    ),
    "read.running": (
        "CallTool, for a read",
        "While the tool runs",
        "The call runs again; after a server restart or a takeover, a Worker that lives on "
        "reclaims it, and it runs once.",
    ),
    "call_tool.every_attempt": (
        "CallTool",
        "Every attempt",
        "After the last attempt, a read records failed and a write records outcome_unknown.",
    ),
    "single_attempt.before_heartbeat": (
        "CallSingleAttemptTool",
        "Before the first heartbeat reaches Dex",
        "The call records outcome_unknown and does not run again. The model sees that the "
        "outcome is unknown. After a server restart or a takeover, a Worker that lives on "
        "reclaims the attempt: the call runs once and its result is kept.",
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
    "await_budget.waiting": (
        "AwaitBudget",
        "While it waits",
        "Nothing runs again. The wait lives in Dex Server. Once the budget (the session's, or "
        "its tenant's day or month) is raised above what was used (or removed, or a new day "
        "or month begins), the model call it waited for runs once.",
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
    "model_usage.result_sent": (
        "RunModel, its usage",
        "After the model answered, before Dex committed the result",
        "The call's tokens and cost count once, for its session and its tenant's day, in the "
        "commit of its result: a Worker that lives on reclaims the attempt and its result commits once; a Worker that dies has "
        "its result committed, or its attempt fails and the retry is a new call, counted "
        "when it commits. A call whose result never commits counts nothing (its provider "
        "may still bill it).",
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
    "limits.held": (
        "RunModel, or CallTool under a concurrency key",
        "Queued, held by a limit (docs/flow-control.md)",
        "The Step stays in the queue and uses no attempt. It runs once, as attempt 1, when "
        "the limit admits it; a limit set at run time is stored and holds after the failure.",
    ),
    "run_model.rate_limited": (
        "RunModel",
        "Refused by the provider for its rate limit (429 with Retry-After), queued again",
        "The refusal uses no attempt. The call runs again, as the same attempt, no sooner "
        "than the Retry-After, which the failure does not shorten.",
    ),
    "mcp_write.running": (
        "CallSingleAttemptTool, for an MCP tool without hints (a write)",
        "While the MCP server runs the call",
        "The call records outcome_unknown and is not sent again: the MCP server's own "
        "ledger shows one call. The model is offered the same tools after the crash.",
    ),
    "mcp_idempotent.running": (
        "CallTool, for an MCP tool with idempotentHint",
        "While the MCP server runs the call",
        "The call is sent again with the same idempotency key in its _meta "
        "(dex/idempotency_key). The model is offered the same tools after the crash.",
    ),
    "mid_turn.interrupt": (
        "A message that interrupts a running turn (on_busy interrupt, docs/mid-turn.md)",
        "Right after the send is acknowledged, while the interrupted turn's tool or model "
        "call runs",
        "The send's one commit cancelled the turn and started the message's: the old turn "
        "stays cancelled once (its running write records outcome_unknown and does not run "
        "again), and the new turn runs once. A send again with the same message_id answers "
        "the same outcome and applies nothing.",
    ),
    "mid_turn.steer": (
        "A message steered into a running turn (on_busy steer)",
        "Right after the send is acknowledged, while the turn's tool or model call runs",
        "The message is recorded with the turn: the call that ran follows its own row, and "
        "the message enters the history once, before the turn's next model call (after a "
        "model call's answer, the turn goes on to answer it); the turn completes once. A "
        "send again with the same message_id answers steered and adds nothing.",
    ),
}

E = "dex.server.engine."
H = E + "handlers."
S = "dex.server.sessions.Sessions."
A = "dex.server.attempts.Attempts."
LINK = "dex.server.attempts.Link."
PY = "dex.worker.runner.Runner."
MCP = "dex.mcp."
TS = "sdk/typescript/src/runner.ts:Runner."
GO = "sdk/go/dex/runner.go:(*Worker)."
D = "dex.server.dispatch.dispatcher.Dispatcher."
L = "dex.server.dispatch.limits.Limits."
RECLAIM = (S + "_recover", D + "await_reclaim", D + "connect", D + "claim")
"""A node that restarts or takes a partition over holds an attempt for its Worker to
reclaim; the Worker's hello (after a restart) or its claim (in a cluster) reclaims it
(``tests/crash/test_reclaim.py``)."""
SINGLE_ATTEMPT = (
    E + "turn.queue_tool",
    E + "outcomes.settle_failed_call",
    LINK + "receive",  # a heartbeat is answered only while the node holds its lease
    A + "heartbeat",  # "ok" only to the connection that holds the attempt
    PY + "run_tool",  # the tool's body starts only on a timely "ok"
    PY + "start_acknowledged",
    PY + "_on_reply",
    TS + "runTool",
    TS + "startAcknowledged",
    TS + "onMessage",
    GO + "runTool",
    GO + "startAcknowledged",
    GO + "heartbeatReply",
)
DECIDED_BY: dict[str, tuple[str, ...]] = {
    "run_model.before_output": (
        H + "fail_attempt",
        H + "recover",
        E + "outcomes.failed_turn_note",
        *RECLAIM,
    ),
    "run_model.after_output": (H + "fail_attempt", H + "recover"),
    "idempotent_write.before_heartbeat": (H + "fail_attempt", H + "complete_model"),
    "idempotent_write.running": (H + "fail_attempt", H + "complete_model", *RECLAIM),
    "read.running": (H + "fail_attempt", *RECLAIM),
    "call_tool.every_attempt": (E + "outcomes.settle_failed_call",),
    "single_attempt.before_heartbeat": (*SINGLE_ATTEMPT, *RECLAIM),
    "single_attempt.running": (*SINGLE_ATTEMPT, *RECLAIM),
    "await_tool_approval.waiting": (E + "waits.record_input", E + "waits.apply_input"),
    "await_question_answer.waiting": (E + "waits.record_input", E + "waits.apply_input"),
    # the firing is recorded once: record_input refuses a wait that ended
    "await_timer.waiting": (
        S + "fire_timer",
        E + "waits.record_input",
        E + "waits.apply_input",
        S + "start",
    ),
    "await_budget.waiting": (
        E + "turn.call_model",
        E + "turn.hold_for_tenant",
        H + "set_budget",
        H + "recheck_budget",
        "dex.server.flow.TenantBudgets.check",
    ),
    "poll_tool_task.between_polls": (H + "complete_tool", S + "start"),
    "poll_tool_task.during_poll": (H + "fail_attempt", H + "complete_tool"),
    "compact_context.during_summary": (H + "complete_summary", H + "fail_attempt"),
    "idle.waiting_for_message": (H + "receive_message",),
    "any_step.queued": (H + "assign", H + "hand_back", S + "start"),
    "read_poll_compact.before_heartbeat": (H + "fail_attempt",),
    "wait_handler.running": (
        S + "resolve",
        S + "_process_inbox",
        E + "waits.apply_input",
        S + "start",
    ),
    # the Worker channel gives each message to Link.receive: it refuses a result from a
    # connection that does not hold the attempt, and commits the others (Attempts.complete)
    "any_step.result_sent": (LINK + "receive", A + "complete", H + "recover"),
    "limits.held": (L + "admit", L + "park", D + "_pump", "dex.server.flow.ModelLimits.load"),
    "run_model.rate_limited": (A + "hand_back", H + "rate_limited", L + "refused"),
    "model_usage.result_sent": (
        H + "complete_model",
        E + "budget.record_usage",
        "dex.server.committer.Committer.commit",
        *RECLAIM,
    ),
    "mcp_write.running": (  # MCP tools are the Python Worker's only: no port to name
        *(name for name in SINGLE_ATTEMPT if not name.startswith((TS, GO))),
        MCP + "MCPTools._kind",
        MCP + "MCPTool.invoke",
    ),
    "mcp_idempotent.running": (
        H + "fail_attempt",
        H + "complete_model",
        MCP + "MCPTools._kind",
        MCP + "MCPTools.call",
    ),
    # one commit cancels the running turn and starts the message's; the message id is
    # remembered with what the send did in that same commit
    "mid_turn.interrupt": (
        H + "receive_message",
        H + "cancel_turn",
        E + "turn.end_turn",
        E + "outcomes.settle_failed_call",
        S + "send",
        "dex.server.committer._remembered",
    ),
    "mid_turn.steer": (
        H + "receive_message",
        E + "turn.steer",
        E + "turn.call_model",
        H + "complete_model",
        S + "send",
        "dex.server.committer._remembered",
    ),
}
"""For each row, the functions whose code decides what happens (shown on the page; each
must exist, so a rename regenerates the page): a dotted Python name (the server's, or the
Python Worker's ``dex.worker``), or ``FILE:NAME`` for the TypeScript and Go Workers' ports
(``sdk/typescript/src/runner.ts:Runner.runTool``, ``sdk/go/dex/runner.go:(*Worker).runTool``;
a function outside a class or without a receiver is ``FILE:name``)."""

ROOT = Path(__file__).resolve().parent.parent.parent

SOURCES = {".ts": "TypeScript", ".go": "Go"}
"""The Worker languages whose functions ``DECIDED_BY`` names as ``FILE:NAME``, by suffix."""

SIDES = ("Server", "Python", "TypeScript", "Go")
"""Whose code a name in ``DECIDED_BY`` is, in the order the page shows them."""


def _side(name: str) -> str:
    """``Server``, or the Worker language whose code ``name`` is."""
    path, colon, _ = name.partition(":")
    if colon:
        return SOURCES[Path(path).suffix]
    return "Python" if name.startswith("dex.worker.") else "Server"


def decided_by(key: str) -> str:
    """The row's "Decided by" cell: its server functions, and, when the row names some of
    the Workers' code, each side's after its name (``Python Worker: ...``)."""
    sides: dict[str, list[str]] = {}
    for name in DECIDED_BY.get(key, ()):
        _resolve(name)
        sides.setdefault(_side(name), []).append(f"`{_shown(name)}`")
    if not sides:
        return "—"
    if list(sides) == ["Server"]:
        return ", ".join(sides["Server"])
    return "; ".join(
        f"{side if side == 'Server' else side + ' Worker'}: {', '.join(sides[side])}"
        for side in SIDES
        if side in sides
    )


def _shown(name: str) -> str:
    """``handlers.fail_attempt``, ``attempts.Attempts.complete``, ``runner.ts Runner.runTool``."""
    path, colon, qualified = name.partition(":")
    if colon:
        return f"{Path(path).name} {qualified}"
    parts = name.split(".")
    return ".".join(parts[-3:] if parts[-2][0].isupper() else parts[-2:])


def _resolve(name: str) -> object:
    """What ``name`` names: a Python object, or the declaration's text in a TypeScript or
    Go source file; raises if it does not exist."""
    path, colon, qualified = name.partition(":")
    if not colon:
        return _resolve_python(name)
    if Path(path).suffix not in SOURCES:
        raise ValueError(f"{name}: a FILE:NAME is a TypeScript or Go function")
    source = (ROOT / path).read_text()
    found = (_go if path.endswith(".go") else _typescript)(source, qualified)
    if found is None:
        raise LookupError(f"{path} declares no {qualified}")
    return found


def _resolve_python(dotted: str) -> object:
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


_TS_MODIFIERS = r"(?:(?:public|private|protected|static|async|override|readonly)\s+)*"


def _typescript(source: str, qualified: str) -> str | None:
    """The declaration of ``Class.method`` (a method declared in the class's body, before
    the next class of the file) or of a function ``name``; None if there is none."""
    owner, dot, name = qualified.rpartition(".")
    if not dot:
        found = re.search(
            rf"^(?:export\s+)?(?:async\s+)?function\s*\*?\s*{re.escape(name)}\s*[<(]",
            source,
            re.M,
        )
        return found[0] if found else None
    declared = re.search(
        rf"^(?:export\s+)?(?:abstract\s+)?class\s+{re.escape(owner)}\b", source, re.M
    )
    if declared is None:
        return None
    body = source[declared.end() :]
    following = re.search(r"^(?:export\s+)?(?:abstract\s+)?class\s", body, re.M)
    if following is not None:
        body = body[: following.start()]
    # a method's declaration starts its line; a call inside the class reads ``this.name(``
    found = re.search(rf"^[ \t]+{_TS_MODIFIERS}{re.escape(name)}\s*(?:<[^>]*>)?\(", body, re.M)
    return found[0] if found else None


def _go(source: str, qualified: str) -> str | None:
    """The declaration of the method ``(*Type).name`` (or ``(Type).name``) or of the
    function ``name``; None if there is none."""
    receiver = re.fullmatch(r"\((\*?)(\w+)\)\.(\w+)", qualified)
    if receiver:
        pointer, type_, name = receiver.groups()
        pattern = rf"^func\s*\(\s*(?:\w+\s+)?{re.escape(pointer)}{type_}\s*\)\s*{name}\s*[\[(]"
    else:
        pattern = rf"^func\s+{re.escape(qualified)}\s*[\[(]"
    found = re.search(pattern, source, re.M)
    return found[0] if found else None


PROSE = """\
## What the page promises, in Dex's words

A crash repeats at most the one call that was running. For each Step above, and for
each of three failures, the cell names the test file that kills a real process at that
moment and checks the outcome against the tool's own ledger of side effects:

- **Worker kill**: the Worker gets SIGKILL and a new Worker starts.
- **Server restart**: the Dex Server node gets SIGKILL and restarts on its data
  directory. Two cases: the Worker is killed with it and a new one starts (the attempt
  fails, as the cell's row says); or the Worker lives through it, reconnects by itself
  and reclaims the attempt it runs (`tests/crash/test_reclaim.py`, for the tool rows and
  RunModel): its result is kept, and the call ran once.
- **Takeover**: three nodes sharing one PostgreSQL database's partitions
  ([cluster.md](cluster.md)); the node that owns the session's partition gets SIGKILL,
  the other two take its partitions over, and the one that took the session's recovers
  and serves it; the Worker (connected to every node) and the client (which any node
  answers) follow by themselves. The same two cases: the Worker is killed with the node
  (the attempt fails, as the row says), or it lives on and claims the attempt on its
  connection to the node that took the session over (`tests/crash/test_reclaim.py`).

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

A cell names a test file for a Worker language only when each of the cell's cases for
that language passed in the run that wrote the page, a run of every crash test; a case
that failed or was skipped is listed after "did not pass", and does not count. "Not
tested" means no case of the cell passed, so its text states the design, not a checked
result. "Decided by" names the functions whose code decides the row (`handlers`, `turn`,
`waits` and `outcomes` are modules of `src/dex/server/engine/`, `Sessions` is in
`src/dex/server/sessions.py`, `Attempts` and `Link` in `src/dex/server/attempts.py`;
the Worker channel gives each message a Worker sends to `Link.receive`). Where the
Workers' code decides too, the row names it for each Worker language after the server's:
the Python Worker's `runner` is `src/dex/worker/runner.py`, the TypeScript Worker's
`runner.ts` is in `sdk/typescript/src/` and the Go Worker's `runner.go` in `sdk/go/dex/`.

The page is written from the results of a run of every crash test (`pytest tests/crash
--write-crash-matrix docs/crash-matrix.md`). A unit test fails when the page does not
match the tests' `crash` marks, and `scripts/test`, whose run includes every crash test,
fails when the page its results would write differs from this one.

A running Worker survives both server failures. After a restart it reconnects and
reclaims the attempts it runs; after a takeover in a cluster it claims them on its
connection to the node that took their sessions over. Each waited the reclaim window
(3 s) for it, and runs on as if nothing happened (`tests/crash/test_reclaim.py`). An
attempt not reclaimed in time fails (`NOT_COMPLETED`) and the row for that Step
applies. The Worker's late
result for a failed attempt is refused and dropped; its heartbeat is answered "stop", so
the code still running for it is cancelled. Live model output of the failed node is
gone; the durable history is not.

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


REGENERATE = (
    ".venv/bin/pytest -n 2 -p no:cacheprovider tests/crash "
    "--write-crash-matrix docs/crash-matrix.md"
)
"""The command that writes the page from a run of every crash test."""


class Case(NamedTuple):
    """One crash test case's cell, and whether it passed in the run."""

    row: str
    column: str
    path: str
    worker: str
    passed: bool


def render(cases: Iterable[Case]) -> str:
    """The page for a run's crash cases. For each Worker language, a cell reads as tested
    only when each of its cases for that language passed: it names their test files (a
    file whose cases ran against other SDKs' Workers too names them). A case that did not
    pass is named under "did not pass", with its Worker languages."""
    marked: dict[tuple[str, str], dict[tuple[str, str], bool]] = {}
    for case in cases:
        runs = marked.setdefault((case.row, case.column), {})
        run = (case.path, case.worker)
        runs[run] = runs.get(run, True) and case.passed
    lines = [
        "# Crash matrix",
        "",
        f"Written from the results of a run of every crash test by `{REGENERATE}`: "
        "a cell names a test file for a Worker language only when each of the cell's cases "
        "for that language passed in that run. `scripts/test` compares this page with the "
        "one its own run would write, and fails on a difference. Do not edit by hand.",
        "",
        "| Step | Interrupted | What happens | Decided by | " + " | ".join(COLUMNS) + " |",
        "|---|---|---|---|" + "---|" * len(COLUMNS),
    ]
    for key, (step, interrupted, what) in ROWS.items():
        cells = [_cell(marked.get((key, c), {})) for c in COLUMNS]
        lines.append(
            f"| {step} | {interrupted} | {what} | {decided_by(key)} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines) + "\n\n" + PROSE


def redecide(page: str) -> str:
    """``page`` with the "What happens" and "Decided by" columns and the prose after the
    table written anew from ``ROWS``, ``DECIDED_BY`` and ``PROSE``, every other cell as it
    was: what a run of every crash test would write when its cases pass as they did in the
    run that wrote ``page`` (``python -m tests.support.crash_matrix docs/crash-matrix.md``). Raises if a row of
    ``ROWS`` is not on the page: that takes a run."""
    table, heading, _ = page.partition(PROSE.splitlines()[0])
    if not heading:
        raise ValueError("the page has no prose after its table")
    lines = table.splitlines()
    for key, (step, interrupted, what) in ROWS.items():
        start = f"| {step} | {interrupted} |"
        index = next((i for i, line in enumerate(lines) if line.startswith(start)), None)
        if index is None:
            raise ValueError(f"the page has no row {start}: write it from a run, {REGENERATE}")
        cells = [cell.strip() for cell in lines[index].strip("|").split("|")]
        cells[2] = what
        cells[3] = decided_by(key)
        lines[index] = "| " + " | ".join(cells) + " |"
    return "\n".join(lines).rstrip("\n") + "\n\n" + PROSE


def _cell(runs: dict[tuple[str, str], bool]) -> str:
    """``runs``: (test file, Worker language) -> whether each of those cases passed."""
    failed_workers = {worker for (_, worker), passed in runs.items() if not passed}
    tested: dict[str, set[str]] = {}
    failed: dict[str, set[str]] = {}
    for (path, worker), passed in runs.items():
        if not passed:
            failed.setdefault(path, set()).add(worker)
        elif worker not in failed_workers:
            tested.setdefault(path, set()).add(worker)
    text = ", ".join(f"`{p}`" + _workers(tested[p]) for p in sorted(tested)) or "Not tested"
    if failed:
        text += "; did not pass: " + ", ".join(
            f"`{p}` ({_names(failed[p])})" for p in sorted(failed)
        )
    return text


def check_mark(row: str, column: str) -> None:
    if row not in ROWS:
        raise ValueError(f"crash mark names unknown row {row!r}; rows: {sorted(ROWS)}")
    if column not in COLUMNS:
        raise ValueError(f"crash mark names unknown column {column!r}; columns: {COLUMNS}")


LANGUAGES = {"python": "Python", "typescript": "TypeScript", "go": "Go"}
"""The Worker SDKs a crash test runs against, as the page names them."""


def _names(workers: set[str]) -> str:
    return ", ".join(LANGUAGES[w] for w in sorted(workers, key=list(LANGUAGES).index))


def _workers(workers: set[str]) -> str:
    """The note after a test file whose cases ran against other SDKs' Workers, such as
    `` (Workers: Python, TypeScript, Go)``; none for the Python Worker alone."""
    return "" if workers == {"python"} else f" (Workers: {_names(workers)})"


def did_not_pass(page: str) -> set[tuple[str, str, str, str]]:
    """The (row key, column, test file, Worker language) that a page lists after "did not
    pass": with the marks, what ``render`` needs to write that page again."""
    found = set()
    names = {name: worker for worker, name in LANGUAGES.items()}
    for key, (step, interrupted, _) in ROWS.items():
        start = f"| {step} | {interrupted} |"
        line = next((line for line in page.splitlines() if line.startswith(start)), "")
        cells = [cell.strip() for cell in line.strip("|").split("|")][-len(COLUMNS) :]
        for column, cell in zip(COLUMNS, cells, strict=False):
            _, _, failed = cell.partition("; did not pass: ")
            for path, workers in re.findall(r"`([^`]+)` \(([^)]+)\)", failed):
                found |= {(key, column, path, names[n]) for n in workers.split(", ")}
    return found


PROPERTY = "crash_cell"
"""The name of the user property that carries a case's cell (row, column, test file,
Worker language) from the process that ran it into its reports."""


def mark_cells(items: Iterable[pytest.Item], root: Path) -> list[tuple[str, str, str, str]]:
    """Check every collected crash mark, and record its cell on the item (so that its
    reports carry it); returns the cells, one per marked case."""
    cells = []
    for item in items:
        for mark in item.iter_markers("crash"):
            row, column = mark.args
            check_mark(row, column)
            worker = str(mark.kwargs.get("worker", "python"))
            cell = (row, column, str(Path(item.path).relative_to(root)), worker)
            item.user_properties.append((PROPERTY, cell))
            cells.append(cell)
    return cells


def _cell_of(value: object) -> tuple[str, str, str, str]:
    """A cell from a report's user property (a list once pytest-xdist carried it)."""
    assert isinstance(value, tuple | list) and len(value) == 4, value
    row, column, path, worker = (str(v) for v in value)
    return row, column, path, worker


class CrashResults:
    """Gathers whether each crash case passed from its reports, then writes the page
    (``--write-crash-matrix``) or fails the session when the committed page differs from
    the one these results write (``--check-crash-matrix``)."""

    def __init__(self, write: str | None, check: str | None) -> None:
        self.write = write
        self.check = check
        self.cells: dict[str, set[tuple[str, str, str, str]]] = {}
        self.called: set[str] = set()
        """Cases whose test function passed."""
        self.spoiled: set[str] = set()
        """Cases with a report that failed or skipped (setup, call or teardown)."""
        self.difference: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        cells = {_cell_of(value) for name, value in report.user_properties if name == PROPERTY}
        if not cells:
            return
        self.cells.setdefault(report.nodeid, set()).update(cells)
        if report.failed or report.skipped:
            self.spoiled.add(report.nodeid)
        elif report.when == "call":
            self.called.add(report.nodeid)

    def page(self) -> str:
        return render(
            Case(row, column, path, worker, nodeid in self.called and nodeid not in self.spoiled)
            for nodeid, cells in self.cells.items()
            for row, column, path, worker in cells
        )

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        page = self.page()
        if self.write:
            Path(self.write).write_text(page)
        if self.check:
            committed = Path(self.check).read_text()
            self.difference = [
                line
                for line in difflib.unified_diff(
                    committed.splitlines(), page.splitlines(), self.check, "this run", n=0
                )
                if not line.startswith("@@")
            ]
            if self.difference and session.exitstatus in (pytest.ExitCode.OK, 0):
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.difference:
            return
        terminalreporter.section("crash matrix", sep="=", red=True, bold=True)
        terminalreporter.line(
            f"{self.check} is not the page this run's crash results write (a marked case "
            f"failed, skipped or did not run, or the page is stale: {REGENERATE}):",
            red=True,
        )
        for line in self.difference:
            terminalreporter.line(line)


if __name__ == "__main__":
    import sys

    for path in sys.argv[1:]:
        Path(path).write_text(redecide(Path(path).read_text()))
