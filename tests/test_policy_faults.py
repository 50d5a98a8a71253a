"""A fault in a policy step never fails the request (design D1.9): the client's own request goes
upstream as it came, the answer reaches the client, and the fault is counted and logged."""

from __future__ import annotations

from typing import Any

import pytest

from policies.steps.fifo import Fifo
from tests.configs import one_model
from tests.in_process import AppStarter, LocalUpstream


def history(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: " + "words " * 200})
        messages.append({"role": "assistant", "content": f"Answer {turn}: " + "words " * 200})
    messages.append({"role": "user", "content": "And finally?"})
    return messages


async def test_a_failing_step_sends_the_request_as_it_came(
    start_app: AppStarter, local_upstream: LocalUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: Fifo, *args: Any) -> Any:
        raise RuntimeError("a bug in a step")

    monkeypatch.setattr(Fifo, "apply", broken)
    model = {"tokenizer": "chars:4", "context_window": 16_000, "max_output_tokens": 500}
    gw = await start_app(one_model(local_upstream.base_url, [{"type": "fifo"}], **model))
    messages = history(30)  # well over the trigger: the chain must run
    local_upstream.script([{"kind": "ok", "content": "fine"}])
    raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=messages)
    assert raw.parse().choices[0].message.content == "fine"
    assert raw.headers["x-compactgate-steps"] == "none"
    [sent] = local_upstream.chat_requests()
    assert sent["json"]["messages"] == messages  # the client's own request, unchanged
    scraped = (await gw.http.get(f"{gw.url}/metrics")).text
    assert "compactgate_policy_errors_total 1.0" in scraped
    assert "a policy step failed" in gw.logs()
