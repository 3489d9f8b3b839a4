"""``bench.timeline``'s moments mean what its report says: in every turn they come in the
order of the hops (client, server, Worker, server, ...), on one clock."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench import timeline


def test_every_turn_is_cut_at_moments_in_the_order_of_its_hops(tmp_path: Path) -> None:
    moments = asyncio.run(timeline.run(turns=25, warmup=3, tmp=tmp_path))
    assert len(moments) == 25
    order = [timeline.HOPS[0][1]] + [end for _, _, end in timeline.HOPS]
    for m in moments:
        assert list(m) == order
        stamps = [m[k] for k in order]
        assert stamps == sorted(stamps), m  # each hop starts where the one before ended
    text = timeline.report(moments, [0.0003])
    assert all(name in text for name, _, _ in timeline.HOPS)
    assert "turn, client send to answer: p50" in text
