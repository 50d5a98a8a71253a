"""The gateway's failure kinds, and the one table that turns them into OpenAI error bodies.

Every failure the gateway itself reports is one of these classes; nothing else decides a status
code. The hierarchy:

    GatewayError
    ├── InvalidRequestError          400 invalid_request_error   (bad JSON, bad fields)
    │   └── ContextLengthExceededError  400, code context_length_exceeded (recovery_mode: error)
    ├── AuthenticationError          401 authentication_error
    ├── PermissionDeniedError        403 permission_error
    ├── NotFoundError                404 invalid_request_error
    │   └── ModelNotFoundError          code model_not_found
    ├── BodyTooLargeError            413 invalid_request_error
    ├── RequestTimeoutError          408 (a client that trickles its body too slowly)
    ├── TooManyRequestsError         429 rate_limit_error (per-tenant concurrency)
    ├── UpstreamError                502 upstream_error
    │   └── UpstreamUnreachableError    code upstream_unreachable
    ├── UpstreamTimeoutError         504 upstream_timeout
    └── ShuttingDownError            503 (the shutdown deadline ended a response)

Errors coming *from* the upstream are not in this tree: the upstream's status and body are relayed
unchanged (R1.1).
"""

from __future__ import annotations

import orjson


class GatewayError(Exception):
    """A failure reported to the client; `status`, `type` and `code` come from ERROR_TABLE."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self._code = code
        self.headers = headers or {}

    @property
    def status(self) -> int:
        return _lookup(type(self))[0]

    @property
    def error_type(self) -> str:
        return _lookup(type(self))[1]

    @property
    def code(self) -> str | None:
        return self._code if self._code is not None else _lookup(type(self))[2]

    def body(self) -> bytes:
        """The OpenAI error body: {"error": {"message", "type", "param", "code"}}."""
        return orjson.dumps(
            {
                "error": {
                    "message": self.message,
                    "type": self.error_type,
                    "param": self.param,
                    "code": self.code,
                }
            }
        )


class InvalidRequestError(GatewayError):
    """The request body is not a valid chat request."""


class ContextLengthExceededError(InvalidRequestError):
    """Nothing the policy chain could do made the request fit (recovery_mode: error)."""


class AuthenticationError(GatewayError):
    """No valid gateway key (only when `auth.keys` is configured)."""


class PermissionDeniedError(GatewayError):
    """A valid gateway key that may not use this model."""


class NotFoundError(GatewayError):
    """A path the gateway does not serve."""


class ModelNotFoundError(NotFoundError):
    """The `model` is not configured and there is no default route."""


class BodyTooLargeError(GatewayError):
    """The body is over `server.max_body_bytes`."""


class RequestTimeoutError(GatewayError):
    """The client did not finish sending its body in time."""


class TooManyRequestsError(GatewayError):
    """The tenant has too many upstream requests in flight."""


class UpstreamError(GatewayError):
    """The upstream failed in a way that is not an HTTP answer (protocol error, dropped stream)."""


class UpstreamUnreachableError(UpstreamError):
    """The upstream refused or dropped the connection before answering."""


class UpstreamTimeoutError(GatewayError):
    """The upstream did not answer (or stalled) within the configured timeout."""


class ShuttingDownError(GatewayError):
    """The server's shutdown deadline passed before this response could finish."""


# class -> (status, type, default code). Subclasses not listed inherit their parent's row.
ERROR_TABLE: dict[type[GatewayError], tuple[int, str, str | None]] = {
    GatewayError: (500, "server_error", None),
    InvalidRequestError: (400, "invalid_request_error", None),
    ContextLengthExceededError: (400, "invalid_request_error", "context_length_exceeded"),
    AuthenticationError: (401, "authentication_error", "invalid_api_key"),
    PermissionDeniedError: (403, "permission_error", "model_not_allowed"),
    NotFoundError: (404, "invalid_request_error", "not_found"),
    ModelNotFoundError: (404, "invalid_request_error", "model_not_found"),
    BodyTooLargeError: (413, "invalid_request_error", "request_too_large"),
    RequestTimeoutError: (408, "invalid_request_error", "request_timeout"),
    TooManyRequestsError: (429, "rate_limit_error", "too_many_concurrent_requests"),
    UpstreamError: (502, "upstream_error", "bad_gateway"),
    UpstreamUnreachableError: (502, "upstream_error", "upstream_unreachable"),
    UpstreamTimeoutError: (504, "upstream_error", "upstream_timeout"),
    ShuttingDownError: (503, "server_error", "shutting_down"),
}


def _lookup(cls: type[GatewayError]) -> tuple[int, str, str | None]:
    for klass in cls.__mro__:
        row = ERROR_TABLE.get(klass)  # type: ignore[arg-type]
        if row is not None:
            return row
    return ERROR_TABLE[GatewayError]


def status_of_code(code: object) -> int:
    """The status the table gives an error `code` (an error event in a stream carries only its
    code); 502 for a code the gateway does not make: the upstream failed."""
    for status, _, known in ERROR_TABLE.values():
        if known is not None and known == code:
            return status
    return 502
