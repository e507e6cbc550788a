"""How long a batch's counts lag its finished requests when calls are long (issue 30), measured
outside the service: the simulated upstream runs in this process and the time each answer left it
is noted; the batch's `request_counts.completed` is polled over HTTP every 0.25 s. A request's lag
is the time from its answer to the first poll whose count includes it.

Workload: one account, a model granted one batch slot (a catalog written to a temp dir, so the
batch is one chain), a batch of a 1 s call followed by 90 s calls (`--calls`). The short first
call is the old count rule's worst case: a chain counted when a request settled 120 s after its
last count, so the first answer waited for two long calls.

    .venv/bin/python bench/count_lag.py                      # this checkout
    .venv/bin/python bench/count_lag.py --repo /path/to/old  # the stack from another checkout
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, Client, StackProcess, dumps
from freeinference_batch.core.catalog import load_catalog
from freeinference_batch_local.upstream_sim import UpstreamSimulator

MODEL = "glm-5.3-flash"


def _answer_times(sim: UpstreamSimulator, stop: threading.Event, into: list[float]) -> None:
    """The time each answer was recorded by the simulator, to 50 ms."""
    while not stop.is_set():
        now, seen = time.monotonic(), len(sim.answered)
        into.extend([now] * (seen - len(into)))
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", default="1,90,90,90", help="each request's call length in seconds, in order")
    parser.add_argument("--repo", type=Path, default=REPO, help="run the stack from this checkout")
    args = parser.parse_args()
    latencies = [float(x) for x in args.calls.split(",")]
    if args.repo.resolve() != REPO:
        # The stack and the admin CLI are subprocesses: both take the other checkout's packages.
        root = args.repo.resolve()
        paths = [root / "layers" / "batch_core", root / "clients", root / "local_stack"]
        os.environ.update(PYTHONPATH=os.pathsep.join(map(str, paths)), FREEINFERENCE_REPO_ROOT=str(root))
    catalog = json.loads(load_catalog().model_dump_json())
    catalog["models"][MODEL]["batch_concurrency"] = 1
    catalog_path = Path(tempfile.mkdtemp(prefix="fi-count-lag-")) / "catalog.json"
    catalog_path.write_text(json.dumps(catalog))
    answered: list[float] = []
    seen: list[float] = []  # the first poll at which the count reached each request
    stop = threading.Event()
    with UpstreamSimulator() as sim:
        stack = StackProcess({"UPSTREAM_BASE_URL": sim.base_url,
                              "FREEINFERENCE_REPO_ROOT": str(args.repo.resolve()),
                              "MODEL_CATALOG_PATH": str(catalog_path)})
        try:
            output = stack.admin("create-key", "--account", "count-lag", "--tier", "internal", "--concurrency", "1")
            key = next(word for word in output.split() if word.startswith("hyi-"))
            client = Client(stack.base_url, key)
            requests = [{"custom_id": f"call-{i}", "body": {"model": MODEL, "messages": [
                {"role": "user", "content": f"[sim:latency={latency}] how long is this call?"}]}}
                for i, latency in enumerate(latencies)]
            batch, _ = client.create(dumps({"requests": requests}))
            watcher = threading.Thread(target=_answer_times, args=(sim, stop, answered), daemon=True)
            watcher.start()
            deadline = time.monotonic() + sum(latencies) + 600
            while len(seen) < len(latencies) and time.monotonic() < deadline:
                counts = client.batch(batch["id"])["request_counts"]
                now = time.monotonic()
                seen.extend([now] * (counts["completed"] + counts["failed"] - len(seen)))
                time.sleep(0.25)
            stop.set()
            watcher.join()
        finally:
            stack.stop()
    print(f"stack from {args.repo}; calls {args.calls} s, one chain")
    lags = [count - answer for answer, count in zip(answered, seen, strict=False)]
    for i, lag in enumerate(lags):
        print(f"request {i} ({latencies[i]:g} s call): counted {lag:.1f} s after its answer")
    print(f"largest lag: {max(lags):.1f} s (bound: 120 s)")


if __name__ == "__main__":
    main()
