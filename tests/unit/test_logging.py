"""The log formats: ids as key=value for people, one JSON object a line for machines."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from dex._logging import ConsoleFormatter, JsonFormatter, configure


def record(exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise KeyError("b")
        except KeyError:
            info = sys.exc_info()
    return logging.getLogger("dex.test").makeRecord(
        "dex.test",
        logging.WARNING,
        __file__,
        1,
        "attempt failed: %s",
        ("KeyError",),
        info,
        extra={"action": "worker.attempt_failed", "session_id": "s1", "attempt_id": "s1/1.2/1"},
    )


def test_console_lines_carry_the_ids_as_key_value() -> None:
    line = ConsoleFormatter().format(record(exc=True))
    head = line.splitlines()[0]
    assert "WARNING dex.test attempt failed: KeyError" in head
    assert "action=worker.attempt_failed session_id=s1 attempt_id=s1/1.2/1" in head
    assert "KeyError: 'b'" in line


def test_json_lines_are_one_object_with_every_field() -> None:
    entry = json.loads(JsonFormatter().format(record(exc=True)))
    assert entry["message"] == "attempt failed: KeyError"
    assert entry["level"] == "warning" and entry["action"] == "worker.attempt_failed"
    assert entry["session_id"] == "s1" and entry["attempt_id"] == "s1/1.2/1"
    assert "KeyError: 'b'" in entry["traceback"]


def test_a_bad_level_or_format_names_the_choices() -> None:
    with pytest.raises(ValueError, match="choose console or json"):
        configure("info", "xml")
    with pytest.raises(ValueError, match="choose debug, info"):
        configure("loud", "json")
