"""How the client puts values on the wire: JSON bodies and ids in paths."""

from __future__ import annotations

import json
from typing import Any

import requests


def encode_json(value: Any) -> bytes:
    """Compact UTF-8 JSON, the encoding the client sends (and the CLI measures batches with)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def path_segment(an_id: str) -> str:
    """An id as one path segment (the API answers 404 for ids that are not its ids)."""
    if not an_id:
        raise ValueError("an id must be a non-empty string")
    return requests.utils.quote(an_id, safe="")
