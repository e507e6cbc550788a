"""Data access for the accounts table: the only module that knows its item keys and shapes.

Items (`pk` / `sk`, both strings):

- API key `KEY#<sha256 hex>` / `KEY`: account_id, status (active | revoked), created_at,
  expires_at (optional), revoked_at
- account settings `SETTINGS#<id>` / `SETTINGS`: account_id, status (active | suspended |
  deleted), tier, daily_quota_nano, concurrency_limit, created_at, updated_at. Under a partition
  of their own so that only the admin path (the admin CLI, with an operator's credentials) may
  write them: the functions' roles may write under `ACCOUNT#` (`dynamodb:LeadingKeys`) and only
  read here, so no function can change a tier, status, quota or concurrency.
- account `ACCOUNT#<id>` / `ACCOUNT`: account_id, unfinished (absent until the first batch),
  created_at (the functions' counter; settings written here before they moved are left over,
  unread: `admin migrate-account-settings` copies them to the settings item)
- daily usage `ACCOUNT#<id>` / `USAGE#YYYY-MM-DD`: cost_nano, ttl
- model load `MODEL#<model>` / `LOAD`: inflight, updated_at
- model backoff `MODEL#<model>` / `BACKOFF`: cap, changed_at (absent, or without them, while the
  model is not backing off; see model_backoff.py)
- idempotency record `ACCOUNT#<id>` / `IDEMPOTENCY#<sha256 hex of the key>`: body_sha256,
  batch_id, answer (the create's JSON answer), created_at, expires_at, ttl

Everything speaks the low-level client's attribute-value format, so the `Update` elements built
here drop straight into another module's TransactWriteItems.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from botocore.exceptions import ClientError

from freeinference_batch.core import aws
from freeinference_batch.core.settings import Settings
from freeinference_batch.store.dynamo import batch_get
from freeinference_batch.store.dynamo import from_item as _from_item
from freeinference_batch.store.dynamo import is_conditional_failure as _is_conditional_failure
from freeinference_batch.store.dynamo import key as _key
from freeinference_batch.store.dynamo import to_attr as _attr

KEY_SK = "KEY"
ACCOUNT_SK = "ACCOUNT"
SETTINGS_SK = "SETTINGS"
# What the admin sets on an account: the settings item's fields (before the move, the account item's).
SETTINGS_FIELDS = ("account_id", "status", "tier", "daily_quota_nano", "concurrency_limit")
LOAD_SK = "LOAD"
BACKOFF_SK = "BACKOFF"
# The daily usage item outlives its day by this much (DynamoDB TTL removes it afterwards).
USAGE_TTL_SECONDS = 3 * 24 * 3600



# -- keys and (de)serialization --


def key_item_key(key_hash: str) -> dict[str, dict]:
    return _key(f"KEY#{key_hash}", KEY_SK)


def account_item_key(account_id: str) -> dict[str, dict]:
    return _key(f"ACCOUNT#{account_id}", ACCOUNT_SK)


def settings_item_key(account_id: str) -> dict[str, dict]:
    return _key(f"SETTINGS#{account_id}", SETTINGS_SK)


def usage_item_key(account_id: str, day: str) -> dict[str, dict]:
    return _key(f"ACCOUNT#{account_id}", f"USAGE#{day}")


def load_item_key(model: str) -> dict[str, dict]:
    return _key(f"MODEL#{model}", LOAD_SK)


def backoff_item_key(model: str) -> dict[str, dict]:
    return _key(f"MODEL#{model}", BACKOFF_SK)


def _get(settings: Settings, key: dict[str, dict]) -> dict[str, Any] | None:
    # Strongly consistent: a revoked key or a suspended account must take effect at once.
    answer = aws.dynamodb().get_item(TableName=settings.accounts_table_name, Key=key, ConsistentRead=True)
    return _from_item(answer.get("Item"))


def _batch_get(settings: Settings, keys: list[dict[str, dict]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Strongly consistent reads of several items, by (pk, sk)."""
    table = settings.accounts_table_name
    found = batch_get({table: {"Keys": keys, "ConsistentRead": True}})
    return {(item["pk"], item["sk"]): item for item in found[table]}


def _pk_sk(key: dict[str, dict]) -> tuple[str, str]:
    return key["pk"]["S"], key["sk"]["S"]


