"""Shared helpers for the benchmarks: payloads, the local stack (subprocess or in-process), HTTP,
peak memory, profiles and the summary table. Not a test module: nothing here asserts.
"""

from __future__ import annotations

import contextlib
import cProfile
import gzip
import io
import json
import os
import pstats
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import requests

REPO = Path(__file__).resolve().parents[1]
# Set before the service's modules are imported here: Powertools reads it when its logger is made.
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
PYTHON = sys.executable
DEV_COMMAND = [PYTHON, "-c", "from freeinference_batch_client.cli import main; main()", "dev"]
MODEL = "glm-5.3-flash"
_LINE = re.compile(r"(?P<base_url>https?://\S+/v1)\b.*?(?P<key>hyi-[A-Za-z0-9_\-]+)")
FINAL = {"completed", "failed", "expired", "cancelled"}
# A plain body this large and more is past what API Gateway hands Lambda (its 6 MB event, base64
# and headers included): the local stack refuses it with 413 as AWS does.
PLAIN_BODY_BYTES = 5_000_000
# Short schedule/retry timings, as the e2e tests use: nothing in a benchmark should wait a minute.
SHORT_TIMINGS = {
    "BATCH_SCHEDULE_SECONDS": "1",
    "BATCH_RETRY_BASE_SECONDS": "0.2",
    "BATCH_RETRY_MAX_SECONDS": "1",
}

_PROMPTS = [
    "Summarize in one sentence: ",
    "Translate into French: ",
    "Classify the sentiment of this review: ",
    "Extract the people and places named in: ",
    "Write a one-line title for: ",
]
_TEXT = (
    "the quarterly report shows revenue up four percent on last year, driven by the new subscription "
    "tier, while support costs fell after the self-service portal launched in March; the board expects "
    "the trend to hold through the autumn as two more regions go live"
)
# 10 MiB / 50,000 requests: the create benchmark's "about 10 MiB of JSON".
DEFAULT_REQUEST_BYTES = 210


