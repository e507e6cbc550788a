"""Lambda execution environments on one machine: a process per environment, one event at a time.

Lambda gives an execution environment one event at a time, and each environment has its own
module state (the Powertools resolver's `app.current_event`, cached clients, Logger keys); more
concurrency means more environments. Running every invocation on threads of one process shares
that state between invocations: one request's query string, headers or body read by another.
So each function here has an `EnvironmentPool` of `ExecutionEnvironment`s, each a child process
(`python -m freeinference_batch_local.runtime`, see runtime.py for the frames):

- an environment imports the handler once (cold start) and then serves invocations one at a time;
- the pool reuses an idle environment (the one used last: Lambda favours warm ones) and starts a
  new one only when all are busy, never more than the function's concurrency
  (`FunctionSpec.concurrency`); beyond a function's reserved concurrency
  (`ReservedConcurrentExecutions`) an invocation is throttled as Lambda throttles it
  (`FunctionError` of type `TooManyRequestsException`, "Rate Exceeded.", the handler never
  runs; the API emulation answers it as API Gateway does, a queue poller backs off); a function
  without one waits for an environment to be free (AWS would start more; locally each is a
  process);
- the function's `Timeout` is enforced as Lambda does: the invocation fails with "Task timed
  out after N seconds" and that environment is killed and discarded; so is an environment whose
  process dies mid-invocation (`Runtime.ExitError`); the next invocation starts a new one;
- a handler's exception is the invocation's error result (`FunctionError`, with Lambda's
  `errorMessage` and `errorType`), raised to the caller: the API emulation answers it as API
  Gateway does (500), a queue poller treats it as a failed batch;
- an environment's deadline is set when it takes the event (after any cold start, as Lambda's
  timeout does not count the init phase) and passed to the child's `LambdaContext`;
- children inherit the environment variables the stack set, leave the terminal's process group
  (Ctrl-C is the stack's to handle) and exit when their stdin closes: at `close()`, or when the
  stack dies;
- a child's stdout and stderr (its logs and EMF metrics) are the stack's own, unless the pool has
  an `on_output`: then each line goes to it with the function's logical id and the stream's name
  (`freeinference-batch dev` writes them to `.local-stack/logs/`, function_logs.py), as Lambda
  sends each function's output to its own log group.

Where it differs from Lambda: no init-phase limit of 10 s (a cold start on a loaded machine may
take longer; `START_TIMEOUT_SECONDS`); idle environments are kept until the stack stops; a
function without reserved concurrency waits beyond `LOCAL_UNRESERVED_CONCURRENCY` instead of
scaling; memory is not limited to `MemorySize` (only reported in the context).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from freeinference_batch_local.handlers import FunctionSpec

log = logging.getLogger(__name__)

# A cold start imports boto3, Powertools and pydantic (~0.5 s of CPU on an idle machine).
START_TIMEOUT_SECONDS = 60.0
# How long `close()` lets environments exit on their own before killing them.
STOP_GRACE_SECONDS = 2.0


# Lambda's answer to an invocation beyond the function's reserved concurrency (Invoke: HTTP 429,
# `Reason: ReservedFunctionConcurrentInvocationLimitExceeded`).
THROTTLED = "TooManyRequestsException"
THROTTLED_MESSAGE = "Rate Exceeded."


def is_throttle(error: BaseException) -> bool:
    """The invocation was throttled: the handler never ran, the event may be sent again."""
    return getattr(error, "error_type", None) == THROTTLED


# `on_output(logical_id, stream, line)`: one line (without its newline) a child wrote to
# "stdout" or "stderr".
OutputCallback = Callable[[str, str, str], None]


class FunctionError(Exception):
    """A failed invocation, as Lambda answers it: `errorMessage`, `errorType` (and a stack trace).
    `logged_by_function`: the child wrote the error to the function's log itself (an exception in
    the handler or its import), as against a timeout or a death only the stack saw."""

    def __init__(
        self,
        error_message: str,
        error_type: str,
        stack_trace: list[str] | None = None,
        *,
        logged_by_function: bool = False,
    ) -> None:
        super().__init__(f"{error_type}: {error_message}")
        self.error_message = error_message
        self.error_type = error_type
        self.stack_trace = stack_trace or []
        self.logged_by_function = logged_by_function

    @property
    def payload(self) -> dict[str, Any]:
        return {"errorMessage": self.error_message, "errorType": self.error_type, "stackTrace": self.stack_trace}


class ExecutionEnvironment:
    """One child process running one function's handler; `invoke` one event at a time."""

    def __init__(
        self,
        function: FunctionSpec,
        on_notice: Callable[[str], None] | None = None,
        on_output: OutputCallback | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.function = function
        self.on_notice = on_notice
        self.on_output = on_output
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None
        self.init_seconds: float | None = None
        self.invocations = 0
        self._connection: Connection | None = None
        self._dead = False

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        return not self._dead and self.process is not None and self.process.poll() is None

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> float:
        """Start the process and wait for its cold start; returns the init seconds, or raises
        `FunctionError` (the handler did not import, or the process did not come up)."""
        parent_end, child_end = socket.socketpair()
        # The child imports this package (the runtime) by its root, installed or not, as
        # MotoProcess does; everything else is the function's own environment (`env`: the stack
        # gives each function its template variables only), else os.environ as set.
        package_root = str(Path(__file__).resolve().parents[1])
        base = os.environ if self.env is None else self.env
        env = {**base, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, base.get("PYTHONPATH")]))}
        if self.on_output is not None:
            # On a pipe Python buffers stdout by the block: a metric or a log line would reach
            # the stack seconds late (or never, if the environment is killed).
            env["PYTHONUNBUFFERED"] = "1"
        piped = subprocess.PIPE if self.on_output is not None else None
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable, "-m", "freeinference_batch_local.runtime",
                    "--fd", str(child_end.fileno()),
                    "--code-dir", str(self.function.code_dir),
                    "--handler", self.function.handler_name,
                    "--function-name", self.function.name,
                    "--memory-mb", str(self.function.memory_mb),
                ],
                stdin=subprocess.PIPE,
                stdout=piped,
                stderr=piped,
                pass_fds=(child_end.fileno(),),
                env=env,
                start_new_session=True,
            )  # fmt: skip
        finally:
            child_end.close()
        self._read_output()
        self._connection = Connection(parent_end.detach())
        frame = self._receive(time.monotonic() + timeout)
        if frame is None or frame.get("type") != "ready":
            self.kill()
            if frame is not None and frame.get("type") == "init_error":
                raise FunctionError(frame["errorMessage"], frame["errorType"], frame.get("stackTrace"),
                                    logged_by_function=True)
            raise FunctionError(
                f"the execution environment of {self.function.name} did not start within {timeout:.0f} s",
                "Runtime.ExitError" if frame is None and not self.alive else "Sandbox.Timedout",
            )
        self.init_seconds = float(frame.get("init_seconds") or 0.0)
        return self.init_seconds

    def invoke(self, event: Any, request_id: str, timeout_seconds: float) -> Any:
        """One invocation; the handler's answer, or `FunctionError`. An environment that timed out
        or whose process died is dead afterwards (`alive` is False)."""
        if not self.alive or self._connection is None or self._connection.closed:
            raise FunctionError(f"RequestId: {request_id} Error: the environment is gone", "Runtime.ExitError")
        self.invocations += 1
        deadline = time.monotonic() + timeout_seconds
        request = json.dumps(
            {"type": "invoke", "request_id": request_id, "deadline_ms": int((time.time() + timeout_seconds) * 1000),
             "event": event}
        ).encode("utf-8")  # fmt: skip
        try:
            self._connection.send_bytes(request)
        except OSError:
            return self._died(request_id)
        while True:
            frame = self._receive(deadline)
            if frame is None:
                if self.process is not None and self.process.poll() is None and time.monotonic() >= deadline:
                    self.kill()
                    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
                    raise FunctionError(
                        f"{stamp} {request_id} Task timed out after {timeout_seconds:.2f} seconds", "Sandbox.Timedout"
                    )
                return self._died(request_id)
            kind = frame.get("type")
            if kind == "notice":
                if self.on_notice is not None:
                    try:
                        self.on_notice(str(frame.get("what")))
                    except Exception:
                        log.exception("%s: a notice's callback failed", self.function.name)
                continue
            if kind == "result":
                return frame.get("payload")
            if kind == "error":
                if frame["errorType"] == "Runtime.ExitError":
                    self._reap()
                raise FunctionError(frame["errorMessage"], frame["errorType"], frame.get("stackTrace"),
                                    logged_by_function=True)
            self.kill()
            raise FunctionError(f"RequestId: {request_id} Error: unexpected frame {kind!r}", "Runtime.ExitError")

    def _read_output(self) -> None:
        """A thread per piped stream, handing each line to `on_output` until the child's end of it
        closes (the process exited, or was killed)."""
        if self.on_output is None or self.process is None:
            return
        for name, stream in (("stdout", self.process.stdout), ("stderr", self.process.stderr)):
            if stream is not None:
                threading.Thread(target=self._forward_lines, args=(name, stream), daemon=True,
                                 name=f"{self.function.logical_id}-{name}").start()

    def _forward_lines(self, name: str, stream: Any) -> None:
        on_output = self.on_output
        assert on_output is not None
        with stream:
            for raw in iter(stream.readline, b""):
                try:
                    on_output(self.function.logical_id, name, raw.decode("utf-8", "replace").rstrip("\r\n"))
                except Exception:  # a line the stack could not keep must not stop the child's output
                    log.exception("%s: could not handle a line of its %s", self.function.logical_id, name)

    def _receive(self, deadline: float) -> dict[str, Any] | None:
        """The next frame, or None at the deadline or when the child's end closes."""
        connection = self._connection
        assert connection is not None
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                # poll() in steps so that a child that died is seen even before its socket closes.
                if connection.poll(min(remaining, 1.0)):
                    return json.loads(connection.recv_bytes())
                if self.process is not None and self.process.poll() is not None:
                    return None
        except (EOFError, OSError):
            return None

    def _died(self, request_id: str) -> Any:
        code = self._reap()
        reason = f"signal: {_signal_name(-code)}" if code is not None and code < 0 else f"exit status {code}"
        raise FunctionError(f"RequestId: {request_id} Error: Runtime exited with error: {reason}", "Runtime.ExitError")

    def _reap(self) -> int | None:
        self._dead = True
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.process.returncode

    def kill(self) -> None:
        """End the process now (a timed-out invocation, a stuck stop)."""
        self._dead = True
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=5)
        self._close_pipes()

    def begin_stop(self) -> None:
        """Ask the child to exit (its stdin closes); `finish_stop` waits for it."""
        self._dead = True
        if self.process is not None and self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()

    def finish_stop(self, deadline: float) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_pipes()

    def _close_pipes(self) -> None:
        if self.process is not None and self.process.stdin is not None and not self.process.stdin.closed:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        # Closed but kept: an invocation still waiting on it (a stop from another thread) gets
        # OSError("handle is closed"), which reads as the environment's end.
        if self._connection is not None:
            self._connection.close()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name.removeprefix("SIG").lower()
    except ValueError:
        return str(number)


