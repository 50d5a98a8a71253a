"""What each request cost, what it would have cost without the gateway, and what we spent.

Prices come from the model price map bundled inside the installed litellm package (read as a
file, offline, without importing litellm), with per-model overrides from the config
(`models[].pricing`, USD per million tokens). A tier the response used but no price covers
makes the request's bill partial: it is counted as such, never as zero.

The bill reads every billed tier from the response's usage (`wire.usage.Usage`, one convention
for all three APIs): fresh input, cache reads, cache writes (5 minutes and 1 hour), output and
reasoning. The counterfactual is the client's own request at the same prices: its prompt is the
billed prompt scaled by the gateway's count of the uncompacted request over its count of what it
sent, and its cache is a simple per-conversation model of the provider's prefix cache: a request
that extends the conversation's previous request within `CACHE_TTL_S` reads that request's
prompt from the cache (at least `CACHE_MIN_TOKENS` of it), and writes the rest when the provider
bills writes (the actual response reported some). A request that was forwarded as it came costs
the same in both arms. The gateway's own spend is its summariser calls (including summaries made
ahead of need and never used); expansion rounds are billed with the answer they belong to, so
they are part of the actual arm.

Net saved = counterfactual - actual - own spend, and may be negative.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..wire.usage import Usage
from .events import EventLog

log = logging.getLogger("compactgate.costs")

PRICE_MAP_FILE = "model_prices_and_context_window_backup.json"
CACHE_TTL_S = 300.0  # the providers' default prompt-cache lifetime
CACHE_MIN_TOKENS = 1024  # shorter prompts are not cached (OpenAI; Anthropic's minimum is higher)
MAX_CONVERSATIONS = 4096
TIERS = ("input", "cache_read", "cache_write_5m", "cache_write_1h", "output", "reasoning")


@dataclass(frozen=True, slots=True)
class Prices:
    """USD per token of each tier; None where nothing says."""

    input: float | None = None
    output: float | None = None
    cache_read: float | None = None
    cache_write_5m: float | None = None
    cache_write_1h: float | None = None
    reasoning: float | None = None


@dataclass(frozen=True, slots=True)
class Bill:
    """USD by component (`input`, `cache_read`, `cache_write`, `output`); `partial` when a
    tier with tokens had no price (then `usd` holds only what could be priced)."""

    usd: Mapping[str, float]
    partial: bool = False

    @property
    def total(self) -> float:
        return sum(self.usd.values())


def billed_tokens(usage: Usage) -> dict[str, int]:
    """Tokens per billed tier (fresh input excludes the cache tiers; output excludes reasoning)."""
    writes = usage.cache_write_5m + usage.cache_write_1h
    return {
        "input": max(0, usage.input - usage.cache_read - writes),
        "cache_read": usage.cache_read,
        "cache_write_5m": usage.cache_write_5m,
        "cache_write_1h": usage.cache_write_1h,
        "output": max(0, usage.output - usage.reasoning),
        "reasoning": usage.reasoning,
    }


def bill(usage: Usage, prices: Prices) -> Bill:
    """What `usage` costs at `prices`. Reasoning is priced as output unless it has its own price;
    a cache tier without its own price is partial (its discount or premium is unknown)."""
    return _bill(billed_tokens(usage), prices)


# Each billed tier's component in a `Bill`: cache writes of both lifetimes are one component,
# reasoning is output.
COMPONENT = {
    "input": "input",
    "cache_read": "cache_read",
    "cache_write_5m": "cache_write",
    "cache_write_1h": "cache_write",
    "output": "output",
    "reasoning": "output",
}


def _bill(tokens: Mapping[str, int], prices: Prices) -> Bill:
    """`bill` of tokens already split by tier (`billed_tokens`), in `TIERS` order."""
    usd: dict[str, float] = {}
    partial = False
    for tier, count in tokens.items():
        if not count:
            continue
        price = getattr(prices, tier)
        if price is None and tier == "reasoning":
            price = prices.output
        if price is None:
            partial = True
            continue
        name = COMPONENT[tier]
        usd[name] = usd.get(name, 0.0) + count * price
    return Bill(usd, partial)


# -- prices -------------------------------------------------------------------------------------


@functools.cache
def price_map() -> Mapping[str, Any]:
    """litellm's bundled price map, or {} when litellm is not installed (read once)."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return {}
    for location in spec.submodule_search_locations:
        path = Path(location) / PRICE_MAP_FILE
        if path.is_file():
            try:
                loaded = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as error:
                log.warning("could not read the price map %s: %s", path, error)
                return {}
            return loaded if isinstance(loaded, dict) else {}
    return {}


