"""The LiteLLM callback, `gateway.integrations.litellm.hook`, in the real LiteLLM proxy.

One proxy for the module (`litellm --config`, the pinned litellm[proxy] of the lock, no
database, the cost map read locally) with the config docs/integrations/litellm.md shows: its
model group `m` a deployment on the fake upstream with an 8k window in LiteLLM's own
`model_info` (no COMPACTGATE_CONFIG: the callback reads the window there), `m-compacted` the
same deployment as its context-window fallback.

- A 120-turn agent chat (tool calls and results every other turn) through the proxy with the
  official openai SDK: every request the fake upstream received fits the window and keeps the
  system prompt, the latest user message, the tool pairs and the client's order.
- Anthropic Messages on the proxy's `/v1/messages` are compacted too, as Messages.
- An upstream that refuses the compacted request for its context: the fallback is compacted
  again, from the client's original, and answered.
- A request the engine cannot read goes as it came (fail-open), counted on the hook's metrics.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml

from tests.conftest import REPO_ROOT, Starter, free_port
from tests.fake_upstream import FakeUpstream
from tests.test_compress import chat_pairs_intact, count, in_order

WINDOW = 8192
OUTPUT = 1024
MASTER_KEY = "sk-master-callback"
SYSTEM = "You are a careful coding agent. Keep answers short."
JSON = dict[str, Any]
pytestmark = pytest.mark.slow  # LiteLLM's proxy takes seconds to start, and 180 requests


PAGE = REPO_ROOT / "docs" / "integrations" / "litellm.md"


def proxy_config() -> str:
    """The proxy config docs/integrations/litellm.md shows (its first YAML block), as it is."""
    return PAGE.read_text().split("```yaml\n", 1)[1].split("```", 1)[0]


def test_the_documented_config_is_the_one_described() -> None:
    config = yaml.safe_load(proxy_config())
    assert config["litellm_settings"]["callbacks"] == "gateway.integrations.litellm.hook"
    groups = {m["model_name"]: m for m in config["model_list"]}
    assert groups["m"]["model_info"]["max_input_tokens"] == WINDOW
    assert groups["m"]["litellm_params"] == groups["m-compacted"]["litellm_params"]
    assert config["router_settings"]["context_window_fallbacks"] == [{"m": ["m-compacted"]}]


class Proxy:
    def __init__(self, port: int, metrics_port: int) -> None:
        self.base_url = f"http://127.0.0.1:{port}"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"

    def outcomes(self) -> dict[str, float]:
        """`compactgate_embedded_total` by outcome (none before the first request: the hook
        builds its engine, and serves its metrics, on the first one)."""
        try:
            text = httpx.get(self.metrics_url, timeout=10).text
        except httpx.ConnectError:
            return {}
        prefix = 'compactgate_embedded_total{outcome="'
        return {
            line[len(prefix) :].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(prefix)
        }


@pytest.fixture(scope="module")
def proxy(
    start_module_process: Starter,
    fake_upstream_server: FakeUpstream,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Proxy]:
    directory: Path = tmp_path_factory.mktemp("litellm")
    config = directory / "litellm.yaml"
    config.write_text(proxy_config())
    port, metrics_port = free_port(), free_port()
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "COMPACTGATE_METRICS_PORT": str(metrics_port),
        "UPSTREAM_BASE_URL": fake_upstream_server.base_url,
        "UPSTREAM_API_KEY": "sk-fake-upstream",
        "LITELLM_MASTER_KEY": MASTER_KEY,
    }
    env.pop("DATABASE_URL", None)
    env.pop("COMPACTGATE_CONFIG", None)
    litellm = str(Path(sys.executable).parent / "litellm")
    argv = [litellm, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    start_module_process(argv, r"Uvicorn running on", 180, env=env)
    yield Proxy(port, metrics_port)


@pytest.fixture
def client(proxy: Proxy) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{proxy.base_url}/v1", api_key=MASTER_KEY, max_retries=0, timeout=60
    ) as api:
        yield api


def source(turn: int) -> str:
    """A file as a read tool returns it: 150 numbered lines."""
    return "\n".join(f"{i:4} def step_{turn}_{i}(x): return x + {i}" for i in range(150))


def latest_user(messages: list[JSON]) -> JSON:
    return next(m for m in reversed(messages) if m["role"] == "user")


def received(fake: FakeUpstream) -> list[list[JSON]]:
    return [r["json"]["messages"] for r in fake.chat_requests()]


def test_a_120_turn_chat_over_an_8k_window_keeps_every_invariant(
    client: openai.OpenAI, fake_upstream: FakeUpstream, proxy: Proxy
) -> None:
    before = proxy.outcomes()
    history: list[JSON] = [{"role": "system", "content": SYSTEM}]
    sent_by_client: list[list[JSON]] = []
    for turn in range(120):
        history.append({"role": "user", "content": f"Turn {turn}: look at module {turn}."})
        if turn % 2 == 0:  # the model reads a file first
            fake_upstream.script(
                [{"kind": "tool_calls", "tool_calls": [{"id": f"call_{turn}", "function": {
                    "name": "read", "arguments": {"path": f"m{turn}.py"}}}]}]
            )  # fmt: skip
            reply = client.chat.completions.create(model="m", messages=history)
            sent_by_client.append(list(history))
            calls = reply.choices[0].message.tool_calls
            assert calls and calls[0].id == f"call_{turn}"
            history.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [c.model_dump() for c in calls],
                }
            )
            history.append({"role": "tool", "tool_call_id": calls[0].id, "content": source(turn)})
        reply = client.chat.completions.create(model="m", messages=history)
        sent_by_client.append(list(history))
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
    assert count(history) > 10 * WINDOW
    upstream = received(fake_upstream)
    assert len(upstream) == len(sent_by_client) == 180
    for sent, got in zip(sent_by_client, upstream, strict=True):
        assert count(got) <= WINDOW - OUTPUT, len(sent)
        assert got[0] == {"role": "system", "content": SYSTEM}
        assert latest_user(got) == latest_user(sent)  # as sent
        assert got[-1]["role"] == sent[-1]["role"]
        assert chat_pairs_intact(got)
        assert in_order(got, sent)
    after = proxy.outcomes()
    compacted = after["compacted"] - before.get("compacted", 0)
    unchanged = after.get("unchanged", 0) - before.get("unchanged", 0)
    assert compacted + unchanged == 180 and compacted > 150


def test_anthropic_messages_are_compacted_as_messages(
    proxy: Proxy, fake_upstream: FakeUpstream
) -> None:
    """On the proxy's `/v1/messages` the callback sees Anthropic blocks (call type
    `anthropic_messages`, `system` beside them) and compacts them as Messages; LiteLLM then
    sends the result to the OpenAI deployment as Responses input, which the fake records."""
    before = proxy.outcomes().get("compacted", 0)
    messages: list[JSON] = []
    for t in range(150):
        messages += [
            {"role": "user", "content": [{"type": "text", "text": f"Check f{t}."}]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"toolu_{t}", "name": "read", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"toolu_{t}", "content": source(t)}
                ],
            },
            {"role": "assistant", "content": [{"type": "text", "text": f"f{t} is fine."}]},
        ]
    messages.append({"role": "user", "content": [{"type": "text", "text": "And now?"}]})
    with anthropic.Anthropic(
        base_url=proxy.base_url, api_key=MASTER_KEY, max_retries=0, timeout=60
    ) as api:
        reply = api.messages.create(model="m", system=SYSTEM, max_tokens=256, messages=messages)
    assert reply.content
    [sent] = [r["json"] for r in fake_upstream.requests() if r["path"] == "/v1/responses"]
    items = sent["input"]
    assert SYSTEM in json.dumps(sent.get("instructions")) + json.dumps(items[:1])
    assert "And now?" in json.dumps(items[-1])
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
    assert calls == outputs
    assert len(calls) < 150 and len(json.dumps(items)) < 4 * WINDOW
    assert proxy.outcomes()["compacted"] == before + 1


def test_a_context_refusal_is_compacted_again_and_answered(
    client: openai.OpenAI, fake_upstream: FakeUpstream, proxy: Proxy
) -> None:
    """The upstream's window is smaller than the 8k LiteLLM was told: it refuses what the
    callback made, the router falls back to `m-compacted`, whose deployment hook compacts the
    client's original again, tighter; the client gets its answer."""
    before = proxy.outcomes().get("recompacted", 0)
    fake_upstream.configure({"context_limit": 1500, "style": "openai"})
    history: list[JSON] = [{"role": "system", "content": SYSTEM}]
    for t in range(60):
        history += [
            {"role": "user", "content": f"Question {t}?"},
            {"role": "assistant", "content": f"Answer {t}. " * 40},
        ]
    history.append({"role": "user", "content": "Last question?"})
    reply = client.chat.completions.create(model="m", messages=history)
    assert reply.choices[0].message.content
    first, retry = received(fake_upstream)
    assert len(json.dumps(retry)) < len(json.dumps(first))
    assert retry[0] == history[0] and retry[-1] == history[-1]
    assert in_order(retry, history)
    assert proxy.outcomes()["recompacted"] == before + 1


def test_what_the_engine_cannot_read_goes_as_it_came(
    client: openai.OpenAI, fake_upstream: FakeUpstream, proxy: Proxy
) -> None:
    """A `compactgate` mark the gateway refuses (a priority of 7) makes the engine raise: the
    request is forwarded untouched (fail-open), and counted."""
    before = proxy.outcomes().get("failed_open", 0)
    history: list[JSON] = [
        {"role": "user", "content": "hi", "compactgate": {"priority": 7}},
    ]
    reply = client.chat.completions.create(model="m", messages=history)  # type: ignore[arg-type]
    assert reply.choices[0].message.content
    [got] = received(fake_upstream)
    assert got == history
    assert proxy.outcomes()["failed_open"] == before + 1