def chat_request(i: int, model: str = MODEL, directive: str = "", size: int = DEFAULT_REQUEST_BYTES) -> dict:
    """One realistic small batch entry: a user message padded/trimmed so the entry's JSON is about
    `size` bytes (method and url are left to their documented defaults, as clients often do)."""
    head = _PROMPTS[i % len(_PROMPTS)]
    tail = f" (#{i})" + (f" {directive}" if directive else "")
    entry = {
        "custom_id": f"req-{i:06d}",
        "body": {"model": model, "messages": [{"role": "user", "content": head + tail}], "max_tokens": 64},
    }
    room = max(0, size - len(json.dumps(entry)))
    text = (_TEXT * (1 + room // len(_TEXT)))[:room].rstrip()
    entry["body"]["messages"][0]["content"] = head + text + tail
    return entry


def batch_body(
    n: int, model: str = MODEL, directive: str = "", size: int = DEFAULT_REQUEST_BYTES, **fields: Any
) -> dict:
    return {"requests": [chat_request(i, model, directive, size) for i in range(n)], **fields}


# ---------------------------------------------------------------- the local stack


class StackProcess:
    """`freeinference-batch dev` as a subprocess (its memory is its own), cwd a fresh temp dir."""

    def __init__(
        self,
        env: dict[str, str] | None = None,
        timeout: float = 90.0,
        *,
        paused: bool = False,
        short_timings: bool = True,
        stats: bool = False,
        template: Path | None = None,
    ) -> None:
        """`paused`: run bench/_stack_server.py --paused instead (the same LocalStack, workers paused).
        `stats`: run bench/_stack_server.py --stats, which appends the stack's counters to
        `stats_path` every 0.5 s (see `read_stats`). `template`: run bench/_stack_server.py on
        this template instead of the repo's (see `write_sized_template`)."""
        self.dir = Path(tempfile.mkdtemp(prefix="fi-bench-"))
        full = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("AWS_", "BATCH_", "UPSTREAM_", "POWERTOOLS_"))
        }
        full.update(
            {
                "PORT": "0",
                "PYTHONUNBUFFERED": "1",
                "FREEINFERENCE_REPO_ROOT": str(REPO),
                "LOCAL_STACK_LOG_LEVEL": "WARNING",
                "POWERTOOLS_LOG_LEVEL": "WARNING",
                **(SHORT_TIMINGS if short_timings else {}),
                **(env or {}),
            }
        )
        self.stderr_path = self.dir / "stack.stderr.log"
        self.stats_path = self.dir / "stack.stats.jsonl"
        with open(self.stderr_path, "wb") as stderr:
            command = DEV_COMMAND
            if paused or stats or template:
                command = [PYTHON, str(REPO / "bench" / "_stack_server.py"), *(["--paused"] if paused else []),
                           *(["--stats", str(self.stats_path)] if stats else []),
                           *(["--template", str(template)] if template else [])]
            self.proc = subprocess.Popen(
                command,
                cwd=self.dir,
                env=full,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: lines.put(self.proc.stdout.readline()), daemon=True).start()
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            line = ""
        found = _LINE.search(line)
        if not found:
            self.stop()
            tail = self.stderr_path.read_text(errors="replace")[-5000:]
            raise RuntimeError(f"the local stack did not start: {line!r}\n{tail}")
        self.base_url, self.key = found["base_url"], found["key"]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def state(self) -> dict[str, Any]:
        """The stack's state file: its environment (UPSTREAM_BASE_URL, queue URLs...) and base URL."""
        return json.loads((self.dir / ".local-stack" / "state.json").read_text())

    @property
    def upstream_url(self) -> str:
        return self.state()["env"]["UPSTREAM_BASE_URL"]

    def admin(self, *args: str) -> str:
        """`freeinference-batch admin ARGS` against this stack (from its directory, where the state
        file is, as the admin CLI expects); returns its stdout."""
        env = {name: value for name, value in os.environ.items()
               if not name.startswith(("AWS_", "BATCH_", "UPSTREAM_", "POWERTOOLS_"))}
        env["POWERTOOLS_LOG_LEVEL"] = "WARNING"
        done = subprocess.run([PYTHON, "-c", "from freeinference_batch_client.cli import main; main()", "admin", *args],
                              cwd=self.dir, env=env, capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"admin {' '.join(args)} failed: {done.stderr[-2000:]}")
        return done.stdout.strip()

    def read_stats(self) -> list[dict[str, Any]]:
        """The stats lines written so far (`stats=True`), oldest first."""
        try:
            text = self.stats_path.read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@contextlib.contextmanager
def in_process_stack(env: dict[str, str] | None = None, short_timings: bool = True,
                     moto_in_process: bool = True, template: Path | None = None) -> Iterator[Any]:
    """`LocalStack` in this process, its functions on threads here rather than in execution
    environments (for profiles and botocore event hooks); moto too, unless
    `moto_in_process` is False (the instruments that time or count moto's work need it here).
    `template`: the stack's template, if not the repo's (see `write_sized_template`)."""
    import logging

    from freeinference_batch_local.stack import LocalStack

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    for name in ("freeinference_batch", "freeinference_batch_local", "werkzeug"):
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    warnings.filterwarnings("ignore", message="No application metrics to publish")
    state_dir = tempfile.mkdtemp(prefix="fi-bench-")
    full_env = {**(SHORT_TIMINGS if short_timings else {}), **(env or {})}
    # The functions on threads of this process (isolated_functions=False), not in execution
    # environments of their own: the instruments patch this process's handlers and boto3 clients.
    stack = LocalStack(port=0, env=full_env, state_dir=state_dir, write_state_file=False,
                       moto_in_process=moto_in_process, template_path=template, isolated_functions=False)
    real_stdout = sys.stdout
    sys.stdout = _DropMetricLines(real_stdout)  # the handlers' EMF metrics would bury the figures
    try:
        stack.start()
        yield stack
    finally:
        try:
            stack.stop()
        finally:
            sys.stdout = real_stdout


