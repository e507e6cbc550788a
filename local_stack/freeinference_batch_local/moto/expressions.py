"""moto parses each distinct DynamoDB update expression once, not twice per UpdateItem.

moto's UpdateItem parses its update expression twice (once to check the names and values it
uses, once to run it), and the worker's few expressions come back thousands of times a run with
only their values changing: parsing was about a tenth of moto's CPU under the worker's load. The
parsed tree is only read (moto's validator works on a deep copy of it), so one tree per
expression string can serve every call. tests/local_stack/moto/test_expressions.py checks both.
"""

from __future__ import annotations

import functools
from typing import Any

from moto.dynamodb.parsing.expressions import UpdateExpressionParser

# The service writes a few dozen distinct expressions; tests and tools a few hundred more.
CACHED_EXPRESSIONS = 1024

_original = UpdateExpressionParser.__dict__["make"]


@functools.lru_cache(maxsize=CACHED_EXPRESSIONS)
def _parsed(expression: str) -> Any:
    return _original.__func__(UpdateExpressionParser, expression)


def install() -> None:
    UpdateExpressionParser.make = classmethod(lambda cls, expression: _parsed(expression))  # type: ignore[method-assign]


def uninstall() -> None:
    UpdateExpressionParser.make = _original  # type: ignore[method-assign]
    _parsed.cache_clear()
