"""The local API Gateway: HTTP requests become HTTP API payload 2.0 events, answers become HTTP."""

from __future__ import annotations

import base64
import gzip
import json
import socket
import time
from pathlib import Path

import pytest
import requests
from freeinference_batch.local.apigw import (
    ApiGatewayServer,
    Route,
    build_event,
    http_response,
    routes_from_functions,
    select_route,
)
from freeinference_batch.local.handlers import functions_from_template
from freeinference_batch.local.template import load_template

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


def test_over_64_mib_is_refused_without_reading_the_body(serve):
    # Given the default limit (64 MiB) and a client that announces 65 MiB but sends nothing
    handler = Recorder()
    base = serve(batch_routes(handler))
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(
            b"POST /v1/batches HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {65 * 1024 * 1024}\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        # Then the answer comes at once, before any body byte was sent
        head = connection.recv(4096).decode()
    assert head.startswith("HTTP/1.1 413")
    assert handler.events == []


def test_32_mib_plain_body_is_accepted(serve):
    # The design's local limit is 32 MiB plain (API Gateway's 10 MB is not enforced locally).
    handler = Recorder(lambda event: {"statusCode": 200, "body": str(len(event["body"]))})
    base = serve(batch_routes(handler))
    answer = requests.post(f"{base}/v1/batches", data=b"a" * (32 * 1024 * 1024), timeout=30)
    assert answer.status_code == 200 and answer.text == str(32 * 1024 * 1024)


def test_overhead_for_a_10_mib_create_is_small(serve):
    # Given a handler that does nothing
    handler = Recorder(lambda event: {"statusCode": 200, "body": "{}"})
    base = serve(batch_routes(handler))
    body = json.dumps({"requests": ["x" * 1000] * (10 * 1024)}).encode()
    session = requests.Session()
    session.post(f"{base}/v1/batches", data=b"{}", timeout=5)  # connect
    # When a 10 MiB body goes through the emulator
    started = time.perf_counter()
    answer = session.post(f"{base}/v1/batches", data=body, timeout=10)
    elapsed = time.perf_counter() - started
    # Then the emulation costs well under a second
    assert answer.status_code == 200 and len(handler.events[-1]["body"]) == len(body)
    assert elapsed < 0.5, f"{elapsed:.3f} s for 10 MiB"


def test_keep_alive_connection_serves_several_requests(serve):
    handler = Recorder()
    base = serve(batch_routes(handler))
    session = requests.Session()
    started = time.perf_counter()
    for _ in range(20):
        assert session.get(f"{base}/v1/batches", timeout=5).status_code == 200
    # No Nagle/delayed-ACK stalls (40 ms each) on a kept-alive connection.
    assert time.perf_counter() - started < 0.5
