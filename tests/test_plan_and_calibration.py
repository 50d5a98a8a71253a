"""The dry run and self-calibration (design D17.2, D12.3).

`/v1/compactgate/plan` and `compactgate plan` must report OpenAI's own count for OpenAI models
and show what each step did; estimates for a heuristic tokenizer must converge on what the
upstream reports; injected stream usage must be invisible to the client.

The endpoint and the proxy run in-process (tests/in_process.py); `compactgate plan` is the CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.config import parse_config
from gateway.counting.tokenizers import CharsTokenizer
from gateway.ops.metrics import Metrics
from gateway.path.calibration import TOLERANCE, Calibration
from gateway.routing import Router
from tests.configs import one_model
from tests.conftest import REPO_ROOT
from tests.fake_upstream import FakeUpstream
from tests.in_process import AppStarter, LocalUpstream
from tests.test_tokens import COOKBOOK_MESSAGES as COOKBOOK


def agent_history(turns: int, size: int = 600) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}]
    for t in range(turns):
        messages += [
            {"role": "user", "content": f"turn {t}: look at file {t}"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{t}",
                        "type": "function",
                        "function": {"name": "read", "arguments": json.dumps({"path": f"f{t}"})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"c{t}", "content": f"line {t} " * size},
            {"role": "assistant", "content": f"file {t} read"},
        ]
    messages.append({"role": "user", "content": "what now?"})
    return messages


async def test_plan_reports_openai_counts_for_openai_models(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(
        {
            "models": [
                {"name": "gpt-4o", "upstream": {"base_url": local_upstream.base_url}},
                {"name": "gpt-4", "upstream": {"base_url": local_upstream.base_url}},
            ]
        }
    )
    for model, expected in (("gpt-4o", 124), ("gpt-4", 129)):
        plan = (
            await gw.http.post(
                f"{gw.base_url}/compactgate/plan", json={"model": model, "messages": COOKBOOK}
            )
        ).json()
        assert plan["tokens_before"] == expected == plan["tokens_after"]
        assert plan["context_window"] == {"gpt-4o": 128000, "gpt-4": 8192}[model]
        assert plan["fits"] is True
        assert plan["counts_by_role"] == {"system": 5, "user": 1}
        assert plan["steps"] == []
        assert plan["messages"] == COOKBOOK
    assert local_upstream.chat_requests() == []  # a plan never calls the upstream


async def test_plan_shows_each_steps_effect_and_the_messages_that_would_be_sent(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    model = {"context_window": 4000, "max_output_tokens": 200, "tokenizer": "chars:4"}
    gw = await start_app(one_model(local_upstream.base_url, [{"type": "fifo"}], **model))
    plan = (
        await gw.http.post(
            f"{gw.base_url}/compactgate/plan", json={"model": "m", "messages": agent_history(20)}
        )
    ).json()
    assert plan["budget"] < plan["tokens_before"]
    assert plan["tokens_after"] <= plan["budget"] and plan["fits"]
    # fifo ran to under the trigger, then on to the target (`to_target`): each run reported
    steps = plan["steps"]
    assert {step["type"] for step in steps} == {"fifo"}
    assert steps[-1]["tokens_after"] <= plan["budget"] * 0.6  # the default target ratio
    assert all(step["tokens_before"] > step["tokens_after"] for step in steps)
    sent = plan["messages"]
    assert sent[0]["role"] == "system" and sent[-1] == {"role": "user", "content": "what now?"}
    removed = sum(step["messages_removed"] for step in steps)
    assert removed > 0 and len(sent) == len(agent_history(20)) - removed
    regions = plan["tokens_by_region"]
    assert regions["system"] > 0 and regions["history"] > regions["system"]
    # the real request is compacted the same way
    response = await gw.http.post(
        f"{gw.base_url}/chat/completions", json={"model": "m", "messages": agent_history(20)}
    )
    assert response.headers["x-compactgate-steps"] == "fifo"
    assert local_upstream.chat_requests()[-1]["json"]["messages"] == sent


@pytest.mark.slow
def test_plan_cli_table_and_json(tmp_path: Path, fake_upstream: FakeUpstream) -> None:
    body = tmp_path / "request.json"
    body.write_text(json.dumps({"model": "gpt-4o", "messages": COOKBOOK}))
    config = tmp_path / "c.yaml"
    config.write_text(
        json.dumps(
            {"models": [{"name": "gpt-4o", "upstream": {"base_url": fake_upstream.base_url}}]}
        )
    )
    run = [sys.executable, "-m", "gateway", "plan", str(body), "--config", str(config)]
    table = subprocess.run(run, capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert table.returncode == 0, table.stderr
    assert "124 -> 124" in table.stdout and "128000" in table.stdout and "(fits)" in table.stdout
    as_json = subprocess.run([*run, "--json"], capture_output=True, cwd=REPO_ROOT, timeout=60)
    assert as_json.returncode == 0
    report = orjson.loads(as_json.stdout)
    assert report["tokens_before"] == 124 and report["model"] == "gpt-4o"
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": "gpt-4o", "messages": []}')
    failed = subprocess.run(
        [sys.executable, "-m", "gateway", "plan", str(bad), "--config", str(config)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
    )
    assert failed.returncode == 1 and "messages" in failed.stderr


async def test_calibration_converges_on_an_upstream_with_a_different_tokenizer(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    # The fake reports usage as chars/2.6 of its JSON view; the gateway starts from chars:4.
    local_upstream.configure({"usage_tokenizer": "chars:2.6"})
    gw = await start_app(
        one_model(local_upstream.base_url, context_window=1_000_000, tokenizer="chars:4")
    )
    client = gw.openai(api_key="k")
    errors = []
    for i in range(40):
        messages = agent_history(1 + i % 4, size=50 + 17 * i)
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=messages)
        reported = raw.parse().usage.prompt_tokens
        estimated = int(raw.headers["x-compactgate-tokens-after"])
        errors.append(abs(estimated - reported) / reported)
    assert errors[0] > 0.2  # uncalibrated, the heuristic is far off
    assert max(errors[-10:]) < 0.03, errors[-10:]
    metrics = (await gw.http.get(f"{gw.url}/metrics")).text
    assert 'compactgate_estimate_error_ratio_count{model="m"} 40.0' in metrics


def test_calibration_settles_and_then_leaves_the_counts_alone() -> None:
    """The correction converges in a few steps, then stays put while the upstream's reports
    agree with it within TOLERANCE: counts (and the cuts made from them) stop moving."""
    config = parse_config(
        {"models": [{"name": "m", "upstream": {"base_url": "http://x/v1"}, "tokenizer": "chars:3"}]}
    )
    route = Router(config).resolve("m")
    assert route is not None
    calibration = Calibration(Metrics())
    truth = 0.75  # the upstream counts 3/4 of what chars:3 says
    changes = []
    for i in range(200):
        tokenizer = route.counter.tokenizer
        assert isinstance(tokenizer, CharsTokenizer)
        estimated = 10_000
        noise = 1 + 0.01 * ((i * 7) % 5 - 2)  # +-2 % from one response to the next
        reported = round(estimated / tokenizer.correction * truth * noise)
        calibration.observe(route, estimated, reported)
        if route.counter.tokenizer is not tokenizer:
            changes.append(i)
    correction = calibration.correction("m")
    assert correction is not None and abs(correction / truth - 1) <= TOLERANCE + 0.01
    assert len(changes) <= 12 and changes[-1] < 40, changes  # settled early, then left alone


async def test_injected_stream_usage_is_invisible_to_the_client(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    local_upstream.configure({"usage_tokenizer": "chars:2"})
    gw = await start_app(
        {
            "server": {"stream_usage": "inject"},
            **one_model(local_upstream.base_url, context_window=100_000, tokenizer="chars:4"),
        }
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hello " * 200}], "stream": True}
    for _ in range(3):
        async with gw.http.stream("POST", f"{gw.base_url}/chat/completions", json=body) as response:
            raw = b"".join([chunk async for chunk in response.aiter_bytes()])
        assert b'"usage"' not in raw
        assert raw.endswith(b"data: [DONE]\n\n")
    sent = local_upstream.chat_requests()[-1]["json"]
    assert sent["stream_options"] == {"include_usage": True}
    metrics = (await gw.http.get(f"{gw.url}/metrics")).text
    assert 'compactgate_estimate_error_ratio_count{model="m"} 3.0' in metrics
    # a client that asks for usage gets it, untouched
    async with gw.http.stream(
        "POST",
        f"{gw.base_url}/chat/completions",
        json={**body, "stream_options": {"include_usage": True}},
    ) as response:
        assert b'"prompt_tokens"' in b"".join([chunk async for chunk in response.aiter_bytes()])


async def test_pin_rules_keep_matching_messages(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    messages = agent_history(20)
    messages[1] = {"role": "user", "content": "TODO: never forget the deploy window is Friday"}
    model = {"context_window": 4000, "max_output_tokens": 200, "tokenizer": "chars:4"}
    config = one_model(local_upstream.base_url, [{"type": "fifo"}], **model)
    config["policies"]["p"]["pin_rules"] = [
        {"content_regex": "^TODO:"},
        {"tool_name": "read", "content_regex": "line 3 "},
    ]
    gw = await start_app(config)
    plan = (
        await gw.http.post(
            f"{gw.base_url}/compactgate/plan", json={"model": "m", "messages": messages}
        )
    ).json()
    assert plan["steps"][0]["messages_removed"] > 0
    sent = plan["messages"]
    assert messages[1] in sent  # pinned by the content rule, though its Turn was dropped
    assert any(m.get("tool_call_id") == "c3" for m in sent)  # pinned tool result ...
    assert any(
        m.get("tool_calls", [{}])[0].get("id") == "c3" for m in sent if m.get("tool_calls")
    )  # ... with its call
    assert not any(m.get("tool_call_id") == "c2" for m in sent)


async def test_max_tokens_that_leave_no_room_are_refused_or_clamped(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    config = one_model(local_upstream.base_url, context_window=4000, tokenizer="chars:4")
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5000}
    strict = await start_app(config)
    refused = await strict.http.post(f"{strict.base_url}/chat/completions", json=body)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"
    assert local_upstream.chat_requests() == []
    clamping = await start_app({"server": {"clamp_max_tokens": True}, **config})
    assert (
        await clamping.http.post(f"{clamping.base_url}/chat/completions", json=body)
    ).status_code == 200
    [sent] = local_upstream.chat_requests()
    assert sent["json"]["max_tokens"] == 1000 and sent["json"]["messages"] == body["messages"]