def map_prices(model: str, table: Mapping[str, Any] | None = None) -> Prices | None:
    """The price map's entry for `model` (also tried without a `provider/` prefix)."""
    table = price_map() if table is None else table
    names = [model]
    if "/" in model:
        names.append(model.split("/", 1)[1])
    for name in names:
        entry = table.get(name)
        if isinstance(entry, dict) and isinstance(entry.get("input_cost_per_token"), int | float):
            return Prices(
                input=_number(entry.get("input_cost_per_token")),
                output=_number(entry.get("output_cost_per_token")),
                cache_read=_number(entry.get("cache_read_input_token_cost")),
                cache_write_5m=_number(entry.get("cache_creation_input_token_cost")),
                cache_write_1h=_number(entry.get("cache_creation_input_token_cost_above_1hr")),
                reasoning=_number(entry.get("output_cost_per_reasoning_token")),
            )
    return None


def prices_for(model: str, overrides: Mapping[str, float | None] | None) -> Prices | None:
    """The price map's prices for `model` with the config's overrides (USD per million) on top;
    None when neither knows an input price."""
    found = map_prices(model) or Prices()
    values = {tier: getattr(found, tier) for tier in TIERS}
    for tier, per_million in (overrides or {}).items():
        if per_million is not None:
            values[tier] = per_million / 1_000_000
    if values["input"] is None:
        return None
    return Prices(**values)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


# -- the counterfactual -------------------------------------------------------------------------


@dataclass(slots=True)
class _Seen:
    uids: tuple[int | None, ...]
    prompt: int  # the counterfactual prompt tokens of the conversation's last request
    at: float


class CounterfactualCache:
    """Per conversation: what the provider would have cached of the client's own requests."""

    def __init__(self, max_conversations: int = MAX_CONVERSATIONS) -> None:
        self._seen: OrderedDict[tuple[str, int], _Seen] = OrderedDict()
        self._max = max_conversations

    def cached(
        self, scope: str, uids: tuple[int | None, ...], prompt: int, now: float | None = None
    ) -> int:
        """Tokens of `prompt` the provider would read from its cache; remembers this request."""
        now = time.monotonic() if now is None else now
        if not uids or uids[0] is None:
            return 0
        key = (scope, uids[0])
        previous = self._seen.get(key)
        if previous is None:
            self._seen[key] = _Seen(uids, prompt, now)
            while len(self._seen) > self._max:
                self._seen.popitem(last=False)
            return 0
        hit = 0
        if (
            now - previous.at <= CACHE_TTL_S
            and previous.prompt >= CACHE_MIN_TOKENS
            and uids[: len(previous.uids)] == previous.uids
        ):
            hit = min(previous.prompt, prompt)
        previous.uids, previous.prompt, previous.at = uids, prompt, now  # this request, now
        self._seen.move_to_end(key)
        return hit


def counterfactual_usage(
    actual: Usage, tokens_before: int, tokens_after: int, cached: int, writes_billed: bool
) -> Usage:
    """The client's own request's usage: the billed prompt scaled to the uncompacted request,
    `cached` of it read from the cache, the rest written when the provider bills writes; the
    same answer (output and reasoning) as the actual one."""
    scale = tokens_before / tokens_after if tokens_after > 0 else 1.0
    prompt = round(actual.input * scale)
    cached = min(cached, prompt)
    write = prompt - cached if writes_billed else 0
    return Usage(
        input=prompt,
        output=actual.output,
        cache_read=cached,
        cache_write_5m=write,
        reasoning=actual.reasoning,
    )


