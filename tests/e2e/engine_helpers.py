"""What the engine's end-to-end tests share: request lines and batches submitted to a stack, waits
for a batch's status, and the cost its results should have (what the stack stored is read through
stored_state.py).

The stacks call a simulated upstream that runs in the test process (the `sim`, `engine` and
`own_stack` fixtures of conftest.py), so the tests read its counters directly: attempts per request
(`"<batch_id>:<position>"`, the worker's request id header) and the most chat requests it served at
once.
"""

from __future__ import annotations

import time
from typing import Any

# tests/e2e is not a package: pytest imports its conftest as the top-level module `conftest`.
from conftest import Api, wait_for
from freeinference_batch.core.catalog import load_catalog
from freeinference_batch_local.upstream_sim import UpstreamSimulator, prompt_tokens, reply_for

FLASH = "glm-5.3-flash"
QWEN = "qwen3.6-35b"
FINAL = ("completed", "failed", "expired", "cancelled")
CATALOG = load_catalog()
POLL = 0.25  # seconds between polls of the API


def item(custom_id: str, content: str = "Say hello.", model: str = FLASH, **body: Any) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": content}], **body},
    }


def submit(api: Api, items: list[dict]) -> dict:
    answer = api.create_batch(items)
    assert answer.status_code == 200, answer.text
    return answer.json()


def statuses(results: list[dict]) -> dict[str, int]:
    counted: dict[str, int] = {}
    for result in results:
        counted[result["status"]] = counted.get(result["status"], 0) + 1
    return counted


def expected_cost_nano(results: list[dict]) -> int:
    """What the completed results should have cost: their usage times the catalog's prices."""
    total = 0
    for result in results:
        if result["status"] != "completed":
            continue
        body = result["response"]["body"]
        usage = body["usage"]
        total += CATALOG.models[body["model"]].cost_nano(usage["prompt_tokens"], usage["completion_tokens"])
    return total


def predicted_cost_nano(content: str, model: str = FLASH) -> int:
    """The cost of one request before it runs (the simulator's replies are deterministic)."""
    messages = [{"role": "user", "content": content}]
    text, _ = reply_for(model, messages, None)
    return CATALOG.models[model].cost_nano(prompt_tokens(messages), len(text.split()))


def answered_cost_nano(sim: UpstreamSimulator, batch_ids: set[str], *, once: bool = False) -> tuple[int, int]:
    """(the cost of what the simulator answered these batches, the dearest answer): what the
    service was charged for, counted outside it. `once`: each request's first answer only (a run
    that died after its answer re-runs the request; the upstream charged both)."""
    answers = [answer for answer in list(sim.answered) if answer[0].split(":", 1)[0] in batch_ids]
    if once:
        answers = list({answer[0]: answer for answer in reversed(answers)}.values())
    costs = [CATALOG.models[model].cost_nano(prompt, completion) for _, model, prompt, completion in answers]
    return sum(costs), max(costs, default=0)


def attempts(sim: UpstreamSimulator, batch_id: str, position: int) -> int:
    return sim.attempts_by_request.get(f"{batch_id}:{position}", 0)


def wait_status(api: Api, batch_id: str, wanted: tuple[str, ...], timeout: float = 60.0) -> dict:
    """Poll the batch (not too often: the local moto server serializes every call) until its
    status is one of `wanted`."""
    last: dict = {}

    def reached() -> dict | None:
        nonlocal last
        last = api.batch(batch_id)
        return last if last["status"] in wanted else None

    try:
        return wait_for(reached, timeout=timeout, interval=POLL, message=f"batch {batch_id} in {wanted}")
    except AssertionError as error:
        raise AssertionError(f"{error}; last seen: {last}") from None


def wait_final(api: Api, batch_id: str, timeout: float = 60.0) -> dict:
    return wait_status(api, batch_id, FINAL, timeout)


def hold_for(seconds: float, invariant, message: str) -> None:
    """Assert `invariant()` stays true for `seconds` (polling): for things that must NOT happen."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert invariant(), message
        time.sleep(0.1)
