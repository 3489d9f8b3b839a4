"""Do the crash tests catch a break in the code that decides a row of the crash matrix?

    scripts/mutations                      # every mutation, then the table
    scripts/mutations --only write-failure-route --only start-ack
    scripts/mutations --baseline           # also the selections on the unbroken copy

For each mutation, a small break in one of the functions that docs/crash-matrix.md's
"Decided by" column names, it copies the source tree (the files git tracks, as they are
in the working tree, under a temporary directory; the working tree is never touched),
applies the break there, and runs the crash tests that concern it against the copy (the
Python Worker's cells, ``pytest -n 2``). A mutation is caught when at least one of them
fails; one that no test notices marks a promise the tests do not hold. The table:

    mutation                 tests  failed  verdict
    write-failure-route          8       6  caught

A break's text must be found exactly once in its file: a mutation that no longer applies
(the code moved on) is reported as such, not as caught.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OTHER_WORKERS = {"typescript", "go"}
"""The words of a test id's parameters that name another SDK's Worker: those cells are left
out (``[worker-kill-go]``, ``[server-restart-typescript-timer]``); the Python cells are
enough, and the copy has no built TypeScript or Go Worker."""


@dataclass(frozen=True)
class Mutation:
    name: str
    promise: str
    """What the break breaks, in the crash matrix's words."""
    path: str
    before: str
    after: str
    tests: tuple[str, ...]
    """pytest selections (files, or node ids without their parameters)."""
    only: str = ""
    """Of the tests selected, run those whose id holds this text."""


MUTATIONS = (
    Mutation(
        "start-ack",
        "a single-attempt tool starts only once the node acknowledged the start "
        "(runner.Runner.run_tool)",
        "src/dex/worker/runner.py",
        "        if h.needs_start_ack or self.draining:\n",
        "        if self.draining:\n",
        ("tests/crash/test_single_attempt_tool.py",),
    ),
    Mutation(
        "key-stability",
        "a retried call keeps its idempotency key (handlers.fail_attempt)",
        "src/dex/server/engine/handlers.py",
        "            call.status = ToolCallStatus.PENDING\n        t.ready.append(step)\n",
        "            call.status = ToolCallStatus.PENDING\n"
        '            call.idempotency_key = f"{call.idempotency_key}/{used}"\n'
        "        t.ready.append(step)\n",
        (
            "tests/crash/test_call_tool.py::"
            "test_idempotent_write_interrupted_while_running_runs_again_with_same_key",
            "tests/crash/test_call_tool.py::"
            "test_idempotent_write_interrupted_before_first_heartbeat_runs_again_with_same_key",
        ),
    ),
    Mutation(
        "not-started-route",
        "only a call that never reached a Worker records failed as not run "
        "(outcomes.settle_failed_call, NOT_STARTED)",
        "src/dex/server/engine/outcomes.py",
        "    if not call.started and error.attempt_progress != AttemptProgress.NOT_COMPLETED:\n",
        "    if error.attempt_progress != AttemptProgress.NOT_STARTED:\n",
        (
            "tests/crash/test_single_attempt_tool.py",
            "tests/crash/test_call_tool.py::"
            "test_every_attempt_interrupted_read_fails_and_write_is_unknown",
        ),
    ),
    # Not ``fire_timer``'s check that the wait still waits: that check only saves a commit,
    # since recording the firing (``waits.record_input``) refuses a wait that ended, and
    # applying it (``waits.apply_input``) ignores one; breaking it alone changes nothing
    # a user sees (run once: no test failed, rightly). A node that comes back must arm its
    # waiting timers again, or a timer that came due while it was down never fires.
    Mutation(
        "timer-rearmed",
        "a timer that came due during an outage fires when the node is back "
        "(sessions.Sessions.start)",
        "src/dex/server/sessions.py",
        "                    self.dispatcher.arm_timer(session_id, step.id, step.wait.deadline)\n",
        "                    pass\n",
        ("tests/crash/test_waits.py",),
        only="timer",
    ),
    Mutation(
        "write-failure-route",
        "after its last attempt a write records outcome_unknown, not failed "
        "(outcomes.settle_failed_call)",
        "src/dex/server/engine/outcomes.py",
        "    elif call.kind == ToolKind.READ:\n",
        "    elif call.kind in (ToolKind.READ, ToolKind.WRITE, ToolKind.IDEMPOTENT_WRITE):\n",
        (
            "tests/crash/test_single_attempt_tool.py",
            "tests/crash/test_call_tool.py::"
            "test_every_attempt_interrupted_read_fails_and_write_is_unknown",
        ),
    ),
)


@dataclass(frozen=True)
class Outcome:
    name: str
    tests: int
    failed: int
    verdict: str
    failures: tuple[str, ...] = ()
    """The tests that failed, each with the first line of why."""


