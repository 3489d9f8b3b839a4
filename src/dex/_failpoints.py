"""Named points in server and Worker code where a test can stop or crash the process.

Armed only through the environment, read once at import:

    DEX_FAILPOINTS="worker.tool_running=pause,server.before_commit_result=crash"
    DEX_FAILPOINT_DIR=/tmp/fp      # where hits are reported and pauses released

``crash`` SIGKILLs the process on the spot. ``pause`` blocks the process (its
whole event loop: no heartbeat leaves it) until the file ``NAME.release`` appears
in the directory, or the test kills it. ``stop`` SIGSTOPs the process on the spot,
every thread of it (a hung VM, a long GC pause): it runs on when the test sends
SIGCONT. Every hit first writes ``NAME.hit``, so a test waits on a file instead of
guessing with a sleep. ``NAME=crash@3`` acts on the third hit only; ``NAME=stop@arm``
on the first hit once the file ``NAME.arm`` exists (for a point that is hit an
unknown number of times before the moment the test means).

``error`` is for the points a caller asks with ``failing(NAME)`` instead of
``hit``: ``failing`` is true while the file ``NAME.fail`` exists in the directory
(and the caller raises the error it stands for, such as SQLite's "database or
disk is full"): a fault a test switches on and off, as a disk fills and is freed.

Unarmed, ``hit`` is a single dictionary check.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

ARM = -1
"""The ``nth`` of ``NAME=action@arm``: act on the first hit once ``NAME.arm`` exists."""

_ARMED: dict[str, tuple[str, int]] = {}
_COUNTS: dict[str, int] = {}
_DIR = Path(os.environ.get("DEX_FAILPOINT_DIR", "."))


def _parse(spec: str) -> dict[str, tuple[str, int]]:
    armed: dict[str, tuple[str, int]] = {}
    for part in spec.split(","):
        if not part.strip():
            continue
        name, _, action = part.strip().partition("=")
        action, _, nth = action.partition("@")
        if action not in ("crash", "pause", "stop", "error"):
            raise ValueError(
                f"failpoint {name}: unknown action {action!r} (crash, pause, stop or error)"
            )
        armed[name] = (action, ARM if nth == "arm" else int(nth or 1))
    return armed


_ARMED.update(_parse(os.environ.get("DEX_FAILPOINTS", "")))


def hit(name: str) -> None:
    if not _ARMED:
        return
    armed = _ARMED.get(name)
    if armed is None or armed[0] == "error":
        return
    action, nth = armed
    if nth == ARM and not (_DIR / f"{name}.arm").exists():
        return
    count = _COUNTS[name] = _COUNTS.get(name, 0) + 1
    if count != max(nth, 1):
        return
    (_DIR / f"{name}.hit").write_text(str(os.getpid()))
    if action == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)  # returns once a SIGCONT resumed the process
        return
    release = _DIR / f"{name}.release"
    while not release.exists():
        time.sleep(0.005)


def failing(name: str) -> bool:
    """Whether the ``error`` failpoint ``name`` is failing now: while ``NAME.fail``
    exists. Each failing call counts as a hit (``NAME.hit`` is written on the first).
    Unarmed, a single dictionary check."""
    if not _ARMED:
        return False
    armed = _ARMED.get(name)
    if armed is None or armed[0] != "error" or not (_DIR / f"{name}.fail").exists():
        return False
    count = _COUNTS[name] = _COUNTS.get(name, 0) + 1
    if count == 1:
        (_DIR / f"{name}.hit").write_text(str(os.getpid()))
    return True
