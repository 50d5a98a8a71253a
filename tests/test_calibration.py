"""Calibration on a recorded usage series: it converges, stays bounded, and then leaves the
counts alone, so identical bodies get identical counts.

The series (tests/fixtures/calibration/) was recorded from the real SmolLM2 on llama.cpp: a
growing conversation, the gateway's uncalibrated `chars:4` count of each request and the prompt
tokens llama.cpp reported for it. Replayed here in process, as the request path would see it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config import parse_config
from gateway.counting.tokenizers import CharsTokenizer
from gateway.ops.metrics import Metrics
from gateway.path.calibration import BOUNDS, Calibration
from gateway.routing import Route, Router

SERIES = json.loads(
    (Path(__file__).parent / "fixtures/calibration/llamacpp_smollm2_series.json").read_text()
)["series"]


def route() -> Route:
    config = {
        "models": [{"name": "m", "upstream": {"base_url": "http://x/v1"}, "tokenizer": "chars:4"}]
    }
    found = Router(parse_config(config)).resolve("m")
    assert found is not None
    return found


def correction_of(route: Route) -> float:
    tokenizer = route.counter.tokenizer
    assert isinstance(tokenizer, CharsTokenizer)
    return tokenizer.correction


def replay(route: Route, calibration: Calibration, series: list[dict[str, int]]) -> list[int]:
    """Each recorded request counted with the multiplier in use, then its usage observed;
    returns the estimates the gateway made."""
    estimates = []
    for row in series:
        used = correction_of(route)
        estimated = math.ceil(row["estimated"] * used)
        estimates.append(estimated)
        calibration.observe(route, estimated, row["reported"], used)
    return estimates


def test_a_recorded_series_converges_and_then_counts_stay_put() -> None:
    r = route()
    calibration = Calibration(Metrics())
    estimates = replay(r, calibration, SERIES)
    errors = [
        abs(e - row["reported"]) / row["reported"] for e, row in zip(estimates, SERIES, strict=True)
    ]
    assert max(errors[:3]) > 0.05  # uncalibrated, the heuristic is off
    assert max(errors[-10:]) < 0.05, errors[-10:]  # calibrated: within 5 %
    settled = correction_of(r)
    # Replayed again (the same requests, sent again): the multiplier does not move, so every
    # identical body is counted exactly as the last time.
    again = replay(r, calibration, SERIES[-10:])
    assert correction_of(r) == settled
    assert replay(r, calibration, SERIES[-10:]) == again


def test_identical_bodies_get_identical_counts_in_a_row() -> None:
    """A new model's first identical requests are counted once uncalibrated, then the same every
    time (a step-by-step calibration gave 7,905, 8,310, 8,612, 8,824 and 8,824 for one body);
    after calibration, five identical requests get five identical counts."""
    r = route()
    calibration = Calibration(Metrics())
    row = SERIES[-1]
    first = replay(r, calibration, [row] * 8)
    assert len(set(first)) <= 2 and len(set(first[3:])) == 1, first
    assert abs(first[-1] - row["reported"]) / row["reported"] < 0.01
    replay(r, calibration, SERIES)
    assert len(set(replay(r, calibration, [row] * 5))) == 1


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 100_000), st.floats(0.001, 1000, allow_nan=False)),
        min_size=1,
        max_size=60,
    )
)
def test_the_multiplier_stays_within_bounds_whatever_the_upstream_reports(
    rows: list[tuple[int, float]],
) -> None:
    r = route()
    calibration = Calibration(Metrics())
    series = [{"estimated": e, "reported": max(1, int(e * ratio))} for e, ratio in rows]
    replay(r, calibration, series)
    assert BOUNDS[0] <= correction_of(r) <= BOUNDS[1]
