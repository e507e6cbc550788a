"""`freeinference-batch admin ...` on moto: each command, and how the target is chosen."""

from __future__ import annotations

import json
import re
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber
from click.testing import CliRunner
from freeinference_batch import accounts
from freeinference_batch.core import aws, errors
from freeinference_batch.core.catalog import NANO_PER_USD
from freeinference_batch.core.settings import Settings
from freeinference_batch_client.cli import main, preflight
from freeinference_batch_client.cli.admin import resolve_target
from freeinference_batch_local.cloudformation.template import load_template
from moto import mock_aws

ACCOUNTS_TABLE = "cli-accounts"
BATCH_TABLE = "cli-batch"
KEY_LINE = re.compile(r"^hyi-[A-Za-z0-9_\-]{43}\n$")


def create_table(name: str) -> None:
    boto3.client("dynamodb").create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    # Run from an empty directory: a local stack state file in the repo must not be picked up.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("ACCOUNTS_TABLE_NAME", ACCOUNTS_TABLE)
    monkeypatch.setenv("BATCH_TABLE_NAME", BATCH_TABLE)
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "FREEINFERENCE_STACK_NAME", "BATCH_CLOCK_OFFSET_FILE"):
        monkeypatch.delenv(name, raising=False)
    with mock_aws():
        aws.reset_clients()
        create_table(ACCOUNTS_TABLE)
        yield tmp_path
        aws.reset_clients()


@pytest.fixture
def settings(aws_env) -> Settings:
    return Settings()


def run(*args: str):
    return CliRunner().invoke(main, ["admin", *args], catch_exceptions=False)


def account(settings: Settings, account_id: str, table: str = ACCOUNTS_TABLE) -> dict:
    """The account's settings item (what the admin sets)."""
    key = {"pk": {"S": f"SETTINGS#{account_id}"}, "sk": {"S": "SETTINGS"}}
    return aws.dynamodb().get_item(TableName=table, Key=key).get("Item", {})


# -- create-key --


def test_create_key_prints_only_the_key_and_stores_its_hash(settings):
    result = run(
        "create-key", "--account", "acct-1", "--tier", "internal", "--daily-quota-usd", "2.5", "--concurrency", "3"
    )
    assert result.exit_code == 0, result.output
    assert KEY_LINE.match(result.stdout), repr(result.stdout)
    key = result.stdout.strip()
    principal = accounts.authenticate(settings, {"Authorization": f"Bearer {key}"})
    assert principal.account_id == "acct-1"
    assert principal.tier == "internal"
    assert principal.daily_quota_nano == 2_500_000_000
    assert principal.concurrency_limit == 3
    items = aws.dynamodb().scan(TableName=ACCOUNTS_TABLE)["Items"]
    assert key not in repr(items)


def test_create_key_defaults(settings):
    key = run("create-key", "--account", "acct-2").stdout.strip()
    principal = accounts.authenticate(settings, {"X-API-Key": key})
    assert (principal.tier, principal.daily_quota_nano, principal.concurrency_limit) == (
        "standard",
        100 * NANO_PER_USD,
        16,
    )


def test_create_key_requires_an_account(settings):
    result = CliRunner().invoke(main, ["admin", "create-key"])
    assert result.exit_code != 0
    assert "--account" in result.output


# -- revoke-key --


def test_revoke_key_reads_the_key_from_standard_input(settings):
    key = run("create-key", "--account", "acct-1").stdout.strip()
    result = CliRunner().invoke(main, ["admin", "revoke-key"], input=key + "\n", catch_exceptions=False)
    assert result.exit_code == 0
    assert result.stdout == ""
    state = accounts.owner_check(settings, accounts.hash_key(key), "acct-1")
    assert state.reason == "API key has been revoked"


def test_revoke_key_by_its_hash(settings):
    key = run("create-key", "--account", "acct-1").stdout.strip()
    result = run("revoke-key", "--hash", accounts.hash_key(key).upper())
    assert result.exit_code == 0
    assert accounts.owner_check(settings, accounts.hash_key(key), "acct-1").reason == "API key has been revoked"