# -- accounting ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Priced:
    """One answered request's bills; `counterfactual` is None when it could not be priced."""

    actual: Bill
    counterfactual: Bill | None

    @property
    def saved(self) -> float | None:
        """Counterfactual minus actual for this request (None when either is partial)."""
        if self.counterfactual is None or self.actual.partial or self.counterfactual.partial:
            return None
        return self.counterfactual.total - self.actual.total


class Accountant:
    """Prices answered requests and the gateway's own calls into the metrics."""

    def __init__(self, metrics: Any) -> None:
        self._metrics = metrics
        self._cache = CounterfactualCache()
        self._prices: dict[str, Prices | None] = {}
        self._billed = metrics.children(metrics.billed_tokens)  # by (tier,)
        self._usd = metrics.children(metrics.cost_usd)  # by (arm, component)
        self._partial = metrics.children(metrics.cost_partial)  # by (arm,)

    def prices(self, route: Any) -> Prices | None:
        name = route.name
        if name not in self._prices:
            if len(self._prices) > MAX_CONVERSATIONS:  # glob routes: one per model name sent
                self._prices.clear()
            pricing = route.pricing
            model = pricing.model if pricing is not None and pricing.model else route.upstream_model
            overrides = pricing.per_million() if pricing is not None else None
            self._prices[name] = prices_for(model, overrides)
            if self._prices[name] is None:
                log.info("model %s: no price known; its costs are counted as partial", name)
        return self._prices[name]

    def request(
        self,
        route: Any,
        tenant: str,
        usage: Usage,
        tokens_before: int,
        tokens_after: int,
        uids: tuple[int | None, ...],
        compacted: bool,
    ) -> Priced | None:
        """Price an answered request (both arms) and count it; None when no price is known."""
        tokens = billed_tokens(usage)
        billed = self._billed
        for tier, count in tokens.items():
            if count:
                billed[(tier,)].inc(count)
        prices = self.prices(route)
        scale_after = tokens_after if compacted else tokens_before
        prompt = round(usage.input * tokens_before / scale_after) if scale_after else usage.input
        cached = self._cache.cached(f"{tenant}|{route.name}", uids, prompt)
        if prices is None:
            self._partial[("actual",)].inc()
            return None
        actual = _bill(tokens, prices)
        if compacted:
            writes = usage.cache_write_5m + usage.cache_write_1h > 0
            counterfactual = bill(
                counterfactual_usage(usage, tokens_before, tokens_after, cached, writes), prices
            )
        else:
            counterfactual = actual  # forwarded as it came: the same request, the same bill
        priced = Priced(actual, counterfactual)
        spent = self._usd
        for arm, result in (("actual", actual), ("counterfactual", counterfactual)):
            if result.partial:
                self._partial[(arm,)].inc()
                continue
            for component, usd in result.usd.items():
                spent[(arm, component)].inc(usd)
        saved = priced.saved
        if saved is not None:
            self._metrics.net_saved_usd.inc(saved)
        return priced

    def own(self, route: Any, usage: Usage) -> Bill | None:
        """A summariser call: the gateway's own spend, taken off the net saving (its bill, None
        when no price is known)."""
        prices = self.prices(route)
        result = bill(usage, prices) if prices is not None else None
        if result is None or result.partial:
            self._metrics.cost_partial.labels("actual").inc()
            return result
        self._metrics.cost_usd.labels("actual", "summaries").inc(result.total)
        self._metrics.net_saved_usd.dec(result.total)
        return result


class OwnSpend:
    """A call the gateway made for itself (a summary, or an agent's compaction answered ahead
    of need): priced as the gateway's own spend, and kept with its time for `/ui`."""

    def __init__(self, costs: Accountant, events: EventLog) -> None:
        self._costs = costs
        self._events = events

    def __call__(self, route: Any, usage: Usage) -> None:
        spent = self._costs.own(route, usage)
        self._events.own_spend(None if spent is None or spent.partial else spent.total)
