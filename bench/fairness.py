"""Fairness: a small batch submitted behind a big one on the same model finishes nearly as fast
as alone.

Per round, on one local stack (a subprocess): the --small batch alone (time from its POST to the
first status poll that sees it final); then a --big batch, and --delay s later (the big one
running) the same small batch again, timed the same way; then the big batch is cancelled and its
running requests drain, and the small batch runs alone once more ("alone after": same tables,
now holding the big batch's items, so the ratio to it leaves out moto getting slower as the
tables grow, and shows the scheduling alone). Simulated upstream latency --latency s, one model (batch concurrency 4).
Target: behind / alone <= 2 (median of --rounds).

If the target is missed (or with --diagnose always), one round runs again on an in-process
LocalStack with every delivery recorded per batch: how many requests each batch ran (a delivery
runs a whole stretch of its chain), and how often and how long its messages were parked.

    .venv/bin/python bench/fairness.py [--big 2000] [--small 20] [--latency 0.1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

BIG_DEFAULT = 2000


def time_to_final(client: c.Client, data: bytes, poll: float, timeout: float) -> tuple[float, dict]:
    started = time.perf_counter()
    batch, _ = client.create(data)
    while batch["status"] not in c.FINAL:
        if time.perf_counter() - started > timeout:
            raise TimeoutError(f"batch not final after {timeout} s: {batch['request_counts']}")
        time.sleep(poll)
        batch = client.batch(batch["id"])
    return time.perf_counter() - started, batch


def diagnose(args: argparse.Namespace, directive: str) -> None:
    """One round in-process, recording every handle_record per batch: requests run, parks (and how long)."""
    from freeinference_batch import worker
    from freeinference_batch.worker import upstream
    from freeinference_batch.worker.waiting import WOKEN_WAIT_SECONDS

    print("\n=== diagnosis: one round on an in-process LocalStack, worker steps per batch ===")
    steps: list[tuple[float, str, int, float | None]] = []  # (time, batch id, upstream calls, park s or None)
    lock = threading.Lock()
    local = threading.local()
    original_handle, original_call = worker.Worker.handle_record, upstream.call

    def call(*a, **k):
        local.calls += 1
        return original_call(*a, **k)

    def handle_record(self, record, deadline=None, invocation_seconds=None):
        # A chain hands its slots over within its own batch, so every call in one record is its batch's.
        local.calls = 0
        outcome = original_handle(self, record, deadline, invocation_seconds)
        batch_id = json.loads(record["body"]).get("batch_id", "?")
        with lock:
            steps.append((time.perf_counter(), batch_id, local.calls, getattr(outcome, "seconds", None)))
        return outcome

    worker.Worker.handle_record, upstream.call = handle_record, call
    try:
        with c.in_process_stack(short_timings=False, moto_in_process=False) as stack:
            client = c.Client(stack.base_url, stack.dev_key)
            small = c.dumps(c.batch_body(args.small, model=args.model, directive=f"{directive} small diag"))
            big = c.dumps(c.batch_body(args.big, model=args.model, directive=f"{directive} big diag"))
            alone, _ = time_to_final(client, small, args.poll, timeout=300)
            big_batch, _ = client.create(big)
            time.sleep(args.delay)
            window_start = time.perf_counter()
            behind, small_batch = time_to_final(client, small, args.poll, timeout=300)
            window_end = time.perf_counter()
            client.cancel(big_batch["id"])
            client.wait_final(big_batch["id"], timeout=300, interval=0.5)
    finally:
        worker.Worker.handle_record, upstream.call = original_handle, original_call
    print(f"in-process: small alone {alone:.2f} s, behind {behind:.2f} s, ratio {behind / alone:.2f}")
    names = {big_batch["id"]: "big", small_batch["id"]: "small (behind)"}
    rows = []
    for batch_id, name in names.items():
        mine = [s for s in steps if s[1] == batch_id and window_start <= s[0] <= window_end]
        ran = sum(s[2] for s in mine)
        runs = [s[2] for s in mine if s[2]]
        parks = [s[3] for s in mine if s[3] is not None]
        rows.append((name, ran, f"{statistics.mean(runs):.1f}" if runs else "-", len(parks), f"{sum(parks):.1f}"))
    print(c.table(rows, ("batch, while the small one ran", "requests run", "requests per delivery",
                         "parks (no free slot)", "park s in all")))
    print(f"worker deliveries in all: {len(steps)}, parked {sum(1 for s in steps if s[3] is not None)}. A chain "
          f"runs on in its invocation, handing its slots to its next request; one that finds the slots full "
          f"registers as a waiter and parks {WOKEN_WAIT_SECONDS[0]:g}-{WOKEN_WAIT_SECONDS[1]:g} s, "
          f"but is made visible as soon as a slot frees; a batch above its share gives slots up to waiting "
          f"batches (fairness.py fair_shares: small batches first, a batch that waited its turn keeps one).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big", type=int, default=BIG_DEFAULT, help=f"requests in the big batch ({BIG_DEFAULT})")
    parser.add_argument("--small", type=int, default=20, help="requests in the small batch (default 20)")
    parser.add_argument("--latency", type=float, default=0.1, help="simulated upstream latency, s (default 0.1)")
    parser.add_argument("--model", default=c.MODEL, help=f"model of both batches (default {c.MODEL})")
    parser.add_argument("--rounds", type=int, default=3, help="alone/behind pairs (default 3)")
    parser.add_argument("--delay", type=float, default=2.0,
                        help="seconds between the big batch's POST and the small one's (default 2)")
    parser.add_argument("--poll", type=float, default=0.1, help="status poll interval, s (default 0.1)")
    parser.add_argument("--target", type=float, default=2.0, help="behind/alone target (default 2)")
    parser.add_argument("--diagnose", choices=("auto", "always", "never"), default="auto",
                        help="in-process diagnosis when the target is missed (auto), always, or never")
    args = parser.parse_args()
    if args.big != BIG_DEFAULT:
        print(f"NOTE: the big batch has {args.big} requests, not the target's {BIG_DEFAULT}")

    directive = f"[sim:latency={args.latency:g}]"
    alone_times, behind_times, ratios, big_done, alone_after_times = [], [], [], [], []
    print(f"model {args.model}, latency {args.latency:g} s; big {args.big}, small {args.small}, {args.rounds} rounds, "
          "each on a fresh stack (moto's transactions slow down as its tables fill, so rounds must not share one)")
    for round_ in range(args.rounds):
        stack = c.StackProcess(short_timings=False)
        try:
            client = c.Client(stack.base_url, stack.key)
            small = c.dumps(c.batch_body(args.small, model=args.model, directive=f"{directive} small {round_}"))
            big = c.dumps(c.batch_body(args.big, model=args.model, directive=f"{directive} big {round_}"))
            alone, batch = time_to_final(client, small, args.poll, timeout=300)
            alone_times.append(alone)
            print(f"round {round_ + 1}: small alone {alone:.2f} s ({batch['status']}, {batch['request_counts']})")

            big_batch, big_post = client.create(big)
            time.sleep(args.delay)
            before = client.batch(big_batch["id"])["request_counts"]
            behind, batch = time_to_final(client, small, args.poll, timeout=300)
            after = client.batch(big_batch["id"])["request_counts"]
            behind_times.append(behind)
            ratios.append(behind / alone)
            ran_meanwhile = after["completed"] - before["completed"]
            big_done.append(ran_meanwhile)
            share = args.small / max(1, args.small + ran_meanwhile)
            print(f"round {round_ + 1}: small behind big {behind:.2f} s ({batch['status']}), ratio "
                  f"{behind / alone:.2f}; big POST {big_post:.2f} s, big completed {before['completed']} -> "
                  f"{after['completed']} meanwhile (small's share of the model {share:.0%})")
            client.cancel(big_batch["id"])
            _, seconds = client.wait_final(big_batch["id"], timeout=300, interval=0.5)
            after_alone, _ = time_to_final(client, small, args.poll, timeout=300)
            alone_after_times.append(after_alone)
            print(f"round {round_ + 1}: big cancelled, drained in {seconds:.1f} s; small alone after "
                  f"{after_alone:.2f} s (behind / alone after {behind / after_alone:.2f})")
        finally:
            stack.stop()

    alone = statistics.median(alone_times)
    behind = statistics.median(behind_times)
    ratio = statistics.median(ratios)
    print("\n=== summary: fairness (small batch behind a big one, same model) ===")
    print(c.table([
        ("big / small / latency", f"{args.big} / {args.small} / {args.latency:g} s", ""),
        (f"small alone, median of {args.rounds}", f"{alone:.2f} s", ""),
        (f"small behind big, median of {args.rounds}", f"{behind:.2f} s", ""),
        ("big requests completed while the small ran, median", f"{statistics.median(big_done):g}", ""),
        ("behind / alone (median of the rounds' ratios)", f"{ratio:.2f}",
         f"<= {args.target:g}  {c.verdict(ratio <= args.target)}"),
        ("ratios per round", ", ".join(f"{r:.2f}" for r in ratios), ""),
        (f"small alone after (big cancelled), median of {args.rounds}", f"{statistics.median(alone_after_times):.2f} s",
         ""),
        ("behind / alone after (scheduling only), median",
         f"{statistics.median(b / a for b, a in zip(behind_times, alone_after_times, strict=True)):.2f}", ""),
        ("load average (1 min) at the end", f"{os.getloadavg()[0]:.1f}", ""),
    ], ("measure", "value", "target")))
    if args.diagnose == "always" or (args.diagnose == "auto" and ratio > args.target):
        diagnose(args, directive)


if __name__ == "__main__":
    main()
