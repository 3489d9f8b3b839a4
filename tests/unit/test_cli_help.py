"""Every ``dex`` command's ``--help`` renders: the first thing a person types to learn a
command's options."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import typer
from typer.testing import CliRunner

from dex.cli.main import app


def _commands(command: object, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The path of every command under ``command``, subcommands included."""
    yield path
    if isinstance(command, typer.core.TyperGroup):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(typer.main.get_command(app)))


def test_the_walk_finds_every_command() -> None:
    names = {path[0] for path in COMMANDS if path}
    assert {"server", "worker", "send", "new", "reconcile", "chat", "turn"} <= names


@pytest.mark.parametrize("path", COMMANDS, ids=lambda path: " ".join(("dex", *path)))
def test_help_renders(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], prog_name="dex")

    assert result.exception is None, result.output
    assert result.exit_code == 0, result.output
    assert f"Usage: dex {' '.join(path)}".rstrip() in " ".join(result.output.split())
    assert "--help" in result.output
