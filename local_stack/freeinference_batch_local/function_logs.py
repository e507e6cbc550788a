"""The functions' output on the local stack: what CloudWatch Logs is to a deployed stack.

Every line a function writes (its execution environments' stdout and stderr, environments.py
`on_output`) goes to `<logs dir>/<function>.jsonl`, the function's logical id with `/` as `.`
(`GlmFlashModel.WorkerFunction.jsonl`), as each function has its own log group on AWS. The
lines stay JSON: a Powertools record as the function wrote it (given the function's name if it
has none: a record logged outside an invocation), any other line wrapped in a record of its own
(`message`, `stream`, `function_name`). An EMF record also goes to the local CloudWatch
(metrics_forward.py), as CloudWatch Logs makes metrics of it. A function's file is bounded:
past `LOG_FILE_MAX_BYTES` (10 MB) it becomes `<function>.jsonl.1` (replacing the one before)
and a new file starts, so a stack left running keeps at most about twice that per function.

The terminal gets, unless `verbose`, one readable line per batch status change (a record with
`batch_status`, freeinference_batch.core.observability `log_status_change`; once per batch and
status, as two chains starting together both log the move to in_progress) and one per ERROR
record; with `verbose` it gets every line as the function wrote it, as before.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import threading
from pathlib import Path
from typing import Any, TextIO

from freeinference_batch_local.metrics_forward import CloudWatchForwarder, emf_record

log = logging.getLogger(__name__)

LOGS_DIR = "logs"  # under the stack's `.local-stack/`
ERROR_LEVELS = frozenset({"ERROR", "CRITICAL"})
# A readable line shows this much of a message at most: a terminal line, not the record.
READABLE_MESSAGE_CHARS = 300
# A function's log file rotates past this size, keeping one rotated file.
LOG_FILE_MAX_BYTES = 10 * 1024 * 1024


def log_file_name(logical_id: str) -> str:
    return logical_id.replace("/", ".") + ".jsonl"


class FunctionLogs:
    """`write(logical_id, stream, line)` from any thread; `close()` once the functions are gone."""

    def __init__(self, directory: str | Path, terminal: TextIO, *, verbose: bool = False,
                 function_names: dict[str, str] | None = None, max_bytes: int = LOG_FILE_MAX_BYTES) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._sizes: dict[str, int] = {}  # bytes written to each open file
        self.terminal = terminal
        self.verbose = verbose
        # logical id -> the function's name (what its LambdaContext says), for lines without one
        self.function_names: dict[str, str] = dict(function_names or {})
        self.metrics: CloudWatchForwarder | None = None
        self._files: dict[str, TextIO] = {}
        self._shown: set[tuple[str, str]] = set()  # (batch id, status) already on the terminal
        self._lock = threading.Lock()
        self._closed = False
        self.directory.mkdir(parents=True, exist_ok=True)

    def write(self, logical_id: str, stream: str, line: str) -> None:
        if not line.strip():
            return
        record = _json_object(line)
        name = self.function_names.get(logical_id, logical_id)
        if record is None:
            record = {"message": line, "stream": stream, "function_name": name, "timestamp": _now()}
            kept = json.dumps(record)
        elif "function_name" not in record:
            record["function_name"] = name
            kept = json.dumps(record)
        else:
            kept = line
        emf = emf_record(line)
        if emf is not None and self.metrics is not None:
            self.metrics.put(emf)
        with self._lock:
            if self._closed:
                return
            self._write(logical_id, kept + "\n")
            shown = line if self.verbose else self._readable(logical_id, record)
            if shown is not None:
                self.terminal.write(shown + "\n")
                self.terminal.flush()

    def _readable(self, logical_id: str, record: dict[str, Any]) -> str | None:
        """The terminal's line for a record, or None (under the lock: `_shown`)."""
        stamp = dt.datetime.now().strftime("%H:%M:%S")
        status = record.get("batch_status")
        batch_id = record.get("batch_id")
        if isinstance(status, str) and isinstance(batch_id, str):
            if (batch_id, status) in self._shown:
                return None
            self._shown.add((batch_id, status))
            previous = record.get("previous_batch_status")
            change = f"{previous} → {status}" if previous else f"created, {status}"
            requests = record.get("requests")
            return f"{stamp} {batch_id}: {change}" + (f" ({requests} requests)" if isinstance(requests, int) else "")
        if str(record.get("level", "")).upper() in ERROR_LEVELS:
            message = str(record.get("message", "")).strip().splitlines() or [""]
            text = message[0][:READABLE_MESSAGE_CHARS]
            exception = record.get("exception_name")
            details = [f"{key}={record[key]}" for key in ("batch_id", "model") if isinstance(record.get(key), str)]
            return (f"{stamp} ERROR {logical_id}: {text}" + (f" ({exception})" if exception else "")
                    + (f" [{' '.join(details)}]" if details else "")
                    + f" (.local-stack/{LOGS_DIR}/{log_file_name(logical_id)})")
        return None

    def _write(self, logical_id: str, text: str) -> None:
        """Append to the function's file (under the lock), rotating it first if `text` would take
        it past `max_bytes` (a line alone over it still goes in whole)."""
        size = len(text.encode("utf-8"))
        if logical_id in self._files and self._sizes[logical_id] + size > self.max_bytes:
            self._files.pop(logical_id).close()
            path = self.directory / log_file_name(logical_id)
            path.replace(path.with_name(path.name + ".1"))
        self._file(logical_id).write(text)
        self._sizes[logical_id] += size

    def _file(self, logical_id: str) -> TextIO:
        handle = self._files.get(logical_id)
        if handle is None:
            # Each run's own logs ("w"); line-buffered: `tail -f` and a test see each line as written.
            handle = open(self.directory / log_file_name(logical_id), "w", encoding="utf-8", buffering=1)  # noqa: SIM115
            self._files[logical_id] = handle
            self._sizes[logical_id] = 0
        return handle

    def close_metrics(self) -> None:
        """Send the metrics queued (before moto stops)."""
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None

    def close(self) -> None:
        self.close_metrics()
        with self._lock:
            self._closed = True
            for handle in self._files.values():
                handle.close()
            self._files = {}


class InProcessOutput(io.TextIOBase):
    """A stdout for the in-process stack (`LocalStack(isolated_functions=False)`): the functions
    share this process's stdout, so a line is the function's its record names (Powertools'
    `function_name`, which on threads may be another invocation's), else `in-process`."""

    def __init__(self, logs: FunctionLogs, stream: TextIO) -> None:
        self.logs = logs
        self.stream = stream
        self._by_name = {name: logical_id for logical_id, name in logs.function_names.items()}
        self._partial = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            self._partial += text
            *lines, self._partial = self._partial.split("\n")
        for line in lines:
            record = _json_object(line) or {}
            self.logs.write(self._by_name.get(str(record.get("function_name")), "in-process"), "stdout", line)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def _json_object(line: str) -> dict[str, Any] | None:
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3] + "+0000"
