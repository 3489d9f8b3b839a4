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

A spec that cannot be read (an unknown action, a hit number that is neither a positive
integer nor ``arm``, a part without ``=``) raises ``ValueError`` at import, naming the
part: the process does not start, as the TypeScript and Go Workers do not.

Unarmed, ``hit`` is a single dictionary check.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

ACTIONS = ("crash", "pause", "stop", "error")
ARM = -1
"""The ``nth`` of ``NAME=action@arm``: act on the first hit once ``NAME.arm`` exists."""

_ARMED: dict[str, tuple[str, int]] = {}
_COUNTS: dict[str, int] = {}
_DIR = Path(os.environ.get("DEX_FAILPOINT_DIR", "."))


def _parse(spec: str) -> dict[str, tuple[str, int]]:
    """The points a spec arms. A part it cannot read is refused by name (``ValueError``),
    as the TypeScript and Go Workers refuse it: a process armed with a typo does not
    start, rather than run with a failpoint that neither pauses nor fails."""
    armed: dict[str, tuple[str, int]] = {}
    for raw in spec.split(","):
        part = raw.strip()
        if not part:
            continue
        name, equals, action = part.partition("=")
        action, counted, nth = action.partition("@")
        if not (name and equals):
            raise _refused(part, "not NAME=ACTION")
        if action not in ACTIONS:
            choices = f"{', '.join(ACTIONS[:-1])} or {ACTIONS[-1]}"
            raise _refused(part, f"unknown action {_quoted(action)} ({choices})")
        if counted and nth != "arm" and not (nth.isascii() and nth.isdigit() and int(nth) >= 1):
            why = f"the hit number {_quoted(nth)} is not a positive integer (or arm)"
            raise _refused(part, why)
        armed[name] = (action, ARM if nth == "arm" else int(nth or 1))
    return armed


def _refused(part: str, why: str) -> ValueError:
    return ValueError(f"DEX_FAILPOINTS: {_quoted(part)}: {why}")


def _quoted(text: str) -> str:
    """In double quotes, as Go's ``%q`` and JavaScript's ``JSON.stringify`` write it."""
    return json.dumps(text, ensure_ascii=False)


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
