"""Run a process's main coroutine on uvloop (a faster event loop) where it is installed,
and tune the garbage collector of a process that Dex owns (a node, a ``dex worker``)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a dependency on Linux and macOS
        factory = None
    else:
        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


GC_YOUNG_THRESHOLD = 20_000
"""Container objects allocated (net) before the youngest generation is collected: Python's
default is 700."""


def tune_gc() -> None:
    """Collect garbage less often, in a process that Dex owns (not in a user's program).

    A turn allocates thousands of short-lived containers (records, dicts of frames, pydantic
    models, futures) that reference counting frees at once; with the default threshold they
    set off a young collection every few hundred allocations, and every tenth of those an
    older one, and the collector took 14 % of the node's busy event loop at 64 sessions
    (1.5 % at this threshold: ``bench/README.md``). Hardly any of them form cycles, so there is
    nothing to find at that frequency: collections every 20,000 allocations still free the
    few cycles (tracebacks, closed tasks) and keep memory bounded. What was loaded at
    startup (modules, schemas, the app) is frozen out of every collection's scan."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
