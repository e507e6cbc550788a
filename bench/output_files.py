"""Writing the output file of a finished 50,000-request batch created from a file (issue 32), on
moto in this process: how long the `write_files` job takes, in how many steps and parts, and its
peak memory, against the jobs function's MemorySize in template.yaml.

The batch is created through the API handler, every request then stored completed as the worker
stores one (answers of `--answer-bytes` of text, compressed in the request item), and the batch
made a file batch that ended (`lifecycle.end_with_files`). The job's steps run through
`job_steps.run_step` with the jobs function's deadline (900 s less its 60 s margin). Peak memory is
tracemalloc's peak over the steps: the service's allocations and moto's answers to its calls (an
over-estimate; moto's stored table, which is AWS's on a real stack, is left out by starting the
count after the batch is stored). Nothing here asserts.

    .venv/bin/python bench/output_files.py [--requests 50000] [--answer-bytes 1000]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _common as c


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--answer-bytes", type=int, default=1000)
    args = parser.parse_args()
    c.moto_environment()

    from freeinference_batch import accounts
    from freeinference_batch.batches import job_steps, lifecycle
    from freeinference_batch.core import aws
    from freeinference_batch.core.schemas import BatchStatus
    from freeinference_batch.store import batch_files
    from freeinference_batch.store.batch_keys import batch_pk, meta_key
    from freeinference_batch.store.batch_table import BatchTable
    from freeinference_batch.store.dynamo import batch_write, to_item
    from freeinference_batch_local.api_gateway.integration import build_event, invoke_integration
    from freeinference_batch_local.cloudformation.template import load_template
    from freeinference_batch_local.handlers import LambdaContext, load_handler

    template = load_template(c.REPO / "template.yaml")
    memory_mb = template["Resources"]["BatchJobsFunction"]["Properties"]["MemorySize"]
    with c.moto_service() as settings:
        key = accounts.create_key(settings, "acct-bench", tier="internal", concurrency=16)
        api = load_handler("api")

        body = gzip.compress(json.dumps(c.batch_body(args.requests)).encode())  # under Lambda's 6 MB event
        event = build_event(method="POST", target="/v1/batches", body=body, route_key="POST /v1/batches",
                            headers=[("content-type", "application/json"), ("content-encoding", "gzip"),
                                     ("authorization", f"Bearer {key}")])
        status, _, answer = invoke_integration(api, event, LambdaContext("api", 1769, 29))
        assert status == 200, answer[:300]
        batch_id = json.loads(answer)["id"]

        # Every request completed, stored as the worker stores it; then the batch ends (a file batch).
        table = BatchTable(settings)
        text = "x" * args.answer_bytes
        items = []
        for position in range(args.requests):
            response = {"status_code": 200, "request_id": f"req_{position}",
                        "body": {"id": f"chatcmpl-{position}", "object": "chat.completion",
                                 "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                              "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 30, "completion_tokens": 250, "total_tokens": 280}}}
            attributes = table.response_attributes(batch_id, position, "claim", response)
            items.append(to_item({"pk": batch_pk(batch_id), "sk": f"REQ#{position:09d}", "status": "completed",
                                  **attributes}))
        batch_write(settings.batch_table_name, puts=items)
        del items
        aws.dynamodb().update_item(
            TableName=settings.batch_table_name, Key=meta_key(batch_id),
            UpdateExpression="SET input_file_id = :f, completed = :n, #status = :in_progress",
            ExpressionAttributeNames={"#status": "status"},
            ExpressionAttributeValues={":f": {"S": "file-bench"}, ":n": {"N": str(args.requests)},
                                       ":in_progress": {"S": BatchStatus.IN_PROGRESS}})
        meta = table.get_meta(batch_id)
        assert lifecycle.try_finalize(settings, meta, time.time()) == BatchStatus.COMPLETED

        tracemalloc.start()
        started = time.perf_counter()
        steps, done = 0, False
        while not done:
            steps += 1
            done = job_steps.STEPS["write_files"](settings, batch_id, time.monotonic() + 840)
        seconds = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        final = table.get_meta(batch_id)
        progress = batch_files.get_progress(settings, batch_id)
        assert final.status == BatchStatus.COMPLETED and final.output_file_id, final
        size = progress.output.size
        parts = progress.output.next_part - 1 if progress.output.upload_id else 1
    part_mib = settings.batch_files_part_bytes / 2**20
    print("\n=== summary: output_files ===")
    print(c.table([
        (f"write_files of {args.requests} completed requests ({args.answer_bytes}-byte answers)",
         f"{seconds:.1f} s", "within one step's 840 s"),
        ("steps", str(steps), ""),
        ("output file", f"{size / 2**20:.1f} MiB in {parts} part(s) of {part_mib:.0f} MiB", ""),
        ("peak memory (tracemalloc: service + moto's answers)", f"{peak / 2**20:.0f} MiB",
         f"<= {memory_mb} MB (BatchJobsFunction) {c.verdict(peak / 1e6 <= memory_mb)}"),
    ], ("measure", "value", "target")))


if __name__ == "__main__":
    main()