def _update_element(
    settings: Settings,
    key: dict[str, dict],
    expression: str,
    values: dict[str, Any],
    *,
    condition: str | None = None,
    names: dict[str, str] | None = None,
) -> dict:
    update: dict[str, Any] = {
        "TableName": settings.accounts_table_name,
        "Key": key,
        "UpdateExpression": expression,
        "ExpressionAttributeValues": {name: _attr(value) for name, value in values.items()},
    }
    if condition:
        update["ConditionExpression"] = condition
    if names:
        update["ExpressionAttributeNames"] = names
    return update


# -- API keys --


def get_key(settings: Settings, key_hash: str) -> dict[str, Any] | None:
    return _get(settings, key_item_key(key_hash))


def put_key_element(
    settings: Settings, key_hash: str, account_id: str, *, created_at: int, expires_at: int | None
) -> dict:
    """A transact `Put` of a new key item (fails if that hash is already stored)."""
    item = {
        **key_item_key(key_hash),
        "account_id": _attr(account_id),
        "status": _attr("active"),
        "created_at": _attr(created_at),
    }
    if expires_at is not None:
        item["expires_at"] = _attr(int(expires_at))
    return {
        "Put": {
            "TableName": settings.accounts_table_name,
            "Item": item,
            "ConditionExpression": "attribute_not_exists(pk)",
        }
    }


def revoke_key(settings: Settings, key_hash: str, *, at: int) -> bool:
    """Mark the key revoked; False if no such key is stored."""
    try:
        aws.dynamodb().update_item(
            TableName=settings.accounts_table_name,
            Key=key_item_key(key_hash),
            UpdateExpression="SET #status = :revoked, revoked_at = if_not_exists(revoked_at, :at)",
            ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeNames={"#status": "status"},
            ExpressionAttributeValues={":revoked": _attr("revoked"), ":at": _attr(at)},
        )
    except ClientError as error:
        if _is_conditional_failure(error):
            return False
        raise
    return True


# -- accounts (settings: admin only) --


def get_account(settings: Settings, account_id: str) -> dict[str, Any] | None:
    """The account's settings with its `unfinished` count (the admin's view); None if it has no
    settings item."""
    found = _batch_get(settings, [settings_item_key(account_id), account_item_key(account_id)])
    account_settings = found.get(_pk_sk(settings_item_key(account_id)))
    if account_settings is None:
        return None
    counter = found.get(_pk_sk(account_item_key(account_id))) or {}
    return {**account_settings, "unfinished": int(counter.get("unfinished", 0))}


def upsert_account_elements(
    settings: Settings, account_id: str, *, set_fields: dict[str, Any], defaults: dict[str, Any], at: int
) -> list[dict]:
    """Transact `Update`s creating the account if missing: its settings item (`set_fields` are
    written, `defaults` only fill attributes it does not have yet) and its account item (the
    counter's, which a batch's create requires)."""
    names: dict[str, str] = {}
    values: dict[str, Any] = {":at": at}
    clauses = ["created_at = if_not_exists(created_at, :at)", "updated_at = :at"]
    for index, (field, value) in enumerate(set_fields.items()):
        names[f"#s{index}"] = field
        values[f":s{index}"] = value
        clauses.append(f"#s{index} = :s{index}")
    for index, (field, value) in enumerate(defaults.items()):
        if field in set_fields:
            continue
        names[f"#d{index}"] = field
        values[f":d{index}"] = value
        clauses.append(f"#d{index} = if_not_exists(#d{index}, :d{index})")
    expression = "SET " + ", ".join(clauses)
    account = _update_element(settings, account_item_key(account_id),
                              "SET account_id = :id, created_at = if_not_exists(created_at, :at)",
                              {":id": account_id, ":at": at})
    return [{"Update": _update_element(settings, settings_item_key(account_id), expression, values, names=names)},
            {"Update": account}]


def update_account(settings: Settings, account_id: str, fields: dict[str, Any], *, at: int) -> dict | None:
    """Set `fields` on an existing account's settings; the account as `get_account` reads it
    afterwards, or None if it has no settings item."""
    names = {f"#f{i}": field for i, field in enumerate(fields)}
    values = {f":f{i}": _attr(value) for i, value in enumerate(fields.values())}
    values[":at"] = _attr(at)
    clauses = [f"#f{i} = :f{i}" for i in range(len(fields))] + ["updated_at = :at"]
    try:
        aws.dynamodb().update_item(
            TableName=settings.accounts_table_name,
            Key=settings_item_key(account_id),
            UpdateExpression="SET " + ", ".join(clauses),
            ConditionExpression="attribute_exists(pk)",
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
        )
    except ClientError as error:
        if _is_conditional_failure(error):
            return None
        raise
    return get_account(settings, account_id)


