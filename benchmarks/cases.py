"""What a run measures: the cases, which targets each one compares, and how much load.

A case is one request shape, in one client API (chat, Responses, Messages), sent the same way to
several targets, measured in rounds so that
whatever else the machine is doing hits them alike: at concurrency 1 the targets alternate
request by request (`load.run_paired`); above it they take turns batch by batch, the order
rotating every round. Every number the report compares comes from one case.

Targets:

    direct               the fast upstream itself: the baseline every "added" figure subtracts
    gateway              CompactGate, model `bench-passthrough` (1M window: nothing compacted)
    relay                the Starlette + aiohttp relay (the Python floor)
    litellm              the LiteLLM proxy (pinned), configured to the same upstream
    headroom             the headroom proxy (pinned), a Python compaction proxy that speaks chat,
                         Responses and Messages, pointed at the same upstream
    gateway-compact      CompactGate, model `bench-compact` (32k window: masking + trimming)
    gateway-emergency    CompactGate, a model whose upstream rejects the request once with
                         `context_length_exceeded`, so the gateway compacts and retries
    gateway-count        CompactGate, model `bench-count` (128k window): the 200-message request
                         fits its trigger, but its upper bound (the UTF-8 bytes of its texts)
                         does not, so a first-seen one is counted exactly before it is forwarded
    gateway-summary      CompactGate, model `bench-summary` (64k window, policy `compaction`):
                         the request crosses the trigger and is served with a summary of its
                         older turns that is already in the summary cache (the warm-up
                         requests made it; every measured request only appends a message)
"""

from __future__ import annotations

from dataclasses import dataclass

PEERS = ("direct", "gateway", "relay", "litellm", "headroom")
# headroom serves one request at a time at 20-200 ms of CPU on chat (0.7-2.3 s on the agent API
# bodies): a batch of 32 in flight would take seconds to minutes a round, so it is measured at
# c=1 on chat and at c=32 only on a seen agent API request (its CPU per request at c=1 bounds its
# throughput anyway: 1000 / CPU ms requests per second on its one process).
CHAT_C32 = ("direct", "gateway", "relay", "litellm")
# At c=32 a first-seen request is measured on the gateway and the floors only: LiteLLM and the
# relay keep nothing per conversation (a first-seen request costs them what a seen one does),
# and headroom's first-seen request costs it seconds of CPU (see its c=1 figure).
FIRST_C32 = ("direct", "gateway", "relay")


@dataclass(frozen=True)
class Load:
    """Per round and target: at most `requests` requests and about `seconds` seconds."""

    requests: int
    seconds: float


@dataclass(frozen=True)
class Case:
    key: str
    title: str
    shape: str  # small | agent | codex | claude
    variant: str  # fixed | appended | first_time
    stream: bool
    concurrency: int
    targets: tuple[str, ...]
    full: Load
    quick: Load
    api: str = "chat"  # chat | responses | messages: the path, headers and stream end
    rounds: tuple[int, int] | None = None  # (full, quick) instead of the run's rounds
    quick_skip: tuple[str, ...] = ()  # targets a --quick run leaves out (too slow for it)

    def targets_for(self, quick: bool) -> tuple[str, ...]:
        return tuple(t for t in self.targets if not (quick and t in self.quick_skip))

    def load(self, quick: bool) -> Load:
        return self.quick if quick else self.full


