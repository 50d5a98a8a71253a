"""The real coding agents on a scripted task: Codex CLI (`codex exec`) and Claude Code
(`claude -p`) through a gateway process, the fake upstream playing the model.

The agents come from `agents/package-lock.json` (`scripts/install-agents`); without them a test
that asks for one is skipped, unless `COMPACTGATE_REQUIRE_AGENTS` is set (CI), when it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.configs import one_model
from tests.conftest import GatewayProcess

BIN = Path(__file__).resolve().parent.parent / "agents" / "node_modules" / ".bin"
STEPS = 8
FINAL = "All eight files inspected; nothing left to fix."


def agent(name: str) -> Path:
    path = BIN / name
    if not path.exists():
        message = f"{path} is missing: run scripts/install-agents"
        if os.environ.get("COMPACTGATE_REQUIRE_AGENTS"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def agent_config(base_url: str, window: int) -> dict[str, Any]:
    """The gateway's config for an agent session: one model `m` with `window` tokens."""
    return one_model(base_url, tokenizer="chars:4", context_window=window, max_output_tokens=2000)


def outgrowing_codex_session(fake: Any, window: int) -> str:
    """Script a Codex session that outgrows `window` on the fake upstream (which refuses a
    request over it); the Codex settings for it. Each step prints ~9 KB (about 2 300 tokens):
    eight of them are twice what fits beside Codex's own instructions and tools (about 9 000)."""
    fake.configure({"context_limit": window})
    calls = shell_steps(STEPS, "seq {step}000 {step}999 | head -1600", reasoning=True)
    fake.script([*calls, {"kind": "ok", "content": FINAL}])
    return "model_context_window = 1000000\nmodel_auto_compact_token_limit = 900000\n"


def shell_steps(steps: int, command: str, reasoning: bool) -> list[dict[str, Any]]:
    """The fake model's shell calls for Codex, one per step (`command` with `{step}`)."""
    return [
        {
            "kind": "tool_calls",
            "reasoning": reasoning,
            "tool_calls": [
                {"name": "exec_command", "arguments": {"cmd": command.format(step=step)}}
            ],
        }
        for step in range(1, steps + 1)
    ]


def run_codex(
    gateway: GatewayProcess,
    tmp_path: Path,
    settings: str,
    timeout: float = 240,
    websockets: bool = False,
) -> str:
    """`codex exec` on the numbered-files task through the gateway (over its WebSocket with
    `websockets`); `settings`: lines of its config.toml. Its JSON-lines output, once it has
    finished without an error."""
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'model = "m"\nmodel_provider = "gateway"\n{settings}'
        "[model_providers.gateway]\n"
        f'name = "CompactGate"\nbase_url = "{gateway.base_url}"\n'
        'env_key = "GATEWAY_KEY"\nwire_api = "responses"\n'
        + ("supports_websockets = true\n" if websockets else "")
    )
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "CODEX_HOME": str(home), "GATEWAY_KEY": "sk-codex", "NO_COLOR": "1"}
    run = subprocess.run(
        [str(agent("codex")), "exec", "--skip-git-repo-check", "--sandbox",
         "danger-full-access", "--json", "Inspect the numbered files and report."],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def bash_steps(steps: int, before: str = "") -> list[dict[str, Any]]:
    """The fake model's Bash calls for Claude Code, one per step (each prints ~15 KB), each
    with a thinking block whose signature must come back; `before` goes in front of each
    command."""
    return [
        {
            "kind": "tool_calls",
            "reasoning": True,
            "tool_calls": [
                {
                    "name": "Bash",
                    "arguments": {
                        "command": f"{before}seq {step}0000 {step}9999 | head -2600",
                        "description": f"list part {step}",
                    },
                }
            ],
        }
        for step in range(1, steps + 1)
    ]


def run_claude(
    claude: Path, gateway_url: str, home: Path, timeout: float, **env: str
) -> dict[str, Any]:
    """`claude -p` on the numbered-parts task through the gateway, its settings and sessions in
    `home`; its JSON result, once it has finished with the model's last answer."""
    work = home / "work"
    work.mkdir()
    run = subprocess.run(
        [str(claude), "-p", "Inspect the numbered parts and report.", "--model", "m",
         "--output-format", "json", "--allowedTools", "Bash"],
        cwd=work,
        env={
            **os.environ,
            "HOME": str(home),  # its settings and session files stay in the test's directory
            "ANTHROPIC_BASE_URL": gateway_url,
            "ANTHROPIC_API_KEY": "sk-claude",
            "ANTHROPIC_SMALL_FAST_MODEL": "m",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            **env,
        },
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )  # fmt: skip
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    result: dict[str, Any] = json.loads(run.stdout)
    assert result["is_error"] is False and result["result"] == FINAL, run.stdout[-2000:]
    return result