def test_revoke_key_never_takes_the_key_on_the_command_line(settings):
    # Shell history and `ps` keep a command line: the raw key is refused there
    key = run("create-key", "--account", "acct-1").stdout.strip()
    result = CliRunner().invoke(main, ["admin", "revoke-key", key])
    assert result.exit_code == 2 and key not in result.output
    assert "revoked" not in str(accounts.owner_check(settings, accounts.hash_key(key), "acct-1").reason)
    assert run("revoke-key", "--hash", "not-a-hash").exit_code == 2


def test_revoke_unknown_key_fails_clearly(settings):
    result = CliRunner().invoke(main, ["admin", "revoke-key"], input="hyi-neverIssuedNeverIssued\n")
    assert result.exit_code == 1
    assert "No such API key" in result.output
    assert run("revoke-key", "--hash", "0" * 64).exit_code == 1


# -- set-account --


def test_set_account_changes_stored_fields(settings):
    run("create-key", "--account", "acct-1")
    result = run(
        "set-account",
        "acct-1",
        "--status",
        "suspended",
        "--tier",
        "internal",
        "--daily-quota-usd",
        "7",
        "--concurrency",
        "2",
    )
    assert result.exit_code == 0, result.output
    assert "status=suspended" in result.stdout
    item = account(settings, "acct-1")
    assert item["status"] == {"S": "suspended"}
    assert item["tier"] == {"S": "internal"}
    assert item["daily_quota_nano"] == {"N": str(7 * NANO_PER_USD)}
    assert item["concurrency_limit"] == {"N": "2"}


def test_set_account_of_missing_account_fails(settings):
    result = run("set-account", "nobody", "--status", "active")
    assert result.exit_code == 1
    assert "does not exist" in result.output
    assert account(settings, "nobody") == {}


def test_set_account_needs_a_change(settings):
    run("create-key", "--account", "acct-1")
    result = CliRunner().invoke(main, ["admin", "set-account", "acct-1"])
    assert result.exit_code == 2
    assert "at least one" in result.output


def test_set_account_rejects_unknown_status(settings):
    result = CliRunner().invoke(main, ["admin", "set-account", "acct-1", "--status", "frozen"])
    assert result.exit_code == 2


# -- migrate-account-settings --


def test_migrate_account_settings_copies_an_old_account_once_and_then_it_authenticates(settings):
    # Given an account written before its settings moved (on its ACCOUNT item only), with a key
    old = {"pk": {"S": "ACCOUNT#old"}, "sk": {"S": "ACCOUNT"}, "account_id": {"S": "old"},
           "status": {"S": "active"}, "tier": {"S": "internal"}, "daily_quota_nano": {"N": str(3 * NANO_PER_USD)},
           "concurrency_limit": {"N": "5"}, "unfinished": {"N": "1"}, "created_at": {"N": "1700000000"}}
    aws.dynamodb().put_item(TableName=ACCOUNTS_TABLE, Item=old)
    key = run("create-key", "--account", "new", "--tier", "internal").stdout.strip()
    old_key = "hyi-" + "o" * 40
    aws.dynamodb().put_item(TableName=ACCOUNTS_TABLE, Item={
        "pk": {"S": f"KEY#{accounts.hash_key(old_key)}"}, "sk": {"S": "KEY"}, "account_id": {"S": "old"},
        "status": {"S": "active"}, "created_at": {"N": "1700000000"}})
    # Its key is refused until it moves (this version reads only the settings item)
    with pytest.raises(errors.Unauthorized):
        accounts.authenticate(settings, {"X-API-Key": old_key})

    # When the migration runs, twice
    first, second = run("migrate-account-settings"), run("migrate-account-settings")

    # Then it copied the old account once (the new one has its settings already), and its key works
    assert first.exit_code == 0, first.output
    assert first.stdout.strip() == "1 accounts' settings copied; 1 already had theirs"
    assert second.stdout.strip() == "0 accounts' settings copied; 2 already had theirs"
    principal = accounts.authenticate(settings, {"X-API-Key": old_key})
    assert (principal.tier, principal.daily_quota_nano, principal.concurrency_limit) == (
        "internal", 3 * NANO_PER_USD, 5)
    assert account(settings, "old")["created_at"] == {"N": "1700000000"}
    assert accounts.authenticate(settings, {"X-API-Key": key}).account_id == "new"
    # And a change made after it is not undone by running it again
    run("set-account", "old", "--tier", "standard")
    run("migrate-account-settings")
    assert accounts.authenticate(settings, {"X-API-Key": old_key}).tier == "standard"


