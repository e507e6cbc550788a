"""`freeinference-batch status / list / cancel / delete`: a batch id, or every batch of a job
manifest; `retry`: a batch id."""

from __future__ import annotations

import json
import time

import click
from freeinference_batch.core.schemas import RETRYABLE_STATUSES

from freeinference_batch_client.cli.common import (
    Target,
    describe_counts,
    echo_err,
    format_time,
    friendly_errors,
    make_client,
    part_lines,
)
from freeinference_batch_client.errors import BatchApiError
from freeinference_batch_client.models import Batch
from freeinference_batch_client.progress import NOT_RUNNING, duration, progress, rate_text, waiting_message


@click.command()
@click.argument("target")
@click.option("--json", "as_json", is_flag=True, help="Print the batch objects as JSON, one per line.")
@friendly_errors
def status(target: str, as_json: bool) -> None:
    """Show a batch ID, or every batch of a job MANIFEST."""
    job = Target(target)
    client = make_client()
    job.check_base_url(client)
    for batch_id in job.batch_ids:
        batch = client.retrieve(batch_id)
        if as_json:
            click.echo(json.dumps(batch.model_dump(mode="json")))
            continue
        lines = job.lines_of(batch_id)
        click.echo(f"{batch.id}  {batch.status:<11}  {describe_counts(batch)}" + (f"  ({lines})" if lines else ""))
        if batch.error is not None:
            click.echo(f"    failed: {batch.error.code}: {batch.error.message}")
        if (rate := progress_line(batch, time.time())) is not None:
            click.echo(f"    rate: {rate}")
        if (message := waiting_message(batch)) is not None:
            click.echo(f"    waiting: {message}")
    if job.manifest is not None:
        for part in job.manifest.parts:
            if not part.batch_id:
                click.echo(f"(not created)  {part_lines(part)}: run submit again to create it")


def progress_line(batch: Batch, now: float) -> str | None:
    """What `status` says of a batch still running: its rate and when it should be done, from this
    one read (progress.py); None for a batch that runs nothing more."""
    if batch.status in NOT_RUNNING:
        return None
    estimate = progress(batch, now)
    if estimate is None:
        return "not enough progress yet (no request has finished)"
    line = (f"{rate_text(estimate.per_minute)} requests a minute over {duration(estimate.running_seconds)} "
            f"running; {estimate.remaining} to go, done about {format_time(int(estimate.finish_at))} "
            f"(in {duration(estimate.finish_at - now)})")
    if estimate.after_window(batch.expires_at):
        line += (f"; but its completion window closes first, at {format_time(batch.expires_at)}: what has "
                 "not started by then expires")
    return line


@click.command(name="list")
@click.option("--limit", type=click.IntRange(1, 100), default=20, show_default=True)
@click.option("--after", default=None, help="Start after this batch id (the last one of the previous page).")
@click.option("--json", "as_json", is_flag=True, help="Print the batch objects as JSON, one per line.")
@friendly_errors
def list_batches(limit: int, after: str | None, as_json: bool) -> None:
    """List your batches, newest first."""
    page = make_client().list(limit=limit, after=after)
    for batch in page.data:
        if as_json:
            click.echo(json.dumps(batch.model_dump(mode="json")))
        else:
            click.echo(f"{batch.id}  {batch.status:<11}  {format_time(batch.created_at)}  {describe_counts(batch)}")
    if page.has_more and not as_json:
        echo_err(f"(more: --after {page.last_id})")


@click.command()
@click.argument("target")
@friendly_errors
def cancel(target: str) -> None:
    """Cancel a batch ID, or every batch of a job MANIFEST."""
    job = Target(target)
    client = make_client()
    job.check_base_url(client)
    for batch_id in job.batch_ids:
        batch = client.cancel(batch_id)
        click.echo(f"{batch.id}  {batch.status:<11}  {describe_counts(batch)}")


def _statuses(_: click.Context, __: click.Parameter, value: str | None) -> list[str] | None:
    if value is None:
        return None
    statuses = [part.strip() for part in value.split(",") if part.strip()]
    unknown = [status for status in statuses if status not in RETRYABLE_STATUSES]
    if not statuses or unknown:
        raise click.BadParameter(f"give statuses from {', '.join(RETRYABLE_STATUSES)}, separated by commas"
                                 + (f" (not {', '.join(unknown)})" if unknown else ""))
    return statuses


@click.command()
@click.argument("batch_id")
@click.option("--status", "statuses", callback=_statuses, metavar="STATUS[,STATUS...]",
              help="Which requests to run again, by their result status: failed, expired, cancelled, completed "
                   "[default: failed,expired].")
@click.option("--json", "as_json", is_flag=True, help="Print the new batch object as JSON.")
@friendly_errors
def retry(batch_id: str, statuses: list[str] | None, as_json: bool) -> None:
    """Run a finished BATCH_ID's failed and expired requests again, as a new batch (its id is printed)."""
    batch = make_client().retry(batch_id, statuses)
    if as_json:
        click.echo(json.dumps(batch.model_dump(mode="json")))
        return
    click.echo(f"{batch.id}  {batch.status:<11}  {describe_counts(batch)}  (retry of {batch.retry_of})")
    echo_err(f"Later: freeinference-batch results {batch.id} --merged -o out.jsonl (every request of "
             f"{batch.retry_of}, each with its latest outcome)")


@click.command()
@click.argument("target")
@friendly_errors
def delete(target: str) -> None:
    """Delete a batch ID, or every batch of a job MANIFEST, with their results."""
    job = Target(target)
    client = make_client()
    job.check_base_url(client)
    problems = 0
    for batch_id in job.batch_ids:
        try:
            client.delete(batch_id)
        except BatchApiError as error:
            if error.status == 404 and job.manifest is not None:
                click.echo(f"{batch_id}  already gone")
                continue
            problems += 1
            echo_err(f"{batch_id}: not deleted: {error.message}")
            continue
        click.echo(f"{batch_id}  deleted")
    if problems:
        raise click.exceptions.Exit(1)
