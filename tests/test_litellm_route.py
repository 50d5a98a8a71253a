"""`provider: litellm` (design D11.1): a route translated by litellm, here its `openai/` provider pointed
at the fake upstream (no network). The client must get OpenAI-shaped answers, streaming and not."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import GatewayStarter
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.slow  # a gateway process that imports litellm (seconds)


def config(fake: FakeUpstream) -> dict[str, object]:
    return {
        "models": [
            {
                "name": "via-litellm",
                "upstream": {
                    "provider": "litellm",
                    "model": "openai/fake-model",
                    "base_url": fake.base_url,
                    "api_key": "sk-upstream",
                },
                "context_window": 50_000,
                "tokenizer": "chars:4",
            }
        ],
    }


def test_litellm_route_answers_in_openai_format(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream
) -> None:
    gw = start_gateway(config(fake_upstream))
    client = openai.OpenAI(base_url=gw.base_url, api_key="sk-client", max_retries=0, timeout=60)
    fake_upstream.script(
        [
            {"kind": "ok", "content": "through litellm"},
            {"kind": "ok", "content": "streamed through litellm"},
        ]
    )
    answer = client.chat.completions.create(
        model="via-litellm", messages=[{"role": "user", "content": "hi"}], temperature=0.1
    )
    assert answer.choices[0].message.content == "through litellm"
    stream = client.chat.completions.create(
        model="via-litellm", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        == "streamed through litellm"
    )
    first = fake_upstream.chat_requests()[0]
    assert first["json"]["model"] == "fake-model" and first["json"]["temperature"] == 0.1
    assert (
        dict((k.lower(), v) for k, v in first["headers"])["authorization"] == "Bearer sk-upstream"
    )


def test_litellm_route_recovers_from_the_providers_context_error(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream
) -> None:
    """The reactive path through litellm: the provider's 400 "maximum context length" comes back from litellm as
    its ContextWindowExceededError; the gateway must learn the window, compact and retry, so the
    client never sees the error."""
    gw = start_gateway(
        {**config(fake_upstream), "policies": {"default": {"steps": [{"type": "fifo"}]}}}
    )
    client = openai.OpenAI(base_url=gw.base_url, api_key="sk-client", max_retries=0, timeout=60)
    fake_upstream.configure({"context_limit": 2_000, "style": "openai"})
    history = []
    for turn in range(30):
        history += [
            {"role": "user", "content": f"question {turn} " + "words " * 80},
            {"role": "assistant", "content": f"answer {turn} " + "words " * 80},
        ]
    messages = [
        {"role": "system", "content": "Be brief."},
        *history,
        {"role": "user", "content": "the latest question"},
    ]
    raw = client.chat.completions.with_raw_response.create(model="via-litellm", messages=messages)
    assert raw.parse().choices[0].message.content
    assert raw.headers["x-compactgate-retries"] == "1"
    sent = fake_upstream.chat_requests()
    assert len(sent) == 2  # the rejected full request, then the compacted one that fits
    last = sent[-1]["json"]["messages"]
    assert last[0]["content"] == "Be brief." and last[-1]["content"] == "the latest question"
    assert len(last) < len(messages)
