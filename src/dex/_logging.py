"""Log set-up for the ``dex`` command: a level, and lines for people or for machines.

Every Dex log record carries a stable ``action`` (``worker.attempt_failed``,
``node.ready``...) and the ids it concerns (``session_id``, ``step_id``, ``attempt_id``,
``worker_id``, ``tool``) as ``extra`` fields. ``console`` prints them as ``key=value``
after the message (a list as its items joined by commas, a value with a space, a quote or
an ``=`` in JSON quotes); ``json`` prints one JSON object per line with every field.

The TypeScript and Go Workers write both formats the same way (``sdk/typescript/src/log.ts``,
``sdk/go/dex/log.go``): one definition, in docs/operations.md ("Logs").
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

FORMATS = ("console", "json")
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class ConsoleFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = _fields(record)
        if fields:
            extra = " ".join(f"{k}={field_text(v)}" for k, v in fields.items())
            head, sep, tail = line.partition("\n")  # a traceback stays below the fields
            line = f"{head} {extra}{sep}{tail}"
        return line


def field_text(value: Any) -> str:
    """A field's value in a console line: one word, quoted as a JSON string when it would
    not read as one; a whole number of seconds as ``2``, as JavaScript and Go write it."""
    if isinstance(value, list | tuple):
        value = ",".join(str(v) for v in value)
    elif isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    text = str(value)
    if text == "" or any(c.isspace() or c in '"=' for c in text):
        return orjson.dumps(text).decode()
    return text


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure(level: str = "info", format: str = "console") -> None:
    """Send logs to stderr at ``level`` (debug, info, warning, error), as ``format``."""
    if format not in FORMATS:
        raise ValueError(f"log format {format!r}: choose console or json")
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"log level {level!r}: choose debug, info, warning or error")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if format == "json" else ConsoleFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
