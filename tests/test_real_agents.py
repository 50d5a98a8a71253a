"""The real coding agents through a real gateway process, against the fake upstream.

Codex CLI (`codex exec`, Responses API over SSE) and Claude Code (`claude -p`, Anthropic
Messages, always streamed) run a multi-step shell-tool session whose history outgrows the
window. The fake upstream scripts the model's tool calls, the agent runs them for real and sends
their output back; the fake refuses, as the providers do, any request that breaks their pairing,
reasoning or signature rules. The session must finish with the model's last answer.

The agents come from `agents/package-lock.json` (`scripts/install-agents`): see
`tests/agent_runs.py`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from tests.agent_runs import (
    FINAL,
    STEPS,
    agent,
    agent_config,
    bash_steps,
    outgrowing_codex_session,
    run_claude,
    run_codex,
    shell_steps,
)
from tests.conftest import GatewayStarter
from tests.fake_agent_apis import prompt_tokens, summary_requests
from tests.fake_upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_codex_finishes_a_tool_session_that_outgrows_the_window(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    agent("codex")
    window = 24_000
    gateway = start_gateway(agent_config(fake_upstream.base_url, window))
    settings = outgrowing_codex_session(fake_upstream, window)
    output = run_codex(gateway, tmp_path, settings, timeout=180)
    events = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    texts = [json.dumps(e) for e in events]
    assert any(FINAL in text for text in texts), output[-3000:]
    commands = [e for e in events if "command_execution" in json.dumps(e)]
    assert commands  # the agent really ran the tool calls
    sizes = [
        prompt_tokens(r["json"], 4.0)
        for r in fake_upstream.requests()
        if r["path"] == "/v1/responses" and r["json"]
    ]
    assert len(sizes) >= STEPS + 1
    refused = gateway.output().count("status=400")
    assert refused == 0, gateway.output()[-3000:]
    # The history outgrew the window: what reached the upstream was compacted to fit it.
    assert max(sizes) <= window * 1.1
    assert re.search(r"steps=(?!none\b)\w", gateway.output())  # some request was compacted


def test_claude_code_finishes_a_tool_session_that_outgrows_the_window(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    claude = agent("claude")
    window = 40_000
    gateway = start_gateway(agent_config(fake_upstream.base_url, window))
    fake_upstream.configure({"context_limit": window})
    # Claude Code's own system prompt and tools are about 24 000 tokens; each step prints
    # ~15 KB (about 4 000 tokens) and brings a thinking block whose signature must come back.
    fake_upstream.script([*bash_steps(STEPS), {"kind": "ok", "content": FINAL}])
    result = run_claude(claude, gateway.url, tmp_path, timeout=180)
    assert result["num_turns"] >= STEPS + 1  # every tool call was run and answered
    sizes = [
        prompt_tokens(r["json"], 4.0)
        for r in fake_upstream.requests()
        if r["path"] == "/v1/messages" and r["json"]
    ]
    assert len(sizes) >= STEPS + 1
    assert gateway.output().count("status=400") == 0, gateway.output()[-3000:]
    assert max(sizes) <= window * 1.1
    assert "api=messages" in gateway.output() and "steps=none" in gateway.output()
    assert re.search(r"steps=(?!none\b)\w", gateway.output())  # some request was compacted


def test_codexs_own_compaction_is_answered_from_a_summary_made_ahead(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """Codex compacts its history itself past `model_auto_compact_token_limit`. Its first
    compaction goes upstream and teaches the gateway where and how; the gateway then makes the
    next summary while Codex works, and answers the next compaction request at once."""
    agent("codex")
    gateway = start_gateway(agent_config(fake_upstream.base_url, 200_000))
    calls = shell_steps(9, "sleep 1; seq {step}0000 {step}1500", reasoning=False)
    fake_upstream.script([*calls, {"kind": "ok", "content": FINAL}])
    settings = "model_context_window = 200000\nmodel_auto_compact_token_limit = 14000\n"
    output = run_codex(gateway, tmp_path, settings)
    assert FINAL in output, output[-3000:]
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    forwarded = _metric(metrics, 'agent="codex",outcome="forwarded"')
    answered = _metric(metrics, 'agent="codex",outcome="answered"')
    assert forwarded >= 1 and answered >= 1, (forwarded, answered, gateway.output()[-3000:])
    # Every compaction Codex asked for was either forwarded or answered by the gateway; the
    # upstream saw only the forwarded ones and the gateway's own, made ahead of need.
    own = _metric(metrics, 'agent="codex",outcome="prepared"')
    assert len(summary_requests(fake_upstream.requests())) == forwarded + own


def _metric(text: str, labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"compactgate_agent_compactions_total{{{labels}}}"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_claude_codes_own_compaction_is_answered_from_a_summary_made_ahead(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """Claude Code compacts its history itself when it nears the window it was told
    (`CLAUDE_CODE_AUTO_COMPACT_WINDOW`, read as at least 100 000: it compacts near 67 000
    tokens, 100 000 less 20 000 for output less 13 000). Its first compaction goes upstream and
    teaches the gateway where and how; the gateway makes the next summary while Claude Code
    works, and answers the next compaction request itself."""
    claude = agent("claude")
    gateway = start_gateway(agent_config(fake_upstream.base_url, 400_000))
    fake_upstream.script([*bash_steps(26, "sleep 0.5; "), {"kind": "ok", "content": FINAL}])
    run_claude(claude, gateway.url, tmp_path, timeout=300, CLAUDE_CODE_AUTO_COMPACT_WINDOW="100000")
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    agent_ = 'agent="claude-code"'
    forwarded = _metric(metrics, f'{agent_},outcome="forwarded"')
    answered = _metric(metrics, f'{agent_},outcome="answered"')
    own = _metric(metrics, f'{agent_},outcome="prepared"')
    assert forwarded >= 1 and answered >= 1, (forwarded, answered, gateway.output()[-3000:])
    assert len(summary_requests(fake_upstream.requests())) == forwarded + own
