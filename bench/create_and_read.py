"""Create a 50,000-request batch (~10 MiB of JSON) and read all its results, on the local stack.

(a) POST /v1/batches: median wall time of --runs creates, and the peak memory (VmHWM) of the stack
    process that served them (the stack runs as a subprocess, so its memory is its own: by default
    bench/_stack_server.py --paused, the same LocalStack with its queue pollers paused so no worker
    competes with the API for moto; --workers running uses `freeinference-batch dev` instead).
    moto runs in the stack's own child process, so its copy of the items is not in this figure.
    Baseline, in this process: json.dumps + json.loads of the same payload. Target: median <= 3 s.
(b) GET /v1/batches/{id}/results, 1,000 a page, until has_more is false: total time. The batch
    need not have run (unstarted requests are listed as queued). Target: <= 10 s.

If a target is missed (or with --profile always), the create (and a few result pages) run again
on an in-process LocalStack under cProfile and the top functions are printed.

    .venv/bin/python bench/create_and_read.py [--requests 50000] [--runs 3] [--page 1000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c


def baseline(body: dict, runs: int) -> tuple[float, float, float]:
    """Median seconds of json.dumps, json.loads, and both, of the same payload in this process."""
    dumps, loads = [], []
    for _ in range(runs):
        started = time.perf_counter()
        data = json.dumps(body)
        dumps.append(time.perf_counter() - started)
        started = time.perf_counter()
        json.loads(data)
        loads.append(time.perf_counter() - started)
    both = [d + lo for d, lo in zip(dumps, loads, strict=True)]
    return statistics.median(dumps), statistics.median(loads), statistics.median(both)


def profile_in_process(data: bytes, batch_body_n: int, pages: int, page_size: int, top: int) -> None:
    """The create (and `pages` result pages) on an in-process LocalStack under cProfile."""
    print(f"\n=== profile: one create of {batch_body_n} requests (+ {pages} result pages), in-process stack ===")
    with c.in_process_stack() as stack:
        stack.pause_workers()
        api_profile, moto_profile = c.ThreadProfiles(), c.ThreadProfiles()
        for route in stack.api.routes:
            route.handler = api_profile.wrap(route.handler)
        stack.moto.app.app = moto_profile.wrap(stack.moto.app.app)
        client = c.Client(stack.base_url, stack.dev_key)
        moto_before = stack.moto.app.requests
        batch, seconds = client.create(data)
        moto_calls = stack.moto.app.requests - moto_before
        print(f"create: {seconds:.2f} s in-process under the profiler, {moto_calls} AWS (moto) requests")
        after = None
        read_started = time.perf_counter()
        for _ in range(pages):
            params = {"limit": page_size, **({"after": after} if after else {})}
            page = client.call("GET", f"/batches/{batch['id']}/results", params=params)
            after = page["last_id"]
            if not page["has_more"]:
                break
        if pages:
            print(f"{pages} result pages: {time.perf_counter() - read_started:.2f} s under the profiler")
        print(f"\n--- API handler thread(s), top {top} by cumulative time ---")
        print(api_profile.top(top))
        print(f"--- moto server (serialized behind one lock), top {top} by cumulative time ---")
        print(moto_profile.top(top))
        print(f"--- API handler thread(s), top {top} by own time ---")
        print(api_profile.top(top, sort="tottime"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50_000, help="requests in the batch (default 50000)")
    parser.add_argument("--runs", type=int, default=3, help="creates to take the median of (default 3)")
    parser.add_argument("--page", type=int, default=1000, help="results per page (default 1000, the maximum)")
    parser.add_argument("--request-bytes", type=int, default=c.DEFAULT_REQUEST_BYTES,
                        help="JSON bytes per request entry (default 210: 50,000 make ~10 MiB)")
    parser.add_argument("--workers", choices=("paused", "running"), default="paused",
                        help="paused (default): the stack's pollers receive nothing; running: `freeinference-batch "
                             "dev`, workers run the batches in the background (see --latency)")
    parser.add_argument("--latency", type=float, default=None,
                        help="[sim:latency=S] in every message (default: none with paused workers, 10 with "
                             "running ones, so they run only ~4 requests per S seconds in the background)")
    parser.add_argument("--create-target", type=float, default=3.0, help="seconds (default 3)")
    parser.add_argument("--read-target", type=float, default=10.0, help="seconds (default 10)")
    parser.add_argument("--profile", choices=("auto", "always", "never"), default="auto",
                        help="profile in-process when a target is missed (auto), always, or never")
    parser.add_argument("--profile-pages", type=int, default=5, help="result pages to profile too (default 5)")
    parser.add_argument("--top", type=int, default=15, help="functions to list per profile (default 15)")
    args = parser.parse_args()

    if args.latency is None:
        args.latency = 10.0 if args.workers == "running" else 0.0
    directive = f"[sim:latency={args.latency:g}]" if args.latency > 0 else ""
    body = c.batch_body(args.requests, directive=directive, size=args.request_bytes)
    data = c.dumps(body)
    print(f"payload: {args.requests} requests, {len(data) / 2**20:.2f} MiB of JSON "
          f"({len(data) / args.requests:.0f} B each); example entry:\n  {json.dumps(body['requests'][1])}")
    base_dumps, base_loads, base_both = baseline(body, args.runs)
    print(f"baseline in this process (median of {args.runs}): json.dumps {base_dumps:.3f} s + json.loads "
          f"{base_loads:.3f} s = {base_both:.3f} s")

    stack = c.StackProcess(paused=args.workers == "paused", short_timings=False)
    try:
        client = c.Client(stack.base_url, stack.key)
        started_status = c.proc_status(stack.pid)
        print(f"stack pid {stack.pid} at {stack.base_url} (workers {args.workers}): RSS after start "
              f"{c.mib(started_status['VmRSS'])}")
        # Warm-up: a tiny batch so connection pools and lazy imports are not billed to run 1.
        warm, _ = client.create(c.dumps(c.batch_body(10, directive=directive)))
        client.cancel(warm["id"])

        creates, peaks, peak_reset = [], [], True
        batch: dict = {}
        for run in range(args.runs):
            peak_reset = c.reset_peak_rss(stack.pid) and peak_reset
            before = c.proc_status(stack.pid)
            batch, seconds = client.create(data)
            after = c.proc_status(stack.pid)
            creates.append(seconds)
            peaks.append(after["VmHWM"])
            print(f"create run {run + 1}: {seconds:.3f} s, status {batch['status']}, "
                  f"total {batch['request_counts']['total']}; stack RSS {c.mib(before['VmRSS'])} -> "
                  f"{c.mib(after['VmRSS'])}, peak (VmHWM) {c.mib(after['VmHWM'])}")
            if run < args.runs - 1:
                client.cancel(batch["id"])  # keep the unfinished count low; the last one is read below
        create_median = statistics.median(creates)
        peak = max(peaks)

        read_started = time.perf_counter()
        results, pages = client.read_all(batch["id"], args.page)
        read_total = time.perf_counter() - read_started
        statuses = Counter(r["status"] for r in results)
        in_order = [r["custom_id"] for r in results] == [f"req-{i:06d}" for i in range(args.requests)]
        print(f"read: {len(results)} results in {len(pages)} pages, {read_total:.2f} s; per page median "
              f"{statistics.median(pages) * 1000:.0f} ms, max {max(pages) * 1000:.0f} ms; statuses "
              f"{dict(statuses)}; in submission order: {in_order}")
        client.cancel(batch["id"])
        final_status = c.proc_status(stack.pid)
    finally:
        stack.stop()

    create_ok = create_median <= args.create_target
    read_ok = read_total <= args.read_target
    peak_note = "per run (VmHWM reset before each)" if peak_reset else "cumulative since start (reset refused)"
    print("\n=== summary: create_and_read ===")
    print(c.table([
        ("payload", f"{args.requests} requests, {len(data) / 2**20:.2f} MiB", "", ""),
        (f"create POST, median of {args.runs}", f"{create_median:.2f} s", f"<= {args.create_target:g} s",
         c.verdict(create_ok)),
        ("create runs", ", ".join(f"{s:.2f}" for s in creates) + " s", "", ""),
        ("baseline json.dumps+loads (this process)", f"{base_both:.3f} s", "", ""),
        ("create / baseline", f"{create_median / base_both:.1f}x", "", ""),
        ("stack peak memory (VmHWM) while creating", c.mib(peak), peak_note, ""),
        ("stack RSS after start / at the end", f"{c.mib(started_status['VmRSS'])} / {c.mib(final_status['VmRSS'])}",
         "", ""),
        (f"read all results, {args.page} a page", f"{read_total:.2f} s", f"<= {args.read_target:g} s",
         c.verdict(read_ok)),
        ("read per page, median / max", f"{statistics.median(pages) * 1000:.0f} / {max(pages) * 1000:.0f} ms", "",
         ""),
    ], ("measure", "value", "target", "")))

    if args.profile == "always" or (args.profile == "auto" and not (create_ok and read_ok)):
        profile_in_process(data, args.requests, 0 if read_ok and args.profile == "auto" else args.profile_pages,
                           args.page, args.top)


if __name__ == "__main__":
    main()
