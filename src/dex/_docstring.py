"""Split a tool's docstring into what the tool does and what each parameter means.

Two styles are read: Google's ``Args:`` section (also ``Arguments:`` and ``Parameters:``)
and reST's ``:param name: text`` fields (with their ``:type name:`` companions).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_GOOGLE_HEADERS = {"args:", "arguments:", "parameters:"}
_GOOGLE_ENTRY = re.compile(r"\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)")
_REST_FIELD = re.compile(r":(param|parameter|arg|argument|key|keyword|type)\s+([^:]*?)\s*:\s*(.*)")


@dataclass(frozen=True)
class Docstring:
    description: str
    """The docstring without its parameter section or fields."""
    params: dict[str, str] = field(default_factory=dict)
    """Each documented parameter's text, continuation lines joined by spaces."""


def parse(doc: str) -> Docstring:
    """``doc`` as ``inspect.getdoc`` returns it (indentation already cleaned)."""
    lines = doc.splitlines()
    kept: list[str] = []
    params: dict[str, str] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip().lower() in _GOOGLE_HEADERS:
            i = _google_section(lines, i, params)
        elif (found := _REST_FIELD.fullmatch(line.strip())) is not None:
            i = _rest_field(lines, i, found, params)
        else:
            kept.append(line)
            i += 1
    return Docstring(description=_tidy(kept), params=params)


def _google_section(lines: list[str], header: int, params: dict[str, str]) -> int:
    """Read the entries under ``lines[header]``; return the index after the section."""
    header_indent = _indent(lines[header])
    entry_indent: int | None = None
    name: str | None = None
    i = header + 1
    while i < len(lines):
        line = lines[i]
        if line.strip():
            indent = _indent(line)
            if indent <= header_indent:
                break  # the next section, or prose after this one
            if entry_indent is None:
                entry_indent = indent
            entry = _GOOGLE_ENTRY.fullmatch(line.strip()) if indent <= entry_indent else None
            if entry is not None:
                name = entry.group(1)
                params[name] = entry.group(2).strip()
            elif name is not None:  # a continuation line
                params[name] = f"{params[name]} {line.strip()}".strip()
        i += 1
    return i


def _rest_field(lines: list[str], start: int, found: re.Match[str], params: dict[str, str]) -> int:
    """Read one ``:param ...:`` field and its continuation lines; return the next index."""
    kind, target, text = found.groups()
    text_lines = [text.strip()]
    i = start + 1
    while i < len(lines) and lines[i].strip() and _indent(lines[i]) > _indent(lines[start]):
        text_lines.append(lines[i].strip())
        i += 1
    if kind != "type":
        name = target.split()[-1] if target.split() else ""  # ":param int n:" names n
        if name:
            params[name] = " ".join(t for t in text_lines if t)
    return i


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _tidy(lines: list[str]) -> str:
    """Join the kept lines, collapsing the blank runs that removed sections leave."""
    out: list[str] = []
    for line in lines:
        if not line.strip() and (not out or not out[-1].strip()):
            continue
        out.append(line.rstrip())
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out)
