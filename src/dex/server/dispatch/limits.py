"""Flow control at hand-out: limits on model calls per model group, and the concurrency
keys of tools.

A queued Step whose hand-out asks something of a limit (an ``Ask``: a key, and for a
model call the tokens it is expected to use) is handed out only once its key's gate
admits it. One the gate does not admit stays queued, uses no attempt, and is parked at
the gate in order; the gate lets its first parked Step go again when it could be
admitted (a call of its key ended, or the rate's time came), and says meanwhile what it
waits for (``blocked``: the snapshot shows it).

A model group's gate enforces its ``Limit``: calls at once, requests per minute, and
input plus output tokens per minute. Rates are kept as the time at which the group's
calls so far would have been spaced out at the rate (the generic cell rate algorithm):
a call is admitted while that time is less than ``BURST`` seconds ahead, and moves it
on by its cost. The tokens of a call are estimated before it (``Ask.tokens``) and
corrected by the usage it reports (``settle``), so over any minute the tokens admitted
are the limit, however wrong the estimates were. A provider's refusal (a 429, an
overloaded answer: ``refused``) closes the group until its ``Retry-After`` and halves
what the group admits (its rates, and its calls at once: those configured, or else
those running when it was refused); each call that succeeds gives back ``RAISE`` of it.

In a cluster each node admits a share of each limit: the part of the group's demand
(calls running and waiting) that is its own, as every node reports it
(``dex.server.flow``), with a tenth kept by the part of the partitions it serves; the
part of the partitions alone until demand is known (calls at once round down, but a
node that serves any partition admits one).

A model group with no limit that was never refused has no gate: its calls are only
counted as running (``_running``), which costs next to nothing per call. Its gate is made
when it needs one (a limit set at run time, a refusal), counting the calls then running.

All of this lives in memory and is rebuilt by the queue itself after a restart: what is
durable is the Step, queued, with no attempt.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

BURST = 1.0
"""Seconds of its rate a group may take at once."""
LOWEST = 1 / 16
"""The least part of its limits a group is lowered to by a provider's refusals."""
RAISE = 0.1
"""The part of its limits a group gets back with each call that succeeds."""

if TYPE_CHECKING:
    from dex.server.dispatch.queues import Queued


class Limit(BaseModel):
    """A model group's limits; a limit left out (None) does not apply."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    concurrency: int | None = Field(None, ge=1, description="Model calls running at once.")
    rpm: float | None = Field(None, gt=0, description="Model calls started per minute.")
    tpm: float | None = Field(
        None, gt=0, description="Input plus output tokens per minute (input estimated)."
    )


@dataclass(frozen=True, slots=True)
class Ask:
    """What a Step's hand-out asks of the limits."""

    key: str
    """A model group (``anthropic/claude-sonnet-4-5``), or a tool's concurrency key
    (``tool:AGENT/TOOL=VALUE``)."""
    tokens: int = 0
    """A model call's expected input tokens."""
    concurrency: int | None = None
    """A tool's own limit of calls at once under ``key``."""


@dataclass(frozen=True, slots=True)
class Blocked:
    """Why a Step's hand-out waits."""

    key: str
    limit: str
    """``concurrency``, ``rpm``, ``tpm``, or ``retry_after`` (the provider refused)."""
    until: float | None
    """Wall-clock time it may go (None: when a call under ``key`` ends)."""

    def words(self) -> str:
        what = {
            "concurrency": "calls at once",
            "rpm": "requests per minute",
            "tpm": "tokens per minute",
            "retry_after": "Retry-After from the model provider",
        }[self.limit]
        return f"the limit of {what} of {self.key}"