def account_items(settings: Settings) -> Iterator[dict[str, Any]]:
    """Every account item (`ACCOUNT#<id>` / `ACCOUNT`): a Scan, for the admin's migration only
    (no function may scan)."""
    paginator = aws.dynamodb().get_paginator("scan")
    for page in paginator.paginate(
        TableName=settings.accounts_table_name, ConsistentRead=True,
        FilterExpression="sk = :sk AND begins_with(pk, :prefix)",
        ExpressionAttributeValues={":sk": _attr(ACCOUNT_SK), ":prefix": _attr("ACCOUNT#")},
    ):
        for item in page.get("Items", []):
            found = _from_item(item)
            if found is not None:
                yield found


def copy_settings(settings: Settings, account: dict[str, Any], *, at: int) -> bool:
    """Copy the settings an account item holds from before the move to the account's settings
    item, unless it has one (then nothing changes: the settings item is the admin's since). True
    if copied. Idempotent: a re-run, or one racing another, copies each account once."""
    account_id = account.get("account_id") or account["pk"].removeprefix("ACCOUNT#")
    item = {**settings_item_key(account_id), "account_id": _attr(account_id),
            "created_at": _attr(int(account.get("created_at", at))), "updated_at": _attr(at)}
    item.update({field: _attr(account[field]) for field in SETTINGS_FIELDS[1:] if field in account})
    try:
        aws.dynamodb().put_item(TableName=settings.accounts_table_name, Item=item,
                                ConditionExpression="attribute_not_exists(pk)")
    except ClientError as error:
        if _is_conditional_failure(error):
            return False
        raise
    return True


def transact(elements: list[dict]) -> None:
    aws.dynamodb().transact_write_items(TransactItems=elements)


# -- reads that serve authentication and the worker's owner re-check --


def get_account_and_usage(settings: Settings, account_id: str, day: str) -> tuple[dict | None, int]:
    """(account settings item or None, cost_nano used on `day`) in one BatchGetItem."""
    account_key, usage_key = settings_item_key(account_id), usage_item_key(account_id, day)
    found = _batch_get(settings, [account_key, usage_key])
    usage = found.get(_pk_sk(usage_key)) or {}
    return found.get(_pk_sk(account_key)), int(usage.get("cost_nano", 0))


def get_key_account_and_usage(
    settings: Settings, key_hash: str, account_id: str, day: str
) -> tuple[dict | None, dict | None, int]:
    """(key item, account settings item, cost_nano used on `day`) in one BatchGetItem."""
    keys = [key_item_key(key_hash), settings_item_key(account_id), usage_item_key(account_id, day)]
    found = _batch_get(settings, keys)
    usage = found.get(_pk_sk(keys[2])) or {}
    return found.get(_pk_sk(keys[0])), found.get(_pk_sk(keys[1])), int(usage.get("cost_nano", 0))


# -- transact elements other modules fold into their own transactions --


def add_usage_element(settings: Settings, account_id: str, cost_nano: int, day: str, at: float,
                      *, peak_nano: int = 0) -> dict:
    """A transact `Update` charging `cost_nano` to the account's usage of `day` (the UTC day the
    charged requests finished); the item expires USAGE_TTL_SECONDS after `at` plus a day.
    `peak_nano`: the dearest of those requests' costs, kept as the power of two at or above it
    (`peak_of`): DynamoDB has no max in an update, but a set takes each exponent once."""
    ttl = int(at) + 24 * 3600 + USAGE_TTL_SECONDS
    values: dict[str, Any] = {":cost": int(cost_nano), ":ttl": ttl}
    expression = "ADD cost_nano :cost SET #ttl = :ttl"
    if peak_nano > 0:
        expression = "ADD cost_nano :cost, peaks :peak SET #ttl = :ttl"
        values[":peak"] = {(int(peak_nano) - 1).bit_length()}
    return {"Update": _update_element(settings, usage_item_key(account_id, day), expression, values,
                                      names={"#ttl": "ttl"})}


def peak_of(usage: dict | None) -> int:
    """The power of two at or above the dearest request charged to this usage item (0: none yet)."""
    exponents = (usage or {}).get("peaks")
    return 2 ** max(int(e) for e in exponents) if exponents else 0


def unfinished_increment_element(settings: Settings, account_id: str, max_unfinished: int) -> dict:
    return {
        "Update": _update_element(
            settings,
            account_item_key(account_id),
            "ADD unfinished :one",
            {":one": 1, ":max": int(max_unfinished)},
            condition="attribute_exists(pk) AND (attribute_not_exists(unfinished) OR unfinished < :max)",
        )
    }


