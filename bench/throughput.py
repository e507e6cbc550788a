"""Throughput of a batch against a direct client at the same concurrency, in the same run.

The simulated upstream answers every request after --latency seconds (`[sim:latency=S]` in each
message). One batch of --requests requests on one model (batch concurrency 4 in the catalog)
runs on the local stack (a subprocess); a direct client in this process sends the same bodies
straight to the same simulated upstream (the stack's UPSTREAM_BASE_URL) with --threads threads.
Rates are requests per second; target: batch/direct >= 0.95.

The batch is timed from the start of its POST to the first status poll that sees it completed;
polls are sparse (1 s) until 90% of the ideal time and every --poll s after, because each poll is
three moto requests and moto serves one request at a time: a tight poll loop slows what it
measures. The direct run is timed from its first send to its last answer.

If the target is missed (or with --diagnose always), the batch runs again on an in-process
LocalStack with every AWS call and moto's busy time measured, to show where the time goes.

    .venv/bin/python bench/throughput.py [--requests 80] [--latency 1] [--threads 4] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c


def run_direct(upstream_url: str, bodies: list[dict], threads: int, tag: str) -> tuple[float, Counter]:
    """Send every body to upstream /chat/completions with `threads` threads; (seconds, statuses)."""
    url = upstream_url.rstrip("/") + "/chat/completions"
    sessions: dict[int, requests.Session] = {}

    def send(numbered: tuple[int, dict]) -> int:
        session = sessions.setdefault(threading.get_ident(), requests.Session())
        number, body = numbered
        answer = session.post(url, json=body, timeout=60,
                              headers={"X-FreeInference-Request-Id": f"direct-{tag}:{number}"})
        answer.json()
        return answer.status_code

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        statuses = Counter(pool.map(send, enumerate(bodies)))
    return time.perf_counter() - started, statuses


def run_batch(
    client: c.Client, data: bytes, poll: float, ideal: float, timeout: float
) -> tuple[float, float, dict, int]:
    """Create and wait; (seconds from POST to seen completed, seconds of the POST, final batch, polls)."""
    started = time.perf_counter()
    batch, post_seconds = client.create(data)
    polls = 0
    while batch["status"] not in c.FINAL:
        elapsed = time.perf_counter() - started
        if elapsed > timeout:
            raise TimeoutError(f"batch not final after {timeout} s: {batch['request_counts']}")
        time.sleep(poll if elapsed >= 0.9 * ideal else min(1.0, 0.9 * ideal - elapsed))
        batch = client.batch(batch["id"])
        polls += 1
    return time.perf_counter() - started, post_seconds, batch, polls


def diagnose(args: argparse.Namespace, ideal: float) -> None:
    """The batch again, in-process, with its AWS calls and moto's busy time measured."""
    from _instrument import AwsCalls, MotoBusy

    print("\n=== diagnosis: the same batch on an in-process LocalStack, AWS calls and moto time measured ===")
    body = c.batch_body(args.requests, model=args.model, directive=f"[sim:latency={args.latency:g}] (diagnosis)")
    with c.in_process_stack(short_timings=False) as stack:
        calls = AwsCalls(stack, units=False).install()
        busy = MotoBusy(stack).install()
        client = c.Client(stack.base_url, stack.dev_key)
        calls.reset()
        busy.reset()
        seconds, _, batch, polls = run_batch(client, c.dumps(body), args.poll, ideal, timeout=max(120.0, 20 * ideal))
        time.sleep(0.3)
        by_source = calls.by_source()
        t = calls.timings
        moto_seconds, moto_calls = dict(busy.seconds), dict(busy.calls)
        pollers = {name: p.stats() for name, p in stack.pollers.items()}
        busy.uninstall()
        calls.uninstall()
    done = batch["request_counts"]["completed"] or 1
    print(f"in-process batch: {seconds:.2f} s ({args.requests / seconds:.2f} req/s, ideal {ideal:.1f} s), "
          f"{polls} status polls; moto busy {sum(moto_seconds.values()):.1f} s = "
          f"{sum(moto_seconds.values()) / seconds:.0%} of the run (one request at a time)")
    rows = []
    for op in sorted(moto_seconds, key=lambda o: -moto_seconds[o]):
        each = moto_seconds[op] / moto_calls[op] * 1000
        rows.append((op, moto_calls[op], f"{moto_calls[op] / done:.2f}", f"{each:.1f}", f"{moto_seconds[op]:.2f}",
                     f"{moto_seconds[op] / seconds:.0%}"))
    print(c.table(rows, ("moto operation (all callers)", "calls", "per request", "ms inside moto", "s in all",
                         "of the run")))
    rows = []
    for source in ("worker", "poller"):
        for op, stats in sorted(by_source.get(source, {}).items(), key=lambda item: -item[1].seconds):
            each = stats.seconds / stats.calls * 1000
            rows.append((source, op, stats.calls, f"{stats.calls / done:.2f}", f"{each:.1f}",
                         f"{stats.seconds / done * 1000:.0f}"))
    print(c.table(rows, ("caller", "operation", "calls", "per request", "ms each (with moto queueing)",
                         "ms per request")))
    mean = statistics.mean
    ran, aws_work = t.requests_run, t.overhead_per_request
    # Only a chain's first request per delivery waits in the queue; the rest are handed over.
    queue_wait = sum(t.queue_wait) / max(1, ran)
    print(f"worker, per request that ran ({ran}, in {len(t.chain_runs)} deliveries): upstream "
          f"{mean(t.upstream) * 1000:.0f} ms, the rest of handle_record {aws_work * 1000:.0f} ms (AWS calls and "
          f"their wait for moto's lock); queue wait (sent -> handle_record) {queue_wait * 1000:.0f} ms; outcomes "
          f"{dict(t.outcomes)}")
    messages = sum(n for n, _ in t.invocations)
    print(f"invocations: {len(t.invocations)}, {messages / max(1, len(t.invocations)):.2f} messages each; pollers "
          f"{ {n: {k: s[k] for k in ('receives', 'empty_receives', 'max_in_flight')} for n, s in pollers.items()} }")
    slot = seconds / (args.requests / args.threads)
    print(f"per request slot: {slot * 1000:.0f} ms = upstream {mean(t.upstream) * 1000:.0f} + worker AWS work "
          f"{aws_work * 1000:.0f} + queue wait {queue_wait * 1000:.0f} + rest "
          f"{(slot - mean(t.upstream) - aws_work - queue_wait) * 1000:.0f} (invocation/poller bookkeeping)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=80, help="requests per run (default 80)")
    parser.add_argument("--latency", type=float, default=1.0, help="simulated upstream latency, s (default 1)")
    parser.add_argument("--threads", type=int, default=4,
                        help="direct client threads (default 4 = the model's batch concurrency)")
    parser.add_argument("--model", default=c.MODEL, help=f"model (default {c.MODEL})")
    parser.add_argument("--rounds", type=int, default=1, help="direct+batch pairs to run (default 1)")
    parser.add_argument("--poll", type=float, default=0.1,
                        help="status poll interval near the end, s (default 0.1: the timing resolution)")
    parser.add_argument("--target", type=float, default=0.95, help="batch/direct target (default 0.95)")
    parser.add_argument("--diagnose", choices=("auto", "always", "never"), default="auto",
                        help="in-process diagnosis when the target is missed (auto), always, or never")
    args = parser.parse_args()

    directive = f"[sim:latency={args.latency:g}]"
    stack = c.StackProcess(short_timings=False)  # schedules at the template's rates, as on AWS
    try:
        client = c.Client(stack.base_url, stack.key)
        upstream = stack.upstream_url
        print(f"stack at {stack.base_url}; simulated upstream at {upstream}; {args.requests} requests on "
              f"{args.model}, latency {args.latency:g} s, direct threads {args.threads}")
        ideal = args.requests / args.threads * args.latency
        print(f"ideal at concurrency {args.threads}: {ideal:.1f} s = {args.threads / args.latency:.2f} req/s")
        direct_times, batch_times = [], []
        for round_ in range(args.rounds):
            body = c.batch_body(args.requests, model=args.model, directive=f"{directive} (round {round_})")
            bodies = [entry["body"] for entry in body["requests"]]
            seconds, statuses = run_direct(upstream, bodies, args.threads, str(round_))
            direct_times.append(seconds)
            print(f"round {round_ + 1} direct: {seconds:.2f} s, {args.requests / seconds:.2f} req/s, "
                  f"HTTP statuses {dict(statuses)}")
            seconds, post_seconds, batch, polls = run_batch(client, c.dumps(body), args.poll, ideal,
                                                            timeout=max(120.0, 20 * ideal))
            batch_times.append(seconds)
            print(f"round {round_ + 1} batch:  {seconds:.2f} s (POST {post_seconds * 1000:.0f} ms, {polls} polls), "
                  f"{args.requests / seconds:.2f} req/s, status {batch['status']}, counts {batch['request_counts']}")
    finally:
        stack.stop()

    direct = statistics.median(direct_times)
    batched = statistics.median(batch_times)
    direct_rate, batch_rate = args.requests / direct, args.requests / batched
    ratio = batch_rate / direct_rate
    slots = args.requests / args.threads
    print("\n=== summary: throughput (batch vs direct, same concurrency) ===")
    print(c.table([
        ("requests / latency / concurrency", f"{args.requests} / {args.latency:g} s / {args.threads}", ""),
        ("ideal time", f"{ideal:.2f} s", ""),
        (f"direct, median of {args.rounds}", f"{direct:.2f} s  {direct_rate:.2f} req/s", ""),
        (f"batch, median of {args.rounds}", f"{batched:.2f} s  {batch_rate:.2f} req/s", ""),
        ("batch overhead per request slot", f"{(batched - direct) / slots * 1000:.0f} ms", ""),
        ("batch / direct", f"{ratio:.3f}", f">= {args.target:g}  {c.verdict(ratio >= args.target)}"),
        ("load average (1 min) at the end", f"{os.getloadavg()[0]:.1f}", ""),
    ], ("measure", "value", "target")))
    if args.diagnose == "always" or (args.diagnose == "auto" and ratio < args.target):
        diagnose(args, ideal)


if __name__ == "__main__":
    main()
