"""openapi.yaml held to the pydantic models the service answers with (schemas.py), without a
stack: the same objects, fields in the same order, each field present when the document says it
is required, the same JSON types (null where a field may be null), the same enums and constants.
The client's models name the same fields. (tests/e2e/test_openapi.py checks live answers too.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from freeinference_batch.core import schemas
from freeinference_batch.files import models as file_models
from freeinference_batch_client import client
from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[2]
SPEC: dict[str, Any] = yaml.safe_load((REPO / "openapi.yaml").read_text())
COMPONENTS = SPEC["components"]["schemas"]

# openapi.yaml's component -> the model the service builds it with.
PAIRS: dict[str, type[BaseModel]] = {
    "Batch": schemas.BatchObject,
    "BatchWaiting": schemas.Waiting,
    "RequestCounts": schemas.RequestCounts,
    "ResultLine": schemas.ResultLine,
    "ResultError": schemas.ResultError,
    "ResultResponse": schemas.ResultResponse,
    "BatchList": schemas.Page,
    "ResultList": schemas.Page,
    "DeletedBatch": schemas.DeletedBatch,
    "WebhookEndpoint": schemas.WebhookEndpoint,
    "WebhookEndpointWithSecret": schemas.WebhookEndpointWithSecret,
    "WebhookEndpointList": schemas.WebhookEndpointList,
    "DeletedWebhookEndpoint": schemas.DeletedWebhookEndpoint,
    "WebhookEndpointTestResult": schemas.WebhookEndpointTestResult,
    "WebhookEventTypeList": schemas.WebhookEventTypeList,
    "File": file_models.FileObject,
    "FileList": file_models.FileList,
    "DeletedFile": file_models.FileDeleted,
    "Upload": file_models.UploadObject,
    "UploadPart": file_models.UploadPartObject,
}
# openapi.yaml's request bodies -> the model the service parses them with (webhooks/endpoints.py,
# batches/retry.py). Event types and retry statuses are plain strings there, so that one outside
# the document's enum is refused naming it, not as a type error.
REQUESTS: dict[str, type[BaseModel]] = {
    "RetryBatchRequest": schemas.RetryBatchBody,
    "CreateWebhookEndpointRequest": schemas.WebhookCreateBody,
    "UpdateWebhookEndpointRequest": schemas.WebhookUpdateBody,
    "RotateWebhookSecretRequest": schemas.WebhookRotateSecretBody,
    "TestWebhookEndpointRequest": schemas.WebhookTestBody,
    "CreateUploadRequest": file_models.CreateUploadBody,
    "CompleteUploadRequest": file_models.CompleteUploadBody,
}
CLIENT: dict[str, type[BaseModel]] = {
    "Batch": client.Batch, "BatchWaiting": client.BatchWaiting, "RequestCounts": client.RequestCounts,
    "ResultLine": client.ResultLine, "ResultError": client.ResultError, "ResultResponse": client.ResultResponse,
    "BatchList": client.Page,
    "DeletedBatch": client.DeletedBatch,
    # The client's one model of an endpoint names the fields of the answer that has them all.
    "WebhookEndpointWithSecret": client.WebhookEndpoint, "DeletedWebhookEndpoint": client.DeletedWebhookEndpoint,
    "WebhookEndpointTestResult": client.WebhookTestResult,
}


def resolve(node: dict, root: dict) -> dict:
    while "$ref" in node:
        target: Any = root
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def json_types(node: dict, root: dict) -> frozenset[str]:
    """The JSON types a schema allows (an object for a reference to a model)."""
    node = resolve(node, root)
    if "anyOf" in node or "oneOf" in node:
        return frozenset().union(*(json_types(n, root) for n in node.get("anyOf", node.get("oneOf"))))
    if "const" in node:
        return frozenset({_type_of(node["const"])})
    if "enum" in node:
        return frozenset(_type_of(value) for value in node["enum"])
    kind = node.get("type")
    if kind is None:
        return frozenset({"any"})
    return frozenset({kind} if isinstance(kind, str) else kind)


def _type_of(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null",
            dict: "object", list: "array"}[type(value)]


def enum_of(node: dict, root: dict) -> set | None:
    node = resolve(node, root)
    for option in node.get("anyOf", [node]):
        option = resolve(option, root)
        if "enum" in option:
            return {value for value in option["enum"] if value is not None}
        if "const" in option:
            return {option["const"]}
    return None


def model_schema(model: type[BaseModel]) -> dict:
    return model.model_json_schema(mode="validation", ref_template="#/$defs/{model}")


@pytest.mark.parametrize("name", list(PAIRS))
def test_a_documented_object_has_the_models_fields_in_order(name):
    documented, model = COMPONENTS[name], PAIRS[name]
    assert list(documented["properties"]) == list(model.model_fields), name
    assert documented.get("additionalProperties") is False, f"{name}: the service answers no other field"


@pytest.mark.parametrize("name", list(PAIRS))
def test_a_documented_field_is_required_exactly_when_the_model_always_writes_it(name):
    documented, model = COMPONENTS[name], PAIRS[name]
    omitted = getattr(model, "OMITTED_WHEN_NONE", frozenset())
    always = [field for field in model.model_fields if field not in omitted]
    assert documented.get("required", []) == always, name


@pytest.mark.parametrize("name", list(PAIRS))
def test_a_documented_fields_types_are_the_models(name):
    documented, model = COMPONENTS[name], PAIRS[name]
    ours = model_schema(model)
    omitted = getattr(model, "OMITTED_WHEN_NONE", frozenset())
    for field, node in documented["properties"].items():
        expected = json_types(ours["properties"][field], ours)
        if field in omitted:
            expected -= {"null"}  # never written as null: left out instead
        if field == "data":
            continue  # a page's lines: Batch or ResultLine, checked as those components
        assert json_types(node, SPEC) == expected, f"{name}.{field}: {sorted(json_types(node, SPEC))} " \
                                                   f"documented, {sorted(expected)} answered"
        assert enum_of(node, SPEC) == enum_of(ours["properties"][field], ours), f"{name}.{field}: enum"


@pytest.mark.parametrize("name", list(CLIENT))
def test_the_clients_models_name_the_documented_fields(name):
    assert list(CLIENT[name].model_fields) == list(COMPONENTS[name]["properties"]), name


@pytest.mark.parametrize("name", list(REQUESTS))
def test_a_documented_request_body_is_the_model_the_service_parses_it_with(name):
    documented, model = COMPONENTS[name], REQUESTS[name]
    ours = model_schema(model)
    assert list(documented["properties"]) == list(model.model_fields), name
    assert documented.get("required", []) == ours.get("required", []), name
    # Unknown fields are refused (extra="forbid"), as additionalProperties: false says
    assert documented.get("additionalProperties") is False and ours.get("additionalProperties") is False, name
    for field, node in documented["properties"].items():
        assert json_types(node, SPEC) == json_types(ours["properties"][field], ours), f"{name}.{field}"


def test_a_model_leaves_out_only_what_it_says_it_leaves_out():
    # The omission the documents depend on is the serializer's, not a convention.
    error = schemas.ResultError(code="batch_failed", message="Not run")
    assert error.model_dump(mode="json") == {"code": "batch_failed", "message": "Not run"}
    linked = schemas.ResultResponse(status_code=200, request_id="req_1", body=None, body_url="https://x/y")
    assert linked.model_dump(mode="json") == {"status_code": 200, "request_id": "req_1", "body": None,
                                              "body_url": "https://x/y"}
    plain = schemas.ResultResponse(status_code=200, request_id="req_1", body={"id": "c"})
    assert plain.model_dump(mode="json") == {"status_code": 200, "request_id": "req_1", "body": {"id": "c"}}
