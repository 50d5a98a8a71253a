"""Issue 40 end to end, through `compactgate serve` in front of the fake upstream.

An Aider-shaped request (the corpus's: four files and a repo map as user messages, "What is in
these files?") over a 40k window: every file keeps a part of itself, the forwarded size lands
near the policy's target (not far below it), and the ledger holds no line of a file. Then the
model reads the rest of a file the excerpt hid, through the gateway's own expansion tool
(design D5.13, D13.4), and the client sees only the final answer.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from benchmarks.corpus import sessions
from policies.excerpts import NOTE_RE
from tests.conftest import GatewayStarter
from tests.fake_upstream import FakeUpstream

LEDGER_HEADER = "[Stated earlier in this conversation, kept word for word:]"
KEY = {"authorization": "Bearer sk-aider-user"}


def config(upstream: FakeUpstream) -> dict[str, Any]:
    return {
        "models": [
            {
                "name": "m",
                "upstream": {"base_url": upstream.base_url},
                "context_window": 40_000,
                "max_output_tokens": 4096,
                "tokenizer": "tiktoken:o200k_base",
            }
        ]
    }


def aider() -> tuple[Any, dict[str, Any]]:
    [s] = sessions("dev", 1, ["aider"], ["en"])
    body = list(s.requests())[-1]
    return s, {**body, "model": "m", "stream": False}


def texts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if isinstance(m.get("content"), str)]


def test_every_file_keeps_a_part_and_the_request_lands_near_the_target(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream
) -> None:
    s, body = aider()
    gw = start_gateway(config(fake_upstream))
    plan = httpx.post(f"{gw.base_url}/compactgate/plan", json=body, headers=KEY, timeout=60).json()
    regions = plan["tokens_by_region"]
    outside = plan["tokens_after"] - regions["system"] - regions["history"]
    response = httpx.post(f"{gw.base_url}/chat/completions", json=body, headers=KEY, timeout=60)
    assert response.status_code == 200
    [forwarded] = fake_upstream.chat_requests()
    sent = texts(forwarded["json"]["messages"])
    joined = "\n".join(sent)
    for f in s.files:
        assert f.probe() in joined, f.name  # every file the client sent keeps a part
    size = int(response.headers["x-compactgate-tokens-after"]) - outside
    assert plan["tokens_before"] > plan["trigger"]  # it had to shrink
    assert 0.7 * plan["target"] <= size <= plan["target"]
    lines = {ln.strip() for f in s.files for ln in f.text.split("\n") if len(ln.strip()) >= 12}
    ledger = [t for t in sent if t.startswith(LEDGER_HEADER)]
    assert not any(line in t for t in ledger for line in lines)
    assert "excerpt" in response.headers["x-compactgate-steps"]


def test_the_model_reads_the_rest_of_a_file_through_the_expansion_tool(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream
) -> None:
    s, body = aider()
    gw = start_gateway(config(fake_upstream))
    plan = httpx.post(f"{gw.base_url}/compactgate/plan", json=body, headers=KEY, timeout=60).json()
    [files] = [t for t in texts(plan["forwarded"]["messages"]) if "added these files" in t]
    note = NOTE_RE.search(files)
    assert note is not None
    ref = note.group(1)
    first = int(re.search(r"lines (\d+)-", note.group(0)).group(1))  # type: ignore[union-attr]
    fake_upstream.script(
        [
            {
                "kind": "tool_calls",
                "tool_calls": [
                    {
                        "id": "call_internal",
                        "function": {
                            "name": "tool_output_cache",
                            "arguments": {"ref_id": ref, "offset": 1, "limit": 3},
                        },
                    }
                ],
            },
            {"kind": "ok", "content": "They hold the PDF renderer and the payments module."},
        ]
    )
    response = httpx.post(f"{gw.base_url}/chat/completions", json=body, headers=KEY, timeout=60)
    assert response.status_code == 200
    answer = response.json()["choices"][0]["message"]
    assert answer["content"] == "They hold the PDF renderer and the payments module."
    assert not answer.get("tool_calls")
    assert response.headers["x-compactgate-internal-rounds"] == "1"
    first_round, second_round = fake_upstream.chat_requests()
    names = [t["function"]["name"] for t in first_round["json"]["tools"]]
    assert "tool_output_cache" in names
    [result] = [
        m["content"]
        for m in second_round["json"]["messages"]
        if m.get("role") == "tool" and m.get("tool_call_id") == "call_internal"
    ]
    # the file the note sits in: its lines from `first` on are what the ref holds
    head = files[: note.start()]
    name = head[: head.rindex("\n```\n")].rsplit("\n", 1)[-1]
    [content] = [f.text for f in s.files if f.name == name]
    hidden = content.split("\n")[first - 1 : first + 2]
    for n, line in enumerate(hidden, 1):
        assert f"{n:>6}\t{line}" in result
