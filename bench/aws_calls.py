"""AWS API calls per successful request, and a modelled AWS cost per million requests.

The local stack runs in this process; botocore event hooks on every client it uses count each
call (see _instrument.py) over: creating a batch of --requests requests, running it (simulated
upstream latency --latency s), and reading all its results (--page a page). Calls are grouped by
who makes them: the API function (create, results), the worker function, and the queue poller
(Lambda's event source mapping makes those receives and deletes too, so they count, but are
shown apart). Status polls while waiting, empty receives and the schedules are shown but not
counted per request: they depend on how often a client polls and how long queues sit idle, not
on the number of requests. Target: <= 8 calls per successful request.

The cost model uses those counts, the billing units measured per call (_billing.py: DynamoDB
read/write request units from the item images before and after each write, GSI writes only where
a write changes what an index holds, SQS 64 KB chunks, API Gateway 512 KB steps) and the worker's
invocations as they ran: each invocation's measured wall time; records run side by side, so an
invocation lasts as long as its longest chain. So how many requests share an invocation, and its
tail (chains waiting for the slowest), are measured, not assumed. By default the run's upstream
latency is --model-latency (5 s) itself, so everything is measured at it, what the engine does on
a timer included (a chain counts what it settled every 24 requests or 120 s: at 5 s, both at once);
with a shorter --latency the run is faster and each upstream call is stretched to --model-latency
in the model, but a timer's writes are then those of the short latency (fewer at 50 ms). The old model (an assumed 4
requests per invocation, GSIs written on every update) is printed beside it for comparison.
Prices are assumptions (us-east-1 list prices, printed); free tiers are ignored.
Targets: <= $3 per million requests at 5 s (issue 24; issue 13's was $5), <= 4 DynamoDB WRU per request.

Hot items on paper: from the writes counted per item (table, pk, sk) and the sizes of the
collections that grow with the requests in flight (slot leases), the WCU per second
each item and each partition key would take with --hot-in-flight (500) requests in flight at
--model-latency, all of one batch and one account as in this run; DynamoDB allows 1,000 WCU/s per
partition, and the target is a third of that. Also how many worker invocations that load needs.

By default the batch is 1,500 requests on a model of 64 batch slots: a model at scale, as issue
13 sets the cost target for (a model serving hundreds of requests at once). At the packaged 4
slots (`--concurrency 0 --requests 200`) at most 4 requests share a worker invocation, so at 5 s
Lambda alone costs $4.17 a million at 256 MB, whatever else the run does.

With --concurrency N the model gets N batch slots (a catalog written to a temp dir, passed as
MODEL_CATALOG_PATH), its worker the sizes README "Sizing a model" gives for N (a copy of
template.yaml beside it: WorkerConcurrency, BatchSize, batching window), and the dev account
enough concurrent-request slots.

    .venv/bin/python bench/aws_calls.py [--requests 1500] [--latency 5] [--page 1000] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c
from _billing import ItemWrites
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
    from freeinference_batch_local.cloudformation.template import load_template

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
    parser.add_argument("--requests", type=int, default=1500, help="requests in the batch (default 1500)")
    parser.add_argument("--latency", type=float, default=None,
                        help="simulated upstream latency in this run, s (default: --model-latency, so that what the "
                             "engine does on a timer, such as counting every 120 s, is measured at that latency; a "
                             "shorter one runs faster, its upstream calls stretched to --model-latency in the model)")
    parser.add_argument("--page", type=int, default=1000, help="results per page when reading (default 1000)")
    parser.add_argument("--poll", type=float, default=0.5, help="status poll interval while waiting, s")
    parser.add_argument("--schedule-seconds", type=float, default=60.0,
                        help="how often the local schedules run (default 60, the template's rate)")
    parser.add_argument("--model-latency", type=float, default=5.0, help="upstream latency in the cost model, s")
    parser.add_argument("--concurrency", type=int, default=64,
                        help="the model's batch slots (default 64; 0: the packaged catalog's, 4)")
    parser.add_argument("--old-per-invocation", type=float, default=4.0,
                        help="the old model's assumed requests per invocation, for the comparison line only (4)")
    parser.add_argument("--hot-in-flight", type=int, default=500,
                        help="requests in flight for the hot-item projection (default 500)")
    parser.add_argument("--aws-call-ms", type=float, default=10.0,
                        help="for a sensitivity line: the worker's AWS calls at this latency each, as on AWS, "
                             "instead of the local stack's (moto, one request at a time) measured durations")
    parser.add_argument("--contended", action="store_true",
                        help="a second account's batch of the same size, created just before the measured one, "
                             "on the same model: its slots full while both run (calls and writes are of both)")
    parser.add_argument("--target", type=float, default=8.0, help="calls per successful request (default 8)")
    parser.add_argument("--target-usd", type=float, default=3.0, help="USD per million requests (default 3)")
    parser.add_argument("--target-wru", type=float, default=4.0, help="DynamoDB WRU per request (default 4)")
    args = parser.parse_args()
    if args.latency is None:
        args.latency = args.model_latency

    print(f"load average before: {c.load_average()}")
    env = {"BATCH_SCHEDULE_SECONDS": str(args.schedule_seconds)}
    template = None
    if args.concurrency:
        catalog_dir = Path(tempfile.mkdtemp(prefix="fi-bench-catalog-"))
        env["MODEL_CATALOG_PATH"] = str(c.write_catalog(catalog_dir, args.concurrency, [c.MODEL]))
        # The model's worker sized for that capacity, as README "Sizing a model" says to deploy it.
        template = c.write_sized_template(catalog_dir, args.concurrency, c.MODEL)
    body = c.batch_body(args.requests, directive=f"[sim:latency={args.latency:g}]")
    data = c.dumps(body)
    with c.in_process_stack(env, template=template) as stack:
        from freeinference_batch import accounts
        from freeinference_batch.core.catalog import load_catalog
        from freeinference_batch.core.settings import get_settings

        concurrency = load_catalog(get_settings().model_catalog_path).models[c.MODEL].batch_concurrency
        # What `admin set-account dev --concurrency` does: the account's slots must not cap the model's.
        accounts.set_account(get_settings(), "dev", concurrency=max(16, 2 * concurrency, args.hot_in_flight))
        calls = AwsCalls(stack).install()
        client = c.Client(stack.base_url, stack.dev_key)
        rival = None
        if args.contended:
            rival = c.Client(stack.base_url, accounts.create_key(
                get_settings(), "rival", tier="internal", concurrency=max(16, 2 * concurrency, args.hot_in_flight)))
        # The model's and the account's slots items exist on any stack that has run a batch: a
        # one-request batch first creates them, so the run measures the steady state and not its
        # first chains racing to create them (conditional writes that fail on a tiny item, which
        # the hot-item projection would price at the item's size with 500 holders).
        warm_up, _ = client.create(c.dumps(c.batch_body(1, directive=f"[sim:latency={args.latency:g}]")))
        client.wait_final(warm_up["id"], timeout=120, interval=args.poll)
        calls.reset()
        moto_before = calls.moto_requests()
        started = time.perf_counter()
        rival_batch = rival.create(data)[0] if rival else None
        batch, create_seconds = client.create(data)
        batch, run_seconds = client.wait_final(batch["id"], timeout=600, interval=args.poll)
        results, pages = client.read_all(batch["id"], args.page)
        if rival and rival_batch:
            rival_batch = rival.wait_final(rival_batch["id"], timeout=600, interval=args.poll)[0]
            rival.read_all(rival_batch["id"], args.page)
        elapsed = time.perf_counter() - started
        page_bytes = list(client.page_bytes)
        time.sleep(0.5)  # let the last deletes of the poller land
        moto_total = calls.moto_requests() - moto_before
        by_source = calls.by_source()
        timings = calls.timings
        poller_stats = {name: p.stats() for name, p in stack.pollers.items()}
        wru_by_kind, gsi_wru_by_kind = dict(calls.wru_by_kind), dict(calls.gsi_wru_by_kind)
        old_wru_by_kind = dict(calls.old_wru_by_kind)
        items = dict(calls.items)
        item_reads = dict(calls.item_reads)
        timer_runs = {name: t.stats()["runs"] for name, t in stack.timers.items()}
        calls.uninstall()

    succeeded = batch["request_counts"]["completed"]
    if rival_batch:
        print(f"the other account's batch: {rival_batch['status']}, counts {rival_batch['request_counts']}")
        succeeded += rival_batch["request_counts"]["completed"]
    print(f"batch of {args.requests} on {c.MODEL} ({concurrency} batch slots): {batch['status']}, "
          f"counts {batch['request_counts']}; create "
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

    print("\nDynamoDB write units by item kind (all callers), the part that is GSI writes, and the old rule's:")
    print(c.table([(kind, f"{wru:g}", f"{wru / succeeded:.2f}", f"{gsi_wru_by_kind.get(kind, 0):g}",
                    f"{old_wru_by_kind.get(kind, 0) / succeeded:.2f}")
                   for kind, wru in sorted(wru_by_kind.items(), key=lambda item: -item[1])],
                  ("item", "WRU", "per success", "of which GSI", "old rule, per success")))

    # ---- the worker's invocations, as measured, stretched to the model latency
    worker_gb = function_memory_gb("GlmFlashModel/WorkerFunction")
    api_gb = function_memory_gb("ApiFunction")
    cap = c.template_poller_cap("GlmFlashModel/WorkerFunction", template)
    overhead = timings.overhead_per_request
    ran = timings.requests_run
    invocation_count = len(timings.invocations)
    local_latency = sum(timings.upstream) / max(1, len(timings.upstream))
    stretch = args.model_latency - local_latency  # each upstream call, from this run's latency to the model's
    measured_seconds = sum(seconds for _, seconds in timings.invocations)
    # An invocation lasts as long as its longest record (its records' chains run side by side).
    modelled_seconds = sum(seconds + max((calls for calls, _ in records), default=0) * stretch
                           for (_, seconds), records in zip(timings.invocations, timings.invocation_records,
                                                            strict=True))
    requests_per_invocation = ran / max(1, invocation_count)
    records_per_invocation = sum(n for n, _ in timings.invocations) / max(1, invocation_count)
    longest_chain = max((calls for records in timings.invocation_records for calls, _ in records), default=0)
    # The worker keeps a chain in its invocation while one more upstream call + 30 s fit before the timeout.
    chain_limit = math.floor((float(cap["timeout"]) - 120 - 30) / (args.model_latency + overhead)) + 1
    side_by_side = ran * (args.model_latency + overhead) / max(modelled_seconds, 1e-9)
    print(f"\nworker invocations (measured): {invocation_count}, {records_per_invocation:.2f} records and "
          f"{requests_per_invocation:.1f} requests run each; {measured_seconds:.1f} s of invocation time in all "
          f"({ran} requests at {local_latency * 1000:.0f} ms upstream + {overhead * 1000:.0f} ms worker AWS work); "
          f"stretched to {args.model_latency:g} s upstream: {modelled_seconds:.0f} s, i.e. "
          f"{side_by_side:.2f} requests running at once per invocation on average (tails included)")
    if longest_chain > chain_limit:
        print(f"NOTE: a chain ran {longest_chain} requests in one invocation here; at {args.model_latency:g} s it "
              f"would leave its invocation after about {chain_limit} (timeout {cap['timeout']} s), so the modelled "
              f"invocation count is a little low (the invocation fee is $0.20 per million: it hardly matters)")

    api_seconds = sum(timings.api.get("POST /v1/batches", [])) + sum(
        timings.api.get("GET /v1/batches/{batch_id}/results", []))
    api_invocations = len(timings.api.get("POST /v1/batches", [])) + len(
        timings.api.get("GET /v1/batches/{batch_id}/results", []))
    http_api_units = math.ceil(len(data) / (512 * 1024)) + sum(math.ceil(max(1, b) / (512 * 1024))
                                                               for b in page_bytes)

    def cost_lines(worker_gb_s: float, invocations_per: float, wru: float, basis: str) -> list[tuple[str, float, str]]:
        api_gb_s = api_gb * api_seconds / succeeded
        return [
            ("Lambda worker GB-s", worker_gb_s * PRICES["lambda_gb_s_arm64"], basis),
            ("Lambda worker invocations", invocations_per * PRICES["lambda_request"], f"{invocations_per:.3f} / req"),
            ("Lambda API GB-s", api_gb_s * PRICES["lambda_gb_s_arm64"],
             f"{api_gb:g} GB x {api_seconds:.2f} s (create + results) / {succeeded}"),
            ("Lambda API invocations", api_invocations / succeeded * PRICES["lambda_request"],
             f"{api_invocations} / {succeeded}"),
            ("DynamoDB writes", wru / succeeded * PRICES["dynamodb_wru"], f"{wru / succeeded:.2f} WRU / req"),
            ("DynamoDB reads", counted.rru / succeeded * PRICES["dynamodb_rru"],
             f"{counted.rru / succeeded:.2f} RRU / req"),
            ("SQS", counted.sqs_requests / succeeded * PRICES["sqs_request"],
             f"{counted.sqs_requests / succeeded:.2f} requests / req"),
            ("S3", (counted.s3_puts * PRICES["s3_put"] + counted.s3_gets * PRICES["s3_get"]) / succeeded,
             f"{counted.s3_puts} PUT, {counted.s3_gets} GET"),
            ("API Gateway HTTP API", http_api_units / succeeded * PRICES["http_api_request"],
             f"{http_api_units} metered requests (512 KB steps)"),
        ]

    worker_gb_s = worker_gb * modelled_seconds / succeeded
    lines = cost_lines(worker_gb_s, invocation_count / succeeded, counted.wru,
                       f"{worker_gb:g} GB x {modelled_seconds:.0f} s of invocations / {succeeded}")
    total = sum(cost for _, cost, _ in lines)
    print(f"\n=== modelled AWS cost per million successful requests (upstream {args.model_latency:g} s, "
          f"invocations as measured: {side_by_side:.2f} requests at once each) ===")
    print(c.table([(name, f"${cost * 1e6:,.2f}", basis) for name, cost, basis in lines]
                  + [("total", f"${total * 1e6:,.2f}", "")], ("item", "USD / 1M", "basis")))

    # The old model, from the same run: an assumed number per invocation, GSIs written on every update.
    n = args.old_per_invocation
    deliveries_run = len(timings.chain_runs)
    parked_seconds = sum(timings.handle) - sum(o for o, _ in timings.chain_runs) - sum(timings.upstream)
    not_run = len(timings.handle) - deliveries_run
    old_gb_s = worker_gb * ((args.model_latency + overhead) * ran / n + parked_seconds) / succeeded
    old_wru = counted.old_wru  # the old rule, over the same counted calls
    old_lines = cost_lines(old_gb_s, (deliveries_run / n + not_run) / succeeded, old_wru, "")
    old_total = sum(cost for _, cost, _ in old_lines)
    worker_calls = per_group.get("worker", OpStats()).calls / succeeded
    fast_overhead = worker_calls * args.aws_call_ms / 1000
    fast_seconds = modelled_seconds - ran * (overhead - fast_overhead) / max(side_by_side, 1e-9)
    fast_total = sum(cost for _, cost, _ in cost_lines(worker_gb * fast_seconds / succeeded,
                                                       invocation_count / succeeded, counted.wru, ""))
    print(c.table([
        ("this model (measured invocations, corrected WRU)", f"${total * 1e6:,.2f}"),
        (f"  same, worker AWS calls {args.aws_call_ms:g} ms each as on AWS ({fast_overhead * 1000:.0f} ms a request "
         f"instead of {overhead * 1000:.0f})", f"${fast_total * 1e6:,.2f}"),
        (f"old model (assumed {n:g} per invocation, GSIs as ALL, after-images; same run)", f"${old_total * 1e6:,.2f}"),
    ], ("model", "total USD / 1M")))
    print("prices assumed (us-east-1 list, no free tier): " + ", ".join(f"{k} {v:.10g}" for k, v in PRICES.items()))
    print("not modelled: DynamoDB/S3 storage and PITR, CloudWatch logs and metrics, X-Ray, data transfer, the "
          "schedules (a fixed cost per minute, not per request) and the event source mapping's idle long polls.")

    # ---- hot items on paper
    hot = hot_items(items, succeeded, args.hot_in_flight, args.model_latency)
    rate = args.hot_in_flight / args.model_latency
    limit = 1000 / 3
    print(f"\n=== hot items on paper: {args.hot_in_flight} requests in flight at {args.model_latency:g} s = "
          f"{rate:.0f} requests/s, one batch and one account (as in this run) ===")
    print(c.table([(f"{table_short(t)} {pk[:28]} / {sk[:24]}", record.kind, f"{record.weight / succeeded:.2f}",
                    f"{record.size:,}", collections_note(record), f"{projected:,}", f"{wcu:,.0f}",
                    "OVER" if wcu > limit else "ok")
                   for (t, pk, sk), record, projected, wcu in hot[:8]],
                  ("item (table pk / sk)", "kind", "writes x2 in tx, per req", "bytes (run)",
                   "growing part (run)", f"bytes at {args.hot_in_flight}", "WCU/s", f"<= {limit:.0f}")))
    busiest_key, busiest_key_wcu = busiest_partition(hot)
    # Two models at that many each, one account: what the account's items take at twice the load,
    # with a batch per model, and with one batch of both models (its own items take it all).
    two_models = 2 * args.hot_in_flight
    hot_two = hot_items(items, succeeded, two_models, args.model_latency, models=2, batches=2)
    two_key, two_key_wcu = busiest_partition(hot_two)
    hot_one = hot_items(items, succeeded, two_models, args.model_latency, models=2, batches=1)
    one_key, one_key_wcu = busiest_partition(hot_one)
    for label, hot_n, (key_n, wcu_n) in (("a batch per model", hot_two, (two_key, two_key_wcu)),
                                         ("one batch of both models", hot_one, (one_key, one_key_wcu))):
        print(f"at {two_models} in flight (two models at {args.hot_in_flight}, one account, {label}): busiest "
              f"item {table_short(hot_n[0][0][0])} {hot_n[0][0][1]} / {hot_n[0][0][2]} {hot_n[0][3]:,.0f} WCU/s, "
              f"busiest partition key {table_short(key_n[0])} {key_n[1]} {wcu_n:,.0f} WCU/s")
    slots_entries = [(f"{table_short(t)} {pk} / {sk}", f"{record.slots_per_entry():.1f}",
                      record.projected_entries(args.hot_in_flight), record.projected_entries(two_models))
                     for (t, pk, sk), record in items.items() if record.entries_seen]
    print("slots per entry of the slots items, measured over the run's writes (a block of an invocation "
          "holds several), and the entries that makes:")
    print(c.table(slots_entries, ("item", "slots per entry", f"entries at {args.hot_in_flight}",
                                  f"at {two_models} (account's: both models)")))
    # The same writes and reads with the items at their projected sizes: what a request would cost.
    wru_at = sum(record.weight * _ceil_kb(projected) + record.gsi_wru
                 for _, record, projected, _ in hot) / succeeded
    rru_at = sum(weight * max(1, math.ceil((items[t].projected_size(args.hot_in_flight) if t in items else size)
                                           / 4096))
                 for t, (weight, size) in item_reads.items()) / succeeded
    rru_run = sum(weight * max(1, math.ceil(size / 4096)) for weight, size in item_reads.values()) / succeeded
    dynamo_at = wru_at * PRICES["dynamodb_wru"] + rru_at * PRICES["dynamodb_rru"]
    all_wru = sum(r.wru + r.gsi_wru for r in items.values()) / succeeded
    busiest_item = hot[0]
    invocations_needed = math.ceil(args.hot_in_flight / max(1e-9, min(records_per_invocation,
                                                                       cap["batch_size"])))
    at_most = math.ceil(args.hot_in_flight / cap["batch_size"])
    print(f"busiest partition key: {table_short(busiest_key[0])} {busiest_key[1]} "
          f"{busiest_key_wcu:,.0f} WCU/s (all its items)")
    print(f"at {args.hot_in_flight} in flight each request would write {wru_at:.1f} WRU (this run: "
          f"{counted.wru / succeeded:.2f}; all callers {all_wru:.2f})"
          f" and read {rru_at:.1f} RRU by key ({rru_run:.2f} here): DynamoDB alone "
          f"${dynamo_at * 1e6:,.2f} per million requests")
    print(f"worker invocations for {args.hot_in_flight} in flight: {invocations_needed} at this run's "
          f"{records_per_invocation:.2f} records per invocation, {at_most} at best (BatchSize {cap['batch_size']}, "
          f"one chain per record); the template allows MaximumConcurrency {cap['maximum_concurrency']} / reserved "
          f"{cap['reserved']}, i.e. {cap['batch_size'] * min(cap['maximum_concurrency'], cap['reserved'])} "
          f"requests in flight at most")

    print("\n=== summary: aws_calls ===")
    wru = counted.wru / succeeded
    print(c.table([
        ("successful requests / batch slots", f"{succeeded} / {concurrency}", ""),
        ("AWS calls per success: functions (API + worker)", f"{functions.calls / succeeded:.2f}", ""),
        ("AWS calls per success: poller (receive + delete)",
         f"{per_group.get('poller (event source mapping)', OpStats()).calls / succeeded:.2f}", ""),
        ("AWS calls per success: total", f"{counted.calls / succeeded:.2f}",
         f"<= {args.target:g}  {c.verdict(counted.calls / succeeded <= args.target)}"),
        ("DynamoDB WRU per success (old rule)", f"{wru:.2f} ({old_wru / succeeded:.2f})",
         f"<= {args.target_wru:g}  {c.verdict(wru <= args.target_wru)}"),
        ("DynamoDB RRU per success", f"{counted.rru / succeeded:.2f}", ""),
        ("worker time per request besides upstream", f"{overhead * 1000:.0f} ms", ""),
        ("requests run per worker invocation (measured)", f"{requests_per_invocation:.1f}", ""),
        (f"requests at once per invocation at {args.model_latency:g} s (measured, stretched)", f"{side_by_side:.2f}",
         ""),
        (f"modelled cost per 1M requests ({args.model_latency:g} s)", f"${total * 1e6:,.2f}",
         f"<= ${args.target_usd:g}  {c.verdict(total * 1e6 <= args.target_usd)}"),
        (f"old model ({n:g}/invocation assumed, old GSI rule)", f"${old_total * 1e6:,.2f}", ""),
        (f"busiest item at {args.hot_in_flight} in flight: {busiest_item[1].kind}", f"{busiest_item[3]:,.0f} WCU/s",
         f"<= {limit:.0f}  {c.verdict(busiest_item[3] <= limit)}"),
        (f"busiest partition key at {args.hot_in_flight} in flight", f"{busiest_key_wcu:,.0f} WCU/s",
         f"<= {limit:.0f}  {c.verdict(busiest_key_wcu <= limit)}"),
        (f"busiest item at {two_models} in flight (2 models, 1 account): {hot_two[0][1].kind}",
         f"{hot_two[0][3]:,.0f} WCU/s", f"<= {limit:.0f}  {c.verdict(hot_two[0][3] <= limit)}"),
        (f"busiest partition key at {two_models} in flight (2 models, 1 account, a batch each)",
         f"{two_key_wcu:,.0f} WCU/s", f"<= {limit:.0f}  {c.verdict(two_key_wcu <= limit)}"),
        (f"  same, one batch of both models: its own partition ({one_key[1][:6]}...)", f"{one_key_wcu:,.0f} WCU/s",
         f"<= {limit:.0f}  {c.verdict(one_key_wcu <= limit)}"),
        (f"DynamoDB WRU / RRU per request at {args.hot_in_flight} in flight (projected sizes)",
         f"{wru_at:.1f} / {rru_at:.1f}", f"${dynamo_at * 1e6:,.2f} / 1M"),
        (f"worker invocations for {args.hot_in_flight} in flight (template cap)",
         f"{invocations_needed} ({min(cap['maximum_concurrency'], cap['reserved'])})", ""),
        ("load average (1 / 5 / 15 min) at the end", c.load_average(), ""),
    ], ("measure", "value", "target")))


def table_short(name: str) -> str:
    return "accounts" if "ccount" in name else "batch"


def collections_note(record: ItemWrites) -> str:
    return ", ".join(f"{name} {count} x {size / count:.0f} B" for name, (count, size) in record.collections.items()
                     if count) or "-"


def hot_items(items: dict[tuple[str, str, str], ItemWrites], succeeded: int, in_flight: int,
              latency: float, models: int = 1,
              batches: int = 1) -> list[tuple[tuple[str, str, str], ItemWrites, int, float]]:
    """Per item, busiest first: (key, writes, projected size, WCU/s) at `in_flight` requests in flight,
    spread evenly over `models` models like this run's one and over `batches` batches: a model's
    own items (`MODEL#...`) take their model's share, a batch's items (`BATCH#...`) their batch's,
    the account's all of it (one account).

    Writes per request as measured (transactional ones twice); each write's units from the item's
    size with its growing collections (slot leases) at `in_flight` entries, i.e. one batch whose
    lane is that wide and one account, as in this run. A lane's chain items (`BATCH/CHAIN`) keep
    their size; each takes its share of the requests at this run's lane width, so its own figure
    is an upper bound (at a lane `in_flight` wide each would take 1/`in_flight`), while its
    partition's sum over the chains is what the lane takes at any width. GSI writes go to the
    indexes' own partitions and are left out."""
    out = []
    for target, record in items.items():
        here = (in_flight // models if target[1].startswith("MODEL#")
                else in_flight // batches if target[1].startswith("BATCH#") else in_flight)
        projected = record.projected_size(here)
        wcu = record.weight / succeeded * here / latency * _ceil_kb(projected)
        out.append((target, record, projected, wcu))
    return sorted(out, key=lambda row: -row[3])


def busiest_partition(hot: list[tuple[tuple[str, str, str], ItemWrites, int, float]]) -> tuple[tuple[str, str], float]:
    by_partition: dict[tuple[str, str], float] = {}
    for (t, pk, _), _, _, wcu in hot:
        by_partition[(t, pk)] = by_partition.get((t, pk), 0.0) + wcu
    return max(by_partition.items(), key=lambda item: item[1])


def _ceil_kb(size: int) -> int:
    return max(1, math.ceil(size / 1024))


if __name__ == "__main__":
    main()
