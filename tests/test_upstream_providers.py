"""`upstream.provider` picks the transport: `litellm` routes' chat completions go through litellm,
their other paths over plain HTTP to the same base_url; a `litellm:` URL is a config error that
says how to declare the provider. In-process (tests/in_process.py), litellm's `openai/` provider
pointed at the fake upstream (no network)."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, parse_config
from tests.in_process import AppStarter, LocalUpstream
from tests.test_litellm_route import config as litellm_model

pytestmark = pytest.mark.slow  # the app imports litellm at start-up (seconds, once per process)


async def test_a_litellm_route_chats_through_litellm_and_passes_other_paths_over_http(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(litellm_model(local_upstream))  # type: ignore[arg-type]
    local_upstream.script([{"kind": "ok", "content": "translated"}])
    answer = await gw.openai().chat.completions.create(
        model="via-litellm", messages=[{"role": "user", "content": "hi"}]
    )
    assert answer.choices[0].message.content == "translated"
    # litellm took the provider prefix off: the request was translated, not forwarded.
    [chat] = local_upstream.chat_requests()
    assert chat["json"]["model"] == "fake-model"

    embeddings = await gw.http.post(
        f"{gw.base_url}/embeddings", json={"model": "via-litellm", "input": "x"}
    )
    assert embeddings.status_code == 200
    forwarded = [r for r in local_upstream.requests() if r["path"] == "/v1/embeddings"]
    assert [r["json"] for r in forwarded] == [{"model": "openai/fake-model", "input": "x"}]


@pytest.mark.parametrize("provider", ["litellm", "openai"])
def test_a_litellm_url_is_refused_with_how_to_declare_the_provider(provider: str) -> None:
    upstream = {"provider": provider, "base_url": "litellm://api.example.com/v1", "model": "x"}
    with pytest.raises(ConfigError) as info:
        parse_config({"models": [{"name": "m", "upstream": upstream}]}, {})
    [problem] = info.value.problems
    assert problem.startswith("models[0].upstream.base_url: ")
    assert "provider: litellm" in problem


def test_the_providers_to_start_are_the_ones_the_models_declare() -> None:
    both = parse_config(
        {
            "models": [
                {"name": "a", "upstream": {"base_url": "http://127.0.0.1:9/v1"}},
                {"name": "b", "upstream": {"provider": "litellm", "model": "anthropic/x"}},
            ]
        },
        {},
    )
    assert both.providers == {"openai", "litellm"}
    only_http = parse_config({"models": [{"name": "a", "upstream": {"base_url": "http://h/v1"}}]})
    assert only_http.providers == {"openai"}
