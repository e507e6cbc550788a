"""The user CLI (`freeinference-batch submit/status/list/cancel/delete/results`), run as a real
subprocess against the local stack: an OpenAI batch input file in, an OpenAI output file out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from freeinference_batch_client.cli import main

pytestmark = pytest.mark.e2e

CLI = [sys.executable, "-c", "from freeinference_batch_client.cli import main; main()"]
POLL = ["--poll-interval", "0.2"]


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


def run_cli(stack, key: str | None, *args: str, cwd: Path, check: bool = True, real: bool = False) -> Run:
    """`freeinference-batch ARGS` with the stack's base URL and `key`: in this process through
    click's CliRunner, or (`real=True`) as a subprocess exactly as a user runs it."""
    env = {"FREEINFERENCE_BASE_URL": stack.base_url, "FREEINFERENCE_API_KEY": key}
    if real:
        full = {name: value for name, value in os.environ.items() if not name.startswith(("FREEINFERENCE_", "AWS_"))}
        full.update({name: value for name, value in env.items() if value is not None})
        done = subprocess.run([*CLI, *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=120)
        result = Run(done.returncode, done.stdout, done.stderr)
    else:
        invoked = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
        result = Run(invoked.exit_code, invoked.stdout, invoked.stderr)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {result.returncode}\n--- stdout\n{result.stdout}\n"
                             f"--- stderr\n{result.stderr}")
    return result


@pytest.fixture(scope="module")
def key(stack) -> str:
    """One internal-tier account for this module's tests (each compares its own batches)."""
    return stack.create_key("e2e-cli", tier="internal")


