"""Pydantic models of every payload the service takes or gives."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, NamedTuple, NotRequired, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictStr,
    ValidationError,
    model_serializer,
)
from typing_extensions import TypedDict

from freeinference_batch.core.errors import BadRequest


class BatchStatus(StrEnum):
    """A batch's status, as stored and as the batch object shows it (members are plain strings)."""

    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    # A batch created from a file (issue 32) that completed, while its output and error files are
    # written (batches/output_files.py); never an inline batch.
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    # Stored statuses beyond the spec's: a batch being written (never visible) and a deleted one.
    CREATING = "creating"
    DELETED = "deleted"


# The statuses the spec gives a batch object: all but the stored-only ones.
VisibleBatchStatus = Literal[
    BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING, BatchStatus.COMPLETED, BatchStatus.FAILED,
    BatchStatus.EXPIRED, BatchStatus.CANCELLING, BatchStatus.CANCELLED,
]
FINAL_STATUSES: frozenset[BatchStatus] = frozenset(
    {BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED}
)


class RequestStatus(StrEnum):
    """A request's status, as stored on its item and as its result line shows it. CANCELLED and
    EXPIRED are never stored: a request that never ran shows them after its batch's (views.py)."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


class WaitingReason(StrEnum):
    """Why a batch with requests left starts none of them: something outside the batch (issue 33)."""

    BATCH_ACCESS = "batch_access"  # the account's tier lost batch access
    CONCURRENCY = "concurrency"  # the account's concurrent-request slots are all held by others
    MODEL_BUSY = "model_busy"  # the model's batch capacity is in use by others, or held back
    DAILY_QUOTA = "daily_quota"  # the account's daily quota is used up until 00:00 UTC


class Waiting(BaseModel):
    """A batch's `waiting`, as stored on its META item and as the batch object shows it."""

    model_config = ConfigDict(frozen=True)

    reason: WaitingReason
    message: str
    since: int  # when this reason was first written (whole seconds)


# ---- create -------------------------------------------------------------------------------


class ChatCompletionBody(BaseModel):
    """The part of a chat-completion body the batch service must understand; everything else is
    passed to the upstream untouched."""

    model_config = ConfigDict(extra="allow")

    model: StrictStr
    messages: list[Any] = Field(min_length=1)
    stream: StrictBool | None = None


class BatchRequestLine(BaseModel):
    """One entry of `requests`, shaped like a line of an OpenAI batch input file."""

    model_config = ConfigDict(extra="forbid")

    custom_id: StrictStr = Field(min_length=1, max_length=512)
    method: Literal["POST"] = "POST"
    url: Literal["/v1/chat/completions"] = "/v1/chat/completions"
    body: ChatCompletionBody


