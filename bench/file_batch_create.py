"""Create a batch from a 50,000-line, ~200 MB input file and run its `validate` step, on moto in
this process: the step's wall time and its memory, against BatchJobsFunction's limits (900 s,
1769 MB: template.yaml).

The file is written as the Files API stores one (its object in the payload bucket, its item
through store/files.py); the create goes through `operations.create_batch` (OpenAI's form), the
step through `file_batches.validate`, as the jobs function calls it. Each line's body is random
text (barely compressible: the stored chunks are near the file's size). Printed:

- create: the API's part (META and the job), which reads nothing of the file;
- validate: the step's wall time (both passes: check, then store) and how many AWS calls it made;
- memory: the process's peak RSS (`resource`, which includes moto's copy of everything stored:
  the 200 MB file and the ~200 MB of chunks written), and with --trace the step's peak traced
  Python memory above what was allocated before it and still held after it (what moto keeps),
  i.e. the step's own working memory. --trace makes the run 2-3x slower.

    .venv/bin/python bench/file_batch_create.py [--requests 50000] [--line-bytes 4000] [--trace]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import string
import sys
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import _common as c  # noqa: E402


def line(index: int, size: int, rng: random.Random) -> bytes:
    head = f'{{"custom_id":"q-{index}","method":"POST","url":"/v1/chat/completions","body":{{"model":"glm-5.3-flash",' \
           '"max_tokens":50,"messages":[{"role":"user","content":"'
    tail = '"}]}}'
    words = " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9)))
                     for _ in range(max(1, (size - len(head) - len(tail)) // 6)))
    return (head + words[: max(1, size - len(head) - len(tail))] + tail).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--line-bytes", type=int, default=4_000)
    parser.add_argument("--trace", action="store_true", help="measure the step's own memory with tracemalloc")
    args = parser.parse_args()

    os.environ["POWERTOOLS_LOG_LEVEL"] = "WARNING"
    c.moto_environment()
    from freeinference_batch import accounts
    from freeinference_batch.batches import file_batches, operations
    from freeinference_batch.store import files, objects

    with c.moto_service() as settings:
        key = accounts.create_key(settings, "acct-bench", tier="internal", concurrency=16)
        principal = accounts.authenticate(settings, {"authorization": f"Bearer {key}"})

        rng = random.Random(32)
        content = b"".join(line(i, args.line_bytes, rng) + b"\n" for i in range(args.requests))
        now = time.time()
        record = files.FileRecord(id=files.new_file_id(now), account_id="acct-bench", purpose="batch",
                                  filename="bench.jsonl", bytes=len(content), created_at=int(now),
                                  expires_at=int(now) + 86400, status="processed", objects=[])
        # As an upload's parts are kept: objects of ~4 MiB read in order (a line may span two).
        part = 4 * 1024 * 1024
        keys = [f"files/{record.id}/part-{n:05d}" for n in range(-(-len(content) // part))]
        for n, object_key in enumerate(keys):
            objects.put(settings.payload_bucket_name, object_key, content[n * part:(n + 1) * part])
        record = record.model_copy(update={"objects": keys})
        files.create_input_file(settings, record, max_files=10, max_bytes=1 << 40)
        print(f"input: {args.requests:,} lines, {len(content) / 1e6:.1f} MB in {len(keys)} objects")
        del content

        body = (f'{{"input_file_id":"{record.id}","endpoint":"/v1/chat/completions",'
                '"completion_window":"24h"}').encode()
        started = time.perf_counter()
        batch = operations.create_batch(settings, principal, body, None).batch
        print(f"create: {time.perf_counter() - started:.3f} s, status {batch['status']}, "
              f"total {batch['request_counts']['total']}")

        calls = {"n": 0}
        from botocore.client import BaseClient
        make_api_call = BaseClient._make_api_call

        def counting(self, operation, params):
            calls["n"] += 1
            return make_api_call(self, operation, params)

        BaseClient._make_api_call = counting
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if args.trace:
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
        started = time.perf_counter()
        done = file_batches.validate(settings, batch["id"], time.monotonic() + 840)
        seconds = time.perf_counter() - started
        if args.trace:
            held, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        BaseClient._make_api_call = make_api_call
        rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

        meta = operations.BatchTable(settings).get_meta(batch["id"])
        assert done and meta is not None and meta.total == args.requests and not meta.unchecked, meta
        print(f"validate: {seconds:.1f} s for both passes ({args.requests / seconds:,.0f} lines/s), "
              f"{calls['n']} AWS calls, {len(meta.chunk_starts)} input chunks; limit 900 s (840 s for the step)")
        print(f"memory: peak RSS {rss_peak:.0f} MB (before the step {rss_before:.0f} MB; includes moto's "
              "copy of the file and of every chunk stored); limit 1769 MB")
        if args.trace:
            print(f"memory (tracemalloc): the step's peak {(peak - before) / 1e6:.0f} MB above what was held before "
                  f"it; {(held - before) / 1e6:.0f} MB still held after it (moto's stored chunks), so its own "
                  f"working memory peaked near {(peak - held) / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
