"""The local API Gateway over HTTP: requests reach the handler as events, answers come back as
HTTP API gives them, bodies over its limits are refused before they are read."""

from __future__ import annotations

import base64
import gzip
import json
import socket
import threading
import time

import pytest
import requests
from freeinference_batch_local.api_gateway.integration import INTEGRATION_TIMEOUT_SECONDS, MAX_BODY_BYTES
from freeinference_batch_local.api_gateway.routes import Route
from freeinference_batch_local.api_gateway.server import ApiGatewayServer
from freeinference_batch_local.handlers import LAMBDA_INVOKE_PAYLOAD_BYTES

from tests.local_stack.api_gateway.recorder import Recorder


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
