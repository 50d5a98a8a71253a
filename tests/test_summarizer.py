"""The LLM summariser (gateway/summaries/summarizer.py): the answer parsing and transcript as functions,
then real calls to the fake upstream process: what is sent (no tools, the client's credential
only, the summary model), incremental extension, chunking, context errors and failures."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from gateway.config import SummariesConfig, parse_config
from gateway.ops.metrics import Metrics
from gateway.routing import Route, Router
from gateway.summaries.summarizer import Summarizer, SummarizerError
from gateway.summaries.transcript import (
    APPEND_NOTE,
    APPEND_RETAIN_NOTE,
    COMBINE_NOTE,
    EXTEND_NOTE,
    SYSTEM_PROMPT,
    chunk,
    cut_text,
    read_answer,
    render_message,
)
from gateway.upstream import UpstreamClient
from gateway.upstream.failover import Balancer
from gateway.upstream.retry import Sender
from policies.summaries import SummaryRequest
from tests.fake_upstream import FakeUpstream

HEADERS = [
    (b"authorization", b"Bearer sk-client"),
    (b"x-secret-trace", b"do-not-forward"),
    (b"content-type", b"application/json"),
    (b"accept-encoding", b"gzip"),
]


def calls_of(metrics: Metrics, outcome: str) -> float:
    value = metrics.registry.get_sample_value(
        "compactgate_summarizer_calls_total", {"outcome": outcome}
    )
    return value or 0.0


def request_of(messages: list[dict[str, Any]], **kwargs: Any) -> SummaryRequest:
    options: dict[str, Any] = {
        "purpose": "compaction",
        "instructions": "Summarise it. Put the summary inside <summary></summary> tags.",
        "max_tokens": 200,
    }
    options.update(kwargs)
    return SummaryRequest(messages=tuple(messages), **options)


def conversation(turns: int, size: int = 40) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for i in range(turns):
        messages.append({"role": "user", "content": f"question {i} " + "q" * size})
        messages.append({"role": "assistant", "content": f"answer {i} " + "a" * size})
    return messages


def sent_body(record: dict[str, Any]) -> dict[str, Any]:
    return orjson.loads(base64.b64decode(record["body_b64"]))


def prompt_of(record: dict[str, Any]) -> str:
    return str(sent_body(record)["messages"][-1]["content"])


# -- pure parts ------------------------------------------------------------------------------


def test_read_answer_sections() -> None:
    answer = read_answer("<retain>ref_1, /tmp/x</retain>\n<summary>We fixed it.</summary>", True)
    assert (answer.text, answer.retain) == ("We fixed it.", "ref_1, /tmp/x")
    assert read_answer("Plain summary.", False).text == "Plain summary."
    cut = read_answer("<think>hmm</think><summary>Started, then cut off", False)
    assert cut.text == "Started, then cut off"
    ignored = read_answer("<retain>r</retain><summary>s</summary>", False)
    assert (ignored.text, ignored.retain) == ("s", "")
    assert read_answer("<think>only thinking", False).text == ""


def test_render_message_covers_tools_and_parts() -> None:
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"p":"/"}'}}
        ],
    }
    assert render_message(call) == '[assistant]\n-> calls ls (c1): {"p":"/"}'
    result = {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}
    assert render_message(result) == "[tool result for c1]\na.txt"
    parts = {
        "role": "user",
        "name": "ann",
        "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:..."}},
        ],
    }
    assert render_message(parts) == "[user (ann)]\nlook\n[image_url attached]"


def test_cut_text_and_chunk() -> None:
    text = "h" * 600 + "t" * 400
    cut = cut_text(text, 250, 100)
    assert cut.startswith("h" * 100) and cut.endswith("t" * 100) and "characters cut" in cut
    assert len(cut) < len(text) // 2
    assert cut_text("short", 2, 100) == "short"
    assert chunk(["a", "b", "c", "d"], [3, 3, 5, 1], 6) == [["a", "b"], ["c", "d"]]
    assert chunk(["big", "x"], [10, 1], 6) == [["big"], ["x"]]


# -- against the fake upstream ---------------------------------------------------------------


def router_for(fake: FakeUpstream, **model: Any) -> Router:
    config = parse_config(
        {
            "models": [
                {
                    "name": "main",
                    "upstream": {"base_url": fake.base_url, "model": "main-upstream"},
                    "context_window": 8192,
                    "tokenizer": "chars:4",
                    "retry": {"max_attempts": 1},
                    **model,
                },
                {
                    "name": "cheap",
                    "upstream": {
                        "base_url": fake.base_url,
                        "model": "cheap-upstream",
                        "api_key": "sk-gateway",
                    },
                    "context_window": 16384,
                    "tokenizer": "chars:4",
                },
            ]
        }
    )
    return Router(config)


@pytest.fixture
async def upstream() -> AsyncIterator[UpstreamClient]:
    client = UpstreamClient(parse_config({}).server)
    await client.start()
    yield client
    await client.close()


def make(
    upstream: UpstreamClient, fake: FakeUpstream, metrics: Metrics | None = None, **config: Any
) -> tuple[Summarizer, Route]:
    """A summariser on the fake upstream, and the route `main` it summarises for."""
    router = router_for(fake)
    metrics = metrics or Metrics()
    sender = Sender(upstream, metrics, Balancer())
    summarizer = Summarizer(sender, router, metrics, SummariesConfig(**config))
    route = router.resolve("main")
    assert route is not None
    return summarizer, route


async def test_one_call_without_tools_with_the_clients_credential_only(
    upstream: UpstreamClient, fake_upstream: FakeUpstream
) -> None:
    metrics = Metrics()
    summarizer, route = make(upstream, fake_upstream, metrics)
    fake_upstream.script([{"kind": "ok", "content": "<summary>They asked 3 questions.</summary>"}])
    answer = await summarizer.summarize(request_of(conversation(3)), route, HEADERS)
    assert answer.status == "ready" and answer.text == "They asked 3 questions."
    [record] = fake_upstream.chat_requests()
    body = sent_body(record)
    assert body["model"] == "main-upstream"
    assert "tools" not in body and "functions" not in body
    assert body["stream"] is False and body["max_tokens"] == 250
    assert body["messages"][0] == {"role": "system", "content": SYSTEM_PROMPT}
    prompt = prompt_of(record)
    assert "question 0" in prompt and "answer 2" in prompt
    assert prompt.rstrip().endswith("Keep the summary under about 200 tokens.")
    assert "Put the summary inside <summary></summary> tags." in prompt
    headers = {k.lower(): v for k, v in record["headers"]}
    assert headers["authorization"] == "Bearer sk-client"
    assert "x-secret-trace" not in headers and "gzip" not in headers.get("accept-encoding", "")
    assert calls_of(metrics, "ok") == 1


async def test_model_override_uses_that_route_and_its_key(
    upstream: UpstreamClient, fake_upstream: FakeUpstream
) -> None:
    summarizer, route = make(upstream, fake_upstream)
    request = request_of(conversation(2), model="cheap")
    assert summarizer.model_of(request, route) == "cheap"
    await summarizer.summarize(request, route, HEADERS)
    [record] = fake_upstream.chat_requests()
    assert sent_body(record)["model"] == "cheap-upstream"
    headers = {k.lower(): v for k, v in record["headers"]}
    assert headers["authorization"] == "Bearer sk-gateway"
    with pytest.raises(SummarizerError, match="not configured"):
        await summarizer.summarize(request_of(conversation(2), model="nope"), route, HEADERS)


async def test_retain_section_and_incremental_extension(
    upstream: UpstreamClient, fake_upstream: FakeUpstream
) -> None:
    summarizer, route = make(upstream, fake_upstream)
    fake_upstream.script(
        [{"kind": "ok", "content": "<retain>ref_9</retain><summary>Old and new.</summary>"}]
    )
    request = request_of(
        conversation(1),
        previous="The earlier part: setup done.",
        retain_instructions="List refs inside <retain></retain> tags.",
    )
    answer = await summarizer.summarize(request, route, HEADERS)
    assert (answer.text, answer.retain) == ("Old and new.", "ref_9")
    [record] = fake_upstream.chat_requests()
    prompt = prompt_of(record)
    assert "<previous_summary>\nThe earlier part: setup done.\n</previous_summary>" in prompt
    assert EXTEND_NOTE in prompt and "List refs inside <retain></retain> tags." in prompt
    assert prompt.index("setup done") < prompt.index("question 0")
    assert sent_body(record)["max_tokens"] == 500  # two sections


async def test_append_mode_asks_for_the_new_messages_only(
    upstream: UpstreamClient, fake_upstream: FakeUpstream
) -> None:
    """`append_summaries`: the earlier summary is context, the answer will be appended to it."""
    summarizer, route = make(upstream, fake_upstream)
    fake_upstream.script(
        [{"kind": "ok", "content": "<retain>ref_9</retain><summary>Only the new part.</summary>"}]
    )
    request = request_of(
        conversation(1),
        previous="The earlier part: setup done.",
        retain_instructions="List refs inside <retain></retain> tags.",
        append=True,
    )
    answer = await summarizer.summarize(request, route, HEADERS)
    assert (answer.text, answer.retain) == ("Only the new part.", "ref_9")
    [record] = fake_upstream.chat_requests()
    prompt = prompt_of(record)
    assert "<previous_summary>\nThe earlier part: setup done.\n</previous_summary>" in prompt
    assert APPEND_NOTE in prompt and APPEND_RETAIN_NOTE in prompt
    assert EXTEND_NOTE not in prompt
    assert prompt.index("setup done") < prompt.index("question 0") < prompt.index(APPEND_NOTE)


async def test_append_mode_chunks_are_combined_without_the_earlier_summary(
    upstream: UpstreamClient, fake_upstream: FakeUpstream
) -> None:
    """Combining the parts with the previous summary would restate it in the appended text."""
    summarizer, route = make(upstream, fake_upstream, max_input_tokens=1200)
    fake_upstream.script(
        [{"kind": "ok", "content": f"<summary>part {i}</summary>"} for i in range(6)]
    )
    request = request_of(conversation(12, size=400), previous="before everything", append=True)
    answer = await summarizer.summarize(request, route, HEADERS)
    *part_prompts, final = [prompt_of(r) for r in fake_upstream.chat_requests()]
    assert len(part_prompts) >= 2
    assert COMBINE_NOTE in final and "before everything" not in final
    assert answer.text == f"part {len(part_prompts)}"


async def test_input_too_long_is_chunked_then_combined(
    upstream: UpstreamClient, fake_upstream: FakeUpstream
) -> None:
    summarizer, route = make(upstream, fake_upstream, max_input_tokens=1200)
    messages = conversation(12, size=400)  # about 2 500 tokens of transcript
    parts = [{"kind": "ok", "content": f"<summary>part {i}</summary>"} for i in range(6)]
    fake_upstream.script(parts)
    request = request_of(messages, previous="before everything")
    answer = await summarizer.summarize(request, route, HEADERS)
    records = fake_upstream.chat_requests()
    prompts = [prompt_of(r) for r in records]
    assert len(records) >= 3
    *part_prompts, final = prompts
    assert all("of a longer conversation" in p for p in part_prompts)
    assert all("<previous_summary>" not in p for p in part_prompts)
    assert COMBINE_NOTE in final and "before everything" in final
    for i in range(len(part_prompts)):
        assert f"part {i}" in final
    assert answer.text == f"part {len(part_prompts)}"
    for record in records:  # every call fits the 1 200-token cap (chars/4)
        assert len(orjson.dumps(sent_body(record)["messages"])) / 4 + 250 <= 1200 + 100
    covered = "".join(part_prompts)
    assert all(f"question {i} " in covered for i in range(12))


async def test_context_error_from_the_upstream_rechunks(
    upstream: UpstreamClient, fake_upstream: FakeUpstream
) -> None:
    metrics = Metrics()
    summarizer, route = make(upstream, fake_upstream, metrics)
    fake_upstream.configure({"context_limit": 1500})
    answer = await summarizer.summarize(request_of(conversation(10, size=400)), route, HEADERS)
    assert answer.status == "ready" and answer.text
    assert calls_of(metrics, "context_error") == 1
    assert calls_of(metrics, "ok") >= 3


async def test_failures_raise_summarizer_error(
    upstream: UpstreamClient, fake_upstream: FakeUpstream
) -> None:
    metrics = Metrics()
    summarizer, route = make(upstream, fake_upstream, metrics, timeout_s=0.5)
    request = request_of(conversation(2))
    fake_upstream.script([{"kind": "error", "status": 400, "body": {"error": {"message": "no"}}}])
    with pytest.raises(SummarizerError, match="answered 400"):
        await summarizer.summarize(request, route, HEADERS)
    fake_upstream.script([{"kind": "ok", "content": "<summary>  </summary>"}])
    with pytest.raises(SummarizerError, match="empty"):
        await summarizer.summarize(request, route, HEADERS)
    fake_upstream.script([{"kind": "hang_before_headers", "seconds": 5}])
    with pytest.raises(SummarizerError) as timed_out:
        await summarizer.summarize(request, route, HEADERS)
    assert timed_out.value.outcome == "timeout"
    assert calls_of(metrics, "error") == 2 and calls_of(metrics, "timeout") == 1
