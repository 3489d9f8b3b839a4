"""A rig of real processes for end-to-end and crash tests: one server node, Workers, a
ledger, gates and failpoints."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import dex
from dex.server.store.partitions import partition_of
from dex.testing import Ledger, SdkWorkerProcess, ServerProcess, WorkerProcess, wait_until

AGENTS = str(Path(__file__).with_name("agents.py"))
_ROOT = Path(__file__).parents[2]
SDK_AGENTS = {
    "typescript": _ROOT / "sdk" / "typescript" / "dist" / "test" / "agents.js",
    "go": _ROOT / ".venv" / "dex-test-worker-go",
}
"""The ports of ``agents.py`` to the other Worker SDKs, as the test command builds them:
``sdk/typescript/test/agents.ts`` (``scripts/typescript``) and
``sdk/go/internal/testagents`` (``scripts/go``)."""
AnyWorker = WorkerProcess | SdkWorkerProcess


def sdk_command(language: str) -> list[str | Path]:
    """The command that starts ``language``'s port of the test agents."""
    built = SDK_AGENTS[language]
    if not built.exists():
        raise FileNotFoundError(f"{built} is missing: run scripts/{language}")
    return ["node", built] if language == "typescript" else [built]


HEARTBEAT_TIMEOUT = 1.0
CLUSTER_HEARTBEAT_TIMEOUT = 3.0
"""In a cluster the Worker stays connected to the survivors while a test holds it paused
through a takeover (a failpoint's ``pause`` blocks its whole process): a Step the new
owner hands it meanwhile must not expire before the test lets the Worker run on."""
CLOCK_READING_ERROR = 0.02
"""How far a node on PostgreSQL may set its clock from this host's: it corrects its clock
to the database's from the middle of a query's round trip (``dex.server.clock``), so on
one host it reads up to half a round trip off (a millisecond under load). A time a node
records can only be compared with the test's own to within this."""


