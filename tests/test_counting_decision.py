"""A first-seen request decided on its upper bound is decided as its exact count decides it.

The gateway may forward a large request before it has counted all of it, once a bound of its
tokens fits under the trigger (the JSON size, then each text's UTF-8 length, then exact counts
message by message). Whatever bound settled it and however many threads counted, the client
gets what the plain path (every message counted exactly first) sends: the same body, compacted
the same way or not at all, and the same exact figures once they are counted. In process (a
the engine built on its own (`tests.parts`), no upstream call), with tiktoken.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gateway.config import parse_config
from gateway.counting.cache import CountCache
from gateway.counting.runner import OFFLOAD_MIN_BYTES
from gateway.counting.tokenizers import load_tokenizer
from gateway.counting.tokens import PRIMING_TOKENS, MessageCounter
from gateway.devtools.parts import Parts, parts
from gateway.engine import Prepared
from gateway.engine.measure import LATE_MIN_BYTES
from gateway.wire import CHAT

COUNTER = MessageCounter(load_tokenizer("tiktoken:o200k_base"), CountCache(0))
MAX_OUTPUT = 100

# Texts whose JSON is much longer than they are (escaped newlines, quotes, backslashes and
# control characters, as in code and logs), one token per byte (so that no bound of it can be
# lower than its length), as short as their JSON (prose), or few bytes per token (numbers, CJK).
TEXTS = (
    'if x:\n\t"quoted" \\ path\n' * 40,
    "\x7f\x01\x1b" * 300,
    "plain prose that tokenizes to long words, " * 30,
    "2024-01-01T00:00:00 17 42 9001 0.5\n" * 30,
    "上下文窗口令牌 😀 " * 40,
    "ok",
)
MESSAGES = st.lists(
    # the text no bound can undercut comes most often: a bound too low shows there first
    st.tuples(
        st.sampled_from(["user", "assistant", "tool"]), st.sampled_from([0, 1, 1, 1, 2, 3, 4, 5])
    ),
    min_size=30,
    max_size=60,
)


def gateway(window: int, threads: int) -> Parts:
    config = {
        "server": {"count_threads": threads},
        "models": [
            {
                "name": "m",
                "upstream": {"base_url": "http://127.0.0.1:9/v1"},
                "tokenizer": "tiktoken:o200k_base",
                "context_window": window,
                "policy": "p",
            }
        ],
        "policies": {"p": {"steps": [{"type": "fifo"}]}},
    }
    return parts(parse_config(config))


async def prepare(gw: Parts, body: bytes, count_late: bool) -> Prepared:
    route = gw.router.resolve("m")
    assert route is not None
    request = CHAT.parse(body, 10_000)
    try:
        prepared = await gw.engine.prepare(
            request, route, "t", window=gw.effective_window(route), count_late=count_late
        )
        if prepared.late is not None:
            await asyncio.wait([prepared.late])
        return prepared
    finally:
        await gw.engine.counting.close()


def conversation(pairs: list[tuple[str, int]]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}]
    for n, (role, which) in enumerate(pairs):
        text = TEXTS[which]
        if role == "tool":  # a tool result answers the assistant's call just before it
            call = {
                "id": f"c{n}",
                "type": "function",
                "function": {"name": "run", "arguments": "{}"},
            }
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": f"{n} {text}"})
        else:
            messages.append({"role": role, "content": f"{n} {text}"})
    messages.append({"role": "user", "content": "And now?"})
    return messages


# Where the trigger lies: under the exact count (compacted), between it and the tighter bound
# (counted until it fits), between the two bounds (the tighter one settles it), over both.
REGIONS = ("under the count", "over the count", "over the narrow bound", "over the JSON bound")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(pairs=[("tool", 1)] * 40, region="under the count", where=0.9, threads=0)
@given(
    pairs=MESSAGES,
    region=st.sampled_from(REGIONS),
    where=st.floats(0, 1),
    threads=st.sampled_from([0, 2]),
)
async def test_a_request_decided_on_its_bound_is_sent_as_its_exact_count_decides(
    pairs: list[tuple[str, int]], region: str, where: float, threads: int
) -> None:
    messages = conversation(pairs)
    body = orjson.dumps({"model": "m", "messages": messages, "max_tokens": MAX_OUTPUT})
    bound = COUNTER.bound
    assert bound is not None
    exact = COUNTER.messages(messages)
    narrow = sum(map(bound.narrow, messages))
    loose = bound.messages(messages)  # priming included
    tighter = sum(min(bound.message(m), bound.narrow(m)) for m in messages) + PRIMING_TOKENS
    marks = (int(exact * 0.6), exact, narrow, loose, loose * 2)
    low = REGIONS.index(region)
    trigger = marks[low] + where * (marks[low + 1] - marks[low])
    window = int(trigger / 0.8) + MAX_OUTPUT + 40  # the trigger is 80 % of what is left

    late = await prepare(gateway(window, threads), body, count_late=True)
    plain = await prepare(gateway(window, threads), body, count_late=False)

    assert late.body == plain.body  # forwarded as it came, or compacted alike
    assert late.changed_steps == plain.changed_steps
    assert late.tokens_before >= plain.tokens_before  # a bound, never below the count
    settled = late.settled()
    assert (settled.tokens_before, settled.tokens_after) == (
        plain.tokens_before,
        plain.tokens_after,
    )
    if narrow >= OFFLOAD_MIN_BYTES and plain.tokens_before < 0.7 * (window - MAX_OUTPUT):
        assert late.bounded  # a request that plainly fits went before all of it was counted
    # A bound that fits is not narrowed by counting: what the response reports is that bound.
    room = late.budget.trigger + PRIMING_TOKENS
    measured = loose - PRIMING_TOKENS >= LATE_MIN_BYTES  # else too small to leave uncounted
    if measured and loose <= room:
        assert late.tokens_before == loose
    elif measured and tighter <= room:
        assert late.tokens_before == tighter