class CreateBatchEnvelope(BaseModel):
    """The create body without its requests (those are validated one by one, so an error can
    name the request at fault). `completion_window` and OpenAI's other fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    requests: list[Any]
    metadata: dict[StrictStr, StrictStr] | None = None


# The same rules as TypedDicts: the create body is parsed and checked in one pass in
# pydantic-core (validate_json), three times faster on 50,000 requests than json.loads followed
# by model validation, and the bodies come out as the plain dicts we store. When it refuses a
# body, the models above produce the message that names the request at fault.


class ChatCompletionBodyDict(TypedDict):
    __pydantic_config__ = ConfigDict(extra="allow")  # type: ignore[misc]
    model: StrictStr
    messages: Annotated[list[Any], Field(min_length=1)]
    stream: NotRequired[StrictBool | None]


class BatchRequestDict(TypedDict):
    __pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[misc]
    custom_id: Annotated[StrictStr, Field(min_length=1, max_length=512)]
    method: NotRequired[Literal["POST"]]
    url: NotRequired[Literal["/v1/chat/completions"]]
    body: ChatCompletionBodyDict


class CreateBatchDict(TypedDict):
    __pydantic_config__ = ConfigDict(extra="ignore")  # type: ignore[misc]
    requests: list[BatchRequestDict]
    metadata: NotRequired[dict[StrictStr, StrictStr] | None]
    # Only read to refuse a body of both forms (a large one never reaches the file form's parse).
    input_file_id: NotRequired[Any]


class CreateFileBatchBody(BaseModel):
    """The create body's second form, OpenAI's: the requests are the lines of an uploaded file
    (batches/file_batches.py checks them in the background). OpenAI's other fields are ignored,
    as the inline form ignores them."""

    model_config = ConfigDict(extra="ignore")

    input_file_id: StrictStr
    endpoint: StrictStr
    completion_window: StrictStr
    metadata: dict[StrictStr, StrictStr] | None = None


# The result statuses a retry may take again: the final ones (a final batch has no other).
RETRYABLE_STATUSES = ("failed", "expired", "cancelled", "completed")
DEFAULT_RETRY_STATUSES = ("failed", "expired")


class RetryBatchBody(BaseModel):
    """The body of `POST /v1/batches/{batch_id}/retry`, all of it optional. Statuses are plain
    strings here so that one outside RETRYABLE_STATUSES is refused naming it (batches/retry.py)."""

    model_config = ConfigDict(extra="forbid")

    statuses: list[StrictStr] = Field(default_factory=lambda: list(DEFAULT_RETRY_STATUSES), min_length=1)
    # Left out: the child takes the parent's metadata; null: none.
    metadata: dict[StrictStr, StrictStr] | None = None


class CheckedRequest(NamedTuple):
    """A request that passed every check, its body kept as the JSON bytes sent upstream."""

    custom_id: str
    model: str
    body: bytes


Body = TypeVar("Body", bound=BaseModel)


def parse_body(raw: bytes, model: type[Body]) -> Body:
    """A small JSON body (a retry's, a webhook endpoint's) as its model; an empty body is `{}`.
    Refused with 400 naming the first field at fault."""
    try:
        data = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as error:
        raise BadRequest(f"The body is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise BadRequest("The body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise BadRequest(f"Invalid body: {where}: {first['msg']}", param=where) from None


# ---- answers ------------------------------------------------------------------------------


class BatchJob(BaseModel):
    """A message of the batch jobs queue: one step of a batch's background work (batches/jobs.py)."""

    kind: Literal["validate", "write_files"]
    batch_id: str


