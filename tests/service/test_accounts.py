"""Accounts, keys, authentication and the daily quota, on moto."""

from __future__ import annotations

import datetime as dt
import time

import boto3
import pytest
from botocore.exceptions import ClientError
from freeinference_batch import accounts
from freeinference_batch.accounts import OwnerStatus
from freeinference_batch.core import aws, clock, errors
from freeinference_batch.core.catalog import NANO_PER_USD
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import accounts_table
from moto import mock_aws

TABLE = "accounts-test"


@pytest.fixture
def settings(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    offset_file = tmp_path / "clock-offset"
    with mock_aws():
        aws.reset_clients()
        boto3.client("dynamodb").create_table(
            TableName=TABLE,
            KeySchema=[
                {"AttributeName": "pk", "KeyType": "HASH"},
                {"AttributeName": "sk", "KeyType": "RANGE"},
            ],
            AttributeDefinitions=[
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "sk", "AttributeType": "S"},
            ],
            BillingMode="PAY_PER_REQUEST",
        )
        yield Settings(ACCOUNTS_TABLE_NAME=TABLE, BATCH_CLOCK_OFFSET_FILE=str(offset_file))
        aws.reset_clients()


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def scan(settings) -> list[dict]:
    return aws.dynamodb().scan(TableName=settings.accounts_table_name)["Items"]


def account_item(settings, account_id: str) -> dict:
    key = {"pk": {"S": f"ACCOUNT#{account_id}"}, "sk": {"S": "ACCOUNT"}}
    return aws.dynamodb().get_item(TableName=TABLE, Key=key)["Item"]


def move_clock_to(settings, when: dt.datetime) -> None:
    clock.set_offset(settings.clock_offset_file, when.timestamp() - time.time())


def usage_update(settings, account_id: str, cost_nano: int, at: float) -> dict:
    """The element a count writes to charge the UTC day of `at` (store/runs.py `flush`)."""
    return accounts_table.add_usage_element(settings, account_id, cost_nano, clock.utc_day(at), at)


def charge(settings, account_id: str, usd: float) -> None:
    at = clock.now(settings.clock_offset_file)
    update = usage_update(settings, account_id, round(usd * NANO_PER_USD), at)
    aws.dynamodb().transact_write_items(TransactItems=[update])


def count_calls(client) -> list[str]:
    calls: list[str] = []
    client.meta.events.register("before-call.dynamodb", lambda model, **_: calls.append(model.name))
    return calls


# -- keys --


def test_generated_keys_look_right_and_differ():
    first, second = accounts.generate_key(), accounts.generate_key()
    assert first.startswith("hyi-") and len(first) == 4 + 43
    assert first != second
    assert accounts.hash_key(first) == accounts.hash_key(first)
    assert len(accounts.hash_key(first)) == 64


def test_create_key_creates_account_with_defaults_and_authenticates(settings):
    # Given / When
    key = accounts.create_key(settings, "acct-1")
    principal = accounts.authenticate(settings, bearer(key))
    # Then
    assert principal.account_id == "acct-1"
    assert principal.key_hash == accounts.hash_key(key)
    assert principal.tier == "standard"
    assert principal.account_status == "active"
    assert principal.daily_quota_nano == 100 * NANO_PER_USD
    assert principal.concurrency_limit == 16
    assert principal.usage_today_nano == 0
    with pytest.raises(Exception):  # noqa: B017 - frozen model
        principal.tier = "internal"  # type: ignore[misc]


def test_keys_are_stored_only_as_hashes(settings):
    key = accounts.create_key(settings, "acct-1", tier="internal")
    dumped = repr(scan(settings))
    assert key not in dumped
    assert key.removeprefix("hyi-") not in dumped
    assert f"KEY#{accounts.hash_key(key)}" in dumped


def test_create_key_updates_only_given_fields_of_existing_account(settings):
    accounts.create_key(settings, "acct-1", tier="internal", daily_quota_usd=5, concurrency=3)
    key = accounts.create_key(settings, "acct-1", concurrency=7)
    principal = accounts.authenticate(settings, bearer(key))
    assert principal.tier == "internal"
    assert principal.daily_quota_nano == 5 * NANO_PER_USD
    assert principal.concurrency_limit == 7


