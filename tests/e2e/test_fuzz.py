"""Fuzzing the local stack from openapi.yaml with schemathesis (examples, coverage and fuzzing
phases; positive and negative data), bounded to 25 generated examples per operation.

For every generated request:
- no answer is a 5xx;
- every 4xx is the API's error body, with a non-empty `error.message`;
- the answer passes every check of schemathesis (status documented, content type, schema, headers;
  data the document calls invalid is refused, and data it calls valid is accepted), as
  `schemathesis.toml` configures them: where a refusal of valid data depends on state OpenAPI
  cannot express, that file says which, and a refused create is checked for exactly those reasons;
- a refused request (4xx) changes nothing: the fuzzing account's batches are the same before and
  after it (same ids; the same status, counts and metadata for those already finished).
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
OPENAPI = REPO / "openapi.yaml"
MAX_EXAMPLES = 25
# The repository's schemathesis configuration, as `schemathesis run openapi.yaml` from the repo
# root reads it, whatever directory pytest runs in.
CONFIG = REPO / "schemathesis.toml"
# Why a create that openapi.yaml calls valid may still be refused (schemathesis.toml): a model the
# key may not use, an input file the account does not have (issue 32's form), an Idempotency-Key
# that created another batch. Any other refusal is a bug.
STATEFUL_CREATE_REFUSALS = {400: ("model_not_found", "file_not_found"), 422: ("idempotency_key_reused",)}
# And a retry (schemathesis.toml): no request in the statuses asked for, a model gone since, a key
# that created another batch.
STATEFUL_RETRY_REFUSALS = {400: ("nothing_to_retry", "model_not_found"), 422: ("idempotency_key_reused",)}
# Likewise for the webhook routes (schemathesis.toml): a URL whose host does not resolve or
# resolves to an address we do not call, a sixth endpoint, a test delivery nobody answered.
STATEFUL_WEBHOOK_REFUSALS = {
    "createWebhookEndpoint": ("The webhook URL is refused: its host ", "too_many_webhook_endpoints"),
    "updateWebhookEndpoint": ("The webhook URL is refused: its host ",),
    "testWebhookEndpoint": ("webhook_test_failed",),
}


@pytest.fixture(scope="module")
def fuzz_key(stack) -> str:
    """An account of the fuzzer's own, so its batches are the only ones it can see or touch."""
    return stack.create_key("e2e-fuzz", tier="internal")


@pytest.fixture(scope="module")
def finished_batch(stack, fuzz_key) -> str:
    """A finished batch the fuzzer reads, pages and cancels (never deletes) by its real id."""
    api = stack.api(fuzz_key)
    answer = api.create_batch([
        {"custom_id": f"known-{i}", "body": {"model": "glm-5.3-flash", "messages": [{"role": "user", "content": "hi"}]}}
        for i in range(3)
    ])
    assert answer.status_code == 200, answer.text
    return api.wait_for_status(answer.json()["id"], {"completed"})["id"]


# Loaded at import (the pytest plugin makes one test per operation); the stack's base URL is only
# known once its fixture runs, so each call is given it.
schema = schemathesis.openapi.from_path(OPENAPI, config=SchemathesisConfig.from_path(CONFIG))
schema.config.generation.update(max_examples=MAX_EXAMPLES)
schema.config.phases.coverage.enabled = False
# The paging operations also get the coverage phase: limits at and past their bounds, odd `after`s,
# and the methods their paths do not declare (405 with Allow: `unsupported_method`).
paging = schemathesis.openapi.from_path(OPENAPI, config=SchemathesisConfig.from_path(CONFIG)).include(
    operation_id=["listBatches", "listBatchResults", "listWebhookEndpoints"])
paging.config.generation.update(max_examples=MAX_EXAMPLES)
paging.config.phases.fuzzing.enabled = False
paging.config.phases.examples.enabled = False
# The account's batches as last seen (None: look again). Only a 2xx may change them, so the state
# after one refused request is the state before the next.
_seen: dict[str, Any] = {}


def snapshot(base_url: str, key: str) -> dict[str, Any]:
    """The account's batches: id -> what must not change (for finished ones) or None."""
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {key}"
    seen: dict[str, Any] = {}
    after = None
    while True:
        answer = session.get(f"{base_url}/batches", params={"limit": 100, **({"after": after} if after else {})},
                             timeout=30)
        assert answer.status_code == 200, answer.text
        page = answer.json()
        for batch in page["data"]:
            final = batch["status"] in {"completed", "failed", "expired", "cancelled"}
            seen[batch["id"]] = (batch["status"], batch["request_counts"], batch["metadata"]) if final else None
        if not page["has_more"]:
            return seen
        after = page["last_id"]


def same_state(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Nothing was created or deleted, and no finished batch changed (unfinished ones move on their own)."""
    if set(before) != set(after):
        return False
    return all(after[batch_id] == state for batch_id, state in before.items() if state is not None)


def use_known_id(case: Any) -> bool:
    """Half the cases of the reading and cancelling operations aim at a real batch (chosen from the
    case itself, so a failing example replays the same way)."""
    if "batch_id" not in (case.path_parameters or {}) or case.method.upper() == "DELETE":
        return False
    return zlib.crc32(repr((case.query, case.path_parameters)).encode()) % 2 == 0


def fuzz_one(case: Any, base_url: str, key: str, finished_batch: str) -> None:
    if use_known_id(case):
        case.path_parameters["batch_id"] = finished_batch
    before = _seen.get(key) or snapshot(base_url, key)
    _seen.pop(key, None)
    response = case.call(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    where = f"{case.method} {case.formatted_path} query={case.query!r} -> {response.status_code}: {response.text[:300]}"

    assert response.status_code < 500, where
    if 400 <= response.status_code < 500:
        body = response.json()
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
        assert isinstance(message, str) and message.strip(), f"4xx without error.message: {where}"
        after = snapshot(base_url, key)
        assert same_state(before, after), f"a refused request changed state: {where}"
        _seen[key] = after
        if case.operation.definition.raw.get("operationId") == "createBatch" and case.meta is not None \
                and case.meta.generation.mode.is_positive and response.status_code in STATEFUL_CREATE_REFUSALS:
            assert body["error"]["code"] in STATEFUL_CREATE_REFUSALS[response.status_code], where
        operation_id = case.operation.definition.raw.get("operationId")
        if operation_id == "retryBatch" and case.meta is not None and case.meta.generation.mode.is_positive \
                and response.status_code in STATEFUL_RETRY_REFUSALS:
            assert body["error"]["code"] in STATEFUL_RETRY_REFUSALS[response.status_code], where
        if operation_id in STATEFUL_WEBHOOK_REFUSALS and case.meta is not None \
                and case.meta.generation.mode.is_positive and response.status_code == 400:
            reasons = STATEFUL_WEBHOOK_REFUSALS[operation_id]
            assert body["error"]["code"] in reasons or body["error"]["message"].startswith(reasons), where
    # Every check enabled in schemathesis.toml (all of them but those it turns off, with why).
    case.validate_response(response, transport_kwargs={"base_url": base_url})


HYPOTHESIS = settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
                      database=None, derandomize=True)


@schema.parametrize()
@HYPOTHESIS
def test_fuzz_no_5xx_clear_4xx_and_refusals_change_nothing(case, stack, fuzz_key, finished_batch):
    fuzz_one(case, stack.base_url, fuzz_key, finished_batch)


@paging.parametrize()
@HYPOTHESIS
def test_paging_parameters_at_and_past_their_bounds(case, stack, fuzz_key, finished_batch):
    fuzz_one(case, stack.base_url, fuzz_key, finished_batch)
