"""What the operator page shows, aggregated from the in-memory request samples of `events`.

Pure functions: samples and the clock's reading in, typed rows out. The rules they keep:
every sample in the time range is counted once in the totals and once in each breakdown (by
model, by wire API, by tenant), so each table's rows sum to the totals; percentiles are
nearest-rank over the range's own values, so p50 <= p99 and both are latencies that happened;
a cost whose price is unknown is left out of the sum and counted as unpriced (the total is then
partial), never counted as zero; a request that failed saved nothing.

"Context errors avoided" is an observed fact, not an estimate: a request the upstream refused
for its context length that the gateway then got answered by compacting harder and retrying
(the same count as `compactgate_context_errors_avoided_total`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .events import OwnSpend, RequestSample

APIS = ("chat", "responses", "messages")  # always shown, with zeros when unused


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank `q`-quantile (0 < q <= 1) of `values`; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True, slots=True)
class Row:
    """One line of a breakdown: the requests that share `key` in the time range."""

    key: str
    requests: int
    rate_per_s: float
    answered: int
    errors: int
    reasons: dict[str, int]  # error reason -> requests, most frequent first
    p50_ms: float | None
    p99_ms: float | None
    overhead_p50_ms: float | None
    overhead_p99_ms: float | None
    compacted: int
    tokens_before: int
    tokens_saved: int
    retries: int
    context_errors_avoided: int
    internal_rounds: int
    cost_usd: float  # the known part
    unpriced: int  # answered requests whose cost is unknown


class Tally:
    """Running sums for one row; `add` takes each sample once (one pass over the range feeds
    the totals and every breakdown)."""

    __slots__ = (
        "answered",
        "avoided",
        "compacted",
        "cost",
        "overheads",
        "reasons",
        "requests",
        "retries",
        "rounds",
        "tokens_before",
        "tokens_saved",
        "totals",
        "unpriced",
    )

    def __init__(self) -> None:
        self.requests = self.answered = self.compacted = self.tokens_before = 0
        self.tokens_saved = self.retries = self.avoided = self.rounds = self.unpriced = 0
        self.cost = 0.0
        self.reasons: dict[str, int] = {}
        self.totals: list[float] = []
        self.overheads: list[float] = []

    def add(self, s: RequestSample) -> None:
        self.requests += 1
        self.totals.append(s.total_ms)
        self.overheads.append(s.overhead_ms)
        self.compacted += s.compacted
        self.tokens_before += s.tokens_before
        self.retries += s.retries
        self.rounds += s.internal_rounds
        if s.answered:
            self.answered += 1
            self.tokens_saved += s.tokens_saved
            self.avoided += s.recovered
            if s.cost_usd is None:
                self.unpriced += 1
            else:
                self.cost += s.cost_usd
        else:
            reason = s.reason or f"status {s.status}"
            self.reasons[reason] = self.reasons.get(reason, 0) + 1

    def row(self, key: str, span_s: float) -> Row:
        return Row(
            key=key,
            requests=self.requests,
            rate_per_s=self.requests / span_s if span_s > 0 else 0.0,
            answered=self.answered,
            errors=self.requests - self.answered,
            reasons=dict(sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
            p50_ms=percentile(self.totals, 0.5),
            p99_ms=percentile(self.totals, 0.99),
            overhead_p50_ms=percentile(self.overheads, 0.5),
            overhead_p99_ms=percentile(self.overheads, 0.99),
            compacted=self.compacted,
            tokens_before=self.tokens_before,
            tokens_saved=self.tokens_saved,
            retries=self.retries,
            context_errors_avoided=self.avoided,
            internal_rounds=self.rounds,
            cost_usd=self.cost,
            unpriced=self.unpriced,
        )


def row(key: str, samples: Iterable[RequestSample], span_s: float) -> Row:
    """Aggregate `samples` (all in one range lasting `span_s` seconds) into one row."""
    tally = Tally()
    for s in samples:
        tally.add(s)
    return tally.row(key, span_s)


def _group(groups: dict[str, Tally], key: str) -> Tally:
    tally = groups.get(key)
    if tally is None:
        tally = groups[key] = Tally()
    return tally


def _rows(tallies: dict[str, Tally], span_s: float) -> list[Row]:
    """Busiest first."""
    rows = [tally.row(name, span_s) for name, tally in tallies.items()]
    return sorted(rows, key=lambda r: (-r.requests, r.key))


@dataclass(frozen=True, slots=True)
class Costs:
    """USD over the range. Net saved = counterfactual - actual - own spend, over the answered
    requests whose both arms are priced, minus the priced own calls; it may be negative."""

    actual_usd: float
    counterfactual_usd: float
    own_usd: float
    net_saved_usd: float
    answered: int
    unpriced: int  # answered requests whose actual cost is unknown
    unpriced_counterfactual: int
    own_calls: int
    own_unpriced: int
    partial: bool = field(init=False)

    def __post_init__(self) -> None:
        partial = bool(self.unpriced or self.unpriced_counterfactual or self.own_unpriced)
        object.__setattr__(self, "partial", partial)


def costs(samples: Sequence[RequestSample], spend: Sequence[OwnSpend]) -> Costs:
    answered = [s for s in samples if s.answered]
    own_known = [o.usd for o in spend if o.usd is not None]
    own = sum(own_known)
    return Costs(
        actual_usd=sum(s.cost_usd for s in answered if s.cost_usd is not None),
        counterfactual_usd=sum(
            s.counterfactual_usd for s in answered if s.counterfactual_usd is not None
        ),
        own_usd=own,
        net_saved_usd=sum(s.saved_usd for s in answered if s.saved_usd is not None) - own,
        answered=len(answered),
        unpriced=sum(s.cost_usd is None for s in answered),
        unpriced_counterfactual=sum(s.counterfactual_usd is None for s in answered),
        own_calls=len(spend),
        own_unpriced=len(spend) - len(own_known),
    )


@dataclass(frozen=True, slots=True)
class Overview:
    """The operator page's numbers for one time range."""

    since: float | None  # start of the range; None: everything kept
    covered_from: float  # the oldest moment the kept samples describe
    span_s: float  # the range's duration, as far as the samples cover it
    totals: Row
    models: list[Row]
    apis: list[Row]
    tenants: list[Row]
    costs: Costs


def overview(
    samples: Iterable[RequestSample],
    spend: Iterable[OwnSpend],
    *,
    now: float,
    range_s: float | None,
    covered_from: float,
) -> Overview:
    """Aggregate the samples of the last `range_s` seconds (None: all kept) as of `now`.

    `covered_from` is when the kept samples start: the log's start, or the oldest sample once
    older ones were dropped; rates are per second of the covered part of the range.
    """
    since = None if range_s is None else now - range_s
    start = covered_from if since is None else max(since, covered_from)
    span = max(1.0, now - start)
    chosen = [s for s in samples if since is None or s.ts >= since]
    totals = Tally()
    models: dict[str, Tally] = {}
    apis = {name: Tally() for name in APIS}
    tenants: dict[str, Tally] = {}
    for s in chosen:
        totals.add(s)
        _group(models, s.model).add(s)
        _group(apis, s.api).add(s)
        _group(tenants, s.tenant or "-").add(s)
    return Overview(
        since=since,
        covered_from=covered_from,
        span_s=span,
        totals=totals.row("all", span),
        models=_rows(models, span),
        apis=_rows(apis, span),
        tenants=_rows(tenants, span),
        costs=costs(chosen, [o for o in spend if since is None or o.ts >= since]),
    )
