"""OpenAI batch files: reading and checking input JSONL, splitting into batches, the manifest,
output-file lines. No network."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from freeinference_batch.core.settings import Settings
from freeinference_batch_client import openai_files
from freeinference_batch_client.openai_files import InputFileError, InputRequest, Manifest, Part


def request(custom_id: str, model: str = "glm-5.3-flash", content: str = "hello", **extra) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": content}]},
        **extra,
    }


def write_jsonl(path: Path, lines: list) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def items_of(*raws: dict) -> list[InputRequest]:
    return openai_files.parse_lines(json.dumps(raw).encode() for raw in raws)


# ---- reading and checking ---------------------------------------------------------------


def test_reads_one_request_per_line_with_line_numbers_skipping_blank_lines(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", [request("a"), "", "   ", request("b")])
    items = openai_files.load_requests(path)
    assert [(item.line, item.raw["custom_id"]) for item in items] == [(1, "a"), (4, "b")]
    assert items[0].encoded == json.dumps(request("a"), separators=(",", ":")).encode()


def test_a_utf8_bom_on_the_first_line_is_accepted(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(request("a")).encode() + b"\n")
    assert [item.raw["custom_id"] for item in openai_files.load_requests(path)] == ["a"]


def test_lines_that_are_not_json_objects_are_named(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", [request("a"), "{nope", "[1, 2]", request("b")])
    with pytest.raises(InputFileError) as caught:
        openai_files.load_requests(path)
    assert len(caught.value.errors) == 2
    assert caught.value.errors[0].startswith("line 2: not valid JSON")
    assert caught.value.errors[1] == "line 3: each line must be a JSON object with custom_id and body"


def test_invalid_utf8_is_named(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(json.dumps(request("a")).encode() + b"\n" + b'{"custom_id": "\xff"}\n')
    with pytest.raises(InputFileError, match=r"line 2: not valid UTF-8"):
        openai_files.load_requests(path)


def test_an_empty_file_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(InputFileError, match="no requests"):
        openai_files.load_requests(path)


def test_the_servers_rules_apply_with_line_numbers_and_every_problem_is_reported(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", [
        request("a"),                                  # line 1: fine
        request("b", model="no-such-model"),           # line 2
        request("c", model="auto"),                    # line 3
        request("a"),                                  # line 4: repeats line 1
        {"custom_id": "d", "body": {"model": "glm-5.3-flash", "messages": []}},  # line 5
        request("e", method="GET"),                    # line 6
        {**request("f"), "body": {**request("f")["body"], "stream": True}},  # line 7
        "{broken",                                     # line 8
        request("g"),                                  # line 9: fine
    ])
    with pytest.raises(InputFileError) as caught:
        openai_files.load_requests(path)
    errors = caught.value.errors
    assert errors == [
        "line 2 (custom_id 'b'): Model 'no-such-model' not found",
        "line 3 (custom_id 'c'): Auto model 'auto' cannot be used in a batch; name a model ID",
        "line 4 (custom_id 'a'): custom_id 'a' repeats line 1; custom_id must be unique within the batch",
        "line 5 (custom_id 'd'): body.messages must be a non-empty array of messages",
        "line 6 (custom_id 'e'): method must be 'POST', the only method a batch accepts",
        "line 7 (custom_id 'f'): body.stream must not be true; batch requests do not stream",
        errors[6],
    ]
    assert errors[6].startswith("line 8: not valid JSON")


def test_custom_ids_must_be_unique_across_the_whole_file_not_only_within_one_batch():
    items = items_of(request("a"), request("b"), request("c"), request("a"))
    with pytest.raises(InputFileError, match=r"line 4 .*repeats line 1"):
        openai_files.check_requests(items)


def test_method_and_url_may_be_left_out():
    items = items_of({"custom_id": "a", "body": {"model": "qwen3.6-35b", "messages": [{"role": "user"}]}})
    openai_files.check_requests(items)


def test_error_reports_stop_after_a_bounded_number():
    items = items_of(*(request(f"r{i}", model="nope") for i in range(50)))
    with pytest.raises(InputFileError) as caught:
        openai_files.check_requests(items)
    assert len(caught.value.errors) == openai_files.MAX_REPORTED_ERRORS
    assert caught.value.more
    assert caught.value.errors[0].startswith("line 1 ")


def test_metadata_rules_are_the_servers():
    openai_files.check_metadata({"k": "v"})
    with pytest.raises(InputFileError, match="at most 16"):
        openai_files.check_metadata({f"k{i}": "v" for i in range(17)})
    with pytest.raises(InputFileError, match="longer than 512"):
        openai_files.check_metadata({"k": "v" * 513})


def test_job_metadata_adds_the_job_and_part_to_the_users():
    assert openai_files.job_metadata({"project": "x"}, "job_1", 0, 3) == {
        "project": "x", openai_files.JOB_KEY: "job_1", openai_files.PART_KEY: "1/3",
    }


# ---- splitting -------------------------------------------------------------------------


def test_a_parts_file_is_its_lines_as_read_each_newline_terminated():
    raws = [request("a"), request("b", content="é" * 10)]
    content = openai_files.file_content(items_of(*raws))
    assert [json.loads(line) for line in content.decode().splitlines()] == raws
    assert content.endswith(b"\n") and content.count(b"\n") == 2


def test_splits_by_request_count():
    items = items_of(*(request(f"r{i}") for i in range(7)))
    parts = openai_files.plan_parts(items, max_requests=3)
    assert [(p.start, p.count, p.first_line, p.last_line) for p in parts] == [(0, 3, 1, 3), (3, 3, 4, 6), (6, 1, 7, 7)]
    assert [p.part for p in parts] == [0, 1, 2]


def test_one_batch_when_everything_fits():
    items = items_of(*(request(f"r{i}") for i in range(5)))
    parts = openai_files.plan_parts(items)
    assert len(parts) == 1 and parts[0].count == 5


def test_splits_by_file_bytes_and_every_part_fits_the_limit():
    raws = [request(f"r{i}", content="x" * (50 + 37 * (i % 5))) for i in range(40)]
    items = items_of(*raws)
    limit = 1500
    parts = openai_files.plan_parts(items, max_requests=1000, max_file_bytes=limit)
    assert len(parts) > 1
    assert sum(p.count for p in parts) == 40
    assert [p.start for p in parts] == [sum(q.count for q in parts[:i]) for i in range(len(parts))]
    for number, part in enumerate(parts):
        assert len(openai_files.file_content(items[part.start : part.start + part.count])) <= limit
        if number + 1 < len(parts):  # greedy: the next request would not have fitted
            assert len(openai_files.file_content(items[part.start : part.start + part.count + 1])) > limit


def test_a_file_exactly_at_the_limit_fits():
    items = items_of(request("a"), request("b"))
    limit = len(openai_files.file_content(items))
    assert len(openai_files.plan_parts(items, max_file_bytes=limit)) == 1
    assert len(openai_files.plan_parts(items, max_file_bytes=limit - 1)) == 2


def test_a_job_past_the_inline_bodys_32_mib_is_one_batch_when_its_file_fits():
    padding = "x" * 1_000_000
    items = items_of(*(request(f"r{i}", content=padding) for i in range(40)))
    assert len(openai_files.file_content(items)) > Settings().batch_max_body_bytes
    assert len(openai_files.plan_parts(items)) == 1


def test_a_request_too_big_for_any_batch_is_named_by_its_line():
    items = items_of(request("a"), request("b", content="x" * 5000))
    with pytest.raises(InputFileError, match=r"^line 2: this request alone makes an input file"):
        openai_files.plan_parts(items, max_file_bytes=2000)


def test_line_ranges_follow_the_file_lines_when_blank_lines_are_skipped():
    encoded = [json.dumps(request(name)).encode() for name in "abc"]
    lines = [encoded[0], b"", encoded[1], encoded[2]]
    parts = openai_files.plan_parts(openai_files.parse_lines(lines), max_requests=2)
    assert [(p.first_line, p.last_line) for p in parts] == [(1, 3), (4, 4)]


# ---- the manifest ---------------------------------------------------------------------


def manifest(tmp_path: Path) -> Manifest:
    return Manifest(
        input=str(tmp_path / "in.jsonl"), input_sha256="0" * 64, base_url="http://x/v1", requests=3,
        max_requests=2, max_file_bytes=1000, metadata={"k": "v"},
        parts=[Part(part=0, start=0, count=2, first_line=1, last_line=2),
               Part(part=1, start=2, count=1, first_line=3, last_line=3)],
    )


def test_manifest_round_trips_and_is_written_atomically(tmp_path):
    job = manifest(tmp_path)
    path = tmp_path / "sub" / "job.manifest.json"
    job.save(path)
    assert not job.complete and job.batch_ids() == []
    job.parts[0].batch_id = "batch_" + "a" * 32
    job.save(path)
    loaded = Manifest.load(path)
    assert loaded == job
    assert loaded.batch_ids() == ["batch_" + "a" * 32]
    assert loaded.job_id.startswith("job_")
    assert sorted(p.name for p in path.parent.iterdir()) == ["job.manifest.json"]  # no temporary left
    assert openai_files.is_manifest_file(str(path))


def test_manifest_complete_once_every_part_has_an_id(tmp_path):
    job = manifest(tmp_path)
    for number, part in enumerate(job.parts):
        part.batch_id = f"batch_{number:032x}"
    assert job.complete


def test_is_manifest_file_tells_ids_and_other_files_apart(tmp_path):
    other = tmp_path / "other.json"
    other.write_text('{"a": 1}')
    assert not openai_files.is_manifest_file("batch_" + "a" * 32)
    assert not openai_files.is_manifest_file(str(other))
    assert not openai_files.is_manifest_file(str(tmp_path))


def test_default_manifest_path_sits_next_to_the_input():
    assert openai_files.default_manifest_path("data/job.jsonl") == Path("data/job.jsonl.manifest.json")


def test_file_sha256(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    assert openai_files.file_sha256(path) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


# ---- output lines ---------------------------------------------------------------------

BODY = {"id": "chatcmpl-1", "object": "chat.completion", "choices": []}


def result(status: str, **fields) -> dict:
    return {"id": "batch_req_7", "custom_id": "q-1", "status": status, "response": None, "error": None, **fields}


def test_output_line_of_a_completed_request_is_openais_format():
    line = openai_files.output_line(result(
        "completed", response={"status_code": 200, "request_id": "req_1", "body": BODY}))
    assert line == {
        "id": "batch_req_7",
        "custom_id": "q-1",
        "response": {"status_code": 200, "request_id": "req_1", "body": BODY},
        "error": None,
    }
    assert list(line) == ["id", "custom_id", "response", "error"]


def test_output_line_of_a_request_the_model_refused_is_its_http_answer_as_openai_writes_it():
    line = openai_files.output_line(result(
        "failed", error={"code": "invalid_request", "message": "bad", "status": 400}))
    assert line == {"id": "batch_req_7", "custom_id": "q-1", "error": None, "response": {
        "status_code": 400, "request_id": None,
        "body": {"error": {"message": "bad", "type": "invalid_request", "param": None, "code": "invalid_request"}}}}
    assert list(line) == ["id", "custom_id", "response", "error"]


@pytest.mark.parametrize(
    ("status", "error", "code"),
    [
        ("cancelled", None, "batch_cancelled"),
        ("expired", {"code": "batch_expired", "message": "Not run"}, "batch_expired"),
        ("failed", {"code": "batch_failed", "message": "Not run"}, "batch_failed"),
        ("queued", None, "not_finished"),
        ("running", {"code": "timeout", "message": "retrying"}, "timeout"),
    ],
)
def test_output_line_of_a_request_without_response_always_says_why(status, error, code):
    line = openai_files.output_line(result(status, error=error))
    assert line["response"] is None
    assert line["error"]["code"] == code and line["error"]["message"]


def test_split_outputs_sends_failures_to_the_errors_writer_when_given():
    results = [
        result("completed", response={"status_code": 200, "request_id": "r", "body": BODY}),
        result("failed", error={"code": "timeout", "message": "slow"}),
        result("cancelled"),
    ]
    ok, bad = [], []
    assert openai_files.split_outputs(results, ok.append, bad.append) == (1, 2)
    assert [line["error"] for line in ok] == [None]
    assert [line["error"]["code"] for line in bad] == ["timeout", "batch_cancelled"]
    everything = []
    assert openai_files.split_outputs(results, everything.append) == (1, 2)
    assert len(everything) == 3


# ---- the CLI's offline part: checking and planning without a network ---------------------


def test_submit_dry_run_checks_and_plans_without_a_key(tmp_path, monkeypatch):
    from click.testing import CliRunner
    from freeinference_batch_client.cli import main

    monkeypatch.delenv("FREEINFERENCE_API_KEY", raising=False)
    path = write_jsonl(tmp_path / "in.jsonl", [request(f"r{i}") for i in range(5)])
    result = CliRunner().invoke(main, ["submit", str(path), "--max-requests", "2", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"{path}: 5 requests, OK; 3 batches:",
        "  batch 1: lines 1-2 (2 requests)",
        "  batch 2: lines 3-4 (2 requests)",
        "  batch 3: line 5 (1 request)",
    ]
    assert not openai_files.default_manifest_path(path).exists()


def test_submit_reports_bad_lines_and_submits_nothing(tmp_path, monkeypatch):
    from click.testing import CliRunner
    from freeinference_batch_client.cli import main

    monkeypatch.setenv("FREEINFERENCE_API_KEY", "hyi-unused")
    monkeypatch.setenv("FREEINFERENCE_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens: no call is made
    path = write_jsonl(tmp_path / "in.jsonl", [request("a"), request("b", model="nope")])
    result = CliRunner().invoke(main, ["submit", str(path)])
    assert result.exit_code == 1
    assert "line 2 (custom_id 'b'): Model 'nope' not found" in result.stderr
    assert "nothing was submitted" in result.stderr
    assert not openai_files.default_manifest_path(path).exists()


def test_submit_refuses_metadata_that_leaves_no_room_for_the_jobs_keys(tmp_path):
    from click.testing import CliRunner
    from freeinference_batch_client.cli import main

    path = write_jsonl(tmp_path / "in.jsonl", [request("a")])
    pairs = [arg for i in range(15) for arg in ("--metadata", f"k{i}=v")]
    result = CliRunner().invoke(main, ["submit", str(path), "--dry-run", *pairs])
    assert result.exit_code == 2 and "at most 16" in result.stderr and "--metadata" in result.stderr


def test_a_manifest_of_an_earlier_client_split_by_body_bytes_still_loads(tmp_path):
    path = tmp_path / "old.manifest.json"
    path.write_text(json.dumps({"version": 1, "job_id": "job_1", "input": "in.jsonl", "input_sha256": "0" * 64,
                                "base_url": "http://x/v1", "created_at": 1.0, "requests": 1, "max_requests": 1,
                                "max_body_bytes": 33554432, "metadata": None,
                                "parts": [{"part": 0, "start": 0, "count": 1, "first_line": 1, "last_line": 1}]}))
    loaded = Manifest.load(path)
    assert loaded.max_file_bytes is None and [(p.start, p.count) for p in loaded.parts] == [(0, 1)]


def test_output_line_of_an_expired_request_keeps_its_last_attempts_error_as_an_error():
    # It ran once (a 429) and then its window closed: not an answer, so no response
    line = openai_files.output_line(result(
        "expired", error={"code": "rate_limited", "message": "slow down", "status": 429}))
    assert line == {"id": "batch_req_7", "custom_id": "q-1", "response": None,
                    "error": {"code": "rate_limited", "message": "slow down"}}
