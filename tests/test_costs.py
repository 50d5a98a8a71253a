"""Cost accounting: every billed tier priced, the counterfactual, the gateway's own spend.

Unit tests price usage we write in each API's own convention at prices we choose; one reads the
price map inside the installed litellm package; in-process tests send a priced session through
the app and read the response headers, the event log and `/metrics`.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.config import PricingConfig
from gateway.ops.costs import (
    CACHE_MIN_TOKENS,
    CACHE_TTL_S,
    Accountant,
    CounterfactualCache,
    Priced,
    Prices,
    bill,
    billed_tokens,
    counterfactual_usage,
    map_prices,
    price_map,
    prices_for,
)
from gateway.ops.metrics import Metrics
from gateway.wire import CHAT, MESSAGES, RESPONSES
from gateway.wire.usage import Usage
from tests.configs import one_model
from tests.fuzz_oracle import summary_call
from tests.in_process import AppStarter, LocalUpstream
from tests.test_metrics import series
from tests.test_summaries_e2e import app_metric, chat_history

PER_M = 1 / 1_000_000
PRICES = Prices(
    input=3 * PER_M,
    output=15 * PER_M,
    cache_read=0.3 * PER_M,
    cache_write_5m=3.75 * PER_M,
    cache_write_1h=6 * PER_M,
)


def test_anthropic_usage_counts_cache_tiers_apart_from_input() -> None:
    """Anthropic's `input_tokens` is only the uncached remainder: 100 fresh, 2 000 read, 300
    written for five minutes and 50 for an hour are 2 450 prompt tokens, each at its own price."""
    usage = MESSAGES.usage_of(
        {
            "usage": {
                "input_tokens": 100,
                "cache_read_input_tokens": 2000,
                "cache_creation_input_tokens": 350,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": 300,
                    "ephemeral_1h_input_tokens": 50,
                },
                "output_tokens": 40,
            }
        }
    )
    assert usage is not None and usage.input == 2450
    priced = bill(usage, PRICES)
    assert priced.usd == pytest.approx(
        {
            "input": 100 * 3 * PER_M,
            "cache_read": 2000 * 0.3 * PER_M,
            "cache_write": (300 * 3.75 + 50 * 6) * PER_M,
            "output": 40 * 15 * PER_M,
        }
    )
    assert not priced.partial


@pytest.mark.parametrize("wire", [CHAT, RESPONSES], ids=["chat", "responses"])
def test_openai_cached_tokens_are_part_of_the_prompt(wire: Any) -> None:
    """OpenAI's cached tokens are a subset of the prompt: 1 000 prompt tokens with 600 cached
    bill 400 fresh and 600 at the cache price; reasoning is output (at the output price)."""
    if wire is CHAT:
        document = {
            "usage": {
                "prompt_tokens": 1000,
                "completion_tokens": 50,
                "prompt_tokens_details": {"cached_tokens": 600},
                "completion_tokens_details": {"reasoning_tokens": 20},
            }
        }
    else:
        document = {
            "usage": {
                "input_tokens": 1000,
                "output_tokens": 50,
                "input_tokens_details": {"cached_tokens": 600},
                "output_tokens_details": {"reasoning_tokens": 20},
            }
        }
    usage = wire.usage_of(document)
    assert billed_tokens(usage) == {
        "input": 400,
        "cache_read": 600,
        "cache_write_5m": 0,
        "cache_write_1h": 0,
        "output": 30,
        "reasoning": 20,
    }
    assert bill(usage, PRICES).total == pytest.approx((400 * 3 + 600 * 0.3 + 50 * 15) * PER_M)


usages = st.builds(
    lambda fresh, read, w5, w1, out, reason: Usage(
        input=fresh + read + w5 + w1,
        output=out + reason,
        cache_read=read,
        cache_write_5m=w5,
        cache_write_1h=w1,
        reasoning=reason,
    ),
    *(st.integers(0, 200_000) for _ in range(6)),
)
prices = st.builds(
    Prices,
    *(st.one_of(st.none(), st.floats(0, 1e-4)) for _ in range(6)),
)


@given(usage=usages, prices=prices)
def test_a_bill_is_every_priced_tier_and_partial_when_one_is_not(
    usage: Usage, prices: Prices
) -> None:
    priced = bill(usage, prices)
    tokens = billed_tokens(usage)
    assert sum(tokens.values()) == usage.input + usage.output
    unpriced = [
        tier
        for tier, count in tokens.items()
        if count
        and getattr(prices, tier) is None
        and not (tier == "reasoning" and prices.output is not None)
    ]
    assert priced.partial == bool(unpriced)
    assert all(value >= 0 for value in priced.usd.values())
    expected = sum(
        count * (getattr(prices, tier) if getattr(prices, tier) is not None else prices.output)
        for tier, count in tokens.items()
        if tier not in unpriced and count
    )
    assert priced.total == pytest.approx(expected)


def test_prices_come_from_the_price_map_inside_litellm_without_importing_it() -> None:
    table = price_map()
    entry = next(
        (name, e)
        for name, e in table.items()
        if isinstance(e, dict) and e.get("cache_read_input_token_cost") and "/" not in name
    )
    found = map_prices(entry[0])
    assert found is not None and found.input == entry[1]["input_cost_per_token"]
    assert found.cache_read == entry[1]["cache_read_input_token_cost"]
    assert map_prices("openai/" + entry[0]) == found  # a provider prefix is looked past
    overridden = prices_for(entry[0], {"input": 2.0, "output": None})
    assert overridden is not None and overridden.input == 2.0 * PER_M
    assert overridden.output == found.output
    assert prices_for("no-such-model-anywhere", None) is None
    assert prices_for("no-such-model-anywhere", {"input": 1.0}) == Prices(input=PER_M)
    code = "import sys; from gateway.ops.costs import price_map; price_map(); print('litellm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_counterfactual_cache_hits_when_the_client_only_appended() -> None:
    cache = CounterfactualCache()
    big = CACHE_MIN_TOKENS * 3
    assert cache.cached("t|m", (1, 2), big, now=0) == 0  # first request: nothing cached
    assert cache.cached("t|m", (1, 2, 3, 4), big + 500, now=10) == big  # appended: hit
    assert cache.cached("t|m", (1, 9, 5), big + 900, now=20) == 0  # history rewritten: miss
    assert cache.cached("t|m", (1, 9, 5, 6), big + 999, now=20 + CACHE_TTL_S + 1) == 0  # expired
    assert cache.cached("t|other", (1, 9, 5, 6, 7), big, now=30) == 0  # another route
    small = CounterfactualCache()
    small.cached("t|m", (1,), CACHE_MIN_TOKENS - 1, now=0)
    assert small.cached("t|m", (1, 2), CACHE_MIN_TOKENS + 5, now=1) == 0  # too short to cache


def plain_cached(
    seen: OrderedDict[tuple[str, int], tuple[tuple[int | None, ...], int, float]],
    most: int,
    request: tuple[str, tuple[int | None, ...], int, float],
) -> int:
    """The cache's rule, stated plainly: the conversation's previous request is read from the
    cache when it was recent, long enough and a prefix of this one; every request replaces the
    conversation's entry, which becomes the newest; the oldest conversations are dropped."""
    scope, uids, prompt, now = request
    if not uids or uids[0] is None:
        return 0
    key = (scope, uids[0])
    previous = seen.get(key)
    hit = 0
    if (
        previous is not None
        and now - previous[2] <= CACHE_TTL_S
        and previous[1] >= CACHE_MIN_TOKENS
        and uids[: len(previous[0])] == previous[0]
    ):
        hit = min(previous[1], prompt)
    seen[key] = (uids, prompt, now)
    seen.move_to_end(key)
    while len(seen) > most:
        seen.popitem(last=False)
    return hit


