"""`provider: litellm` (R1.2): a route translated by litellm, here its `openai/` provider pointed
at the fake upstream (no network). The client must get OpenAI-shaped answers, streaming and not."""

from __future__ import annotations

import openai

from tests.conftest import GatewayStarter
from tests.fake_upstream import FakeUpstream


def config(fake: FakeUpstream) -> dict[str, object]:
    return {
        "models": [{
            "name": "via-litellm",
            "upstream": {"provider": "litellm", "model": "openai/fake-model", "base_url": fake.base_url, "api_key": "sk-upstream"},
            "context_window": 50_000, "tokenizer": "chars:4",
        }],
    }


def test_litellm_route_answers_in_openai_format(start_gateway: GatewayStarter, fake_upstream: FakeUpstream) -> None:
    gw = start_gateway(config(fake_upstream))
    client = openai.OpenAI(base_url=gw.base_url, api_key="sk-client", max_retries=0, timeout=60)
    fake_upstream.script([{"kind": "ok", "content": "through litellm"}, {"kind": "ok", "content": "streamed through litellm"}])
    answer = client.chat.completions.create(model="via-litellm", messages=[{"role": "user", "content": "hi"}], temperature=0.1)
    assert answer.choices[0].message.content == "through litellm"
    stream = client.chat.completions.create(model="via-litellm", messages=[{"role": "user", "content": "hi"}], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "streamed through litellm"
    first = fake_upstream.chat_requests()[0]
    assert first["json"]["model"] == "fake-model" and first["json"]["temperature"] == 0.1
    assert dict((k.lower(), v) for k, v in first["headers"])["authorization"] == "Bearer sk-upstream"