def unfinished_decrement_element(settings: Settings, account_id: str) -> dict:
    return {
        "Update": _update_element(
            settings,
            account_item_key(account_id),
            "ADD unfinished :minus_one",
            {":minus_one": -1},
            # Only "the account item exists" (accounts are never removed, only marked deleted), so
            # this element cannot block a batch's final transition; the batch's own conditional
            # transition is what makes the decrement happen exactly once.
            condition="attribute_exists(pk)",
        )
    }


# -- idempotency records (create's Idempotency-Key) --


def idempotency_item_key(account_id: str, key_digest: str) -> dict[str, dict]:
    return _key(f"ACCOUNT#{account_id}", f"IDEMPOTENCY#{key_digest}")


def get_idempotency(settings: Settings, account_id: str, key_digest: str) -> dict[str, Any] | None:
    return _get(settings, idempotency_item_key(account_id, key_digest))


def put_idempotency_element(
    settings: Settings,
    account_id: str,
    key_digest: str,
    *,
    body_digest: str,
    batch_id: str,
    answer: str,
    now: int,
    expires_at: int,
) -> dict:
    """A transact `Put` of an idempotency record, failing its condition while an unexpired record
    of that key exists (TTL removes expired ones late, so an expired one may be overwritten)."""
    item = {
        **idempotency_item_key(account_id, key_digest),
        "body_sha256": _attr(body_digest),
        "batch_id": _attr(batch_id),
        "answer": _attr(answer),
        "created_at": _attr(now),
        "expires_at": _attr(expires_at),
        "ttl": _attr(expires_at),
    }
    return {
        "Put": {
            "TableName": settings.accounts_table_name,
            "Item": item,
            "ConditionExpression": "attribute_not_exists(pk) OR expires_at <= :now",
            "ExpressionAttributeValues": {":now": _attr(now)},
        }
    }


# -- model load --


def put_model_load(settings: Settings, model: str, inflight: int, *, at: int) -> None:
    aws.dynamodb().put_item(
        TableName=settings.accounts_table_name,
        Item={**load_item_key(model), "inflight": _attr(int(inflight)), "updated_at": _attr(at)},
    )


def get_model_load(settings: Settings, model: str) -> dict[str, Any] | None:
    answer = aws.dynamodb().get_item(TableName=settings.accounts_table_name, Key=load_item_key(model))
    return _from_item(answer.get("Item"))


# -- model backoff (what it means: worker/model_backoff.py) --


def get_model_backoff(settings: Settings, model: str) -> dict[str, Any] | None:
    """The model's backoff item (`cap`, `changed_at`; neither while it is not backing off)."""
    return _get(settings, backoff_item_key(model))


def set_model_cap(settings: Settings, model: str, cap: int, now: float, *, seen_cap: int | None = None,
                  seen_at: float | None = None) -> bool:
    """Set the model's backoff cap, only if it is still as seen (`seen_cap` since `seen_at`; None:
    no backoff): of two workers deciding from the same read, one writes. False if it changed
    meanwhile."""
    # No backoff is no item, or an item a finished backoff emptied (see end_model_backoff).
    condition = ("attribute_not_exists(cap)" if seen_cap is None
                 else "changed_at = :seen_at AND cap = :seen_cap")
    values = {":cap": _attr(cap), ":now": _attr(now)}
    if seen_cap is not None:
        values |= {":seen_at": _attr(seen_at), ":seen_cap": _attr(seen_cap)}
    try:
        aws.dynamodb().update_item(
            TableName=settings.accounts_table_name, Key=backoff_item_key(model),
            UpdateExpression="SET cap = :cap, changed_at = :now", ConditionExpression=condition,
            ExpressionAttributeValues=values,
        )
    except ClientError as error:
        if _is_conditional_failure(error):
            return False
        raise
    return True


def end_model_backoff(settings: Settings, model: str, *, seen_cap: int, seen_at: float) -> bool:
    """The model is back to its full batch cap: remove the backoff, if still as seen (`seen_cap`
    since `seen_at`). (An update that empties the item, not a DeleteItem: no function may delete
    items one by one.)"""
    try:
        aws.dynamodb().update_item(
            TableName=settings.accounts_table_name, Key=backoff_item_key(model),
            UpdateExpression="REMOVE cap, changed_at",
            ConditionExpression="changed_at = :seen_at AND cap = :seen_cap",
            ExpressionAttributeValues={":seen_at": _attr(seen_at), ":seen_cap": _attr(seen_cap)},
        )
    except ClientError as error:
        if _is_conditional_failure(error):
            return False
        raise
    return True
