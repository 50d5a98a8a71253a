"""Which upstream error bodies mean "the prompt does not fit the model's context window".

The reactive path (design D6) retries with a harder-compressed request only when the upstream
said the *context window* was exceeded; every other failure is relayed or retried as it is. So
this module keeps one rule: a body is a context error only when a row of `SIGNATURES` recognises
it, and each row is data (statuses, error code, error type, message pattern, how to read the
numbers) with a verbatim fixture in `tests/fixtures/context_errors/` that says where it came from.

What the numbers mean, whatever the provider's wording:

- `limit` is the window the upstream enforces (never a guess: None unless the body states it).
- `requested` is the *input* side as the upstream counted it: messages, tool definitions and
  functions together, never the completion reservation. This is what the gateway compares with
  its own estimate to learn the provider's tokenizer.
- `reserved_output` is the completion reservation the body says it added (`max_tokens`), if any.

Deliberately *not* context errors (each has a near-miss test):

- Output-cap errors that do not depend on the prompt ("max_tokens is too large ... supports at
  most 16384 completion tokens", Anthropic's "max_tokens: 8192 > 4096, which is the maximum
  allowed number of output tokens", Bedrock's "The maximum tokens you requested exceeds the model
  limit"): compressing the prompt cannot fix them. In contrast, "prompt + max_tokens exceeds the
  window" (vLLM's "'max_tokens' ... is too large ... your request has N input tokens", OpenRouter's
  "(N of text input, M in the output)") *is* a context error: the body states the window, and the
  caller decides from `requested` and `reserved_output` whether a smaller prompt can help.
- Request-size errors (Anthropic's 413 `request_too_large`, OpenAI's "string too long"), rate
  limits (429), server errors (5xx; llama.cpp is the one exception: before it answered 400 it
  answered 500 with `exceed_context_size_error`, which is unambiguous), vLLM's "max_tokens must
  be at least 1, got -186" (it names neither window nor prompt), and any 200 completion, such as
  llama.cpp's `finish_reason: "length"` when the prompt fits but the answer does not.

Rows are per wire format, not per company: Azure OpenAI's body is byte-for-byte OpenAI's, and
llama-cpp-python's is OpenAI's older wording once `max_tokens` is set, so both are reported as
"openai" (the row's `providers` say so); only llama-cpp-python's "None in the completion" (no
`max_tokens`) is told apart. The handling is the same either way.

Status 200 is still examined, because a streaming upstream may answer 200 and then send
`data: {"error": {...}}` before the first chunk: pass that event's payload (the
`data:` prefix is tolerated). A completion body never matches: it has no error envelope.

`classify` never raises: bodies over `MAX_BODY_BYTES`, non-JSON, invalid UTF-8 and odd JSON types
all give None, and a cheap keyword scan rejects ordinary bodies before any JSON is parsed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import orjson

MAX_BODY_BYTES = 256 * 1024  # a context error is a few hundred bytes; litellm's nest a few KiB
_MAX_MESSAGE_CHARS = 32 * 1024


@dataclass(frozen=True, slots=True)
class ContextError:
    """A recognised context-window error and the numbers its body states."""

    signature: str  # the SIGNATURES row that matched, e.g. "openai", "llamacpp"
    limit: int | None  # the window the upstream enforces, when stated
    requested: int | None  # the prompt (input) tokens the upstream counted, when stated
    reserved_output: int | None = None  # the completion reservation it added, when stated


def beyond_window(
    first: ContextError, stated: int | None, window: int | None, counted: int, output: int | None
) -> str:
    """What the client is told when its request still overflowed after every retry: the real
    window (the one the upstream stated, else that it stated none and the model's window) and
    the request's real size (as the upstream counted it first, else the gateway's count), never
    the figures of the tighter window a retry was compacted against (design D15.6)."""
    if stated:
        limit = f"the upstream's window is {stated} tokens"
    else:
        known = f"; the model's window here is {window} tokens" if window else ""
        limit = f"the upstream refused it as too long without saying its window{known}"
    if first.requested is not None:
        size = f"it counted {first.requested} tokens in this request"
    else:
        size = f"this request is about {counted} tokens by the gateway's count"
    asked = f" (max_tokens {output})" if output else ""
    return (
        f"The request does not fit the model's context window: {limit}, and {size}{asked}. "
        "Compacted as far as the model's policy allows (the system prompts and the latest user "
        "message are never dropped), it still does not fit; shorten the latest message or the "
        "system prompt, or lower max_tokens."
    )


@dataclass(frozen=True, slots=True)
class ErrorView:
    """The parts of an error body that signatures look at, whatever the provider's envelope.

    `shape` is "envelope" for `{"error": {...}}` (also inside a JSON list, as Gemini sends it),
    "string" for `{"error": "text"}` and "bare" for a top-level `{"message": ...}` (Bedrock,
    vLLM's older `{"object": "error", ...}`).
    """

    shape: str
    message: str
    code: str | None
    type: str | None
    fields: Mapping[str, object]


Numbers = tuple[int | None, int | None, int | None]  # limit, requested, reserved_output


@dataclass(frozen=True, slots=True)
class Signature:
    """One provider's context-window error: how to recognise it and how to read its numbers."""

    name: str
    providers: tuple[str, ...]  # upstreams known to send this exact wire format
    statuses: frozenset[int]
    shapes: frozenset[str]
    code: str | None  # required error code (compared as text), None = any
    type: str | None  # required error type, None = any
    pattern: re.Pattern[str]  # must be found in the message
    parse: Callable[[ErrorView], Numbers]
    source: str  # where the wire format is documented or observed (see the fixture too)


# Numbers are bounded to 12 digits so int() can never hit Python's digit limit.
_N = r"(?<!\d)(\d{1,12})(?!\d)"


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _first(patterns: tuple[re.Pattern[str], ...], message: str) -> int | None:
    for pattern in patterns:
        match = pattern.search(message)
        if match is not None:
            return _int(match.group(1))
    return None


_LIMIT = (
    re.compile(r"maximum context length is " + _N + " tokens", re.I),
    re.compile(r"configured limit of " + _N + " tokens", re.I),
    re.compile(r"maximum model length of " + _N, re.I),
    re.compile(r"\(context length " + _N + r"\)", re.I),
)
_INPUT = (
    re.compile(r"resulted in " + _N + " tokens", re.I),  # messages + functions: all input
    re.compile(r"your request has " + _N + " input tokens", re.I),
    re.compile(r"prompt contains at least " + _N + " input tokens", re.I),
    re.compile(r"prompt \((?:total )?length " + _N + r"\)", re.I),
)
_TOTAL = (re.compile(r"you requested " + _N + " tokens", re.I),)
_PARTS = (re.compile(_N + r" in (?:the messages|your prompt)", re.I),)
_OUTPUT = (
    re.compile(_N + r" (?:in|for) the completion", re.I),
    re.compile(r"'max_tokens' or 'max_completion_tokens' is too large: " + _N, re.I),
    re.compile(r"you requested " + _N + " output tokens", re.I),
)
_FUNCTIONS = re.compile(_N + r" in the functions", re.I)


def parse_openai_family(view: ErrorView) -> Numbers:
    """OpenAI's wordings, which vLLM, llama-cpp-python and OpenAI-compatible servers copy."""
    message = view.message
    limit = _first(_LIMIT, message)
    output = _first(_OUTPUT, message)
    requested = _first(_INPUT, message)
    if requested is None:
        total = _first(_TOTAL, message)
        if total is not None and output is not None and total >= output:
            requested = total - output
        else:
            parts = _first(_PARTS, message)
            functions = _int(m.group(1)) if (m := _FUNCTIONS.search(message)) else None
            if parts is not None:
                requested = parts + (functions or 0)
            elif total is not None and output is None:
                requested = total
    return limit, requested, output


_ANTHROPIC_PROMPT = re.compile(r"prompt is too long: " + _N + " tokens > " + _N + " maximum", re.I)
_ANTHROPIC_SUM = re.compile(
    r"input length and .?max_tokens.? exceed context limit: " + _N + r" \+ " + _N + " > " + _N,
    re.I,
)


def parse_anthropic(view: ErrorView) -> Numbers:
    """ "prompt is too long: N tokens > M maximum" or "... exceed context limit: N + O > M"."""
    if match := _ANTHROPIC_PROMPT.search(view.message):
        return _int(match.group(2)), _int(match.group(1)), None
    if match := _ANTHROPIC_SUM.search(view.message):
        return _int(match.group(3)), _int(match.group(1)), _int(match.group(2))
    return None, None, None


_GEMINI_COUNT = re.compile(r"input token count \(" + _N + r"\)", re.I)
_GEMINI_LIMIT = re.compile(r"maximum number of tokens allowed \(" + _N + r"\)", re.I)


def parse_gemini(view: ErrorView) -> Numbers:
    """Gemini 2.0 states the count; 2.5 sometimes states only the limit."""
    requested = _int(m.group(1)) if (m := _GEMINI_COUNT.search(view.message)) else None
    limit = _int(m.group(1)) if (m := _GEMINI_LIMIT.search(view.message)) else None
    return limit, requested, None


_OPENROUTER_LIMIT = re.compile(r"maximum context length is " + _N + " tokens", re.I)
_OPENROUTER_ABOUT = re.compile(r"requested about " + _N + " tokens", re.I)
_OPENROUTER_INPUT = re.compile(_N + r" of [a-z ]{1,20}?input", re.I)
_OPENROUTER_OUTPUT = re.compile(_N + r" in the output", re.I)


def parse_openrouter(view: ErrorView) -> Numbers:
    """ "... requested about T tokens (A of text input, B of tool input, C in the output)"."""
    message = view.message
    limit = _int(m.group(1)) if (m := _OPENROUTER_LIMIT.search(message)) else None
    output = _int(m.group(1)) if (m := _OPENROUTER_OUTPUT.search(message)) else None
    inputs = [int(m.group(1)) for m in _OPENROUTER_INPUT.finditer(message)]
    if inputs:
        return limit, sum(inputs), output
    total = _int(m.group(1)) if (m := _OPENROUTER_ABOUT.search(message)) else None
    if total is not None and output is not None and total >= output:
        return limit, total - output, output
    return limit, total, output


_LLAMACPP_MESSAGE = re.compile(
    r"request \(" + _N + r" tokens\) exceeds the available context size \(" + _N + " tokens",
    re.I,
)
_LLAMACPP_PROMPT_FIELD = re.compile(r'"n_prompt_tokens"\s*:\s*' + _N)
_LLAMACPP_CTX_FIELD = re.compile(r'"n_ctx"\s*:\s*' + _N)


def _field(view: ErrorView, name: str) -> int | None:
    value = view.fields.get(name)
    return value if type(value) is int and 0 <= value < 10**12 else None


def parse_llamacpp(view: ErrorView) -> Numbers:
    """The structured fields first, then the same numbers inside the message text.

    The text form covers Ollama, which relays llama.cpp's JSON body as a string.
    """
    limit, requested = _field(view, "n_ctx"), _field(view, "n_prompt_tokens")
    message = view.message
    if match := _LLAMACPP_MESSAGE.search(message):
        requested = requested if requested is not None else _int(match.group(1))
        limit = limit if limit is not None else _int(match.group(2))
    if requested is None and (m := _LLAMACPP_PROMPT_FIELD.search(message)):
        requested = _int(m.group(1))
    if limit is None and (m := _LLAMACPP_CTX_FIELD.search(message)):
        limit = _int(m.group(1))
    return limit, requested, None


def parse_bedrock(view: ErrorView) -> Numbers:
    """Bedrock's own message states nothing; Claude's message relayed through it does."""
    return parse_anthropic(view)


def parse_nested(view: ErrorView) -> Numbers:
    """litellm wraps the provider's body as text: read it with every other parser."""
    for parse in (
        parse_anthropic,
        parse_llamacpp,
        parse_gemini,
        parse_openrouter,
        parse_openai_family,
    ):
        numbers = parse(view)
        if numbers[0] is not None or numbers[1] is not None:
            return numbers
    return None, None, None


_GENERAL = frozenset({200, 400, 413, 422})
_ENVELOPE = frozenset({"envelope"})
_ANY_SHAPE = frozenset({"envelope", "string", "bare"})


def _p(text: str) -> re.Pattern[str]:
    return re.compile(text, re.I)


# First match wins, so the specific rows come before the ones they resemble: llama-cpp-python
# before OpenAI (same code, telltale "None in the completion"), litellm before the bodies it
# nests, the generic OpenAI-compatible wording last.
SIGNATURES: tuple[Signature, ...] = (
    Signature(
        name="llamacpp",
        providers=("llama.cpp server", "xllamacpp"),
        statuses=_GENERAL | {500},
        shapes=_ENVELOPE,
        code=None,
        type="exceed_context_size_error",
        pattern=_p(""),
        parse=parse_llamacpp,
        source="https://github.com/ggml-org/llama.cpp/pull/15780 (type and fields)",
    ),
    Signature(
        name="ollama",
        providers=("ollama",),
        statuses=_GENERAL,
        shapes=_ANY_SHAPE,
        code=None,
        type=None,
        pattern=_p(r"exceed_context_size_error|exceeds the available context size"),
        parse=parse_llamacpp,
        source="https://github.com/ollama/ollama/issues/16800 (llama.cpp body relayed as text)",
    ),
    Signature(
        name="litellm",
        providers=("litellm proxy", "litellm library"),
        statuses=_GENERAL,
        shapes=_ANY_SHAPE,
        code=None,
        type=None,
        pattern=_p(r"ContextWindowExceededError"),
        parse=parse_nested,
        source="https://github.com/BerriAI/litellm/issues/7259 (proxy body)",
    ),
    Signature(
        name="anthropic",
        providers=("anthropic",),
        statuses=_GENERAL,
        shapes=_ENVELOPE,
        code=None,
        type=None,
        pattern=_p(r"prompt is too long: \d+ tokens > \d+ maximum|exceed context limit: \d+ \+"),
        parse=parse_anthropic,
        source="https://docs.claude.com/en/api/errors (shape); exe.dev issue 62 (message)",
    ),
    Signature(
        name="bedrock",
        providers=("aws bedrock",),
        statuses=_GENERAL,
        shapes=frozenset({"bare"}),
        code=None,
        type=None,
        pattern=_p(
            r"input is too long for requested model|prompt is too long: \d+ tokens > \d+ maximum"
            r"|exceed context limit: \d+ \+"
        ),
        parse=parse_bedrock,
        source="ValidationException {message}; aws-samples/assessment-generator issue 2",
    ),
    Signature(
        name="gemini",
        providers=("gemini", "gemini openai-compatible endpoint", "vertex ai"),
        statuses=_GENERAL,
        shapes=_ENVELOPE,
        code=None,
        type=None,
        pattern=_p(r"input token count.{0,40}exceeds the maximum number of tokens allowed"),
        parse=parse_gemini,
        source="https://github.com/google-gemini/gemini-cli/issues/4118",
    ),
    Signature(
        name="openrouter",
        providers=("openrouter",),
        statuses=_GENERAL,
        shapes=_ENVELOPE,
        code=None,
        type=None,
        pattern=_p(r"this endpoint's maximum context length is \d+ tokens"),
        parse=parse_openrouter,
        source="https://github.com/topoteretes/cognee/issues/1061",
    ),
    Signature(
        name="vllm",
        providers=("vllm",),
        statuses=_GENERAL,
        shapes=frozenset({"envelope", "bare"}),
        code=None,
        type="BadRequestError",
        pattern=_p(
            r"maximum context length is \d+ tokens|longer than the maximum model length"
            r"|too long to fit into the model"
        ),
        parse=parse_openai_family,
        source="https://github.com/vllm-project/vllm/issues/34340; vllm entrypoints renderer",
    ),
    Signature(
        name="llama-cpp-python",
        providers=("llama-cpp-python server",),
        statuses=_GENERAL,
        shapes=_ENVELOPE,
        code="context_length_exceeded",
        type=None,
        pattern=_p(r"\d+ in the messages, None in the completion|None for the completion"),
        parse=parse_openai_family,
        source="abetlen/llama-cpp-python llama_cpp/server/errors.py",
    ),
    Signature(
        name="openai",
        providers=("openai", "azure openai"),
        statuses=_GENERAL,
        shapes=_ENVELOPE,
        code="context_length_exceeded",
        type=None,
        pattern=_p(""),
        parse=parse_openai_family,
        source="https://github.com/chathub-dev/chathub/issues/126; MicrosoftDocs/azure-docs 114113",
    ),
    Signature(
        name="openai_compatible",
        providers=("deepseek", "fastchat", "other servers copying OpenAI's wording"),
        statuses=_GENERAL,
        shapes=frozenset({"envelope", "bare"}),
        code=None,
        type=None,
        pattern=_p(r"this model's maximum context length is \d+ tokens"),
        parse=parse_openai_family,
        source="https://github.com/evalstate/fast-agent/issues/621 (DeepSeek)",
    ),
)

_STATUSES = frozenset().union(*(s.statuses for s in SIGNATURES))

# Cheap pre-check on the raw bytes: a body without any of these cannot match any row.
# Lower-casing and substring search run in C; a case-insensitive regex alternation is ~50x slower.
_KEYWORDS = (
    b"context_length_exceeded", b"maximum context length", b"exceed_context_size_error",
    b"available context size", b"prompt is too long", b"exceed context limit",
    b"input token count", b"input is too long", b"contextwindowexceeded", b"configured limit of",
    b"maximum model length", b"too long to fit into the model",
)  # fmt: skip


def _has_keyword(body: bytes) -> bool:
    lowered = body.lower()
    return any(keyword in lowered for keyword in _KEYWORDS)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _label(value: object) -> str | None:
    """An error code as text: OpenAI sends strings, vLLM and llama.cpp send integers."""
    if isinstance(value, str):
        return value
    if type(value) is int:
        return str(value)
    return None


def view_of(document: object) -> ErrorView | None:
    """Normalise the provider envelopes listed on `ErrorView`; None if it is no error body."""
    if isinstance(document, list) and document:
        document = document[0]
    if not isinstance(document, dict):
        return None
    error = document.get("error")
    if isinstance(error, dict):
        return ErrorView(
            shape="envelope",
            message=(_text(error.get("message")) or "")[:_MAX_MESSAGE_CHARS],
            code=_label(error.get("code")),
            type=_text(error.get("type")) or _text(error.get("status")),  # Gemini: status
            fields=error,
        )
    if isinstance(error, str):
        return ErrorView("string", error[:_MAX_MESSAGE_CHARS], None, None, document)
    message = _text(document.get("message")) or _text(document.get("Message"))
    if message is None:
        return None
    return ErrorView(
        shape="bare",
        message=message[:_MAX_MESSAGE_CHARS],
        code=_label(document.get("code")),
        type=_text(document.get("type")),
        fields=document,
    )


def _matches(signature: Signature, status: int, view: ErrorView) -> bool:
    return (
        status in signature.statuses
        and view.shape in signature.shapes
        and (signature.code is None or view.code == signature.code)
        and (signature.type is None or view.type == signature.type)
        and signature.pattern.search(view.message) is not None
    )


def _document(body: bytes) -> object:
    stripped = body.strip()
    if stripped.startswith(b"data:"):  # one SSE event's line, as a stream sends it
        stripped = stripped[5:].split(b"\n", 1)[0].strip()
    try:
        return orjson.loads(stripped)
    except orjson.JSONDecodeError:
        return None


def classify(status: int, body: bytes) -> ContextError | None:
    """Return the context error this upstream response states, or None if it is anything else."""
    if status not in _STATUSES or len(body) > MAX_BODY_BYTES:
        return None
    if not _has_keyword(body):
        return None
    view = view_of(_document(body))
    if view is None:
        return None
    for signature in SIGNATURES:
        if _matches(signature, status, view):
            limit, requested, output = signature.parse(view)
            return ContextError(signature.name, limit, requested, output)
    return None
