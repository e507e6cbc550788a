"""One Lambda execution environment: `python -m freeinference_batch_local.runtime --fd N ...`.

The child of an `environments.ExecutionEnvironment`. It imports its function's handler once (the
cold start), then serves one invocation at a time, as Lambda's runtime loop does, over the
connection on fd N (length-prefixed frames of JSON, `multiprocessing.connection`): not stdout,
which is the handler's (Powertools prints its metrics there), nor stdin, whose end-of-file is the
parent's stop (or death) and ends this process at once, an invocation running or not.

Frames, each a JSON object with a `type`:

- child -> parent, once: `ready` (`init_seconds`) or `init_error` (`errorMessage`, `errorType`);
- parent -> child: `invoke` (`event`, `request_id`, `deadline_ms`: epoch milliseconds, as
  Lambda's Runtime API passes `Lambda-Runtime-Deadline-Ms`);
- child -> parent, per invocation: any number of `notice` (`what: "sqs"`: the function sent an
  SQS message or changed a message's visibility, so the stack's pollers look now, as a long poll
  would), then one `result` (`payload`) or `error` (`errorMessage`, `errorType`, `stackTrace`).

A handler's exception is the invocation's error and the environment serves the next event, as on
Lambda. So is the worker's `SimulatedCrash` (chaos tests): the invocation fails as if the Lambda
were killed, without a new process per crash. Any other `BaseException` (`SystemExit`, ...) ends
the process after its error frame, as Lambda's `Runtime.ExitError` ends the environment.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from freeinference_batch_local.handlers import LambdaContext, _handler_from

log = logging.getLogger("freeinference_batch_local.runtime")

# The SQS calls after which a message may be receivable: the stack's pollers are woken for them.
_SQS_WAKING_CALLS = ("SendMessage", "SendMessageBatch", "ChangeMessageVisibility", "ChangeMessageVisibilityBatch")


class _Frames:
    """The connection to the parent; writes from the handler's threads (notices) take turns."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._lock = threading.Lock()

    def send(self, frame: dict[str, Any]) -> None:
        self.send_encoded(json.dumps(frame).encode("utf-8"))

    def send_encoded(self, data: bytes) -> None:
        with self._lock:
            self.connection.send_bytes(data)

    def receive(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.connection.recv_bytes())
        except (EOFError, OSError):
            return None


def _exit_when_stdin_closes() -> None:
    # The parent holds the other end: it closes it to stop us, and the kernel closes it if the
    # parent dies, so no environment outlives its stack, even mid-invocation.
    def watch() -> None:
        try:
            sys.stdin.buffer.read()
        finally:
            os._exit(0)

    threading.Thread(target=watch, name="stdin-watch", daemon=True).start()


def _notify_on_sqs_calls(frames: _Frames) -> None:
    try:
        from freeinference_batch.core import aws
    except ImportError:  # a function of another code base: no service client to watch
        return

    def notice(**_: Any) -> None:
        with contextlib.suppress(OSError):  # the parent is gone: stdin's watcher ends us
            frames.send({"type": "notice", "what": "sqs"})

    try:
        events = aws.sqs().meta.events
    except Exception as error:  # no region or credentials: nothing the stack runs, but no reason to fail
        log.warning("no SQS client to watch (%s): the pollers wake at their next idle poll", error)
        return
    for operation in _SQS_WAKING_CALLS:
        events.register(f"after-call.sqs.{operation}", notice)


def _simulated_crash() -> type[BaseException] | None:
    try:
        from freeinference_batch.worker.faults import SimulatedCrash
    except ImportError:
        return None
    return SimulatedCrash


def _error_frame(error: BaseException, error_type: str | None = None) -> dict[str, Any]:
    # Lambda's Python runtime answers {"errorMessage", "errorType", "requestId", "stackTrace"}.
    return {
        "type": "error",
        "errorMessage": str(error),
        "errorType": error_type or type(error).__name__,
        "stackTrace": traceback.format_tb(error.__traceback__),
    }


def _log_error(request_id: str, error: BaseException) -> None:
    # What Lambda's runtime writes to the function's log for a failed invocation.
    log.error(
        "[ERROR] %s: %s (RequestId: %s)\n%s",
        type(error).__name__,
        error,
        request_id,
        "".join(traceback.format_exception(type(error), error, error.__traceback__)),
    )


class _JsonLines(logging.Formatter):
    """The runtime's own records (a failed invocation, an init error) as one JSON line each, as the
    function's Powertools logs are: a traceback stays in its record, and every line of the
    function's log names the function."""

    def __init__(self, function_name: str) -> None:
        super().__init__()
        self.function_name = function_name

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "level": record.levelname,
            "location": f"{record.funcName}:{record.lineno}",
            "message": record.getMessage(),
            "timestamp": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(record.created))
            + f",{int(record.msecs):03d}+0000",
            "logger": record.name,
            "function_name": self.function_name,
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def serve(frames: _Frames, handler: Any, function_name: str, memory_mb: int) -> None:
    simulated_crash = _simulated_crash()
    while True:
        request = frames.receive()
        if request is None:
            return
        request_id = request["request_id"]
        context = LambdaContext(
            function_name, memory_mb, aws_request_id=request_id, deadline_epoch_ms=request["deadline_ms"]
        )
        exit_after = False
        try:
            payload = handler(request["event"], context)
            try:
                frame = json.dumps({"type": "result", "payload": payload}).encode("utf-8")
            except (TypeError, ValueError) as error:  # as the runtime refuses a result it cannot serialize
                frame = json.dumps(_error_frame(error, "Runtime.MarshalError")).encode("utf-8")
        except Exception as error:
            _log_error(request_id, error)
            frame = json.dumps(_error_frame(error)).encode("utf-8")
        except BaseException as error:
            _log_error(request_id, error)
            exit_after = simulated_crash is None or not isinstance(error, simulated_crash)
            frame = json.dumps(_error_frame(error, "Runtime.ExitError" if exit_after else None)).encode("utf-8")
        frames.send_encoded(frame)
        if exit_after:
            os._exit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description="one Lambda execution environment of the local stack")
    parser.add_argument("--fd", type=int, required=True, help="the frames' connection to the parent")
    parser.add_argument("--code-dir", required=True)
    parser.add_argument("--handler", required=True, help="module.function, as the template's Handler")
    parser.add_argument("--function-name", required=True)
    parser.add_argument("--memory-mb", type=int, default=128)
    args = parser.parse_args()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonLines(args.function_name))
    logging.basicConfig(level=os.environ.get("LOCAL_STACK_LOG_LEVEL", "INFO").upper(), handlers=[handler])
    _exit_when_stdin_closes()
    frames = _Frames(Connection(args.fd))
    started = time.perf_counter()
    try:
        handler = _handler_from(Path(args.code_dir), args.handler)
        _notify_on_sqs_calls(frames)
    except BaseException as error:  # as Lambda's Runtime.ImportModuleError / an init failure
        _log_error("init", error)
        frames.send({**_error_frame(error), "type": "init_error"})
        return
    frames.send({"type": "ready", "init_seconds": time.perf_counter() - started})
    serve(frames, handler, args.function_name, args.memory_mb)


if __name__ == "__main__":
    main()