class LineError(BaseModel):
    """One bad line of a file batch's input, OpenAI's `errors.data[]` entry (`line` 1-based; null
    when the error is the file's as a whole)."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(BaseModel):
    """A file batch's `errors`: why its input failed the checks, OpenAI's shape."""

    object: Literal["list"] = "list"
    data: list[LineError]


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class BatchObject(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: Literal["/v1/chat/completions"] = "/v1/chat/completions"
    # A batch created from a file (OpenAI's form): its file, and the bad lines that failed it
    # (status failed, nothing of it run). Null on an inline batch, as the spec has them.
    errors: BatchErrors | None = None
    input_file_id: str | None = None
    completion_window: str
    status: VisibleBatchStatus
    # A batch created from a file, once final: its successes and its failures as OpenAI's batch
    # output lines (null when there are none, and always on an inline batch).
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts
    metadata: dict[str, str] | None = None
    cost_usd: float
    error: dict[str, Any] | None = None
    # Beyond the spec's object (like cost_usd and error): the batch this one retries, else null.
    retry_of: str | None = None
    # Beyond the spec's object too: why its unstarted requests cannot start now, else null.
    waiting: Waiting | None = None


class _OmitsNone(BaseModel):
    """An answer whose fields named in OMITTED_WHEN_NONE are left out, not written null, when they
    have no value (openapi.yaml leaves them out of `required`; tests/docs/test_openapi_models.py)."""

    OMITTED_WHEN_NONE: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        for name in self.OMITTED_WHEN_NONE:
            if data.get(name) is None:
                data.pop(name, None)
        return data


class ResultError(_OmitsNone):
    """The spec: a `code` and a `message`, "plus the HTTP `status` behind it when there was one".
    An error no HTTP answer stands behind (the batch failed or expired first) has no `status` at
    all, rather than `status: null`."""

    OMITTED_WHEN_NONE = frozenset({"status"})

    code: str
    message: str
    status: int | None = None


class ResultResponse(_OmitsNone):
    """A completed request's answer. `body` is null only for an answer too big for any page, and
    then `body_url` (present only then) serves it (results.py)."""

    OMITTED_WHEN_NONE = frozenset({"body_url"})

    status_code: int
    request_id: str
    body: dict[str, Any] | None
    body_url: str | None = None


class ResultLine(BaseModel):
    id: str
    custom_id: str
    status: RequestStatus
    response: ResultResponse | None = None
    error: ResultError | None = None


class Page(BaseModel):
    object: Literal["list"] = "list"
    data: list[Any]
    has_more: bool
    first_id: str | None
    last_id: str | None


class DeletedBatch(BaseModel):
    id: str
    object: Literal["batch.deleted"] = "batch.deleted"
    deleted: Literal[True] = True


# ---- webhooks (OpenAI's webhook-endpoint API: the `openai` package's client.webhooks) ----------


class WebhookEventType(StrEnum):
    """The events a webhook endpoint may subscribe to: one per final batch status."""

    BATCH_COMPLETED = "batch.completed"
    BATCH_FAILED = "batch.failed"
    BATCH_EXPIRED = "batch.expired"
    BATCH_CANCELLED = "batch.cancelled"


class WebhookEndpoint(BaseModel):
    """A webhook endpoint as every answer but create and rotate_secret shows it: never the secret."""

    id: str
    object: Literal["webhook_endpoint"] = "webhook_endpoint"
    url: str
    name: str
    event_types: list[WebhookEventType]
    created_at: int
    updated_at: int
    signing_secret_hint: str


class WebhookEndpointWithSecret(WebhookEndpoint):
    """Create's and rotate_secret's answer: the only times the signing secret is shown."""

    signing_secret: str


class WebhookEndpointList(BaseModel):
    object: Literal["list"] = "list"
    data: list[WebhookEndpoint]
    first_id: str | None
    last_id: str | None
    has_more: bool


class DeletedWebhookEndpoint(BaseModel):
    id: str
    object: Literal["webhook_endpoint.deleted"] = "webhook_endpoint.deleted"
    deleted: Literal[True] = True


class WebhookEndpointTestResult(BaseModel):
    object: Literal["webhook_endpoint.test"] = "webhook_endpoint.test"
    webhook_endpoint_id: str
    event_type: WebhookEventType
    status_code: int
    # OpenAI's: always true in an answer; a delivery that got no HTTP answer at all is a 400.
    success: Literal[True] = True


class WebhookEventTypeList(BaseModel):
    object: Literal["list"] = "list"
    data: list[WebhookEventType]


class WebhookCreateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: StrictStr
    name: StrictStr = Field(min_length=1, max_length=256)
    event_types: list[StrictStr] = Field(min_length=1)


class WebhookUpdateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: StrictStr | None = None
    name: StrictStr | None = Field(None, min_length=1, max_length=256)
    event_types: list[StrictStr] | None = Field(None, min_length=1)


class WebhookRotateSecretBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keep_old_secret_active_for_24_hours: StrictBool = False


class WebhookTestBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    event_type: StrictStr


class WebhookEventData(BaseModel):
    id: str


class WebhookEvent(BaseModel):
    """The body of a delivery, OpenAI's event shape: the event names the batch, nothing more (so a
    batch deleted before its event is delivered is still told of, and nothing of it leaks)."""

    id: str
    object: Literal["event"] = "event"
    type: WebhookEventType
    created_at: int
    data: WebhookEventData


class BatchStatusChange(BaseModel):
    """The `detail` of an EventBridge "Batch Status Change" event, and of a "Batch Waiting Change"
    (its status unchanged: `previous_status` is `status`; `waiting` set, changed or cleared)."""

    batch_id: str
    account_id: str
    status: VisibleBatchStatus
    previous_status: VisibleBatchStatus
    request_counts: RequestCounts
    cost_usd: float
    created_at: int
    metadata: dict[str, str] | None
    retry_of: str | None = None
    waiting: Waiting | None = None


# ---- internal -----------------------------------------------------------------------------


class RequestMessage(BaseModel):
    """An SQS message: which request to run. Messages carry ids, never bodies (SQS caps a message
    at 1 MiB, and the owner's details are re-read before every run anyway)."""

    batch_id: str
    model: str
    index: int = Field(ge=0, description="position within the batch's lane for this model")
    position: int = Field(ge=0, description="position within the batch")
    account_id: str = ""
    key_hash: str = ""
    # Set on a fresh copy of a message that waited long (see worker/runner.py): when the wait began.
    waiting_since: float | None = None


class WebhookDeliveryMessage(BaseModel):
    """An SQS message of the webhook delivery queue: one event for one endpoint. Every attempt of
    it is signed with the same `event_id` (the `webhook-id`), so receivers can de-duplicate."""

    model_config = ConfigDict(extra="ignore")

    event_id: str
    event_type: WebhookEventType
    batch_id: str
    endpoint_id: str
    account_id: str
    created_at: int
    # When the event was first queued: it is retried until this + the retry window.
    queued_at: float