def copy_tree(into: Path) -> Path:
    """The files git tracks, as they are in the working tree (edits included)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    tree = into / "tree"
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            target = tree / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return tree


def mutate(tree: Path, mutation: Mutation) -> str | None:
    """Apply the break in the copy; why it cannot be, if it cannot."""
    path = tree / mutation.path
    text = path.read_text()
    found = text.count(mutation.before)
    if found != 1:
        return f"its text is in {mutation.path} {found} times, not once"
    path.write_text(text.replace(mutation.before, mutation.after))
    return None


def environment(tree: Path) -> dict[str, str]:
    """The copy's ``dex`` ahead of the one the virtualenv installed, for pytest and for
    the servers and Workers it starts (``python -m dex``)."""
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree}"}
    env.pop("DEX_FAILPOINTS", None)
    return env


def imports_the_copy(tree: Path) -> bool:
    """Whether ``dex`` imports from the copy in its environment (not from the working
    tree, which the virtualenv installed in editable mode)."""
    found = subprocess.run(
        [sys.executable, "-c", "import dex; print(dex.__file__)"],
        env=environment(tree),
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(found.stdout.strip()).is_relative_to(tree)


def python_cells(tree: Path, mutation: Mutation) -> list[str]:
    """The ids of the tests the mutation selects, without other SDKs' Worker cells."""
    selections = mutation.tests
    collected = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            *selections,
        ],
        cwd=tree,
        env=environment(tree),
        capture_output=True,
        text=True,
    )
    ids = [line for line in collected.stdout.splitlines() if "::" in line]
    if collected.returncode != 0 or not ids:
        raise RuntimeError(f"collecting {selections} failed:\n{collected.stdout[-3000:]}")
    kept = [i for i in ids if mutation.only in i and not OTHER_WORKERS & set(parameters(i))]
    if not kept:
        raise RuntimeError(f"{mutation.name} selects no test of the Python Worker")
    return kept


def parameters(test_id: str) -> list[str]:
    """The words of a test id's parameters: ``[server-restart-go-timer]`` gives
    ``server``, ``restart``, ``go``, ``timer``."""
    _, bracket, rest = test_id.partition("[")
    return rest.rstrip("]").split("-") if bracket else []


def run_tests(tree: Path, ids: list[str], jobs: int) -> tuple[int, list[str]]:
    """Run the tests in the copy: how many ran, and those that failed (with why)."""
    report = tree / "report.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            str(jobs),
            f"--junitxml={report}",
            *ids,
        ],
        cwd=tree,
        env=environment(tree),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None
    failed = []
    for case in suite.iter("testcase"):
        for problem in (*case.findall("failure"), *case.findall("error")):
            why = (problem.get("message") or "").strip().splitlines() or [""]
            failed.append(f"{case.get('name')}: {why[0][:160]}")
    return int(suite.get("tests", 0)) - int(suite.get("skipped", 0)), failed


def check(mutation: Mutation | None, chosen: list[Mutation], jobs: int) -> Outcome:
    """Run the mutation's tests on a broken copy; with no mutation, every chosen one's
    tests on an unbroken copy (the baseline)."""
    name = mutation.name if mutation else "none (baseline)"
    with tempfile.TemporaryDirectory(prefix="dex-mutation-") as tmp:
        tree = copy_tree(Path(tmp))
        if mutation is not None and (why := mutate(tree, mutation)) is not None:
            return Outcome(name, 0, 0, f"DOES NOT APPLY: {why}")
        if not imports_the_copy(tree):
            raise RuntimeError(f"dex does not import from the copy {tree}")
        if mutation is None:
            ids = list(dict.fromkeys(i for m in chosen for i in python_cells(tree, m)))
        else:
            ids = python_cells(tree, mutation)
        ran, failed = run_tests(tree, ids, jobs)
    if mutation is None:
        verdict = "all pass" if not failed else "FAILING WITHOUT A MUTATION"
    else:
        verdict = "caught" if failed else "NOT CAUGHT"
    return Outcome(name, ran, len(failed), verdict, tuple(failed))


def table(outcomes: list[Outcome]) -> str:
    width = max(len("mutation"), *(len(o.name) for o in outcomes))
    lines = [f"{'mutation':<{width}}  tests  failed  verdict"]
    lines += [f"{o.name:<{width}}  {o.tests:5}  {o.failed:6}  {o.verdict}" for o in outcomes]
    return "\n".join(lines)


def report(outcome: Outcome) -> None:
    """One mutation's row as soon as it is known, and the tests that failed."""
    print(table([outcome]).splitlines()[-1], flush=True)
    for failure in outcome.failures:
        print(f"    failed: {failure}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=[m.name for m in MUTATIONS])
    parser.add_argument("--baseline", action="store_true", help="run the selections unbroken")
    parser.add_argument("--jobs", type=int, default=2, help="pytest processes (-n)")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    outcomes = []
    if args.baseline:
        outcomes.append(check(None, chosen, args.jobs))
        report(outcomes[-1])
    for mutation in chosen:
        print(f"{mutation.name}: {mutation.promise}", flush=True)
        outcomes.append(check(mutation, chosen, args.jobs))
        report(outcomes[-1])
    print()
    print(table(outcomes))
    caught = all(o.verdict in ("caught", "all pass") for o in outcomes)
    return 0 if caught else 1


if __name__ == "__main__":
    raise SystemExit(main())
