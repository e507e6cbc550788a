"""API keys, accounts, authentication and the daily quota.

Keys look like `hyi-<random>` and are stored only as SHA-256 hashes: the raw key is shown once,
when it is created, and never written anywhere. Usage is charged per UTC day (the quota renews
at 00:00 UTC); the day is taken from `clock.now`, so tests move it with the clock offset file.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

from freeinference_batch.core import clock, errors
from freeinference_batch.core.catalog import NANO_PER_USD, Catalog, load_catalog
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import accounts_table

KEY_PREFIX = "hyi-"
# Generated keys are "hyi-" + 43 URL-safe characters (256 random bits); admins may supply their own
# of this alphabet. Keys are stored as unsalted SHA-256, so a short one would be found from its
# hash by brute force: a chosen key needs at least CHOSEN_KEY_MIN_CHARS after the prefix (6 bits
# each, 192 bits if chosen at random). Keys chosen before that rule still authenticate (the 8 below).
CHOSEN_KEY_MIN_CHARS = 32
_KEY_PATTERN = re.compile(r"^hyi-[A-Za-z0-9_\-]{8,256}$")
_CHOSEN_KEY_PATTERN = re.compile(rf"^hyi-[A-Za-z0-9_\-]{{{CHOSEN_KEY_MIN_CHARS},256}}$")

ACCOUNT_STATUSES = ("active", "suspended", "deleted")
DEFAULT_TIER = "standard"
DEFAULT_DAILY_QUOTA_USD = 100.0
DEFAULT_CONCURRENCY = 16

MISSING_KEY_MESSAGE = "Missing API key: send 'Authorization: Bearer <key>' or 'X-API-Key'"
INVALID_KEY_MESSAGE = "Invalid API key"
REVOKED_KEY_MESSAGE = "API key has been revoked"
EXPIRED_KEY_MESSAGE = "API key has expired"


class Principal(BaseModel):
    """Who is calling: the key's hash (never the key), its account and today's usage."""

    model_config = ConfigDict(frozen=True)

    key_hash: str
    account_id: str
    tier: str
    account_status: str
    daily_quota_nano: int
    concurrency_limit: int
    usage_today_nano: int


class OwnerStatus(StrEnum):
    OK = "ok"
    UNAUTHORIZED = "unauthorized"
    QUOTA_EXHAUSTED = "quota_exhausted"
    NO_BATCH_ACCESS = "no_batch_access"


class OwnerState(BaseModel):
    """The worker's re-check of a batch owner before each request.

    `status` says what to do; `reason` is the user-facing why (for unauthorized: the same words
    `authenticate` would use); `resume_at` is the next 00:00 UTC when the quota is used up;
    `concurrency_limit` is the account's (0 when the account is gone).
    """

    model_config = ConfigDict(frozen=True)

    status: OwnerStatus
    concurrency_limit: int = 0
    resume_at: float | None = None
    reason: str = ""
    tier: str = ""

    @property
    def ok(self) -> bool:
        return self.status is OwnerStatus.OK


# -- keys --


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _usd_to_nano(usd: float) -> int:
    if usd < 0:
        raise ValueError("daily quota must not be negative")
    return round(usd * NANO_PER_USD)


def format_usd(nano: int) -> str:
    """$100.00, $0.50, $0.000001 (small quotas keep their significant digits)."""
    usd = nano / NANO_PER_USD
    if nano % (NANO_PER_USD // 100) == 0:
        return f"${usd:,.2f}"
    return "$" + f"{usd:,.9f}".rstrip("0")


def _validate_account_fields(
    *, status: str | None = None, tier: str | None = None, concurrency: int | None = None
) -> None:
    if status is not None and status not in ACCOUNT_STATUSES:
        raise ValueError(f"status must be one of {', '.join(ACCOUNT_STATUSES)}")
    if tier is not None and not re.fullmatch(r"[a-z0-9_\-]{1,64}", tier):
        raise ValueError("tier must be 1-64 characters of a-z, 0-9, '_' or '-'")
    if concurrency is not None and concurrency < 0:
        raise ValueError("concurrency must not be negative")


def create_key(
    settings: Settings,
    account_id: str,
    *,
    tier: str | None = None,
    daily_quota_usd: float | None = None,
    concurrency: int | None = None,
    key: str | None = None,
    expires_at: float | None = None,
) -> str:
    """Store a new key for `account_id` and return the raw key (the only time it is seen).

    The account is created if missing (tier "standard", $100 a day, 16 concurrent requests unless
    given); if it exists, only the given fields change. Account and key are written in one
    transaction, so a key never points at a missing account.
    """
    if not account_id or not re.fullmatch(r"[A-Za-z0-9_.@\-]{1,128}", account_id):
        raise ValueError("account id must be 1-128 characters of A-Z, a-z, 0-9, '_', '.', '@' or '-'")
    _validate_account_fields(tier=tier, concurrency=concurrency)
    if key is None:
        key = generate_key()
    elif not _CHOSEN_KEY_PATTERN.match(key):
        raise ValueError(f"a key must look like 'hyi-' followed by {CHOSEN_KEY_MIN_CHARS}-256 URL-safe characters "
                         "(A-Z, a-z, 0-9, '_', '-'): it is stored as an unsalted SHA-256, which a shorter key "
                         "would not protect")
    at = int(clock.now(settings.clock_offset_file))
    set_fields: dict[str, Any] = {}
    if tier is not None:
        set_fields["tier"] = tier
    if daily_quota_usd is not None:
        set_fields["daily_quota_nano"] = _usd_to_nano(daily_quota_usd)
    if concurrency is not None:
        set_fields["concurrency_limit"] = concurrency
    defaults = {
        "account_id": account_id,
        "status": "active",
        "tier": DEFAULT_TIER,
        "daily_quota_nano": _usd_to_nano(DEFAULT_DAILY_QUOTA_USD),
        "concurrency_limit": DEFAULT_CONCURRENCY,
    }
    accounts_table.transact(
        [
            *accounts_table.upsert_account_elements(
                settings, account_id, set_fields=set_fields, defaults=defaults, at=at
            ),
            accounts_table.put_key_element(
                settings,
                hash_key(key),
                account_id,
                created_at=at,
                expires_at=int(expires_at) if expires_at is not None else None,
            ),
        ]
    )
    return key


def revoke_key(settings: Settings, key: str) -> bool:
    """Revoke a key (given raw); False if no such key exists. Revoking twice is harmless."""
    return revoke_key_hash(settings, hash_key(key))


def revoke_key_hash(settings: Settings, key_hash: str) -> bool:
    """Revoke a key by its SHA-256 (hex), as stored: an operator need not hold the raw key."""
    at = int(clock.now(settings.clock_offset_file))
    return accounts_table.revoke_key(settings, key_hash.lower(), at=at)


def set_account(
    settings: Settings,
    account_id: str,
    *,
    status: str | None = None,
    tier: str | None = None,
    daily_quota_usd: float | None = None,
    concurrency: int | None = None,
) -> dict[str, Any]:
    """Change fields of an existing account's settings; returns its settings as stored afterwards
    (with its `unfinished` count).

    Raises errors.NotFound if the account has no settings (it does not exist, or its settings are
    still to be moved: `migrate_account_settings`), ValueError for invalid values or when nothing
    is to change.
    """
    _validate_account_fields(status=status, tier=tier, concurrency=concurrency)
    fields: dict[str, Any] = {}
    if status is not None:
        fields["status"] = status
    if tier is not None:
        fields["tier"] = tier
    if daily_quota_usd is not None:
        fields["daily_quota_nano"] = _usd_to_nano(daily_quota_usd)
    if concurrency is not None:
        fields["concurrency_limit"] = concurrency
    if not fields:
        raise ValueError("nothing to change: give a status, tier, daily quota or concurrency")
    at = int(clock.now(settings.clock_offset_file))
    account = accounts_table.update_account(settings, account_id, fields, at=at)
    if account is None:
        raise errors.NotFound(f"Account {account_id!r} does not exist", code="account_not_found")
    return account


def migrate_account_settings(settings: Settings) -> tuple[int, int]:
    """Copy each account's settings from its account item, where they were kept before they moved
    to an item of their own, unless it has that item already: (copied, left as they were). Safe
    to run again, or while the service runs."""
    at = int(clock.now(settings.clock_offset_file))
    copied = kept = 0
    for account in accounts_table.account_items(settings):
        if accounts_table.copy_settings(settings, account, at=at):
            copied += 1
        else:
            kept += 1
    return copied, kept


def set_model_load(settings: Settings, model: str, inflight: int) -> None:
    """Record a model's interactive requests in flight (the gateway, or `admin set-load`)."""
    if inflight < 0:
        raise ValueError("in-flight count must not be negative")
    accounts_table.put_model_load(settings, model, inflight, at=int(clock.now(settings.clock_offset_file)))


