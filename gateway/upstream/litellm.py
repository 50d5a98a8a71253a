"""The transport to upstreams litellm translates (`provider: litellm`): any provider litellm knows.

litellm and the openai SDK are imported on first use only (they cost seconds of start-up and
hundreds of MB), litellm with its local model registry (no network at import). A request's
chat completion is run through `litellm.acompletion`, and the answer is shaped as an
OpenAI-compatible server would have sent it (OpenAI JSON, or SSE events ending with `[DONE]`),
provider errors included, so the rest of the gateway treats it like any other upstream. The URL a
destination carries is litellm's `api_base` (empty: the provider's default). litellm's exceptions
become the gateway's own here and nowhere else.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson

from ..errors import UpstreamTimeoutError, UpstreamUnreachableError, error_body
from .transport import Timeouts

_JSON = {"content-type": "application/json"}
_SSE = {"content-type": "text/event-stream", "cache-control": "no-cache"}
_closing: set[asyncio.Future[Any]] = set()  # streams being closed (kept until done)
# Headers not passed on to litellm's provider call: ours, and the openai SDK's `x-stainless-*`,
# which are instructions to an SDK (`x-stainless-raw-response: true`, sent by a client's
# `with_raw_response`, would make litellm's own openai client return an unparsed response).
_OURS = ("x-compactgate", "x-stainless-")


def _litellm() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # never fetch it at import
    import litellm

    litellm.telemetry = False
    litellm.suppress_debug_info = True  # no banners on our stdout
    return litellm


class LitellmResponse:
    """An answer shaped like `UpstreamResponse`."""

    def __init__(self, status: int, body: bytes = b"", stream: Any = None) -> None:
        self.status = status
        self._body = body
        self._stream = stream
        self.headers: dict[str, str] = dict(_SSE if stream is not None else _JSON)
        self._iterator: Any = None
        self._finished = False

    def relay_headers(self) -> list[tuple[bytes, bytes]]:
        return [(k.encode(), v.encode()) for k, v in self.headers.items()]

    @property
    def content_type(self) -> str:
        return self.headers["content-type"]

    async def read(self) -> bytes:
        if self._stream is None:
            return self._body
        return b"".join([chunk async for chunk in self.chunks()])

    async def chunks(self) -> AsyncIterator[bytes]:
        if self._stream is None:
            if self._body:
                yield self._body
                self._body = b""
            return
        # Each call continues the one stream: the gateway peeks at the first chunk, then relays.
        if self._iterator is None:
            self._iterator = self._stream.__aiter__()
        while not self._finished:
            try:
                chunk = await self._iterator.__anext__()
            except StopAsyncIteration:
                self._finished = True
                yield b"data: [DONE]\n\n"
                return
            yield b"data: " + _dumps(chunk) + b"\n\n"

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None and hasattr(stream, "aclose"):
            task = asyncio.ensure_future(stream.aclose())
            _closing.add(task)
            task.add_done_callback(_closing.discard)

    def release(self) -> None:
        self.close()


class LitellmTransport:
    """Chat completions through litellm; nothing to hold open between requests."""

    def __init__(self, timeouts: Timeouts) -> None:
        self.timeouts = timeouts

    async def start(self) -> None:
        """Import litellm off the event loop, so that the first request does not wait for it."""
        await asyncio.to_thread(_litellm)

    async def close(self) -> None:
        return None

    async def open(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> LitellmResponse:
        """Run one chat completion through litellm (`url`: its api_base); the provider's
        refusals come back as OpenAI-style error responses."""
        import openai

        litellm = _litellm()
        payload = orjson.loads(body or b"{}")
        authorization = headers.get("authorization", "")
        api_key = authorization[7:].strip() if authorization[:7].lower() == "bearer " else None
        extra = {k: v for k, v in headers.items() if k.startswith("x-") and not k.startswith(_OURS)}
        kwargs = {k: v for k, v in payload.items() if k not in ("model", "messages")}
        try:
            result = await litellm.acompletion(
                model=payload.get("model"),
                messages=payload.get("messages"),
                api_base=url or None,
                api_key=api_key,
                extra_headers=extra or None,
                timeout=self.timeouts.total,
                num_retries=0,
                **kwargs,
            )
        except litellm.exceptions.Timeout as exc:
            raise UpstreamTimeoutError(f"The upstream did not answer in time: {exc}") from None
        except litellm.exceptions.APIConnectionError as exc:
            raise UpstreamUnreachableError(f"The upstream could not be reached: {exc}") from None
        except litellm.exceptions.ContextWindowExceededError as exc:
            return LitellmResponse(400, _error(exc, "context_length_exceeded"))
        except (openai.OpenAIError, *litellm.LITELLM_EXCEPTION_TYPES) as exc:  # provider errors
            return LitellmResponse(int(getattr(exc, "status_code", 502) or 502), _error(exc, None))
        if payload.get("stream"):
            return LitellmResponse(200, stream=result)
        return LitellmResponse(200, _dumps(result))


def _dumps(value: Any) -> bytes:
    data = value.model_dump(exclude_none=True) if hasattr(value, "model_dump") else value
    return orjson.dumps(data, default=str)


def _error(exc: Exception, code: str | None) -> bytes:
    status = int(getattr(exc, "status_code", 500) or 500)
    message = str(getattr(exc, "message", "") or exc)
    kind = "invalid_request_error" if status < 500 else "upstream_error"
    return error_body(message, kind, None, code)
