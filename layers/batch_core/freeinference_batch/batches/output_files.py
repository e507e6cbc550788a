"""A file batch's output and error files: the `write_files` job's step (batches/jobs.py).

When a batch created from a file ends (lifecycle.end_with_files: completed, cancelled, expired, or
failed after it started), its final status waits in `ending` while this job writes two files in
OpenAI's batch output line format, in input order: the output file its successes, the error file
everything else (failed, and the cancelled and expired requests that never ran, as OpenAI reports
them). Then one conditional write gives the batch its final status and the files' ids (null for an
empty file), and gives the account's unfinished batch back.

A line is what the results pages show of the request (views.result_line, with the batch's final
status), reshaped as OpenAI's: `{"id", "custom_id", "response": {"status_code", "request_id",
"body"} | null, "error": {"code", "message"} | null}`, where a failed request whose error has an
HTTP `status` is a response of that status, as OpenAI writes it (views.openai_error_fields).

Resumable: each file is an S3 multipart upload, sent a part at a time (BATCH_FILES_PART_BYTES),
and after each part its progress is kept (store/batch_files.py: the next part, and the position
up to which its lines are in its parts). A step that dies loses at most the part it was filling;
the next run starts again from the smaller of the two files' positions and skips, for each file,
the lines it already holds. Its lines are the same every time (they are read from settled items),
and a part is only ever sent whole (a step out of time leaves its unfilled part to the next): part
N holds the same lines whichever run sends it, a run that died before keeping it or another run of
the job at once (SQS delivers at least once), so no file mixes two runs' cuts. Largest output
file: 10,000 parts x the part size (468.75 GiB at 48 MiB), above what a batch can hold (50,000
requests x an 8 MiB answer = 390.6 GiB); a file that would need more parts fails the step, loudly
(the job's dead-letter queue and alarm), rather than be cut short.
"""

from __future__ import annotations

import json
import time

from freeinference_batch.batches import views
from freeinference_batch.batches.results import result_lines
from freeinference_batch.core import clock
from freeinference_batch.core.observability import log_status_change, logger
from freeinference_batch.core.schemas import BatchStatus, RequestStatus
from freeinference_batch.core.settings import Settings
from freeinference_batch.store import batch_files, batch_status, files
from freeinference_batch.store.batch_files import KINDS, FileProgress, Kind, Progress
from freeinference_batch.store.batch_record import BatchRecord
from freeinference_batch.store.batch_table import BatchTable
from freeinference_batch.store.dynamo import TransactionFailed, transact

# A request that never ran shows no error on its results page (its status says it); OpenAI's error
# file gives it one.
NOT_RUN = {
    RequestStatus.CANCELLED: {"code": "batch_cancelled", "message": "Not run: the batch was cancelled"},
    RequestStatus.EXPIRED: {"code": "batch_expired", "message": "Not run: the completion window closed first"},
}


class OutputTooLarge(RuntimeError):
    """A file would need more than S3's 10,000 parts."""


