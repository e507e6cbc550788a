"""The local stack in a process of its own, like `freeinference-batch dev`, optionally with its
workers paused (the queue pollers receive nothing) so a benchmark measures the API alone.

Prints one line with the base URL and the dev key, as `dev` does; stops on SIGINT/SIGTERM.

With `--stats PATH`, it also appends one JSON line to PATH every `--stats-interval` seconds: what
a benchmark cannot see through the API but the stack process knows for free. The simulated
upstream's calls in flight (`upstream.concurrent`, i.e. requests running), the pollers' counters
(invocations, messages, invocations in flight), every AWS call the stack's clients made by
operation (count and client-side seconds, which include the wait for moto's one lock), and the
CPU seconds of this process and of its moto child (moto serves one request at a time, so its CPU
share is close to how busy it is). With `--stats` the functions run on this process's threads
(`LocalStack(isolated_functions=False)`, the threads `dev` ran them on until execution
environments), since the counts hook this process's clients; `--environments` runs them in
execution environments all the same (then `aws_calls` holds the pollers' calls only, and each
line's `functions` has each function's environment counters: cold starts, environments, busy).
Counting costs a dict update per AWS call, nothing per moto
request: the figures of a run with stats are those of a run without.

    .venv/bin/python bench/_stack_server.py [--paused] [--stats PATH] [--stats-interval 0.5] [--environments]
                                            [--template PATH]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections import defaultdict
from typing import Any

import _billing  # bench/ is this script's directory, so first on sys.path

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float | None:
    """utime + stime of a process (all its threads), from /proc; None if it is gone."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS  # fields 14 and 15 of stat(5), after the name


