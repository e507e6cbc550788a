"""`freeinference-batch admin ...`: API keys, accounts and model load; the local stack's fault counts.

Which deployment the commands act on is decided in one place, `resolve_target`:
1. `--stack-name NAME` (or FREEINFERENCE_STACK_NAME): the deployed CloudFormation stack's
   outputs give the table names; credentials and region come from the usual AWS environment;
2. else `.local-stack/state.json` in the current directory: the environment the running local
   stack wrote there (its moto endpoint, fake credentials, table names) is applied first, so the
   commands work against `freeinference-batch dev` from the repo root with no setup;
3. else the plain environment (ACCOUNTS_TABLE_NAME, AWS_* ...).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any, TypeVar

import boto3
import click
from botocore.exceptions import BotoCoreError, ClientError
from freeinference_batch import accounts
from freeinference_batch.core import aws, errors
from freeinference_batch.core.catalog import NANO_PER_USD, load_catalog
from freeinference_batch.core.settings import Settings

STACK_NAME_ENV = "FREEINFERENCE_STACK_NAME"
LOCAL_STATE_PATH = Path(".local-stack") / "state.json"
# Stack output -> the setting it provides.
STACK_OUTPUTS = {
    "AccountsTableName": "ACCOUNTS_TABLE_NAME",
    "BatchTableName": "BATCH_TABLE_NAME",
    "PayloadBucketName": "PAYLOAD_BUCKET_NAME",
}

F = TypeVar("F", bound=Callable[..., Any])


def resolve_target(
    stack_name: str | None,
    *,
    cwd: str | Path | None = None,
    environ: MutableMapping[str, str] | None = None,
) -> Settings:
    """The Settings the admin commands use (see the module docstring for the order).

    Applying the local stack's environment changes `environ` (default: os.environ) and drops
    cached boto3 clients, so every client built afterwards talks to the local moto server.
    """
    environ = os.environ if environ is None else environ
    if stack_name:
        return Settings(**_stack_outputs(stack_name))
    state_file = Path(cwd or os.getcwd()) / LOCAL_STATE_PATH
    if state_file.is_file():
        environ.update(_local_stack_env(state_file))
        aws.reset_clients()
        return Settings(**{name: value for name, value in environ.items() if name in _setting_aliases()})
    return Settings()


def _setting_aliases() -> set[str]:
    return {field.alias for field in Settings.model_fields.values() if field.alias}


def _stack_outputs(stack_name: str) -> dict[str, str]:
    try:
        stacks = boto3.client("cloudformation").describe_stacks(StackName=stack_name)["Stacks"]
    except (ClientError, BotoCoreError) as error:
        raise click.ClickException(f"Cannot read CloudFormation stack {stack_name!r}: {error}") from error
    outputs = {o["OutputKey"]: o["OutputValue"] for o in (stacks[0].get("Outputs") if stacks else None) or []}
    missing = [key for key in ("AccountsTableName", "BatchTableName") if key not in outputs]
    if missing:
        raise click.ClickException(f"Stack {stack_name!r} has no output {', '.join(missing)}; is it deployed?")
    return {setting: outputs[key] for key, setting in STACK_OUTPUTS.items() if key in outputs}


def _local_stack_env(state_file: Path) -> dict[str, str]:
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
        env = state["env"]
        if not isinstance(env, dict):
            raise TypeError("'env' is not an object")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise click.ClickException(f"Cannot read the local stack's state file {state_file}: {error}") from error
    pid = state.get("pid")
    if isinstance(pid, int) and not _process_alive(pid):
        raise click.ClickException(
            f"{state_file} names a local stack (pid {pid}) that is no longer running: start it with "
            "`freeinference-batch dev`, or delete the file to use the plain environment"
        )
    return {str(name): str(value) for name, value in env.items()}


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _settings(ctx: click.Context) -> Settings:
    """Resolved once per invocation, when a command first needs it (not for --help)."""
    obj = ctx.ensure_object(dict)
    if "settings" not in obj:
        obj["settings"] = resolve_target(obj.get("stack_name"))
    return obj["settings"]


def _clear_errors(command: F) -> F:
    """Turn domain and AWS errors into a one-line message and a non-zero exit."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (ValueError, errors.ApiError) as error:
            raise click.ClickException(str(error)) from error
        except ClientError as error:
            detail = error.response.get("Error", {})
            raise click.ClickException(f"AWS error {detail.get('Code')}: {detail.get('Message')}") from error
        except BotoCoreError as error:
            raise click.ClickException(f"AWS error: {error}") from error

    return wrapper  # type: ignore[return-value]


