"""The client's file flow against the service on moto (the API handler through API Gateway's and
Lambda's limits, the harness's): an input file uploaded by files.create or, past 4 MiB, by an
upload in 4 MiB parts, then a batch created from it, checked by its job and run."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest
import requests
from freeinference_batch_client import client as client_module
from freeinference_batch_client.client import BatchClient

from tests.client.helpers import response
from tests.conftest import sample_request
from tests.service.batches.file_batch_helpers import line_of, run_file_batch_to_final


class HarnessSession:
    """A requests session whose calls go to the API handler on moto (harness.call)."""

    def __init__(self, harness) -> None:
        self.harness = harness
        self.paths: list[str] = []

    def request(self, method: str, url: str, params: Any = None, data: bytes | None = None,
                headers: dict | None = None, **_: Any) -> requests.Response:
        path = urlsplit(url).path + (f"?{urlencode(params)}" if params else "")
        self.paths.append(f"{method} {path}")
        lowered = {name.lower(): value for name, value in (headers or {}).items()}
        status, body = self.harness.call(method, path, raw=data or b"", headers=lowered, key=False)
        return response(status, body)


@pytest.fixture
def client(harness) -> BatchClient:
    return BatchClient(harness.key, "https://example.invalid/v1", session=HarnessSession(harness))  # type: ignore[arg-type]


@pytest.mark.parametrize("big", [False, True])
def test_an_input_file_uploaded_then_a_batch_created_from_it_runs(harness, client, monkeypatch, big):
    lines = [line_of(sample_request(f"q-{i}", f"Say {i}.")) for i in range(3)]
    if big:  # past files.create's limit: an upload in parts (made small here so that a test stays quick)
        monkeypatch.setattr(client_module, "FILE_CREATE_MAX_BYTES", 100)
        monkeypatch.setattr(client_module, "UPLOAD_PART_BYTES", 150)
    content = b"\n".join(lines) + b"\n"
    file_id = client.upload_file(content, "in.jsonl")
    paths = client.session.paths  # type: ignore[attr-defined]
    if big:
        assert paths[0] == "POST /v1/uploads" and paths[-1].endswith("/complete")
        assert sum(p.endswith("/parts") for p in paths) == -(-len(content) // 150)
    else:
        assert paths == ["POST /v1/files"]
    batch = client.create_from_file(file_id, metadata={"job": "j-1"}, idempotency_key="k-1")
    assert batch.status == "validating" and batch.input_file_id == file_id and batch.metadata == {"job": "j-1"}
    assert client.create_from_file(file_id, metadata={"job": "j-1"}, idempotency_key="k-1").id == batch.id
    final = run_file_batch_to_final(harness, batch.id)
    assert final["status"] == "completed" and final["request_counts"]["total"] == 3
    assert [json.loads(line)["custom_id"] for line in lines] == [r["custom_id"] for r in harness.results(batch.id)]