CASES: tuple[Case, ...] = (
    Case(
        "small",
        "small (3 messages), non-streaming, c=1",
        "small",
        "fixed",
        False,
        1,
        PEERS,
        Load(150, 3),
        Load(60, 2),
    ),
    Case(
        "small-stream",
        "small, streaming, c=1",
        "small",
        "fixed",
        True,
        1,
        PEERS,
        Load(150, 3),
        Load(60, 2),
    ),
    Case(
        "small-c32",
        "small, non-streaming, c=32",
        "small",
        "fixed",
        False,
        32,
        CHAT_C32,
        Load(50_000, 2.0),
        Load(50_000, 0.75),
    ),
    Case(
        "small-stream-c32",
        "small, streaming, c=32",
        "small",
        "fixed",
        True,
        32,
        CHAT_C32,
        Load(50_000, 2.0),
        Load(50_000, 0.75),
    ),
    Case(
        "agent-seen",
        "200 messages, same conversation + 1 new message, non-streaming, c=1",
        "agent",
        "appended",
        False,
        1,
        PEERS,
        Load(20, 3),
        Load(10, 2),
    ),
    Case(
        "agent-first",
        "200 messages, first time seen (every message new), non-streaming, c=1",
        "agent",
        "first_time",
        False,
        1,
        ("direct", "gateway", "relay", "litellm", "headroom"),
        Load(15, 3),
        Load(8, 3),
    ),
    Case(
        "agent-count",
        "200 messages, first time seen, 128k window: its upper bound reaches the trigger, so it "
        "is counted before it goes (gateway-count), c=1",
        "agent",
        "first_time",
        False,
        1,
        ("direct", "relay", "gateway-count"),
        Load(20, 3),
        Load(10, 3),
    ),
    Case(
        "agent-seen-stream",
        "200 messages, seen before, streaming, c=1",
        "agent",
        "appended",
        True,
        1,
        ("direct", "gateway", "relay", "litellm"),
        Load(20, 3),
        Load(10, 2),
    ),
    Case(
        "agent-seen-c32",
        "200 messages, seen before, non-streaming, c=32",
        "agent",
        "appended",
        False,
        32,
        CHAT_C32,
        Load(50_000, 2.0),
        Load(50_000, 0.75),
    ),
    Case(
        "compact-seen",
        "200 messages over a 32k window (masking + trimming), seen before, c=1",
        "agent",
        "appended",
        False,
        1,
        ("direct", "gateway", "gateway-compact"),
        Load(40, 6),
        Load(10, 3),
    ),
    Case(
        "compact-first",
        "200 messages over a 32k window, first time seen, c=1",
        "agent",
        "first_time",
        False,
        1,
        ("direct", "gateway", "gateway-compact"),
        Load(20, 6),
        Load(6, 3),
    ),
    Case(
        "summary-ready",
        "200 messages over a 64k window, summary of the older turns ready, seen before, c=1",
        "agent",
        "appended",
        False,
        1,
        ("direct", "gateway", "gateway-summary"),
        Load(40, 6),
        Load(10, 3),
    ),
    Case(
        "emergency",
        "200 messages, upstream answers 400 context_length_exceeded once, c=1",
        "agent",
        "appended",
        False,
        1,
        ("direct", "gateway", "gateway-emergency"),
        Load(30, 6),
        Load(8, 3),
    ),
)


def _agent_api_cases(shape: str, api: str, label: str) -> tuple[Case, ...]:
    """Seen and first-seen, c=1 and c=32, streamed as the agents stream."""
    c1, c32 = (Load(10, 3), Load(4, 1.0)), (Load(50_000, 1.5), Load(50_000, 0.5))
    return (
        Case(
            f"{shape}-seen",
            f"{label}, same conversation + 1 new item, streaming, c=1",
            shape,
            "appended",
            True,
            1,
            PEERS,
            *c1,
            api,
            (2, 1),
        ),
        Case(
            f"{shape}-first",
            f"{label}, first time seen (every item new), streaming, c=1",
            shape,
            "first_time",
            True,
            1,
            PEERS,
            *c1,
            api,
            (2, 1),
        ),
        Case(
            f"{shape}-seen-c32",
            f"{label}, seen before, streaming, c=32",
            shape,
            "appended",
            True,
            32,
            PEERS,
            *c32,
            api,
            (2, 1),
            ("litellm", "headroom"),
        ),
        Case(
            f"{shape}-first-c32",
            f"{label}, first time seen, streaming, c=32",
            shape,
            "first_time",
            True,
            32,
            FIRST_C32,
            *c32,
            api,
            (2, 1),
        ),
    )


AGENT_API_CASES = _agent_api_cases(
    "codex", "responses", "Codex-like /v1/responses"
) + _agent_api_cases("claude", "messages", "Claude-Code-like /v1/messages")
# after the chat cases with peers, before the gateway-only ones (a run cut short by
# --max-minutes loses those, which take seconds)
CASES = CASES[:8] + AGENT_API_CASES + CASES[8:]

ROUNDS_FULL = 3
ROUNDS_QUICK = 2
MEMORY_CONVERSATIONS = 1000
MEMORY_MESSAGES = 20


def warmup_requests(concurrency: int) -> int:
    """Requests sent (and not counted) before each batch: reopens keep-alive connections."""
    return 3 if concurrency == 1 else concurrency
