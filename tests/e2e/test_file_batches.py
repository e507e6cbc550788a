"""A batch created from a file with OpenAI's own calls, unchanged, against the local stack: the
`validate` job checks it in the batch jobs function, then it runs; a bad file fails naming its
lines. Small on purpose (CI's time): the checks themselves are tested on moto."""

from __future__ import annotations

import json
import time

import openai
from conftest import StackProcess


def _line(custom_id: str, model: str = "glm-5.3-flash") -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": model, "messages": [{"role": "user", "content": "Say hi."}]}}).encode()


def _final(client: openai.OpenAI, batch_id: str, timeout: float = 60) -> openai.types.Batch:
    deadline = time.monotonic() + timeout
    while (batch := client.batches.retrieve(batch_id)).status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
    return batch


def test_the_openai_sdk_creates_a_batch_from_a_file_and_a_bad_file_fails_naming_its_lines(stack: StackProcess):
    client = openai.OpenAI(base_url=stack.base_url, api_key=stack.key, max_retries=0, timeout=60)
    good = client.files.create(file=("in.jsonl", b"\n".join(_line(f"q-{i}") for i in range(3)) + b"\n"),
                               purpose="batch")
    batch = client.batches.create(input_file_id=good.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "validating" and batch.input_file_id == good.id
    done = _final(client, batch.id)
    assert done.status == "completed" and done.request_counts.total == done.request_counts.completed == 3

    bad = client.files.create(file=("bad.jsonl", _line("q-0") + b"\n" + _line("q-1", "no-such-model") + b"\n"),
                              purpose="batch")
    failed = _final(client, client.batches.create(input_file_id=bad.id, endpoint="/v1/chat/completions",
                                                  completion_window="24h").id)
    assert failed.status == "failed" and failed.errors is not None
    assert [(e.line, e.code, e.message) for e in failed.errors.data] == [
        (2, "model_not_found", "custom_id 'q-1': Model 'no-such-model' not found")]