class Rig:
    """One node on SQLite; or, given ``database`` (a PostgreSQL URL), two nodes on it: the
    active one (``server``) and a hot standby, which Workers and clients both know; or,
    with ``cluster``, that many nodes sharing the partitions (docs/cluster.md): ``server``
    is then the one whose partitions hold the sessions ``session`` makes (the client
    creates them through it, and it makes their ids in its own partitions)."""

    def __init__(
        self,
        tmp: Path,
        database: str | None = None,
        *,
        standby: bool = True,
        cluster: int = 0,
        worker_language: str = "python",
    ) -> None:
        self.tmp = tmp
        self.gates = tmp / "gates"
        self.failpoints = tmp / "failpoints"
        self.gates.mkdir()
        self.failpoints.mkdir()
        self.ledger = Ledger(tmp / "ledger.jsonl")
        names = ["data"]
        if database and cluster:
            names += [f"data-{chr(ord('a') + i)}" for i in range(1, cluster)]
        elif database and standby:
            names.append("data-b")
        self.cluster = bool(database and cluster)
        self.nodes = [
            ServerProcess(
                tmp / name,
                heartbeat_timeout=CLUSTER_HEARTBEAT_TIMEOUT if cluster else HEARTBEAT_TIMEOUT,
                database=database,
                standby=bool(database and standby and not cluster),
            )
            for name in names
        ]
        self.server = self.nodes[0]
        """The node that serves (in HA, the active one)."""
        self.workers: list[AnyWorker] = []
        self.worker_module = AGENTS
        """What ``start_worker`` serves unless told otherwise (a crash helper's new Worker too)."""
        self.worker_language = worker_language
        """``python`` (``dex worker``), ``typescript`` or ``go`` (a Worker of that SDK
        serving its port of the test agents, ``SDK_AGENTS``): what ``start_worker``
        starts unless told otherwise."""
        self.worker_env: dict[str, str] = {}
        self.client = dex.SyncClient(self.address, timeout=30)
        self.sessions: list[str] = []
        """The sessions ``session`` made, in order."""

    @property
    def ha(self) -> bool:
        return len(self.nodes) > 1

    @property
    def clock_error(self) -> float:
        """How far a time the nodes record may be from this host's ``time.time()``: 0 on
        SQLite (the node reads the host's clock), ``CLOCK_READING_ERROR`` on PostgreSQL."""
        return CLOCK_READING_ERROR if self.nodes[0].database else 0.0

    @property
    def address(self) -> str:
        """Every node's address: Workers and clients move on to the one that serves."""
        return ",".join(node.address for node in self.nodes)

    # --- processes ---------------------------------------------------------------

    def start_worker(
        self,
        failpoints: str = "",
        *,
        module: str | None = None,
        env: dict[str, str] | None = None,
        language: str | None = None,
        capacity: int = 16,
    ) -> AnyWorker:
        """A Worker serving the test agents: in Python (``module``, default ``agents.py``)
        or, with ``language`` ``typescript`` or ``go``, that SDK's port (``SDK_AGENTS``);
        running ``capacity`` attempts at once."""
        log = self.tmp / f"worker-{len(self.workers) + 1}.log"
        worker_env = {
            "DEX_TEST_LEDGER": str(self.ledger.path),
            "DEX_TEST_GATES": str(self.gates),
            "DEX_FAILPOINTS": failpoints,
            "DEX_FAILPOINT_DIR": str(self.failpoints),
            **self.worker_env,
            **(env or {}),
        }
        worker: AnyWorker
        language = language or self.worker_language
        if language != "python":
            assert module is None, f"the {language} Worker serves its port of agents.py only"
            worker = SdkWorkerProcess(
                sdk_command(language), self.address, log, env=worker_env, capacity=capacity
            )
        else:
            worker = WorkerProcess(
                module or self.worker_module, self.address, log, env=worker_env, capacity=capacity
            )
        self.workers.append(worker.start())
        return worker

    def restart_server(self) -> None:
        """SIGKILL the node that serves and bring service back: the same node restarted on
        its storage, or (HA) the standby taking over."""
        self.server.kill()
        self.recover_server()

    def recover_server(self) -> None:
        """The serving node is dead (killed, or crashed at a failpoint): restart it on its
        storage; with a standby, wait until the standby serves, and start the dead node
        again as the new standby."""
        dead = self.server
        dead.kill()  # reap it
        if not self.ha:
            dead.start()
            return
        if self.cluster:
            # the survivors take the dead node's partitions; it comes back a standby, so
            # that no hand-over back to it moves the sessions while the test runs (and it
            # stands in once no other node is left)
            wait_until(self.settled, 30, 0.02, what="the survivors took every partition")
            self.server = self._owner()
            dead.standby = True
            dead.start(env=self._env(""), ready=False)
            return
        (standby,) = [node for node in self.nodes if node is not dead]
        wait_until(standby.ready, 30, 0.02, what="the standby took over")
        self.server = standby
        dead.start(env=self._env(""), ready=False)

    def start_server(self, failpoints: str = "") -> None:
        """Start the node (HA: the first node, which becomes active, then the standby;
        ``failpoints`` arm the active one)."""
        self.server.start(env=self._env(failpoints))
        for node in self.nodes:
            if node is not self.server:
                node.start(env=self._env(""), ready=False)
        if self.cluster:
            wait_until(
                lambda: self.settled(balanced=True),
                30,
                0.02,
                what="the nodes shared the partitions out",
            )

    def settled(self, balanced: bool = False) -> bool:
        """Every partition is served by a live node, and none is being taken over,
        recovered or handed over (``balanced``: each node serves its share)."""
        counts = [partitions_served(node) for node in self.nodes if node.alive]
        served = [count for count in counts if count is not None]
        if len(served) < len(counts) or sum(served) != PARTITIONS:
            return False
        return not balanced or max(served) - min(served) <= 1

    def _owner(self) -> ServerProcess:
        """The node that serves the partition of the last session ``session`` made (any
        live node before the first): the one a takeover must kill."""
        if not self.sessions:
            return next(node for node in self.nodes if node.alive)
        database = self.nodes[0].database
        assert database is not None
        with psycopg.connect(database) as conn:
            row = conn.execute(
                "SELECT owner FROM dex_partitions WHERE id = %s",
                (partition_of(self.sessions[-1], PARTITIONS),),
            ).fetchone()
        assert row is not None
        pid = int(str(row[0]).rsplit(":", 1)[1])  # a node's id is host:pid
        return next(node for node in self.nodes if node.alive and node.pid == pid)

    def _env(self, failpoints: str) -> dict[str, str]:
        return {"DEX_FAILPOINTS": failpoints, "DEX_FAILPOINT_DIR": str(self.failpoints)}

    def wait_failpoint(self, name: str, timeout: float = 20) -> None:
        wait_until(
            lambda: (self.failpoints / f"{name}.hit").exists(),
            timeout,
            what=f"failpoint {name} reached",
        )

    def release_failpoint(self, name: str) -> None:
        (self.failpoints / f"{name}.release").write_text("")

    def wait_entered(self, gate: str, attempt: int, timeout: float = 20) -> None:
        wait_until(
            lambda: (self.gates / f"{gate}.{attempt}.entered").exists(),
            timeout,
            what=f"tool behind gate {gate} running as attempt {attempt}",
        )

    def open_gate(self, gate: str) -> None:
        (self.gates / f"{gate}.open").write_text("")

    # --- the conversation ------------------------------------------------------------

    def session(self, agent: str = "assistant") -> str:
        wait_until(
            lambda: any(a["name"] == agent for a in self.client.list_agents()),
            20,
            what=f"agent {agent} registered",
        )
        session_id: str = self.client.create_session(agent)["id"]
        self.sessions.append(session_id)
        return session_id

    def call(self, session_id: str, *calls: tuple[str, dict[str, Any]]) -> int:
        """Send a message asking for these tool calls; return its turn number."""
        text = "call: " + json.dumps([list(c) for c in calls])
        turn: int = self.client.send_message(session_id, text)["turn"]
        return turn

    def wait_turn(self, session_id: str, turn: int, timeout: float = 30) -> dict[str, Any]:
        """The turn once it has ended (a turn that waits for a person has not)."""
        result: dict[str, Any] = self.client.wait_turn(session_id, turn, timeout=timeout)
        status = result["status"]
        assert status not in ("running", "waiting"), f"turn {turn} still {status} after {timeout}s"
        return result

    def current_step(self, session_id: str, type_: str) -> dict[str, Any] | None:
        turn = self.client.get_agent_snapshot(session_id)["current_turn"]
        steps = [s for s in (turn or {}).get("steps", []) if s["type"] == type_]
        return steps[-1] if steps else None

    def close(self) -> None:
        self.client.close()
        for worker in self.workers:
            worker.kill()
        for node in self.nodes:
            node.kill()


