"""HTTP API's Lambda integration, payload 2.0: the event built from a request, the function
invoked, and its answer turned into HTTP.

What API Gateway does and this does too: lowercased comma-joined headers, cookies split out,
comma-joined duplicate query parameters, path parameters, binary bodies (here: compressed, multipart
or not UTF-8) passed as base64, `{"message":"Internal Server Error"}` when the handler fails, and the
2.0 response rules (a dict with `statusCode`, or any other value as a 200 JSON body).

It refuses what AWS refuses, as AWS answers it (see `invoke_integration`): a body over HTTP API's
10 MB is a 413 before the body is read; an event over Lambda's 6 MB invoke payload is a 413 and
the handler never runs; a handler response over 6 MB is a 500; a handler still running after
the 30 s integration timeout is a 503 (its thread runs on, as the Lambda would).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qsl, unquote

from freeinference_batch_local.handlers import LAMBDA_INVOKE_PAYLOAD_BYTES, LOCAL_ACCOUNT_ID, invoke_payload_bytes

log = logging.getLogger(__name__)

# HTTP API's payload quota: 10 MB, measured on the request body as received.
MAX_BODY_BYTES = 10 * 1024 * 1024
# HTTP API's integration timeout: at most 30 s (REST APIs: 29 s).
INTEGRATION_TIMEOUT_SECONDS = 30.0
API_ID = "local"
JSON_HEADER = ("Content-Type", "application/json")
_INTERNAL_ERROR = b'{"message":"Internal Server Error"}'
# HTTP API answers its own errors as {"message": <the status's reason phrase>}. For a body over
# 10 MB and for an event Lambda refuses as too large (Lambda's RequestEntityTooLargeException,
# HTTP 413) the status is 413; AWS's exact body for HTTP APIs is not documented (REST APIs were
# seen answering {"message": "Request Too Long"}), so this is the reason phrase, as for the others.
TOO_LARGE = b'{"message":"Request Entity Too Large"}'
# HTTP API answers an integration that outlives its timeout with 503 (REST APIs: 504).
_TIMED_OUT = b'{"message":"Service Unavailable"}'
_TEXT_ENCODINGS = {"", "identity"}


def build_event(
    *,
    method: str,
    target: str,
    headers: Iterable[tuple[str, str]],
    body: bytes | None,
    route_key: str,
    path_parameters: dict[str, str] | None = None,
    source_ip: str = "127.0.0.1",
    protocol: str = "HTTP/1.1",
    domain_name: str = "127.0.0.1",
    request_id: str | None = None,
    now: float | None = None,
) -> dict[str, Any]:
    """The HTTP API payload 2.0 event for one request (`target` is the request line's path?query)."""
    raw_path, _, raw_query = target.partition("?")
    now = time.time() if now is None else now
    joined: dict[str, str] = {}
    cookies: list[str] = []
    for name, value in headers:
        name = name.lower()
        if name == "cookie":
            cookies.extend(part.strip() for part in value.split(";") if part.strip())
            continue
        joined[name] = f"{joined[name]},{value}" if name in joined else value
    joined.setdefault("x-forwarded-for", source_ip)
    joined.setdefault("x-forwarded-proto", "http")
    joined.setdefault("x-amzn-trace-id", f"Root=1-{int(now):08x}-{uuid.uuid4().hex[:24]}")
    request_id = request_id or base64.b64encode(uuid.uuid4().bytes[:11]).decode().rstrip("=") + "="
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": route_key,
        "rawPath": raw_path,
        "rawQueryString": raw_query,
    }
    if cookies:
        event["cookies"] = cookies
    event["headers"] = joined
    if raw_query:
        query: dict[str, str] = {}
        for name, value in parse_qsl(raw_query, keep_blank_values=True):
            query[name] = f"{query[name]},{value}" if name in query else value
        event["queryStringParameters"] = query
    event["requestContext"] = {
        "accountId": LOCAL_ACCOUNT_ID,
        "apiId": API_ID,
        "domainName": domain_name,
        "domainPrefix": domain_name.split(".")[0].split(":")[0],
        "http": {
            "method": method,
            "path": unquote(raw_path),
            "protocol": protocol,
            "sourceIp": source_ip,
            "userAgent": joined.get("user-agent", ""),
        },
        "requestId": request_id,
        "routeKey": route_key,
        "stage": "$default",
        "time": dt.datetime.fromtimestamp(now, dt.UTC).strftime("%d/%b/%Y:%H:%M:%S +0000"),
        "timeEpoch": int(now * 1000),
    }
    if path_parameters:
        event["pathParameters"] = path_parameters
    if body:
        # A multipart form (a file upload) is binary to API Gateway whatever it holds: base64,
        # a third bigger inside the 6 MB event.
        if (joined.get("content-encoding", "").strip().lower() not in _TEXT_ENCODINGS
                or joined.get("content-type", "").strip().lower().startswith("multipart/")):
            event["body"], event["isBase64Encoded"] = base64.b64encode(body).decode("ascii"), True
        else:
            try:
                event["body"], event["isBase64Encoded"] = body.decode("utf-8"), False
            except UnicodeDecodeError:
                event["body"], event["isBase64Encoded"] = base64.b64encode(body).decode("ascii"), True
    else:
        event["isBase64Encoded"] = False
    return event


