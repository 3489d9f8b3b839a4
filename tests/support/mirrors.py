"""Checks that msgspec structs mirror the protocol's pydantic types (``dex.wire``'s
``server_frames`` for the Worker, ``worker_frames`` for the server): the same fields and
defaults, and a frame refused by both."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import orjson
import pydantic
import pytest


def model_fields(model: type[pydantic.BaseModel]) -> dict[str, Any]:
    """Each field's default, or ``"required"``."""
    return {
        name: "required" if f.is_required() else f.get_default(call_default_factory=True)
        for name, f in model.model_fields.items()
    }


def struct_fields(struct: type[msgspec.Struct]) -> dict[str, Any]:
    """The same for a struct; its tag (``t``) is a required field, as in the model."""
    info = msgspec.inspect.type_info(struct)
    assert isinstance(info, msgspec.inspect.StructType)
    fields: dict[str, Any] = {"t": "required"} if info.tag is not None else {}
    for f in info.fields:
        default = f.default if f.default_factory is msgspec.NODEFAULT else f.default_factory()
        fields[f.name] = "required" if f.required else default
    return fields


def refused_by_both(
    frame_type: pydantic.TypeAdapter[Any], decode: Callable[[bytes], Any], message: Any
) -> None:
    frame = orjson.dumps([message])
    with pytest.raises(pydantic.ValidationError):
        frame_type.validate_json(frame)
    with pytest.raises(msgspec.ValidationError):
        decode(frame)


def coerced_by_pydantic_only(
    frame_type: pydantic.TypeAdapter[Any], decode: Callable[[bytes], Any], message: Any
) -> None:
    """What pydantic's lax mode coerces (a number sent as a string, ...) msgspec refuses."""
    frame = orjson.dumps([message])
    frame_type.validate_json(frame)
    with pytest.raises(msgspec.ValidationError):
        decode(frame)
