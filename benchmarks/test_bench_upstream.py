"""The benchmark's fast upstream speaks the agent APIs in their real shapes, and its report keeps
what was written by hand.

The official SDKs are the judges of "real shape": the openai SDK reads a Responses answer and its
event stream (ending in `response.completed`), the anthropic SDK a Messages answer and its stream
(`message_start` ... `message_stop`), both from the benchmark's upstream process, through the
do-nothing relay the benchmark measures the gateway against. A peer proxy that parses what it
relays (LiteLLM, headroom) would fail on anything less.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import anthropic
import openai
import pytest

from benchmarks import agent_bodies, report
from benchmarks.load import Batch
from tests.conftest import Starter

pytestmark = pytest.mark.e2e


@pytest.fixture
def relay(start_process: Starter) -> Iterator[str]:
    upstream = start_process(
        [sys.executable, "-m", "benchmarks.fast_upstream", "--port", "0"], r"^READY (\d+)$"
    )
    assert upstream.match is not None
    origin = f"http://127.0.0.1:{upstream.match.group(1)}"
    relay = start_process(
        [sys.executable, "-m", "benchmarks.relay_floor", "--upstream", origin, "--port", "0"],
        r"^READY (\d+)$",
    )
    assert relay.match is not None
    yield f"http://127.0.0.1:{relay.match.group(1)}"


def test_responses_answer_and_stream_read_by_the_openai_sdk(relay: str) -> None:
    with openai.OpenAI(base_url=relay + "/v1", api_key="sk-bench", max_retries=0) as client:
        answer = client.responses.create(model="m", input="hello")
        assert answer.status == "completed"
        assert answer.output_text.strip().startswith("word1")
        assert answer.usage is not None and answer.usage.output_tokens > 0
        with client.responses.stream(model="m", input="hello") as stream:
            deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
            final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == answer.output_text
    assert final.status == "completed"


def test_messages_answer_and_stream_read_by_the_anthropic_sdk(relay: str) -> None:
    with anthropic.Anthropic(base_url=relay, api_key="sk-ant-bench", max_retries=0) as client:
        answer = client.messages.create(
            model="m", max_tokens=64, messages=[{"role": "user", "content": "hello"}]
        )
        assert answer.stop_reason == "end_turn"
        text = answer.content[0].text  # type: ignore[union-attr]
        with client.messages.stream(
            model="m", max_tokens=64, messages=[{"role": "user", "content": "hello"}]
        ) as stream:
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
    assert streamed == text and text.strip().startswith("word1")
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0


def test_agent_bodies_have_the_agents_size_and_markers() -> None:
    """Instructions and tools of 20-50 KB, as the agents send; first-seen changes every item."""
    for workload in (agent_bodies.codex("m"), agent_bodies.claude("m")):
        sizes = agent_bodies.sizes(workload.template)
        assert 20_000 <= sizes["instructions_and_tools"] <= 50_000
        assert workload.appended(1) != workload.template
        assert len(workload.first_time(1)) == len(workload.template)
        seen, first = workload.appended(1), workload.first_time(1)
        assert sum(a != b for a, b in zip(seen, first, strict=True)) > 300  # every item changed


def test_a_rewritten_report_keeps_the_sections_written_by_hand() -> None:
    by_hand = "\n## Another benchmark\n\nIts table, written by hand.\n"
    old = "# Benchmarks\n\n## Versions and machine\n\n| a | b |\n" + by_hand
    assert report.keep_tail(old) == by_hand
    rewritten = "# Benchmarks (new run)\n" + report.GENERATED_END + "\n" + report.keep_tail(old)
    assert report.keep_tail(rewritten) == by_hand  # and again on the next run
    assert report.keep_tail("# Benchmarks\n\n## Versions and machine\n\n| a | b |\n") == ""


def test_the_report_judges_the_gateway_against_the_relay_of_the_same_case() -> None:
    def batch(p50_ms: float, cpu_ms: float) -> Batch:
        return Batch(latencies=[p50_ms / 1000] * 3, elapsed=1.0, cpu_seconds=3 * cpu_ms / 1000)

    def judged(gateway: Batch) -> dict[str, str]:
        results = {
            "small": {"direct": batch(0.2, 0.05), "relay": batch(0.5, 0.4), "gateway": gateway},
            "agent-seen-c32": {"direct": batch(7, 0.1), "relay": batch(15, 0.4)},
        }
        results["agent-seen-c32"]["gateway"] = gateway
        return {v.goal: f"{v.shown()} {v.status}" for v in report.verdicts(results)}

    near = judged(batch(0.64, 0.58))  # 0.14 ms beyond the relay; CPU 1.45x
    assert near["small request: added beyond the relay's, p50"] == "0.14 ms PASS"
    assert near["200 messages at c=32: CPU per request / relay's"] == "1.45x PASS"
    far = judged(batch(19.1, 0.62))  # added 12.1 against the relay's 8: 1.51x
    assert far["200 messages at c=32: added p50 / relay added"] == "1.51x MISS"
    assert far["200 messages at c=32: CPU per request / relay's"] == "1.55x MISS"
