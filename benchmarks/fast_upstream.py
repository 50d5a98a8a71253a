"""A fast fake upstream for benchmarks: raw asyncio protocol + httptools, no framework.

    python -m benchmarks.fast_upstream --port 0                        # prints "READY <port>"
    python -m benchmarks.fast_upstream --port 0 --reject-above 32768   # emergency mode

It must never be the bottleneck, so it does almost nothing: every POST gets the same small
`chat.completion` JSON body (prepared once, with a usage block), or, when the body says
`"stream": true`, a 200 `text/event-stream` of `--chunks` OpenAI chunk events plus
`data: [DONE]`, with real SSE framing in HTTP/1.1 chunked encoding, no sleeps. A POST whose path
ends in `/responses` or `/messages` (query aside) gets the same in that API's shape instead
(`benchmarks.agent_answers`: a Responses or Anthropic Messages JSON body, or its SSE events).
Whether a body streams is found with a byte search for the key `"stream"` (in JSON text a key's
quotes are never escaped, so text inside messages cannot match). Any GET gets a models list (a
HEAD its headers). Keep-alive as the client asks.

Emergency mode (`--reject-above BYTES`): a POST whose body is larger than BYTES is answered with
OpenAI's 400 `context_length_exceeded` body, once per conversation: the conversation is named by
the `x-bench-conversation` request header, and later requests of the same conversation are
accepted. Without that header every request above the limit is rejected.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import sys
from typing import Any

import httptools
import orjson

from . import agent_answers

MODEL = "bench-upstream"
CONTEXT_ERROR = {
    "error": {
        "message": (
            "This model's maximum context length is 8192 tokens. However, your messages resulted "
            "in 9000 tokens. Please reduce the length of the messages."
        ),
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
_MAX_CONVERSATIONS = 100_000


def _response(status: bytes, content_type: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\ncontent-type: "
        + content_type
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


def completion_json() -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-bench0000000000000000000000",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": MODEL,
            "system_fingerprint": "fp_bench",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "The capital of France is Paris.",
                        "refusal": None,
                    },
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 30, "completion_tokens": 8, "total_tokens": 38},
        }
    )


def stream_events(chunks: int) -> list[bytes]:
    """`chunks` SSE events (role, content pieces, finish) and `[DONE]`, each an HTTP chunk."""
    head: dict[str, Any] = {
        "id": "chatcmpl-bench0000000000000000000000",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": MODEL,
        "system_fingerprint": "fp_bench",
    }

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"

    count = max(2, chunks)
    events = [event({"role": "assistant", "content": ""})]
    events += [event({"content": f" word{i}"}) for i in range(1, count - 1)]
    events.append(event({}, "stop"))
    events.append(b"data: [DONE]\n\n")
    return _chunked(events)


def _chunked(events: list[bytes]) -> list[bytes]:
    """Each SSE event as one HTTP/1.1 chunk."""
    return [b"%x\r\n%b\r\n" % (len(e), e) for e in events]


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
LAST_CHUNK = b"0\r\n\r\n"


def wants_stream(body: bytes) -> bool:
    """True if the JSON body has a top-level-looking `"stream": true` (no full parse)."""
    start = 0
    for _ in range(8):  # bounded: a body names "stream" a handful of times at most
        index = body.find(b'"stream"', start)
        if index < 0:
            return False
        rest = body[index + 8 : index + 24].lstrip()
        if rest[:1] == b":" and rest[1:].lstrip().startswith(b"true"):
            return True
        start = index + 8
    return False


class Answers:
    """The prepared responses and the emergency-mode state shared by all connections."""

    def __init__(self, chunks: int, reject_above: int | None) -> None:
        self.ok = _response(b"200 OK", b"application/json", completion_json())
        self.stream = stream_events(chunks)
        # (JSON answer, SSE chunks) by the last segment of the path: the agent APIs
        self.by_api: dict[bytes, tuple[bytes, list[bytes]]] = {
            b"responses": (
                _response(
                    b"200 OK", b"application/json", orjson.dumps(agent_answers.responses_body())
                ),
                _chunked(agent_answers.responses_events()),
            ),
            b"messages": (
                _response(
                    b"200 OK", b"application/json", orjson.dumps(agent_answers.messages_body())
                ),
                _chunked(agent_answers.messages_events()),
            ),
        }
        self.models = _response(
            b"200 OK",
            b"application/json",
            orjson.dumps(
                {
                    "object": "list",
                    "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "bench"}],
                }
            ),
        )
        self.context_error = _response(
            b"400 Bad Request", b"application/json", orjson.dumps(CONTEXT_ERROR)
        )
        self.bad_request = _response(b"400 Bad Request", b"text/plain", b"bad request")
        self.reject_above = reject_above
        self.rejected: set[bytes] = set()
        self.requests = 0

    def rejects(self, body: bytes, conversation: bytes | None) -> bool:
        if self.reject_above is None or len(body) <= self.reject_above:
            return False
        if conversation is None:
            return True
        if conversation in self.rejected:
            return False
        if len(self.rejected) >= _MAX_CONVERSATIONS:
            self.rejected.clear()
        self.rejected.add(conversation)
        return True


class Connection(asyncio.Protocol):
    """One client connection: httptools parses, `on_message_complete` answers at once."""

    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.body: list[bytes] = []
        self.conversation: bytes | None = None
        self.api = b""  # the path's last segment: b"responses", b"messages", ...

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is None:
                return
            self.transport.write(self.answers.bad_request)
            self.transport.close()

    # httptools callbacks

    def on_message_begin(self) -> None:
        self.body = []
        self.conversation = None
        self.api = b""

    def on_url(self, url: bytes) -> None:
        self.api = url.partition(b"?")[0].rstrip(b"/").rpartition(b"/")[2]

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) == 20 and name.lower() == b"x-bench-conversation":
            self.conversation = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        answers = self.answers
        answers.requests += 1
        method = self.parser.get_method()
        if method == b"HEAD":  # the headers a GET would get, and no body (RFC 9110 §9.3.2)
            transport.write(answers.models.partition(b"\r\n\r\n")[0] + b"\r\n\r\n")
        elif method != b"POST":
            transport.write(answers.models)
        else:
            body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
            ok, events = answers.by_api.get(self.api) or (answers.ok, answers.stream)
            if answers.rejects(body, self.conversation):
                transport.write(answers.context_error)
            elif wants_stream(body):
                transport.write(STREAM_HEAD + events[0])
                for event in events[1:]:
                    transport.write(event)
                transport.write(LAST_CHUNK)
            else:
                transport.write(ok)
        self.body = []
        if not self.parser.should_keep_alive():
            transport.close()


async def serve(host: str, port: int, chunks: int, reject_above: int | None) -> None:
    loop = asyncio.get_running_loop()
    answers = Answers(chunks, reject_above)
    server = await loop.create_server(lambda: Connection(answers), host, port, backlog=1024)
    bound = server.sockets[0].getsockname()[1]
    print(f"READY {bound}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--chunks", type=int, default=20, help="SSE events per streamed answer")
    parser.add_argument(
        "--reject-above",
        type=int,
        default=None,
        metavar="BYTES",
        help="emergency mode: 400 context_length_exceeded above this body size",
    )
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:
        uvloop = None
    runner = uvloop.run if uvloop is not None else asyncio.run
    try:
        runner(serve(args.host, args.port, args.chunks, args.reject_above))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