def line(custom_id: str, content: str, model: str = "glm-5.3-flash", **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": content}], **body}}


def write_jsonl(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(text) for text in path.read_text().splitlines()]


def batch_ids(api) -> list[str]:
    answer = api.get("/batches", params={"limit": 100})
    assert answer.status_code == 200, answer.text
    return [batch["id"] for batch in answer.json()["data"]]


def test_an_invalid_line_is_named_and_nothing_is_created(stack, key, tmp_path):
    # Given a file whose third line uses an unknown model
    before = batch_ids(stack.api(key))
    path = write_jsonl(tmp_path / "job.jsonl", [
        line("a", "one"), line("b", "two"), line("c", "three", model="no-such-model"), line("d", "four"),
    ])
    # When it is submitted
    result = run_cli(stack, key, "submit", str(path), "--wait", cwd=tmp_path, check=False)
    # Then the CLI fails naming the line, and nothing was created or recorded
    assert result.returncode != 0
    assert "line 3 (custom_id 'c'): Model 'no-such-model' not found" in result.stderr
    assert "nothing was submitted" in result.stderr
    assert batch_ids(stack.api(key)) == before
    assert not (tmp_path / "job.jsonl.manifest.json").exists()


def test_a_missing_api_key_is_a_clear_error(stack, tmp_path):
    path = write_jsonl(tmp_path / "job.jsonl", [line("a", "one")])
    result = run_cli(stack, None, "submit", str(path), cwd=tmp_path, check=False, real=True)
    assert result.returncode != 0
    assert "FREEINFERENCE_API_KEY is not set" in result.stderr
    assert "Traceback" not in result.stderr


def test_submit_wait_then_results_gives_an_openai_output_file_in_order(stack, key, tmp_path):
    # Given an OpenAI batch input file over both models, one request of which will be refused upstream
    inputs = [line(f"q-{i}", f"Question number {i}", model="glm-5.3-flash" if i % 2 else "qwen3.6-35b")
              for i in range(6)]
    inputs[4] = line("q-4", "Refused [sim:status=400]")
    path = write_jsonl(tmp_path / "job.jsonl", inputs)
    # When it is submitted and waited for
    submitted = run_cli(stack, key, "submit", str(path), "--wait", "--metadata", "project=e2e", *POLL, cwd=tmp_path,
                        real=True)
    manifest_path = tmp_path / "job.jsonl.manifest.json"
    manifest = json.loads(manifest_path.read_text())
    [part] = manifest["parts"]
    assert (part["first_line"], part["last_line"], part["count"]) == (1, 6, 6)
    assert submitted.stdout.split() == [part["batch_id"]]
    assert "done: 5 completed, 1 failed, 6 total" in submitted.stderr
    batch = stack.api(key).batch(part["batch_id"])
    assert batch["status"] == "completed" and batch["metadata"]["project"] == "e2e"
    # And the results are written from the manifest
    out = tmp_path / "out.jsonl"
    run_cli(stack, key, "results", str(manifest_path), "-o", str(out), cwd=tmp_path, real=True)
    # Then there is one OpenAI-format line per input line, in order
    lines = read_jsonl(out)
    assert [x["custom_id"] for x in lines] == [x["custom_id"] for x in inputs]
    for number, output in enumerate(lines):
        assert list(output) == ["id", "custom_id", "response", "error"]
        assert output["id"].startswith("batch_req_")
        if number == 4:
            # refused by the model's API: OpenAI's form, the HTTP answer with the error as its body
            assert output["error"] is None and output["response"]["status_code"] == 400
            assert output["response"]["body"]["error"]["code"] == "invalid_request"
        else:
            assert output["error"] is None
            response = output["response"]
            assert set(response) == {"status_code", "request_id", "body"} and response["status_code"] == 200
            assert response["body"]["object"] == "chat.completion"
            assert response["body"]["model"] == inputs[number]["body"]["model"]
    # And with --errors the failed line goes to its own file, the rest stays in order
    ok, bad = tmp_path / "ok.jsonl", tmp_path / "bad.jsonl"
    run_cli(stack, key, "results", part["batch_id"], "-o", str(ok), "--errors", str(bad), cwd=tmp_path)
    assert [x["custom_id"] for x in read_jsonl(ok)] == ["q-0", "q-1", "q-2", "q-3", "q-5"]
    assert [x["custom_id"] for x in read_jsonl(bad)] == ["q-4"]


def test_one_command_from_input_file_to_output_file(stack, key, tmp_path):
    inputs = [line(f"r-{i}", f"Say {i}") for i in range(3)]
    path = write_jsonl(tmp_path / "in.jsonl", inputs)
    out = tmp_path / "out.jsonl"
    run_cli(stack, key, "submit", str(path), "-o", str(out), *POLL, cwd=tmp_path)
    assert [x["custom_id"] for x in read_jsonl(out)] == ["r-0", "r-1", "r-2"]
    assert all(x["response"]["status_code"] == 200 for x in read_jsonl(out))


def test_status_list_cancel_delete_by_id_and_manifest(stack, key, tmp_path):
    path = write_jsonl(tmp_path / "job.jsonl", [line("a", "one"), line("b", "two")])
    run_cli(stack, key, "submit", str(path), "--wait", *POLL, cwd=tmp_path)
    manifest = tmp_path / "job.jsonl.manifest.json"
    [batch_id] = json.loads(manifest.read_text())["parts"][0]["batch_id"].split()

    status = run_cli(stack, key, "status", str(manifest), cwd=tmp_path)
    assert status.stdout.split()[:2] == [batch_id, "completed"] and "2 completed, 0 failed, 2 total" in status.stdout
    as_json = json.loads(run_cli(stack, key, "status", batch_id, "--json", cwd=tmp_path).stdout)
    assert as_json["id"] == batch_id and as_json["request_counts"] == {"total": 2, "completed": 2, "failed": 0}

    listed = run_cli(stack, key, "list", "--limit", "1", cwd=tmp_path)  # newest first
    assert listed.stdout.split()[:2] == [batch_id, "completed"] and len(listed.stdout.splitlines()) == 1

    cancelled = run_cli(stack, key, "cancel", batch_id, cwd=tmp_path)  # finished: unchanged
    assert cancelled.stdout.split()[:2] == [batch_id, "completed"]

    deleted = run_cli(stack, key, "delete", str(manifest), cwd=tmp_path)
    assert deleted.stdout.split() == [batch_id, "deleted"]
    assert batch_id not in batch_ids(stack.api(key))
    again = run_cli(stack, key, "delete", str(manifest), cwd=tmp_path)  # idempotent for a job
    assert "already gone" in again.stdout

    missing = run_cli(stack, key, "status", batch_id, cwd=tmp_path, check=False)
    assert missing.returncode != 0 and "404" in missing.stderr and "not found" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_results_refuses_an_unfinished_batch(stack, key, tmp_path):
    path = write_jsonl(tmp_path / "job.jsonl", [line("slow", "wait [sim:latency=3]")])
    run_cli(stack, key, "submit", str(path), cwd=tmp_path)
    manifest = tmp_path / "job.jsonl.manifest.json"
    result = run_cli(stack, key, "results", str(manifest), "-o", str(tmp_path / "out.jsonl"), cwd=tmp_path,
                     check=False)
    assert result.returncode != 0 and "not finished yet" in result.stderr
    assert not (tmp_path / "out.jsonl").exists()
    # --wait waits for it instead
    run_cli(stack, key, "results", str(manifest), "-o", str(tmp_path / "out.jsonl"), "--wait", *POLL, cwd=tmp_path)
    assert [x["custom_id"] for x in read_jsonl(tmp_path / "out.jsonl")] == ["slow"]


def test_a_large_job_is_split_recorded_resumed_and_read_back_in_order(start_stack, tmp_path):
    # Given a stack that takes 3 requests per batch and 1 unfinished batch per account
    own = start_stack(tmp_path, BATCH_MAX_REQUESTS="3", BATCH_MAX_UNFINISHED="1")
    key = own.key
    inputs = [line(f"q-{i}", f"Item {i}" + (" [sim:latency=1.5]" if i == 0 else "")) for i in range(8)]
    lines = [*inputs[:4], "", *inputs[4:]]  # a blank line: skipped, but line numbers still count it
    path = write_jsonl(tmp_path / "big.jsonl", lines)
    manifest_path = tmp_path / "big.jsonl.manifest.json"

    # When it is submitted without waiting: the first batch is created, the second hits the limit
    first = run_cli(own, key, "submit", str(path), "--max-requests", "3", cwd=tmp_path, check=False)
    assert first.returncode != 0, first.stderr
    assert "too_many_unfinished_batches" in first.stderr and "run the same submit again" in first.stderr
    manifest = json.loads(manifest_path.read_text())
    assert [(p["first_line"], p["last_line"], p["count"]) for p in manifest["parts"]] == [
        (1, 3, 3), (4, 7, 3), (8, 9, 2),
    ]
    assert [bool(p["batch_id"]) for p in manifest["parts"]] == [True, False, False]

    # And the same submit is run again with --wait: it creates the rest as slots free up
    second = run_cli(own, key, "submit", str(path), "--max-requests", "3", "--wait", *POLL, cwd=tmp_path)
    assert "resuming the job (1 of 3 batches created before)" in second.stderr
    manifest = json.loads(manifest_path.read_text())
    ids = [p["batch_id"] for p in manifest["parts"]]
    assert all(ids) and len(set(ids)) == 3
    assert sorted(batch_ids(own.api())) == sorted(ids)
    for part, batch_id in zip(manifest["parts"], ids, strict=True):
        batch = own.api().batch(batch_id)
        assert batch["status"] == "completed"
        assert batch["request_counts"]["total"] == part["count"]
        assert batch["metadata"]["freeinference_part"] == f"{part['part'] + 1}/3"

    # Then a submit interrupted after a create but before the manifest was written finds that
    # batch again (by the job's metadata) instead of creating it twice
    manifest["parts"][2]["batch_id"] = None
    manifest_path.write_text(json.dumps(manifest))
    third = run_cli(own, key, "submit", str(path), "--max-requests", "3", cwd=tmp_path)
    assert f"found {ids[2]}" in third.stderr
    assert json.loads(manifest_path.read_text())["parts"][2]["batch_id"] == ids[2]
    assert sorted(batch_ids(own.api())) == sorted(ids)

    # And the results of the whole job come back in submission order across its batches
    out = tmp_path / "out.jsonl"
    run_cli(own, key, "results", str(manifest_path), "-o", str(out), cwd=tmp_path)
    written = read_jsonl(out)
    assert [x["custom_id"] for x in written] == [f"q-{i}" for i in range(8)]
    assert all(x["error"] is None and x["response"]["status_code"] == 200 for x in written)


def test_webhooks_add_list_test_delete_and_the_secret_is_printed_once(stack, key, tmp_path):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import openai

    got: list[tuple[bytes, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append((self.rfile.read(int(self.headers["Content-Length"])), dict(self.headers)))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/hook"
    try:
        added = run_cli(stack, key, "webhooks", "add", url, "--event-type", "batch.completed", cwd=tmp_path,
                        real=True)
        first, secret_line = added.stdout.splitlines()
        endpoint_id = first.split()[0]
        assert endpoint_id.startswith("we_") and url in first and "batch.completed" in first
        secret = secret_line.removeprefix("signing secret: ")
        assert secret.startswith("whsec_") and "shown only this once" in added.stderr

        # Listing shows the endpoint, never the secret again
        listed = run_cli(stack, key, "webhooks", "list", cwd=tmp_path)
        assert listed.stdout.split()[0] == endpoint_id and secret not in listed.stdout
        as_json = json.loads(run_cli(stack, key, "webhooks", "list", "--json", cwd=tmp_path).stdout)
        assert as_json["id"] == endpoint_id and "signing_secret" not in as_json

        # A test delivery reaches the receiver, signed with the secret add printed
        tested = run_cli(stack, key, "webhooks", "test", endpoint_id, cwd=tmp_path)
        assert tested.stdout.split()[:2] == [endpoint_id, "batch.completed"] and "answered 204" in tested.stdout
        (body, headers), = got
        event = openai.OpenAI(api_key="unused", webhook_secret=secret).webhooks.unwrap(body, headers)
        assert event.type == "batch.completed"

        deleted = run_cli(stack, key, "webhooks", "delete", endpoint_id, cwd=tmp_path)
        assert deleted.stdout.split() == [endpoint_id, "deleted"]
        assert run_cli(stack, key, "webhooks", "list", cwd=tmp_path).stdout == ""
        gone = run_cli(stack, key, "webhooks", "test", endpoint_id, cwd=tmp_path, check=False)
        assert gone.returncode == 1 and "404" in gone.stderr and "Traceback" not in gone.stderr
    finally:
        server.shutdown()
        server.server_close()
