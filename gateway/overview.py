"""What the operator page shows, aggregated from the in-memory request samples of `events`.

Pure functions: samples and the clock's reading in, typed rows out. The rules they keep:
every sample in the time range is counted once in the totals and once in each breakdown (by
model, by wire API, by tenant), so each table's rows sum to the totals; percentiles are
nearest-rank over the range's own values, so p50 <= p99 and both are latencies that happened;
a cost whose price is unknown is left out of the sum and counted as unpriced (the total is then
partial), never counted as zero; a request that failed saved nothing.

"Context errors avoided" is an observed fact, not an estimate: a request the upstream refused
for its context length that the gateway then got answered by compacting harder and retrying
(the same count as `compactgate_context_errors_recovered_total`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
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


def row(key: str, samples: Sequence[RequestSample], span_s: float) -> Row:
    """Aggregate `samples` (all in one range lasting `span_s` seconds) into one row."""
    reasons: dict[str, int] = {}
    for s in samples:
        if not s.answered:
            reason = s.reason or f"status {s.status}"
            reasons[reason] = reasons.get(reason, 0) + 1
    totals = [s.total_ms for s in samples]
    overheads = [s.overhead_ms for s in samples]
    answered = [s for s in samples if s.answered]
    return Row(
        key=key,
        requests=len(samples),
        rate_per_s=len(samples) / span_s if span_s > 0 else 0.0,
        answered=len(answered),
        errors=len(samples) - len(answered),
        reasons=dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        p50_ms=percentile(totals, 0.5),
        p99_ms=percentile(totals, 0.99),
        overhead_p50_ms=percentile(overheads, 0.5),
        overhead_p99_ms=percentile(overheads, 0.99),
        compacted=sum(s.compacted for s in samples),
        tokens_before=sum(s.tokens_before for s in samples),
        tokens_saved=sum(s.tokens_saved for s in samples),
        retries=sum(s.retries for s in samples),
        context_errors_avoided=sum(s.recovered for s in samples),
        internal_rounds=sum(s.internal_rounds for s in samples),
        cost_usd=sum(s.cost_usd for s in answered if s.cost_usd is not None),
        unpriced=sum(s.cost_usd is None for s in answered),
    )


def breakdown(
    samples: Sequence[RequestSample],
    key: Callable[[RequestSample], str],
    span_s: float,
    always: Iterable[str] = (),
) -> list[Row]:
    """One row per distinct key (plus `always`, even when empty), busiest first."""
    groups: dict[str, list[RequestSample]] = {name: [] for name in always}
    for s in samples:
        groups.setdefault(key(s), []).append(s)
    rows = [row(name, members, span_s) for name, members in groups.items()]
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
    chosen = [s for s in samples if since is None or s.ts >= since]
    paid = [o for o in spend if since is None or o.ts >= since]
    span = max(1.0, now - start)
    return Overview(
        since=since,
        covered_from=covered_from,
        span_s=span,
        totals=row("all", chosen, span),
        models=breakdown(chosen, lambda s: s.model, span),
        apis=breakdown(chosen, lambda s: s.api, span, APIS),
        tenants=breakdown(chosen, lambda s: s.tenant or "-", span),
        costs=costs(chosen, paid),
    )
