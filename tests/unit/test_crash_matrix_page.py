"""docs/crash-matrix.md is written from the crash tests' results: it must match their
marks, and a marked case that did not pass must not read as tested."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.support import crash_matrix, skips
from tests.support.crash_matrix import (
    DECIDED_BY,
    REGENERATE,
    ROWS,
    Case,
    decided_by,
    did_not_pass,
    redecide,
    render,
)

ROOT = Path(__file__).parent.parent.parent


def _without(env: Mapping[str, str], *names: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in names}


def _pytest(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """pytest in a subprocess, with this repository importable (``tests.conftest``, and
    its own ``dex`` when that is not the installed one)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env={
            **_without(os.environ, skips.ENV, "CI"),
            "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}",
        },
        capture_output=True,
        text=True,
        check=False,
    )


def _row(page: str, start: str) -> list[str]:
    """The cells of the page's row that starts with ``start``."""
    line = next(line for line in page.splitlines() if line.startswith(start))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_committed_crash_matrix_lists_each_cell_as_the_crash_tests_mark_it(
    tmp_path: Path,
) -> None:
    """The page is the one ``render`` writes for the collected crash cases, each passed
    unless the page lists it as "did not pass": a mark added, moved or removed, or a row
    renamed, makes it stale. Whether the cases passed is checked by ``scripts/test``."""
    marks = tmp_path / "marks.json"
    done = _pytest("--collect-only", "-q", "tests/crash", "--list-crash-marks", str(marks))
    assert done.returncode == 0, done.stdout + done.stderr
    cells = [(r, c, p, w) for r, c, p, w in json.loads(marks.read_text())]
    assert len(cells) > 200  # every crash case, each with its cell
    committed = (ROOT / "docs" / "crash-matrix.md").read_text()
    failed = did_not_pass(committed)
    assert failed <= set(cells), f"the page lists cases that are not marked: {failed - set(cells)}"
    assert committed == render(Case(*cell, cell not in failed) for cell in cells), (
        "docs/crash-matrix.md does not match the crash tests' marks: regenerate it from a "
        f"run of every crash test with `{REGENERATE}`"
    )


def test_every_covered_cell_names_a_test_file() -> None:
    page = (ROOT / "docs" / "crash-matrix.md").read_text()
    row = _row(page, "| CallSingleAttemptTool | While")
    assert "`tests/crash/test_single_attempt_tool.py`" in row[-1]


def test_a_cell_reads_as_tested_for_a_worker_only_when_each_of_its_cases_passed() -> None:
    row, worker_kill, takeover = "read.running", "Worker kill", "Takeover"
    path, other = "tests/crash/test_call_tool.py", "tests/crash/test_other.py"
    page = render(
        [
            Case(row, worker_kill, path, "python", True),
            Case(row, worker_kill, path, "typescript", False),
            Case(row, worker_kill, path, "go", True),
            Case(row, takeover, path, "python", True),
            Case(row, takeover, other, "python", False),
        ]
    )
    cells = _row(page, "| CallTool, for a read |")
    assert cells[4] == f"`{path}` (Workers: Python, Go); did not pass: `{path}` (TypeScript)"
    assert cells[5] == "Not tested"
    assert cells[6] == f"Not tested; did not pass: `{other}` (Python)"
    assert did_not_pass(page) == {
        (row, worker_kill, path, "typescript"),
        (row, takeover, other, "python"),
    }


