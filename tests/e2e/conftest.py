"""End-to-end fixtures: the local stack as a subprocess (`freeinference-batch dev`), driven over HTTP.

- `stack` (session): one stack with default settings and short timings (`SHORT_TIMINGS`);
- `start_stack(tmp_path, **env)`: a stack of the test's own, with env overrides
  (e.g. `BATCH_COMPLETION_WINDOW_SECONDS="5"`); stopped at the end of the test;
- `api` (function): an `Api` for the session stack with its dev key;
- `sim` (module): a simulated upstream in the test process; `engine` (module): a stack calling it,
  with fast retries (`FAST_RETRIES`); `own_stack(**env)`: a stack of the test's own calling it
  (tests/e2e/engine_helpers.py has what the tests of such stacks share).

A `StackProcess` has `base_url`, `key` (the dev key, internal tier), `cwd` (where its
`.local-stack/state.json` lives), `api(key=None)`, `admin(*args)` and `create_key(account, ...)`
(the real admin CLI, run in the stack's cwd), `set_clock_offset(seconds)` (moves the stack's
clock via BATCH_CLOCK_OFFSET_FILE), `terminal_text()` (its stderr: what a person sees), `stderr_text()`
(that, then its logs in `.local-stack/logs/`: a failing test's context) and `stop()`. A stack is
quiet, as `make dev` is, unless started with `verbose=True` (`dev --verbose`).

Every wait here has a deadline (`Api.wait_for`); nothing sleeps and hopes.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests
from console_browser import chromium
from freeinference_batch.core import clock
from freeinference_batch_local.upstream_sim import UpstreamSimulator
from selenium.webdriver.remote.webdriver import WebDriver

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 20.0
# `freeinference-batch dev`, with this interpreter (no reliance on PATH or a `cli/__main__.py`).
DEV_COMMAND = [sys.executable, "-c", "from freeinference_batch_client.cli import main; main()", "dev"]
ADMIN_COMMAND = [sys.executable, "-c", "from freeinference_batch_client.cli import main; main()", "admin"]
# Default settings, except the timings a test would otherwise wait for.
SHORT_TIMINGS = {
    "BATCH_SCHEDULE_SECONDS": "1",
    "BATCH_RETRY_BASE_SECONDS": "0.2",
    "BATCH_RETRY_MAX_SECONDS": "1",
    # A test's injected 429/503s lower the model's batch cap (model_backoff.py): halve it at most
    # once in a run and let it recover within a request or two, or the tests that inject many
    # (and those after them on the same stack) would run on one slot.
    "BATCH_BACKOFF_COOLDOWN_SECONDS": "3600",
    "BATCH_RECOVERY_SECONDS": "0.5",
}
# Fast retries (the engine's stacks): a request that is retried 8 times still settles in a few seconds.
FAST_RETRIES = {"BATCH_RETRY_BASE_SECONDS": "0.05", "BATCH_RETRY_MAX_SECONDS": "0.5", "BATCH_SCHEDULE_SECONDS": "1"}
_LINE = re.compile(r"(?P<base_url>https?://\S+/v1)\b.*?(?P<key>hyi-[A-Za-z0-9_\-]+)")
_KEY = re.compile(r"hyi-[A-Za-z0-9_\-]+")
T = TypeVar("T")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.e2e)


class Api:
    """A requests.Session for one key against one stack; paths are relative to the base URL."""

    def __init__(self, base_url: str, key: str | None = None, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.key = key
        self.timeout = timeout
        self.session = requests.Session()
        if key:
            self.session.headers["Authorization"] = f"Bearer {key}"

    def url(self, path: str) -> str:
        """`"/batches"` -> `<base_url>/batches` (a full URL is kept as it is)."""
        return path if path.startswith("http") else f"{self.base_url}/{path.lstrip('/')}"

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", self.timeout)
        return self.session.request(method, self.url(path), **kwargs)

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("POST", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("DELETE", path, **kwargs)

    def create_batch(self, items: list[dict], **fields: Any) -> requests.Response:
        """POST /batches with `items` as the `requests` array (plus any other body fields)."""
        return self.post("/batches", json={"requests": items, **fields})

    def batch(self, batch_id: str) -> dict:
        answer = self.get(f"/batches/{batch_id}")
        answer.raise_for_status()
        return answer.json()

    def results(self, batch_id: str) -> list[dict]:
        """Every result line of a batch, paging 1,000 at a time."""
        out: list[dict] = []
        after = None
        while True:
            params: dict[str, Any] = {"limit": 1000}
            if after:
                params["after"] = after
            answer = self.get(f"/batches/{batch_id}/results", params=params)
            assert answer.status_code == 200, answer.text
            page = answer.json()
            out.extend(page["data"])
            if not page["has_more"]:
                return out
            after = page["last_id"]

    def wait_for(
        self, predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.05, message: str = "condition"
    ) -> T:
        """Poll `predicate` until it returns something truthy (returned); fail at the deadline."""
        return wait_for(predicate, timeout=timeout, interval=interval, message=message)

    def wait_for_status(self, batch_id: str, statuses: str | set[str] | tuple[str, ...], timeout: float = 30.0) -> dict:
        """Poll the batch until its status is one of `statuses`; returns the batch object."""
        wanted = {statuses} if isinstance(statuses, str) else set(statuses)
        last: dict = {}

        def reached() -> dict | None:
            nonlocal last
            last = self.batch(batch_id)
            return last if last.get("status") in wanted else None

        try:
            return self.wait_for(reached, timeout=timeout, message=f"batch {batch_id} in {sorted(wanted)}")
        except AssertionError as error:
            raise AssertionError(f"{error}; last seen: {last}") from None


def wait_for(
    predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.05, message: str = "condition"
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {message} (last value: {value!r})")
        time.sleep(interval)


class StackProcess:
    """One `freeinference-batch dev` process (see the module docstring)."""

    def __init__(
        self,
        proc: subprocess.Popen,
        cwd: Path,
        env: dict[str, str],
        stderr_path: Path,
        base_url: str,
        key: str,
        first_line: str,
        started_in: float,
    ) -> None:
        self.proc = proc
        self.cwd = cwd
        self.env = env
        self.stderr_path = stderr_path
        self.base_url = base_url
        self.key = key
        self.first_line = first_line
        self.started_in = started_in
        self.stdout_after_first_line = ""  # read at stop(): the stack must print nothing more

    @property
    def state_file(self) -> Path:
        return self.cwd / ".local-stack" / "state.json"

    def api(self, key: str | None = None) -> Api:
        """An Api with `key` (default: the dev key); `api(key="")` sends no key."""
        return Api(self.base_url, self.key if key is None else key)

    def admin(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """`freeinference-batch admin ARGS` in the stack's cwd (it finds the stack through state.json)."""
        env = {name: value for name, value in self.env.items() if not name.startswith("AWS_")}
        result = subprocess.run(
            [*ADMIN_COMMAND, *args], cwd=self.cwd, env=env, capture_output=True, text=True, timeout=60
        )
        if check and result.returncode != 0:
            raise AssertionError(f"admin {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
        return result

    def create_key(
        self,
        account: str,
        *,
        tier: str | None = None,
        daily_quota_usd: float | None = None,
        concurrency: int | None = None,
    ) -> str:
        """A new key (and the account if new) through the admin CLI."""
        args = ["create-key", "--account", account]
        if tier is not None:
            args += ["--tier", tier]
        if daily_quota_usd is not None:
            args += ["--daily-quota-usd", str(daily_quota_usd)]
        if concurrency is not None:
            args += ["--concurrency", str(concurrency)]
        output = self.admin(*args).stdout
        found = _KEY.search(output)
        assert found, f"no key in the output of admin create-key: {output!r}"
        return found.group(0)

    def set_clock_offset(self, seconds: float) -> None:
        """Move the stack's clock (and every process sharing BATCH_CLOCK_OFFSET_FILE) by `seconds`."""
        clock.set_offset(self.env["BATCH_CLOCK_OFFSET_FILE"], seconds)

    @property
    def logs_dir(self) -> Path:
        return self.cwd / ".local-stack" / "logs"

    def terminal_text(self) -> str:
        """What the stack wrote to its stderr: a person's terminal."""
        return _read(self.stderr_path)

    def stderr_text(self) -> str:
        """The terminal's text, then every function's log and the stack's own, which is last (the
        tail a failure message shows): a quiet stack keeps the details there."""
        return stack_output(self.stderr_path, self.logs_dir)

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT_SECONDS) -> int:
        """SIGINT (Ctrl-C), then SIGKILL after `timeout`; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.stdout_after_first_line = self.proc.stdout.read()
            self.proc.stdout.close()
        return self.proc.returncode

    def __enter__(self) -> StackProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_started: list[StackProcess] = []


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def stack_output(stderr_path: Path, logs_dir: Path) -> str:
    files = [*sorted(logs_dir.glob("*.jsonl")), logs_dir / "local-stack.log"]
    sections = [_read(stderr_path)] + [f"--- {path.name} ---\n{_read(path)}" for path in files if path.is_file()]
    return "\n".join(sections)


def launch_stack(cwd: Path, *, verbose: bool = False, **env_overrides: str) -> StackProcess:
    """Start `freeinference-batch dev` (`--verbose` if asked) in `cwd` and wait (60 s at most) for
    its one stdout line."""
    cwd.mkdir(parents=True, exist_ok=True)
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("AWS_", "BATCH_", "UPSTREAM_", "POWERTOOLS_", "LOCAL_AWS_FAULTS"))
    }
    env.update(
        {
            "PORT": "0",
            "PYTHONUNBUFFERED": "1",
            "FREEINFERENCE_REPO_ROOT": str(REPO),
            "BATCH_CLOCK_OFFSET_FILE": str(cwd / "clock-offset"),
            # The tests' loopback webhook receivers listen on whatever port was free.
            "WEBHOOK_LOOPBACK_PORTS": "1024-65535",
        }
    )
    env.update({name: str(value) for name, value in env_overrides.items()})
    stderr_path = cwd / "stack.stderr.log"
    started = time.monotonic()
    with open(stderr_path, "wb") as stderr:  # a file, not a pipe: a chatty stack never blocks on it
        proc = subprocess.Popen(
            [*DEV_COMMAND, "--verbose"] if verbose else DEV_COMMAND,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            encoding="utf-8",
        )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=START_TIMEOUT_SECONDS)
    except queue.Empty:
        line = ""
    found = _LINE.search(line)
    if not found:
        proc.kill()
        proc.wait(10)
        log = stack_output(stderr_path, cwd / ".local-stack" / "logs")
        pytest.fail(
            f"the local stack did not start within {START_TIMEOUT_SECONDS} s (exit code {proc.returncode}); "
            f"stdout line: {line!r}\n--- stderr ---\n{log[-20000:]}"
        )
    stack = StackProcess(proc, cwd, env, stderr_path, found["base_url"], found["key"], line, time.monotonic() - started)
    _started.append(stack)
    return stack


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackProcess]:
    """One local stack for the session: default settings, short schedule and retry timings."""
    process = launch_stack(tmp_path_factory.mktemp("stack"), **SHORT_TIMINGS)
    yield process
    process.stop()


@pytest.fixture
def start_stack() -> Iterator[Callable[..., StackProcess]]:
    """`start_stack(tmp_path, verbose=False, **env)`: a stack of the test's own (SHORT_TIMINGS unless
    overridden)."""
    mine: list[StackProcess] = []

    def start(tmp_path: Path, verbose: bool = False, **env: str) -> StackProcess:
        process = launch_stack(Path(tmp_path) / f"stack-{len(mine)}", verbose=verbose, **{**SHORT_TIMINGS, **env})
        mine.append(process)
        return process

    yield start
    for process in mine:
        process.stop()


@pytest.fixture
def api(stack: StackProcess) -> Api:
    return stack.api()


@pytest.fixture(scope="session", autouse=True)
def _stop_every_stack() -> Iterator[None]:
    yield
    for process in _started:
        with contextlib.suppress(Exception):
            process.stop()


@pytest.fixture(scope="module")
def sim() -> Iterator[UpstreamSimulator]:
    """A simulated upstream in the test process, whose counters a test reads directly."""
    simulator = UpstreamSimulator()
    simulator.start()
    yield simulator
    simulator.stop()


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, sim: UpstreamSimulator) -> Iterator[StackProcess]:
    """One stack for a module's tests: default limits, fast retries, the test process's simulator."""
    process = launch_stack(
        tmp_path_factory.mktemp("engine"), **{**SHORT_TIMINGS, **FAST_RETRIES, "UPSTREAM_BASE_URL": sim.base_url}
    )
    yield process
    process.stop()


@pytest.fixture
def own_stack(tmp_path: Path, sim: UpstreamSimulator) -> Iterator:
    """`own_stack(**env)`: a stack of the test's own, calling the test process's simulator."""
    mine: list[StackProcess] = []

    def start(**env: str) -> StackProcess:
        process = launch_stack(
            tmp_path / f"stack-{len(mine)}",
            **{**SHORT_TIMINGS, **FAST_RETRIES, "UPSTREAM_BASE_URL": sim.base_url, **env},
        )
        mine.append(process)
        return process

    yield start
    for process in mine:
        process.stop()


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where a module's browser saves what its pages download."""
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory, downloads: Path) -> Iterator[WebDriver]:
    """A headless Chromium for the module's console tests (console_browser.chromium)."""
    with chromium(tmp_path_factory.mktemp("chromium-profile"), downloads) as driver:
        yield driver
