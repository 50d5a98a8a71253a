"""Several upstreams per model name: balanced by weight, failed over on connection failures,
5xx and 429 (a 429's Retry-After keeps that upstream last), on every API path."""

from __future__ import annotations

import random
import re
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import UpstreamConfig
from gateway.upstream.failover import Balancer
from tests.in_process import AppStarter, LocalUpstream

SMALL = [{"role": "user", "content": "hello"}]
BACKUP = 1e-9  # a weight that all but never leads: the test knows which upstream goes first


def dead_url() -> str:
    """A loopback port nothing listens on (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def two_upstreams(first: str, second: str, **model: object) -> dict:
    return {
        "models": [
            {
                "name": "m",
                "upstreams": [
                    {"base_url": first, "weight": 1},
                    {"base_url": second, "weight": BACKUP},
                ],
                "context_window": 100_000,
                **model,
            }
        ]
    }


def metric(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    found = re.search(rf"^{name}\{{{re.escape(wanted)}\}} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def test_a_dead_upstream_is_failed_over_and_then_left_alone(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    dead = dead_url()
    app = await start_app(two_upstreams(dead, local_upstream.base_url))
    for _ in range(3):
        reply = await app.openai().chat.completions.create(model="m", messages=SMALL)
        assert reply.choices[0].message.content
    assert len(local_upstream.chat_requests()) == 3
    text = (await app.http.get(f"{app.url}/metrics")).text
    # Only the first request met the dead upstream: it rests, the next two went straight on.
    assert metric(text, "compactgate_upstream_failovers_total", model="m", reason="connect") == 1
    port = dead.split(":")[2].split("/")[0]
    assert (
        f"upstream failover: model=m from=127.0.0.1:{port} reason=connect "
        f"to=127.0.0.1:{local_upstream.port}"
    ) in app.logs()


async def test_a_429_moves_on_at_once_and_its_retry_after_keeps_the_upstream_last(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    async with LocalUpstream.serve() as limited:
        app = await start_app(two_upstreams(limited.base_url, local_upstream.base_url))
        limited.script(
            [{"kind": "error", "status": 429, "headers": {"Retry-After": "30"}, "body": {}}]
        )
        for _ in range(3):
            reply = await app.openai(max_retries=0).chat.completions.create(
                model="m", messages=SMALL
            )
            assert reply.choices[0].message.content
        # Asked once; for the next 30 s the other upstream leads, though this one would answer.
        assert len(limited.chat_requests()) == 1
        assert len(local_upstream.chat_requests()) == 3
        text = (await app.http.get(f"{app.url}/metrics")).text
        assert metric(text, "compactgate_upstream_failovers_total", model="m", reason="429") == 1


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
async def test_a_503_fails_over_on_every_compacting_api(
    start_app: AppStarter, local_upstream: LocalUpstream, api: str
) -> None:
    async with LocalUpstream.serve() as failing:
        app = await start_app(two_upstreams(failing.base_url, local_upstream.base_url))
        failing.script([{"kind": "error", "status": 503, "body": {"error": {"message": "busy"}}}])
        if api == "chat":
            reply = await app.openai(max_retries=0).chat.completions.create(
                model="m", messages=SMALL
            )
            assert reply.choices[0].message.content
        elif api == "responses":
            answer = await app.openai(max_retries=0).responses.create(model="m", input="hello")
            assert answer.output_text
        else:
            message = await app.anthropic(max_retries=0).messages.create(
                model="m", max_tokens=50, messages=SMALL
            )
            assert message.content[0].text  # type: ignore[union-attr]
        assert len(failing.requests()) == 1 and len(local_upstream.requests()) == 1
        assert local_upstream.requests()[0]["path"] == failing.requests()[0]["path"]
        text = (await app.http.get(f"{app.url}/metrics")).text
        assert metric(text, "compactgate_upstream_failovers_total", model="m", reason="503") == 1


async def test_passthrough_fails_over_once_per_upstream(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    app = await start_app(two_upstreams(dead_url(), local_upstream.base_url))
    response = await app.http.post(
        f"{app.base_url}/embeddings", json={"model": "m", "input": "hello"}
    )
    assert response.status_code == 200 and response.json()["object"] == "list"
    [sent] = local_upstream.requests()
    assert sent["path"] == "/v1/embeddings"


async def test_every_upstream_is_tried_before_any_is_tried_again(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """Both fail once: the request goes to each in turn, then back to the first (whichever
    led), and the client still gets its answer."""
    async with LocalUpstream.serve() as other:
        config = two_upstreams(other.base_url, local_upstream.base_url)
        for upstream in config["models"][0]["upstreams"]:
            upstream["weight"] = 1
        config["models"][0]["retry"] = {"max_attempts": 3, "backoff_base_seconds": 0}
        app = await start_app(config)
        for fake in (other, local_upstream):
            fake.script([{"kind": "error", "status": 502, "body": {}}])
        reply = await app.openai(max_retries=0).chat.completions.create(model="m", messages=SMALL)
        assert reply.choices[0].message.content
        counts = sorted([len(other.chat_requests()), len(local_upstream.chat_requests())])
        assert counts == [1, 2]


async def test_a_single_upstream_keeps_its_plain_retries(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    config = {
        "models": [
            {
                "name": "m",
                "upstream": {"base_url": local_upstream.base_url},
                "retry": {"max_attempts": 2, "backoff_base_seconds": 0},
            }
        ]
    }
    app = await start_app(config)
    local_upstream.script([{"kind": "error", "status": 503, "body": {}}])
    reply = await app.openai(max_retries=0).chat.completions.create(model="m", messages=SMALL)
    assert reply.choices[0].message.content and len(local_upstream.chat_requests()) == 2
    text = (await app.http.get(f"{app.url}/metrics")).text
    assert metric(text, "compactgate_upstream_failovers_total", model="m", reason="503") == 0


# -- the balancer's order --------------------------------------------------------------------


def upstream(index: int, weight: float = 1.0) -> UpstreamConfig:
    return UpstreamConfig(base_url=f"http://10.0.0.{index}/v1", weight=weight)


@given(
    weights=st.lists(st.floats(0.01, 100), min_size=2, max_size=6),
    resting=st.sets(st.integers(0, 5)),
    seed=st.integers(0, 2**32),
)
def test_the_order_is_every_upstream_once_healthy_ones_first(
    weights: list[float], resting: set[int], seed: int
) -> None:
    now = [100.0]
    balancer = Balancer(clock=lambda: now[0], rng=random.Random(seed))
    upstreams = [upstream(i, w) for i, w in enumerate(weights)]
    rested = sorted(i for i in resting if i < len(upstreams))
    for rank, i in enumerate(rested):
        balancer.rest(upstreams[i], 10.0 + rank)
    order = balancer.order(upstreams)
    assert sorted(order) == list(range(len(upstreams)))
    assert order[len(order) - len(rested) :] == rested  # resting last, soonest back first
    now[0] += 60.0  # every rest is over: all healthy again
    assert not any(balancer.resting(u) for u in upstreams)


def test_weights_set_the_share_of_requests_led() -> None:
    balancer = Balancer(rng=random.Random(7))
    upstreams = [upstream(1, 3.0), upstream(2, 1.0)]
    led = [balancer.order(upstreams)[0] for _ in range(4000)]
    assert 0.72 < led.count(0) / len(led) < 0.78  # 3 : 1


async def test_the_summariser_fails_over_too(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """A summary is a call to the model's upstreams like any other: one down does not stop it."""
    from tests.test_summaries_e2e import WINDOW, app_post, chat_history, summary_script

    config = two_upstreams(dead_url(), local_upstream.base_url)
    config["models"][0].update(context_window=WINDOW, tokenizer="chars:4", policy="summ")
    config["policies"] = {
        "summ": {"steps": [{"type": "compaction", "summary_tokens": 200}, {"type": "fifo"}]}
    }
    config["summaries"] = {"precompute": False, "retry_failed_after_s": 0}
    app = await start_app(config)
    local_upstream.script([summary_script("SUMMARY-AFTER-FAILOVER")])
    response, _ = await app_post(app, chat_history(16))
    assert response.status_code == 200
    assert response.headers["x-compactgate-steps"].split(",")[0] == "compaction"
    sent = local_upstream.chat_requests()[-1]
    assert "SUMMARY-AFTER-FAILOVER" in str(sent["json"]["messages"])