class _DropMetricLines(io.TextIOBase):
    """A stdout that drops the Powertools EMF metric lines (`{"_aws": ...}`) and passes the rest."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.pending = ""
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            self.pending += text
            *lines, self.pending = self.pending.split("\n")
            for line in lines:
                if not line.startswith('{"_aws"'):
                    self.target.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        with self.lock:
            if self.pending and not self.pending.startswith('{"_aws"'):
                self.target.write(self.pending)
                self.pending = ""
            self.target.flush()


def write_catalog(directory: Path | str, concurrency: int, models: list[str] | None = None) -> Path:
    """The packaged catalog with `batch_concurrency` set to `concurrency` (see
    freeinference_batch_local.sizing)."""
    from freeinference_batch_local.sizing import write_catalog as write

    return write(REPO, directory, concurrency, models)


def write_sized_template(directory: Path | str, concurrency: int, model: str = MODEL) -> Path:
    """template.yaml with `model`'s block sized for `concurrency` (see freeinference_batch_local.sizing)."""
    from freeinference_batch_local.sizing import write_sized_template as write

    return write(REPO, directory, concurrency, model)


def template_poller_cap(function: str = "GlmFlashModel/WorkerFunction",
                        template_path: Path | None = None) -> dict[str, Any]:
    """The worker's SQS event settings from the template (template.yaml unless given) that bound how
    many requests run at once: BatchSize (records an invocation runs side by side), the batching
    window, MaximumConcurrency, reserved concurrency."""
    from freeinference_batch_local.cloudformation.template import load_template

    properties = load_template(template_path or REPO / "template.yaml")["Resources"][function]["Properties"]
    event = next(iter(properties["Events"].values()))["Properties"]
    return {"batch_size": int(event.get("BatchSize", 10)),
            "window": float(event.get("MaximumBatchingWindowInSeconds") or 0),
            "maximum_concurrency": (event.get("ScalingConfig") or {}).get("MaximumConcurrency"),
            "reserved": properties.get("ReservedConcurrentExecutions"),
            "timeout": properties.get("Timeout")}


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


# ---------------------------------------------------------------- HTTP


