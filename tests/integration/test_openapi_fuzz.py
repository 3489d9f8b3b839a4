"""Schemathesis fuzzes the app in process from its own OpenAPI document: every answer is
documented (status and schema), and none is a server error.

One Hypothesis run per operation with bounded examples, then a stateful run that follows
the document's links: a created session's id into its snapshot, messages, turns, waits
(approve, deny, answer), cancel and reconcile. A registered agent (written to the store
before the node starts, as a Worker's hello would) lets sessions be created.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.python import asgi as schemathesis_asgi
from schemathesis.specs.openapi.checks import (
    response_schema_conformance,
    status_code_conformance,
)
from starlette.types import ASGIApp

from dex.server import records
from dex.server.app import asgi
from dex.server.config import ServerConfig
from dex.server.store.sqlite import SqliteStore
from tests.integration.conftest import AGENT

Case = schemathesis.Case[Any]

CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]
EXAMPLES = 30
"""Per operation: the whole test stays well under a minute on a busy machine."""
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
STREAM_SECONDS = 0.2
"""How long an event stream is read before the client stops (it never ends by itself)."""


def _config(data_dir: Path, token: str | None = None) -> ServerConfig:
    """A node that holds a waiting request briefly; with ``token``, auth on for every role."""
    return ServerConfig(
        data_dir=data_dir,
        max_wait_seconds=0.05,
        client_token=token,
        worker_token=token and token + "-worker",
        admin_token=token and token + "-admin",
    )


async def _register_agent(config: ServerConfig) -> None:
    store = SqliteStore(config.database_path)
    await store.open()
    try:
        await store.write(records.write(agents=[AGENT]))
    finally:
        await store.close()


def _fresh_node(data_dir: Path) -> ASGIApp:
    """A node whose store knows the test agent; Schemathesis runs its lifespan."""
    config = _config(data_dir)
    asyncio.run(_register_agent(config))
    return asgi(config)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[ASGIApp]:
    yield _fresh_node(tmp_path / "data")
    schemathesis_asgi.shutdown_lifespans()


def _load(node: ASGIApp) -> Any:
    """The node's OpenAPI document as Schemathesis reads it. A new session names the test
    agent whenever the generated body has a string there, so sessions get created and the
    routes behind them are reached."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", node)

    @schema.hook
    def map_body(context: schemathesis.HookContext, body: Any) -> Any:
        operation = context.operation
        creates = operation is not None and operation.label == "POST /v1/sessions"
        if creates and isinstance(body, dict) and isinstance(body.get("agent"), str):
            return {**body, "agent": AGENT.name}
        return body

    return schema


def _operations(schema: Any) -> list[Any]:
    """Every operation of the document; one Schemathesis cannot read fails the test."""
    return [result.ok() for result in schema.get_all_operations()]


def _fuzz(operation: Any) -> None:
    """Positive and negative cases of one operation, each answer checked."""
    kwargs: dict[str, Any] = (
        {"timeout": STREAM_SECONDS} if operation.path.endswith("/events") else {}
    )

    @given(case=st.one_of([operation.as_strategy(mode) for mode in GenerationMode]))
    @SETTINGS
    def run(case: Case) -> None:
        case.call_and_validate(checks=CHECKS, **kwargs)

    run()


def _fuzz_each_operation(schema: Any) -> list[str]:
    failures: list[str] = []
    for operation in _operations(schema):
        try:
            _fuzz(operation)
        except Exception as e:
            failures.append(f"{operation.label}: {e}")
    return failures


def test_every_operation_answers_as_documented(node: ASGIApp) -> None:
    schema = _load(node)
    failures = _fuzz_each_operation(schema)
    assert not failures, "\n\n".join(failures)


def test_following_links_from_a_created_session_answers_as_documented(
    node: ASGIApp, tmp_path: Path
) -> None:
    machine = _load(node).as_state_machine()
    seen: set[tuple[str, int]] = set()
    scenarios = iter(range(1_000_000))

    class Links(machine):  # type: ignore[valid-type,misc]
        """Each scenario talks to a node of its own: the same requests get the same answers
        (Hypothesis replays scenarios, and a session id taken by an earlier one is a 409)."""

        def setup(self) -> None:
            self.node = _fresh_node(tmp_path / f"scenario-{next(scenarios)}")

        def teardown(self) -> None:
            schemathesis_asgi.shutdown_lifespans()

        def after_call(self, response: schemathesis.Response, case: Case) -> None:
            super().after_call(response, case)
            seen.add((case.operation.label, response.status_code))

        def get_call_kwargs(self, case: Case) -> dict[str, Any]:
            if case.operation.path.endswith("/events"):
                return {"app": self.node, "timeout": STREAM_SECONDS}
            return {"app": self.node}

        def validate_response(
            self, response: schemathesis.Response, case: Case, **kwargs: Any
        ) -> None:
            case.validate_response(response, checks=CHECKS)

    Links.run(
        settings=settings(
            max_examples=25,
            stateful_step_count=12,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
    )
    # the links were followed: routes about one session answered for a created session
    assert ("POST /v1/sessions", 201) in seen, seen
    reached = {op for op, status in seen if "{session_id}" in op and status in (200, 201, 409)}
    assert len(reached) >= 3, seen


def test_with_auth_on_every_operation_answers_401_as_documented(tmp_path: Path) -> None:
    config = _config(tmp_path / "data", token="secret")
    node = asgi(config)
    try:
        schema = schemathesis.openapi.from_asgi("/openapi.json", node)
        failures = []
        for operation in _operations(schema):
            names = re.findall(r"{(\w+)}", operation.path)
            case = operation.Case(path_parameters=dict.fromkeys(names, "1"))
            response = case.call()
            if operation.path not in ("/healthz", "/readyz"):
                assert response.status_code == 401, (operation.label, response.text)
            try:
                case.validate_response(response, checks=CHECKS)
            except Exception as e:
                failures.append(f"{operation.label}: {e}")
        assert not failures, "\n\n".join(failures)
    finally:
        schemathesis_asgi.shutdown_lifespans()
