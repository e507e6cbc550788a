"""Pages bounded by bytes as well as by `limit`.

Lambda refuses a response payload over 6,291,456 bytes, measured as the handler's return value
serialized to JSON: the page is a JSON string in `{"statusCode", "headers", "body"}`, so every
quote and backslash of it is escaped a second time. A page therefore stops early (with
`has_more: true`) before a line that would take it past a budget safely under that limit;
`limit` stays the most lines a page holds, not a promise.
"""

from __future__ import annotations

import json
from typing import Any

# Lambda's limit on a synchronous invocation's payload, its response's included.
LAMBDA_PAYLOAD_LIMIT = 6_291_456
# Room for the envelope around the lines: statusCode, headers, the page's other fields.
ENVELOPE_BYTES = 4096


def invoke_bytes(value: Any) -> int:
    """What `value` adds to the response payload, counted as it will be encoded: the API encodes
    with ASCII escapes (each non-ASCII character as \\uXXXX, two for one outside the BMP) and
    the Lambda runtime escapes each quote and backslash of that text again. Counting ASCII
    escapes also bounds a UTF-8 encoding (at most 4 bytes for what is 6 or 12 here)."""
    text = json.dumps(value, separators=(",", ":"))
    return len(text) + text.count('"') + text.count("\\")


class Budget:
    """The bytes a page's lines may still take."""

    def __init__(self, budget_bytes: int) -> None:
        self.left = budget_bytes - ENVELOPE_BYTES

    def fits(self, cost: int) -> bool:
        return cost + 1 <= self.left  # + the comma between lines

    def take(self, cost: int) -> None:
        self.left -= cost + 1
