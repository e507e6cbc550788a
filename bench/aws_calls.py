"""AWS API calls per successful request, and a modelled AWS cost per million requests.

The local stack runs in this process; botocore event hooks on every client it uses count each
call (see _instrument.py) over: creating a batch of --requests requests, running it (simulated
upstream latency --latency s), and reading all its results (--page a page). Calls are grouped by
who makes them: the API function (create, results), the worker function, and the queue poller
(Lambda's event source mapping makes those receives and deletes too, so they count, but are
shown apart). Status polls while waiting, empty receives and the schedules are shown but not
counted per request: they depend on how often a client polls and how long queues sit idle, not
on the number of requests. Target: <= 8 calls per successful request.

The cost model uses those counts, the billing units measured per call (DynamoDB read/write
request units from the item sizes, SQS 64 KB chunks, API Gateway 512 KB steps) and the measured
durations, with the upstream call taking --model-latency (5 s) and --per-invocation requests
running concurrently in one worker invocation. Prices are assumptions (us-east-1 list prices,
printed); free tiers are ignored.

    .venv/bin/python bench/aws_calls.py [--requests 200] [--latency 0.05] [--page 1000]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c
from _instrument import AwsCalls, OpStats

# us-east-1 list prices (assumptions; check https://aws.amazon.com/pricing before relying on them).
PRICES = {
    "lambda_gb_s_arm64": 0.0000133334,  # USD per GB-second, arm64 (the template's architecture)
    "lambda_request": 0.20 / 1e6,  # USD per invocation
    "dynamodb_wru": 0.625 / 1e6,  # USD per on-demand write request unit
    "dynamodb_rru": 0.125 / 1e6,  # USD per on-demand read request unit
    "sqs_request": 0.40 / 1e6,  # USD per standard-queue request (each 64 KB chunk of payload)
    "s3_put": 0.005 / 1000,  # USD per PUT/LIST request
    "s3_get": 0.0004 / 1000,  # USD per GET request
    "http_api_request": 1.00 / 1e6,  # USD per HTTP API request (metered in 512 KB steps)
}


def function_memory_gb(logical_id: str) -> float:
    from freeinference_batch.local.template import load_template

    template = load_template(c.REPO / "template.yaml")
    default = ((template.get("Globals") or {}).get("Function") or {}).get("MemorySize", 128)
    properties = template["Resources"][logical_id].get("Properties") or {}
    return float(properties.get("MemorySize", default)) / 1024


def add(stats: list[OpStats]) -> OpStats:
    total = OpStats()
    for one in stats:
        for name in total.__dataclass_fields__:
            setattr(total, name, getattr(total, name) + getattr(one, name))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="requests in the batch (default 200)")
    parser.add_argument("--latency", type=float, default=0.05, help="simulated upstream latency in this run, s")
    parser.add_argument("--page", type=int, default=1000, help="results per page when reading (default 1000)")
    parser.add_argument("--poll", type=float, default=0.5, help="status poll interval while waiting, s")
    parser.add_argument("--schedule-seconds", type=float, default=60.0,
                        help="how often the local schedules run (default 60, the template's rate)")
    parser.add_argument("--model-latency", type=float, default=5.0, help="upstream latency in the cost model, s")
    parser.add_argument("--per-invocation", type=float, default=4.0,
                        help="requests running at once in one worker invocation, in the cost model (default 4 = "
                             "the model's batch concurrency, one lane's messages per batch)")
    parser.add_argument("--aws-call-ms", type=float, default=10.0,
                        help="for a sensitivity line: the worker's AWS calls at this latency each, as on AWS, "
                             "instead of the local stack's (moto, one request at a time) measured durations")
    parser.add_argument("--target", type=float, default=8.0, help="calls per successful request (default 8)")
    args = parser.parse_args()

    env = {"BATCH_SCHEDULE_SECONDS": str(args.schedule_seconds)}
    body = c.batch_body(args.requests, directive=f"[sim:latency={args.latency:g}]")
    data = c.dumps(body)
    with c.in_process_stack(env) as stack:
        calls = AwsCalls(stack).install()
        client = c.Client(stack.base_url, stack.dev_key)
        calls.reset()
        moto_before = calls.moto_requests()
        started = time.perf_counter()
        batch, create_seconds = client.create(data)
        batch, run_seconds = client.wait_final(batch["id"], timeout=600, interval=args.poll)
        results, pages = client.read_all(batch["id"], args.page)
        elapsed = time.perf_counter() - started
        page_bytes = list(client.page_bytes)
        time.sleep(0.5)  # let the last deletes of the poller land
        moto_total = calls.moto_requests() - moto_before
        by_source = calls.by_source()
        timings = calls.timings
        poller_stats = {name: p.stats() for name, p in stack.pollers.items()}
        wru_by_kind, gsi_wru_by_kind = dict(calls.wru_by_kind), dict(calls.gsi_wru_by_kind)
        timer_runs = {name: t.stats()["runs"] for name, t in stack.timers.items()}
        calls.uninstall()

    succeeded = batch["request_counts"]["completed"]
    print(f"batch of {args.requests}: {batch['status']}, counts {batch['request_counts']}; create "
          f"{create_seconds:.2f} s, run {run_seconds:.2f} s, read {len(results)} results in {len(pages)} page(s); "
          f"{elapsed:.1f} s in all; {moto_total} requests reached moto")
    if not succeeded:
        print("no request succeeded: nothing to divide by")
        return

    # ---- who called what
    groups: dict[str, dict[str, OpStats]] = {}
    separate: dict[str, dict[str, OpStats]] = {}
    for source, ops in sorted(by_source.items()):
        if source == "api:POST /v1/batches":
            groups["API: create"] = ops
        elif source == "api:GET /v1/batches/{batch_id}/results":
            groups["API: read results"] = ops
        elif source == "worker":
            groups["worker"] = ops
        elif source == "poller":
            groups["poller (event source mapping)"] = {op: s for op, s in ops.items() if "(empty)" not in op}
            separate["poller: empty receives"] = {op: s for op, s in ops.items() if "(empty)" in op}
        elif source == "api:GET /v1/batches/{batch_id}":
            separate["API: status polls"] = ops
        else:
            separate[source] = ops

    rows = []
    for group, ops in [*groups.items(), *separate.items()]:
        counted = group in groups
        for op, s in sorted(ops.items(), key=lambda item: -item[1].calls):
            rows.append((group if counted else f"({group})", op, s.calls,
                         f"{s.calls / succeeded:.2f}" if counted else "-",
                         f"{s.seconds / s.calls * 1000:.1f}", f"{s.rru:g}", f"{s.wru:g}", s.sqs_requests,
                         s.attempts - s.calls))
    print("\n=== AWS calls by caller and operation (over create + run + read) ===")
    print(c.table(rows, ("caller", "operation", "calls", "per success", "ms each", "RRU", "WRU", "SQS req",
                         "retries")))

    per_group = {group: add(list(ops.values())) for group, ops in groups.items()}
    counted = add(list(per_group.values()))
    functions = add([s for group, s in per_group.items() if not group.startswith("poller")])
    print("\n=== calls per successful request ===")
    print(c.table(
        [(group, f"{s.calls / succeeded:.2f}") for group, s in per_group.items()]
        + [("functions (API + worker)", f"{functions.calls / succeeded:.2f}"),
           ("total (functions + poller)", f"{counted.calls / succeeded:.2f}")],
        ("", "calls / success")))
    runs = sum(timer_runs.values())
    schedule_calls = sum(add(list(ops.values())).calls for source, ops in separate.items()
                         if source.startswith("schedule:"))
    polls = len(timings.api.get("GET /v1/batches/{batch_id}", []))
    poll_calls = add(list(separate.get("API: status polls", {}).values())).calls
    empty = add(list(separate.get("poller: empty receives", {}).values())).calls
    print(f"not per request: {polls} status polls ({poll_calls / max(1, polls):.1f} calls each), {empty} empty "
          f"receives (local pollers poll every few ms without long polling; Lambda's long-polls), "
          f"{runs} schedule runs ({schedule_calls} calls)")
    invocations = timings.invocations
    brief = {n: {k: v for k, v in s.items() if k in ("receives", "empty_receives", "invocations")}
             for n, s in poller_stats.items()}
    messages = sum(n for n, _ in invocations)
    print(f"worker: {len(invocations)} invocations, {messages} messages "
          f"({messages / max(1, len(invocations)):.2f} an invocation); handle_record outcomes "
          f"{dict(timings.outcomes)}; poller stats {brief}")

    print("\nDynamoDB write units by item written (all callers; pk/sk prefixes), and the part that is GSI writes:")
    print(c.table([(kind, f"{wru:g}", f"{wru / succeeded:.2f}", f"{gsi_wru_by_kind.get(kind, 0):g}")
                   for kind, wru in sorted(wru_by_kind.items(), key=lambda item: -item[1])],
                  ("item", "WRU", "per success", "of which GSI")))

    # ---- the cost model
    worker_gb = function_memory_gb("GlmFlashWorkerFunction")
    api_gb = function_memory_gb("ApiFunction")
    overhead = timings.overhead_per_request
    ran = timings.requests_run
    deliveries_run = len(timings.chain_runs)  # a delivery runs a stretch of its chain: often several requests
    parked_seconds = sum(timings.handle) - sum(o for o, _ in timings.chain_runs) - sum(timings.upstream)
    not_run = len(timings.handle) - deliveries_run
    api_seconds = sum(timings.api.get("POST /v1/batches", [])) + sum(
        timings.api.get("GET /v1/batches/{batch_id}/results", []))
    api_invocations = len(timings.api.get("POST /v1/batches", [])) + len(
        timings.api.get("GET /v1/batches/{batch_id}/results", []))
    http_api_units = math.ceil(len(data) / (512 * 1024)) + sum(math.ceil(max(1, b) / (512 * 1024))
                                                               for b in page_bytes)

    def lambda_worker(n: float, overhead: float) -> tuple[float, float]:
        """(GB-s, invocations) per success: chains share invocations n at a time; other records one each."""
        gb_s = worker_gb * ((args.model_latency + overhead) * ran / n + parked_seconds) / succeeded
        return gb_s, (deliveries_run / n + not_run) / succeeded

    def cost_lines(n: float, overhead: float = overhead) -> list[tuple[str, float, str]]:
        gb_s, invocations_per = lambda_worker(n, overhead)
        api_gb_s = api_gb * api_seconds / succeeded
        return [
            ("Lambda worker GB-s", gb_s * PRICES["lambda_gb_s_arm64"],
             f"{worker_gb:g} GB x ({args.model_latency:g} s + {overhead * 1000:.0f} ms) / {n:g} a invocation"),
            ("Lambda worker invocations", invocations_per * PRICES["lambda_request"], f"{invocations_per:.3f} / req"),
            ("Lambda API GB-s", api_gb_s * PRICES["lambda_gb_s_arm64"],
             f"{api_gb:g} GB x {api_seconds:.2f} s (create + results) / {succeeded}"),
            ("Lambda API invocations", api_invocations / succeeded * PRICES["lambda_request"],
             f"{api_invocations} / {succeeded}"),
            ("DynamoDB writes", counted.wru / succeeded * PRICES["dynamodb_wru"],
             f"{counted.wru / succeeded:.2f} WRU / req"),
            ("DynamoDB reads", counted.rru / succeeded * PRICES["dynamodb_rru"],
             f"{counted.rru / succeeded:.2f} RRU / req"),
            ("SQS", counted.sqs_requests / succeeded * PRICES["sqs_request"],
             f"{counted.sqs_requests / succeeded:.2f} requests / req"),
            ("S3", (counted.s3_puts * PRICES["s3_put"] + counted.s3_gets * PRICES["s3_get"]) / succeeded,
             f"{counted.s3_puts} PUT, {counted.s3_gets} GET"),
            ("API Gateway HTTP API", http_api_units / succeeded * PRICES["http_api_request"],
             f"{http_api_units} metered requests (512 KB steps)"),
        ]

    lines = cost_lines(args.per_invocation)
    total = sum(cost for _, cost, _ in lines)
    print(f"\n=== modelled AWS cost per million successful requests (upstream {args.model_latency:g} s, "
          f"{args.per_invocation:g} requests per worker invocation) ===")
    print(c.table([(name, f"${cost * 1e6:,.2f}", basis) for name, cost, basis in lines]
                  + [("total", f"${total * 1e6:,.2f}", "")], ("item", "USD / 1M", "basis")))
    worker_calls = per_group.get("worker", OpStats()).calls / succeeded
    aws_overhead = worker_calls * args.aws_call_ms / 1000
    sensitivity = []
    for n in sorted({1.0, 2.0, args.per_invocation, 10.0}):
        sensitivity.append((f"{n:g} requests / invocation", f"${sum(x for _, x, _ in cost_lines(n)) * 1e6:,.2f}",
                            f"${sum(x for _, x, _ in cost_lines(n, aws_overhead)) * 1e6:,.2f}"))
    print(c.table(sensitivity, ("worker invocations shared by", "total USD / 1M",
                                f"same, worker AWS calls {args.aws_call_ms:g} ms each ({aws_overhead * 1000:.0f} ms)")))
    print("prices assumed (us-east-1 list, no free tier): " + ", ".join(f"{k} {v:.10g}" for k, v in PRICES.items()))
    print("not modelled: DynamoDB/S3 storage, CloudWatch logs and metrics, X-Ray, data transfer, the schedules "
          "(a fixed cost per minute, not per request) and the event source mapping's idle long polls.")

    print("\n=== summary: aws_calls ===")
    print(c.table([
        ("successful requests", succeeded, ""),
        ("AWS calls per success: functions (API + worker)", f"{functions.calls / succeeded:.2f}", ""),
        ("AWS calls per success: poller (receive + delete)",
         f"{per_group.get('poller (event source mapping)', OpStats()).calls / succeeded:.2f}", ""),
        ("AWS calls per success: total", f"{counted.calls / succeeded:.2f}",
         f"<= {args.target:g}  {c.verdict(counted.calls / succeeded <= args.target)}"),
        ("DynamoDB WRU / RRU per success", f"{counted.wru / succeeded:.2f} / {counted.rru / succeeded:.2f}", ""),
        ("worker time per request besides upstream", f"{overhead * 1000:.0f} ms", ""),
        (f"modelled cost per 1M requests ({args.model_latency:g} s, {args.per_invocation:g}/invocation)",
         f"${total * 1e6:,.2f}", ""),
    ], ("measure", "value", "target")))


if __name__ == "__main__":
    main()
