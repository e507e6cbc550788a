"""Waiting for a job's batches (a progress bar each) and writing their results as OpenAI output
files: the `results` command (`--merged`: a batch and the batches it retries, each custom_id's
latest outcome), and `submit --wait / -o`."""

from __future__ import annotations

import contextlib
import heapq
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import click

from freeinference_batch_client import openai_files, retries
from freeinference_batch_client.cli.common import (
    DEFAULT_POLL_SECONDS,
    Target,
    describe_counts,
    echo_err,
    friendly_errors,
    make_client,
)
from freeinference_batch_client.client import BatchClient
from freeinference_batch_client.models import Batch


def wait_with_progress(client: BatchClient, target: Target, poll_interval: float) -> list[Batch]:
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
        echo_err(f"\nStopped waiting; the batches keep running. Later: freeinference-batch status {where}, "
                 f"then freeinference-batch results {where} -o out.jsonl")
        raise click.exceptions.Exit(130) from None
    finally:
        for bar in bars.values():
            bar.close()


def print_summary(batches: list[Batch]) -> None:
    completed = sum(batch.request_counts.completed for batch in batches)
    failed = sum(batch.request_counts.failed for batch in batches)
    total = sum(batch.request_counts.total for batch in batches)
    statuses = sorted({batch.status for batch in batches})
    echo_err(f"done: {completed} completed, {failed} failed, {total} total ({', '.join(statuses)})")


def write_results(client: BatchClient, batches: list[Batch], output: Path, errors_path: Path | None) -> None:
    """The results of these final batches (as last read), one after another."""
    write_lines((_result_dicts(client, batch) for batch in batches), output, errors_path)


def write_lines(sources: Iterable[Iterable[dict]], output: Path, errors_path: Path | None) -> None:
    """Result lines, one source after another, as OpenAI output lines (failures to `errors_path`
    when given): written whole or not at all."""
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
            for lines in sources:
                got = openai_files.split_outputs(lines, writer(out), writer(err) if err is not None else None)
                ok, bad = ok + got[0], bad + got[1]
        os.replace(temporary[0], output)
        if errors_path is not None:
            os.replace(temporary[1], errors_path)
    finally:
        for path in temporary:
            path.unlink(missing_ok=True)
    if errors_path is not None:
        echo_err(f"wrote {ok} succeeded requests to {output} and {bad} others to {errors_path}")
    else:
        echo_err(f"wrote {ok + bad} lines to {output} ({ok} succeeded, {bad} did not)")


def _result_dicts(client: BatchClient, batch: Batch) -> Iterator[dict]:
    """A batch's results in submission order: a batch created from a file (issue 32), from its
    output and error files (merged back into input order by their ids); any other, from its pages."""
    if batch.input_file_id is None or not (batch.output_file_id or batch.error_file_id):
        for line in client.iter_results(batch.id):
            yield line.model_dump(mode="json")
        return
    sources = [_file_lines(client, file_id, status)
               for status, file_id in (("completed", batch.output_file_id), ("failed", batch.error_file_id)) if file_id]
    yield from heapq.merge(*sources, key=_position)


def _file_lines(client: BatchClient, file_id: str, status: str) -> Iterator[dict]:
    """A file's lines, each with the status its file gives it (openai_files.output_line gives it
    back as it is)."""
    for line in client.iter_file_lines(file_id):
        yield {**line, "status": status}


def _position(line: dict) -> int:
    return int(str(line["id"]).removeprefix("batch_req_"))


def write_merged(client: BatchClient, job: Target, output: Path, errors_path: Path | None) -> None:
    """`results --merged`: the batch and the batches it retries, each custom_id's latest outcome,
    in the order first submitted. An ancestor deleted meanwhile ends the chain: what remains is
    merged, and stderr says so."""
    chain = retries.lineage(client, job.batch_ids[0])
    ids = ", ".join(batch.id for batch in chain.batches)
    count = f"{len(chain.batches)} batch{'' if len(chain.batches) == 1 else 'es'}"
    if chain.deleted is not None:
        echo_err(f"{chain.deleted}, which {chain.batches[-1].id} retries, no longer exists (deleted, or past its "
                 f"retention): merging what remains, {count} ({ids}); requests that only it held are missing")
    else:
        echo_err(f"merging {count}, newest first: {ids}")
    merged = (line.model_dump(mode="json") for line in retries.merged_results(client, chain))
    write_lines([merged], output, errors_path)


@click.command()
@click.argument("target")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The output file (OpenAI's batch output format, one line per request, in submission order).")
@click.option("--errors", "errors_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write failed, cancelled and expired requests here instead of to the output file.")
@click.option("--wait", is_flag=True, help="Wait for unfinished batches instead of refusing.")
@click.option("--merged", is_flag=True,
              help="TARGET is a batch id: follow the batches it retries (retry_of) back to the first, and write "
                   "each custom_id once, with its latest outcome, in the order first submitted.")
@click.option("--poll-interval", type=click.FloatRange(min=0.01), default=DEFAULT_POLL_SECONDS, show_default=True)
@friendly_errors
def results(target: str, output: Path, errors_path: Path | None, wait: bool, merged: bool,
            poll_interval: float) -> None:
    """Write the results of a batch ID or a job MANIFEST as an OpenAI output file."""
    job = Target(target)
    if merged and job.manifest is not None:
        raise click.ClickException("--merged takes a batch id (the latest retry of a batch), not a job manifest")
    job.require_complete("ask for the results")
    client = make_client()
    job.check_base_url(client)
    if wait:
        batches = wait_with_progress(client, job, poll_interval)
    else:
        batches = [client.retrieve(batch_id) for batch_id in job.batch_ids]
        unfinished = [batch for batch in batches if not batch.is_final]
        if unfinished:
            listed = "; ".join(f"{batch.id} is {batch.status} ({describe_counts(batch)})" for batch in unfinished)
            raise click.ClickException(f"not finished yet: {listed}. Pass --wait to wait for it")
    if merged:
        write_merged(client, job, output, errors_path)
    else:
        write_results(client, batches, output, errors_path)