cache_requests = st.lists(
    st.tuples(
        st.sampled_from(["t|m", "t|n"]),
        st.one_of(  # mostly one of three conversations, grown or cut back; now and then none
            st.tuples(st.sampled_from([1, 2, 3]), st.integers(1, 4)).map(
                lambda c: tuple(c[0] * 10 + i for i in range(c[1]))
            ),
            st.sampled_from([(), (None, 5)]),
        ),
        st.sampled_from([CACHE_MIN_TOKENS - 1, CACHE_MIN_TOKENS, CACHE_MIN_TOKENS * 3]),
        st.sampled_from([0.0, 1.0, CACHE_TTL_S + 1]),  # time since the previous request
    ),
    max_size=30,
)


LRU = [("t|m", (10,)), ("t|m", (20,)), ("t|m", (10, 11)), ("t|m", (30,)), ("t|m", (10, 11, 12))]


@given(cache_requests, st.integers(1, 4))
@example([(scope, uids, CACHE_MIN_TOKENS * 3, 1.0) for scope, uids in LRU], 2)  # the LRU order
@settings(max_examples=300)
def test_the_counterfactual_cache_keeps_its_rule_over_any_sequence(
    requests: list[tuple[str, tuple[int | None, ...], int, float]], most: int
) -> None:
    cache, seen = CounterfactualCache(most), OrderedDict()  # type: ignore[var-annotated]
    now = 0.0
    for scope, uids, prompt, wait in requests:
        now += wait
        expected = plain_cached(seen, most, (scope, uids, prompt, now))
        assert cache.cached(scope, uids, prompt, now=now) == expected


