"""The user commands of `freeinference-batch`: submit, status, list, cancel, delete, results,
and `webhooks add/list/delete/test` (the account's webhook endpoints).

They speak OpenAI's batch files: `submit` takes an OpenAI batch input file (JSONL), checks it
with the server's own rules, splits it into as many batches as the limits require and records
them in a manifest (so an interrupted submit resumes without creating anything twice);
`results` writes OpenAI's output-file format, in submission order across the job's batches.

The API key comes from FREEINFERENCE_API_KEY, the base URL from FREEINFERENCE_BASE_URL (default
https://freeinference.org/v1). `status`, `cancel`, `delete` and `results` take a batch id or a
manifest file.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import click
from freeinference_batch.core.catalog import load_catalog

from freeinference_batch_client import openai_files
from freeinference_batch_client.client import (
    API_KEY_ENV,
    BASE_URL_ENV,
    WEBHOOK_EVENT_TYPES,
    Batch,
    BatchApiError,
    BatchClient,
    BatchClientError,
    WebhookEndpoint,
)
from freeinference_batch_client.openai_files import InputFileError, Manifest

F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_POLL_SECONDS = 5.0
# How far before the manifest's creation an adopted batch may have been created (clock skew).
ADOPT_SKEW_SECONDS = 600


# ---- shared -------------------------------------------------------------------------------


def _friendly(function: F) -> F:
    """API and connection errors as one clear line and exit code 1, not a traceback."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except BatchApiError as error:
            raise click.ClickException(f"the API answered {error.status} ({error.code or 'error'}): "
                                       f"{error.message}") from None
        except BatchClientError as error:
            raise click.ClickException(str(error)) from None

    return wrapper  # type: ignore[return-value]


def make_client() -> BatchClient:
    if not os.environ.get(API_KEY_ENV):
        raise click.ClickException(
            f"{API_KEY_ENV} is not set. Export your FreeInference API key first, e.g.\n"
            f"  export {API_KEY_ENV}=hyi-...\n"
            "(`freeinference-batch dev` prints a key for the local stack, and its base URL for "
            f"{BASE_URL_ENV}.)"
        )
    return BatchClient()


def _echo_err(message: str) -> None:
    click.echo(message, err=True)


class Target:
    """A command's argument: one batch id, or a manifest file and the batches it records."""

    def __init__(self, value: str) -> None:
        self.value = value
        self.manifest: Manifest | None = None
        self.manifest_path: Path | None = None
        if openai_files.is_manifest_file(value):
            self.manifest_path = Path(value)
            try:
                self.manifest = Manifest.load(value)
            except ValueError as error:
                raise click.ClickException(f"{value} is not a readable manifest: {error}") from None
            self.batch_ids = self.manifest.batch_ids()
        elif Path(value).exists():
            raise click.ClickException(f"{value} is a file but not a job manifest (no 'job_id' and 'parts')")
        else:
            self.batch_ids = [value]

    def check_base_url(self, client: BatchClient) -> None:
        if self.manifest is not None and self.manifest.base_url.rstrip("/") != client.base_url:
            raise click.ClickException(
                f"{self.manifest_path} records batches of {self.manifest.base_url}, but {BASE_URL_ENV} "
                f"points at {client.base_url}; set {BASE_URL_ENV}={self.manifest.base_url}"
            )

    def require_complete(self, command: str) -> None:
        if self.manifest is not None and not self.manifest.complete:
            missing = sum(1 for part in self.manifest.parts if not part.batch_id)
            raise click.ClickException(
                f"{missing} of the {len(self.manifest.parts)} batches of {self.manifest_path} were never created; "
                f"run `freeinference-batch submit {self.manifest.input} --manifest {self.manifest_path}` to finish "
                f"submitting, then {command} again"
            )

    def count_of(self, batch_id: str) -> int | None:
        if self.manifest is not None:
            for part in self.manifest.parts:
                if part.batch_id == batch_id:
                    return part.count
        return None

    def lines_of(self, batch_id: str) -> str:
        if self.manifest is not None:
            for part in self.manifest.parts:
                if part.batch_id == batch_id:
                    return _lines(part)
        return ""


