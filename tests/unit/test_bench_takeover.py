"""bench.takeover's ledger check: each way the ``write`` tool's ledger can disagree with
what Dex recorded is found, on made-up evidence (the e2e test runs it on real evidence)."""

from __future__ import annotations

from typing import Any

from bench.takeover import ledger_problems

from dex import TOOL_CALL_NOT_RUN_ERROR_PREFIX


def call(n: int, status: str, error: str | None = None) -> dict[str, Any]:
    return {
        "id": f"{n}.1",
        "turn": n,
        "status": status,
        "error": error,
        "idempotency_key": f"s/{n}.1",
    }


def ran(*ns: int) -> list[dict[str, Any]]:
    return [{"effect": "write", "key": f"s/{n}.1"} for n in ns]


def test_a_ledger_that_agrees_with_dex_has_no_problem() -> None:
    calls = [call(1, "succeeded"), call(2, "outcome_unknown"), call(3, "outcome_unknown")]
    calls.append(call(4, "failed", f"{TOOL_CALL_NOT_RUN_ERROR_PREFIX}: the node restarted"))
    assert ledger_problems(calls, ran(1, 2)) == []


def test_a_write_that_ran_twice_is_found() -> None:
    problems = ledger_problems([call(1, "outcome_unknown")], ran(1, 1))
    assert problems == ["the write of key s/1.1 ran 2 times"]


def test_a_succeeded_call_must_have_run_exactly_once() -> None:
    assert ledger_problems([call(1, "succeeded")], []) == [
        "call 1.1 (turn 1) is succeeded, yet the ledger holds 0 runs of it"
    ]
    assert "call 1.1 (turn 1) is succeeded, yet the ledger holds 2 runs of it" in ledger_problems(
        [call(1, "succeeded")], ran(1, 1)
    )


def test_a_run_dex_does_not_account_for_or_says_never_happened_is_found() -> None:
    assert ledger_problems([], ran(7)) == ["a write of key s/7.1 ran, and Dex has no such call"]
    not_run = call(1, "failed", f"{TOOL_CALL_NOT_RUN_ERROR_PREFIX}: no Worker took it")
    assert ledger_problems([not_run], ran(1)) == [
        "call 1.1 (turn 1) is failed as never run, yet the ledger holds 1 runs of it"
    ]