# -- set-load --


def test_set_load(settings):
    result = run("set-load", "glm-5.3-flash", "40")
    assert result.exit_code == 0, result.output
    assert accounts.model_load(settings, "glm-5.3-flash") == 40
    assert run("set-load", "glm-5.3-flash", "0").exit_code == 0
    assert accounts.model_load(settings, "glm-5.3-flash") == 0


def test_set_load_of_unknown_model_fails(settings):
    result = run("set-load", "no-such-model", "3")
    assert result.exit_code == 1
    assert "Unknown model" in result.output
    assert CliRunner().invoke(main, ["admin", "set-load", "glm-5.3-flash", "-1"]).exit_code == 2


# -- target selection --


def test_local_stack_state_file_is_applied(aws_env, monkeypatch):
    # Given a local stack state file naming other tables (no endpoint: moto's mock serves them)
    create_table("local-accounts")
    state = {"env": {"ACCOUNTS_TABLE_NAME": "local-accounts", "BATCH_TABLE_NAME": "local-batch"}}
    (aws_env / ".local-stack").mkdir()
    (aws_env / ".local-stack" / "state.json").write_text(json.dumps(state))
    for name in state["env"]:
        monkeypatch.setenv(name, "restored-after-the-test")
    # When
    result = run("create-key", "--account", "acct-local")
    # Then the key went to the local stack's table
    assert result.exit_code == 0, result.output
    assert account(Settings(), "acct-local", table="local-accounts")
    assert account(Settings(), "acct-local", table=ACCOUNTS_TABLE) == {}


def test_resolve_target_applies_the_local_stack_environment(tmp_path):
    env = {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:4566",
        "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local",
        "AWS_DEFAULT_REGION": "us-east-1",
        "ACCOUNTS_TABLE_NAME": "acc-local",
        "BATCH_TABLE_NAME": "batch-local",
    }
    (tmp_path / ".local-stack").mkdir()
    (tmp_path / ".local-stack" / "state.json").write_text(json.dumps({"env": env, "base_url": "x"}))
    environ: dict[str, str] = {"UNRELATED": "1"}
    settings = resolve_target(None, cwd=tmp_path, environ=environ)
    assert settings.accounts_table_name == "acc-local"
    assert settings.batch_table_name == "batch-local"
    assert environ == {"UNRELATED": "1", **env}


def test_stale_local_stack_state_file_is_refused(aws_env):
    (aws_env / ".local-stack").mkdir()
    state = {"env": {"ACCOUNTS_TABLE_NAME": "x"}, "pid": 2**22 + 12345}
    (aws_env / ".local-stack" / "state.json").write_text(json.dumps(state))
    result = run("create-key", "--account", "acct-1")
    assert result.exit_code == 1
    assert "no longer running" in result.output


def test_plain_environment_without_state_file(aws_env):
    settings = resolve_target(None, cwd=aws_env, environ={})
    assert settings.accounts_table_name == ACCOUNTS_TABLE


