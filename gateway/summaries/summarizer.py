"""The LLM summariser: a `SummaryRequest` in, summary text (and the retain section) out.

One call (design D7.9): the messages to summarise, then the instructions as the final
user message, sent without tools to the summary model (the step's `model:` when set,
resolved by the router like any client model name; else the request's own route), with the
client's credential unless the route holds its own key. The messages are written out as a
transcript inside that one user message rather than replayed as chat messages: tool calls
whose results fall outside the range, image parts and strict chat templates (no two user
messages in a row, no tool messages without `tools`) then cannot make the call fail.
`prepare_for_summary` has already been applied by the step.

The answer is read for `<retain>...</retain>` and `<summary>...</summary>`; an
answer without summary tags is the summary as a whole, and `<think>` blocks are dropped.

The input must fit the summary model's window, or compaction would fail exactly when it is
needed. When it does not, the transcript is cut into chunks that fit, each chunk is summarised,
and the partial summaries are summarised into one (again in groups if they do not fit either).
If the upstream still answers with a context-window error, the window it states (or a smaller
guess) is used and the work is chunked once more.

`SummaryRequest.previous` makes the call incremental: the earlier summary goes first, and the
model is asked to return it extended with the new messages. With `SummaryRequest.append` (the
step's `append_summaries`) the earlier summary is context only: the model summarises just the new
messages and the policy appends the answer to the earlier text, which then stays unchanged (and
cached by the provider). When the input has to be chunked, the partial summaries are then combined
without the earlier summary, which must not be restated.

Every failure (upstream error, timeout, empty answer, unknown model) is a `SummarizerError`; the
caller turns it into a `failed` answer that is never cached (design D7.4).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson

from policies.summaries import SummaryAnswer, SummaryRequest

from ..config import SummariesConfig
from ..errors import GatewayError
from ..ops.metrics import Metrics
from ..routing import Route, Router
from ..upstream import forward_headers
from ..upstream.failover import Destination
from ..upstream.retry import Sender
from ..wire import WIRES, Wire
from ..wire.context_errors import classify
from ..wire.usage import Usage
from .transcript import (
    APPEND_NOTE,
    APPEND_RETAIN_NOTE,
    COMBINE_NOTE,
    EXTEND_NOTE,
    LENGTH_NOTE,
    PART_NOTE,
    PREVIOUS_LABEL,
    SYSTEM_PROMPT,
    as_part,
    chunk,
    cut_text,
    read_answer,
    render_message,
)

# What of the client's headers a summary call carries: its credential, nothing else.
CREDENTIAL_HEADERS = frozenset(
    {"authorization", "api-key", "x-api-key", "openai-organization", "openai-project"}
)

MARGIN_TOKENS = 64  # chat-format overhead and estimate error, on top of the prompt's own count
MIN_CHUNK_TOKENS = 256
MAX_DEPTH = 4  # combining rounds before giving up
MAP_CONCURRENCY = 4


class SummarizerError(Exception):
    """The summary could not be made; `outcome` is the metric label (error, timeout, ...)."""

    def __init__(self, message: str, outcome: str = "error") -> None:
        super().__init__(message)
        self.outcome = outcome


class _ContextOverflow(SummarizerError):
    def __init__(self, limit: int | None) -> None:
        super().__init__("the summary model's context window was exceeded", "context_error")
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Target:
    """Where one summary's calls go: route, URL, headers and the window the input must fit."""

    route: Route
    destinations: Sequence[Destination]  # the route's upstreams, failed over like requests
    window: int | None
    deadline: float  # event-loop time by which the whole summary must be done
    wire: Wire  # the API the call is made in


# -- the summariser -----------------------------------------------------------------------------


