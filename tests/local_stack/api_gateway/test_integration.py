"""The local API Gateway's Lambda integration: requests become HTTP API payload 2.0 events, the
handler's answers become HTTP, within HTTP API's and Lambda's limits."""

from __future__ import annotations

import base64
import gzip
import json

from freeinference_batch_local.api_gateway.integration import (
    MAX_BODY_BYTES,
    build_event,
    http_response,
    invoke_integration,
    refuse_oversized_body,
)
from freeinference_batch_local.handlers import LAMBDA_INVOKE_PAYLOAD_BYTES, invoke_payload_bytes, repo_root

from tests.local_stack.api_gateway.recorder import Recorder

REPO = repo_root()


def test_event_has_the_payload_2_0_fields():
    # Given a GET with duplicate query parameters, duplicate headers and cookies
    event = build_event(
        method="GET",
        target="/v1/batches/batch_1/results?limit=5&after=batch_req_3&limit=7&q=a%20b",
        headers=[
            ("Host", "127.0.0.1:8080"),
            ("User-Agent", "pytest"),
            ("X-Thing", "one"),
            ("x-thing", "two"),
            ("Cookie", "a=1; b=2"),
        ],
        body=None,
        route_key="GET /v1/batches/{batch_id}/results",
        path_parameters={"batch_id": "batch_1"},
        source_ip="127.0.0.9",
        domain_name="127.0.0.1:8080",
        now=1_700_000_000.123,
    )
    # Then it is shaped as HTTP API sends it
    assert event["version"] == "2.0"
    assert event["routeKey"] == "GET /v1/batches/{batch_id}/results"
    assert event["rawPath"] == "/v1/batches/batch_1/results"
    assert event["rawQueryString"] == "limit=5&after=batch_req_3&limit=7&q=a%20b"
    assert event["queryStringParameters"] == {"limit": "5,7", "after": "batch_req_3", "q": "a b"}
    assert event["pathParameters"] == {"batch_id": "batch_1"}
    assert event["headers"]["x-thing"] == "one,two"
    assert event["headers"]["user-agent"] == "pytest"
    assert all(name == name.lower() for name in event["headers"])
    assert "cookie" not in event["headers"] and event["cookies"] == ["a=1", "b=2"]
    assert event["isBase64Encoded"] is False and "body" not in event
    context = event["requestContext"]
    assert context["http"] == {
        "method": "GET",
        "path": "/v1/batches/batch_1/results",
        "protocol": "HTTP/1.1",
        "sourceIp": "127.0.0.9",
        "userAgent": "pytest",
    }
    assert context["stage"] == "$default" and context["routeKey"] == event["routeKey"]
    assert context["timeEpoch"] == 1_700_000_000_123
    assert context["time"] == "14/Nov/2023:22:13:20 +0000"
    assert context["requestId"] and context["accountId"] and context["apiId"]
    assert context["domainName"] == "127.0.0.1:8080"


def test_event_matches_the_sample_event_keys():
    # The sample event in events/ was written from AWS's documentation: same keys, same nesting.
    sample = json.loads((REPO / "events" / "api-get-batch.json").read_text())
    event = build_event(
        method="GET",
        target="/v1/batches/batch_1",
        headers=[("Host", "h")],
        body=None,
        route_key="GET /v1/batches/{batch_id}",
        path_parameters={"batch_id": "batch_1"},
    )
    assert set(sample) - {"body"} <= set(event)
    assert set(sample["requestContext"]) <= set(event["requestContext"])
    assert set(sample["requestContext"]["http"]) == set(event["requestContext"]["http"])


def test_text_body_is_passed_as_text_and_binary_as_base64():
    text = build_event(
        method="POST", target="/v1/batches", headers=[], body='{"a": "é"}'.encode(), route_key="POST /v1/batches"
    )
    assert text["body"] == '{"a": "é"}' and text["isBase64Encoded"] is False

    compressed = gzip.compress(b'{"requests": []}')
    gzipped = build_event(
        method="POST",
        target="/v1/batches",
        headers=[("Content-Encoding", "gzip")],
        body=compressed,
        route_key="POST /v1/batches",
    )
    assert gzipped["isBase64Encoded"] is True
    assert base64.b64decode(gzipped["body"]) == compressed

    not_utf8 = build_event(
        method="POST", target="/v1/batches", headers=[], body=b"\xff\xfe\x00", route_key="POST /v1/batches"
    )
    assert not_utf8["isBase64Encoded"] is True and base64.b64decode(not_utf8["body"]) == b"\xff\xfe\x00"


def test_response_rules_of_payload_2_0():
    status, headers, body = http_response(
        {"statusCode": 201, "headers": {"content-type": "application/json", "x-a": "1"}, "body": '{"ok":true}'}
    )
    assert (status, body) == (201, b'{"ok":true}') and ("x-a", "1") in headers

    status, headers, body = http_response(
        {
            "statusCode": 200,
            "body": base64.b64encode(b"\x00\x01").decode(),
            "isBase64Encoded": True,
            "cookies": ["s=1; Path=/"],
        }
    )
    assert body == b"\x00\x01" and ("Set-Cookie", "s=1; Path=/") in headers

    # A dict without statusCode is the JSON body of a 200; a string is sent as-is.
    assert http_response({"hello": "world"}) == (200, [("Content-Type", "application/json")], b'{"hello": "world"}')
    assert http_response("plain")[2] == b"plain"


def test_the_gateway_limit_is_10_mb_of_body():
    assert refuse_oversized_body(MAX_BODY_BYTES) is None
    status, _, body = refuse_oversized_body(MAX_BODY_BYTES + 1)
    assert (status, json.loads(body)) == (413, {"message": "Request Entity Too Large"})


def test_an_event_is_measured_as_its_json_up_to_6_mb():
    # The event {"body": "aaa..."} serializes to its body plus 12 bytes of JSON around it.
    handler = Recorder()
    overhead = invoke_payload_bytes({"body": ""})
    just_under = {"body": "a" * (LAMBDA_INVOKE_PAYLOAD_BYTES - overhead)}
    just_over = {"body": "a" * (LAMBDA_INVOKE_PAYLOAD_BYTES - overhead + 1)}
    assert LAMBDA_INVOKE_PAYLOAD_BYTES == 6_291_456
    assert invoke_integration(handler, just_under, None)[0] == 200
    status, _, body = invoke_integration(handler, just_over, None)
    assert (status, json.loads(body)) == (413, {"message": "Request Entity Too Large"})
    assert len(handler.events) == 1


def test_a_response_over_6_mb_is_500_internal_server_error():
    # A response is measured as the Python runtime serializes it (json.dumps, ASCII-escaped).
    overhead = invoke_payload_bytes({"statusCode": 200, "body": ""})
    fits = LAMBDA_INVOKE_PAYLOAD_BYTES - overhead
    status, _, body = invoke_integration(Recorder({"statusCode": 200, "body": "a" * fits}), {}, None)
    assert status == 200 and len(body) == fits
    status, _, body = invoke_integration(Recorder({"statusCode": 200, "body": "a" * (fits + 1)}), {}, None)
    assert (status, json.loads(body)) == (500, {"message": "Internal Server Error"})
    # "é" is 6 bytes once escaped: what fits in UTF-8 may not fit as the runtime sends it
    status, _, _ = invoke_integration(Recorder({"statusCode": 200, "body": "é" * (fits // 2)}), {}, None)
    assert status == 500


def test_an_invalid_2_0_response_is_500():
    status, _, body = invoke_integration(Recorder({"statusCode": 999}), {}, None)
    assert (status, json.loads(body)) == (500, {"message": "Internal Server Error"})