def model_load(settings: Settings, model: str) -> int:
    """A model's interactive requests in flight; 0 if never recorded."""
    item = accounts_table.get_model_load(settings, model)
    return int(item.get("inflight", 0)) if item else 0


# -- authentication --


def _header(headers: Mapping[str, str], name: str) -> str:
    lowered = name.lower()
    for header, value in headers.items():
        if header.lower() == lowered:
            return (value or "").strip()
    return ""


def _key_from_headers(headers: Mapping[str, str]) -> str:
    authorization = _header(headers, "Authorization")
    if authorization:
        scheme, _, credential = authorization.partition(" ")
        if scheme.lower() == "bearer" and credential.strip():
            return credential.strip()
    api_key = _header(headers, "X-API-Key")
    if api_key:
        return api_key
    if authorization:
        raise errors.Unauthorized(INVALID_KEY_MESSAGE)
    raise errors.Unauthorized(MISSING_KEY_MESSAGE)


def _key_problem(key_item: dict | None, at: float) -> str | None:
    """Why a stored key may not be used (the user-facing message), or None."""
    if key_item is None:
        return INVALID_KEY_MESSAGE
    if key_item.get("status") != "active":
        return REVOKED_KEY_MESSAGE
    expires_at = key_item.get("expires_at")
    if expires_at is not None and at >= expires_at:
        return EXPIRED_KEY_MESSAGE
    return None


