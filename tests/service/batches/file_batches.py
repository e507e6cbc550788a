"""What the tests of a file batch's output and error files share: a batch made a file batch (its
META given an `input_file_id`, as create from a file writes it), the batch jobs queue pumped
through its function's handler, and the files' content read back."""

from __future__ import annotations

import json

from freeinference_batch.core import aws
from freeinference_batch.store import files
from freeinference_batch.store.batch_keys import meta_key
from freeinference_batch_local.handlers import LambdaContext, load_handler
from freeinference_batch_local.triggers.sqs import failed_message_ids, sqs_record

FINAL = ("completed", "failed", "expired", "cancelled")
NOT_RUN = {"cancelled": {"code": "batch_cancelled", "message": "Not run: the batch was cancelled"}}


def create_file_batch(harness, requests: list[dict]) -> str:
    """A batch of `requests` that reads as created from a file whose check has passed: the inline
    create, then the field a create from a file writes (for tests of how such a batch ends, without
    a file and its check: tests/service/batches/test_file_batches.py has those)."""
    batch = harness.create(requests)
    aws.dynamodb().update_item(TableName=harness.settings.batch_table_name, Key=meta_key(batch["id"]),
                               UpdateExpression="SET input_file_id = :f",
                               ExpressionAttributeValues={":f": {"S": "file-00000000000000input"}})
    return batch["id"]


def pump_jobs(harness, seconds: float = 900) -> tuple[int, int]:
    """One jobs-function invocation per message the batch jobs queue holds, until it is empty (as
    Lambda's poller, BatchSize 1): (steps run, steps failed). A failed step's message is made
    visible again at once (the function hides it for its backoff, job_steps.retry_later)."""
    handler = load_handler("batch_jobs")
    sqs, url = aws.sqs(), harness.settings.batch_jobs_queue_url
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    for ran in range(100):
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, AttributeNames=["All"]).get("Messages", [])
        if not messages:
            return ran, 0
        record = sqs_record(messages[0], arn)
        answer = handler({"Records": [record]}, LambdaContext("batch_jobs", 1769, seconds))
        if failed_message_ids(answer, [record["messageId"]]):
            sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=messages[0]["ReceiptHandle"],
                                          VisibilityTimeout=0)
            return ran + 1, 1
        sqs.delete_message(QueueUrl=url, ReceiptHandle=messages[0]["ReceiptHandle"])
    raise AssertionError("the jobs queue never emptied")


def run_until_status(harness, batch_id: str, statuses: tuple[str, ...]) -> dict:
    harness.run_until(lambda: harness.batch(batch_id)["status"] in statuses)
    return harness.batch(batch_id)


def file_lines(harness, file_id: str | None) -> list[dict]:
    """A batch file's lines as JSON, read as the content route serves them (F's store)."""
    if file_id is None:
        return []
    record = files.get_file(harness.settings, "acct-1", file_id)
    assert record is not None, file_id
    return [json.loads(line) for line in files.iter_lines(harness.settings, record)]


def openai_error(status: str, error: dict) -> dict:
    """OpenAI's error-file fields for a results-page line: a failed request's HTTP error (a
    `status`) as a response with that status and an error body, any other as `error`."""
    if status != "failed" or error.get("status") is None:
        return {"response": None, "error": {"code": error["code"], "message": error["message"]}}
    body = {"error": {"message": error["message"], "type": error["code"], "param": None, "code": error["code"]}}
    return {"response": {"status_code": error["status"], "request_id": None, "body": body}, "error": None}


def expected_files(results: list[dict]) -> tuple[list[dict], list[dict]]:
    """The output and error files the results pages call for, line by line: OpenAI's shape."""
    output, error = [], []
    for r in results:
        if r["status"] == "completed":
            response = {k: r["response"][k] for k in ("status_code", "request_id", "body")}
            output.append({"id": r["id"], "custom_id": r["custom_id"], "response": response, "error": None})
        else:
            fields = openai_error(r["status"], r["error"] or NOT_RUN[r["status"]])
            error.append({"id": r["id"], "custom_id": r["custom_id"], **fields})
    return output, error
