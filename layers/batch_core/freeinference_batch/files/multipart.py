"""multipart/form-data bodies (files.create and an upload's parts, as OpenAI's SDK sends them).

The body is at most what Lambda's 6 MB event carries, already in memory: split by its boundary
with bytes.find, never copied part by part through a general MIME parser."""

from __future__ import annotations

import re
from dataclasses import dataclass

from freeinference_batch.core.errors import BadRequest

_BOUNDARY = re.compile(r'boundary=(?:"([^"]+)"|([^;\s]+))', re.IGNORECASE)
_NAME = re.compile(rb'\bname="([^"]*)"', re.IGNORECASE)
_FILENAME = re.compile(rb'\bfilename="([^"]*)"', re.IGNORECASE)


@dataclass(frozen=True)
class FormField:
    value: bytes
    filename: str | None


def parse(body: bytes, content_type: str | None) -> dict[str, FormField]:
    """The form's fields by name (the first of a repeated name). Raises BadRequest for a body that
    is not multipart/form-data."""
    match = _BOUNDARY.search(content_type or "")
    if not (content_type or "").lower().startswith("multipart/form-data") or match is None:
        raise BadRequest("The body must be multipart/form-data (as the OpenAI SDK sends files and parts)")
    delimiter = b"--" + (match.group(1) or match.group(2)).encode("latin-1")
    fields: dict[str, FormField] = {}
    start = body.find(delimiter)
    while start != -1:
        start += len(delimiter)
        if body[start : start + 2] == b"--":
            return fields
        end = body.find(b"\r\n" + delimiter, start)
        if end == -1:
            break
        head, separator, value = body[start:end].removeprefix(b"\r\n").partition(b"\r\n\r\n")
        name = _NAME.search(head)
        if separator and name is not None:
            filename = _FILENAME.search(head)
            fields.setdefault(name.group(1).decode("utf-8", "replace"),
                              FormField(value, filename.group(1).decode("utf-8", "replace") if filename else None))
        start = end + 2
    raise BadRequest("The body must be multipart/form-data (as the OpenAI SDK sends files and parts)")