def _account_problem(account: dict | None) -> str | None:
    if account is None:
        return INVALID_KEY_MESSAGE
    status = account.get("status", "active")
    if status != "active":
        return f"Account is {status}"
    return None


def _quota_message(daily_quota_nano: int) -> str:
    return f"Daily quota of {format_usd(daily_quota_nano)} used up; it renews at 00:00 UTC"


def batch_catalog(settings: Settings, principal: Principal) -> Catalog:
    """The catalog, once the principal's tier may use batches (creating them, retrying them,
    managing their webhooks); 403 otherwise."""
    catalog = load_catalog(settings.model_catalog_path)
    if not catalog.tier_may_batch(principal.tier):
        raise errors.Forbidden("Batch inference is available to internal accounts only; "
                               f"this key's account tier is {principal.tier!r}")
    return catalog


def authenticate(settings: Settings, headers: Mapping[str, str]) -> Principal:
    """The caller of an API request, from its headers.

    Raises errors.Unauthorized (401) for a missing, unknown, revoked or expired key or an account
    that is not active, and errors.QuotaExceeded (429) while today's usage has reached the daily
    quota. Two reads: the key item, then account and today's usage together.
    """
    key = _key_from_headers(headers)
    if not _KEY_PATTERN.match(key):
        raise errors.Unauthorized(INVALID_KEY_MESSAGE)
    key_hash = hash_key(key)
    at = clock.now(settings.clock_offset_file)
    key_item = accounts_table.get_key(settings, key_hash)
    problem = _key_problem(key_item, at)
    if problem:
        raise errors.Unauthorized(problem)
    assert key_item is not None
    account_id = key_item["account_id"]
    account, usage_nano = accounts_table.get_account_and_usage(settings, account_id, clock.utc_day(at))
    problem = _account_problem(account)
    if problem:
        raise errors.Unauthorized(problem)
    assert account is not None
    principal = Principal(
        key_hash=key_hash,
        account_id=account_id,
        tier=account.get("tier", DEFAULT_TIER),
        account_status=account.get("status", "active"),
        daily_quota_nano=int(account.get("daily_quota_nano", 0)),
        concurrency_limit=int(account.get("concurrency_limit", 0)),
        usage_today_nano=usage_nano,
    )
    if principal.usage_today_nano >= principal.daily_quota_nano:
        raise errors.QuotaExceeded(_quota_message(principal.daily_quota_nano))
    return principal


def owner_check(settings: Settings, key_hash: str, account_id: str, *, at: float | None = None) -> OwnerState:
    """Re-check a batch's owner before one of its requests runs (one BatchGetItem).

    unauthorized: key revoked, expired or missing, or account not active / missing (fail the
    batch); no_batch_access: the tier may not batch (park and re-check later); quota_exhausted:
    today's usage reached the quota (park until `resume_at`, the next 00:00 UTC).
    """
    if at is None:
        at = clock.now(settings.clock_offset_file)
    key_item, account, usage_nano = accounts_table.get_key_account_and_usage(
        settings, key_hash, account_id, clock.utc_day(at)
    )
    return judge_owner(load_catalog(settings.model_catalog_path), account_id, key_item, account, usage_nano, at)


def judge_owner(catalog: Catalog, account_id: str, key_item: dict | None, account: dict | None, usage_nano: int,
                at: float) -> OwnerState:
    """The owner re-check on items already read (the worker reads them with the batch in one call)."""
    problem = _key_problem(key_item, at)
    if problem is None and key_item is not None and key_item.get("account_id") != account_id:
        problem = INVALID_KEY_MESSAGE
    problem = problem or _account_problem(account)
    if problem:
        return OwnerState(status=OwnerStatus.UNAUTHORIZED, reason=problem)
    assert account is not None
    tier = account.get("tier", DEFAULT_TIER)
    concurrency_limit = int(account.get("concurrency_limit", 0))
    if not catalog.tier_may_batch(tier):
        return OwnerState(
            status=OwnerStatus.NO_BATCH_ACCESS,
            concurrency_limit=concurrency_limit,
            tier=tier,
            reason=f"Tier {tier!r} may not use batch inference",
        )
    daily_quota_nano = int(account.get("daily_quota_nano", 0))
    if usage_nano >= daily_quota_nano:
        return OwnerState(
            status=OwnerStatus.QUOTA_EXHAUSTED,
            concurrency_limit=concurrency_limit,
            tier=tier,
            resume_at=clock.next_utc_midnight(at),
            reason=_quota_message(daily_quota_nano),
        )
    return OwnerState(status=OwnerStatus.OK, concurrency_limit=concurrency_limit, tier=tier)