def _lines(part: openai_files.Part) -> str:
    if part.first_line == part.last_line:
        return f"line {part.first_line}"
    return f"lines {part.first_line}-{part.last_line}"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _counts(batch: Batch) -> str:
    counts = batch.request_counts
    return f"{counts.completed} completed, {counts.failed} failed, {counts.total} total"


def _when(timestamp: int | None) -> str:
    if timestamp is None:
        return "-"
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _parse_metadata(pairs: tuple[str, ...]) -> dict[str, str] | None:
    if not pairs:
        return None
    metadata: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--metadata")
        metadata[name] = value
    return metadata


def _report_input_errors(path: Path, error: InputFileError) -> None:
    count = len(error.errors)
    _echo_err(f"{path}: {count}{'+' if error.more else ''} problem{'s' if count != 1 else ''}; "
              "nothing was submitted.")
    for message in error.errors:
        _echo_err(f"  {message}")
    raise click.exceptions.Exit(1)


# ---- submit -------------------------------------------------------------------------------


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--wait", is_flag=True, help="Wait for every batch to finish, with a progress bar per batch.")
@click.option("--manifest", "manifest_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to record the job's batches [default: FILE.manifest.json]. Run the same submit "
                   "again to resume an interrupted one.")
@click.option("--metadata", "metadata_pairs", multiple=True, metavar="KEY=VALUE",
              help="Metadata for every batch of the job (repeat for several pairs; at most 14).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the results, in OpenAI's output-file format, once done (implies --wait).")
@click.option("--errors", "errors_path", type=click.Path(dir_okay=False, path_type=Path),
              help="With -o: write the requests that did not succeed here instead.")
@click.option("--max-requests", type=click.IntRange(min=1), default=openai_files.DEFAULT_MAX_REQUESTS,
              show_default=True, help="Requests per batch (the service's limit).")
@click.option("--max-body-bytes", type=click.IntRange(min=1), default=openai_files.DEFAULT_MAX_BODY_BYTES,
              show_default=True, help="Bytes of one create body (the service's limit).")
@click.option("--catalog", "catalog_path", type=click.Path(exists=True, dir_okay=False),
              help="Check model ids against this models.json instead of the packaged catalog.")
@click.option("--dry-run", is_flag=True, help="Check the file and show how it would be split; submit nothing.")
@click.option("--poll-interval", type=click.FloatRange(min=0.01), default=DEFAULT_POLL_SECONDS,
              show_default=True, help="Seconds between status checks while waiting.")