def test_the_page_is_written_from_results_a_skipped_and_a_failed_case_do_not_read_as_tested(
    tmp_path: Path,
) -> None:
    """A run of a tiny crash-marked selection: the passing case's cell names its file, the
    failing and the skipped cases' cells do not; ``--check-crash-matrix`` fails the run
    on the difference from a page where all passed."""
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_addoption, pytest_collection_finish, pytest_configure\n"
    )
    (tmp_path / "test_cells.py").write_text(
        "import pytest\n"
        "@pytest.mark.crash('read.running', 'Worker kill')\n"
        "def test_passes(): pass\n"
        "@pytest.mark.crash('read.running', 'Server restart')\n"
        "def test_fails(): assert False\n"
        "@pytest.mark.crash('read.running', 'Takeover')\n"
        "def test_skips(): pytest.skip('no PostgreSQL')\n"
    )
    written = tmp_path / "page.md"
    args = ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), "-q"]
    done = _pytest(*args, "test_cells.py", "--write-crash-matrix", str(written), cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    cells = _row(written.read_text(), "| CallTool, for a read |")
    assert cells[4:] == [
        "`test_cells.py`",
        "Not tested; did not pass: `test_cells.py` (Python)",
        "Not tested; did not pass: `test_cells.py` (Python)",
    ]

    all_passed = tmp_path / "all-passed.md"
    all_passed.write_text(
        render(
            Case("read.running", column, "test_cells.py", "python", True)
            for column in ("Worker kill", "Server restart", "Takeover")
        )
    )
    checked = _pytest(
        *args,
        *("test_cells.py", "-k", "passes or skips", "--check-crash-matrix", str(all_passed)),
        cwd=tmp_path,
    )
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "is not the page this run's crash results write" in checked.stdout
    assert "+| CallTool, for a read |" in checked.stdout


@pytest.mark.parametrize(
    ("named", "misnamed"),
    [
        ("dex.worker.runner.Runner.run_tool", "dex.worker.runner.Runner.run_tools"),
        (
            "sdk/typescript/src/runner.ts:Runner.runTool",
            "sdk/typescript/src/runner.ts:Runner.runTools",
        ),
        (
            "sdk/typescript/src/connection.ts:Connection.onMessage",
            "sdk/typescript/src/connection.ts:Connection.runTool",  # Runner's, not Connection's
        ),
        ("sdk/typescript/src/runner.ts:needsApproval", "sdk/typescript/src/runner.ts:runTool"),
        ("sdk/go/dex/runner.go:(*Worker).runTool", "sdk/go/dex/runner.go:(*Worker).runTools"),
        ("sdk/go/dex/runner.go:(*Worker).runTool", "sdk/go/dex/runner.go:(Worker).runTool"),
        ("sdk/go/dex/results.go:done", "sdk/go/dex/results.go:(*Worker).done"),
    ],
)
def test_the_page_names_only_functions_that_exist_in_each_worker_language(
    monkeypatch: pytest.MonkeyPatch, named: str, misnamed: str
) -> None:
    """A renamed or misspelled function in "Decided by", Python, TypeScript or Go, stops
    the page from being written."""
    row = DECIDED_BY["read.running"]
    monkeypatch.setitem(DECIDED_BY, "read.running", (*row, named))
    cells = _row(render([]), "| CallTool, for a read |")
    shown = named.rpartition("/")[2].replace(":", " ").removeprefix("dex.worker.")
    assert f"`{shown}`" in cells[3]

    monkeypatch.setitem(DECIDED_BY, "read.running", (*row, misnamed))
    with pytest.raises((ImportError, AttributeError, LookupError)):
        render([])


def test_a_call_is_not_taken_for_a_declaration(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "runner.ts").write_text(
        "export class Runner {\n"
        "  private run(): void {\n    this.runTool();\n  }\n"
        "}\n"
        "export class Other {\n  runTool(): void {}\n}\n"
    )
    (tmp_path / "runner.go").write_text(
        "package dex\n\n"
        "func (w *Worker) run() {\n\tw.runTool()\n}\n\n"
        "func (o *Other) runTool() {}\n"
    )
    monkeypatch.setattr(crash_matrix, "ROOT", tmp_path)
    monkeypatch.setitem(
        DECIDED_BY, "read.running", ("runner.ts:Runner.run", "runner.go:(*Worker).run")
    )
    assert decided_by("read.running") == (
        "TypeScript Worker: `runner.ts Runner.run`; Go Worker: `runner.go (*Worker).run`"
    )
    for misnamed in ("runner.ts:Runner.runTool", "runner.go:(*Worker).runTool"):
        monkeypatch.setitem(DECIDED_BY, "read.running", (misnamed,))
        with pytest.raises(LookupError):
            decided_by("read.running")


def test_a_row_that_names_a_workers_code_names_it_for_each_worker_language() -> None:
    """The rows whose tests run the Python, TypeScript and Go Workers name each one's
    port of the code that decides them, after the server's; a row of the Python Worker's
    only (MCP tools) names its code alone."""
    sdks = ("Python Worker: ", "TypeScript Worker: ", "Go Worker: ")
    named = {key for key in ROWS if any(sdk in decided_by(key) for sdk in sdks)}
    every = {"single_attempt.before_heartbeat", "single_attempt.running"}
    assert named == {*every, "mcp_write.running"}
    for key in named:
        cell = decided_by(key)
        assert cell.startswith("Server: `turn.queue_tool`")
        assert all(sdk in cell for sdk in sdks) == (key in every), key
        assert "Python Worker: " in cell
        assert "`attempts.Link.receive`" in cell  # the start acknowledgement, lease-checked


def test_redecide_writes_the_decided_by_column_and_keeps_every_result() -> None:
    path = "tests/crash/test_call_tool.py"
    page = render(
        [
            Case("read.running", "Worker kill", path, "python", True),
            Case("read.running", "Takeover", path, "go", False),
        ]
    )
    stale = page.replace("| `handlers.fail_attempt` |", "| `handlers.gone` |")
    stale = stale.replace("`Attempts` and `Link`", "`Attempts`")
    assert stale != page
    assert redecide(stale) == page
    committed = (ROOT / "docs" / "crash-matrix.md").read_text()
    assert redecide(committed) == committed
