"""How far past its daily quota an account's batches run (issue 30), measured outside the service:
the simulated upstream records every answer it sent, and the answers' cost is what the service
was charged for.

Workload (the issue's): an account running 8 requests at once (4 chains on each packaged model),
calls of 0.5 s, a $0.01 quota, requests of about $0.001 each, 40 per model. A direct client with
8 requests in flight stops by the quota plus 8 requests ($0.018).

    flock /work/wt/heavy.lock .venv/bin/python bench/quota_overrun.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Client, StackProcess, dumps
from freeinference_batch.core.catalog import NANO_PER_USD, load_catalog
from freeinference_batch_local.upstream_sim import UpstreamSimulator

# Words of prompt that cost about $0.001 on each model (a word is a simulated token).
WORDS_FOR_A_THOUSANDTH = {"glm-5.3-flash": 10_000, "qwen3.6-35b": 5_000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quota-usd", type=float, default=0.01)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=40, help="requests per model")
    parser.add_argument("--latency", type=float, default=0.5)
    args = parser.parse_args()
    catalog = load_catalog()
    with UpstreamSimulator() as sim:
        stack = StackProcess({"UPSTREAM_BASE_URL": sim.base_url})
        try:
            output = stack.admin("create-key", "--account", "quota-bench", "--tier", "internal",
                                 "--daily-quota-usd", str(args.quota_usd), "--concurrency", str(args.concurrency))
            key = next(word for word in output.split() if word.startswith("hyi-"))
            client = Client(stack.base_url, key)
            for model, words in WORDS_FOR_A_THOUSANDTH.items():
                content = f"[sim:latency={args.latency}] " + "spend " * words
                requests = [{"custom_id": f"{model}-{i}", "body": {
                    "model": model, "messages": [{"role": "user", "content": content}]}} for i in range(args.requests)]
                client.create(dumps({"requests": requests}))
            # Until the upstream has answered nothing for 5 s (the batches paused, or done)
            last, quiet_since = -1, time.monotonic()
            while time.monotonic() - quiet_since < 5:
                time.sleep(0.25)
                if len(sim.answered) != last:
                    last, quiet_since = len(sim.answered), time.monotonic()
            costs = [catalog.models[model].cost_nano(prompt, completion) for _, model, prompt, completion
                     in list(sim.answered)]
        finally:
            stack.stop()
    quota = args.quota_usd
    answered = sum(costs) / NANO_PER_USD
    dearest = max(costs) / NANO_PER_USD
    print(f"answered {len(costs)} requests, ${answered:.4f} (quota ${quota:.4f}, dearest request ${dearest:.5f})")
    print(f"past the quota: ${max(0.0, answered - quota):.4f}, {max(0.0, answered - quota) / dearest:.1f} requests;"
          f" a direct client with {args.concurrency} in flight: at most ${args.concurrency * dearest:.4f}"
          f" ({args.concurrency} requests)")


if __name__ == "__main__":
    main()
