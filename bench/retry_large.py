"""How long a retry of a 50,000-request batch takes (issue 33), against the create of the same
batch in the same run (the baseline: a retry stores its child through create's writer).

The stack runs with its workers paused (bench/_stack_server.py --paused): the batch is created,
cancelled before any request starts, and retried with `statuses: ["cancelled"]`, so the child holds
all 50,000 requests, read back from the parent's input chunks and checked again. No request ran,
so the parent has no request items: the retry's query of its requests' statuses reads nothing
here, where a parent whose requests all ran would read 50,000 items (about 50 MB of DynamoDB
pages at 1 KB an item; not measured here).

    .venv/bin/python bench/retry_large.py [--requests 50000] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    data = c.dumps(c.batch_body(args.requests))
    creates, retries = [], []
    stack = c.StackProcess(paused=True, timeout=180.0)
    try:
        client = c.Client(stack.base_url, stack.key)
        for _ in range(args.runs):
            parent, seconds = client.create(data)
            creates.append(seconds)
            client.cancel(parent["id"])
            client.wait_final(parent["id"], timeout=120)
            started = time.perf_counter()
            child = client.call("POST", f"/batches/{parent['id']}/retry", data=json.dumps({"statuses": ["cancelled"]}),
                                headers={"Content-Type": "application/json"})
            retries.append(time.perf_counter() - started)
            assert child["request_counts"]["total"] == args.requests, child
            client.cancel(child["id"])
            client.wait_final(child["id"], timeout=120)
            for batch_id in (parent["id"], child["id"]):
                client.call("DELETE", f"/batches/{batch_id}")
    finally:
        stack.stop()
    create, retry = statistics.median(creates), statistics.median(retries)
    print("\n=== summary: retry_large ===")
    print(c.table([
        (f"create of {args.requests} requests (median of {args.runs})", f"{create:.2f} s", ""),
        (f"retry of its {args.requests} cancelled requests (median of {args.runs})", f"{retry:.2f} s",
         f"<= 29 s (the API's timeout) {c.verdict(retry <= 29)}"),
        ("retry / create", f"{retry / create:.2f}", ""),
    ], ("measure", "value", "target")))

if __name__ == "__main__":
    main()
