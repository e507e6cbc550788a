"""The local API Gateway: HTTP requests become HTTP API payload 2.0 events, answers become HTTP."""

from __future__ import annotations

import base64
import gzip
import json
import socket
import threading
import time
from pathlib import Path

import pytest
import requests
from freeinference_batch_local.apigw import (
    INTEGRATION_TIMEOUT_SECONDS,
    LAMBDA_INVOKE_PAYLOAD_BYTES,
    MAX_BODY_BYTES,
    ApiGatewayServer,
    Route,
    build_event,
    http_response,
    invoke_integration,
    invoke_payload_bytes,
    refuse_oversized_body,
    routes_from_functions,
    select_route,
)
from freeinference_batch_local.handlers import functions_from_template
from freeinference_batch_local.template import load_template

REPO = Path(__file__).resolve().parents[2]


class Recorder:
    """A fake api handler: keeps the events and context it got, answers what it is told."""

    def __init__(self, answer=None):
        self.events: list[dict] = []
        self.contexts: list = []
        self.answer = answer if answer is not None else {"statusCode": 200, "body": "{}"}

    def __call__(self, event, context):
        self.events.append(event)
        self.contexts.append(context)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer(event) if callable(self.answer) else self.answer


def batch_routes(handler) -> list[Route]:
    return [
        Route("POST", "/v1/batches", handler),
        Route("GET", "/v1/batches", handler),
        Route("GET", "/v1/batches/{batch_id}", handler),
        Route("GET", "/v1/batches/{batch_id}/results", handler),
        Route("POST", "/v1/batches/{batch_id}/cancel", handler),
        Route("DELETE", "/v1/batches/{batch_id}", handler),
    ]


@pytest.fixture
def serve():
    servers = []

    def start(routes, **kwargs) -> str:
        server = ApiGatewayServer(routes, port=0, **kwargs)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


# ---------------------------------------------------------------- routes


def test_routes_come_from_the_template_http_api_events():
    # Given the template's functions
    functions = functions_from_template(load_template(REPO / "template.yaml"), REPO)
    # When the routes are read from their HttpApi events
    routes = routes_from_functions(functions.values())
    # Then every API route of the spec is there, with its route key
    keys = {route.route_key for route in routes}
    assert {
        "POST /v1/batches",
        "GET /v1/batches",
        "GET /v1/batches/{batch_id}",
        "GET /v1/batches/{batch_id}/results",
        "POST /v1/batches/{batch_id}/cancel",
        "DELETE /v1/batches/{batch_id}",
    } <= keys


def test_most_specific_route_wins_and_default_catches_the_rest():
    handler = Recorder()
    routes = [
        Route("ANY", "$default", handler),
        Route("ANY", "/v1/{proxy+}", handler),
        Route("GET", "/v1/batches/{batch_id}", handler),
        Route("ANY", "/v1/batches/{batch_id}", handler),
        Route("GET", "/v1/batches/special", handler),
    ]
    assert select_route(routes, "GET", "/v1/batches/special")[0].route_key == "GET /v1/batches/special"
    route, params = select_route(routes, "GET", "/v1/batches/b1")
    assert (route.route_key, params) == ("GET /v1/batches/{batch_id}", {"batch_id": "b1"})
    assert select_route(routes, "PUT", "/v1/batches/b1")[0].route_key == "ANY /v1/batches/{batch_id}"
    route, params = select_route(routes, "GET", "/v1/a/b/c")
    assert (route.route_key, params) == ("ANY /v1/{proxy+}", {"proxy": "a/b/c"})
    assert select_route(routes, "GET", "/elsewhere")[0].route_key == "$default"
    assert select_route(routes[2:], "GET", "/v1/batches/b1/extra") is None


# ---------------------------------------------------------------- events


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


# ---------------------------------------------------------------- responses


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


# ---------------------------------------------------------------- over HTTP


