"""Fairness under a stream of small batches: a big batch (--big, 3,000 requests) keeps a fair
part of its model while --clients other clients (3) each submit --small-request batches (100)
back to back (the next as soon as the previous is final), for --duration seconds (120).

With four batches taking turns the big one should get about a quarter of the model: its share
of the model's completed requests, per --window (10 s) and overall, against the fair share
1/(clients+1). Target: the overall share at least --target-fraction (0.8) of the fair share.

Each client is an account of its own (admin CLI: create-key, then set-account --concurrency),
as the big batch's owner is (the dev account), so only the model's slots are shared. The model
gets --concurrency batch slots (4, the packaged catalog's) through MODEL_CATALOG_PATH. The stack
is a subprocess with stats (bench/_stack_server.py --stats), which also tells how many of the
model's slots were held. Counts come from status polls: the big batch every second, each small
batch every --poll s (1) by its own client; a batch's requests completed between two polls are
counted at the later poll. Polls are three moto requests each, so they are kept sparse.

Everything stops by itself: after --duration the clients submit no more, the open batches are
cancelled and the stack stops.

    .venv/bin/python bench/fairness_stream.py [--big 3000] [--small 100] [--clients 3] [--latency 0.5]
        [--duration 120] [--window 10] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c


@dataclass
class Counts:
    """(wall time, requests finished so far) per poll of one batch, and what each poll added."""

    name: str
    samples: list[tuple[float, int]] = field(default_factory=list)

    def add(self, wall: float, batch: dict) -> None:
        counts = batch["request_counts"]
        self.samples.append((wall, counts["completed"] + counts["failed"]))

    def finished_between(self, start: float, end: float) -> int:
        """Requests counted at polls in [start, end): each poll's increase over the previous one."""
        total, previous = 0, 0
        for wall, done in self.samples:
            if start <= wall < end:
                total += done - previous
            previous = done
        return total


@dataclass
class SmallRun:
    client: int
    batch_id: str
    started: float
    ended: float | None
    counts: Counts


