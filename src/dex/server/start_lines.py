"""What ``dex server`` says once it serves: where it listens, where the web console is,
which database and streams backend it uses, and whether auth is on (a warning when it is
off on an address other machines can reach)."""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import dex
from dex.server.config import ServerConfig
from dex.server.pages import PREFIX as CONSOLE

log = logging.getLogger("dex.server")


def announce(config: ServerConfig, auth_on: bool) -> None:
    """Log the start lines (action ``node.serving``; ``node.auth_off`` for the warning)."""
    for level, line in start_lines(config, auth_on):
        action = "node.auth_off" if level == logging.WARNING else "node.serving"
        log.log(level, "%s", line, extra={"action": action})


def start_lines(config: ServerConfig, auth_on: bool) -> list[tuple[int, str]]:
    """The start lines, each with its log level."""
    url = base_url(config)
    lines = [
        (logging.INFO, f"Dex {dex.__version__} listening on {url}"),
        (logging.INFO, f"web console: {url}{CONSOLE}"),
        (logging.INFO, f"database: {_database(config)}"),
        (logging.INFO, f"live events: {_streams(config.streams)}"),
    ]
    if auth_on:
        lines.append((logging.INFO, "auth: on (every request needs a token)"))
    elif loopback(config.host):
        lines.append((logging.INFO, f"auth: off (only this machine reaches {config.host})"))
    else:
        lines.append(
            (
                logging.WARNING,
                f"auth: off, and {config.listen} can be reached from other machines: anyone "
                "who reaches it can read and drive every session. Turn auth on with "
                "--tokens-file or --client-token (docs/operations.md)",
            )
        )
    return lines


def base_url(config: ServerConfig) -> str:
    scheme = "https" if config.tls_cert is not None else "http"
    host = config.host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    return f"{scheme}://{host}:{config.port}"


def loopback(host: str) -> bool:
    """Whether only this machine can connect to ``host``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def _database(config: ServerConfig) -> str:
    url = config.database_url
    if url.startswith("sqlite:///"):
        return f"SQLite at {Path(url.removeprefix('sqlite:///')).resolve()}"
    return f"PostgreSQL at {without_password(url)} (nodes that share it take turns to lead)"


def _streams(streams: str) -> str:
    if streams == "memory":
        return "in this node's memory (a restart loses them; --streams redis://... keeps them)"
    return f"Redis at {without_password(streams)}"


def without_password(url: str) -> str:
    """``url`` with any password in it replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port is not None else ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))
