"""Errors a caller of the API sees: each carries its HTTP status, an error type and a message.

The API handler turns any `ApiError` into `{"error": {"message", "type", "code", "param"}}`,
the shape OpenAI-compatible clients already parse.
"""

from __future__ import annotations


class ApiError(Exception):
    status: int = 400
    error_type: str = "invalid_request_error"
    code: str | None = None
    # Seconds after which the same call may succeed, sent as Retry-After (a 429's, a 503's).
    retry_after: int | None = None

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.param = param
        if retry_after is not None:
            self.retry_after = retry_after

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.error_type, "code": self.code, "param": self.param}}


class BadRequest(ApiError):
    status = 400
    code = "invalid_request"


class Unauthorized(ApiError):
    status = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(ApiError):
    status = 403
    error_type = "permission_error"
    code = "forbidden"


class NotFound(ApiError):
    status = 404
    error_type = "not_found_error"
    code = "not_found"


class MethodNotAllowed(ApiError):
    """A method the path does not take; the API sends the ones it does as `Allow`."""

    status = 405
    code = "method_not_allowed"


class Conflict(ApiError):
    status = 409
    error_type = "conflict_error"
    code = "conflict"


class PayloadTooLarge(ApiError):
    status = 413
    code = "payload_too_large"


class UnprocessableEntity(ApiError):
    status = 422
    code = "unprocessable_entity"


class TooManyRequests(ApiError):
    status = 429
    error_type = "rate_limit_error"
    code = "rate_limited"


class QuotaExceeded(TooManyRequests):
    code = "quota_exceeded"


class ServiceUnavailable(ApiError):
    """A passing condition (a write conflicted with another one): nothing was changed, and the
    same call may succeed after `retry_after` seconds, which the API sends as Retry-After."""

    status = 503
    error_type = "server_error"
    code = "service_unavailable"

    def __init__(self, message: str, *, retry_after: int = 1, code: str | None = None) -> None:
        super().__init__(message, code=code, retry_after=retry_after)


# How long a caller waits before retrying a write that conflicting writes kept cancelling.
BUSY_RETRY_AFTER_SECONDS = 1


def busy(doing: str) -> ServiceUnavailable:
    """A transaction other writes kept cancelling (DynamoDB reports a conflict instead of
    waiting): nothing was written, so the same call a moment later is safe."""
    return ServiceUnavailable(f"Another change to the same data was in progress while {doing}; nothing was "
                              f"changed. Try again in {BUSY_RETRY_AFTER_SECONDS} second(s)",
                              retry_after=BUSY_RETRY_AFTER_SECONDS)
