"""What a model's effective window becomes from what its upstream answered and refused
(gateway/path/windows.py, design D2.4), as a sequence of events: never raised, never below a
prompt the upstream answered, and below every numbers-less refusal of a prompt larger than any
it answered."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.config import parse_config
from gateway.ops.metrics import Metrics
from gateway.path.windows import Windows
from gateway.routing import Route, Router

CONFIGURED = 100_000

events = st.lists(
    st.one_of(
        st.tuples(st.just("served"), st.integers(1, 150_000), st.just(0)),
        st.tuples(st.just("refused"), st.integers(1, 150_000), st.integers(0, 20_000)),
        st.tuples(st.just("stated"), st.integers(1, 150_000), st.just(0)),
    ),
    max_size=30,
)


def route() -> Route:
    config = {
        "models": [
            {"name": "m", "upstream": {"base_url": "http://127.0.0.1:9/v1"},
             "context_window": CONFIGURED, "tokenizer": "chars:4"}
        ]
    }  # fmt: skip
    found = Router(parse_config(config)).resolve("m")
    assert found is not None
    return found


@given(events)
def test_the_window_follows_what_the_upstream_answered_and_refused(
    happened: list[tuple[str, int, int]],
) -> None:
    windows, model = Windows(Metrics()), route()
    effective = windows.effective(model)
    largest_served = 0
    for kind, tokens, reserved in happened:
        if kind == "served":
            windows.served(model, tokens)
        elif kind == "refused":
            windows.refused(model, tokens, reserved, "test")
        else:
            windows.learn(model, tokens, "test")
        now = windows.effective(model)
        assert now is not None and effective is not None
        assert now <= effective  # never raised
        if kind == "refused" and tokens > largest_served:
            assert now <= tokens + reserved  # the refusal bounds it
        if kind == "refused" and tokens <= largest_served:
            assert now == effective  # a refusal of what was answered before teaches nothing
        if kind == "served":
            largest_served = max(largest_served, tokens)
        effective = now