class Summarizer:
    """Makes summaries through the gateway's upstream client."""

    def __init__(
        self,
        sender: Sender,
        router: Router,
        metrics: Metrics,
        config: SummariesConfig,
        window_of: Callable[[Route], int | None] | None = None,
        on_usage: Callable[[Route, Usage], None] | None = None,
    ) -> None:
        self._on_usage = on_usage  # the gateway's own spend (cost accounting)
        self._sender = sender
        self._router = router
        self._metrics = metrics
        self._config = config
        self._window_of = window_of or (lambda route: route.context_window)
        # Made once: it is part of every summary's cache key, looked up on every request.
        self._fingerprint = (
            f"v1|{config.max_input_tokens}|{config.token_limit_param}|{SYSTEM_PROMPT}"
        )

    def fingerprint(self) -> str:
        """What, besides the request, changes the text a summary comes out with."""
        return self._fingerprint

    def model_of(self, request: SummaryRequest, route: Route) -> str:
        """The name of the route that will make this summary (part of the cache key)."""
        return request.model or route.name

    async def summarize(
        self,
        request: SummaryRequest,
        route: Route,
        headers: Sequence[tuple[bytes, bytes]],
        api: str = "chat",
    ) -> SummaryAnswer:
        """The summary for `request`, asked for in `api` (a wire API the upstream speaks);
        raises SummarizerError. Bounded by `timeout_s`."""
        target = self._target(request, route, headers, WIRES[api])
        return await self._summarize(request, target)

    def _target(
        self,
        request: SummaryRequest,
        route: Route,
        headers: Sequence[tuple[bytes, bytes]],
        wire: Wire,
    ) -> Target:
        chosen = route
        if request.model is not None:
            resolved = self._router.resolve(request.model)
            if resolved is None:
                raise SummarizerError(f"the summary model {request.model!r} is not configured")
            chosen = resolved
        if wire.name != "chat" and chosen.upstream.provider == "litellm":
            wire = WIRES["chat"]  # litellm routes speak chat completions only
        credentials = [
            (k, v) for k, v in headers if k.decode("latin-1").lower() in CREDENTIAL_HEADERS
        ]
        destinations = []
        for upstream in chosen.targets:
            if upstream.provider == "litellm":
                url = upstream.base_url or ""  # litellm's api_base
            elif upstream.base_url is not None:
                url = upstream.base_url + wire.upstream_path
            else:
                continue
            key = upstream.api_key
            sent = forward_headers(
                credentials, wire.credential_headers(key) if key else None, upstream.headers
            )
            sent["content-type"] = "application/json"
            destinations.append(Destination(upstream, url, sent))
        if not destinations:
            raise SummarizerError(f"the model {chosen.name!r} has no upstream for {wire.name}")
        window = self._window_of(chosen)
        if self._config.max_input_tokens is not None:
            window = min(window or self._config.max_input_tokens, self._config.max_input_tokens)
        deadline = asyncio.get_running_loop().time() + self._config.timeout_s
        return Target(chosen, destinations, window, deadline, wire)

    async def _summarize(self, request: SummaryRequest, target: Target) -> SummaryAnswer:
        pieces = [render_message(m) for m in request.messages]
        window = target.window
        for _ in range(2):
            try:
                return await self._pieces(request, target, window, pieces)
            except _ContextOverflow as overflow:
                # The upstream counts more than we do: trust its window, or aim well below ours.
                used = window or self._count(target, "\n\n".join(pieces)) + self._out_tokens(
                    request
                )
                window = min(overflow.limit or used, int(used * 0.7))
        return await self._pieces(request, target, window, pieces)

    async def _pieces(
        self, request: SummaryRequest, target: Target, window: int | None, pieces: list[str]
    ) -> SummaryAnswer:
        out = self._out_tokens(request)
        if window is None:
            return await self._call(request, target, pieces, request.previous)
        fixed = (
            self._count(target, self._prompt(request, [], request.previous)) + out + MARGIN_TOKENS
        )
        sizes = [self._count(target, p) for p in pieces]
        if fixed + sum(sizes) <= window:
            return await self._call(request, target, pieces, request.previous)
        # Too long for one call: summarise chunks, then combine them with the previous summary.
        budget = max(MIN_CHUNK_TOKENS, window - fixed + self._previous_tokens(target, request))
        parts = await self._map(request, target, pieces, sizes, budget)
        return await self._combine(request, target, window, parts)

    async def _map(
        self,
        request: SummaryRequest,
        target: Target,
        pieces: list[str],
        sizes: list[int],
        budget: int,
    ) -> list[str]:
        pieces = [cut_text(p, s, budget) for p, s in zip(pieces, sizes, strict=True)]
        sizes = [min(s, budget) for s in sizes]
        chunks = chunk(pieces, sizes, budget)
        limit = asyncio.Semaphore(MAP_CONCURRENCY)

        async def one(index: int, part: list[str]) -> str:
            async with limit:
                note = PART_NOTE.format(part=index + 1, parts=len(chunks))
                answer = await self._call(request, target, part, None, note=note)
            return as_part(answer)

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(i, c)) for i, c in enumerate(chunks)]
        return [t.result() for t in tasks]

    async def _combine(
        self, request: SummaryRequest, target: Target, window: int, parts: list[str]
    ) -> SummaryAnswer:
        if request.previous and not request.append:  # appended: the previous text is kept as is
            parts = [request.previous, *parts]
        out = self._out_tokens(request)
        for _ in range(MAX_DEPTH):
            fixed = self._count(target, self._prompt(request, [], None, combine=True)) + out
            fixed += MARGIN_TOKENS
            sizes = [self._count(target, p) for p in parts]
            if fixed + sum(sizes) <= window or len(parts) <= 2:
                budget = max(MIN_CHUNK_TOKENS, window - fixed)
                parts = [
                    cut_text(p, s, budget // len(parts)) for p, s in zip(parts, sizes, strict=True)
                ]
                return await self._call(request, target, parts, None, combine=True)
            budget = max(MIN_CHUNK_TOKENS, window - fixed)
            groups = chunk(parts, sizes, budget)
            if len(groups) == len(parts):  # every part alone is too big: combine in pairs
                groups = [parts[i : i + 2] for i in range(0, len(parts), 2)]
            answers = await asyncio.gather(
                *(self._call(request, target, g, None, combine=True) for g in groups)
            )
            parts = [as_part(a) for a in answers]
        raise SummarizerError("the partial summaries do not fit the summary model's window")

    # -- one upstream call ------------------------------------------------------------------------

    def _prompt(
        self,
        request: SummaryRequest,
        pieces: Sequence[str],
        previous: str | None,
        *,
        note: str | None = None,
        combine: bool = False,
    ) -> str:
        sections: list[str] = []
        if previous:
            sections.append(
                f"{PREVIOUS_LABEL}\n<previous_summary>\n{previous}\n</previous_summary>"
            )
        if combine:
            body = "\n\n".join(f"<part>\n{p}\n</part>" for p in pieces)
            sections.append(f"<summaries>\n{body}\n</summaries>")
        else:
            sections.append("<conversation>\n" + "\n\n".join(pieces) + "\n</conversation>")
        sections.append(request.instructions.strip())
        if request.retain_instructions:
            sections.append(request.retain_instructions.strip())
        if combine:
            sections.append(COMBINE_NOTE)
        elif previous and request.append:
            sections.append(APPEND_NOTE)
            if request.retain_instructions:
                sections.append(APPEND_RETAIN_NOTE)
        elif previous:
            sections.append(EXTEND_NOTE)
        if note:
            sections.append(note)
        sections.append(LENGTH_NOTE.format(tokens=request.max_tokens))
        return "\n\n".join(sections)

    async def _call(
        self,
        request: SummaryRequest,
        target: Target,
        pieces: Sequence[str],
        previous: str | None,
        *,
        note: str | None = None,
        combine: bool = False,
    ) -> SummaryAnswer:
        prompt = self._prompt(request, pieces, previous, note=note, combine=combine)
        limit = None if self._config.token_limit_param == "none" else self._out_tokens(request)
        payload = target.wire.plain_request(
            target.route.upstream_model,
            SYSTEM_PROMPT,
            prompt,
            limit,
            self._config.token_limit_param,
        )
        started = time.perf_counter()
        outcome = "error"
        try:
            try:
                async with asyncio.timeout_at(target.deadline):
                    text = await self._send(target, orjson.dumps(payload))
            except TimeoutError:
                raise SummarizerError("the summariser did not answer in time", "timeout") from None
            answer = read_answer(text, request.retain_instructions is not None)
            if not answer.text:
                raise SummarizerError("the summariser answered with an empty summary")
            outcome = "ok"
            return answer
        except SummarizerError as error:
            outcome = error.outcome
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self._metrics.summarizer_calls.labels(outcome).inc()
            self._metrics.summarizer_seconds.observe(time.perf_counter() - started)

    async def _send(self, target: Target, body: bytes) -> str:
        route = target.route
        try:
            response, _ = await self._sender.send(route, target.destinations, body)
            try:
                data = await response.read()
            finally:
                response.release()
        except GatewayError as error:
            outcome = "timeout" if error.status == 504 else "error"
            raise SummarizerError(f"summary call failed: {error.message}", outcome) from None
        if response.status >= 400:
            overflow = classify(response.status, data)
            if overflow is not None:
                raise _ContextOverflow(overflow.limit)
            raise SummarizerError(f"the summary model answered {response.status}: {data[:200]!r}")
        try:
            document = orjson.loads(data)
        except orjson.JSONDecodeError:
            document = None
        text = target.wire.answer_text(document) if isinstance(document, dict) else None
        usage = target.wire.usage_of(document) if isinstance(document, dict) else None
        if usage is not None and self._on_usage is not None:
            self._on_usage(route, usage)
        if text is None:
            raise SummarizerError(f"the summary model's answer is not a {target.wire.name} answer")
        return text

    # -- counting ---------------------------------------------------------------------------------

    def _count(self, target: Target, text: str) -> int:
        return target.route.counter.text(text)

    def _previous_tokens(self, target: Target, request: SummaryRequest) -> int:
        return self._count(target, request.previous) if request.previous else 0

    def _out_tokens(self, request: SummaryRequest) -> int:
        sections = 2 if request.retain_instructions is not None else 1
        return max(64, int(request.max_tokens * sections * 1.25))