def _describe_account(account: dict) -> str:
    quota = int(account.get("daily_quota_nano", 0))
    return (
        f"account {account['account_id']}: "
        f"status={account.get('status')} tier={account.get('tier')} "
        f"daily_quota_usd={quota / NANO_PER_USD:g} concurrency={account.get('concurrency_limit')} "
        f"unfinished={account.get('unfinished', 0)}"
    )


_TIER_HELP = "Account tier: internal (may create batches) or standard"


@click.group()
@click.option(
    "--stack-name",
    envvar=STACK_NAME_ENV,
    default=None,
    help=f"Deployed CloudFormation stack to act on (env {STACK_NAME_ENV}); default: the local stack "
    "if .local-stack/state.json exists here, else the plain environment.",
)
@click.option("--region", default=None, help="AWS region of the deployed stack (default: the AWS environment's).")
@click.pass_context
def admin(ctx: click.Context, stack_name: str | None, region: str | None) -> None:
    """Manage API keys, accounts and model load; check an account before a deploy."""
    ctx.ensure_object(dict)["stack_name"] = stack_name
    if region:
        # boto3 reads the region from the environment; every client built from here on uses it.
        os.environ["AWS_DEFAULT_REGION"] = region
        aws.reset_clients()


@admin.command("create-key")
@click.option("--account", "account_id", required=True, help="Account id (created if it does not exist)")
@click.option("--tier", default=None, help=_TIER_HELP)
@click.option("--daily-quota-usd", type=click.FloatRange(min=0), default=None, help="Daily quota in USD")
@click.option("--concurrency", type=click.IntRange(min=0), default=None, help="Concurrent requests allowed")
@click.pass_context
@_clear_errors
def create_key_command(
    ctx: click.Context, account_id: str, tier: str | None, daily_quota_usd: float | None, concurrency: int | None
) -> None:
    """Create an API key; prints only the key (it is stored as a hash and cannot be shown again)."""
    key = accounts.create_key(
        _settings(ctx), account_id, tier=tier, daily_quota_usd=daily_quota_usd, concurrency=concurrency
    )
    click.echo(key)


@admin.command("revoke-key")
@click.option("--hash", "key_hash", default=None, metavar="SHA256",
              help="The key's SHA-256 (64 hex digits), as stored, instead of the key itself")
@click.argument("given", required=False, metavar="")
@click.pass_context
@_clear_errors
def revoke_key_command(ctx: click.Context, key_hash: str | None, given: str | None) -> None:
    """Revoke an API key: calls with it get 401 and its unfinished batches fail.

    The key is read from standard input (`... revoke-key < key.txt`, or typed at a hidden prompt),
    never from the command line, where shell history and `ps` would keep it; or give its hash."""
    if given is not None:  # (not echoed: it is already in the shell's history)
        raise click.UsageError("revoke-key does not take the key on the command line (shell history and `ps` "
                               "keep it): give it on standard input, or its SHA-256 with --hash")
    settings = _settings(ctx)
    if key_hash is not None:
        if not re.fullmatch(r"[0-9a-fA-F]{64}", key_hash):
            raise click.BadParameter("not a SHA-256 in hex (64 hex digits)", param_hint="--hash")
        found, shown = accounts.revoke_key_hash(settings, key_hash), f"with hash {key_hash[:12].lower()}..."
    else:
        key = (click.prompt("API key", hide_input=True) if sys.stdin.isatty() else sys.stdin.readline()).strip()
        if not key:
            raise click.UsageError("Give the key on standard input (or its SHA-256 with --hash)")
        found, shown = accounts.revoke_key(settings, key), key[:8] + "..."
    if not found:
        raise click.ClickException("No such API key")
    click.echo(f"revoked key {shown}", err=True)