STACK_TEMPLATE = {
    "Resources": {
        "AccountsTable": {
            "Type": "AWS::DynamoDB::Table",
            "Properties": {
                "TableName": "stack-accounts",
                "BillingMode": "PAY_PER_REQUEST",
                "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
                "AttributeDefinitions": [
                    {"AttributeName": "pk", "AttributeType": "S"},
                    {"AttributeName": "sk", "AttributeType": "S"},
                ],
            },
        }
    },
    "Outputs": {
        "AccountsTableName": {"Value": {"Ref": "AccountsTable"}},
        "BatchTableName": {"Value": "stack-batch"},
    },
}


@pytest.mark.parametrize("via_env", [False, True])
def test_stack_name_reads_the_deployed_stack_outputs(aws_env, monkeypatch, via_env):
    boto3.client("cloudformation").create_stack(StackName="fib-prod", TemplateBody=json.dumps(STACK_TEMPLATE))
    if via_env:
        monkeypatch.setenv("FREEINFERENCE_STACK_NAME", "fib-prod")
        result = run("create-key", "--account", "acct-prod")
    else:
        result = run("--stack-name", "fib-prod", "create-key", "--account", "acct-prod")
    assert result.exit_code == 0, result.output
    assert KEY_LINE.match(result.stdout)
    assert account(Settings(), "acct-prod", table="stack-accounts")
    assert account(Settings(), "acct-prod", table=ACCOUNTS_TABLE) == {}
    settings = resolve_target("fib-prod")
    assert (settings.accounts_table_name, settings.batch_table_name) == ("stack-accounts", "stack-batch")


def test_unknown_stack_fails_clearly(aws_env):
    result = run("--stack-name", "no-such-stack", "create-key", "--account", "a")
    assert result.exit_code == 1
    assert "no-such-stack" in result.output


def test_help_needs_no_target(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["admin", "--stack-name", "does-not-matter", "create-key", "--help"])
    assert result.exit_code == 0
    assert "--account" in result.output


def test_missing_table_is_a_clear_error(aws_env, monkeypatch):
    monkeypatch.setenv("ACCOUNTS_TABLE_NAME", "no-such-table")
    result = run("create-key", "--account", "acct-1")
    assert result.exit_code == 1
    assert "AWS error ResourceNotFoundException" in result.output


def test_main_lists_admin_and_dev():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    assert "admin" in result.output and "dev" in result.output


# -- preflight (moto has no Lambda GetAccountSettings: the AWS clients are stubbed) --

TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"
SECRET_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:upstream-AbCdEf"


def reserved_by_template() -> int:
    return sum(preflight.template_reserved_concurrency(load_template(TEMPLATE)).values())


@pytest.fixture
def stubbed(aws_env, monkeypatch):
    """The clients `admin preflight` builds, each with a botocore Stubber to queue answers on."""
    clients = {name: boto3.client(name, region_name="us-east-1") for name in ("lambda", "cloudformation",
                                                                               "secretsmanager")}
    stubs = {name: Stubber(client) for name, client in clients.items()}
    monkeypatch.setattr(boto3, "client", lambda name, *a, **k: clients[name])
    for stub in stubs.values():
        stub.activate()
    yield stubs
    for stub in stubs.values():
        stub.assert_no_pending_responses()


def account_settings(limit: int, unreserved: int) -> dict:
    return {"AccountLimit": {"ConcurrentExecutions": limit, "UnreservedConcurrentExecutions": unreserved}}


def no_stack(stubs, name: str = "fib") -> None:
    stubs["cloudformation"].add_client_error("list_stack_resources", "ValidationError",
                                             f"Stack with id {name} does not exist")


def test_preflight_refuses_an_account_whose_pool_would_drop_below_100(stubbed):
    # Given a new account's quota of 10 concurrent executions, and no stack yet
    no_stack(stubbed)
    stubbed["lambda"].add_response("get_account_settings", account_settings(10, 10))
    # When the preflight runs
    result = run("--stack-name", "fib", "--region", "us-east-1", "preflight", "--template", str(TEMPLATE))
    # Then it fails, saying what the template reserves and what to ask for
    assert result.exit_code == 1, result.output
    assert f"the template reserves {reserved_by_template()}" in result.output
    assert f"unreserved after deploy {10 - reserved_by_template()}" in result.output
    assert preflight.CONCURRENCY_QUOTA_CODE in result.output
    assert f"at least {reserved_by_template() + 100}" in result.output
    assert "not deployed yet" in result.output