@_friendly
def submit(
    file: Path,
    wait: bool,
    manifest_path: Path | None,
    metadata_pairs: tuple[str, ...],
    output: Path | None,
    errors_path: Path | None,
    max_requests: int,
    max_body_bytes: int,
    catalog_path: str | None,
    dry_run: bool,
    poll_interval: float,
) -> None:
    """Submit an OpenAI batch input file (one {custom_id, method, url, body} per line).

    The file is checked first with the service's rules; any problem is reported with its line
    number and nothing is submitted. The job is split into as many batches as the limits require.
    """
    if errors_path is not None and output is None:
        raise click.UsageError("--errors needs -o/--output")
    metadata = _parse_metadata(metadata_pairs)
    # Sized for the largest metadata a part will carry (the job's two keys included).
    widest = openai_files.job_metadata(metadata, "job_" + "0" * 32, 99_998, 99_999)
    try:
        openai_files.check_metadata(widest)
    except InputFileError as error:
        raise click.BadParameter(f"{error} (the job's own two keys included)", param_hint="--metadata") from None
    try:
        items = openai_files.load_requests(file, load_catalog(catalog_path or ""))
        parts = openai_files.plan_parts(items, max_requests, max_body_bytes, widest)
    except InputFileError as error:
        _report_input_errors(file, error)
    if dry_run:
        click.echo(f"{file}: {len(items)} requests, OK; {len(parts)} batch{'es' if len(parts) != 1 else ''}:")
        for part in parts:
            click.echo(f"  batch {part.part + 1}: {_lines(part)} ({_plural(part.count, 'request')})")
        return

    client = make_client()
    manifest_path = manifest_path or openai_files.default_manifest_path(file)
    digest = openai_files.file_sha256(file)
    manifest = None
    if manifest_path.exists():
        earlier = _load_manifest(manifest_path)
        same_job = earlier.input_sha256 == digest and earlier.base_url.rstrip("/") == client.base_url
        if same_job and not earlier.complete:
            _adopt_created(client, earlier, manifest_path)
        if earlier.batch_ids():
            manifest = _resume_manifest(manifest_path, earlier, digest, client, metadata if metadata_pairs else None)
        else:
            _echo_err(f"{manifest_path}: no batch of the earlier attempt was created; starting the job afresh")
    if manifest is None:
        manifest = Manifest(
            input=str(file), input_sha256=digest, base_url=client.base_url, requests=len(items),
            max_requests=max_requests, max_body_bytes=max_body_bytes, metadata=metadata, parts=parts,
        )
        manifest.save(manifest_path)

    try:
        created = _create_missing(client, manifest, manifest_path, items, wait=wait or output is not None,
                                  poll_interval=poll_interval)
    except KeyboardInterrupt:
        _echo_err(f"\nInterrupted: {len(manifest.batch_ids())} of {len(manifest.parts)} batches are created and "
                  f"recorded in {manifest_path}; run the same submit again to resume (nothing is created twice)")
        raise click.exceptions.Exit(130) from None
    total = len(manifest.parts)
    _echo_err(f"{manifest_path}: {total} batch{'es' if total != 1 else ''} for {manifest.requests} requests "
              f"({created} created now)")
    for part in manifest.parts:
        click.echo(part.batch_id)

    if wait or output is not None:
        target = Target(str(manifest_path))
        final = _wait_with_progress(client, target, poll_interval)
        _print_summary(final)
        if output is not None:
            _write_results(client, target, output, errors_path)


def _load_manifest(path: Path) -> Manifest:
    try:
        return Manifest.load(path)
    except (OSError, ValueError) as error:
        raise click.ClickException(f"{path} exists but is not a readable manifest ({error}); "
                                   "remove it or pass another --manifest") from None


def _resume_manifest(path: Path, manifest: Manifest, digest: str, client: BatchClient,
                     metadata: dict[str, str] | None) -> Manifest:
    if manifest.input_sha256 != digest:
        raise click.ClickException(
            f"{path} records a job for a different version of {manifest.input} (the file changed since); "
            "pass another --manifest to submit it as a new job"
        )
    if manifest.base_url.rstrip("/") != client.base_url:
        raise click.ClickException(f"{path} records batches of {manifest.base_url}, not {client.base_url}; "
                                   f"set {BASE_URL_ENV} or pass another --manifest")
    if metadata is not None and metadata != manifest.metadata:
        raise click.ClickException(f"{path} was submitted with metadata {manifest.metadata}; resume it without "
                                   "--metadata, or pass another --manifest for a new job")
    if manifest.complete:
        _echo_err(f"{path}: every batch of this job was already created; nothing new to submit")
    else:
        _echo_err(f"{path}: resuming the job ({len(manifest.batch_ids())} of {len(manifest.parts)} batches "
                  "created before)")
    return manifest


def _adopt_created(client: BatchClient, manifest: Manifest, path: Path) -> None:
    """Batches an interrupted submit created but did not record (it stopped during the call):
    found by the job's metadata, so resuming creates nothing twice."""
    missing = {str(part.part + 1): part for part in manifest.parts if not part.batch_id}
    oldest = manifest.created_at - ADOPT_SKEW_SECONDS
    for batch in client.iter_batches():
        if batch.created_at < oldest:
            break
        found = batch.metadata or {}
        if found.get(openai_files.JOB_KEY) != manifest.job_id:
            continue
        number = found.get(openai_files.PART_KEY, "").partition("/")[0]
        part = missing.pop(number, None)
        if part is not None:
            part.batch_id, part.created_at = batch.id, float(batch.created_at)
            manifest.save(path)
            _echo_err(f"found {batch.id} ({_lines(part)}), created before the interruption")
        if not missing:
            break


