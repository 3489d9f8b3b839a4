"""The log formats: ids as key=value for people, one JSON object a line for machines."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from dex._logging import ConsoleFormatter, JsonFormatter, configure, field_text
from dex.worker.connection_log import ConnectionLog


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


def test_console_values_read_as_one_word_each() -> None:
    assert field_text(["concierge", "triage"]) == "concierge,triage"
    assert field_text(16) == "16" and field_text(30.0) == "30" and field_text(2.5) == "2.5"
    assert field_text("http://127.0.0.1:7450") == "http://127.0.0.1:7450"
    assert field_text('closed "now" (1006)') == '"closed \\"now\\" (1006)"'
    assert field_text("a=b") == '"a=b"' and field_text("") == '""'
    line = ConsoleFormatter().format(
        logging.makeLogRecord(
            {"name": "dex.worker", "levelname": "WARNING", "msg": "lost", "error": "cut off"}
        )
    )
    assert line.endswith('WARNING dex.worker lost error="cut off"')


def test_a_worker_logs_one_line_per_outage_however_many_tries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    connection = ConnectionLog("w-1", ["concierge"], 16, clock=lambda: now[0])
    caplog.set_level(logging.INFO, "dex.worker")
    connection.failed("http://a", "refused")  # started before its server: said once
    connection.failed("http://a", "refused")
    connection.connected("http://a")
    connection.lost("http://a", "the connection closed (1006)")
    for _ in range(5):
        now[0] += 0.5
        connection.failed("http://a", "refused")
    connection.connected("http://b")
    connection.stopped("SIGTERM")
    seen = [(r.levelname, vars(r)["action"], r.getMessage()) for r in caplog.records]
    assert seen == [
        (
            "WARNING",
            "worker.connect_failed",
            "cannot reach http://a: refused; trying again until it answers",
        ),
        ("INFO", "worker.connected", "connected to http://a"),
        (
            "WARNING",
            "worker.connection_lost",
            "lost the connection to http://a: the connection closed (1006); reconnecting",
        ),
        ("INFO", "worker.reconnected", "reconnected to http://b after 2.5s and 6 tries"),
        ("INFO", "worker.stopped", "stopped: SIGTERM, drained"),
    ]
    back = vars(caplog.records[3])
    assert (back["address"], back["tries"], back["seconds"]) == ("http://b", 6, 2.5)