def http_response(result: Any) -> tuple[int, list[tuple[str, str]], bytes]:
    """A handler's return value as API Gateway (payload 2.0) answers it: status, headers, body."""
    if isinstance(result, dict) and "statusCode" in result:
        status = int(result["statusCode"])
        if not 100 <= status <= 599:
            raise ValueError(f"statusCode {status} out of range")
        headers = [(str(name), _header_value(value)) for name, value in (result.get("headers") or {}).items()]
        headers += [("Set-Cookie", str(cookie)) for cookie in result.get("cookies") or ()]
        body = result.get("body")
        if body is None:
            payload = b""
        elif result.get("isBase64Encoded"):
            payload = base64.b64decode(body, validate=False)
        elif isinstance(body, str):
            payload = body.encode("utf-8")
        else:
            payload = json.dumps(body).encode("utf-8")
        return status, headers, payload
    # Any other value is a 200 whose body is that value as JSON (a string is sent as-is).
    payload = (result if isinstance(result, str) else json.dumps(result)).encode("utf-8")
    return 200, [("Content-Type", "application/json")], payload


GatewayAnswer = tuple[int, list[tuple[str, str]], bytes]


def refuse_oversized_body(body_length: int, max_body_bytes: int = MAX_BODY_BYTES) -> GatewayAnswer | None:
    """HTTP API's answer to a body over its payload quota, or None if the body may pass."""
    if body_length > max_body_bytes:
        return 413, [JSON_HEADER], TOO_LARGE
    return None


def invoke_integration(
    handler: Callable[[dict, Any], Any],
    event: dict[str, Any],
    context: Any,
    *,
    timeout_seconds: float = INTEGRATION_TIMEOUT_SECONDS,
) -> GatewayAnswer:
    """Invoke a Lambda integration as HTTP API does, with Lambda's and HTTP API's limits.

    - the event over Lambda's invoke payload: Lambda refuses the invoke (413), the handler never
      runs, and the client gets 413 `{"message":"Request Entity Too Large"}`;
    - the handler raises, or answers something that is not a valid 2.0 response, or answers
      more than the invoke payload allows (Lambda's `Function.ResponseSizeTooLarge`), or Lambda
      throttles the invocation (beyond the function's reserved concurrency: environments.py):
      HTTP API answers 500 `{"message":"Internal Server Error"}` (for a throttle: README
      "Throttling", and its sources);
    - the handler has not answered after `timeout_seconds`: 503 `{"message":"Service
      Unavailable"}`; the handler's thread runs on, as the Lambda invocation would.
    """
    request_bytes = invoke_payload_bytes(event)
    if request_bytes > LAMBDA_INVOKE_PAYLOAD_BYTES:
        log.warning("event of %d bytes is over Lambda's invoke payload: 413, the handler did not run", request_bytes)
        return 413, [JSON_HEADER], TOO_LARGE
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["result"] = handler(event, context)
        except Exception as error:  # whatever the handler raises, the client gets a 500
            outcome["error"] = error
        finally:
            done.set()

    # A daemon thread, not an executor: a handler that never returns must not keep the
    # process from exiting.
    threading.Thread(target=run, name="api-invocation", daemon=True).start()
    if not done.wait(timeout_seconds):
        log.error("the handler did not answer within the %.1f s integration timeout: 503", timeout_seconds)
        return 503, [JSON_HEADER], _TIMED_OUT
    if "error" in outcome:
        error = outcome["error"]
        log.error("the handler failed: 500", exc_info=(type(error), error, error.__traceback__))
        return 500, [JSON_HEADER], _INTERNAL_ERROR
    result = outcome["result"]
    response_bytes = invoke_payload_bytes(result)
    if response_bytes > LAMBDA_INVOKE_PAYLOAD_BYTES:
        log.error("the handler's response of %d bytes is over Lambda's invoke payload: 500", response_bytes)
        return 500, [JSON_HEADER], _INTERNAL_ERROR
    try:
        return http_response(result)
    except (ValueError, TypeError):
        log.exception("the handler's response is not a valid payload 2.0 response: 500")
        return 500, [JSON_HEADER], _INTERNAL_ERROR


def _header_value(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(str(item) for item in value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