def test_http_request_reaches_the_handler_as_an_event(serve):
    # Given the emulator with a recording handler
    handler = Recorder(lambda event: {"statusCode": 202, "headers": {"x-route": event["routeKey"]}, "body": "ok"})
    base = serve(batch_routes(handler))
    # When a client cancels a batch
    answer = requests.post(f"{base}/v1/batches/batch_9/cancel?x=1", headers={"Authorization": "Bearer k"}, timeout=5)
    # Then the handler saw the payload 2.0 event and the client gets its answer
    assert answer.status_code == 202 and answer.text == "ok"
    assert answer.headers["x-route"] == "POST /v1/batches/{batch_id}/cancel"
    assert answer.headers["apigw-requestid"]
    event = handler.events[0]
    assert event["pathParameters"] == {"batch_id": "batch_9"}
    assert event["headers"]["authorization"] == "Bearer k"
    assert event["queryStringParameters"] == {"x": "1"}
    assert event["requestContext"]["http"]["method"] == "POST"
    context = handler.contexts[0]
    assert context.get_remaining_time_in_millis() > 0 and context.aws_request_id and context.function_name


def test_unmatched_route_is_404_not_found(serve):
    handler = Recorder()
    base = serve(batch_routes(handler))
    for method, path in [("GET", "/v2/batches"), ("PUT", "/v1/batches"), ("GET", "/v1/batches/a/b")]:
        answer = requests.request(method, base + path, timeout=5)
        assert answer.status_code == 404 and answer.json() == {"message": "Not Found"}
    assert handler.events == []


def test_handler_exception_is_500_internal_server_error(serve, caplog):
    base = serve(batch_routes(Recorder(RuntimeError("boom"))))
    answer = requests.get(f"{base}/v1/batches", timeout=5)
    assert answer.status_code == 500 and answer.json() == {"message": "Internal Server Error"}
    assert "boom" in caplog.text


def test_gzip_body_arrives_base64_encoded(serve):
    handler = Recorder()
    base = serve(batch_routes(handler))
    payload = gzip.compress(json.dumps({"requests": [{"custom_id": "a"}]}).encode())
    answer = requests.post(f"{base}/v1/batches", data=payload, headers={"Content-Encoding": "gzip"}, timeout=5)
    assert answer.status_code == 200
    event = handler.events[0]
    assert event["isBase64Encoded"] is True and base64.b64decode(event["body"]) == payload


def test_chunked_body_is_read(serve):
    handler = Recorder()
    base = serve(batch_routes(handler))
    answer = requests.post(f"{base}/v1/batches", data=iter([b'{"a":', b" 1}"]), timeout=5)
    assert answer.status_code == 200 and handler.events[0]["body"] == '{"a": 1}'


def test_body_over_the_limit_is_413_and_the_handler_never_runs(serve):
    handler = Recorder()
    base = serve(batch_routes(handler), max_body_bytes=1024)
    answer = requests.post(f"{base}/v1/batches", data=b"x" * 4096, timeout=5)
    assert answer.status_code == 413 and answer.json() == {"message": "Request Entity Too Large"}
    chunked = requests.post(f"{base}/v1/batches", data=iter([b"x" * 800, b"x" * 800]), timeout=5)
    assert chunked.status_code == 413
    assert handler.events == []
    # Up to the limit is fine.
    assert requests.post(f"{base}/v1/batches", data=b"x" * 1024, timeout=5).status_code == 200