def client_loop(number: int, client: c.Client, args: argparse.Namespace, stop_at: float,
                runs: list[SmallRun], lock: threading.Lock, errors: list[str]) -> None:
    """Submit small batches back to back until `stop_at`; the last one is left running (cancelled later)."""
    round_ = 0
    while time.time() < stop_at:
        body = c.batch_body(args.small, model=c.MODEL,
                            directive=f"[sim:latency={args.latency:g}] client {number} batch {round_}")
        try:
            batch, _ = client.create(c.dumps(body))
        except RuntimeError as error:  # e.g. 503 busy: try again shortly, it counts as the stream's gap
            errors.append(f"client {number}: {error}")
            time.sleep(1.0)
            continue
        run = SmallRun(number, batch["id"], time.time(), None, Counts(f"client {number}"))
        with lock:
            runs.append(run)
        run.counts.add(time.time(), batch)
        while batch["status"] not in c.FINAL and time.time() < stop_at:
            time.sleep(args.poll)
            batch = client.batch(batch["id"])
            run.counts.add(time.time(), batch)
        if batch["status"] in c.FINAL:
            run.ended = time.time()
        round_ += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big", type=int, default=3000, help="requests in the big batch (default 3000)")
    parser.add_argument("--small", type=int, default=100, help="requests in each small batch (default 100)")
    parser.add_argument("--clients", type=int, default=3, help="clients submitting small batches (default 3)")
    parser.add_argument("--latency", type=float, default=0.5, help="simulated upstream latency, s (default 0.5)")
    parser.add_argument("--duration", type=float, default=120.0,
                        help="seconds the small batches stream in after the big one starts (default 120)")
    parser.add_argument("--window", type=float, default=10.0, help="seconds per line of the share series (10)")
    parser.add_argument("--concurrency", type=int, default=4, help="the model's batch slots (default 4)")
    parser.add_argument("--account-concurrency", type=int, default=1000,
                        help="each account's concurrent-request slots (default 1000: only the model's count)")
    parser.add_argument("--delay", type=float, default=2.0,
                        help="seconds between the big batch's POST and the first small ones (default 2)")
    parser.add_argument("--poll", type=float, default=1.0, help="status poll interval of the clients, s (1)")
    parser.add_argument("--target-fraction", type=float, default=0.8,
                        help="the big batch's overall share must be at least this fraction of 1/(clients+1)")
    args = parser.parse_args()
    fair = 1 / (args.clients + 1)
    print(f"load average before: {c.load_average()}")
    print(f"model {c.MODEL} with {args.concurrency} batch slots, latency {args.latency:g} s; big batch {args.big}; "
          f"{args.clients} clients submit {args.small}-request batches back to back for {args.duration:g} s; "
          f"fair share of the big batch {fair:.0%}")

    catalog = c.write_catalog(Path(tempfile.mkdtemp(prefix="fi-bench-catalog-")), args.concurrency, [c.MODEL])
    stack = c.StackProcess(env={"MODEL_CATALOG_PATH": str(catalog)}, short_timings=False, stats=True)
    runs: list[SmallRun] = []
    errors: list[str] = []
    lock = threading.Lock()
    big_counts = Counts("big")
    try:
        stack.admin("set-account", "dev", "--concurrency", str(args.account_concurrency))
        clients = []
        for number in range(args.clients):
            key = stack.admin("create-key", "--account", f"client-{number}", "--tier", "internal").splitlines()[-1]
            stack.admin("set-account", f"client-{number}", "--concurrency", str(args.account_concurrency))
            clients.append(c.Client(stack.base_url, key))
        owner = c.Client(stack.base_url, stack.key)
        big_body = c.batch_body(args.big, model=c.MODEL, directive=f"[sim:latency={args.latency:g}] big")
        started = time.time()
        big, big_post = owner.create(c.dumps(big_body))
        big_counts.add(time.time(), big)
        print(f"big batch created in {big_post:.2f} s")
        time.sleep(args.delay)
        stream_start = time.time()
        stop_at = stream_start + args.duration
        threads = [threading.Thread(target=client_loop, args=(n, client, args, stop_at, runs, lock, errors),
                                    name=f"client-{n}", daemon=True) for n, client in enumerate(clients)]
        for thread in threads:
            thread.start()
        while time.time() < stop_at:
            time.sleep(1.0)
            big = owner.batch(big["id"])
            big_counts.add(time.time(), big)
            if big["status"] in c.FINAL:
                print("NOTE: the big batch finished before the stream ended: make it bigger or the run shorter")
                break
        for thread in threads:
            thread.join(timeout=30 + args.poll)
        end = time.time()
        # Bounded: whatever still runs is cancelled, not waited for.
        for run in runs:
            if run.ended is None:
                with contextlib.suppress(RuntimeError):  # it finished meanwhile
                    clients[run.client].cancel(run.batch_id)
        if big["status"] not in c.FINAL:
            owner.cancel(big["id"])
        samples = stack.read_stats()
    finally:
        stack.stop()

    # ---- shares per window, from the stream's start
    rows = []
    big_total = small_total = 0
    t = stream_start
    shares = []
    while t < end - 1e-6:
        edge = min(t + args.window, end)
        big_done = big_counts.finished_between(t, edge)
        small_done = sum(run.counts.finished_between(t, edge) for run in runs)
        held = [s["slots"].get(c.MODEL, [0, 0]) for s in samples if t <= s["wall"] < edge]
        total = big_done + small_done
        share = big_done / total if total else float("nan")
        if total:
            shares.append(share)
        rows.append((f"{t - stream_start:.0f}-{edge - stream_start:.0f} s", big_done, small_done,
                     f"{share:.0%}" if total else "-",
                     f"{statistics.mean(h[0] for h in held):.1f}" if held else "-",
                     f"{statistics.mean(h[1] for h in held):.1f}" if held else "-"))
        big_total += big_done
        small_total += small_done
        t = edge
    print(f"\n=== the model's completed requests per {args.window:g} s window, from the first small batch ===")
    print(c.table(rows, ("window", "big", f"small ({args.clients} clients)", f"big's share (fair {fair:.0%})",
                         "slots held, mean", "waiters, mean")))

    finished = [run for run in runs if run.ended is not None]
    times = [run.ended - run.started for run in finished]
    per_client = {n: sum(1 for run in finished if run.client == n) for n in range(args.clients)}
    overall = big_total / (big_total + small_total) if big_total + small_total else float("nan")
    ran_for = end - stream_start
    ideal_small = args.small / args.concurrency * args.latency
    print(f"\nsmall batches finished: {len(finished)} ({per_client} by client), each in {min(times):.1f} to "
          f"{max(times):.1f} s, median {statistics.median(times):.1f} s (alone on all {args.concurrency} slots: "
          f"{ideal_small:.1f} s at best)" if times else "\nno small batch finished in the run")
    big_wall, big_done = big_counts.samples[-1]
    print(f"big batch: {big_done} of {args.big} requests done in {big_wall - started:.0f} s "
          f"(cancelled at the end if unfinished)")
    if errors:
        print(f"{len(errors)} create errors, e.g. {errors[0][:200]}")
    model_rate = (big_total + small_total) / ran_for
    print(f"the model ran {model_rate:.2f} req/s in all ({args.concurrency / args.latency:.1f} if every slot were "
          f"always in an upstream call)")

    print("\n=== summary: fairness under a stream of small batches ===")
    ok = overall >= args.target_fraction * fair
    print(c.table([
        ("big / small / clients / latency / slots",
         f"{args.big} / {args.small} / {args.clients} / {args.latency:g} s / {args.concurrency}", ""),
        ("stream duration", f"{ran_for:.0f} s", ""),
        ("big's completed / all completed", f"{big_total} / {big_total + small_total}", ""),
        ("big's share overall", f"{overall:.1%}",
         f">= {args.target_fraction * fair:.0%} (fair {fair:.0%})  {c.verdict(ok)}"),
        (f"big's share per {args.window:g} s window, min / median / max",
         f"{min(shares):.0%} / {statistics.median(shares):.0%} / {max(shares):.0%}" if shares else "-", ""),
        ("windows where the big batch ran nothing", sum(1 for s in shares if s == 0), ""),
        ("small batches finished, median time", f"{len(finished)}, {statistics.median(times):.1f} s" if times else "0",
         ""),
        ("load average (1 / 5 / 15 min) at the end", c.load_average(), ""),
    ], ("measure", "value", "target")))
    if not ok:
        print("\nWhat the policy predicts (store/leases.py fair_shares), and the table shows: a batch with at "
              "most 100 requests left takes every slot it has chains for, ahead of bigger batches, even their "
              "last; with small batches always waiting, the big one's chains yield at each hand-over and the woken "
              "turns go to the small ones, so it runs only in the gaps between one small batch's end and the "
              "next one's start.")


if __name__ == "__main__":
    main()
