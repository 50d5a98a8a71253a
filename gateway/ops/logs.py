"""Log output: one line per request, as text (logfmt) or JSON (`server.log_format`).

The rule this module keeps: a request's line carries facts about the request (ids, sizes, times,
outcome) and never an API key, a header value or message content. Its `tenant` is a keyed
tenant's configured name, or a pseudonym for any other tenant (whose id is derived from the
client's credential or a header value), so neither a key nor its hash can be read from a log.

The request line goes to the `compactgate.access` logger with its fields attached; the text
formatter prints them as `key=value` pairs, the JSON formatter as one object per line. Every other
log record (the gateway's and uvicorn's) goes through the same formatter, so with `json` the whole
output is JSON lines. `logging_config` is handed to uvicorn, which applies it in every worker.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import logging.config
import os
import re
import time
from collections.abc import Mapping
from typing import Any

import orjson

access_log = logging.getLogger("compactgate.access")

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
MAX_VALUE_CHARS = 200  # a client-chosen string (a model name) is cut to this in a log line
_BARE = re.compile(r"[A-Za-z0-9_.:/,*@+-]+")  # printed as they are; anything else is quoted


class RequestLine:
    """A request's fields, rendered as `key=value` pairs only when a text formatter asks."""

    __slots__ = ("fields",)

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.fields = fields

    def __str__(self) -> str:
        return " ".join(f"{key}={_text_value(value)}" for key, value in self.fields.items())


def request_fields(
    *,
    request_id: str,
    api: str,
    status: int,
    tenant: str = "",
    model: str = "-",
    reason: str = "",
    stream: bool = False,
    tokens_before: int = 0,
    tokens_after: int = 0,
    tokens_bound: bool = False,
    steps: str = "none",
    retries: int = 0,
    internal_rounds: int = 0,
    total_s: float = 0.0,
    upstream_s: float = 0.0,
) -> dict[str, Any]:
    """A request line's fields, always these and in this order. `tenant` is the tenant id
    (shown as `tenant_label` shows it); `reason` is the failure kind, "-" for a success.
    `tokens_bound`: the token figures are an upper bound, not counts (a request forwarded on
    its bound whose exact count was abandoned, at shutdown); only then is the field written."""
    fields = {
        "request_id": request_id,
        "tenant": tenant_label(tenant),
        "api": api,
        "model": model,
        "status": status,
        "reason": reason or "-",
        "stream": stream,
        "tokens_before": tokens_before,
        "tokens_after": tokens_after,
        "steps": steps,
        "retries": retries,
        "internal_rounds": internal_rounds,
        "total_ms": round(total_s * 1000, 2),
        "upstream_ms": round(upstream_s * 1000, 2),
        "overhead_ms": round(max(0.0, total_s - upstream_s) * 1000, 2),
    }
    if tokens_bound:
        fields["tokens_bound"] = True
    return fields


def access_logged() -> bool:
    """Whether request lines are written at all (the access log is at INFO or below)."""
    return access_log.isEnabledFor(logging.INFO)


def log_request(fields: Mapping[str, Any]) -> None:
    """Write one request's line (INFO on `compactgate.access`)."""
    if access_log.isEnabledFor(logging.INFO):
        access_log.info("%s", RequestLine(fields), extra={"fields": fields})


def new_request_id() -> str:
    """A request id for a request that brought none: 32 random hex digits, as a uuid4's hex
    reads, taken from the OS's random source without building a UUID (a few µs a request)."""
    return os.urandom(16).hex()


@functools.lru_cache(maxsize=4096)
def tenant_label(tenant: str) -> str:
    """How a tenant id appears in a log line: a keyed tenant (`t:<name>`) by the name the config
    gives it; any other (a credential hash, a header's value) by a pseudonym that is stable across
    processes and says nothing of the credential or value it came from."""
    if tenant.startswith("t:"):
        return clip(tenant[2:])
    if not tenant:
        return "-"
    digest = hashlib.sha256(b"compactgate log tenant\x00" + tenant.encode()).hexdigest()
    return "anon-" + digest[:12]


def clip(value: str) -> str:
    """A client-chosen string, bounded for a log line."""
    return value if len(value) <= MAX_VALUE_CHARS else value[:MAX_VALUE_CHARS] + "..."


def _text_value(value: Any) -> str:
    kind = type(value)
    if kind is int:
        return str(value)
    if kind is bool:
        return "true" if value else "false"
    if kind is float:
        return f"{value:.2f}"
    text = str(value)
    if _BARE.fullmatch(text):
        return text
    return orjson.dumps(text).decode()  # quoted and escaped: no line breaks, no `=` confusion


class JsonFormatter(logging.Formatter):
    """One JSON object per record: `ts` (UTC, ISO 8601), `level`, `logger`, `pid` (which worker
    wrote it), then a request's fields, or `msg` (and `exc` with the traceback) for any other
    record."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,  # several workers write to one stderr: which one wrote it
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            out.update(fields)
        else:
            out["msg"] = record.getMessage()
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def _timestamp(created: float) -> str:
    millis = int(created * 1000) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{millis:03d}Z"


def logging_config(level: str, log_format: str) -> dict[str, Any]:
    """The `logging.config.dictConfig` for `serve` (and uvicorn's `log_config`): one handler on
    stderr with the chosen formatter; uvicorn's loggers write through it too."""
    formatter: dict[str, Any] = (
        {"()": f"{__name__}.JsonFormatter"} if log_format == "json" else {"format": TEXT_FORMAT}
    )
    uvicorn = {"handlers": [], "propagate": True}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": formatter},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "default",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["stderr"], "level": level.upper()},
        "loggers": {"uvicorn": uvicorn, "uvicorn.error": uvicorn, "uvicorn.access": uvicorn},
    }


def configure_logging(level: str, log_format: str) -> dict[str, Any]:
    """Apply `logging_config` now (so start-up warnings use it) unless the process already has
    its own logging set up (as `logging.basicConfig` would); returns it for uvicorn."""
    config = logging_config(level, log_format)
    if not logging.getLogger().handlers:
        logging.config.dictConfig(config)
        logging.captureWarnings(True)  # Python's warnings as log records too, in the same format
    return config
