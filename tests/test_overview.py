"""The operator page's aggregation (gateway/ops/overview.py): rows that add up, percentiles that are
ordered, time ranges that nest, and costs that never turn an unknown price into zero."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidRequestError
from gateway.http.admin import parse_range
from gateway.ops.events import OwnSpend, RequestSample
from gateway.ops.overview import APIS, Row, costs, overview, percentile, row

NOW = 1_800_000_000.0
STARTED = NOW - 200_000.0
COUNTED = (
    "requests",
    "answered",
    "errors",
    "compacted",
    "tokens_before",
    "tokens_saved",
    "retries",
    "context_errors_avoided",
    "internal_rounds",
    "unpriced",
)

usd = st.floats(min_value=0, max_value=5, allow_nan=False)


@st.composite
def samples(draw: st.DrawFn) -> RequestSample:
    status = draw(st.sampled_from([200, 200, 200, 201, 400, 404, 429, 499, 502]))
    total = draw(st.floats(min_value=0, max_value=120_000, allow_nan=False))
    before = draw(st.integers(0, 200_000))
    retries = draw(st.integers(0, 2))
    actual = draw(st.none() | usd)
    counterfactual = draw(st.none() | usd)
    answered = status < 400
    return RequestSample(
        ts=draw(st.floats(min_value=STARTED, max_value=NOW)),
        request_id=draw(st.text(min_size=1, max_size=4)),
        api=draw(st.sampled_from([*APIS, "count_tokens"])),
        model=draw(st.sampled_from(["a", "b", "c", "-"])),
        tenant=draw(st.sampled_from(["", "t1", "t2"])),
        status=status,
        reason="" if answered else draw(st.sampled_from(["", "model_not_found", "upstream 502"])),
        total_ms=total,
        upstream_ms=draw(st.floats(min_value=0, max_value=total)) if total else 0.0,
        tokens_before=before,
        tokens_after=draw(st.integers(0, before)),
        observe=draw(st.booleans()),
        steps=draw(st.sampled_from(["none", "fifo", "tool_output_cache,fifo"])),
        retries=retries,
        context_errors=draw(st.integers(retries, retries + 1)),
        internal_rounds=draw(st.integers(0, 3)),
        cost_usd=actual if answered else None,
        counterfactual_usd=counterfactual if answered else None,
        saved_usd=(
            counterfactual - actual
            if answered and actual is not None and counterfactual is not None
            else None
        ),
    )


spends = st.lists(
    st.builds(OwnSpend, st.floats(min_value=STARTED, max_value=NOW), st.none() | usd),
    max_size=8,
)
ranges = st.none() | st.floats(min_value=1, max_value=300_000)


def sums(rows: list[Row], total: Row) -> None:
    for name in COUNTED:
        assert sum(getattr(r, name) for r in rows) == getattr(total, name), name
    assert math.isclose(sum(r.cost_usd for r in rows), total.cost_usd, abs_tol=1e-9)
    assert sum(sum(r.reasons.values()) for r in rows) == total.errors


@settings(max_examples=60, deadline=None)
@given(st.lists(samples(), max_size=40), spends, ranges)
def test_every_breakdown_sums_to_the_totals(
    kept: list[RequestSample], spend: list[OwnSpend], range_s: float | None
) -> None:
    view = overview(kept, spend, now=NOW, range_s=range_s, covered_from=STARTED)
    for rows in (view.models, view.apis, view.tenants):
        sums(rows, view.totals)
    assert {r.key for r in view.apis} >= set(APIS)  # the three APIs always have a row
    assert view.totals.requests == sum(1 for s in kept if range_s is None or s.ts >= NOW - range_s)
    assert view.totals.errors == sum(view.totals.reasons.values())


@settings(max_examples=60, deadline=None)
@given(st.lists(samples(), max_size=40), ranges)
def test_percentiles_are_ordered_and_happened(
    kept: list[RequestSample], range_s: float | None
) -> None:
    view = overview(kept, [], now=NOW, range_s=range_s, covered_from=STARTED)
    for r in [view.totals, *view.models, *view.apis, *view.tenants]:
        if not r.requests:
            assert r.p50_ms is None and r.p99_ms is None
            continue
        assert r.p50_ms is not None and r.p99_ms is not None
        assert r.p50_ms <= r.p99_ms
        assert r.overhead_p50_ms is not None and r.overhead_p99_ms is not None
        assert 0 <= r.overhead_p50_ms <= r.overhead_p99_ms <= r.p99_ms
        latencies = {s.total_ms for s in kept if s.model == r.key or r.key == "all"}
        if r in view.models or r is view.totals:
            assert r.p50_ms in latencies and r.p99_ms in latencies


@settings(max_examples=50, deadline=None)
@given(
    st.lists(samples(), max_size=40),
    spends,
    st.floats(min_value=1, max_value=300_000),
    st.floats(min_value=1, max_value=300_000),
)
def test_a_longer_range_never_counts_less(
    kept: list[RequestSample], spend: list[OwnSpend], a: float, b: float
) -> None:
    short, long = sorted((a, b))
    views = [
        overview(kept, spend, now=NOW, range_s=r, covered_from=STARTED) for r in (short, long, None)
    ]
    for name in COUNTED:
        counts = [getattr(v.totals, name) for v in views]
        assert counts == sorted(counts), name
    calls = [v.costs.own_calls for v in views]
    assert calls == sorted(calls)


@settings(max_examples=60, deadline=None)
@given(st.lists(samples(), max_size=40), spends)
def test_net_saved_is_counterfactual_minus_actual_minus_own_spend_where_priced(
    kept: list[RequestSample], spend: list[OwnSpend]
) -> None:
    result = costs(kept, spend)
    answered = [s for s in kept if s.answered]
    own = sum(o.usd for o in spend if o.usd is not None)
    saved = sum(s.saved_usd for s in answered if s.saved_usd is not None)
    assert math.isclose(result.net_saved_usd, saved - own, abs_tol=1e-9)
    assert result.unpriced == sum(s.cost_usd is None for s in answered)
    assert result.own_unpriced == sum(o.usd is None for o in spend)
    assert result.partial == bool(
        result.unpriced or result.unpriced_counterfactual or result.own_unpriced
    )


def sample(**fields: object) -> RequestSample:
    defaults: dict[str, object] = {
        "ts": NOW - 1,
        "request_id": "r",
        "api": "chat",
        "model": "m",
        "tenant": "t",
        "status": 200,
    }
    return RequestSample(**{**defaults, **fields})  # type: ignore[arg-type]


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(100, 0, -1)]  # 1..100, unsorted
    assert percentile(values, 0.5) == 50
    assert percentile(values, 0.99) == 99
    assert percentile(values, 1.0) == 100
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([], 0.5) is None


def test_an_unknown_price_is_counted_as_unpriced_never_as_zero() -> None:
    priced = sample(cost_usd=0.002, counterfactual_usd=0.005, saved_usd=0.003)
    unpriced = sample(model="local")  # no price known: cost_usd None
    failed = sample(status=502, reason="upstream 502")
    result = row("all", [priced, unpriced, failed], 60.0)
    assert result.cost_usd == pytest.approx(0.002) and result.unpriced == 1
    assert result.answered == 2 and result.errors == 1
    alone = row("local", [unpriced], 60.0)
    assert alone.cost_usd == 0 and alone.unpriced == alone.answered == 1  # shown as unknown
    total = costs([priced, unpriced, failed], [OwnSpend(NOW, 0.001), OwnSpend(NOW, None)])
    assert total.partial and total.unpriced == 1 and total.own_unpriced == 1
    assert total.net_saved_usd == pytest.approx(0.003 - 0.001)


def test_a_failed_request_saves_nothing_and_its_reason_is_counted() -> None:
    failed = sample(status=502, reason="upstream 502", tokens_before=900, tokens_after=300)
    answered = sample(tokens_before=900, tokens_after=300, steps="fifo")
    shadow = sample(tokens_before=900, tokens_after=300, steps="fifo", observe=True)
    result = row("m", [failed, answered, shadow], 10.0)
    assert result.tokens_saved == 600  # only the answered, enforced one
    assert result.compacted == 1  # shadow mode compacts nothing
    assert result.reasons == {"upstream 502": 1}


def test_context_errors_avoided_are_retries_that_got_an_answer() -> None:
    recovered = sample(context_errors=1, retries=1)
    refused = sample(context_errors=2, retries=1, status=400, reason="context_length_exceeded")
    over_but_compacted = sample(tokens_before=9000, tokens_after=3000, steps="fifo")
    result = row("m", [recovered, refused, over_but_compacted], 10.0)
    assert result.context_errors_avoided == 1 and result.retries == 2


def test_rates_use_the_part_of_the_range_the_samples_cover() -> None:
    kept = [sample(ts=NOW - i) for i in range(30)]
    started_recently = overview(kept, [], now=NOW, range_s=3600, covered_from=NOW - 60)
    assert started_recently.span_s == 60 and started_recently.totals.rate_per_s == 0.5
    view = overview(kept, [], now=NOW, range_s=10, covered_from=NOW - 60)
    assert view.totals.requests == 11 and view.span_s == 10  # ts >= now - 10: 0..10


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5m", 300), ("1h", 3600), ("24h", 86400), ("90", 90), ("90s", 90), ("2d", 172800)],
)
def test_range_parses_durations(text: str, seconds: float) -> None:
    assert parse_range(text) == seconds


def test_range_all_and_bad_ranges() -> None:
    assert parse_range("all") is None
    for bad in ("", "0", "-5m", "soon", "5y", "inf", "nan"):
        with pytest.raises(InvalidRequestError) as error:
            parse_range(bad)
        assert error.value.param == "range"
