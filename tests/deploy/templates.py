"""The templates as the deploy tests read them: where they are, the API's routes, and what the
tests ask of the expanded template (a function's events of a kind, the models' workers, the
resource a `!GetAtt` names). The fixtures (`template`, `functions`) are in conftest.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "template.yaml"
MODEL_TEMPLATE = REPO / "model" / "template.yaml"  # one nested application of it per model
MONITORING_TEMPLATE = REPO / "monitoring" / "template.yaml"  # the stack's other alarms, one nested application
EVENTS = REPO / "events"

API_ROUTES = {
    ("POST", "/v1/batches"),
    ("GET", "/v1/batches"),
    ("GET", "/v1/batches/{batch_id}"),
    ("GET", "/v1/batches/{batch_id}/results"),
    ("POST", "/v1/batches/{batch_id}/cancel"),
    ("POST", "/v1/batches/{batch_id}/retry"),
    ("DELETE", "/v1/batches/{batch_id}"),
    # OpenAI's webhook-endpoint API (webhooks/endpoints.py), so the openai package's client.webhooks works.
    ("POST", "/v1/webhook_endpoints"),
    ("GET", "/v1/webhook_endpoints"),
    ("GET", "/v1/webhook_endpoints/{endpoint_id}"),
    ("POST", "/v1/webhook_endpoints/{endpoint_id}"),
    ("DELETE", "/v1/webhook_endpoints/{endpoint_id}"),
    ("POST", "/v1/webhook_endpoints/{endpoint_id}/rotate_secret"),
    ("POST", "/v1/webhook_endpoints/{endpoint_id}/test"),
    ("GET", "/v1/webhook_event_types"),
    # OpenAI's Files and Uploads APIs (files/), so the openai package's client.files and client.uploads work.
    ("POST", "/v1/files"),
    ("GET", "/v1/files"),
    ("GET", "/v1/files/{file_id}"),
    ("DELETE", "/v1/files/{file_id}"),
    ("GET", "/v1/files/{file_id}/content"),
    ("POST", "/v1/uploads"),
    ("POST", "/v1/uploads/{upload_id}/parts"),
    ("POST", "/v1/uploads/{upload_id}/complete"),
    ("POST", "/v1/uploads/{upload_id}/cancel"),
}
# An ANY route per path of the API: the methods a path does not declare reach the function,
# which answers 405 with Allow (api.py), not API Gateway's 404.
API_METHOD_REFUSALS = {("ANY", path) for path in {path for _, path in API_ROUTES}}
# The web console's files, on the same HTTP API (ConsoleFunction).
CONSOLE_ROUTES = {("GET", "/"), ("GET", "/console/{file+}")}


def events_of_type(properties: dict[str, Any], event_type: str) -> list[dict[str, Any]]:
    return [e["Properties"] for e in properties.get("Events", {}).values() if e["Type"] == event_type]


def worker_functions(functions: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The models' workers: the functions that run one model's queue (WORKER_MODEL). Other
    SQS-triggered functions (the webhook deliveries) are not workers."""
    return {logical_id: properties for logical_id, properties in functions.items()
            if "WORKER_MODEL" in (properties.get("Environment") or {}).get("Variables", {})}


def getatt_resource(value: Any) -> str:
    assert isinstance(value, dict) and "Fn::GetAtt" in value, f"expected !GetAtt <Queue>.Arn, got {value!r}"
    resource, attribute = value["Fn::GetAtt"]
    assert attribute == "Arn"
    return resource
