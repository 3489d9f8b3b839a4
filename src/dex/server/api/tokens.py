"""The tokens a node accepts: from the command line, and from a tokens file that holds
only their SHA-256 hashes and is read again when it changes (or on SIGHUP).

A tokens file is TOML, one ``[[token]]`` table per token::

    [[token]]
    name = "web-app"                # in logs and 429s; the rate limit is kept per name
    role = "client"                 # client, worker or admin
    sha256 = "9f86d081884c7d65..."  # the SHA-256 of the token, in hex (dex token new)
    rate_limit = "20/second"        # optional: this token's limit on the client API

    [[token]]
    name = "acme-app"
    role = "client"
    sha256 = "..."
    tenant = "acme"                 # optional: it sees and changes only acme's sessions

    [[token]]
    name = "billing-workers"
    role = "worker"
    sha256 = "..."
    agents = ["billing"]            # optional: the only agents its Workers may serve

Rotation: add the new token's entry beside the old one (both are valid), move the
holders to the new token, then remove the old entry. The node reads the file again
within a second of a change, and at once on SIGHUP. A file that does not parse keeps the
tokens read before (an error in the log), so a typo never locks everyone out; at start
it stops the node with the problem.

A token offered in a request is hashed once and compared with every known hash in
constant time (``hmac.compare_digest``), each one, whatever matches.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dex.errors import InvalidInput
from dex.server.fleet import TENANT, TENANT_RULE

log = logging.getLogger("dex.auth")

RELOAD_EVERY = 1.0
"""Seconds between two looks at the tokens file's modification time."""


class Role(StrEnum):
    CLIENT = "client"
    WORKER = "worker"
    ADMIN = "admin"


@dataclass(frozen=True)
class Token:
    """A token the node accepts: who holds it, and what it may do."""

    name: str
    role: Role
    digest: bytes
    """The SHA-256 of the token."""
    agents: frozenset[str] | None = None
    """A worker token's scope: the agents its Workers may serve (None: any)."""
    rate_limit: str | None = None
    """This token's limit on the client API (``limits`` notation); None: the default."""
    tenant: str | None = None
    """A client token's scope: the one tenant whose sessions it sees and changes
    (``dex.server.api.tenancy``; None: every session)."""


def digest(token: str | bytes) -> bytes:
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).digest()


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    role: Literal["client", "worker", "admin"]
    sha256: Annotated[str, Field(pattern=r"^[0-9a-fA-F]{64}$")]
    agents: list[Annotated[str, Field(min_length=1)]] | None = None
    rate_limit: str | None = None
    tenant: str | None = None


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token: list[_Entry] = Field(default_factory=list)


def read_file(path: Path) -> list[Token]:
    """The tokens of a tokens file; ``InvalidInput`` naming the problem if it is wrong."""
    try:
        data = tomllib.loads(path.read_text())
        entries = _File.model_validate(data).token
    except OSError as e:
        raise InvalidInput(f"cannot read the tokens file {path}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise InvalidInput(f"the tokens file {path} is not valid TOML: {e}") from None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidInput(f"the tokens file {path}: {where}: {first['msg']}") from None
    tokens = []
    for entry in entries:
        if entry.agents is not None and entry.role != "worker":
            raise InvalidInput(
                f"the tokens file {path}: 'agents' limits a worker token, not a {entry.role} one"
            )
        if entry.tenant is not None:
            check_tenant(entry.tenant, entry.role, f"the tokens file {path}: ")
        if entry.rate_limit is not None:
            check_rate_limit(entry.rate_limit)
        tokens.append(
            Token(
                name=entry.name or f"{entry.role}-{entry.sha256[:8].lower()}",
                role=Role(entry.role),
                digest=bytes.fromhex(entry.sha256),
                agents=frozenset(entry.agents) if entry.agents is not None else None,
                rate_limit=entry.rate_limit,
                tenant=entry.tenant,
            )
        )
    names = [t.name for t in tokens]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidInput(f"the tokens file {path}: names used twice: {', '.join(twice)}")
    return tokens


def check_tenant(tenant: str, role: str, where: str = "") -> None:
    """Refuse a tenant scope on a token that is not a client token, or a bad name."""
    if role != "client":
        raise InvalidInput(f"{where}'tenant' limits a client token, not a {role} one")
    if not TENANT.fullmatch(tenant):
        raise InvalidInput(f"{where}tenant {tenant!r}: a tenant is {TENANT_RULE}")


def check_rate_limit(text: str) -> None:
    """Refuse a rate limit that ``limits`` cannot read ("20/second; 600/minute")."""
    from limits import parse_many

    try:
        parse_many(text)
    except ValueError:
        raise InvalidInput(
            f"rate limit {text!r} is not like '20/second' or '20/second; 600/minute'"
        ) from None


class Tokens:
    """Every token the node accepts now. ``match`` is what a request calls; the tokens
    file is looked at (a ``stat``) at most once a second, and read again when it changed."""

    def __init__(self, inline: Mapping[Role, str | None], file: Path | None = None) -> None:
        self.inline = [
            Token(name=role.value, role=role, digest=digest(value))
            for role, value in inline.items()
            if value
        ]
        self.file = file
        self._stamp: tuple[int, int, int] | None = None
        self._next_look = 0.0
        self._lock = threading.Lock()
        self.tokens: list[Token] = list(self.inline)
        self.reloads = 0
        """How many times the tokens file was read again after a change."""
        if file is not None:
            self._load(at_start=True)

    @property
    def enabled(self) -> bool:
        """Auth is on: some token is configured (a tokens file turns it on even empty)."""
        return bool(self.inline) or self.file is not None

    def match(self, offered: bytes) -> Token | None:
        """The token whose hash is the offered token's. Every hash is compared, in
        constant time, whichever matches."""
        self.refresh()
        mac = digest(offered)
        found = None
        for token in self.tokens:
            if hmac.compare_digest(mac, token.digest):
                found = token
        return found

    def refresh(self) -> None:
        """Read the file again if it changed since the last look (at most once a second)."""
        if self.file is None:
            return
        now = time.monotonic()
        if now < self._next_look:
            return
        self._next_look = now + RELOAD_EVERY
        if self._stat() != self._stamp:
            self._load()

    def reload(self) -> None:
        """Read the file again now (SIGHUP)."""
        if self.file is not None:
            self._load()

    def _stat(self) -> tuple[int, int, int] | None:
        assert self.file is not None
        try:
            st = os.stat(self.file)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _load(self, *, at_start: bool = False) -> None:
        assert self.file is not None
        with self._lock:
            stamp = self._stat()
            try:
                tokens = read_file(self.file)
            except InvalidInput as e:
                if at_start:
                    raise
                self._stamp = stamp  # one error per change, not one per second
                log.error(
                    "the tokens file was not read again; the tokens read before stay: %s",
                    e.message,
                    extra={"action": "auth.tokens_file_invalid", "path": str(self.file)},
                )
                return
            self.tokens = [*self.inline, *tokens]
            self._stamp = stamp
            if not at_start:
                self.reloads += 1
            log.info(
                "tokens file read: %d tokens",
                len(tokens),
                extra={
                    "action": "auth.tokens_loaded",
                    "path": str(self.file),
                    "tokens": len(tokens),
                },
            )
