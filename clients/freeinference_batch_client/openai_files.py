"""OpenAI batch files on our API: reading input JSONL, checking it, splitting it into batches,
the job manifest, and OpenAI output-file lines. No network here (the CLI does the calls).

- `read_input(path)`: one request per line, `{custom_id, method, url, body}` as in OpenAI's batch
  input files; blank lines are skipped; every request remembers its line number.
- `check_requests(items)`: the server's own rules (`validation.validate_requests`), run over
  the whole file, with errors naming the line (`line 3 (custom_id 'q-2'): Model ... not found`).
- `plan_parts(items, ...)`: consecutive runs of requests, each within the limits of one batch
  (requests per batch, bytes of the input file it is sent as: `file_content`).
- `Manifest`: the job on disk, one part per batch with its line range and, once created, its id.
- `output_line(result)`: one line of OpenAI's output-file format for one result line.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from freeinference_batch.batches import validation, views
from freeinference_batch.core.catalog import Catalog, load_catalog
from freeinference_batch.core.errors import BadRequest
from freeinference_batch.core.settings import Settings
from pydantic import BaseModel, Field

from freeinference_batch_client.client import encode_json

DEFAULT_MAX_REQUESTS: int = Settings.model_fields["batch_max_requests"].default
# `submit` sends each batch of a job as an input file (OpenAI's flow): the service takes files of
# up to this many bytes (the inline create's 32 MiB body limit does not apply to them).
DEFAULT_MAX_FILE_BYTES: int = Settings.model_fields["file_max_bytes"].default
# Metadata the CLI adds to each batch of a job, so an interrupted submit finds what it created.
JOB_KEY = "freeinference_job"
PART_KEY = "freeinference_part"
MAX_REPORTED_ERRORS = 20
MANIFEST_VERSION = 1


class InputFileError(Exception):
    """The input file cannot be submitted; `errors` lists the problems, each naming its line."""

    def __init__(self, errors: Sequence[str], more: bool = False) -> None:
        self.errors = list(errors)
        self.more = more
        text = "\n".join(self.errors)
        if more:
            text += f"\n(stopped after {len(self.errors)} errors)"
        super().__init__(text)


@dataclass
class InputRequest:
    """One request of the input file: its 1-based line number, the parsed object, its encoding."""

    line: int
    raw: Any
    encoded: bytes = field(repr=False)


# ---- reading and checking -------------------------------------------------------------------


def _parse(lines: Iterable[bytes]) -> tuple[list[InputRequest], list[str]]:
    items: list[InputRequest] = []
    errors: list[str] = []
    for number, data in enumerate(lines, start=1):
        if not data.strip():
            continue
        try:
            text = data.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as error:
            errors.append(f"line {number}: not valid UTF-8 ({error.reason} at byte {error.start})")
            continue
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError) as error:
            errors.append(f"line {number}: not valid JSON: {str(error)[:200]}")
            continue
        if not isinstance(raw, dict):
            errors.append(f"line {number}: each line must be a JSON object with custom_id and body")
            continue
        items.append(InputRequest(number, raw, encode_json(raw)))
    return items, errors


def parse_lines(lines: Iterable[bytes]) -> list[InputRequest]:
    """Requests from JSONL lines (bytes, as read from a file opened in binary mode); raises
    InputFileError for lines that are not JSON objects, naming each line."""
    items, errors = _parse(lines)
    if errors:
        raise InputFileError(errors[:MAX_REPORTED_ERRORS], more=len(errors) > MAX_REPORTED_ERRORS)
    if not items:
        raise InputFileError(["the file has no requests (one JSON object per line)"])
    return items


def read_input(path: str | os.PathLike[str]) -> list[InputRequest]:
    with open(path, "rb") as handle:
        return parse_lines(handle)


def load_requests(
    path: str | os.PathLike[str], catalog: Catalog | None = None, tier: str | None = None
) -> list[InputRequest]:
    """Read and check an input file in one go: every problem found (unparsable lines and the
    server's rules alike), in line order, in one InputFileError."""
    with open(path, "rb") as handle:
        items, errors = _parse(handle)
    if not items and not errors:
        raise InputFileError(["the file has no requests (one JSON object per line)"])
    if items and len(errors) < MAX_REPORTED_ERRORS:
        try:
            check_requests(items, catalog, tier)
        except InputFileError as error:
            errors.extend(error.errors)
    if errors:
        errors.sort(key=lambda message: _line_named(message, None) or 0)
        raise InputFileError(errors[:MAX_REPORTED_ERRORS], more=len(errors) >= MAX_REPORTED_ERRORS)
    return items


def batch_tier(catalog: Catalog) -> str:
    """The account tier to check models for: the first tier that may create batches."""
    return catalog.batch_tiers[0] if catalog.batch_tiers else "internal"


def check_requests(items: Sequence[InputRequest], catalog: Catalog | None = None, tier: str | None = None) -> None:
    """The server's checks over the whole file (so custom_id must be unique across the job);
    raises InputFileError listing up to MAX_REPORTED_ERRORS problems, each naming its line."""
    catalog = catalog if catalog is not None else load_catalog()
    tier = tier or batch_tier(catalog)
    remaining = list(items)
    errors: list[str] = []
    while remaining and len(errors) < MAX_REPORTED_ERRORS:
        numbers = [item.line for item in remaining]
        try:
            validation.validate_requests(
                [item.raw for item in remaining], catalog, tier, max_requests=len(remaining),
                label=lambda index, numbers=numbers: f"line {numbers[index]}",
            )
            break
        except BadRequest as error:
            errors.append(error.message)
            culprit = _line_named(error.message, numbers)
            if culprit is None:
                break
            # Drop the line at fault and look again, so one run reports every problem.
            remaining = [item for item in remaining if item.line != culprit]
    if errors:
        errors.sort(key=lambda message: _line_named(message, None) or 0)
        raise InputFileError(errors, more=len(errors) >= MAX_REPORTED_ERRORS)


def _line_named(message: str, numbers: Sequence[int] | None) -> int | None:
    if not message.startswith("line "):
        return None
    digits = message[5:].split(maxsplit=1)[0].rstrip(":")
    if not digits.isdigit():
        return None
    number = int(digits)
    return number if numbers is None or number in numbers else None


def check_metadata(metadata: Mapping[str, str] | None) -> None:
    """The server's metadata rules, for the metadata of every batch of a job (ours included)."""
    try:
        validation.validate_metadata(dict(metadata) if metadata is not None else None)
    except BadRequest as error:
        raise InputFileError([error.message]) from None


def job_metadata(user_metadata: Mapping[str, str] | None, job_id: str, part: int, parts: int) -> dict[str, str]:
    """The metadata one batch of a job is created with: the user's plus the job's two keys."""
    return {**(user_metadata or {}), JOB_KEY: job_id, PART_KEY: f"{part + 1}/{parts}"}


# ---- splitting ------------------------------------------------------------------------------


def file_content(items: Sequence[InputRequest]) -> bytes:
    """The input file of these requests: each one's line, newline-terminated."""
    return b"".join(item.encoded + b"\n" for item in items)


class Part(BaseModel):
    """One batch of a job: requests [start, start + count) of the file, lines first..last."""

    part: int
    start: int
    count: int
    first_line: int
    last_line: int
    batch_id: str | None = None
    created_at: float | None = None


def plan_parts(
    items: Sequence[InputRequest],
    max_requests: int = DEFAULT_MAX_REQUESTS,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> list[Part]:
    """Consecutive runs of requests, as long as the limits allow: at most `max_requests` each, in
    an input file (`file_content`) of at most `max_file_bytes`. A request too big for a file on
    its own is an InputFileError."""
    if max_requests < 1 or max_file_bytes < 1:
        raise ValueError("the limits must be positive")
    parts: list[Part] = []
    start, size = 0, 0
    for index, item in enumerate(items):
        line = len(item.encoded) + 1
        if line > max_file_bytes:
            raise InputFileError([
                f"line {item.line}: this request alone makes an input file of {line} bytes; "
                f"a batch's file holds at most {max_file_bytes} bytes"
            ])
        count = index - start
        if count and (count >= max_requests or size + line > max_file_bytes):
            parts.append(_part(items, len(parts), start, index))
            start, size = index, line
        else:
            size += line
    parts.append(_part(items, len(parts), start, len(items)))
    return parts


def _part(items: Sequence[InputRequest], number: int, start: int, end: int) -> Part:
    return Part(part=number, start=start, count=end - start, first_line=items[start].line,
                last_line=items[end - 1].line)


# ---- the manifest ---------------------------------------------------------------------------


class Manifest(BaseModel):
    """A submitted (or half-submitted) job: which batches hold which lines of which file."""

    version: int = MANIFEST_VERSION
    job_id: str = Field(default_factory=lambda: f"job_{uuid.uuid4().hex}")
    input: str
    input_sha256: str
    base_url: str
    created_at: float = Field(default_factory=time.time)
    requests: int
    max_requests: int
    # Of the input file each batch was sent as; None in a manifest of a client before it (split by
    # the inline create's body limit), whose parts are kept as recorded.
    max_file_bytes: int | None = None
    metadata: dict[str, str] | None = None
    parts: list[Part]

    @property
    def complete(self) -> bool:
        """Every part has been created."""
        return all(part.batch_id for part in self.parts)

    def batch_ids(self) -> list[str]:
        return [part.batch_id for part in self.parts if part.batch_id]

    def save(self, path: str | os.PathLike[str]) -> None:
        """Written whole or not at all (a temporary file renamed over the old one)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(self.model_dump_json(indent=2) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Manifest:
        return cls.model_validate_json(Path(path).read_text())


def default_manifest_path(input_path: str | os.PathLike[str]) -> Path:
    """`data/job.jsonl` -> `data/job.jsonl.manifest.json`."""
    path = Path(input_path)
    return path.with_name(path.name + ".manifest.json")


def file_sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


def is_manifest_file(value: str) -> bool:
    """Whether a CLI argument names a manifest file rather than a batch id."""
    path = Path(value)
    if not path.is_file():
        return False
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(document, dict) and "parts" in document and "job_id" in document


# ---- output files ---------------------------------------------------------------------------

# Why a result that did not succeed has no response, when the service gives no error of its own.
_NO_ERROR = {
    "cancelled": ("batch_cancelled", "Not run: the batch was cancelled"),
    "queued": ("not_finished", "Not finished yet: still queued when the results were read"),
    "running": ("not_finished", "Not finished yet: still running when the results were read"),
    "expired": ("batch_expired", "Not run: the completion window closed first"),
    "failed": ("failed", "The request failed"),
}


def output_line(result: Mapping[str, Any]) -> dict[str, Any]:
    """One line of OpenAI's batch output-file format for one of our result lines:
    `{"id", "custom_id", "response": {"status_code", "request_id", "body"} | null,
    "error": {"code", "message"} | null}`; a failed request whose error has an HTTP `status` is a
    response of that status, as OpenAI's error files have it."""
    status = result.get("status")
    response = result.get("response")
    error = result.get("error")
    if status == "failed" and response and not error:
        # An error file's line already (a results page never gives a failed request a response)
        return {"id": result["id"], "custom_id": result["custom_id"], "response": response, "error": None}
    if status == "completed" and response:
        return {
            "id": result["id"],
            "custom_id": result["custom_id"],
            "response": {
                "status_code": response["status_code"],
                "request_id": response["request_id"],
                "body": response["body"],
            },
            "error": None,
        }
    if error:
        code, message = error.get("code"), error.get("message")
    else:
        code, message = _NO_ERROR.get(str(status), ("unknown", f"No response (status {status!r})"))
    fields = views.openai_error_fields(str(status), {"code": code, "message": message,
                                                     "status": (error or {}).get("status")})
    return {"id": result["id"], "custom_id": result["custom_id"], **fields}


def is_success(result: Mapping[str, Any]) -> bool:
    return result.get("status") == "completed" and bool(result.get("response"))


def write_jsonl_lines(handle: Any, lines: Iterable[Mapping[str, Any]]) -> int:
    count = 0
    for line in lines:
        handle.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
        count += 1
    return count


def split_outputs(
    results: Iterable[Mapping[str, Any]],
    write_ok: Callable[[dict[str, Any]], None],
    write_error: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[int, int]:
    """Turn result lines into output lines, sending failures to `write_error` when there is one;
    answers (succeeded, not succeeded)."""
    ok = bad = 0
    for result in results:
        line = output_line(result)
        if is_success(result):
            ok += 1
            write_ok(line)
        else:
            bad += 1
            (write_error or write_ok)(line)
    return ok, bad