per_million = st.one_of(st.none(), st.floats(0, 100))
pricings = st.builds(
    PricingConfig,
    model=st.just("no-such-model-anywhere"),  # the config's prices only
    input=per_million,
    output=per_million,
    cache_read=per_million,
    cache_write_5m=per_million,
    cache_write_1h=per_million,
    reasoning=per_million,
)
answered = st.tuples(usages, st.integers(1, 50_000), st.integers(1, 50_000), st.booleans())


@given(st.lists(answered, max_size=8), pricings)
@settings(max_examples=60, deadline=None)
def test_the_accountant_counts_exactly_what_the_bills_say(
    requests: list[tuple[Usage, int, int, bool]], pricing: PricingConfig
) -> None:
    """`Accountant.request` against the plain path: each arm billed with `bill`, each amount
    counted through `labels()` in the same order (so even float sums agree to the bit)."""
    route = SimpleNamespace(name="m", pricing=pricing, upstream_model="m")
    held, plain = Metrics(), Metrics()
    accountant, cache = Accountant(held), CounterfactualCache()
    prices = prices_for("no-such-model-anywhere", pricing.per_million())
    for usage, before, after, compacted in requests:
        priced = accountant.request(route, "t", usage, before, after, (1,), compacted)
        for tier, count in billed_tokens(usage).items():
            if count:
                plain.billed_tokens.labels(tier).inc(count)
        prompt = round(usage.input * before / (after if compacted else before))
        cached = cache.cached("t|m", (1,), prompt)
        if prices is None:
            plain.cost_partial.labels("actual").inc()
            assert priced is None
            continue
        actual = bill(usage, prices)
        writes = usage.cache_write_5m + usage.cache_write_1h > 0
        counterfactual = (
            bill(counterfactual_usage(usage, before, after, cached, writes), prices)
            if compacted
            else actual
        )
        assert priced == Priced(actual, counterfactual)
        for arm, result in (("actual", actual), ("counterfactual", counterfactual)):
            if result.partial:
                plain.cost_partial.labels(arm).inc()
                continue
            for component, usd in result.usd.items():
                plain.cost_usd.labels(arm, component).inc(usd)
        if priced.saved is not None:
            plain.net_saved_usd.inc(priced.saved)
    assert series(held) == series(plain)


# -- through the app ----------------------------------------------------------------------------


def priced_config(
    upstream: LocalUpstream, steps: list[dict[str, Any]] | None = None, events: str | None = None
) -> Any:
    pricing = {"input": 2.0, "output": 8.0, "cache_read": 0.5}
    model = {"tokenizer": "chars:4", "context_window": 4096, "pricing": pricing}
    steps = steps or [{"type": "fifo"}]
    return {**one_model(upstream.base_url, steps, **model), "events": {"path": events}}