@admin.command("set-account")
@click.argument("account_id")
@click.option("--status", type=click.Choice(accounts.ACCOUNT_STATUSES), default=None)
@click.option("--tier", default=None, help=_TIER_HELP)
@click.option("--daily-quota-usd", type=click.FloatRange(min=0), default=None, help="Daily quota in USD")
@click.option("--concurrency", type=click.IntRange(min=0), default=None, help="Concurrent requests allowed")
@click.pass_context
@_clear_errors
def set_account_command(
    ctx: click.Context,
    account_id: str,
    status: str | None,
    tier: str | None,
    daily_quota_usd: float | None,
    concurrency: int | None,
) -> None:
    """Change an existing account's status, tier, daily quota or concurrency."""
    if status is None and tier is None and daily_quota_usd is None and concurrency is None:
        raise click.UsageError("Give at least one of --status, --tier, --daily-quota-usd, --concurrency")
    account = accounts.set_account(
        _settings(ctx),
        account_id,
        status=status,
        tier=tier,
        daily_quota_usd=daily_quota_usd,
        concurrency=concurrency,
    )
    click.echo(_describe_account(account))


@admin.command("migrate-account-settings")
@click.pass_context
@_clear_errors
def migrate_account_settings_command(ctx: click.Context) -> None:
    """Move accounts' settings (status, tier, quota, concurrency) to the items only admins write.

    Run right before deploying the version that reads them there (the running one reads the old
    fields, which this leaves in place) and once more right after; it copies each account that
    has no settings item yet, so running it again changes nothing."""
    copied, kept = accounts.migrate_account_settings(_settings(ctx))
    click.echo(f"{copied} accounts' settings copied; {kept} already had theirs")


@admin.command("set-load")
@click.argument("model")
@click.argument("inflight", type=click.IntRange(min=0))
@click.pass_context
@_clear_errors
def set_load_command(ctx: click.Context, model: str, inflight: int) -> None:
    """Record MODEL's interactive requests in flight (batch capacity shrinks as it grows)."""
    settings = _settings(ctx)
    catalog = load_catalog(settings.model_catalog_path)
    if model not in catalog.models:
        raise click.ClickException(f"Unknown model {model!r}; known: {', '.join(sorted(catalog.models))}")
    accounts.set_model_load(settings, model, inflight)
    click.echo(f"{model}: {inflight} interactive requests in flight")


@admin.command("preflight")
@click.option("--template", "template_path", type=click.Path(exists=True, dir_okay=False), default="template.yaml",
              show_default=True, help="The template to deploy")
@click.pass_context
@_clear_errors
def preflight_command(ctx: click.Context, template_path: str) -> None:
    """Check the account before a deploy (Lambda concurrency: the unreserved pool must stay >= 100)
    and, with --stack-name, the deployed stack (the upstream credential was put in its secret)."""
    from freeinference_batch_local.cloudformation.template import load_template  # PyYAML: the dev install has it

    from freeinference_batch_client.cli import preflight

    clients = {name: boto3.client(name) for name in ("lambda", "cloudformation", "secretsmanager")}
    findings = preflight.run(load_template(template_path), ctx.obj.get("stack_name"), clients)
    for finding in findings:
        click.echo(f"{'ok  ' if finding.ok else 'FAIL'} {finding.message}")
    if not all(finding.ok for finding in findings):
        raise SystemExit(1)


