"""Signing secrets and Standard Webhooks signatures.

An endpoint's signing secret is never stored. It is derived, when needed, from a key the table
does not hold (a Secrets Manager secret, `WebhookSigningKeySecret`) and the endpoint's id and a
random nonce the table does hold: `whsec_` + base64(HMAC-SHA256(key, "webhook-signing-secret:" +
id + ":" + nonce)). So a leak of the table alone lets no one sign, and rotating an endpoint's
secret is a new nonce. (HMAC keyed by a secret is a PRF: the derived secrets are independent.)
Replacing the key itself would change every endpoint's secret at once; the README says so.

Signatures are Standard Webhooks' (what OpenAI sends and the `openai` package's
`webhooks.unwrap` verifies): `webhook-signature: v1,<base64 HMAC-SHA256(secret, id.timestamp.body)>`,
several space-separated while an old secret is still honoured after a rotation.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from freeinference_batch.core import aws
from freeinference_batch.core.settings import Settings

SECRET_PREFIX = "whsec_"


def signing_key(settings: Settings) -> bytes:
    """The key every endpoint's secret is derived from (cached a few minutes when in Secrets Manager)."""
    if settings.webhook_signing_key_secret:
        value = aws.secret_string(settings.webhook_signing_key_secret, settings.webhook_signing_key_max_age_seconds)
    else:
        value = settings.webhook_signing_key
    if not value:
        raise RuntimeError("neither WEBHOOK_SIGNING_KEY_SECRET nor WEBHOOK_SIGNING_KEY is set: no secret can be made")
    return value.encode()


def new_nonce() -> str:
    return secrets.token_hex(16)


def derive_secret(key: bytes, endpoint_id: str, nonce: str) -> str:
    digest = hmac.new(key, f"webhook-signing-secret:{endpoint_id}:{nonce}".encode(), hashlib.sha256).digest()
    return SECRET_PREFIX + base64.b64encode(digest).decode("ascii")


def secret_hint(secret: str) -> str:
    """What lists show of a secret: enough to tell two apart, far too little to sign with."""
    return f"{SECRET_PREFIX}...{secret[-4:]}"


def signature(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    raw = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(raw, signed, hashlib.sha256).digest()).decode("ascii")


def signed_headers(signing_secrets: list[str], webhook_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The headers of one attempt: a fresh timestamp each time (receivers refuse old ones), the
    same id every time (receivers de-duplicate by it)."""
    return {
        "Content-Type": "application/json",
        "User-Agent": "FreeInference-Batch-Webhooks/1",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signature(s, webhook_id, timestamp, body) for s in signing_secrets),
    }
