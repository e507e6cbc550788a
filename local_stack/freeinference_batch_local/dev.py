"""`freeinference-batch dev` (`make dev`): the local stack in the foreground until Ctrl-C, its one
line (the base URL and the dev key) on stdout, the functions' output and the stack's own log in
`.local-stack/logs/`, and on the terminal a readable line per batch status change and per error
(or, with `--verbose`, every log line)."""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from freeinference_batch_local.aws_faults.config import FaultConfigError
from freeinference_batch_local.environments import FunctionError
from freeinference_batch_local.function_logs import LOGS_DIR, FunctionLogs
from freeinference_batch_local.stack import LocalStack
from freeinference_batch_local.state import STATE_DIR

log = logging.getLogger("freeinference_batch_local")

LOCAL_HOST_ENV = "LOCAL_STACK_HOST"


class _OneLine(logging.Formatter):
    """The quiet terminal's form of the stack's own records: the first line of the message, no
    traceback (it is in `.local-stack/logs/local-stack.log`)."""

    def format(self, record: logging.LogRecord) -> str:
        first = (record.getMessage().splitlines() or [""])[0]
        return f"{self.formatTime(record, '%H:%M:%S')} {record.levelname} {record.name.rsplit('.', 1)[-1]}: {first}"


def _not_logged_by_the_function(record: logging.LogRecord) -> bool:
    # A failed invocation the function logged itself (its ERROR line is already on the terminal)
    # is also logged by the poller, timer or API that called it: one terminal line per error.
    error = record.exc_info[1] if record.exc_info else None
    return not (isinstance(error, FunctionError) and error.logged_by_function)


def _configure_logging(logs_dir: Path, verbose: bool) -> None:
    """The stack's own records: all of them to `local-stack.log`; to the terminal, all with
    `verbose`, else its warnings and errors, one line each."""
    full = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    to_file = logging.FileHandler(logs_dir / "local-stack.log", mode="w", encoding="utf-8")
    to_file.setFormatter(full)
    to_terminal = logging.StreamHandler(sys.stderr)
    if verbose:
        to_terminal.setFormatter(full)
    else:
        to_terminal.setLevel(logging.WARNING)
        to_terminal.setFormatter(_OneLine())
        to_terminal.addFilter(_not_logged_by_the_function)
    logging.basicConfig(level=os.environ.get("LOCAL_STACK_LOG_LEVEL", "INFO").upper(),
                        handlers=[to_file, to_terminal])


def run_local_stack(verbose: bool = False) -> None:
    """Run the local stack in the foreground until SIGINT/SIGTERM; exit normally (code 0) then.

    stdout gets exactly one line, the base URL and the dev key (the e2e tests read it). The
    functions' output goes to `.local-stack/logs/<function>.jsonl` (function_logs.py), the
    stack's own log to `.local-stack/logs/local-stack.log`; stderr gets a readable line per batch
    status change and per error, or with `verbose` every log line.
    """
    logs_dir = Path.cwd() / STATE_DIR / LOGS_DIR
    logs_dir.mkdir(parents=True, exist_ok=True)
    _configure_logging(logs_dir, verbose)
    logs = FunctionLogs(logs_dir, sys.stderr, verbose=verbose)
    stop = threading.Event()
    previous: dict[int, Any] = {}

    def on_signal(signum: int, frame: Any) -> None:
        if stop.is_set():  # a second Ctrl-C while stopping: leave at once
            os._exit(128 + signum)
        log.info("%s: stopping the local stack", signal.Signals(signum).name)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, on_signal)

    sys.stdout.flush()
    real_stdout = os.dup(1)
    os.dup2(2, 1)  # fd 1 is stderr from now on: only our one line reaches the real stdout
    # 127.0.0.1 unless LOCAL_STACK_HOST says otherwise: on Linux, `sam local`'s containers reach
    # the host only on an address other than loopback (LOCAL_STACK_HOST=0.0.0.0, README).
    stack = LocalStack(host=os.environ.get(LOCAL_HOST_ENV) or "127.0.0.1", logs=logs)
    try:
        try:
            stack.start()
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
            log.error("cannot start the local stack: %s (set PORT to another port, or PORT=0 for any)", error)
            raise SystemExit(1) from None
        except FaultConfigError as error:
            log.error("cannot start the local stack: %s", error)
            raise SystemExit(1) from None
        if not stop.is_set():
            line = f"FreeInference Batch local stack on {stack.base_url} — dev key: {stack.dev_key}\n"
            os.write(real_stdout, line.encode("utf-8"))
        while not stop.wait(0.5):
            pass
    finally:
        stack.stop()
        logs.close()
        log.info("local stack stopped")
        sys.stdout.flush()
        os.dup2(real_stdout, 1)
        os.close(real_stdout)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
