"""Idempotent create: the `Idempotency-Key` request header (IETF httpapi-idempotency-key draft,
Stripe's convention).

The same key with the same body within 24 hours answers the original batch again; with another
body, 422. Keys are scoped per account: another account's identical key is unrelated.

The record is written in the same TransactWriteItems as the batch's META and the unfinished
counter, conditional on no unexpired record of that key: batch and record commit together, so
no crash can leave a batch without its record, and of two concurrent creates with one key
exactly one stores a batch. Powertools' idempotency utility is not used for this reason: it
writes its record in a step of its own, apart from our transaction, and a crash between the two
would let a retry create a duplicate.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from freeinference_batch.core.errors import BadRequest, UnprocessableEntity
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import accounts_table

HEADER = "Idempotency-Key"
# How long a key is remembered.
WINDOW_SECONDS = 24 * 3600
_KEY = re.compile(r"^[\x20-\x7e]{1,255}$")


@dataclass(frozen=True)
class IdempotencyKey:
    """A create's key, as stored: digests only (the key may carry anything the client chose)."""

    account_id: str
    key_digest: str
    body_digest: str


def parse(account_id: str, value: str | None, body: bytes) -> IdempotencyKey | None:
    """The create's key (None without the header); 400 unless it is 1-255 printable ASCII."""
    if value is None:
        return None
    if not _KEY.match(value):
        raise BadRequest(f"The {HEADER} header must be 1 to 255 printable ASCII characters "
                         f"(got {len(value)} characters{'' if value.isascii() else ', not all ASCII'})",
                         code="invalid_idempotency_key", param=HEADER)
    return IdempotencyKey(account_id, hashlib.sha256(value.encode()).hexdigest(), hashlib.sha256(body).hexdigest())


def replay(settings: Settings, key: IdempotencyKey, now: float) -> dict | None:
    """The original answer if this key created a batch in the last 24 hours (422 if that create
    had another body); None when the key is new or its record has expired."""
    record = accounts_table.get_idempotency(settings, key.account_id, key.key_digest)
    if record is None or record["expires_at"] <= now:  # TTL deletes late: expired reads as absent
        return None
    if record["body_sha256"] != key.body_digest:
        raise UnprocessableEntity(
            f"This {HEADER} was already used, in the last 24 hours, to create batch {record['batch_id']} "
            "with a different body; send a new key for a new batch",
            code="idempotency_key_reused", param=HEADER)
    return json.loads(record["answer"])


def record_element(settings: Settings, key: IdempotencyKey, batch_id: str, answer: dict, now: float) -> dict:
    """The transact `Put` of the key's record, to commit with the batch itself."""
    return accounts_table.put_idempotency_element(
        settings, key.account_id, key.key_digest, body_digest=key.body_digest, batch_id=batch_id,
        answer=json.dumps(answer, separators=(",", ":")), now=int(now), expires_at=int(now) + WINDOW_SECONDS)
