"""What ``dex server`` says at start: the URLs people open, the database and streams
without their passwords, and a warning when auth is off on an address others reach."""

from __future__ import annotations

import logging

import pytest

from dex.server.config import ServerConfig
from dex.server.start_lines import start_lines


def lines(auth_on: bool = False, **settings: object) -> dict[str, tuple[int, str]]:
    """The start lines by their first word."""
    config = ServerConfig.model_validate(settings)
    return {line.split()[0]: (level, line) for level, line in start_lines(config, auth_on)}


def test_urls_for_ipv6_and_tls() -> None:
    found = lines(listen="[::1]:7450", tls_cert="cert.pem", tls_key="key.pem")
    assert found["Dex"][1].endswith("listening on https://[::1]:7450")
    assert found["web"][1] == "web console: https://[::1]:7450/ui"
    assert found["auth:"] == (logging.INFO, "auth: off (only this machine reaches [::1])")


def test_passwords_are_not_shown() -> None:
    found = lines(
        database="postgresql://dex:s3cret@db:5432/dex", streams="redis://:hunter2@cache:6379/0"
    )
    text = "\n".join(line for _, line in found.values())
    assert "s3cret" not in text and "hunter2" not in text
    assert "PostgreSQL at postgresql://dex:***@db:5432/dex" in text
    assert "Redis at redis://:***@cache:6379/0" in text


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.1", "dex.internal", "::"])
def test_auth_off_where_others_reach_is_a_warning(host: str) -> None:
    listen = f"[{host}]:7450" if ":" in host else f"{host}:7450"
    level, line = lines(listen=listen)["auth:"]
    assert level == logging.WARNING and "can be reached from other machines" in line


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "127.0.0.2"])
def test_auth_off_on_loopback_is_information(host: str) -> None:
    assert lines(listen=f"{host}:7450")["auth:"][0] == logging.INFO


def test_auth_on_is_said_whatever_the_address() -> None:
    assert lines(auth_on=True, listen="0.0.0.0:7450")["auth:"] == (
        logging.INFO,
        "auth: on (every request needs a token)",
    )