def test_over_10_mb_is_refused_without_reading_the_body(serve):
    # Given the default limit (HTTP API's 10 MB) and a client that announces one byte more but
    # sends nothing
    handler = Recorder()
    base = serve(batch_routes(handler))
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(
            b"POST /v1/batches HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {MAX_BODY_BYTES + 1}\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        # Then the answer comes at once, before any body byte was sent
        head = connection.recv(4096).decode()
    assert MAX_BODY_BYTES == 10_485_760
    assert head.startswith("HTTP/1.1 413")
    assert head.endswith('{"message":"Request Entity Too Large"}')
    assert handler.events == []


def test_the_gateway_limit_is_10_mb_of_body():
    assert refuse_oversized_body(MAX_BODY_BYTES) is None
    status, _, body = refuse_oversized_body(MAX_BODY_BYTES + 1)
    assert (status, json.loads(body)) == (413, {"message": "Request Entity Too Large"})


def test_a_plain_7_mb_body_is_refused_as_lambda_refuses_the_invoke(serve):
    # Given a 7 MB create body: under HTTP API's 10 MB, over Lambda's 6 MB invoke payload
    handler = Recorder()
    base = serve(batch_routes(handler))
    body = json.dumps({"requests": ["x" * 1000] * 7000}).encode()
    assert 7_000_000 < len(body) < MAX_BODY_BYTES
    # When it is sent plain
    answer = requests.post(f"{base}/v1/batches", data=body, timeout=30)
    # Then it is a 413 and the handler never ran
    assert answer.status_code == 413 and answer.json() == {"message": "Request Entity Too Large"}
    assert handler.events == []
    # And the same body gzipped (base64 in the event, far under 6 MB) reaches the handler
    gzipped = requests.post(
        f"{base}/v1/batches", data=gzip.compress(body), headers={"Content-Encoding": "gzip"}, timeout=30
    )
    assert gzipped.status_code == 200
    assert gzip.decompress(base64.b64decode(handler.events[0]["body"])) == body


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


def test_a_response_over_6_mb_over_http_is_500(serve):
    base = serve(batch_routes(Recorder({"statusCode": 200, "body": "a" * LAMBDA_INVOKE_PAYLOAD_BYTES})))
    answer = requests.get(f"{base}/v1/batches", timeout=30)
    assert answer.status_code == 500 and answer.json() == {"message": "Internal Server Error"}


def test_a_handler_slower_than_the_integration_timeout_is_503(serve):
    # Given a gateway with a short integration timeout and a handler that waits to be released
    release = threading.Event()
    finished = threading.Event()

    def slow(event, context):
        release.wait(30)
        finished.set()
        return {"statusCode": 200, "body": "late"}

    base = serve(batch_routes(slow), integration_timeout_seconds=0.3)
    try:
        # When a client calls it
        started = time.monotonic()
        answer = requests.get(f"{base}/v1/batches", timeout=10)
        elapsed = time.monotonic() - started
        # Then the gateway answers 503 after the timeout, while the handler is still running
        assert answer.status_code == 503 and answer.json() == {"message": "Service Unavailable"}
        assert 0.3 <= elapsed < 5
        assert not finished.is_set()
    finally:
        release.set()
    # The handler ran on, as the Lambda invocation would
    assert finished.wait(5)


def test_the_integration_timeout_is_30_seconds_by_default():
    server = ApiGatewayServer([], port=0)
    try:
        assert server.integration_timeout_seconds == INTEGRATION_TIMEOUT_SECONDS == 30
        assert server.max_body_bytes == MAX_BODY_BYTES
    finally:
        server.server_close()


def test_an_invalid_2_0_response_is_500():
    status, _, body = invoke_integration(Recorder({"statusCode": 999}), {}, None)
    assert (status, json.loads(body)) == (500, {"message": "Internal Server Error"})


def test_overhead_for_a_5_mib_create_is_small(serve):
    # Given a handler that does nothing
    handler = Recorder(lambda event: {"statusCode": 200, "body": "{}"})
    base = serve(batch_routes(handler))
    body = json.dumps({"requests": ["x" * 1000] * (5 * 1024)}).encode()
    session = requests.Session()
    session.post(f"{base}/v1/batches", data=b"{}", timeout=5)  # connect
    # When a 5 MiB body (under Lambda's 6 MB once in the event) goes through the emulator
    started = time.perf_counter()
    answer = session.post(f"{base}/v1/batches", data=body, timeout=10)
    elapsed = time.perf_counter() - started
    # Then the emulation, limit checks included, costs well under a second
    assert answer.status_code == 200 and len(handler.events[-1]["body"]) == len(body)
    assert elapsed < 0.5, f"{elapsed:.3f} s for 5 MiB"


def test_keep_alive_connection_serves_several_requests(serve):
    handler = Recorder()
    base = serve(batch_routes(handler))
    session = requests.Session()
    started = time.perf_counter()
    for _ in range(20):
        assert session.get(f"{base}/v1/batches", timeout=5).status_code == 200
    # No Nagle/delayed-ACK stalls (40 ms each) on a kept-alive connection.
    assert time.perf_counter() - started < 0.5
