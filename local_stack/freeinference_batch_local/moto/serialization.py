"""A faster way for moto to write DynamoDB attribute values into its responses.

moto's response serializer walks the service model for every value it writes, and a DynamoDB
attribute value is a structure of ten members: for each one it builds a lookup context and tries
several name aliases. An item's every attribute, and every entry of a map attribute (the slots
items hold one per holder), goes through that walk, so serializing a GetItem or BatchGetItem
response was about 40% of moto's CPU under the worker's load. An attribute value is already in
its wire form but for binary values, so this writes it directly; the rest of the response (its
shape, names and order) is still moto's. tests/local_stack/moto/test_serialization.py compares the two
on every attribute type.
"""

from __future__ import annotations

import base64
from typing import Any

from moto.core.serialize import BaseJSONSerializer

ATTRIBUTE_VALUE_SHAPE = "AttributeValue"

_original = BaseJSONSerializer._serialize_type_structure


def wire_attribute_value(value: dict[str, Any]) -> dict[str, Any]:
    """An attribute value as moto holds it ({type: value}, binary as bytes) -> its JSON wire form."""
    wire: dict[str, Any] = {}
    for kind, inner in value.items():
        if inner is None:
            continue  # moto's serializer leaves a member without a value out
        if kind == "B":
            wire[kind] = _base64(inner)
        elif kind == "BS":
            wire[kind] = [_base64(item) for item in inner]
        elif kind == "M":
            wire[kind] = {name: wire_attribute_value(item) for name, item in inner.items()}
        elif kind == "L":
            wire[kind] = [wire_attribute_value(item) for item in inner]
        elif kind in ("S", "N"):
            wire[kind] = str(inner)
        else:  # SS, NS, BOOL, NULL
            wire[kind] = inner
    return wire


def _base64(value: str | bytes) -> str:
    raw = value.encode("utf-8") if isinstance(value, str) else value
    return base64.b64encode(raw).strip().decode("utf-8")


def _serialize_type_structure(self: BaseJSONSerializer, serialized: Any, value: Any, shape: Any, key: str) -> None:
    if shape.name == ATTRIBUTE_VALUE_SHAPE and isinstance(value, dict):
        self._default_serialize(serialized, wire_attribute_value(value), shape, key)
        return
    _original(self, serialized, value, shape, key)


def install() -> None:
    BaseJSONSerializer._serialize_type_structure = _serialize_type_structure  # type: ignore[method-assign]


def uninstall() -> None:
    BaseJSONSerializer._serialize_type_structure = _original  # type: ignore[method-assign]