def _create_missing(client: BatchClient, manifest: Manifest, path: Path, items: list, *, wait: bool,
                    poll_interval: float) -> int:
    created = 0
    told_waiting = False
    for part in manifest.parts:
        if part.batch_id:
            continue
        requests_ = [item.raw for item in items[part.start : part.start + part.count]]
        metadata = openai_files.job_metadata(manifest.metadata, manifest.job_id, part.part, len(manifest.parts))
        # One key per part, kept while waiting for a free slot too: whatever attempt stored the
        # batch, the others answer that batch instead of creating another.
        idempotency_key = str(uuid.uuid4())
        while True:
            try:
                batch = client.create(requests_, metadata=metadata, idempotency_key=idempotency_key)
                break
            except BatchApiError as error:
                done = len(manifest.batch_ids())
                if error.status == 429 and error.code == "too_many_unfinished_batches" and wait:
                    if not told_waiting:
                        _echo_err(f"{error.message}\nwaiting for a free slot to create the rest "
                                  f"({done} of {len(manifest.parts)} created)...")
                        told_waiting = True
                    time.sleep(max(poll_interval, 1.0))
                    continue
                if done:
                    hint = (f"{done} of {len(manifest.parts)} batches are created and recorded in {path}; "
                            "run the same submit again to create the rest")
                else:
                    hint = "no batch of this job was created; run the same submit again once that is fixed"
                if error.status == 429 and error.code == "too_many_unfinished_batches":
                    hint += " once some have finished (or add --wait to wait for a free slot)"
                raise click.ClickException(
                    f"creating the batch for {_lines(part)} failed: the API answered "
                    f"{error.status} ({error.code or 'error'}): {error.message}\n{hint}"
                ) from None
        part.batch_id, part.created_at = batch.id, time.time()
        manifest.save(path)
        created += 1
        _echo_err(f"created {batch.id}: {_lines(part)} ({_plural(part.count, 'request')})")
    return created


# ---- waiting ------------------------------------------------------------------------------


def _wait_with_progress(client: BatchClient, target: Target, poll_interval: float) -> list[Batch]:
    """Poll every batch until all are final, a tqdm bar each (completed+failed of total)."""
    from tqdm import tqdm

    ids = target.batch_ids
    latest: dict[str, Batch] = {}
    bars = {}
    try:
        for position, batch_id in enumerate(ids):
            label = target.lines_of(batch_id) or batch_id
            bars[batch_id] = tqdm(total=target.count_of(batch_id), desc=label, position=position, unit="req",
                                  file=sys.stderr, dynamic_ncols=True, leave=True)
        pause = min(0.5, poll_interval)  # quick at first (small jobs finish fast), then every poll_interval
        while True:
            for batch_id in ids:
                if batch_id in latest and latest[batch_id].is_final:
                    continue
                batch = client.retrieve(batch_id)
                latest[batch_id] = batch
                counts = batch.request_counts
                bar = bars[batch_id]
                bar.total = counts.total
                bar.n = counts.completed + counts.failed
                bar.set_postfix_str(f"{batch.status}: {counts.completed} completed, {counts.failed} failed",
                                    refresh=False)
                bar.refresh()
            if all(latest[batch_id].is_final for batch_id in ids):
                return [latest[batch_id] for batch_id in ids]
            time.sleep(pause)
            pause = min(poll_interval, pause * 2)
    except KeyboardInterrupt:
        for bar in bars.values():
            bar.close()
        bars.clear()
        where = target.manifest_path or target.value
        _echo_err(f"\nStopped waiting; the batches keep running. Later: freeinference-batch status {where}, "
                  f"then freeinference-batch results {where} -o out.jsonl")
        raise click.exceptions.Exit(130) from None
    finally:
        for bar in bars.values():
            bar.close()


def _print_summary(batches: list[Batch]) -> None:
    completed = sum(batch.request_counts.completed for batch in batches)
    failed = sum(batch.request_counts.failed for batch in batches)
    total = sum(batch.request_counts.total for batch in batches)
    statuses = sorted({batch.status for batch in batches})
    _echo_err(f"done: {completed} completed, {failed} failed, {total} total ({', '.join(statuses)})")


