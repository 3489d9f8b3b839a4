"""docs/crash-matrix.md is generated from the crash tests' marks: it must be current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent


def test_committed_crash_matrix_matches_the_tests(tmp_path: Path) -> None:
    fresh = tmp_path / "crash-matrix.md"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/crash",
            "--write-crash-matrix",
            str(fresh),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    committed = (ROOT / "docs" / "crash-matrix.md").read_text()
    assert committed == fresh.read_text(), (
        "docs/crash-matrix.md is stale: regenerate it with "
        "`.venv/bin/pytest --collect-only -q tests/crash --write-crash-matrix docs/crash-matrix.md`"
    )


def test_every_covered_cell_names_a_test_file() -> None:
    page = (ROOT / "docs" / "crash-matrix.md").read_text()
    row = next(
        line for line in page.splitlines() if line.startswith("| CallSingleAttemptTool | While")
    )
    assert "`tests/crash/test_single_attempt_tool.py`" in row
