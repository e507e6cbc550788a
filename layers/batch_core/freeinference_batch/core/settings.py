"""The one place that reads the environment.

Every other module takes a `Settings` instance (usually from `get_settings()`), so the domain
logic can be tested with any values without touching `os.environ`.
"""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import urlsplit

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from freeinference_batch.core.catalog import queue_suffix

# The longest visibility timeout the service sets: SQS refuses one over 12 h (43,200 s) from the
# message's receive, and this leaves a delivery function's run (60 s) and a margin inside that.
# WEBHOOK_RETRY_MAX_SECONDS is bounded by it, and so is the template's WebhookRetryMaxSeconds
# (tests/deploy/test_settings_agree.py).
SQS_MAX_VISIBILITY_SECONDS = 43_000


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="", extra="ignore", frozen=True)

    # Limits from the spec (the user-facing defaults).
    batch_max_requests: int = Field(50_000, alias="BATCH_MAX_REQUESTS", ge=1)
    batch_max_body_bytes: int = Field(32 * 1024 * 1024, alias="BATCH_MAX_BODY_BYTES", ge=1)
    batch_max_unfinished: int = Field(10, alias="BATCH_MAX_UNFINISHED", ge=1)
    batch_completion_window_seconds: int = Field(24 * 3600, alias="BATCH_COMPLETION_WINDOW_SECONDS", ge=1)
    batch_retention_seconds: int = Field(7 * 24 * 3600, alias="BATCH_RETENTION_SECONDS", ge=1)

    # Execution.
    batch_max_attempts: int = Field(8, alias="BATCH_MAX_ATTEMPTS", ge=1)
    batch_retry_base_seconds: float = Field(2.0, alias="BATCH_RETRY_BASE_SECONDS", ge=0)
    batch_retry_max_seconds: float = Field(300.0, alias="BATCH_RETRY_MAX_SECONDS", ge=0)
    # One upstream call: what the interactive endpoint allows (reasoning answers of several minutes
    # are normal), cut to what the worker invocation has left (call_budget.py).
    batch_upstream_timeout_seconds: float = Field(600.0, alias="BATCH_UPSTREAM_TIMEOUT_SECONDS", gt=0)
    # Kept at a worker invocation's end to settle after a call (and, for the most a call may run,
    # as much at its start for a record to reach its call): call_budget.py.
    batch_settle_seconds: float = Field(30.0, alias="BATCH_SETTLE_SECONDS", gt=0)
    # A chain runs its next request in the same invocation while that call would get at least this
    # long (or the most a call may run, if less); else it leaves by a message, and the request
    # starts a fresh invocation. 120: as long as chains handed over when 120 s was the timeout.
    batch_handover_min_call_seconds: float = Field(120.0, alias="BATCH_HANDOVER_MIN_CALL_SECONDS", gt=0)
    # How long a running request's lease lasts before recovery may take it back.
    batch_lease_seconds: float = Field(0, alias="BATCH_LEASE_SECONDS", ge=0)
    # How often the local stack fires the schedules (on AWS the template's rates apply).
    batch_schedule_seconds: float = Field(60.0, alias="BATCH_SCHEDULE_SECONDS", gt=0)
    batch_api_enabled: bool = Field(True, alias="BATCH_API_ENABLED")
    # How long a dispatched message may go unclaimed before the sweep sends it again.
    batch_dispatch_lease_seconds: float = Field(600.0, alias="BATCH_DISPATCH_LEASE_SECONDS", gt=0)
    # A model answering 429/503 halves its batch cap at most this often (model_backoff.py)...
    batch_backoff_cooldown_seconds: float = Field(10.0, alias="BATCH_BACKOFF_COOLDOWN_SECONDS", ge=0)
    # ...and while its calls succeed, the cap grows back one slot at most this often.
    batch_recovery_seconds: float = Field(30.0, alias="BATCH_RECOVERY_SECONDS", ge=0)
    # Most bytes the lines of one page (results, batch list) may add to the API's answer: safely
    # under Lambda's 6,291,456-byte response payload limit (see pages.py).
    batch_page_budget_bytes: int = Field(5_000_000, alias="BATCH_PAGE_BUDGET_BYTES", ge=100_000, le=6_000_000)

    # Fault injection for the chaos tests and demos (never set in production): the share of
    # worker steps that die as if the Lambda were killed. (AWS's own failures, duplicated
    # deliveries among them, are the local stack's LOCAL_AWS_FAULTS.)
    batch_fault_crash_rate: float = Field(0.0, alias="BATCH_FAULT_CRASH_RATE", ge=0, le=1)

    # Upstream OpenAI-compatible API: the base URL ends in /v1 (as OpenAI's SDKs take it); the
    # workers call <base>/chat/completions.
    upstream_base_url: str = Field("", alias="UPSTREAM_BASE_URL")
    # The service credential in plain text: the local stack and tests only. Deployed, the workers
    # get the name of a Secrets Manager secret instead (never the value, which anyone allowed
    # lambda:GetFunctionConfiguration could read), and read it at run time, cached for
    # UPSTREAM_API_KEY_MAX_AGE_SECONDS: a rotated credential is in use within that time, no deploy.
    upstream_api_key: str = Field("", alias="UPSTREAM_API_KEY")
    upstream_api_key_secret: str = Field("", alias="UPSTREAM_API_KEY_SECRET")
    upstream_api_key_max_age_seconds: int = Field(300, alias="UPSTREAM_API_KEY_MAX_AGE_SECONDS", ge=0)

    # Webhooks (webhooks/: endpoints.py, delivery.py, status_events.py).
    # The key every endpoint's signing secret is derived from (webhooks/signing.py): the name or ARN
    # of a Secrets Manager secret deployed; WEBHOOK_SIGNING_KEY in plain text for tests only.
    webhook_signing_key_secret: str = Field("", alias="WEBHOOK_SIGNING_KEY_SECRET")
    webhook_signing_key: str = Field("", alias="WEBHOOK_SIGNING_KEY")
    webhook_signing_key_max_age_seconds: int = Field(300, alias="WEBHOOK_SIGNING_KEY_MAX_AGE_SECONDS", ge=0)
    # A batch's background jobs (batches/jobs.py): checking a file batch's input, writing its
    # output and error files.
    batch_jobs_queue_url: str = Field("", alias="BATCH_JOBS_QUEUE_URL")
    # A file batch's output and error files (batches/output_files.py): the size a multipart part
    # is sent at (S3: at least 5 MiB but the last, 10,000 parts; 48 MiB x 10,000 = 468.75 GiB, over
    # BATCH_MAX_REQUESTS x an 8 MiB answer), and how long its job may show no progress before the
    # sweep sends it again (a step takes at most the jobs function's 900 s).
    batch_files_part_bytes: int = Field(48 * 1024 * 1024, alias="BATCH_FILES_PART_BYTES", ge=5 * 1024 * 1024,
                                        le=512 * 1024 * 1024)
    batch_files_stall_seconds: int = Field(1800, alias="BATCH_FILES_STALL_SECONDS", ge=60)
    # A job step that fails (an AWS error outlasting botocore's retries, say) runs again after
    # this, doubled at each failure (60, 120, 240, 480 s; after the fifth, 960 s later, SQS moves
    # it to the dead-letter queue at its next receive), rather than after the jobs queue's
    # 90-minute visibility timeout, which is for a step that dies without answering.
    batch_jobs_retry_base_seconds: int = Field(60, alias="BATCH_JOBS_RETRY_BASE_SECONDS", ge=0)
    webhook_delivery_queue_url: str = Field("", alias="WEBHOOK_DELIVERY_QUEUE_URL")
    webhook_dead_letter_queue_url: str = Field("", alias="WEBHOOK_DEAD_LETTER_QUEUE_URL")
    # The local stack only: http:// and https:// to the literal hosts 127.0.0.1, ::1 and localhost
    # (a developer's own receiver). Off in the template: deployed, a URL must be https to a public address.
    webhook_allow_loopback_http: bool = Field(False, alias="WEBHOOK_ALLOW_LOOPBACK_HTTP")
    # ...and on these loopback ports only ("9000-9999,8000"): not the stack's own, nor any other
    # service's on the machine.
    webhook_loopback_ports: str = Field("9000-9999", alias="WEBHOOK_LOOPBACK_PORTS",
                                        pattern=r"^\s*(\d{1,5}(-\d{1,5})?\s*(,\s*\d{1,5}(-\d{1,5})?\s*)*)?$")
    webhook_max_endpoints: int = Field(5, alias="WEBHOOK_MAX_ENDPOINTS", ge=1)
    # One attempt's deadline in all (connecting, TLS, sending, the status line and headers), the
    # part of it a host name may take to resolve, and how long an event is retried in all before
    # it goes to the dead-letter queue; the wait before attempt n is about min(base * 2^(n-1), max),
    # jittered.
    webhook_timeout_seconds: float = Field(10.0, alias="WEBHOOK_TIMEOUT_SECONDS", gt=0)
    webhook_resolve_timeout_seconds: float = Field(2.0, alias="WEBHOOK_RESOLVE_TIMEOUT_SECONDS", gt=0)
    # One account's delivery attempts in flight at once, over every delivery function environment,
    # and the least time between two test deliveries (`/test`) of one endpoint.
    webhook_account_max_in_flight: int = Field(3, alias="WEBHOOK_ACCOUNT_MAX_IN_FLIGHT", ge=1, le=10)
    webhook_test_interval_seconds: float = Field(10.0, alias="WEBHOOK_TEST_INTERVAL_SECONDS", ge=0)
    webhook_retry_window_seconds: float = Field(86400.0, alias="WEBHOOK_RETRY_WINDOW_SECONDS", gt=0)
    webhook_retry_base_seconds: float = Field(30.0, alias="WEBHOOK_RETRY_BASE_SECONDS", ge=0)
    # A wait is a visibility timeout, which SQS counts from the message's receive and caps.
    webhook_retry_max_seconds: float = Field(3600.0, alias="WEBHOOK_RETRY_MAX_SECONDS", ge=0,
                                             le=SQS_MAX_VISIBILITY_SECONDS)
    # The EventBridge bus every batch status change is put on.
    event_bus_name: str = Field("default", alias="EVENT_BUS_NAME")

    # Files and uploads (files/: OpenAI's Files and Uploads APIs, purpose "batch"). The largest
    # input file; what one files.create may carry (Lambda's 6 MB event holds the multipart body in
    # base64: 4 MiB of file and its form fit, ~4.7 MB do not); how long an input file lives (its
    # objects must go before the bucket's 9-day lifecycle backstop); an account's stored input
    # files and their bytes; an upload's parts (the file's item names each part's object: 1,000
    # keys of ~70 bytes stay far under DynamoDB's 400 KB item) and lifetime (OpenAI's hour); how
    # long a content link may be started.
    file_max_bytes: int = Field(200 * 1024 * 1024, alias="FILE_MAX_BYTES", ge=1)
    file_create_max_bytes: int = Field(4 * 1024 * 1024, alias="FILE_CREATE_MAX_BYTES", ge=1, le=4 * 1024 * 1024)
    file_lifetime_seconds: int = Field(7 * 24 * 3600, alias="FILE_LIFETIME_SECONDS", ge=3600, le=8 * 24 * 3600)
    file_max_stored: int = Field(100, alias="FILE_MAX_STORED", ge=1)
    file_max_stored_bytes: int = Field(5 * 1024**3, alias="FILE_MAX_STORED_BYTES", ge=1)
    upload_max_parts: int = Field(1000, alias="UPLOAD_MAX_PARTS", ge=1, le=1000)
    upload_lifetime_seconds: int = Field(3600, alias="UPLOAD_LIFETIME_SECONDS", ge=60)
    file_url_seconds: int = Field(300, alias="FILE_URL_SECONDS", ge=1, le=3600)

    # Resources (the template passes these to every function; the local stack sets them too).
    batch_table_name: str = Field("freeinference-batch", alias="BATCH_TABLE_NAME")
    accounts_table_name: str = Field("freeinference-accounts", alias="ACCOUNTS_TABLE_NAME")
    payload_bucket_name: str = Field("freeinference-batch-payloads", alias="PAYLOAD_BUCKET_NAME")
    # A model's queue URL is this + the model id with "." made "-" (`catalog.queue_suffix`): the
    # template names every model's queue <stack>-model_<suffix>, so no per-model list is kept.
    model_queue_url_prefix: str = Field("", alias="MODEL_QUEUE_URL_PREFIX")
    # Optional path to a JSON model catalog replacing the packaged one.
    model_catalog_path: str = Field("", alias="MODEL_CATALOG_PATH")
    # Optional file holding a clock offset in seconds (local stack and tests only).
    clock_offset_file: str = Field("", alias="BATCH_CLOCK_OFFSET_FILE")

    @field_validator("upstream_base_url")
    @classmethod
    def _check_upstream_base_url(cls, value: str) -> str:
        """Refuse a base URL every request would fail on (an upstream answers 404 to a wrong path,
        which reads as `model_not_found`): better a function that cannot start than a queue of
        requests that fail one by one. Empty means "not configured" (the API never calls it)."""
        if not value:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"UPSTREAM_BASE_URL {value!r} is not an http(s) URL")
        if parts.query or parts.fragment:
            raise ValueError(f"UPSTREAM_BASE_URL {value!r} has a query or fragment; give the base URL only")
        if not parts.path.rstrip("/").endswith("/v1"):
            raise ValueError(
                f"UPSTREAM_BASE_URL {value!r} must end in /v1 (e.g. https://gateway.internal/v1): "
                "the workers call <base>/chat/completions"
            )
        return value

    def model_queue_url(self, model: str) -> str:
        """The URL of `model`'s work queue."""
        if not self.model_queue_url_prefix:
            raise RuntimeError("MODEL_QUEUE_URL_PREFIX is not set: no model queue can be named")
        return self.model_queue_url_prefix + queue_suffix(model)

    @property
    def lease_seconds(self) -> float:
        """A running request's lease: long enough for the slowest upstream call plus bookkeeping."""
        return self.batch_lease_seconds or self.batch_upstream_timeout_seconds + 60

    @property
    def slot_lease_seconds(self) -> float:
        """A block of slots' lease (store/leases.py), never past its invocation's end (+ 60 s).
        The first of its chains to find less than a request's lease of it left renews it (so it
        never runs out mid-run): at most once per `lease_seconds`, and never where it outlasts the
        invocation, as by default. A dead invocation's slots free themselves after at most this
        long, or at its end."""
        return 2 * self.lease_seconds


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()  # type: ignore[call-arg]
