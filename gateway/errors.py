"""The gateway's failure kinds, and the one table that turns them into OpenAI error bodies.

Every failure the gateway itself reports is one of these classes; nothing else decides a status
code. The hierarchy:

    GatewayError
    ├── InvalidRequestError          400 invalid_request_error   (bad JSON, bad fields)
    │   ├── ContextLengthExceededError  400, code context_length_exceeded (recovery_mode: error)
    │   └── InvalidCompactionError      400, code invalid_encrypted_content (forged, other tenant's)
    ├── AuthenticationError          401 authentication_error
    ├── PermissionDeniedError        403 permission_error
    │   ├── OriginNotAllowedError       code origin_not_allowed (a web page's origin, CORS)
    │   └── HostNotAllowedError         code host_not_allowed (a Host no browser may use: DNS
    │                                   rebinding)
    ├── NotFoundError                404 invalid_request_error
    │   ├── ModelNotFoundError          code model_not_found
    │   └── RouteNotFoundError          no code (no endpoint at this path)
    ├── MethodNotAllowedError        405 invalid_request_error
    ├── BodyTooLargeError            413 invalid_request_error
    ├── RequestTimeoutError          408 (a client that trickles its body too slowly)
    ├── CompactionExpiredError       410 (a compaction item whose summary left the store)
    ├── TooManyRequestsError         429 rate_limit_error (per-tenant concurrency)
    │   └── TooManyFramesError          code websocket_queue_full (frames waiting on a socket)
    ├── UpstreamError                502 upstream_error
    │   ├── UpstreamUnreachableError    code upstream_unreachable
    │   └── UpstreamMalformedError      code upstream_malformed (a 2xx not in the API's format)
    ├── UpstreamTimeoutError         504 upstream_timeout
    ├── ShuttingDownError            503 (the shutdown deadline ended a response)
    ├── CompressTimeoutError         503 (POST /v1/compress past server.compress_timeout_s)
    └── StoreUnavailableError        503 (a summary the request needs is in an unreachable store)

Errors coming *from* the upstream are not in this tree: the upstream's status and body are relayed
unchanged (design D15.2). Each row also names a failure kind, the `reason` of its request's log
line.
"""

from __future__ import annotations

from typing import NamedTuple

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
        return _lookup(type(self)).status

    @property
    def error_type(self) -> str:
        return _lookup(type(self)).type

    @property
    def code(self) -> str | None:
        return self._code if self._code is not None else _lookup(type(self)).code

    def body(self) -> bytes:
        """The OpenAI error body: {"error": {"message", "type", "param", "code"}}."""
        return error_body(self.message, self.error_type, self.param, self.code)


def error_body(message: str, kind: str, param: str | None, code: str | None) -> bytes:
    """OpenAI's error envelope. The gateway's own errors get theirs from `GatewayError.body`;
    a transport that must shape a provider's refusal as an OpenAI server would uses this."""
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}})


class InvalidRequestError(GatewayError):
    """The request body is not a valid chat request."""


class ContextLengthExceededError(InvalidRequestError):
    """Nothing the policy chain could do made the request fit (recovery_mode: error)."""


class InvalidCompactionError(InvalidRequestError):
    """A compaction item claims to be the gateway's but is not valid for this caller."""


class CompactionExpiredError(GatewayError):
    """A compaction item the gateway issued, whose summary is no longer in the store."""


class StoreUnavailableError(GatewayError):
    """The store holding what the request refers to cannot be reached."""


class AuthenticationError(GatewayError):
    """No valid gateway key (only when `auth.keys` is configured)."""


class PermissionDeniedError(GatewayError):
    """A caller not allowed here: a valid gateway key that may not use this model, or an admin
    surface asked from another machine while no admin token is set."""


class OriginNotAllowedError(PermissionDeniedError):
    """A web page from an origin `server.cors_origins` does not allow."""


class HostNotAllowedError(PermissionDeniedError):
    """A browser's request by a Host name the gateway is not served as (`hosts`)."""


class NotFoundError(GatewayError):
    """A path the gateway does not serve."""


class ModelNotFoundError(NotFoundError):
    """The `model` is not configured and there is no default route."""


class RouteNotFoundError(NotFoundError):
    """No endpoint at this path (the router's own answer, which names no code)."""


class MethodNotAllowedError(GatewayError):
    """An endpoint asked with a method it does not take."""


class BodyTooLargeError(GatewayError):
    """The body is over `server.max_body_bytes`."""


class RequestTimeoutError(GatewayError):
    """The client did not finish sending its body in time."""


class TooManyRequestsError(GatewayError):
    """The tenant has too many upstream requests in flight."""


