"""Retrying a batch from the client and the CLI (issue 33): `client.retry`, `freeinference-batch
retry`, and `results --merged` following `retry_of` back to the first batch, each custom_id with
its latest outcome, a deleted ancestor said on stderr."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from click.testing import CliRunner
from freeinference_batch_client import retries
from freeinference_batch_client.cli import batches as batch_commands
from freeinference_batch_client.cli import main
from freeinference_batch_client.cli import results as result_commands
from freeinference_batch_client.client import BatchApiError, BatchClient

from tests.client.helpers import BATCH_ID, batch_json, error_json, make, response

ROOT, CHILD, GRANDCHILD = (f"batch_{n:032x}" for n in (1, 2, 3))


def result(custom_id: str, status: str, batch: str) -> dict:
    """A result line whose answer names the batch it came from."""
    number = int(batch[-4:], 16) * 100 + int(custom_id[2:])
    return {"id": f"batch_req_{number}", "custom_id": custom_id, "status": status,
            "response": {"status_code": 200, "request_id": f"req_{number}", "body": {"from": batch}}
            if status == "completed" else None,
            "error": None if status == "completed" else {"code": "rate_limited", "message": batch, "status": 429}}


class FakeApi:
    """A requests session answering GET /batches/{id} and GET /batches/{id}/results (paged by
    `limit` and `after`) from batches it holds; a batch it does not hold is a 404."""

    def __init__(self, batches: dict[str, tuple[dict, list[dict]]]) -> None:
        self.batches = batches
        self.calls: list[str] = []

    def request(self, method: str, url: str, params: dict | None = None, **_: Any) -> requests.Response:
        path = urlsplit(url).path.removeprefix("/v1/batches/")
        self.calls.append(f"{method} {path}")
        batch_id, _, rest = path.partition("/")
        if batch_id not in self.batches:
            return response(404, error_json(f"Batch '{batch_id}' not found", "batch_not_found", "not_found_error"))
        batch, lines = self.batches[batch_id]
        if not rest:
            return response(200, batch)
        ids = [line["id"] for line in lines]
        start = ids.index(params["after"]) + 1 if params and params.get("after") else 0
        data = lines[start:start + int((params or {}).get("limit") or 100)]
        return response(200, {"object": "list", "data": data, "has_more": start + len(data) < len(lines),
                              "first_id": data[0]["id"] if data else None,
                              "last_id": data[-1]["id"] if data else None})


def three_generations(api_batches: set[str] = frozenset({ROOT, CHILD, GRANDCHILD})) -> FakeApi:
    """q-0..q-5 submitted; q-1, q-3, q-4 failed and were retried; of those q-3 and q-4 failed again
    and were retried, and q-4 failed a third time."""
    everything = {
        ROOT: (batch_json("completed", id=ROOT),
               [result("q-0", "completed", ROOT), result("q-1", "failed", ROOT), result("q-2", "completed", ROOT),
                result("q-3", "failed", ROOT), result("q-4", "failed", ROOT), result("q-5", "completed", ROOT)]),
        CHILD: (batch_json("completed", id=CHILD, retry_of=ROOT),
                [result("q-1", "completed", CHILD), result("q-3", "failed", CHILD), result("q-4", "failed", CHILD)]),
        GRANDCHILD: (batch_json("completed", id=GRANDCHILD, retry_of=CHILD),
                     [result("q-3", "completed", GRANDCHILD), result("q-4", "failed", GRANDCHILD)]),
    }
    return FakeApi({batch_id: held for batch_id, held in everything.items() if batch_id in api_batches})


def client_of(api: FakeApi) -> BatchClient:
    client = BatchClient("hyi-test", "http://api.test/v1", session=api)  # type: ignore[arg-type]
    client._sleep = lambda _: None
    return client


# ---- the client -------------------------------------------------------------------------------


def test_retry_posts_the_statuses_and_metadata_with_an_idempotency_key_kept_across_its_retries():
    client, session, sleeps = make(response(503, error_json("busy", "service_unavailable", "server_error")),
                                   response(200, batch_json(retry_of=CHILD)))
    child = client.retry(CHILD, ["failed", "cancelled"], {"run": "2"})
    assert child.retry_of == CHILD and len(sleeps) == 1
    first, second = session.calls
    assert (first["method"], first["url"]) == ("POST", f"http://api.test/v1/batches/{CHILD}/retry")
    assert json.loads(first["data"]) == {"statuses": ["failed", "cancelled"], "metadata": {"run": "2"}}
    assert first["headers"]["Idempotency-Key"] == second["headers"]["Idempotency-Key"]
    assert first["headers"]["Content-Type"] == "application/json"


def test_retry_without_arguments_sends_an_empty_body_for_the_servers_defaults():
    client, session, _ = make(response(200, batch_json(retry_of=CHILD)))
    client.retry(CHILD, idempotency_key="mine")
    assert json.loads(session.calls[0]["data"]) == {} and session.calls[0]["headers"]["Idempotency-Key"] == "mine"


def test_a_refused_retry_is_raised_with_the_servers_code():
    client, _, _ = make(response(409, error_json(f"Batch {CHILD} is in_progress; only a finished batch ...",
                                                 "batch_not_final", "conflict_error")))
    with pytest.raises(BatchApiError) as raised:
        client.retry(CHILD)
    assert raised.value.status == 409 and raised.value.code == "batch_not_final"


def test_merged_results_are_the_first_batchs_order_with_each_latest_outcome():
    api = three_generations()
    chain = retries.lineage(client_of(api), GRANDCHILD)
    assert [b.id for b in chain.batches] == [GRANDCHILD, CHILD, ROOT] and chain.deleted is None
    merged = [(line.custom_id, line.status, (line.response.body if line.response else {"from": line.error.message}))
              for line in retries.merged_results(client_of(api), chain)]
    assert merged == [
        ("q-0", "completed", {"from": ROOT}), ("q-1", "completed", {"from": CHILD}),
        ("q-2", "completed", {"from": ROOT}), ("q-3", "completed", {"from": GRANDCHILD}),
        ("q-4", "failed", {"from": GRANDCHILD}), ("q-5", "completed", {"from": ROOT}),
    ]


def test_merging_pages_through_each_batch_side_by_side(monkeypatch):
    api = three_generations()
    client = client_of(api)
    pages_of = client.iter_results
    monkeypatch.setattr(client, "iter_results", lambda batch_id: pages_of(batch_id, page_size=1))
    merged = [line.custom_id for line in retries.merged_results(client, retries.lineage(client, GRANDCHILD))]
    assert merged == ["q-0", "q-1", "q-2", "q-3", "q-4", "q-5"]
    assert sum(call.endswith("/results") for call in api.calls) == 6 + 3 + 2


def test_a_deleted_ancestor_ends_the_chain_and_is_named():
    api = three_generations({CHILD, GRANDCHILD})
    chain = retries.lineage(client_of(api), GRANDCHILD)
    assert [b.id for b in chain.batches] == [GRANDCHILD, CHILD] and chain.deleted == ROOT
    merged = [(line.custom_id, line.status) for line in retries.merged_results(client_of(api), chain)]
    assert merged == [("q-1", "completed"), ("q-3", "completed"), ("q-4", "failed")]


# ---- the CLI ----------------------------------------------------------------------------------


@pytest.fixture
def cli(monkeypatch):
    """Runs `freeinference-batch ARGS` with its client on the given fake API."""

    def run(api: Any, *args: str):
        monkeypatch.setattr(batch_commands, "make_client", lambda: client_of(api))
        monkeypatch.setattr(result_commands, "make_client", lambda: client_of(api))
        return CliRunner().invoke(main, list(args))

    return run


def test_the_retry_command_prints_the_new_batch_and_how_to_merge_it(cli):
    _, session, _ = make(response(200, batch_json(retry_of=CHILD, request_counts={"total": 3, "completed": 0,
                                                                                  "failed": 0})))
    ran = cli(session, "retry", CHILD, "--status", "failed, expired,cancelled")
    assert ran.exit_code == 0, ran.output
    assert ran.stdout.split() == [BATCH_ID, "validating", "0", "completed,", "0", "failed,", "3", "total", "(retry",
                                  "of", f"{CHILD})"]
    assert f"freeinference-batch results {BATCH_ID} --merged" in ran.stderr
    assert json.loads(session.calls[0]["data"]) == {"statuses": ["failed", "expired", "cancelled"]}


def test_the_retry_command_refuses_an_unknown_status_before_calling(cli):
    _, session, _ = make()
    ran = cli(session, "retry", CHILD, "--status", "failed,queued")
    assert ran.exit_code == 2 and "not queued" in ran.stderr and session.calls == []


def test_the_retry_command_says_why_the_api_refused(cli):
    _, session, _ = make(response(400, error_json(f"Batch {CHILD} has no request that is failed or expired; there "
                                                  "is nothing to retry", "nothing_to_retry")))
    ran = cli(session, "retry", CHILD)
    assert ran.exit_code == 1
    assert "the API answered 400 (nothing_to_retry)" in ran.stderr and "nothing to retry" in ran.stderr


def test_results_merged_writes_each_custom_ids_latest_outcome(cli, tmp_path):
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    ran = cli(three_generations(), "results", GRANDCHILD, "--merged", "-o", str(out), "--errors", str(errors))
    assert ran.exit_code == 0, ran.output
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(line["custom_id"], line["response"]["body"]["from"]) for line in written] == [
        ("q-0", ROOT), ("q-1", CHILD), ("q-2", ROOT), ("q-3", GRANDCHILD), ("q-5", ROOT)]
    failed = [json.loads(line) for line in errors.read_text().splitlines()]
    assert [(line["custom_id"], line["response"]["status_code"], line["response"]["body"]["error"]["message"])
            for line in failed] == [("q-4", 429, GRANDCHILD)]
    assert f"merging 3 batches, newest first: {GRANDCHILD}, {CHILD}, {ROOT}" in ran.stderr


def test_results_merged_with_a_deleted_parent_merges_what_remains_and_says_so(cli, tmp_path):
    out = tmp_path / "out.jsonl"
    ran = cli(three_generations({CHILD, GRANDCHILD}), "results", GRANDCHILD, "--merged", "-o", str(out))
    assert ran.exit_code == 0, ran.output
    assert [json.loads(line)["custom_id"] for line in out.read_text().splitlines()] == ["q-1", "q-3", "q-4"]
    assert f"{ROOT}, which {CHILD} retries, no longer exists" in ran.stderr
    assert "merging what remains, 2 batches" in ran.stderr


def test_results_merged_refuses_a_manifest_and_an_unfinished_batch(cli, tmp_path):
    manifest = tmp_path / "job.manifest.json"
    manifest.write_text(json.dumps({"job_id": "job_1", "input": "in.jsonl", "input_sha256": "0", "base_url": "x",
                                    "requests": 1, "max_requests": 1, "max_body_bytes": 1, "parts": []}))
    ran = cli(three_generations(), "results", str(manifest), "--merged", "-o", str(tmp_path / "out.jsonl"))
    assert ran.exit_code == 1 and "--merged takes a batch id" in ran.stderr
    running = FakeApi({CHILD: (batch_json("in_progress", id=CHILD, retry_of=ROOT), [])})
    ran = cli(running, "results", CHILD, "--merged", "-o", str(tmp_path / "out.jsonl"))
    assert ran.exit_code == 1 and "not finished yet" in ran.stderr and not (tmp_path / "out.jsonl").exists()