class Client:
    def __init__(self, base_url: str, key: str, timeout: float = 300.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {key}"
        self.last_bytes = 0  # size of the last answer's body

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        kwargs.setdefault("timeout", self.timeout)
        answer = self.session.request(method, self.base_url + path, **kwargs)
        if answer.status_code >= 400:
            raise RuntimeError(f"{method} {path} -> {answer.status_code}: {answer.text[:500]}")
        self.last_bytes = len(answer.content)
        return answer.json()

    def create(self, data: bytes) -> tuple[dict, float]:
        """POST /batches with an already-encoded body; returns (batch, wall seconds). A body past
        what a plain one may be (Lambda's 6 MB event) goes gzipped, as the project's client sends
        it; the compression is not in the time."""
        headers = {"Content-Type": "application/json"}
        if len(data) > PLAIN_BODY_BYTES:
            data, headers["Content-Encoding"] = gzip.compress(data, 6), "gzip"
        started = time.perf_counter()
        batch = self.call("POST", "/batches", data=data, headers=headers)
        return batch, time.perf_counter() - started

    def batch(self, batch_id: str) -> dict:
        return self.call("GET", f"/batches/{batch_id}")

    def cancel(self, batch_id: str) -> dict:
        return self.call("POST", f"/batches/{batch_id}/cancel")

    def wait_final(self, batch_id: str, timeout: float, interval: float = 0.1) -> tuple[dict, float]:
        """Poll until the batch is final; returns (batch, seconds waited)."""
        started = time.perf_counter()
        while True:
            batch = self.batch(batch_id)
            if batch["status"] in FINAL:
                return batch, time.perf_counter() - started
            if time.perf_counter() - started > timeout:
                raise TimeoutError(f"batch {batch_id} not final after {timeout} s: {batch['request_counts']}")
            time.sleep(interval)

    def read_all(self, batch_id: str, limit: int = 1000) -> tuple[list[dict], list[float]]:
        """Every result, `limit` a page; returns (results, per-page seconds); page sizes in `page_bytes`."""
        results: list[dict] = []
        pages: list[float] = []
        self.page_bytes: list[int] = []
        after = None
        while True:
            params: dict[str, Any] = {"limit": limit}
            if after:
                params["after"] = after
            started = time.perf_counter()
            page = self.call("GET", f"/batches/{batch_id}/results", params=params)
            pages.append(time.perf_counter() - started)
            self.page_bytes.append(self.last_bytes)
            results.extend(page["data"])
            if not page["has_more"]:
                return results, pages
            after = page["last_id"]


# ---------------------------------------------------------------- memory, profiles, output


def proc_status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS / VmHWM / VmPeak of a process, in KiB."""
    out = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM", "VmPeak"):
                out[name] = int(value.split()[0])
    return out


def reset_peak_rss(pid: int | str) -> bool:
    """Reset VmHWM to the current RSS (Linux: write 5 to clear_refs); False if not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def mib(kib: float) -> str:
    return f"{kib / 1024:.0f} MiB"


class ThreadProfiles:
    """cProfile for calls made on any thread: wrap a function, every call runs under one shared
    profiler at a time (cProfile only sees the thread that enabled it)."""

    def __init__(self) -> None:
        self.stats: pstats.Stats | None = None
        self._lock = threading.Lock()

    def wrap(self, function: Callable[..., Any]) -> Callable[..., Any]:
        def profiled(*args: Any, **kwargs: Any) -> Any:
            profile = cProfile.Profile()
            try:
                return profile.runcall(function, *args, **kwargs)
            finally:
                with self._lock:
                    if self.stats is None:
                        self.stats = pstats.Stats(profile, stream=io.StringIO())
                    else:
                        self.stats.add(profile)

        return profiled

    def top(self, count: int = 15, sort: str = "cumulative") -> str:
        if self.stats is None:
            return "(no calls profiled)"
        stream = io.StringIO()
        self.stats.stream = stream
        self.stats.sort_stats(sort).print_stats(count)
        text = stream.getvalue()
        # Drop the preamble up to the column header, keep paths short.
        text = text[text.find("   ncalls") :] if "   ncalls" in text else text
        return text.replace(str(REPO) + "/", "").replace(sys.prefix + "/", "")


def table(rows: list[tuple[Any, ...]], header: tuple[str, ...]) -> str:
    cells = [tuple(str(c) for c in header), *[tuple(str(c) for c in row) for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = []
    for number, row in enumerate(cells):
        pairs = enumerate(zip(row, widths, strict=True))
        lines.append("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in pairs))
        if number == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def dumps(body: Any) -> bytes:
    return json.dumps(body).encode()


def moto_environment() -> None:
    """What moto in this process needs of the environment, set before the service's modules are
    imported (Powertools reads its switches when they are)."""
    os.environ.update(AWS_DEFAULT_REGION="us-east-1", AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                      POWERTOOLS_METRICS_DISABLED="true", POWERTOOLS_TRACE_DISABLED="true")
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        os.environ.pop(name, None)


@contextlib.contextmanager
def moto_service(template_path: Path | None = None) -> Iterator[Any]:
    """The service's AWS resources, made from template.yaml in moto in this process (no stack, no
    server), and its settings as its functions would read them. Yields the settings."""
    import boto3

    moto_environment()
    from freeinference_batch.core import aws
    from freeinference_batch.core.settings import get_settings
    from freeinference_batch_local.cloudformation.resources import TemplateResources, template_environment
    from freeinference_batch_local.cloudformation.template import load_template
    from moto import mock_aws

    template = load_template(template_path or REPO / "template.yaml")
    with mock_aws():
        aws.reset_clients()
        resources = TemplateResources(template, {name: boto3.client(name)
                                                 for name in ("dynamodb", "sqs", "s3", "secretsmanager")})
        resources.create_all()
        env, _ = template_environment(template, resources)
        os.environ.update(env)
        get_settings.cache_clear()
        yield get_settings()
