"""The local stack in a process of its own, like `freeinference-batch dev`, optionally with its
workers paused (the queue pollers receive nothing) so a benchmark measures the API alone.

Prints one line with the base URL and the dev key, as `dev` does; stops on SIGINT/SIGTERM.

    .venv/bin/python bench/_stack_server.py [--paused]
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--paused", action="store_true", help="pause the workers' queue pollers")
    args = parser.parse_args()
    logging.basicConfig(level=os.environ.get("LOCAL_STACK_LOG_LEVEL", "WARNING").upper(), stream=sys.stderr)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    real_stdout = os.dup(1)
    os.dup2(2, 1)  # the handlers' logs and metrics go to stderr; stdout gets the one line

    from freeinference_batch.local.stack import LocalStack

    stack = LocalStack().start()
    try:
        if args.paused:
            stack.pause_workers()
        note = " (workers paused)" if args.paused else ""
        os.write(real_stdout, f"local stack on {stack.base_url} — dev key: {stack.dev_key}{note}\n".encode())
        while not stop.wait(0.5):
            pass
    finally:
        stack.stop()


if __name__ == "__main__":
    main()