def run_queue_wait(pid: int | None) -> float | None:
    """Seconds the process's live threads spent runnable but waiting for a CPU (schedstat's second
    field, summed over /proc/PID/task): on a shared machine, moto can be slow for want of a core."""
    if not pid:
        return None
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                total += int(stat.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


class CallCounter:
    """Counts and times every AWS call made through the given botocore clients, by operation."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])  # op -> [calls, seconds]
        self._local = threading.local()

    def hook(self, client: Any) -> None:
        service = client.meta.service_model.service_name

        def before(params: dict, model: Any, **_: Any) -> None:
            self._local.started = time.perf_counter()
            # Single-item calls are told apart by the item's kind ("MODEL/HELD_SLOTS", "BATCH/LANEPOS"...).
            key = params.get("Key") if model.name in ("GetItem", "UpdateItem", "DeleteItem") else None
            self._local.kind = item_kind(key) if key else ""

        def after(model: Any, parsed: dict, **_: Any) -> None:
            seconds = time.perf_counter() - getattr(self._local, "started", time.perf_counter())
            name = f"{service}.{model.name}"
            if getattr(self._local, "kind", ""):
                name += f" {self._local.kind}"
            if model.name == "ReceiveMessage" and not parsed.get("Messages"):
                name += " (empty)"
            with self.lock:
                entry = self.calls[name]
                entry[0] += 1
                entry[1] += seconds

        client.meta.events.register(f"before-parameter-build.{service}.*", before)
        client.meta.events.register(f"after-call.{service}.*", after)

    def snapshot(self) -> dict[str, list[float]]:
        with self.lock:
            return {name: [calls, round(seconds, 4)] for name, (calls, seconds) in self.calls.items()}


def model_slots(client: Any) -> dict[str, list[int]]:
    """Leases and waiters on each model's slots item: one GetItem per model per stats line
    (a few moto requests a second, against the hundred a busy run makes), on a client of its
    own so that the call counts leave these reads out."""
    from freeinference_batch.core.catalog import load_catalog
    from freeinference_batch.core.settings import get_settings
    from freeinference_batch.store.dynamo import from_item
    from freeinference_batch.store.leases import model_slots_key, slots_held

    settings = get_settings()
    out = {}
    for model in load_catalog(settings.model_catalog_path).models:
        try:
            answer = client.get_item(TableName=settings.accounts_table_name, Key=model_slots_key(model))
        except Exception:  # a sample lost is not worth failing the stack for
            continue
        item = from_item(answer.get("Item")) or {}
        out[model] = [slots_held(item), len(item.get("waiters", {}))]
    return out


def item_kind(key: dict) -> str:
    """`{"pk": {"S": "BATCH#x"}, "sk": {"S": "REQ#000000042"}}` -> "BATCH/REQ" (as the cost model names it)."""
    texts = [str(next(iter(value.values()))) if isinstance(value, dict) and value else str(value)
             for value in key.values()]
    return _billing.item_kind(*texts, *[""] * (2 - len(texts)))


def write_stats(stack: Any, counter: CallCounter, path: str, interval: float, stop: threading.Event) -> None:
    moto_process = getattr(stack.moto, "_process", None)  # MotoProcess's child (None if moto is in-process)
    moto_pid = moto_process.pid if moto_process is not None else None
    import boto3

    own_client = boto3.session.Session().client("dynamodb")  # AWS_ENDPOINT_URL: the stack's moto
    started = time.time()
    with open(path, "a", buffering=1) as out:
        while not stop.wait(interval):
            upstream = stack.upstream
            slots = model_slots(own_client)
            line = {
                "t": round(time.time() - started, 3),
                "wall": time.time(),
                "upstream_in_flight": upstream.concurrent if upstream is not None else None,
                "upstream_calls": upstream.total_requests if upstream is not None else None,
                "slots": slots,  # model -> [slots held, waiters registered] on its MODEL#/HELD_SLOTS item
                "pollers": {name: poller.stats() for name, poller in stack.pollers.items()},
                # function -> its execution environments' counters (--environments)
                "functions": {name: pool.stats() for name, pool in stack.pools.items()},
                "aws_calls": counter.snapshot(),
                "cpu_stack": round(time.process_time(), 3),
                "cpu_moto": cpu_seconds(moto_pid),
                "wait_moto": run_queue_wait(moto_pid),
            }
            out.write(json.dumps(line) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--paused", action="store_true", help="pause the workers' queue pollers")
    parser.add_argument("--stats", default="", help="append a JSON line of the stack's counters here, periodically")
    parser.add_argument("--stats-interval", type=float, default=0.5, help="seconds between stats lines (0.5)")
    parser.add_argument("--environments", action="store_true",
                        help="with --stats, run the functions in execution environments, as dev does")
    parser.add_argument("--template", default="", help="the stack's template, if not the repo's template.yaml")
    args = parser.parse_args()
    logging.basicConfig(level=os.environ.get("LOCAL_STACK_LOG_LEVEL", "WARNING").upper(), stream=sys.stderr)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    real_stdout = os.dup(1)
    os.dup2(2, 1)  # the handlers' logs and metrics go to stderr; stdout gets the one line

    from freeinference_batch_local.stack import LocalStack

    # The counts hook the functions' boto3 clients, which are this process's only when the
    # functions run on its threads (isolated_functions=False); without --stats they run in
    # execution environments of their own, as `dev` runs them (and with --environments).
    stack = LocalStack(template_path=args.template or None,
                       isolated_functions=args.environments or not args.stats).start()
    stats_stop = threading.Event()
    try:
        if args.paused:
            stack.pause_workers()
        if args.stats:
            from freeinference_batch.core import aws

            counter = CallCounter()
            hooked: set[int] = set()
            # The functions' shared clients, and the pollers' own (the event source mapping's calls).
            for client in (aws.dynamodb(), aws.sqs(), aws.s3(), *(p.sqs for p in stack.pollers.values())):
                if id(client) not in hooked:
                    hooked.add(id(client))
                    counter.hook(client)
            threading.Thread(target=write_stats, args=(stack, counter, args.stats, args.stats_interval, stats_stop),
                             name="bench-stats", daemon=True).start()
        note = " (workers paused)" if args.paused else ""
        os.write(real_stdout, f"local stack on {stack.base_url} — dev key: {stack.dev_key}{note}\n".encode())
        while not stop.wait(0.5):
            pass
    finally:
        stats_stop.set()
        stack.stop()


if __name__ == "__main__":
    main()
