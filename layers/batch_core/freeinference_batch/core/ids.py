"""The ids the service makes for what a user creates (batches, files, uploads and their parts,
webhook endpoints)."""

from __future__ import annotations

import secrets


def time_ordered_id(prefix: str, now: float) -> str:
    """`prefix`, the creation time in microseconds as 14 hex digits (ids of one kind sort as they
    were made, which lists page by), then 72 random bits (an id cannot be guessed from another)."""
    return f"{prefix}{int(now * 1_000_000):014x}{secrets.token_hex(9)}"
