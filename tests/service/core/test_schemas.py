"""The status enums: the strings the spec gives, stored as plain strings, shown as plain strings."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
import yaml
from freeinference_batch.core.schemas import (
    FINAL_STATUSES,
    BatchObject,
    BatchStatus,
    RequestCounts,
    RequestStatus,
    ResultLine,
    VisibleBatchStatus,
)
from freeinference_batch.store import dynamo
from pydantic import ValidationError

SPEC = yaml.safe_load((Path(__file__).resolve().parents[3] / "openapi.yaml").read_text())


def test_the_statuses_shown_are_the_specs():
    schemas = SPEC["components"]["schemas"]
    assert list(typing.get_args(VisibleBatchStatus)) == schemas["Batch"]["properties"]["status"]["enum"]
    assert list(RequestStatus) == schemas["ResultLine"]["properties"]["status"]["enum"]
    assert set(BatchStatus) - set(typing.get_args(VisibleBatchStatus)) == {BatchStatus.CREATING, BatchStatus.DELETED}


@pytest.mark.parametrize("status", [*BatchStatus, *RequestStatus])
def test_dynamodb_gets_plain_strings(status):
    for attr in (dynamo.to_attr(status), dynamo.values(status=status)[":status"],
                 dynamo.to_item({"status": status})["status"], dynamo.to_attr({"s": [status]})["M"]["s"]["L"][0]):
        assert attr == {"S": status.value}
        assert type(attr["S"]) is str


def test_plain_strings_read_back_match_the_members():
    assert "completed" in FINAL_STATUSES and "in_progress" not in FINAL_STATUSES
    assert {BatchStatus.CANCELLED: 1}["cancelled"] == 1
    assert f"{BatchStatus.EXPIRED}_at" == "expired_at"


def batch(status) -> BatchObject:
    return BatchObject(id="batch_x", completion_window="24h", status=status, created_at=1, expires_at=2,
                       request_counts=RequestCounts(total=0, completed=0, failed=0), cost_usd=0)


@pytest.mark.parametrize("status", typing.get_args(VisibleBatchStatus))
def test_the_batch_object_shows_the_plain_string(status):
    for given in (status, status.value):
        shown = batch(given)
        assert shown.model_dump(mode="json")["status"] == status.value
        assert type(shown.model_dump(mode="json")["status"]) is str
        assert json.loads(shown.model_dump_json())["status"] == status.value


@pytest.mark.parametrize("status", ["creating", "deleted"])
def test_the_batch_object_refuses_statuses_the_spec_does_not_give(status):
    # (`finalizing` is issue 32's extension, for batches created from a file only: test_output_files.py)
    with pytest.raises(ValidationError):
        batch(status)


@pytest.mark.parametrize("status", list(RequestStatus))
def test_the_result_line_shows_the_plain_string(status):
    for given in (status, status.value):
        shown = ResultLine(id="batch_req_1", custom_id="a", status=given).model_dump(mode="json")
        assert shown["status"] == status.value and type(shown["status"]) is str
