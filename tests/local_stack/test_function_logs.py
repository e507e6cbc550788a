"""function_logs.FunctionLogs: the local stack's CloudWatch Logs (a file per function, metrics
forwarded, a readable terminal), without a stack."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from freeinference_batch_local.function_logs import FunctionLogs, InProcessOutput

NAMES = {"ApiFunction": "local-ApiFunction", "GlmFlashModel/WorkerFunction": "local-GlmFlashModel-WorkerFunction"}
EMF = {"_aws": {"Timestamp": 0, "CloudWatchMetrics": [{"Namespace": "N", "Dimensions": [["service"]],
                                                       "Metrics": [{"Name": "M", "Unit": "Count"}]}]},
       "service": "s", "M": [1.0]}


class Metrics:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def put(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def close(self) -> None:
        pass


def logs(tmp_path: Path, verbose: bool = False) -> tuple[FunctionLogs, io.StringIO, Metrics]:
    terminal = io.StringIO()
    out = FunctionLogs(tmp_path, terminal, verbose=verbose, function_names=NAMES)
    metrics = Metrics()
    out.metrics = metrics  # type: ignore[assignment]
    return out, terminal, metrics


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_function_gets_its_json_lines_and_the_terminal_a_line_per_change_and_error(tmp_path: Path) -> None:
    out, terminal, metrics = logs(tmp_path)
    created = {"level": "INFO", "message": "batch created", "batch_id": "b1", "batch_status": "validating",
               "requests": 3, "function_name": "local-ApiFunction"}
    out.write("ApiFunction", "stderr", json.dumps(created))
    out.write("ApiFunction", "stderr", "/x.py:1: UserWarning: something printed")  # not JSON: wrapped
    out.write("ApiFunction", "stdout", json.dumps(EMF))  # no function_name: given its own
    started = {"level": "INFO", "batch_id": "b1", "batch_status": "in_progress", "previous_batch_status": "validating"}
    out.write("GlmFlashModel/WorkerFunction", "stderr", json.dumps(started))
    out.write("GlmFlashModel/WorkerFunction", "stderr", json.dumps(started))  # a second chain's first claim
    error = {"level": "ERROR", "message": "request failed unexpectedly\nTraceback ...", "exception_name": "KeyError",
             "batch_id": "b1"}
    out.write("GlmFlashModel/WorkerFunction", "stderr", json.dumps(error))
    out.close()

    api = lines(tmp_path / "ApiFunction.jsonl")
    assert [record["function_name"] for record in api] == ["local-ApiFunction"] * 3
    assert api[1]["message"] == "/x.py:1: UserWarning: something printed" and api[1]["stream"] == "stderr"
    worker = lines(tmp_path / "GlmFlashModel.WorkerFunction.jsonl")
    assert {record["function_name"] for record in worker} == {"local-GlmFlashModel-WorkerFunction"}
    assert len(worker) == 3
    assert metrics.records == [EMF]
    shown = [line.split(" ", 1)[1] for line in terminal.getvalue().splitlines()]
    assert shown == [
        "b1: created, validating (3 requests)",
        "b1: validating → in_progress",
        "ERROR GlmFlashModel/WorkerFunction: request failed unexpectedly (KeyError) [batch_id=b1]"
        " (.local-stack/logs/GlmFlashModel.WorkerFunction.jsonl)",
    ]


def test_verbose_shows_every_line_as_written(tmp_path: Path) -> None:
    out, terminal, _ = logs(tmp_path, verbose=True)
    line = json.dumps({"level": "INFO", "message": "sweep schedule ran"})
    out.write("ApiFunction", "stderr", line)
    out.write("ApiFunction", "stdout", json.dumps(EMF))
    assert terminal.getvalue().splitlines() == [line, json.dumps(EMF)]


def test_in_process_lines_go_to_the_function_their_record_names(tmp_path: Path) -> None:
    # LocalStack(isolated_functions=False): the functions print their metrics to the stack's stdout
    out, _, metrics = logs(tmp_path)
    stdout = InProcessOutput(out, io.StringIO())
    record = {**EMF, "function_name": "local-GlmFlashModel-WorkerFunction"}
    text = json.dumps(record)
    stdout.write(text[:10])
    stdout.write(text[10:] + "\nplain text\n")
    out.close()
    assert metrics.records == [record]
    assert lines(tmp_path / "GlmFlashModel.WorkerFunction.jsonl") == [record]
    assert lines(tmp_path / "in-process.jsonl")[0]["message"] == "plain text"


def test_a_functions_file_rotates_past_its_cap_keeping_one_rotated_file(tmp_path: Path) -> None:
    # Given a 2 KB cap on each function's file
    out = FunctionLogs(tmp_path, io.StringIO(), function_names=NAMES, max_bytes=2048)
    # When a function writes 200 lines of about 100 bytes (20 KB), and another function one line
    for n in range(200):
        out.write("ApiFunction", "stdout", json.dumps({"level": "INFO", "message": f"line {n:03d}", "pad": "x" * 50}))
    out.write("GlmFlashModel/WorkerFunction", "stdout", json.dumps({"level": "INFO", "message": "alone"}))
    out.close()
    # Then the function has its file and one rotated file, each within the cap, and nothing else
    current, rotated = tmp_path / "ApiFunction.jsonl", tmp_path / "ApiFunction.jsonl.1"
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "ApiFunction.jsonl", "ApiFunction.jsonl.1", "GlmFlashModel.WorkerFunction.jsonl"]
    assert current.stat().st_size <= 2048 and rotated.stat().st_size <= 2048
    # And they hold the latest lines, in order, the rotated one just before the current one
    kept = [record["message"] for record in lines(rotated) + lines(current)]
    assert kept[-1] == "line 199" and kept == [f"line {n:03d}" for n in range(200 - len(kept), 200)]
    assert [record["message"] for record in lines(tmp_path / "GlmFlashModel.WorkerFunction.jsonl")] == ["alone"]