class TooManyFramesError(TooManyRequestsError):
    """More frames wait on a Responses WebSocket than `server.websocket_queue_bytes` allows."""


class UpstreamError(GatewayError):
    """The upstream failed in a way that is not an HTTP answer (protocol error, dropped stream)."""


class UpstreamUnreachableError(UpstreamError):
    """The upstream refused or dropped the connection before answering."""


class UpstreamMalformedError(UpstreamError):
    """The upstream answered 2xx with something that is not the API's answer: not JSON,
    truncated, or not an event stream of the API (`wire.framing`)."""


class UpstreamTimeoutError(GatewayError):
    """The upstream did not answer (or stalled) within the configured timeout."""


class ShuttingDownError(GatewayError):
    """The server's shutdown deadline passed before this response could finish."""


class CompressTimeoutError(GatewayError):
    """Compacting a `/v1/compress` conversation took longer than its configured bound."""


class Row(NamedTuple):
    """What a failure kind means to the client (status, OpenAI `type`, default `code`) and to
    the operator (`reason`, the failure kind its request's log line names)."""

    status: int
    type: str
    code: str | None
    reason: str


# class -> its row. Subclasses not listed inherit their parent's row.
ERROR_TABLE: dict[type[GatewayError], Row] = {
    GatewayError: Row(500, "server_error", None, "internal"),
    InvalidRequestError: Row(400, "invalid_request_error", None, "bad_request"),
    ContextLengthExceededError: Row(
        400, "invalid_request_error", "context_length_exceeded", "context_overflow"
    ),
    InvalidCompactionError: Row(
        400, "invalid_request_error", "invalid_encrypted_content", "bad_request"
    ),
    CompactionExpiredError: Row(410, "invalid_request_error", "compaction_expired", "internal"),
    StoreUnavailableError: Row(503, "server_error", "store_unavailable", "internal"),
    AuthenticationError: Row(401, "authentication_error", "invalid_api_key", "auth"),
    PermissionDeniedError: Row(403, "permission_error", "model_not_allowed", "forbidden"),
    OriginNotAllowedError: Row(403, "permission_error", "origin_not_allowed", "origin_not_allowed"),
    HostNotAllowedError: Row(403, "permission_error", "host_not_allowed", "host_not_allowed"),
    NotFoundError: Row(404, "invalid_request_error", "not_found", "not_found"),
    ModelNotFoundError: Row(404, "invalid_request_error", "model_not_found", "unknown_model"),
    RouteNotFoundError: Row(404, "invalid_request_error", None, "not_found"),
    MethodNotAllowedError: Row(405, "invalid_request_error", None, "method_not_allowed"),
    BodyTooLargeError: Row(413, "invalid_request_error", "request_too_large", "body_too_large"),
    RequestTimeoutError: Row(408, "invalid_request_error", "request_timeout", "client_timeout"),
    TooManyRequestsError: Row(
        429, "rate_limit_error", "too_many_concurrent_requests", "tenant_limit"
    ),
    TooManyFramesError: Row(
        429, "rate_limit_error", "websocket_queue_full", "websocket_queue_full"
    ),
    UpstreamError: Row(502, "upstream_error", "bad_gateway", "upstream_error"),
    UpstreamUnreachableError: Row(
        502, "upstream_error", "upstream_unreachable", "upstream_unreachable"
    ),
    UpstreamMalformedError: Row(502, "upstream_error", "upstream_malformed", "upstream_malformed"),
    UpstreamTimeoutError: Row(504, "upstream_error", "upstream_timeout", "upstream_timeout"),
    ShuttingDownError: Row(503, "server_error", "shutting_down", "shutting_down"),
    CompressTimeoutError: Row(503, "server_error", "compress_timeout", "compress_timeout"),
}


def reason_of(error: GatewayError) -> str:
    """The failure kind of one of our errors, for logs."""
    return _lookup(type(error)).reason


def upstream_reason(status: int) -> str:
    """The failure kind of an error answer relayed from the upstream, by its status."""
    if status in (401, 403):
        return "upstream_auth"
    if status == 404:
        return "upstream_not_found"
    if status == 429:
        return "upstream_rate_limited"
    if status >= 500:
        return "upstream_server_error"
    return "upstream_bad_request"


def _lookup(cls: type[GatewayError]) -> Row:
    for klass in cls.__mro__:
        row = ERROR_TABLE.get(klass)
        if row is not None:
            return row
    return ERROR_TABLE[GatewayError]


def status_of_code(code: object) -> int:
    """The status the table gives an error `code` (an error event in a stream carries only its
    code); 502 for a code the gateway does not make: the upstream failed."""
    for row in ERROR_TABLE.values():
        if row.code is not None and row.code == code:
            return row.status
    return 502
