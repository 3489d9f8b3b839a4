"""A skipped test fails the run, unless the allow-list below names it.

A service that cannot be reached (PostgreSQL, Redis, Chromium) makes the tests that need
it skip; counted as green, those skips would hide that the crash, failover, lease, stream
and browser tests never ran. With ``--fail-on-skip``, or ``DEX_FAIL_ON_SKIP=1``, or
``CI=true`` (``scripts/test`` sets ``DEX_FAIL_ON_SKIP``), every skip that ``ALLOWED`` does
not name fails the session: pytest's exit status is non-zero and the summary names each
unexpected skip with its reason. A developer running one file by hand gets the usual
skips unless they ask for the check.

The plugin reads test reports, so under pytest-xdist it works in the controller, which
receives every report.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import pytest

ENV = "DEX_FAIL_ON_SKIP"
OPTION = "--fail-on-skip"


@dataclass(frozen=True)
class Allowed:
    """A skip the run accepts: of ``test`` (a node id, or a node id without its
    ``[parameters]`` for all its cases), with a reason starting with ``reason``."""

    test: str
    reason: str
    why: str
    """Why the skip is acceptable, for the review of this list."""


ALLOWED: tuple[Allowed, ...] = (
    Allowed(
        "tests/e2e/test_storage_faults.py::"
        "test_a_full_disk_refuses_new_work_acknowledges_nothing_and_recovers_by_itself[tmpfs]",
        "cannot mount a tmpfs here (needs root)",
        "Mounting a small tmpfs to fill a real disk needs root. The test's failpoint case "
        "runs everywhere and checks the same refusal and recovery.",
    ),
)
"""The reviewed list of skips a run accepts. Keep it short; a crash, failover, lease,
stream or browser test may never be on it (``check_allowed`` refuses such an entry)."""

MUST_RUN_DIRECTORIES = ("tests/crash/", "tests/browser/")
MUST_RUN_FILE_WORDS = {"failover", "takeover", "lease", "stream", "streams"}
MUST_RUN_TEST_WORDS = {"failover", "takeover", "lease"}


def must_run(test: str) -> bool:
    """Whether a test may never be allowed to skip: the crash tests, the browser tests,
    the failover, takeover, lease and stream tests (by the words of their file's name),
    and any test whose name or case speaks of a failover, a takeover or a lease."""
    path, _, name = test.partition("::")
    file_words = set(re.split(r"[_.]", path.rsplit("/", 1)[-1]))
    test_words = set(re.split(r"[^a-z]+", name.lower()))
    return (
        path.startswith(MUST_RUN_DIRECTORIES)
        or bool(file_words & MUST_RUN_FILE_WORDS)
        or bool(test_words & MUST_RUN_TEST_WORDS)
    )


def check_allowed(allowed: tuple[Allowed, ...]) -> None:
    """Raise ``pytest.UsageError`` for an entry without a reason or naming a test that may
    never skip."""
    for entry in allowed:
        if not entry.reason.strip() or not entry.why.strip():
            raise pytest.UsageError(f"skip allow-list: {entry.test} needs a reason and a why")
        if must_run(entry.test):
            raise pytest.UsageError(
                f"skip allow-list: {entry.test} may never skip "
                "(crash, failover, takeover, lease, stream and browser tests must run)"
            )


def skip_reason(report: pytest.TestReport) -> str:
    """The reason a skipped report gives, on one line, without pytest's ``Skipped: ``."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return " ".join(reason.removeprefix("Skipped: ").split())


def is_allowed(nodeid: str, reason: str, allowed: tuple[Allowed, ...] = ALLOWED) -> bool:
    return any(
        (nodeid == a.test or nodeid.split("[", 1)[0] == a.test) and reason.startswith(a.reason)
        for a in allowed
    )


def enabled(config: pytest.Config) -> bool:
    return bool(
        config.getoption(OPTION)
        or os.environ.get(ENV, "") not in ("", "0")
        or os.environ.get("CI", "").lower() == "true"
    )


class FailOnSkip:
    """Collects the unexpected skips from the reports and fails the session on them."""

    def __init__(self) -> None:
        self.unexpected: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not report.skipped or hasattr(report, "wasxfail"):
            return
        reason = skip_reason(report)
        if not is_allowed(report.nodeid, reason):
            self.unexpected.setdefault(report.nodeid, reason)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.unexpected and session.exitstatus in (pytest.ExitCode.OK, 0):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.unexpected:
            return
        terminalreporter.section("unexpected skips", sep="=", red=True, bold=True)
        terminalreporter.line(
            f"{len(self.unexpected)} tests skipped that tests/support/skips.py's ALLOWED "
            "does not name; the run fails (a missing service? run scripts/services):",
            red=True,
        )
        for nodeid, reason in sorted(self.unexpected.items()):
            terminalreporter.line(f"SKIPPED {nodeid}: {reason}")


def register(config: pytest.Config) -> None:
    """Install the plugin when the check is asked for, in the process that sees every
    report (pytest-xdist's controller, or the only process)."""
    if not enabled(config) or hasattr(config, "workerinput"):
        return
    check_allowed(ALLOWED)
    config.pluginmanager.register(FailOnSkip(), "dex-fail-on-skip")
