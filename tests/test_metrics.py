"""The counters operators read say what happened, with one meaning each.

"Context errors avoided" is counted one way on `/metrics`, in the event feed (`/ui`) and on the
dashboard: requests the upstream refused with a context-window error that the gateway compacted
further, retried and answered. The estimate of requests compaction kept from being refused is
counted apart (`over_window_answered`). Tokens saved count answered requests only. Driven
in-process through the app, against the fake upstream.
"""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.ops.metrics import Metrics
from policies.conversation import Conversation, Message
from policies.invariants import check
from tests.in_process import AppGateway, AppStarter, LocalUpstream
from tests.test_observability import POLICIES, long_history, model


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples with these labels in a text exposition; 0 when absent."""
    total = 0.0
    for sample, raw, value in re.findall(r"^(\w+)(?:\{([^}]*)\})? (\S+)$", text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', raw))
        if sample == name and all(have.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total


async def scrape(gw: AppGateway) -> str:
    return (await gw.http.get(f"{gw.url}/metrics")).text


async def totals(gw: AppGateway) -> dict[str, Any]:
    return (await gw.http.get(f"{gw.base_url}/compactgate/events")).json()["totals"]


async def chat(gw: AppGateway, messages: list[dict[str, Any]], **extra: Any) -> Any:
    return await gw.http.post(
        f"{gw.base_url}/chat/completions", json={"model": "m", "messages": messages, **extra}
    )


async def test_tokens_saved_count_only_requests_that_were_answered(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app({"models": [model(local_upstream)], "policies": POLICIES})
    refusal = {"error": {"message": "no", "type": "invalid_request_error", "code": None}}
    local_upstream.script(
        [
            {"kind": "error", "status": 400, "body": refusal},
            {"kind": "drop_mid_stream", "after_chunks": 1},
        ]
    )
    failed = await chat(gw, long_history())
    assert failed.status_code == 400
    before = int(failed.headers["x-compactgate-tokens-before"])
    assert int(failed.headers["x-compactgate-tokens-after"]) < before  # compacted, then refused
    broken = await chat(gw, long_history(), stream=True)
    assert broken.status_code == 200 and '"error"' in broken.text  # the stream ended in an error
    text = await scrape(gw)
    assert metric(text, "compactgate_tokens_saved_total", model="m") == 0
    assert metric(text, "compactgate_compactions_total", step="fifo") == 2  # it did compact
    assert (await totals(gw))["tokens_saved"] == 0

    answered = await chat(gw, long_history())
    assert answered.status_code == 200
    saved = int(answered.headers["x-compactgate-tokens-before"]) - int(
        answered.headers["x-compactgate-tokens-after"]
    )
    assert saved > 0
    assert metric(await scrape(gw), "compactgate_tokens_saved_total", model="m") == saved
    assert (await totals(gw))["tokens_saved"] == saved


async def test_count_tokens_saves_nothing(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """A count is not a generation: compacting the request it sizes saves no billed token."""
    gw = await start_app({"models": [model(local_upstream)], "policies": POLICIES})
    counted = await gw.http.post(
        f"{gw.base_url}/messages/count_tokens",
        json={"model": "m", "messages": long_history()[1:]},
        headers={"anthropic-version": "2023-06-01"},
    )
    assert counted.status_code == 200
    assert metric(await scrape(gw), "compactgate_compactions_total", step="fifo") == 1
    assert metric(await scrape(gw), "compactgate_tokens_saved_total") == 0
    assert (await totals(gw))["tokens_saved"] == 0


async def test_context_errors_avoided_means_recovered_requests_everywhere(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """Three requests: one larger than the window, compacted ahead and answered (no upstream
    error: nothing avoided, one estimate); one the upstream refuses for its context, retried
    after compacting and answered (one avoided); one refused again after its retry (not
    avoided). /metrics and the event feed agree."""
    gw = await start_app({"models": [model(local_upstream, max_retries=1)], "policies": POLICIES})
    over = await chat(gw, long_history())
    assert over.status_code == 200 and over.headers["x-compactgate-retries"] == "0"

    local_upstream.script([{"kind": "context_limit", "limit": 600, "style": "openai"}])
    recovered = await chat(gw, long_history(6))
    assert recovered.status_code == 200 and recovered.headers["x-compactgate-retries"] == "1"

    local_upstream.script([{"kind": "context_limit", "limit": 5, "style": "openai"}] * 2)
    refused = await chat(gw, long_history(6))
    assert refused.status_code >= 400

    text = await scrape(gw)
    assert metric(text, "compactgate_context_errors_total") >= 2
    assert metric(text, "compactgate_emergency_retries_total", model="m") >= 2
    assert metric(text, "compactgate_context_errors_avoided_total", model="m") == 1
    assert metric(text, "compactgate_over_window_answered_total", model="m") == 1
    feed = await totals(gw)
    assert feed["context_errors_avoided"] == 1
    assert feed["over_window_answered"] == 1


async def test_shadow_mode_rescues_a_request_refused_for_its_context(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """Shadow mode forwards the original; when the upstream refuses it with a context-window
    error, the gateway compacts it for real and retries, as in enforce mode. The answer says
    what was done in the ordinary headers (not the `would-` ones) and counts as avoided."""
    gw = await start_app(
        {"mode": "observe", "models": [model(local_upstream)], "policies": POLICIES}
    )
    local_upstream.script([{"kind": "context_limit", "limit": 600, "style": "openai"}] * 2)
    messages = long_history(6)
    rescued = await chat(gw, messages)
    assert rescued.status_code == 200
    assert rescued.headers["x-compactgate-retries"] == "1"
    assert "fifo" in rescued.headers["x-compactgate-steps"]
    assert not [h for h in rescued.headers if h.startswith("x-compactgate-would-")]
    first, retried = local_upstream.chat_requests()
    assert len(first["json"]["messages"]) == len(messages)  # the original, untouched
    assert len(retried["json"]["messages"]) < len(messages)  # compacted for real
    text = await scrape(gw)
    assert metric(text, "compactgate_context_errors_avoided_total", model="m") == 1
    assert (await totals(gw))["context_errors_avoided"] == 1


def test_refused_compactions_name_the_broken_rule_in_words() -> None:
    """The `rule` label of compactgate_invariant_violations_total (and the log line) says which
    invariant broke in words an operator reads, not a requirement number."""
    data = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first", "compactgate": {"pin": True}},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "latest"},
    ]
    original = Conversation.of(
        Message(d, 1, pin=bool(d.get("compactgate")), origin=i) for i, d in enumerate(data)
    )
    nothing_left = Conversation.of([])
    rules = {v.rule for v in check(original, nothing_left)}
    assert rules == {"system_prompts_kept", "latest_user_message_kept", "pinned_messages_kept"}
    reordered = Conversation.of([original.messages[0], *reversed(original.messages[1:])])
    assert {v.rule for v in check(original, reordered)} == {"client_order_kept"}


async def test_latency_and_token_metrics_are_split_by_api(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """An operator can tell the APIs apart in the latency and token series, not only in the
    request count."""
    gw = await start_app({"models": [model(local_upstream)], "policies": POLICIES})
    await chat(gw, [{"role": "user", "content": "hi"}])
    responses = await gw.http.post(
        f"{gw.base_url}/responses", json={"model": "m", "input": "hi", "stream": False}
    )
    messages = await gw.http.post(
        f"{gw.base_url}/messages",
        json={"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]},
        headers={"anthropic-version": "2023-06-01"},
    )
    assert responses.status_code == 200 and messages.status_code == 200
    text = await scrape(gw)
    for api in ("chat", "responses", "messages"):
        for name in (
            "compactgate_request_duration_seconds_count",
            "compactgate_gateway_overhead_seconds_count",
        ):
            assert metric(text, name, model="m", api=api) == 1, (name, api)
        assert metric(text, "compactgate_tokens_before_total", model="m", api=api) > 0


async def test_memo_messages_say_how_much_of_a_conversation_was_taken_over(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """What affinity is for (design D13.6), on /metrics: a conversation's next turn in the same
    process takes its earlier messages' counts and parses over; its first turn takes none."""
    gw = await start_app({"models": [model(local_upstream)], "policies": POLICIES})
    first = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "1"},
        {"role": "user", "content": "two"},
    ]

    async def turn(messages: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
        answer = await gw.http.post(
            f"{gw.base_url}/messages",
            json={"model": "m", "max_tokens": 50, "system": "Be terse.", "messages": messages},
            headers={"anthropic-version": "2023-06-01"},
        )
        assert answer.status_code == 200
        text = await scrape(gw)
        return {
            (memo, result): metric(
                text, "compactgate_memo_messages_total", memo=memo, result=result
            )
            for memo in ("prefix_counts", "resent_parse")
            for result in ("reused", "new")
        }

    after_first = await turn(first)
    after_second = await turn(
        [*first, {"role": "assistant", "content": "2"}, {"role": "user", "content": "three"}]
    )
    for memo in ("prefix_counts", "resent_parse"):
        assert after_first[memo, "reused"] == 0 and after_first[memo, "new"] >= 3, memo
        # the second turn: its first three messages taken over, the two it added new
        assert after_second[memo, "reused"] >= 3, (memo, after_second)
        assert after_second[memo, "new"] - after_first[memo, "new"] == 2, (memo, after_second)


# The request path updates its series through children held per label set (`Metrics.children`),
# not through `labels()`; the exposition must not tell the two apart.
HELD = {  # metric attribute -> how many labels it takes
    "requests": 3,
    "request_seconds": 2,
    "overhead_seconds": 2,
    "tokens_saved": 2,
    "cost_usd": 2,
    "billed_tokens": 1,
    "estimate_error": 1,
}
updates = st.lists(
    st.tuples(
        st.sampled_from(sorted(HELD)),
        st.lists(st.sampled_from(["a", "b", "chat", "200"]), min_size=3, max_size=3),
        st.floats(0, 50, allow_nan=False),
        st.booleans(),
    ),
    max_size=40,
)


def series(metrics: Metrics) -> list[str]:
    """The gateway's own lines of an exposition (not the process's, which change by the call)."""
    return [line for line in metrics.render().decode().splitlines() if "compactgate_" in line]


@given(updates)
@settings(max_examples=60, deadline=None)
def test_held_children_count_exactly_what_labels_counts(
    steps: list[tuple[str, list[str], float, bool]],
) -> None:
    held, plain = Metrics(), Metrics()
    for name, values, amount, through_child in steps:
        labels = tuple(values[: HELD[name]])
        if through_child:
            via = held.child(getattr(held, name), *labels)
        else:
            via = held.children(getattr(held, name))[labels]
        reference = getattr(plain, name).labels(*labels)
        for child in (via, reference):
            if hasattr(child, "observe"):
                child.observe(amount)
            else:
                child.inc(amount)
    assert series(held) == series(plain)