# ---- results ------------------------------------------------------------------------------


def _write_results(client: BatchClient, target: Target, output: Path, errors_path: Path | None) -> None:
    temporary = [output.with_name(f".{output.name}.partial")]
    if errors_path is not None:
        temporary.append(errors_path.with_name(f".{errors_path.name}.partial"))
    try:
        with contextlib.ExitStack() as files:
            out = files.enter_context(open(temporary[0], "w", encoding="utf-8"))
            err = files.enter_context(open(temporary[1], "w", encoding="utf-8")) if errors_path else None

            def writer(handle: Any) -> Callable[[dict], None]:
                return lambda line: openai_files.write_jsonl_lines(handle, [line])

            ok = bad = 0
            for batch_id in target.batch_ids:
                got = openai_files.split_outputs(_result_dicts(client, batch_id), writer(out),
                                                 writer(err) if err is not None else None)
                ok, bad = ok + got[0], bad + got[1]
        os.replace(temporary[0], output)
        if errors_path is not None:
            os.replace(temporary[1], errors_path)
    finally:
        for path in temporary:
            path.unlink(missing_ok=True)
    if errors_path is not None:
        _echo_err(f"wrote {ok} succeeded requests to {output} and {bad} others to {errors_path}")
    else:
        _echo_err(f"wrote {ok + bad} lines to {output} ({ok} succeeded, {bad} did not)")


def _result_dicts(client: BatchClient, batch_id: str) -> Iterator[dict]:
    for line in client.iter_results(batch_id):
        yield line.model_dump(mode="json")


