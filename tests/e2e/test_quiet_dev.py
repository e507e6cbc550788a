"""`make dev` is quiet: its start line, then a readable line per batch status change and per error;
each function's JSON log lines in `.local-stack/logs/<function>.jsonl`; `--verbose` (VERBOSE=1
make dev) brings the JSON back to the terminal."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from conftest import REPO, StackProcess, wait_for

MODEL = "glm-5.3-flash"
# A readable line: the time, then words (a batch's change, an error, the stack's own warning).
READABLE = re.compile(r"^\d\d:\d\d:\d\d \S")
FUNCTION_NAME_PREFIX = "freeinference-batch-local-"  # the local stack's names: <stack>-<logical id, / as ->


def request(custom_id: str, content: str) -> dict:
    return {"custom_id": custom_id, "body": {"model": MODEL, "messages": [{"role": "user", "content": content}]}}


def log_records(stack: StackProcess, file_name: str) -> list[dict]:
    path = stack.logs_dir / file_name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def ticks(stack: StackProcess, function: str) -> int:
    return sum(record.get("message") == f"{function} schedule ran"
               for record in log_records(stack, f"{function.capitalize()}Function.jsonl"))


def test_dev_prints_a_line_per_status_change_and_error_and_logs_json_per_function(start_stack, tmp_path: Path) -> None:
    # Given a quiet stack (as `make dev`), its schedules ticking every second
    stack = start_stack(tmp_path, BATCH_MAX_ATTEMPTS="2")
    api = stack.api()
    # When a small batch runs, one of its requests refused by the upstream (our credential: an error)
    created = api.create_batch([request("ok", "Hello"), request("refused", "Hello [sim:status=401]")])
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]
    final = api.wait_for_status(batch_id, "completed", timeout=60)
    assert final["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    wait_for(lambda: f"{batch_id}: in_progress → completed" in stack.terminal_text(), timeout=30,
             message="the batch's completion on the terminal")
    # (a few schedule ticks have run meanwhile: each used to print JSON and a Powertools warning)
    wait_for(lambda: ticks(stack, "sweep") >= 3 and ticks(stack, "purge") >= 3, timeout=30, message="schedule ticks")

    # Then the terminal shows one readable line per status change of the batch, in order
    terminal = stack.terminal_text()
    lines = [line for line in terminal.splitlines() if line.strip()]
    changes = [line.split(" ", 1)[1] for line in lines if batch_id in line and "ERROR" not in line]
    assert changes == [
        f"{batch_id}: created, validating (2 requests)",
        f"{batch_id}: validating → in_progress",
        f"{batch_id}: in_progress → completed",
    ], terminal
    # and a line per error: each refused attempt, one line each, naming its function and log file
    errors = [line for line in lines if " ERROR " in line]
    assert len(errors) == 2, terminal  # BATCH_MAX_ATTEMPTS=2
    assert all("GlmFlashModel/WorkerFunction: the upstream refused the service credential" in line
               and ".local-stack/logs/GlmFlashModel.WorkerFunction.jsonl" in line for line in errors), terminal
    # and nothing else: no JSON, no Powertools warning, no traceback; only lines a person reads
    assert all(READABLE.match(line) for line in lines), terminal
    assert "{" not in terminal and "No application metrics" not in terminal, terminal

    # And every function's log is JSON lines, each with that function's own name
    files = {path.name: path for path in stack.logs_dir.glob("*.jsonl")}
    assert {"ApiFunction.jsonl", "SweepFunction.jsonl", "PurgeFunction.jsonl", "ExpireFunction.jsonl",
            "GlmFlashModel.WorkerFunction.jsonl"} <= set(files), sorted(files)
    for name in files:
        records = log_records(stack, name)
        expected = FUNCTION_NAME_PREFIX + name.removesuffix(".jsonl").replace(".", "-")
        assert records and {record["function_name"] for record in records} == {expected}, (name, records[:3])
    # with the structured fields the terminal's lines come from
    api_records = log_records(stack, "ApiFunction.jsonl")
    created_record = next(record for record in api_records if record.get("batch_id") == batch_id)
    assert created_record["batch_status"] == "validating" and "previous_batch_status" not in created_record
    worker = log_records(stack, "GlmFlashModel.WorkerFunction.jsonl")
    assert [r["previous_batch_status"] for r in worker if r.get("batch_status") == "completed"] == ["in_progress"]
    assert not any("No application metrics" in record.get("message", "") for name in files
                   for record in log_records(stack, name))
    # and the stack's own log (its INFO lines, kept off the quiet terminal) is beside them
    assert "local stack ready" in (stack.logs_dir / "local-stack.log").read_text()

    # And stdout had the start line only
    assert stack.stop() == 0
    assert stack.first_line.startswith("FreeInference Batch local stack on ") and "dev key: hyi-" in stack.first_line
    assert stack.stdout_after_first_line == ""


def test_dev_verbose_brings_the_json_back_to_the_terminal(start_stack, tmp_path: Path) -> None:
    # Given `freeinference-batch dev --verbose`
    stack = start_stack(tmp_path, verbose=True)

    def json_ticks() -> list[dict]:
        records = [json.loads(line) for line in stack.terminal_text().splitlines() if line.startswith("{")]
        return [record for record in records if record.get("message") == "sweep schedule ran"]

    # Then the schedules' JSON log lines reach the terminal, as each function wrote it
    (tick, *_) = wait_for(json_ticks, timeout=30, message="a sweep tick's JSON line on the terminal")
    assert tick["function_name"] == FUNCTION_NAME_PREFIX + "SweepFunction"
    # and the logs are still written
    assert log_records(stack, "SweepFunction.jsonl")
    assert stack.stop() == 0 and stack.stdout_after_first_line == ""


def test_make_dev_passes_verbose_when_asked() -> None:
    def dev_command(*variables: str) -> str:
        # -n: print the commands only (the venv's target included), run nothing
        return subprocess.run(["make", "-n", "dev", *variables], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout

    assert "freeinference-batch dev --verbose" in dev_command("VERBOSE=1")
    assert "--verbose" not in dev_command()