def file_line(line: dict) -> tuple[Kind, bytes]:
    """A results page's line as OpenAI's batch output line (its newline included), and its file."""
    if line["status"] == RequestStatus.COMPLETED:
        response = line["response"]
        out = {"id": line["id"], "custom_id": line["custom_id"],
               "response": {"status_code": response["status_code"], "request_id": response["request_id"],
                            "body": response["body"]},
               "error": None}
        kind: Kind = "output"
    else:
        error = line["error"] or NOT_RUN.get(line["status"]) or {
            "code": "batch_not_run", "message": f"Not run: the request was {line['status']} when its batch ended"}
        out = {"id": line["id"], "custom_id": line["custom_id"], **views.openai_error_fields(line["status"], error)}
        kind = "error"
    data = json.dumps(out, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode() + b"\n"
    return kind, data


class _Writer:
    """One file's lines not yet in a part, and up to where they go."""

    def __init__(self, progress: FileProgress) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.end = progress.position

    def add(self, data: bytes, end: int) -> None:
        self.chunks.append(data)
        self.size += len(data)
        self.end = end

    def take(self) -> bytes:
        body = b"".join(self.chunks)
        self.chunks, self.size = [], 0
        return body


class _Step:
    """One run of the job: the batch, its progress as this run last kept it, and its writers."""

    def __init__(self, settings: Settings, meta: BatchRecord, progress: Progress, version: int | None,
                 ttl: int) -> None:
        self.settings, self.meta, self.progress, self.version, self.ttl = settings, meta, progress, version, ttl
        self.writers = {kind: _Writer(progress.of(kind)) for kind in KINDS}

    def keep(self) -> bool:
        """Keep the progress; False when another run moved it first (this one stops)."""
        self.progress.touched_at = int(clock.now(self.settings.clock_offset_file))
        if not batch_files.save_progress(self.settings, self.meta.id, self.progress, self.version, self.ttl):
            logger.warning("another run of the batch's write_files job went on: this one stops",
                           extra={"batch_id": self.meta.id})
            return False
        self.version = 0 if self.version is None else self.version + 1
        return True

    def send_part(self, kind: Kind) -> bool:
        """The writer's lines as the file's next part (its upload started first if need be)."""
        state, writer = self.progress.of(kind), self.writers[kind]
        if state.next_part > batch_files.MAX_PARTS:
            raise OutputTooLarge(f"the {kind} file of batch {self.meta.id} needs more than "
                                 f"{batch_files.MAX_PARTS} parts of {self.settings.batch_files_part_bytes} bytes")
        if state.upload_id is None:
            upload_id = batch_files.start_upload(self.settings, self.meta.id, kind)
            state.upload_id = upload_id
            if not self.keep():
                # Another run's upload is the file's; this one, never given a part, the bucket's
                # lifecycle rule aborts (AbortIncompleteMultipartUpload, a day).
                return False
        body = writer.take()
        batch_files.upload_part(self.settings, self.meta.id, kind, state.upload_id, state.next_part, body)
        state.next_part += 1
        state.size += len(body)
        state.position = writer.end
        return self.keep()

    def close(self, kind: Kind) -> bool:
        """The file whole: its last part and the upload completed, or, smaller than a part, one object."""
        state, writer = self.progress.of(kind), self.writers[kind]
        if state.upload_id is None:
            state.size = batch_files.put_whole(self.settings, self.meta.id, kind, writer.take()) if writer.size else 0
        else:
            if writer.size and not self.send_part(kind):
                return False
            state.size = batch_files.complete_upload(self.settings, self.meta.id, kind, state.upload_id,
                                                     state.next_part - 1)
        state.position, state.done = self.meta.total, True
        return self.keep()


def write_files(settings: Settings, batch_id: str, deadline: float) -> bool:
    """The `write_files` job's step: write what fits before `deadline`; True when the job is done
    (the batch final, or another run of the job carrying on)."""
    table = BatchTable(settings)
    meta = table.get_meta(batch_id)
    if meta is None or meta.ending is None:
        return True  # already final (a run before this one finished it), or gone
    now = clock.now(settings.clock_offset_file)
    _, ttl = batch_status.retention(settings, now)
    found = batch_files.get_progress(settings, batch_id)
    step = _Step(settings, meta, found or Progress(), found.version if found else None, ttl)
    if not step.keep():  # a sign of life for the sweep, and this run's claim on the progress
        return True
    pending = [kind for kind in KINDS if not step.progress.of(kind).done]
    if pending:
        view = meta.model_copy(update={"status": meta.ending})  # its lines as its final status shows them
        first = min(step.progress.of(kind).position for kind in pending)
        output = step.progress.output
        responses_from = meta.total if output.done else output.position
        part_bytes = settings.batch_files_part_bytes
        for position, _, line in result_lines(table, view, first, view.total - 1, responses_from):
            kind: Kind = "output" if line["status"] == RequestStatus.COMPLETED else "error"
            state = step.progress.of(kind)
            if state.done or position < state.position:
                continue  # already in one of its parts (a completed one's response was not read)
            writer = step.writers[kind]
            writer.add(file_line(line)[1], position + 1)
            if writer.size >= part_bytes and not step.send_part(kind):
                return True
            if time.monotonic() >= deadline:
                # What is not yet a whole part is read again by the next step: a part cut short here
                # would hold other lines than the same part sent by another run of the job at once.
                return False
        for kind in pending:
            if not step.close(kind):
                return True
    return _finish(settings, table, meta, step.progress, now, ttl)


def _finish(settings: Settings, table: BatchTable, meta: BatchRecord, progress: Progress, now: float,
            ttl: int) -> bool:
    """The files' items, then the batch's final write with their ids."""
    ids: list[str | None] = []
    for kind in KINDS:
        size = progress.of(kind).size
        if size == 0:
            ids.append(None)  # OpenAI's null for a file that would be empty
            continue
        record = files.register_batch_file(settings, meta.account_id, meta.id, kind,
                                           batch_files.object_key(meta.id, kind), size, now, ttl)
        ids.append(record.id)
    final = BatchStatus(meta.ending)
    try:
        # (The progress item stays, done, until the batch's purge: no function deletes items one by one.)
        transact(batch_status.finish(settings, meta, final, now, files=(ids[0], ids[1])))
    except TransactionFailed:
        fresh = table.get_meta(meta.id)
        if fresh is None or fresh.ending is None:
            return True  # another run finished it
        raise
    log_status_change(f"batch {final}", meta.id, final, meta.status, output_file_id=ids[0], error_file_id=ids[1])
    return True

