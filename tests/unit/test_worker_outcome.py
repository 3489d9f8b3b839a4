"""A tool call's outcome reaches the server exactly as ``ToolOutcome`` dumps it, though the
Worker builds it without the model (``succeeded``): whatever the tool returned."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import uuid
from typing import Any

import pydantic
import pydantic_core
import pytest

from dex.wire import ToolOutcome
from dex.worker.runner import succeeded


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int
    y: float


class Booking(pydantic.BaseModel):
    ref: str = pydantic.Field(alias="Ref")
    nights: float = float("inf")
    note: str | None = pydantic.Field(None, exclude_if=lambda v: v is None)


RESULTS: list[Any] = [
    None,
    "ok",
    3,
    2**70,
    1.5,
    float("nan"),
    [float("-inf"), {"a": (1, 2)}],
    {"ids": {3, 1}},
    b"bytes",
    datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
    datetime.timedelta(seconds=90),
    uuid.UUID(int=7),
    decimal.Decimal("1.25"),
    Color.RED,
    Point(1, 2.5),
    Booking(Ref="b-1"),
    {"booking": Booking(Ref="b-2", note="late")},
]


@pytest.mark.parametrize("result", RESULTS, ids=lambda r: type(r).__name__)
def test_the_outcome_is_what_the_model_dumps(result: Any) -> None:
    expected = ToolOutcome(status="succeeded", result=result).model_dump(mode="json")
    assert succeeded(result) == expected
    assert ToolOutcome.model_validate(succeeded(result)) == ToolOutcome.model_validate(expected)


def test_a_result_that_cannot_be_serialized_fails_the_same_way() -> None:
    class Opaque:
        pass

    with pytest.raises(pydantic_core.PydanticSerializationError):
        ToolOutcome(status="succeeded", result=Opaque()).model_dump(mode="json")
    with pytest.raises(pydantic_core.PydanticSerializationError):
        succeeded({"x": Opaque()})
