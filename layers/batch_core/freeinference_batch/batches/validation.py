"""The rules a batch's requests must meet, shared by the API and the CLI's local check.

Every error names the request at fault in the spec's form:
`requests[1] (custom_id 'q-2'): Model 'no-such-model' not found`. An id is quoted by `quote`.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable
from typing import Any

from pydantic import TypeAdapter, ValidationError

from freeinference_batch.core.catalog import Catalog, is_auto_model
from freeinference_batch.core.errors import BadRequest
from freeinference_batch.core.schemas import (
    BatchRequestLine,
    CheckedRequest,
    CreateBatchDict,
    CreateBatchEnvelope,
    CreateFileBatchBody,
)

_lines = TypeAdapter(list[BatchRequestLine])
_create_body = TypeAdapter(CreateBatchDict)

METADATA_MAX_PAIRS = 16
METADATA_MAX_KEY = 64
METADATA_MAX_VALUE = 512
# Parsing JSON costs about 115 bytes of Python objects per value. A legitimate 32 MiB body of chat
# requests holds well under a million values, but 27 MB of `[],` holds 9 million (a gigabyte
# parsed): refuse bodies that are this fragmented before parsing them.
MAX_JSON_VALUES = 5_000_000
# A JSON string, or an unterminated one, which runs to the end of the body (no parser reads past
# it). Every quantifier is possessive: a match never gives back what it took, so each match is one
# pass over what it covers and a failed attempt costs one byte. The backtracking form that was here
# rescanned to the end from every quote of an unterminated string of `\"` (quadratic: 64,000
# pairs held the API for ~48 s).
_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"?', re.DOTALL)

Label = Callable[[int], str]

# Ids longer than this are cut in messages (to QUOTE_MAX - 3 characters plus "..."): a message
# names the request, it does not carry a 512-character id back.
QUOTE_MAX = 64
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def quote(value: str) -> str:
    """An id (custom_id, model) as a message shows it, the spec's `'q-2'`: in single quotes as
    given (no escaping of quotes or backslashes, unlike repr), cut to 61 characters plus `...` when
    over 64, with only control characters escaped (`\\n`, `\\r`, `\\t`, else `\\u0000`), so a
    message stays one line of visible text."""
    cut = len(value) > QUOTE_MAX
    escaped = "".join(_SHORT_ESCAPES.get(ch) or (f"\\u{ord(ch):04x}" if unicodedata.category(ch) == "Cc" else ch)
                      for ch in (value[:QUOTE_MAX - 3] if cut else value))
    return f"'{escaped}{'...' if cut else ''}'"


def requests_label(index: int) -> str:
    return f"requests[{index}]"


def _describe(error: dict[str, Any]) -> str:
    """A pydantic error, in words that point at the field."""
    loc = [str(part) for part in error["loc"][1:]]  # drop the list index
    field = ".".join(loc)
    kind = error["type"]
    if loc == ["custom_id"]:
        return "custom_id must be a string of 1 to 512 characters"
    if loc == ["method"]:
        return "method must be 'POST', the only method a batch accepts"
    if loc == ["url"]:
        return "url must be '/v1/chat/completions', the only endpoint a batch can call"
    if loc == ["body"] and kind in ("model_type", "dict_type"):
        return "body must be a chat-completion request object"
    if loc == ["body", "model"]:
        return "body.model is required and must be a string" if kind == "missing" else "body.model must be a string"
    if loc == ["body", "messages"]:
        return "body.messages must be a non-empty array of messages"
    if loc == ["body", "stream"]:
        return "body.stream must be a boolean (and not true: batches do not stream)"
    if kind == "missing":
        return f"{field} is required"
    if kind == "extra_forbidden":
        return f"unknown field '{field}' (a request has custom_id, method, url and body)"
    return f"{field}: {error['msg']}"


def _prefix(label: Label, index: int, raw: Any) -> str:
    """Where the error is: `requests[1] (custom_id 'q-2')`; a label of "" (a file's line, whose
    number its error carries apart) names the request by its custom_id alone."""
    custom_id = raw.get("custom_id") if isinstance(raw, dict) else None
    if isinstance(custom_id, str):
        name = label(index)
        return f"{name} (custom_id {quote(custom_id)})" if name else f"custom_id {quote(custom_id)}"
    return label(index)


def validate_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > METADATA_MAX_PAIRS:
        raise BadRequest(f"metadata holds {len(metadata)} pairs; at most {METADATA_MAX_PAIRS} are allowed",
                         param="metadata")
    for name, value in metadata.items():
        if not name:
            # DynamoDB refuses empty attribute names, map keys included.
            raise BadRequest("metadata keys must not be empty", param="metadata")
        if len(name) > METADATA_MAX_KEY:
            raise BadRequest(f"metadata key {name[:70]!r} is longer than {METADATA_MAX_KEY} characters",
                             param="metadata")
        if len(value) > METADATA_MAX_VALUE:
            raise BadRequest(f"metadata[{name!r}] is longer than {METADATA_MAX_VALUE} characters", param="metadata")


def parse_envelope(document: Any) -> CreateBatchEnvelope:
    if not isinstance(document, dict):
        raise BadRequest("The body must be a JSON object with a 'requests' array or an 'input_file_id'")
    both_forms(document)
    try:
        return CreateBatchEnvelope.model_validate(document)
    except ValidationError as error:
        first = error.errors()[0]
        where = first["loc"][0] if first["loc"] else ""
        if where == "requests":
            if first["type"] == "missing":
                raise BadRequest("The body must have a 'requests' array (the requests inline) or an "
                                 "'input_file_id' (a file of them, OpenAI's form)", param="requests") from None
            raise BadRequest("'requests' must be an array of requests", param="requests") from None
        if where == "metadata":
            raise BadRequest("metadata must be an object of string keys and string values",
                             param="metadata") from None
        raise BadRequest(f"Invalid body: {first['msg']}") from None


def validate_requests(raw_requests: list[Any], catalog: Catalog, tier: str, max_requests: int,
                      label: Label = requests_label) -> list[CheckedRequest]:
    """Check every request; answers each with its body encoded as JSON, in order."""
    if not raw_requests:
        raise BadRequest("A batch needs at least one request; 'requests' is empty", param="requests")
    if len(raw_requests) > max_requests:
        raise BadRequest(f"A batch holds at most {max_requests} requests; this one has {len(raw_requests)}. "
                         "Split the job into several batches", param="requests")
    try:
        lines = _lines.validate_python(raw_requests)
    except ValidationError as error:
        first = min(error.errors(), key=lambda e: e["loc"][0])
        index = int(first["loc"][0])
        if len(first["loc"]) == 1:
            raise BadRequest(f"{label(index)}: each request must be an object with custom_id and body") from None
        raise BadRequest(f"{_prefix(label, index, raw_requests[index])}: {_describe(first)}") from None

    return check_requests([line.model_dump(exclude_unset=True) | {"body": raw["body"]}
                           for line, raw in zip(lines, raw_requests, strict=True)], raw_requests, catalog, tier, label)


def check_requests(lines: list[dict], raw_requests: list[Any], catalog: Catalog, tier: str,
                   label: Label = requests_label) -> list[CheckedRequest]:
    """The rules a schema cannot say: known models, no auto models, no streaming, unique ids,
    finite numbers. Answers each request with its body encoded as JSON, in order."""
    seen: dict[str, int] = {}
    packed: list[CheckedRequest] = []
    for index, line in enumerate(lines):
        body = line["body"]
        model = body["model"]
        custom_id = line["custom_id"]
        if is_auto_model(model):
            where = _prefix(label, index, raw_requests[index])
            raise BadRequest(f"{where}: Auto model {quote(model)} cannot be used in a batch; name a model ID")
        if catalog.model_for_tier(model, tier) is None:
            # Not allowed and not existing read the same: a key cannot probe for models.
            where = _prefix(label, index, raw_requests[index])
            raise BadRequest(f"{where}: Model {quote(model)} not found", code="model_not_found")
        if body.get("stream"):
            where = _prefix(label, index, raw_requests[index])
            raise BadRequest(f"{where}: body.stream must not be true; batch requests do not stream")
        if custom_id in seen:
            where = _prefix(label, index, raw_requests[index])
            raise BadRequest(f"{where}: custom_id {quote(custom_id)} repeats {label(seen[custom_id])}; "
                             "custom_id must be unique within the batch")
        seen[custom_id] = index
        try:
            encoded = json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
        except ValueError:
            where = _prefix(label, index, raw_requests[index])
            raise BadRequest(f"{where}: body holds NaN or Infinity, which JSON does not allow; "
                             "send finite numbers (or null)") from None
        packed.append(CheckedRequest(custom_id, model, encoded))
    return packed


def both_forms(document: dict) -> None:
    """A create body holds its requests inline or names a file of them, never both."""
    if "requests" in document and "input_file_id" in document:
        raise BadRequest("The body has both 'requests' and 'input_file_id'; send the requests inline or name "
                         "a file of them, not both", param="input_file_id")


# A body of the file form is a few fields: one larger than this is the inline form (or neither).
FILE_FORM_MAX_BYTES = 64 * 1024
ENDPOINT = "/v1/chat/completions"
COMPLETION_WINDOW = "24h"


def parse_file_form(raw: bytes) -> CreateFileBatchBody | None:
    """The create body in OpenAI's form (`input_file_id`, `endpoint`, `completion_window`,
    `metadata`), checked; None when it is not that form (the inline parse then explains what it is)."""
    if len(raw) > FILE_FORM_MAX_BYTES or b"input_file_id" not in raw:
        return None
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(document, dict) or "input_file_id" not in document:
        return None
    both_forms(document)
    try:
        body = CreateFileBatchBody.model_validate(document)
    except ValidationError as error:
        first = error.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "input_file_id"
        if field == "metadata":
            raise BadRequest("metadata must be an object of string keys and string values", param="metadata") from None
        if first["type"] == "missing":
            raise BadRequest(f"{field} is required with input_file_id", param=field) from None
        raise BadRequest(f"{field} must be a string", param=field) from None
    if body.endpoint != ENDPOINT:
        raise BadRequest(f"endpoint must be {ENDPOINT!r}, the only endpoint a batch can call "
                         f"(got {quote(body.endpoint)})", param="endpoint")
    if body.completion_window != COMPLETION_WINDOW:
        raise BadRequest(f"completion_window must be {COMPLETION_WINDOW!r} (got {quote(body.completion_window)})",
                         param="completion_window")
    validate_metadata(body.metadata)
    return body


def check_fragmentation(raw: bytes) -> None:
    """Refuse a body whose parse would take far more memory than its size (see MAX_JSON_VALUES).

    Every value but the first in an array or object follows a comma, and every array or object
    opens with a bracket, so those characters outside strings bound the number of values. Counting
    them in strings too is an upper bound that is nearly always far under the limit; only when it
    is not are the strings stripped for an exact count, in one linear pass whatever the body
    (0.1 s on 27 MB of `[],`; bench/validation_scan.py)."""
    def structure(data: bytes) -> int:
        return data.count(b",") + data.count(b"[") + data.count(b"{")

    if structure(raw) <= MAX_JSON_VALUES:
        return
    count = structure(_JSON_STRING.sub(b'""', raw))
    if count > MAX_JSON_VALUES:
        raise BadRequest(f"The body holds about {count:,} JSON values (arrays, objects, strings, numbers); "
                         f"at most {MAX_JSON_VALUES:,} are accepted. Chat requests never need that many: "
                         "check the bodies, or split the job into several batches")


def parse_create_body(raw: bytes, catalog: Catalog, tier: str,
                      max_requests: int) -> tuple[list[CheckedRequest], dict[str, str] | None]:
    """Parse and check a create body; answers (each request with its encoded body, metadata)."""
    check_fragmentation(raw)
    try:
        document = _create_body.validate_json(raw)
    except ValidationError as error:
        _explain_refusal(raw, error, catalog, tier, max_requests)
        raise AssertionError("unreachable") from None
    both_forms(document)
    metadata = document.get("metadata")
    validate_metadata(metadata)
    requests = document["requests"]
    if not requests or len(requests) > max_requests:
        validate_requests(requests, catalog, tier, max_requests)  # raises the count's message
    return check_requests(requests, requests, catalog, tier), metadata


def _explain_refusal(raw: bytes, error: ValidationError, catalog: Catalog, tier: str, max_requests: int) -> None:
    """The fast parse refused the body: redo it the slow way, whose errors name the request."""
    first = error.errors()[0]
    if first["type"] in ("json_invalid", "json_type"):
        raise BadRequest(f"The body is not valid JSON: {str(first.get('ctx', {}).get('error', first['msg']))[:200]}")
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as decode_error:
        raise BadRequest(f"The body is not valid JSON: {str(decode_error)[:200]}") from None
    envelope = parse_envelope(document)
    validate_metadata(envelope.metadata)
    validate_requests(envelope.requests, catalog, tier, max_requests)
    raise BadRequest(f"Invalid body: {first['msg']}")