def test_create_key_with_given_key(settings):
    key = accounts.create_key(settings, "acct-1", key="hyi-local-development-key-0123456789abcdef")
    assert key == "hyi-local-development-key-0123456789abcdef"
    assert accounts.authenticate(settings, bearer(key)).account_id == "acct-1"
    with pytest.raises(ValueError):
        accounts.create_key(settings, "acct-1", key="not-a-hyi-key")


def test_create_key_does_not_overwrite_an_existing_key(settings):
    accounts.create_key(settings, "acct-1", key="hyi-local-development-key-0123456789abcdef")
    with pytest.raises(ClientError):
        accounts.create_key(settings, "acct-2", key="hyi-local-development-key-0123456789abcdef")
    key_item = aws.dynamodb().get_item(
        TableName=TABLE,
        Key={"pk": {"S": f"KEY#{accounts.hash_key('hyi-local-development-key-0123456789abcdef')}"}, "sk": {"S": "KEY"}},
    )["Item"]
    assert key_item["account_id"] == {"S": "acct-1"}


# -- authentication: 401s --


def test_missing_key_is_401(settings):
    with pytest.raises(errors.Unauthorized) as caught:
        accounts.authenticate(settings, {"content-type": "application/json"})
    assert caught.value.status == 401
    assert caught.value.message == "Missing API key: send 'Authorization: Bearer <key>' or 'X-API-Key'"


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Bearer hyi-thisKeyWasNeverIssued000000"},
        {"Authorization": "Bearer not-a-key"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"X-API-Key": "hyi-"},
    ],
)
def test_unknown_or_malformed_key_is_401(settings, headers):
    accounts.create_key(settings, "acct-1")
    with pytest.raises(errors.Unauthorized) as caught:
        accounts.authenticate(settings, headers)
    assert caught.value.message == "Invalid API key"


@pytest.mark.parametrize(
    "headers",
    [
        lambda key: {"Authorization": f"Bearer {key}"},
        lambda key: {"AUTHORIZATION": f"bearer {key}"},
        lambda key: {"x-api-key": key},
        lambda key: {"X-Api-Key": key},
    ],
)
def test_key_is_read_from_either_header_case_insensitively(settings, headers):
    key = accounts.create_key(settings, "acct-1")
    assert accounts.authenticate(settings, headers(key)).account_id == "acct-1"


def test_revoked_key_is_401(settings):
    key = accounts.create_key(settings, "acct-1")
    assert accounts.revoke_key(settings, key) is True
    with pytest.raises(errors.Unauthorized) as caught:
        accounts.authenticate(settings, bearer(key))
    assert caught.value.message == "API key has been revoked"
    assert accounts.revoke_key(settings, "hyi-neverIssuedNeverIssued") is False


def test_expired_key_is_401(settings):
    now = clock.now(settings.clock_offset_file)
    key = accounts.create_key(settings, "acct-1", expires_at=now + 60)
    assert accounts.authenticate(settings, bearer(key)).account_id == "acct-1"
    clock.set_offset(settings.clock_offset_file, 120)
    with pytest.raises(errors.Unauthorized) as caught:
        accounts.authenticate(settings, bearer(key))
    assert caught.value.message == "API key has expired"


@pytest.mark.parametrize("status", ["suspended", "deleted"])
def test_inactive_account_is_401(settings, status):
    key = accounts.create_key(settings, "acct-1")
    accounts.set_account(settings, "acct-1", status=status)
    with pytest.raises(errors.Unauthorized) as caught:
        accounts.authenticate(settings, bearer(key))
    assert caught.value.status == 401
    assert caught.value.message == f"Account is {status}"
    accounts.set_account(settings, "acct-1", status="active")
    assert accounts.authenticate(settings, bearer(key)).account_status == "active"


def test_authenticate_reads_twice(settings):
    key = accounts.create_key(settings, "acct-1")
    calls = count_calls(aws.dynamodb())
    accounts.authenticate(settings, bearer(key))
    assert calls == ["GetItem", "BatchGetItem"]


# -- quota --