@click.command()
@click.argument("target")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The output file (OpenAI's batch output format, one line per request, in submission order).")
@click.option("--errors", "errors_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write failed, cancelled and expired requests here instead of to the output file.")
@click.option("--wait", is_flag=True, help="Wait for unfinished batches instead of refusing.")
@click.option("--poll-interval", type=click.FloatRange(min=0.01), default=DEFAULT_POLL_SECONDS, show_default=True)
@_friendly
def results(target: str, output: Path, errors_path: Path | None, wait: bool, poll_interval: float) -> None:
    """Write the results of a batch ID or a job MANIFEST as an OpenAI output file."""
    job = Target(target)
    job.require_complete("ask for the results")
    client = make_client()
    job.check_base_url(client)
    if wait:
        _wait_with_progress(client, job, poll_interval)
    else:
        unfinished = [batch for batch in (client.retrieve(batch_id) for batch_id in job.batch_ids)
                      if not batch.is_final]
        if unfinished:
            listed = "; ".join(f"{batch.id} is {batch.status} ({_counts(batch)})" for batch in unfinished)
            raise click.ClickException(f"not finished yet: {listed}. Pass --wait to wait for it")
    _write_results(client, job, output, errors_path)


# ---- status, list, cancel, delete ---------------------------------------------------------


@click.command()
@click.argument("target")
@click.option("--json", "as_json", is_flag=True, help="Print the batch objects as JSON, one per line.")
@_friendly
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
        click.echo(f"{batch.id}  {batch.status:<11}  {_counts(batch)}" + (f"  ({lines})" if lines else ""))
        if batch.error is not None:
            click.echo(f"    failed: {batch.error.code}: {batch.error.message}")
    if job.manifest is not None:
        for part in job.manifest.parts:
            if not part.batch_id:
                click.echo(f"(not created)  {_lines(part)}: run submit again to create it")


@click.command(name="list")
@click.option("--limit", type=click.IntRange(1, 100), default=20, show_default=True)
@click.option("--after", default=None, help="Start after this batch id (the last one of the previous page).")
@click.option("--json", "as_json", is_flag=True, help="Print the batch objects as JSON, one per line.")
@_friendly
def list_batches(limit: int, after: str | None, as_json: bool) -> None:
    """List your batches, newest first."""
    page = make_client().list(limit=limit, after=after)
    for batch in page.data:
        if as_json:
            click.echo(json.dumps(batch.model_dump(mode="json")))
        else:
            click.echo(f"{batch.id}  {batch.status:<11}  {_when(batch.created_at)}  {_counts(batch)}")
    if page.has_more and not as_json:
        _echo_err(f"(more: --after {page.last_id})")


@click.command()
@click.argument("target")
@_friendly
def cancel(target: str) -> None:
    """Cancel a batch ID, or every batch of a job MANIFEST."""
    job = Target(target)
    client = make_client()
    job.check_base_url(client)
    for batch_id in job.batch_ids:
        batch = client.cancel(batch_id)
        click.echo(f"{batch.id}  {batch.status:<11}  {_counts(batch)}")


@click.command()
@click.argument("target")
@_friendly
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
            _echo_err(f"{batch_id}: not deleted: {error.message}")
            continue
        click.echo(f"{batch_id}  deleted")
    if problems:
        raise click.exceptions.Exit(1)


# ---- webhooks -----------------------------------------------------------------------------


@click.group()
def webhooks() -> None:
    """Webhook endpoints: URLs told, with a signed event, when one of your batches ends."""


def _endpoint_line(endpoint: WebhookEndpoint) -> str:
    return (f"{endpoint.id}  {endpoint.url}  {','.join(endpoint.event_types)}  {endpoint.name!r}  "
            f"secret {endpoint.signing_secret_hint}")


@webhooks.command(name="add")
@click.argument("url")
@click.option("--name", default=None, help="A name to tell endpoints apart (default: the URL's host).")
@click.option("--event-type", "event_types", multiple=True, type=click.Choice(WEBHOOK_EVENT_TYPES),
              help="An event to send (repeatable); default: all four.")
@click.option("--json", "as_json", is_flag=True, help="Print the endpoint object as JSON (with its secret).")
@_friendly
def add_webhook(url: str, name: str | None, event_types: tuple[str, ...], as_json: bool) -> None:
    """Register URL; prints its signing secret, which is shown this once."""
    endpoint = make_client().webhooks.create(url, name or (urlsplit(url).hostname or url),
                                             event_types or WEBHOOK_EVENT_TYPES)
    if as_json:
        click.echo(json.dumps(endpoint.model_dump(mode="json")))
        return
    click.echo(_endpoint_line(endpoint))
    click.echo(f"signing secret: {endpoint.signing_secret}")
    # On stderr: stdout stays the endpoint and its secret, for a script to read.
    _echo_err("Keep the signing secret now: it is shown only this once (a new one: rotate it).")


@webhooks.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print the endpoint objects as JSON, one per line.")
@_friendly
def list_webhooks(as_json: bool) -> None:
    """Your webhook endpoints (never their secrets)."""
    for endpoint in make_client().webhooks.iter():
        # The server never lists a secret; the model's empty field is left out, not printed as null.
        click.echo(json.dumps(endpoint.model_dump(mode="json", exclude={"signing_secret"})) if as_json
                   else _endpoint_line(endpoint))


@webhooks.command(name="delete")
@click.argument("endpoint_id")
@_friendly
def delete_webhook(endpoint_id: str) -> None:
    """Delete an endpoint; its pending deliveries stop."""
    click.echo(f"{make_client().webhooks.delete(endpoint_id).id}  deleted")


@webhooks.command(name="test")
@click.argument("endpoint_id")
@click.option("--event-type", type=click.Choice(WEBHOOK_EVENT_TYPES), default="batch.completed", show_default=True)
@_friendly
def test_webhook(endpoint_id: str, event_type: str) -> None:
    """Send one signed test event now; prints what the receiver answered, exit 1 unless a 2xx."""
    result = make_client().webhooks.test(endpoint_id, event_type)
    click.echo(f"{result.webhook_endpoint_id}  {result.event_type}  the receiver answered {result.status_code}")
    if not 200 <= result.status_code < 300:
        raise click.exceptions.Exit(1)


def register(main: click.Group) -> None:
    """Add the user commands to the `freeinference-batch` group."""
    for command in (submit, status, list_batches, cancel, delete, results, webhooks):
        main.add_command(command)