async def test_the_price_map_is_read_while_the_gateway_starts(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """Reading litellm's price map takes about half a second: start-up pays it, not the first
    answered request after every start."""
    price_map.cache_clear()
    await start_app(priced_config(local_upstream))
    assert price_map.cache_info().currsize == 1


async def test_a_compacted_answer_says_what_it_cost_and_what_it_saved(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(priced_config(local_upstream))
    local_upstream.script(
        [
            {"kind": "ok", "content": "short", "prompt_tokens": 100, "completion_tokens": 10},
            {"kind": "ok", "content": "long", "prompt_tokens": 2000, "completion_tokens": 10},
        ]
    )
    small = await gw.http.post(
        f"{gw.base_url}/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert small.headers["x-compactgate-cost-usd"] == f"{(100 * 2 + 10 * 8) * PER_M:.6f}"
    assert (
        small.headers["x-compactgate-counterfactual-cost-usd"]
        == f"{(100 * 2 + 10 * 8) * PER_M:.6f}"
    )
    big = await gw.http.post(
        f"{gw.base_url}/chat/completions",
        json={"model": "m", "messages": chat_history(40), "max_tokens": 200},
    )
    assert big.headers["x-compactgate-steps"] == "fifo"
    before = int(big.headers["x-compactgate-tokens-before"])
    after = int(big.headers["x-compactgate-tokens-after"])
    actual = (2000 * 2 + 10 * 8) * PER_M
    counterfactual = (round(2000 * before / after) * 2 + 10 * 8) * PER_M
    assert float(big.headers["x-compactgate-cost-usd"]) == pytest.approx(actual, abs=1e-6)
    assert float(big.headers["x-compactgate-counterfactual-cost-usd"]) == pytest.approx(
        counterfactual, abs=1e-6
    )
    metric = await app_metric(gw, "compactgate_cost_usd_total", 'arm="actual",component="input"')
    assert metric == pytest.approx((100 + 2000) * 2 * PER_M)
    saved = await app_metric(gw, "compactgate_net_saved_usd_total")
    assert saved == pytest.approx(counterfactual - actual, rel=1e-3)
    fresh = await app_metric(gw, "compactgate_billed_tokens_total", 'tier="input"')
    assert fresh == 2100


async def test_failed_requests_save_nothing_and_unknown_prices_are_partial(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    config = priced_config(local_upstream)
    config["models"].append(
        {"name": "unpriced-model-x", "upstream": {"base_url": local_upstream.base_url}}
    )
    gw = await start_app(config)
    local_upstream.script(
        [
            {"kind": "error", "status": 400, "body": {"error": {"message": "refused"}}},
            {"kind": "ok", "content": "x", "prompt_tokens": 50, "completion_tokens": 5},
        ]
    )
    failed = await gw.http.post(
        f"{gw.base_url}/chat/completions",
        json={"model": "m", "messages": chat_history(40), "max_tokens": 200},
    )
    assert failed.status_code == 400
    assert "x-compactgate-cost-usd" not in failed.headers
    assert await app_metric(gw, "compactgate_net_saved_usd_total") == 0
    unpriced = await gw.http.post(
        f"{gw.base_url}/chat/completions",
        json={"model": "unpriced-model-x", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert unpriced.status_code == 200 and "x-compactgate-cost-usd" not in unpriced.headers
    assert await app_metric(gw, "compactgate_cost_partial_total", 'arm="actual"') == 1
    assert await app_metric(gw, "compactgate_cost_usd_total", 'arm="actual",component="input"') == 0


async def test_summariser_calls_are_the_gateways_own_spend(
    start_app: AppStarter, local_upstream: LocalUpstream, tmp_path: Path
) -> None:
    log = tmp_path / "events.jsonl"
    steps = [{"type": "compaction", "summary_tokens": 200}, {"type": "fifo"}]
    gw = await start_app(priced_config(local_upstream, steps, str(log)))
    # Every call (the summariser's, however many pieces it makes, and the client's) bills the
    # same usage.
    call = {"kind": "ok", "content": "<summary>S</summary>", "prompt_tokens": 1000}
    local_upstream.script([{**call, "completion_tokens": 50}] * 8)
    response = await gw.http.post(
        f"{gw.base_url}/chat/completions",
        json={"model": "m", "messages": chat_history(40), "max_tokens": 200},
    )
    assert response.status_code == 200
    assert response.headers["x-compactgate-steps"].startswith("compaction")
    calls = [r for r in local_upstream.chat_requests() if summary_call(r["json"])]
    assert calls
    own = len(calls) * (1000 * 2 + 50 * 8) * PER_M
    spent = await app_metric(gw, "compactgate_cost_usd_total", 'arm="actual",component="summaries"')
    assert spent == pytest.approx(own)
    actual = float(response.headers["x-compactgate-cost-usd"])
    counterfactual = float(response.headers["x-compactgate-counterfactual-cost-usd"])
    saved = await app_metric(gw, "compactgate_net_saved_usd_total")
    assert saved == pytest.approx(counterfactual - actual - own, abs=2e-6)
    await asyncio.sleep(0.05)  # events are written just after the response
    [event] = [json.loads(line) for line in log.read_text().splitlines()]
    assert event["cost_usd"] == pytest.approx(actual, abs=1e-6)
    assert event["counterfactual_usd"] == pytest.approx(counterfactual, abs=1e-6)
    assert event["saved_usd"] == pytest.approx(counterfactual - actual, abs=1e-6)