def test_quota_used_up_is_429_until_next_utc_midnight(settings):
    # Given an account with a $1 quota, late in a UTC day
    day = dt.datetime.now(dt.UTC).date() + dt.timedelta(days=2)
    move_clock_to(settings, dt.datetime(day.year, day.month, day.day, 23, 58, tzinfo=dt.UTC))
    key = accounts.create_key(settings, "acct-1", daily_quota_usd=1)
    charge(settings, "acct-1", 0.6)
    assert accounts.authenticate(settings, bearer(key)).usage_today_nano == 600_000_000
    # When usage reaches the quota
    charge(settings, "acct-1", 0.4)
    # Then every call is 429
    with pytest.raises(errors.QuotaExceeded) as caught:
        accounts.authenticate(settings, bearer(key))
    assert caught.value.status == 429
    assert caught.value.message == "Daily quota of $1.00 used up; it renews at 00:00 UTC"
    # And after 00:00 UTC the quota has renewed
    move_clock_to(
        settings, dt.datetime(day.year, day.month, day.day, 23, 58, tzinfo=dt.UTC) + dt.timedelta(minutes=3)
    )
    assert accounts.authenticate(settings, bearer(key)).usage_today_nano == 0


def test_usage_item_has_ttl_after_its_day(settings):
    accounts.create_key(settings, "acct-1")
    at = dt.datetime(2030, 5, 6, 12, 0, tzinfo=dt.UTC).timestamp()
    update = usage_update(settings, "acct-1", 1234, at)
    aws.dynamodb().transact_write_items(
        TransactItems=[update, usage_update(settings, "acct-2", 1, at)]
    )
    aws.dynamodb().transact_write_items(
        TransactItems=[usage_update(settings, "acct-1", 1000, at)]
    )
    item = aws.dynamodb().get_item(
        TableName=TABLE, Key={"pk": {"S": "ACCOUNT#acct-1"}, "sk": {"S": "USAGE#2030-05-06"}}
    )["Item"]
    assert item["cost_nano"] == {"N": "2234"}
    assert int(item["ttl"]["N"]) > dt.datetime(2030, 5, 7, tzinfo=dt.UTC).timestamp()


# -- owner re-check --


def test_owner_check_states(settings):
    key = accounts.create_key(settings, "acct-1", tier="internal", daily_quota_usd=1, concurrency=5)
    key_hash = accounts.hash_key(key)

    calls = count_calls(aws.dynamodb())
    state = accounts.owner_check(settings, key_hash, "acct-1")
    assert calls == ["BatchGetItem"]
    assert state.status == OwnerStatus.OK == "ok"
    assert state.ok and state.concurrency_limit == 5

    accounts.set_account(settings, "acct-1", tier="standard")
    state = accounts.owner_check(settings, key_hash, "acct-1")
    assert state.status == OwnerStatus.NO_BATCH_ACCESS
    assert state.concurrency_limit == 5

    accounts.set_account(settings, "acct-1", tier="internal")
    charge(settings, "acct-1", 1)
    at = clock.now(settings.clock_offset_file)
    state = accounts.owner_check(settings, key_hash, "acct-1", at=at)
    assert state.status == OwnerStatus.QUOTA_EXHAUSTED
    assert state.resume_at == clock.next_utc_midnight(at)

    accounts.set_account(settings, "acct-1", status="suspended")
    state = accounts.owner_check(settings, key_hash, "acct-1")
    assert state.status == OwnerStatus.UNAUTHORIZED
    assert state.reason == "Account is suspended"


def test_owner_check_unauthorized_for_revoked_missing_or_foreign_key(settings):
    key = accounts.create_key(settings, "acct-1", tier="internal")
    accounts.create_key(settings, "acct-2", tier="internal")
    assert accounts.owner_check(settings, accounts.hash_key(key), "acct-2").status == OwnerStatus.UNAUTHORIZED
    assert accounts.owner_check(settings, "0" * 64, "acct-1").status == OwnerStatus.UNAUTHORIZED
    accounts.revoke_key(settings, key)
    state = accounts.owner_check(settings, accounts.hash_key(key), "acct-1")
    assert state.status == OwnerStatus.UNAUTHORIZED
    assert state.reason == "API key has been revoked"


# -- admin operations --


def test_set_account_requires_existing_account(settings):
    with pytest.raises(errors.NotFound):
        accounts.set_account(settings, "nobody", status="suspended")
    assert scan(settings) == []


def test_set_account_rejects_bad_values(settings):
    accounts.create_key(settings, "acct-1")
    with pytest.raises(ValueError):
        accounts.set_account(settings, "acct-1", status="frozen")
    with pytest.raises(ValueError):
        accounts.set_account(settings, "acct-1")