class EnvironmentPool:
    """One function's execution environments; calling it is one invocation (a handler's signature,
    so the pollers, timers and API routes take it where they took the handler in-process)."""

    def __init__(
        self,
        function: FunctionSpec,
        *,
        max_environments: int | None = None,
        on_notice: Callable[[str], None] | None = None,
        on_output: OutputCallback | None = None,
        start_timeout: float = START_TIMEOUT_SECONDS,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.function = function
        self.on_output = on_output
        self.env = env  # the environment variables its environments start with (None: os.environ)
        self.name = function.logical_id
        self.max_environments = max(1, int(max_environments or function.concurrency))
        # Lambda throttles beyond a reserved concurrency; a function without one here waits.
        reserved = function.reserved_concurrency
        self.throttles = reserved is not None and self.max_environments >= reserved
        self.timeout = function.timeout
        self.on_notice = on_notice
        self.start_timeout = start_timeout
        self._condition = threading.Condition()
        self._idle: list[ExecutionEnvironment] = []  # the one released last at the end
        self._all: set[ExecutionEnvironment] = set()
        self._reserved = 0  # environments counted against the cap: running, idle or starting
        self._busy = 0
        self._closed = False
        self._counts = dict.fromkeys(("invocations", "errors", "timeouts", "exits", "cold_starts", "init_errors",
                                     "throttles"), 0)
        self._max_busy = 0
        self._init_seconds: list[float] = []

    def __call__(self, event: Any, context: Any = None) -> Any:
        return self.invoke(event, getattr(context, "aws_request_id", None))

    def invoke(self, event: Any, request_id: str | None = None) -> Any:
        """One invocation in an idle environment, or a new one if all are busy (up to the cap);
        beyond a reserved concurrency, `FunctionError` `TooManyRequestsException` at once."""
        request_id = request_id or str(uuid.uuid4())
        environment = self._acquire()
        try:
            with self._condition:
                self._counts["invocations"] += 1
            return environment.invoke(event, request_id, self.timeout)
        except FunctionError as error:
            with self._condition:
                self._counts["errors"] += 1
                if error.error_type == "Sandbox.Timedout":
                    self._counts["timeouts"] += 1
                elif error.error_type == "Runtime.ExitError":
                    self._counts["exits"] += 1
            raise
        finally:
            self._release(environment)

    def prewarm(self) -> None:
        """Start one environment now (a handler that cannot import fails here, not at a request)."""
        self._release(self._acquire())

    def _acquire(self) -> ExecutionEnvironment:
        with self._condition:
            while True:
                if self._closed:
                    raise FunctionError(f"{self.function.name}: the local stack is stopping", "Local.Stopped")
                while self._idle:
                    environment = self._idle.pop()
                    if environment.alive:
                        self._take()
                        return environment
                    self._forget(environment)
                if self._reserved < self.max_environments:
                    self._reserved += 1
                    self._take()
                    break
                if self.throttles:
                    self._counts["throttles"] += 1
                    raise FunctionError(THROTTLED_MESSAGE, THROTTLED)
                self._condition.wait()
        environment = ExecutionEnvironment(self.function, self.on_notice, self.on_output, self.env)
        with self._condition:
            self._all.add(environment)
        try:
            init_seconds = environment.start(self.start_timeout)
        except BaseException:
            with self._condition:
                self._counts["init_errors"] += 1
                self._busy -= 1
                self._forget(environment)
                self._condition.notify()
            raise
        with self._condition:
            self._counts["cold_starts"] += 1
            self._init_seconds.append(init_seconds)
        log.debug("%s: cold start in %.2f s (pid %s)", self.name, init_seconds, environment.pid)
        return environment

    def _take(self) -> None:
        self._busy += 1
        self._max_busy = max(self._max_busy, self._busy)

    def _release(self, environment: ExecutionEnvironment) -> None:
        with self._condition:
            self._busy -= 1
            if environment.alive and not self._closed:
                self._idle.append(environment)
            else:
                self._forget(environment)
            self._condition.notify()
        if not environment.alive:
            environment.kill()  # closes what the dead one left open

    def _forget(self, environment: ExecutionEnvironment) -> None:
        # Under the condition's lock: a dead or stopped environment no longer counts against the cap.
        if environment in self._all:
            self._all.discard(environment)
            self._reserved -= 1

    def pids(self) -> list[int]:
        with self._condition:
            return [environment.pid for environment in self._all if environment.pid is not None]

    def stats(self) -> dict[str, Any]:
        with self._condition:
            return {
                **self._counts,
                "environments": len(self._all),
                "idle": len(self._idle),
                "busy": self._busy,
                "max_busy": self._max_busy,
                "max_environments": self.max_environments,
                "init_seconds_mean": round(sum(self._init_seconds) / len(self._init_seconds), 3)
                if self._init_seconds
                else None,
            }

    def close(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """Stop every environment (a running invocation is cut short, as the stack is stopping)."""
        with self._condition:
            self._closed = True
            environments = list(self._all)
            self._idle.clear()
            self._condition.notify_all()
        for environment in environments:
            environment.begin_stop()
        deadline = time.monotonic() + grace
        for environment in environments:
            environment.finish_stop(deadline)


def close_pools(pools: list[EnvironmentPool], grace: float = STOP_GRACE_SECONDS) -> None:
    """Close several pools with one grace period for all of their environments."""
    threads = [threading.Thread(target=pool.close, args=(grace,), daemon=True) for pool in pools]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(grace + 10)
