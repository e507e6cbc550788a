"""`freeinference-batch submit`: an OpenAI batch input file, checked with the server's own rules,
split into as many batches as the limits require and recorded in a manifest as they are created,
so an interrupted submit resumes without creating anything twice."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import click
from freeinference_batch.core.catalog import load_catalog

from freeinference_batch_client import openai_files
from freeinference_batch_client.cli.common import (
    DEFAULT_POLL_SECONDS,
    Target,
    echo_err,
    friendly_errors,
    make_client,
    part_lines,
    plural,
)
from freeinference_batch_client.cli.results import print_summary, wait_with_progress, write_results
from freeinference_batch_client.client import BASE_URL_ENV, BatchClient
from freeinference_batch_client.errors import BatchApiError
from freeinference_batch_client.openai_files import InputFileError, Manifest

# How far before the manifest's creation an adopted batch may have been created (clock skew).
ADOPT_SKEW_SECONDS = 600


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
    echo_err(f"{path}: {count}{'+' if error.more else ''} problem{'s' if count != 1 else ''}; "
             "nothing was submitted.")
    for message in error.errors:
        echo_err(f"  {message}")
    raise click.exceptions.Exit(1)


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
@click.option("--max-file-bytes", type=click.IntRange(min=1), default=openai_files.DEFAULT_MAX_FILE_BYTES,
              show_default=True, help="Bytes of one batch's input file (the service's limit).")
@click.option("--catalog", "catalog_path", type=click.Path(exists=True, dir_okay=False),
              help="Check model ids against this models.json instead of the packaged catalog.")
@click.option("--dry-run", is_flag=True, help="Check the file and show how it would be split; submit nothing.")
@click.option("--poll-interval", type=click.FloatRange(min=0.01), default=DEFAULT_POLL_SECONDS,
              show_default=True, help="Seconds between status checks while waiting.")
@friendly_errors
def submit(
    file: Path,
    wait: bool,
    manifest_path: Path | None,
    metadata_pairs: tuple[str, ...],
    output: Path | None,
    errors_path: Path | None,
    max_requests: int,
    max_file_bytes: int,
    catalog_path: str | None,
    dry_run: bool,
    poll_interval: float,
) -> None:
    """Submit an OpenAI batch input file (one {custom_id, method, url, body} per line).

    The file is checked first with the service's rules; any problem is reported with its line
    number and nothing is submitted. The job is split into as many batches as the limits require;
    each is uploaded as an input file (/v1/files, or /v1/uploads in 4 MiB parts) and created from it.
    """
    if errors_path is not None and output is None:
        raise click.UsageError("--errors needs -o/--output")
    metadata = _parse_metadata(metadata_pairs)
    # Checked at the largest metadata a part will carry (the job's two keys included).
    widest = openai_files.job_metadata(metadata, "job_" + "0" * 32, 99_998, 99_999)
    try:
        openai_files.check_metadata(widest)
    except InputFileError as error:
        raise click.BadParameter(f"{error} (the job's own two keys included)", param_hint="--metadata") from None
    try:
        items = openai_files.load_requests(file, load_catalog(catalog_path or ""))
        parts = openai_files.plan_parts(items, max_requests, max_file_bytes)
    except InputFileError as error:
        _report_input_errors(file, error)
    if dry_run:
        click.echo(f"{file}: {len(items)} requests, OK; {len(parts)} batch{'es' if len(parts) != 1 else ''}:")
        for part in parts:
            click.echo(f"  batch {part.part + 1}: {part_lines(part)} ({plural(part.count, 'request')})")
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
            echo_err(f"{manifest_path}: no batch of the earlier attempt was created; starting the job afresh")
    if manifest is None:
        manifest = Manifest(
            input=str(file), input_sha256=digest, base_url=client.base_url, requests=len(items),
            max_requests=max_requests, max_file_bytes=max_file_bytes, metadata=metadata, parts=parts,
        )
        manifest.save(manifest_path)

    try:
        created = _create_missing(client, manifest, manifest_path, items, wait=wait or output is not None,
                                  poll_interval=poll_interval)
    except KeyboardInterrupt:
        echo_err(f"\nInterrupted: {len(manifest.batch_ids())} of {len(manifest.parts)} batches are created and "
                 f"recorded in {manifest_path}; run the same submit again to resume (nothing is created twice)")
        raise click.exceptions.Exit(130) from None
    total = len(manifest.parts)
    echo_err(f"{manifest_path}: {total} batch{'es' if total != 1 else ''} for {manifest.requests} requests "
             f"({created} created now)")
    for part in manifest.parts:
        click.echo(part.batch_id)

    if wait or output is not None:
        target = Target(str(manifest_path))
        final = wait_with_progress(client, target, poll_interval)
        print_summary(final)
        if output is not None:
            write_results(client, final, output, errors_path)


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
        echo_err(f"{path}: every batch of this job was already created; nothing new to submit")
    else:
        echo_err(f"{path}: resuming the job ({len(manifest.batch_ids())} of {len(manifest.parts)} batches "
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
        # A retry of a part carries the part's metadata (a retry keeps its parent's): not the part.
        if found.get(openai_files.JOB_KEY) != manifest.job_id or batch.retry_of is not None:
            continue
        number = found.get(openai_files.PART_KEY, "").partition("/")[0]
        part = missing.pop(number, None)
        if part is not None:
            part.batch_id, part.created_at = batch.id, float(batch.created_at)
            manifest.save(path)
            echo_err(f"found {batch.id} ({part_lines(part)}), created before the interruption")
        if not missing:
            break


def _create_missing(client: BatchClient, manifest: Manifest, path: Path, items: list, *, wait: bool,
                    poll_interval: float) -> int:
    created = 0
    told_waiting = False
    for part in manifest.parts:
        if part.batch_id:
            continue
        metadata = openai_files.job_metadata(manifest.metadata, manifest.job_id, part.part, len(manifest.parts))
        # One key per part, kept while waiting for a free slot too: whatever attempt stored the
        # batch, the others answer that batch instead of creating another.
        idempotency_key = str(uuid.uuid4())
        input_file_id: str | None = None
        while True:
            try:
                # OpenAI's flow: the part's lines uploaded as an input file (once, kept while
                # waiting for a slot), then a batch created from it; the server checks its lines
                # again in the background (already checked here by the same rules).
                if input_file_id is None:
                    content = openai_files.file_content(items[part.start : part.start + part.count])
                    input_file_id = client.upload_file(content, f"{Path(manifest.input).stem}-{part.part + 1}.jsonl")
                batch = client.create_from_file(input_file_id, metadata=metadata, idempotency_key=idempotency_key)
                break
            except BatchApiError as error:
                done = len(manifest.batch_ids())
                if error.status == 429 and error.code == "too_many_unfinished_batches" and wait:
                    if not told_waiting:
                        echo_err(f"{error.message}\nwaiting for a free slot to create the rest "
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
                    f"creating the batch for {part_lines(part)} failed: the API answered "
                    f"{error.status} ({error.code or 'error'}): {error.message}\n{hint}"
                ) from None
        part.batch_id, part.created_at = batch.id, time.time()
        manifest.save(path)
        created += 1
        echo_err(f"created {batch.id}: {part_lines(part)} ({plural(part.count, 'request')})")
    return created
