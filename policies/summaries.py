"""The one thing a policy needs from outside: summary text, asked for as data (design D7.1).

Policies stay pure by never calling a model. A step that wants a summary builds a
`SummaryRequest` (exactly which messages, which instructions, how long) and asks the
`SummarySource` it was given. The source answers from what the gateway already has:
`ready` with text, `missing` (the gateway will fetch it and run the chain again, like httpx's
auth flow yields a request and gets the response back), or `failed` (the summariser errored: the
step gives up and the chain moves on to its next step: design D7.4).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import orjson

SummaryPurpose = Literal["sandwich", "compaction", "summarize_old", "fresh_start"]
SummaryStatus = Literal["ready", "missing", "failed"]


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    """What to summarise and how; equal requests must give equal summaries."""

    purpose: SummaryPurpose
    messages: tuple[Mapping[str, Any], ...]
    instructions: str
    max_tokens: int
    previous: str | None = None  # an earlier summary being extended with `messages`
    retain_instructions: str | None = None  # what to keep verbatim (`<retain>`), when asked for
    model: str | None = None  # the step's `model` to summarise with; None: the request's
    # Summarise only `messages`, with `previous` as context: the answer is appended to it
    # (`append_summaries`). False: return `previous` rewritten to cover `messages` too.
    append: bool = False
    _canonical: bytes | None = field(default=None, compare=False, repr=False)

    def canonical(self) -> bytes:
        """Deterministic bytes describing the request (the gateway hashes it into a cache key).

        Computed once per request object: a memoised request (a rolling summary's link, asked
        for again on every later turn) is serialised only the first time. `append` is written
        only when set, so the keys of rewrite-mode requests (every summary cached before the
        flag existed) stay what they were.
        """
        if self._canonical is not None:
            return self._canonical
        fields: dict[str, Any] = {
            "purpose": self.purpose,
            "messages": list(self.messages),
            "instructions": self.instructions,
            "max_tokens": self.max_tokens,
            "previous": self.previous,
            "retain": self.retain_instructions,
            "model": self.model,
        }
        if self.append:
            fields["append"] = True
        try:
            canonical = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError as error:
            raise UnwritableError(str(error)) from None
        object.__setattr__(self, "_canonical", canonical)  # a cache of a pure function
        return canonical


class UnwritableError(ValueError):
    """A summary request whose messages cannot be written as JSON again (nested deeper than the
    encoder writes, though the parser read them): what the client sent cannot be summarised."""


@dataclass(frozen=True, slots=True)
class SummaryAnswer:
    status: SummaryStatus
    text: str = ""
    retain: str = ""  # the <retain> section, when the request asked for one

    @classmethod
    def ready(cls, text: str, retain: str = "") -> SummaryAnswer:
        return cls("ready", text, retain)


MISSING = SummaryAnswer("missing")
FAILED = SummaryAnswer("failed")


class SummarySource(Protocol):
    def get(self, request: SummaryRequest) -> SummaryAnswer: ...


class NoSummaries:
    """A source with nothing in it: every request is `missing` (plan without an LLM, tests)."""

    def get(self, request: SummaryRequest) -> SummaryAnswer:
        return MISSING


class DictSummaries:
    """Answers from a dict keyed by `SummaryRequest.canonical()`; records what it lacked."""

    def __init__(self, answers: Mapping[bytes, SummaryAnswer] | None = None) -> None:
        self.answers: dict[bytes, SummaryAnswer] = dict(answers or {})
        self.missing: dict[bytes, SummaryRequest] = {}

    def get(self, request: SummaryRequest) -> SummaryAnswer:
        key = request.canonical()
        answer = self.answers.get(key)
        if answer is None:
            self.missing[key] = request
            return MISSING
        return answer


def prepare_for_summary(messages: tuple[Mapping[str, Any], ...]) -> tuple[Mapping[str, Any], ...]:
    """A trailing assistant message with tool_calls breaks summarisation.

    Its tool calls have no results inside the summarised range, and providers reject such a
    history. Keep its text without the calls, or drop it when it has no text.
    """
    if not messages:
        return messages
    last = messages[-1]
    if last.get("role") != "assistant" or not last.get("tool_calls"):
        return messages
    content = last.get("content")
    if content:
        stripped = {k: v for k, v in last.items() if k not in ("tool_calls", "function_call")}
        return (*messages[:-1], stripped)
    return messages[:-1]
