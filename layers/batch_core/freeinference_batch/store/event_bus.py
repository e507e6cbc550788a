"""The service's EventBridge bus: the batches' status changes as events."""

from __future__ import annotations

import random
import time

from freeinference_batch.core import aws

# PutEvents may refuse some entries of a call and put the others (`FailedEntryCount`, an
# `ErrorCode` in each refused entry's place): those are sent again, up to this many calls in all,
# after a short jittered pause; botocore's retries cover only a call that failed as a whole.
PUT_ATTEMPTS = 4
PUT_BACKOFF_SECONDS = 0.05


def put_event(bus_name: str, source: str, detail_type: str, detail: str) -> None:
    """One event on the bus (PutEvents); raises when the bus still refuses it after
    `PUT_ATTEMPTS` calls (the caller's record is then retried)."""
    put_events([{"Source": source, "DetailType": detail_type, "Detail": detail, "EventBusName": bus_name,
                 "Resources": []}])


def put_events(entries: list[dict]) -> None:
    """Put `entries` (at most 10, PutEvents' limit); the entries refused are sent again, the
    others never twice. Raises with the last refusals when some are still refused."""
    for attempt in range(PUT_ATTEMPTS):
        answer = aws.events().put_events(Entries=entries)
        if not answer.get("FailedEntryCount"):
            return
        results = answer.get("Entries") or []
        refused = [(entry, result) for entry, result in zip(entries, results, strict=False) if result.get("ErrorCode")]
        if not refused:  # a count without the entries that say which: all of them, to be safe
            refused = [(entry, {}) for entry in entries]
        entries = [entry for entry, _ in refused]
        if attempt < PUT_ATTEMPTS - 1:
            time.sleep(random.uniform(0, PUT_BACKOFF_SECONDS * 2**attempt))
    errors = [{"ErrorCode": result.get("ErrorCode"), "ErrorMessage": result.get("ErrorMessage")}
              for _, result in refused]
    raise RuntimeError(f"PutEvents refused {len(entries)} event(s): {errors}")