def test_preflight_passes_an_account_with_room_before_the_first_deploy(stubbed):
    stubbed["lambda"].add_response("get_account_settings", account_settings(1000, 1000))
    result = run("preflight", "--template", str(TEMPLATE))
    assert result.exit_code == 0, result.output
    assert result.output.startswith("ok   Lambda concurrency: account quota 1000, unreserved now 1000")
    # And it states the worst slot time of one request (eight whole timeouts) and how to shorten it
    assert ("ok   Slot time: a request whose every call times out holds a slot of its model for 8 x 600 s "
            "= 80 min at worst") in result.output
    assert "UpstreamTimeoutSeconds=N" in result.output


def test_preflight_counts_what_the_deployed_stack_holds_and_checks_the_secret(stubbed):
    # Given a deployed stack whose workers hold the template's reservations, leaving exactly 100,
    # and whose secret still holds CloudFormation's placeholder
    reserved = reserved_by_template()
    # (a model's worker lives in the model's nested stack)
    nested = "arn:aws:cloudformation:us-east-1:123456789012:stack/fib-GlmFlashModel-X/1"
    stubbed["cloudformation"].add_response("list_stack_resources", {"StackResourceSummaries": [
        {"LogicalResourceId": "GlmFlashModel", "PhysicalResourceId": nested,
         "ResourceType": "AWS::CloudFormation::Stack",
         "LastUpdatedTimestamp": "2026-12-01T00:00:00Z", "ResourceStatus": "CREATE_COMPLETE"}]})
    stubbed["cloudformation"].add_response("list_stack_resources", {"StackResourceSummaries": [
        {"LogicalResourceId": "W", "PhysicalResourceId": "fib-W", "ResourceType": "AWS::Lambda::Function",
         "LastUpdatedTimestamp": "2026-12-01T00:00:00Z", "ResourceStatus": "CREATE_COMPLETE"}]},
        {"StackName": nested})
    stubbed["lambda"].add_response("get_account_settings", account_settings(100 + reserved, 100))
    stubbed["lambda"].add_response("get_function_concurrency", {"ReservedConcurrentExecutions": reserved},
                                   {"FunctionName": "fib-W"})
    stubbed["cloudformation"].add_response("describe_stacks", {"Stacks": [{
        "StackName": "fib", "CreationTime": "2026-12-01T00:00:00Z", "StackStatus": "CREATE_COMPLETE",
        "Outputs": [{"OutputKey": "UpstreamApiKeySecretArn", "OutputValue": SECRET_ARN}]}]})
    stubbed["secretsmanager"].add_response("list_secret_version_ids", {"Versions": [
        {"VersionId": "v1" * 16, "VersionStages": ["AWSCURRENT"]}]})
    # When the preflight runs against it
    result = run("--stack-name", "fib", "preflight", "--template", str(TEMPLATE))
    # Then the concurrency is fine (what the stack holds comes back on update) but the secret is not set
    assert result.exit_code == 1, result.output
    assert "ok   Lambda concurrency" in result.output and "unreserved after deploy 100" in result.output
    assert "FAIL Upstream credential" in result.output and "placeholder" in result.output


def test_concurrency_after_deploy_counts_the_stacks_own_reservations():
    check = preflight.Concurrency(account_limit=1000, unreserved_now=104, template_reserves=24, stack_reserves_now=16)
    assert check.unreserved_after == 96
    # 880 reserved by other functions of the account, 24 for the template, 100 left unreserved
    assert not check.finding().ok and "at least 1004" in check.finding().message