@dataclass(eq=False)
class _Gate:
    key: str
    limit: Limit | None = None
    running: int = 0
    requests_at: float = 0.0
    """The time by which the calls admitted so far would have started at the rate."""
    tokens_at: float = 0.0
    """The same, for their tokens."""
    factor: float = 1.0
    """The part of its limits a provider's refusals left it."""
    seen: int | None = None
    """Calls running at the first refusal, when no concurrency is configured."""
    closed_until: float = 0.0
    parked: deque[Queued] = field(default_factory=deque)
    wake: float | None = None
    """When its first parked Step is let go, if a time decides."""

    def idle(self) -> bool:
        return self.limit is None and not self.running and not self.parked and self.factor == 1


class Limits:
    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now
        """The wall clock of ``Blocked.until`` (the dispatcher's: the database's)."""
        self.share: Callable[[], float] = lambda: 1.0
        """The part of each limit this node admits: in a cluster, of the partitions."""
        self.shares: dict[str, float] = {}
        """By group, the part of its limits this node admits, from the cluster's demand
        (``flow.ModelLimits.share_by_demand``); ``share()`` for a group not named."""
        self.configured: dict[str, Limit] = {}
        """The limits of model groups, by group."""
        self._gates: dict[str, _Gate] = {}
        self._running: dict[tuple[str, str], tuple[str, int]] = {}
        """(session, Step) -> (key, estimated tokens) of each admitted call."""
        self._blocked: dict[tuple[str, str], Blocked] = {}
        """Why each parked Step waits."""
        self._wakes: list[tuple[float, str]] = []
        self._due: set[str] = set()
        """Keys whose first parked Step may go now."""

    # --- configuration -------------------------------------------------------------

    def set(self, key: str, limit: Limit | None) -> None:
        """Set (or, with None, remove) a model group's limits; Steps waiting for them are
        looked at again at once."""
        if limit is None:
            self.configured.pop(key, None)
        else:
            self.configured[key] = limit
        gate = self._gates.get(key)
        if gate is None and limit is not None:
            loose = self._loose(key)
            if loose:  # calls of the group run already: they count against the limit
                gate = self._gates[key] = _Gate(key, limit, loose)
        if gate is not None:
            gate.limit = limit
            self._due.add(key)
            if gate.idle():
                del self._gates[key]

    def replace(self, limits: dict[str, Limit]) -> None:
        """Make ``limits`` the whole configuration."""
        for key in set(self.configured) - set(limits):
            self.set(key, None)
        for key, limit in limits.items():
            if self.configured.get(key) != limit:
                self.set(key, limit)

    # --- admission -----------------------------------------------------------------

    def admit(self, session_id: str, step_id: str, ask: Ask) -> Blocked | None:
        """Admit the call if its gate lets it go now (it counts until ``release``); else why
        it waits. A Step parked at the gate goes before any that is not."""
        step = (session_id, step_id)
        gate = self._gates.get(ask.key)
        if gate is None:
            if ask.concurrency is None and ask.key not in self.configured:
                # no limit, never refused: nothing to check, the call is only counted
                self._running[step] = (ask.key, ask.tokens)
                if self._blocked:
                    self._blocked.pop(step, None)
                return None
            gate = self._gate(ask.key)
        now = self.now()
        if gate.parked and step not in self._blocked:
            return self._blocked.get(_first(gate), Blocked(ask.key, "concurrency", None))
        blocked = self._blocks(gate, ask, now)
        if blocked is not None:
            return blocked
        gate.running += 1
        self._running[step] = (ask.key, ask.tokens)
        self._blocked.pop(step, None)
        rpm, tpm = self._rates(gate)
        if rpm is not None:
            gate.requests_at = max(gate.requests_at, now) + 60 / rpm
        if tpm is not None:
            gate.tokens_at = max(gate.tokens_at, now) + ask.tokens * 60 / tpm
        self._schedule(ask.key, gate, now)
        return None

    def counts(self, session_id: str, step_id: str) -> bool:
        """Whether the Step's call counts against its limits now (admitted, or counted)."""
        return (session_id, step_id) in self._running

    def count(self, session_id: str, step_id: str, ask: Ask) -> None:
        """Count a call that runs without having been admitted here: one left running by a
        restart or a takeover, which its Worker may reclaim."""
        step = (session_id, step_id)
        if step not in self._running:
            if ask.key in self._gates or ask.concurrency is not None or ask.key in self.configured:
                self._gate(ask.key).running += 1
            self._running[step] = (ask.key, ask.tokens)

    def park(self, step: Queued, blocked: Blocked) -> None:
        """The Step waits at its gate (``admit`` said why) until ``due`` lets it go."""
        assert step.ask is not None
        gate = self._gate(step.ask.key)
        if (step.session_id, step.step_id) in self._blocked and gate.parked:
            gate.parked.appendleft(step)  # it was first, let go, and still may not start
        else:
            gate.parked.append(step)
        self._blocked[(step.session_id, step.step_id)] = blocked
        self._schedule(step.ask.key, gate, self.now())

    def due(self) -> Iterator[Queued]:
        """The parked Steps that may be admitted now (each gate lets its first go)."""
        now = self.now()
        while self._wakes and self._wakes[0][0] <= now:
            self._due.add(heapq.heappop(self._wakes)[1])
        keys, self._due = self._due, set()
        for key in keys:
            gate = self._gates.get(key)
            if gate is not None and gate.parked:
                gate.wake = None
                yield gate.parked.popleft()

    def next_wake(self) -> float | None:
        """When ``due`` may next let a Step go, if a time decides (now if one may)."""
        if self._due:
            return self.now()
        while self._wakes and self._stale(self._wakes[0]):
            heapq.heappop(self._wakes)
        return self._wakes[0][0] if self._wakes else None

    def parked(self) -> Iterator[Queued]:
        for gate in self._gates.values():
            yield from gate.parked

    def blocked(self, session_id: str, step_id: str) -> Blocked | None:
        return self._blocked.get((session_id, step_id))

    def tally(self) -> dict[str, tuple[int, int]]:
        """(calls running, Steps waiting) by key: every key that has calls running or Steps
        waiting, or was lowered (what the metrics and the API's view of the limits show)."""
        out = {key: (gate.running, len(gate.parked)) for key, gate in self._gates.items()}
        for key, _ in self._running.values():
            if key not in self._gates:
                out[key] = (out.get(key, (0, 0))[0] + 1, 0)
        return out

    def groups(self) -> list[str]:
        """The keys that have calls running or Steps waiting, or were lowered."""
        return list(self.tally())

    def running(self, key: str) -> int:
        gate = self._gates.get(key)
        return gate.running if gate is not None else self._loose(key)

    def lowered(self, key: str) -> float:
        """The part of its limits a provider's refusals left the group (1: all)."""
        gate = self._gates.get(key)
        return gate.factor if gate is not None else 1.0

    # --- ends ----------------------------------------------------------------------

    def settle(self, session_id: str, step_id: str, tokens: int) -> None:
        """A model call succeeded having used ``tokens`` (input plus output): correct its
        estimate, and give its group back some of what refusals took."""
        running = self._running.get((session_id, step_id))
        if running is None:
            return
        key, estimate = running
        gate = self._gates.get(key)
        if gate is None:
            return  # no limit, never refused: nothing to correct or give back
        _, tpm = self._rates(gate)
        if tpm is not None:
            gate.tokens_at += (tokens - estimate) * 60 / tpm
        if gate.factor < 1:
            gate.factor = min(1.0, gate.factor + RAISE)
            if gate.factor == 1:
                gate.seen = None

    def refused(self, session_id: str, step_id: str, retry_after: float | None) -> None:
        """The model provider refused the call (its rate limit, or its load): close its
        group until ``retry_after`` and halve what the group admits."""
        running = self._running.get((session_id, step_id))
        if running is None:
            return
        key = running[0]
        gate = self._gates.get(key)
        if gate is None:  # its calls ran without a gate: the gate counts them from now
            gate = self._gates[key] = _Gate(key, self.configured.get(key), self._loose(key))
        if gate.seen is None and (gate.limit is None or gate.limit.concurrency is None):
            gate.seen = max(1, gate.running)
        gate.factor = max(LOWEST, gate.factor / 2)
        if retry_after:
            gate.closed_until = max(gate.closed_until, self.now() + retry_after)

    def forget(self, session_id: str, step_id: str) -> None:
        """The Step is not this node's to hand out any more: forget why it waited."""
        self._blocked.pop((session_id, step_id), None)

    def release(self, session_id: str, step_id: str) -> None:
        """The Step's call ended (or its hand-out was not recorded, or it is dropped)."""
        step = (session_id, step_id)
        self._blocked.pop(step, None)
        running = self._running.pop(step, None)
        if running is None:
            return
        key = running[0]
        gate = self._gates.get(key)
        if gate is None:
            return  # only counted
        gate.running -= 1
        if gate.parked:
            self._schedule(key, gate, self.now())
        elif gate.idle():
            del self._gates[key]

    # --- the gates -----------------------------------------------------------------

    def _gate(self, key: str) -> _Gate:
        """The key's gate, made if it has none. Every call of a key that has a gate, a limit
        (``configured``) or a concurrency of its own counts at its gate; only a model
        group with neither may have calls running without one (``_loose``): ``set`` and
        ``refused`` make its gate counting them."""
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = _Gate(key, limit=self.configured.get(key))
        return gate

    def _loose(self, key: str) -> int:
        """The calls of ``key`` running without a gate (none while it has one)."""
        if key in self._gates:
            return 0
        return sum(1 for running in self._running.values() if running[0] == key)

    def _rates(self, gate: _Gate) -> tuple[float | None, float | None]:
        """The requests and tokens per minute this node admits now."""
        if gate.limit is None:
            return None, None
        part = gate.factor * self._share(gate.key)
        rpm = gate.limit.rpm * part if gate.limit.rpm is not None else None
        tpm = gate.limit.tpm * part if gate.limit.tpm is not None else None
        return rpm, tpm

    def _concurrency(self, gate: _Gate, ask: Ask) -> int | None:
        if ask.concurrency is not None:
            return ask.concurrency
        if gate.limit is not None and gate.limit.concurrency is not None:
            most = gate.limit.concurrency * self._share(gate.key)
        elif gate.seen is not None:
            most = gate.seen
        else:
            return None
        return max(1, math.floor(most * gate.factor)) if self._share(gate.key) > 0 else 0

    def _share(self, key: str) -> float:
        share = self.shares.get(key)
        return self.share() if share is None else share

    def _blocks(self, gate: _Gate, ask: Ask, now: float) -> Blocked | None:
        if gate.closed_until > now:
            return Blocked(ask.key, "retry_after", gate.closed_until)
        most = self._concurrency(gate, ask)
        if most is not None and gate.running >= most:
            return Blocked(ask.key, "concurrency", None)
        rpm, tpm = self._rates(gate)
        if rpm == 0 or tpm == 0:  # this node serves no partition
            return Blocked(ask.key, "concurrency", None)
        if rpm is not None and gate.requests_at > now + BURST:
            return Blocked(ask.key, "rpm", gate.requests_at - BURST)
        if tpm is not None and gate.tokens_at > now + BURST:
            return Blocked(ask.key, "tpm", gate.tokens_at - BURST)
        return None

    def _schedule(self, key: str, gate: _Gate, now: float) -> None:
        """Arrange for the gate's first parked Step to go when it may."""
        if not gate.parked:
            return
        first = gate.parked[0].ask
        assert first is not None
        blocked = self._blocks(gate, first, now)
        if blocked is None:
            self._due.add(key)
        elif blocked.until is not None and gate.wake != blocked.until:
            gate.wake = blocked.until
            heapq.heappush(self._wakes, (blocked.until, key))

    def _stale(self, wake: tuple[float, str]) -> bool:
        gate = self._gates.get(wake[1])
        return gate is None or not gate.parked or gate.wake != wake[0]


def _first(gate: _Gate) -> tuple[str, str]:
    return gate.parked[0].session_id, gate.parked[0].step_id
