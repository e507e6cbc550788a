"""What the user commands share: the client from the environment, API errors as one line, the
batch-id-or-manifest argument (`Target`), and the few formats they print."""

from __future__ import annotations

import datetime as dt
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from freeinference_batch_client import openai_files
from freeinference_batch_client.client import API_KEY_ENV, BASE_URL_ENV, BatchClient
from freeinference_batch_client.errors import BatchApiError, BatchClientError
from freeinference_batch_client.models import Batch
from freeinference_batch_client.openai_files import Manifest

F = TypeVar("F", bound=Callable[..., Any])
DEFAULT_POLL_SECONDS = 5.0


def friendly_errors(function: F) -> F:
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


def echo_err(message: str) -> None:
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
                    return part_lines(part)
        return ""


def part_lines(part: openai_files.Part) -> str:
    if part.first_line == part.last_line:
        return f"line {part.first_line}"
    return f"lines {part.first_line}-{part.last_line}"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def describe_counts(batch: Batch) -> str:
    counts = batch.request_counts
    return f"{counts.completed} completed, {counts.failed} failed, {counts.total} total"


def format_time(timestamp: int | None) -> str:
    if timestamp is None:
        return "-"
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