PARTITIONS = 64


def partitions_served(node: ServerProcess) -> int | None:
    """How many partitions the node serves, and nothing else in hand (its ``/metrics``);
    None while it takes, recovers or hands one over, or does not answer."""
    try:
        with urllib.request.urlopen(node.address + "/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None
    states = {}
    for line in text.splitlines():
        if line.startswith("dex_partitions{"):
            state = line.split('state="', 1)[1].split('"', 1)[0]
            states[state] = int(float(line.rsplit(" ", 1)[1]))
    if not states or states.get("recovering") or states.get("draining"):
        return None
    return states.get("serving", 0)


TAKEOVER = "Takeover"
SERVER_RESTART_POSTGRES = "Server restart on PostgreSQL"


def make_rig(tmp_path: Path, request: pytest.FixtureRequest) -> Rig:
    """A rig of real processes. A test parametrized with ``column`` "Takeover" gets three
    nodes sharing a fresh PostgreSQL database's partitions, with "Server restart on
    PostgreSQL" one node on it; any other, one node on SQLite."""
    callspec = getattr(request.node, "callspec", None)
    column = callspec.params.get("column") if callspec is not None else None
    on_postgres = column in (TAKEOVER, SERVER_RESTART_POSTGRES)
    database = request.getfixturevalue("postgres_url") if on_postgres else None
    language = callspec.params.get("worker_language", "python") if callspec else "python"
    cluster = 3 if column == TAKEOVER else 0
    return Rig(tmp_path, database, standby=False, cluster=cluster, worker_language=language)


@pytest.fixture
def worker_language(request: pytest.FixtureRequest) -> str:
    """Which Worker the rig starts: ``python`` unless a test is parametrized (indirectly)
    with ``typescript`` or ``go`` (``tests.crash.helpers.columns(..., typescript=True,
    go=True)``)."""
    language: str = getattr(request, "param", "python")
    return language


@pytest.fixture
def rig(tmp_path: Path, request: pytest.FixtureRequest, worker_language: str) -> Iterator[Rig]:
    """``make_rig``, closed after the test."""
    r = make_rig(tmp_path, request)
    try:
        yield r
    finally:
        r.close()


def metric(rig: Rig, name: str) -> float:
    """One unlabelled figure of the active node's ``/metrics``."""
    with urllib.request.urlopen(rig.server.address + "/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def results(turn: dict[str, Any]) -> list[dict[str, Any]]:
    """What the model saw as tool results in the turn's last RunModel (the test script
    answers with them)."""
    text = turn["text"] or ""
    assert text.startswith("results: "), f"unexpected final answer: {text!r}"
    parsed: list[dict[str, Any]] = json.loads(text.removeprefix("results: "))
    return parsed


def model_calls(rig: Rig, session_id: str, effect: str = "model") -> list[int]:
    """The attempt number of every call the session's scripted model received, in order,
    by the model's own ledger (``tests/support/agents.py`` and its ports): ``model`` for
    model calls, ``summary`` for summary calls. A call counts once it started, however it
    ended (and whether Dex took its result or not)."""
    return [e["attempt"] for e in rig.ledger.entries(effect) if e["session_id"] == session_id]


def attempts(turn: dict[str, Any], step_type: str) -> list[list[tuple[int, str]]]:
    """(number, outcome) of every attempt, per Step of that type, in order."""
    return [
        [(a["number"], a["outcome"]) for a in s["attempts"]]
        for s in turn["steps"]
        if s["type"] == step_type
    ]
