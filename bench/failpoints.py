"""What an unarmed failpoint costs on the hot path.

    .venv/bin/python -m bench.failpoints

Times ``dex._failpoints.hit`` unarmed against an empty function call (the baseline,
measured in the same run), and puts the difference in terms of one turn: a turn of the
turn benchmark (model -> read tool -> model) passes about ten failpoints.
"""

from __future__ import annotations

import timeit

from dex import _failpoints as failpoints

HITS_PER_TURN = 10  # an upper bound: Worker and server points passed by one 3-Step turn
TURN_SECONDS = 0.003  # the order of one sequential turn (see bench.turns)


def _empty(name: str) -> None:
    return None


def main() -> None:
    assert not failpoints._ARMED, "run with DEX_FAILPOINTS unset"
    n = 2_000_000
    hit = min(timeit.repeat(lambda: failpoints.hit("worker.tool_running"), number=n, repeat=5))
    base = min(timeit.repeat(lambda: _empty("worker.tool_running"), number=n, repeat=5))
    per_hit = hit / n
    per_call = base / n
    extra = max(0.0, per_hit - per_call)
    print(f"unarmed hit():        {per_hit * 1e9:7.1f} ns")
    print(f"empty call baseline:  {per_call * 1e9:7.1f} ns   (ratio {per_hit / per_call:.2f}x)")
    share = HITS_PER_TURN * per_hit / TURN_SECONDS
    print(
        f"per turn ({HITS_PER_TURN} hits):   {HITS_PER_TURN * per_hit * 1e6:7.2f} us = "
        f"{share:.4%} of a {TURN_SECONDS * 1e3:g} ms turn "
        f"(beyond a plain call: {HITS_PER_TURN * extra * 1e6:.2f} us)"
    )


if __name__ == "__main__":
    main()
