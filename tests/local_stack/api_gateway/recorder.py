"""A fake handler for the API Gateway tests."""

from __future__ import annotations

from typing import Any


class Recorder:
    """A fake api handler: keeps the events and context it got, answers what it is told."""

    def __init__(self, answer: Any = None) -> None:
        self.events: list[dict] = []
        self.contexts: list = []
        self.answer = answer if answer is not None else {"statusCode": 200, "body": "{}"}

    def __call__(self, event, context):
        self.events.append(event)
        self.contexts.append(context)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer(event) if callable(self.answer) else self.answer