def test_set_account_changes_fields(settings):
    accounts.create_key(settings, "acct-1")
    account = accounts.set_account(settings, "acct-1", tier="internal", daily_quota_usd=2.5, concurrency=4)
    assert account["tier"] == "internal"
    assert account["daily_quota_nano"] == 2_500_000_000
    assert account["concurrency_limit"] == 4


def test_model_load(settings):
    assert accounts.model_load(settings, "glm-5.3-flash") == 0
    accounts.set_model_load(settings, "glm-5.3-flash", 12)
    assert accounts.model_load(settings, "glm-5.3-flash") == 12
    with pytest.raises(ValueError):
        accounts.set_model_load(settings, "glm-5.3-flash", -1)


# -- unfinished-batch counter --


def test_unfinished_counter_stops_at_the_limit(settings):
    accounts.create_key(settings, "acct-1")
    client = aws.dynamodb()

    def increment() -> None:
        update = accounts_table.unfinished_increment_element(settings, "acct-1", 2)
        client.transact_write_items(TransactItems=[update])

    def decrement() -> None:
        client.transact_write_items(TransactItems=[accounts_table.unfinished_decrement_element(settings, "acct-1")])

    increment()
    increment()
    with pytest.raises(ClientError) as caught:
        increment()
    assert caught.value.response["Error"]["Code"] == "TransactionCanceledException"
    assert account_item(settings, "acct-1")["unfinished"] == {"N": "2"}
    decrement()
    increment()
    decrement()
    decrement()
    assert account_item(settings, "acct-1")["unfinished"] == {"N": "0"}


def test_unfinished_decrement_never_creates_an_account(settings):
    with pytest.raises(ClientError):
        aws.dynamodb().transact_write_items(
            TransactItems=[accounts_table.unfinished_decrement_element(settings, "nobody")]
        )
    assert scan(settings) == []


def test_unfinished_increment_requires_the_account(settings):
    with pytest.raises(ClientError):
        aws.dynamodb().transact_write_items(
            TransactItems=[accounts_table.unfinished_increment_element(settings, "nobody", 10)]
        )
    assert scan(settings) == []


def test_a_chosen_key_too_short_to_resist_brute_force_of_its_hash_is_refused(settings):
    # Keys are stored as unsalted SHA-256: a chosen key needs 32 characters after the prefix
    short = "hyi-" + "a1B2" * 7 + "x"  # 29
    with pytest.raises(ValueError, match="32-256 URL-safe characters"):
        accounts.create_key(settings, "acct-1", key=short)
    # Then nothing was written (no key, no account)
    assert "Item" not in aws.dynamodb().get_item(
        TableName=TABLE, Key={"pk": {"S": f"KEY#{accounts.hash_key(short)}"}, "sk": {"S": "KEY"}})
    assert accounts.create_key(settings, "acct-1", key=short + "yyy") == short + "yyy"
    # And a generated key is longer than the minimum
    assert len(accounts.generate_key()) - len(accounts.KEY_PREFIX) > accounts.CHOSEN_KEY_MIN_CHARS


def test_what_the_functions_may_write_under_account_changes_no_setting(settings):
    # Given a suspended standard account with a small quota (its settings: admin only)
    key = accounts.create_key(settings, "acct-1", tier="standard", daily_quota_usd=1, concurrency=2)
    accounts.set_account(settings, "acct-1", status="suspended")
    # When code with a function's role (writes under ACCOUNT# only) sets settings there
    aws.dynamodb().update_item(
        TableName=TABLE, Key={"pk": {"S": "ACCOUNT#acct-1"}, "sk": {"S": "ACCOUNT"}},
        UpdateExpression="SET #s = :active, tier = :internal, daily_quota_nano = :big, concurrency_limit = :big",
        ExpressionAttributeNames={"#s": "status"},
        ExpressionAttributeValues={":active": {"S": "active"}, ":internal": {"S": "internal"},
                                   ":big": {"N": str(10**15)}})
    # Then the account is still suspended, and the worker's owner check sees the admin's settings
    with pytest.raises(errors.Unauthorized, match="suspended"):
        accounts.authenticate(settings, bearer(key))
    accounts.set_account(settings, "acct-1", status="active")
    principal = accounts.authenticate(settings, bearer(key))
    assert (principal.tier, principal.daily_quota_nano, principal.concurrency_limit) == ("standard", NANO_PER_USD, 2)
    owner = accounts.owner_check(settings, accounts.hash_key(key), "acct-1")
    assert (owner.tier, owner.concurrency_limit) == ("standard", 2)
