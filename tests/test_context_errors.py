"""gateway.wire.context_errors: every provider fixture is recognised with its numbers, look-alikes are
not, and no input can make `classify` raise."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.wire.context_errors import MAX_BODY_BYTES, SIGNATURES, ContextError, classify

FIXTURES = Path(__file__).parent / "fixtures" / "context_errors"


def _meta(path: Path) -> dict[str, str]:
    source = path.with_suffix(".source.txt").read_text()
    return dict(line.split(": ", 1) for line in source.splitlines() if ": " in line)


def _number(text: str) -> int | None:
    return None if text == "-" else int(text)


FIXTURE_PATHS = sorted(FIXTURES.glob("*.json"))


def test_fixtures_exist_and_every_signature_has_one() -> None:
    covered = {_meta(path)["signature"] for path in FIXTURE_PATHS}
    assert covered == {signature.name for signature in SIGNATURES}


@pytest.mark.parametrize("path", FIXTURE_PATHS, ids=lambda p: p.stem)
def test_fixture_is_classified_with_its_numbers(path: Path) -> None:
    meta = _meta(path)
    assert meta["source"].strip() and meta["provenance"].strip()
    expected = ContextError(
        signature=meta["signature"],
        limit=_number(meta["limit"]),
        requested=_number(meta["requested"]),
        reserved_output=_number(meta["reserved_output"]),
    )
    assert classify(int(meta["status"]), path.read_bytes()) == expected


@pytest.mark.parametrize("path", FIXTURE_PATHS, ids=lambda p: p.stem)
def test_fixture_as_an_in_stream_error_event(path: Path) -> None:
    """A streaming upstream may answer 200 and send the error as the first SSE event."""
    event = b"data: " + orjson.dumps(orjson.loads(path.read_bytes())) + b"\n\n"
    result = classify(200, event)
    assert result is not None and result.signature == _meta(path)["signature"]


def _openai(message: str, code: str | None, param: str | None = None) -> bytes:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return orjson.dumps({"error": error})


OPENAI_CONTEXT = (FIXTURES / "openai.json").read_bytes()

NEAR_MISSES = {
    # 400s about something else
    "tool message without a preceding tool call": (
        400,
        _openai(
            "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
            "message with 'tool_calls'.",
            None,
            "messages.[2].role",
        ),
    ),
    "unknown tool_call_id": (
        400,
        _openai(
            "Invalid parameter: 'tool_call_id' of 'call_abc' not found in 'tool_calls' of previous "
            "message.",
            None,
            "messages.[3].tool_call_id",
        ),
    ),
    "openai output cap (prompt fits)": (
        400,
        _openai(
            "max_tokens is too large: 100000. This model supports at most 16384 completion tokens, "
            "whereas you provided 100000.",
            "invalid_value",
            "max_tokens",
        ),
    ),
    "openai per-message size cap": (
        400,
        _openai(
            "Invalid 'messages[1].content': string too long. Expected a string with maximum length "
            "10485760, but got a string with length 10485761 instead.",
            "string_above_max_length",
        ),
    ),
    # continuedev/continue issue 4225, verbatim
    "anthropic output cap": (
        400,
        b'{"type":"error","error":{"type":"invalid_request_error",'
        b'"message":"max_tokens: 8192 > 4096, which is the maximum allowed number of output '
        b'tokens for claude-3-haiku-20240307"}}',
    ),
    "anthropic request_too_large (bytes, not tokens)": (
        413,
        b'{"type":"error","error":{"type":'
        b'"request_too_large","message":"Request exceeds the maximum allowed number of bytes."}}',
    ),
    # charmbracelet/crush issue 946, verbatim
    "bedrock output cap": (
        400,
        b'{"message":"The maximum tokens you requested exceeds the model limit of 32768"}',
    ),
    # vllm-project/vllm issue 1351, verbatim
    "vllm negative max_tokens": (
        400,
        b'{"object":"error","message":"max_tokens must be at least '
        b'1, got -53.","type":"invalid_request_error","param":null,"code":null}',
    ),
    "gemini invalid argument": (
        400,
        b'{"error":{"code":400,"message":"Request contains an invalid'
        b' argument.","status":"INVALID_ARGUMENT"}}',
    ),
    "litellm bad request that is not about context": (
        400,
        orjson.dumps(
            {
                "error": {
                    "message": "litellm.BadRequestError: OpenAIException - Invalid parameter: messages with "
                    "role 'tool' must be a response to a preceeding message with 'tool_calls'.",
                    "type": None,
                    "param": None,
                    "code": "400",
                }
            }
        ),
    ),
    # rate limits and server errors, even when they mention context
    "openai rate limit": (
        429,
        _openai(
            "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit "
            "30000, Used 29000, Requested 5000. Please try again in 8s.",
            "rate_limit_exceeded",
        ),
    ),
    "429 carrying a context body": (429, OPENAI_CONTEXT),
    "500 carrying a context body": (500, OPENAI_CONTEXT),
    "502 carrying a context body": (502, OPENAI_CONTEXT),
    "503 overloaded": (
        503,
        b'{"error":{"message":"The engine is currently overloaded","type":'
        b'"server_error","param":null,"code":null}}',
    ),
    "anthropic 529": (
        529,
        b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}',
    ),
    "404 carrying a context body": (404, OPENAI_CONTEXT),
    # 200 completions: llama.cpp's finish_reason "length" when prompt + max_tokens overflows
    "llama.cpp 200 with finish_reason length": (
        200,
        b'{"choices":[{"finish_reason":"length",'
        b'"index":0,"message":{"role":"assistant","content":"The capital of France is"}}],'
        b'"created":1761000000,"model":"smollm2","object":"chat.completion","usage":'
        b'{"completion_tokens":16,"prompt_tokens":2030,"total_tokens":2046},"id":"chatcmpl-x"}',
    ),
    "completion that talks about the error": (
        200,
        orjson.dumps(
            {
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {
                            "role": "assistant",
                            "content": "context_length_exceeded means: This model's maximum context length is 10 tokens",
                        },
                    }
                ]
            }
        ),
    ),
    "stream chunk with finish_reason length": (
        200,
        b'data: {"id":"x","object":'
        b'"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}',
    ),
    # bodies that are not error JSON
    "html error page": (400, b"<html><body>400: maximum context length exceeded</body></html>"),
    "plain text": (400, b"prompt is too long: 5 tokens > 3 maximum"),
    "empty": (400, b""),
    "json string": (400, b'"context_length_exceeded"'),
    "error with a null message": (
        400,
        b'{"error":{"message":null,"type":"context_length","code":"maximum context length"}}',
    ),
}


@pytest.mark.parametrize("case", sorted(NEAR_MISSES))
def test_near_miss_is_not_a_context_error(case: str) -> None:
    status, body = NEAR_MISSES[case]
    assert classify(status, body) is None


def test_oversized_body_is_not_examined() -> None:
    padding = b" " * MAX_BODY_BYTES
    assert classify(400, OPENAI_CONTEXT + padding) is None


def test_numbers_that_are_not_plain_integers_are_dropped() -> None:
    body = orjson.dumps(
        {
            "error": {
                "code": 400,
                "message": "",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": True,
                "n_ctx": 1e99,
            }
        }
    )
    assert classify(400, body) == ContextError("llamacpp", None, None)
    huge = b"9" * 5000  # longer than Python's int() digit limit
    message = b"This model's maximum context length is " + huge + b" tokens."
    body = b'{"error":{"message":"' + message + b'","code":"context_length_exceeded"}}'
    assert classify(400, body) == ContextError("openai", None, None)


def test_non_matching_bodies_are_cheap() -> None:
    small = _openai("Invalid parameter: messages with role 'tool' must be a response.", None)
    started = time.perf_counter()
    for _ in range(10_000):
        classify(400, small)
    assert time.perf_counter() - started < 1.0  # ~1 µs each in practice

    big = b'{"error":{"message":"' + b"x" * (MAX_BODY_BYTES - 64) + b'"}}'
    started = time.perf_counter()
    for _ in range(20):
        classify(400, big)
    assert (time.perf_counter() - started) / 20 < 0.02


KEYWORDS = [
    "context_length_exceeded", "maximum context length is 10 tokens", "exceed_context_size_error",
    "prompt is too long: 5 tokens > 3 maximum", "input token count (5) exceeds the maximum number "
    "of tokens allowed (3)", "ContextWindowExceededError", "n_ctx", "\ud800", "None in the "
    "completion", "you requested about 12 tokens (3 of text input, 9 in the output)",
]  # fmt: skip
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.sampled_from(KEYWORDS),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "error",
                    "message",
                    "type",
                    "code",
                    "n_ctx",
                    "n_prompt_tokens",
                    "status",
                    "Message",
                ]
            )
            | st.text(),
            children,
            max_size=4,
        )
    ),
    max_leaves=20,
)
statuses = st.sampled_from([200, 400, 413, 422, 429, 500, 503]) | st.integers(-1000, 1000)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(status=statuses, body=st.binary(max_size=2048))
def test_arbitrary_bytes_never_raise(status: int, body: bytes) -> None:
    assert classify(status, body) is None or isinstance(classify(status, body), ContextError)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(status=statuses, document=json_values, prefix=st.sampled_from([b"", b"data: ", b" \n"]))
def test_arbitrary_json_never_raises(status: int, document: object, prefix: bytes) -> None:
    try:
        body = prefix + orjson.dumps(document)
    except (TypeError, orjson.JSONEncodeError):  # e.g. a lone surrogate: not encodable
        return
    result = classify(status, body)
    assert result is None or isinstance(result, ContextError)


@settings(max_examples=200)
@given(
    index=st.integers(0, len(FIXTURE_PATHS) - 1),
    cut=st.integers(0, 4096),
    flips=st.lists(st.tuples(st.integers(0, 4096), st.integers(0, 255)), max_size=6),
)
def test_damaged_fixtures_never_raise(index: int, cut: int, flips: list[tuple[int, int]]) -> None:
    body = bytearray(FIXTURE_PATHS[index].read_bytes())
    for position, value in flips:
        if body:
            body[position % len(body)] = value
    for candidate in (bytes(body), bytes(body[:cut]), bytes(body) * 3):
        result = classify(400, candidate)
        assert result is None or isinstance(result, ContextError)