@admin.command("faults")
@click.pass_context
def faults_command(ctx: click.Context) -> None:
    """Print, as one JSON object, how many AWS faults of each name the local stack running here
    has injected (LOCAL_AWS_FAULTS; names not turned on count 0)."""
    from freeinference_batch_local.aws_faults.config import FAULTS_PATH

    if ctx.obj.get("stack_name"):
        raise click.ClickException("Only the local stack injects AWS faults; a deployed stack has none to count")
    state_file = Path.cwd() / LOCAL_STATE_PATH
    if not state_file.is_file():
        raise click.ClickException(
            f"No local stack here ({LOCAL_STATE_PATH} not found): run this from where `freeinference-batch dev` runs"
        )
    endpoint = _local_stack_env(state_file).get("AWS_ENDPOINT_URL")
    if not endpoint:
        raise click.ClickException(f"{state_file} names no moto server (AWS_ENDPOINT_URL)")
    try:
        # (bandit's B310, urlopen: the URL is the local stack's own moto endpoint from its state file.)
        with urllib.request.urlopen(endpoint.rstrip("/") + FAULTS_PATH, timeout=30) as answer:  # nosec B310
            counts = json.loads(answer.read())
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise click.ClickException(f"Cannot read the fault counts from the local stack's moto server {endpoint}: "
                                   f"{error}") from error
    click.echo(json.dumps(counts))


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


@admin.command("status")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of tables")
@click.pass_context
@_clear_errors
def status_command(ctx: click.Context, as_json: bool) -> None:
    """The service now: per model the batch cap (after interactive load and upstream backoff),
    slots held, requests queued and running, completions and failures in the last 5 and 60
    minutes and the backlog's drain time; per account with unfinished batches, their number and
    today's usage against the quota; the batches waiting (none of their requests can start), why
    and since when. Counts of the last minutes come from CloudWatch (the
    workers' per-model metrics; the local stack forwards them to its moto server), the rest
    from the tables."""
    import time

    from freeinference_batch.core import clock
    from freeinference_batch.ops.operator_status import operator_status, recent_counts

    settings = _settings(ctx)
    catalog = load_catalog()
    now = clock.now(settings.clock_offset_file)
    # CloudWatch is asked in wall-clock time: metrics are stamped when they were published.
    recent = recent_counts(sorted(catalog.models), time.time())
    status = operator_status(settings, catalog, now, recent)
    if as_json:
        click.echo(json.dumps(status.as_dict(), indent=2))
        return
    rows = [("model", "cap", "of", "load", "slots", "queued", "running", "done 5m", "failed 5m", "done 60m",
             "failed 60m", "drain")]
    for model in status.models:
        rows.append((model.model, str(model.batch_cap) + (" (backoff)" if model.backed_off else ""),
                     str(model.configured_cap), str(model.interactive_inflight), str(model.slots_held),
                     str(model.requests_queued), str(model.requests_running), str(model.completed_5m),
                     str(model.failed_5m), str(model.completed_60m), str(model.failed_60m),
                     _minutes(model.drain_seconds)))
    _echo_table(rows)
    click.echo("")
    accounts = [("account", "unfinished batches", "usage today (USD)", "daily quota (USD)")]
    for account in status.accounts:
        quota = f"{account.daily_quota_usd:.2f}" if account.daily_quota_usd is not None else "-"
        accounts.append((account.account_id, str(account.unfinished_batches), f"{account.usage_usd_today:.6f}", quota))
    if len(accounts) == 1:
        click.echo("no account has an unfinished batch")
    else:
        _echo_table(accounts)
    if status.waiting:
        click.echo("")
        waiting = [("waiting batch", "account", "reason", "since (UTC)")]
        for batch in status.waiting:
            since = dt.datetime.fromtimestamp(batch.since, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
            waiting.append((batch.batch_id, batch.account_id, batch.reason, since))
        _echo_table(waiting)


def _echo_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
