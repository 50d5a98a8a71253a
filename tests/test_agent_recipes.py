"""Each agent page's recipe, followed for real: `compactgate setup <agent> --gateway URL --write`
writes the agent's settings into a fresh home directory, the real agent runs a short scripted
task non-interactively with nothing but those settings and an API key, and the task's requests
reach the fake upstream through a `compactgate serve` process, in the API that agent speaks.

The agents come from scripts/install-agents: the npm ones from agents/package-lock.json, the
Python ones (Aider, mini-swe-agent, the OpenAI Agents SDK) into virtual environments of their own
under agents/.venvs/ from requirements/agents/*.txt, since their pins clash with the gateway's
lock. Without them a test is skipped, unless COMPACTGATE_REQUIRE_AGENTS is set (CI).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.devtools.agent_settings import AGENT_SHARE
from tests.agent_runs import FINAL, STEPS, agent, bash_steps
from tests.conftest import GatewayProcess, GatewayStarter
from tests.fake_agent_apis import asks_for_summary, prompt_tokens
from tests.fake_upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
VENVS = ROOT / "agents" / ".venvs"
WINDOW = 128_000
DONE = "Recipe followed; the listing is in."
MARK = "recipe-step-output"


def python_agent(venv: str, exe: str) -> Path:
    """An agent installed into agents/.venvs/<venv> by scripts/install-agents."""
    path = VENVS / venv / "bin" / exe
    if not path.exists():
        message = f"{path} is missing: run scripts/install-agents"
        if os.environ.get("COMPACTGATE_REQUIRE_AGENTS"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def served(start_gateway: GatewayStarter, fake: FakeUpstream) -> GatewayProcess:
    config = {
        "models": [
            {"name": "m", "upstream": {"base_url": fake.base_url}, "tokenizer": "chars:4",
             "context_window": WINDOW, "max_output_tokens": 4000},
        ]
    }  # fmt: skip
    return start_gateway(config)


def setup_write(name: str, gateway: GatewayProcess, home: Path) -> str:
    """`compactgate setup <name> --gateway <url> --write`, as the agent's page says."""
    run = subprocess.run(
        [sys.executable, "-m", "gateway", "setup", name, "--gateway", gateway.url, "--write"],
        env={**os.environ, "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a newcomer's shell: a home of their own, no settings of ours but the
    key, and none of the test run's agent or provider variables."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TERM", "TMPDIR")}
    return {
        **keep,
        "HOME": str(home),
        "NO_COLOR": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        **extra,
    }


def run_agent(argv: list[str], home: Path, env: dict[str, str], timeout: float = 240) -> str:
    work = home / "work"
    work.mkdir(exist_ok=True)
    run = subprocess.run(
        argv, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    return run.stdout + run.stderr


def tool_step(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {
        "kind": "tool_calls",
        "tool_calls": [{"id": call_id, "name": name, "arguments": arguments}],
    }


def reached(fake: FakeUpstream, path: str, gateway: GatewayProcess) -> list[dict[str, Any]]:
    """The agent's requests on `path` that reached the upstream, each through the gateway (the
    gateway's request log names every one)."""
    records = [r for r in fake.requests() if r["path"] == path and r["json"]]
    assert records, [r["path"] for r in fake.requests()]
    logged = gateway.output()
    assert "status=200" in logged and "model=m" in logged, logged[-2000:]
    assert all(r["json"].get("model") == "m" for r in records), [
        r["json"].get("model") for r in records
    ]
    return records


def tool_output_came_back(records: list[dict[str, Any]]) -> bool:
    """The tool ran for real: its output went back to the model in a later request."""
    return any(MARK in json.dumps(r["json"]) for r in records)


def test_codex_recipe(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    codex = agent("codex")
    gateway = served(start_gateway, fake_upstream)
    setup_write("codex", gateway, tmp_path)
    fake_upstream.script([
        tool_step("exec_command", {"cmd": f"echo {MARK}"}, "call_1"),
        {"kind": "ok", "content": DONE},
    ])  # fmt: skip
    out = run_agent(
        [str(codex), "exec", "--skip-git-repo-check", "--sandbox", "danger-full-access", "--json",
         "List the files."],
        tmp_path, clean_env(tmp_path, OPENAI_API_KEY="sk-recipe"),
    )  # fmt: skip
    assert DONE in out
    assert tool_output_came_back(reached(fake_upstream, "/v1/responses", gateway))


def test_claude_code_recipe(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    claude = agent("claude")
    gateway = served(start_gateway, fake_upstream)
    setup_write("claude-code", gateway, tmp_path)
    fake_upstream.script([
        tool_step("Bash", {"command": f"echo {MARK}", "description": "list"}, "toolu_1"),
        {"kind": "ok", "content": DONE},
    ])  # fmt: skip
    out = run_agent(
        [str(claude), "-p", "List the files.", "--output-format", "json", "--allowedTools", "Bash"],
        tmp_path,
        clean_env(tmp_path, ANTHROPIC_API_KEY="sk-recipe", DISABLE_AUTOUPDATER="1",
                  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1"),
    )  # fmt: skip
    assert DONE in out
    assert tool_output_came_back(reached(fake_upstream, "/v1/messages", gateway))


def test_opencode_recipe(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    opencode = agent("opencode")
    gateway = served(start_gateway, fake_upstream)
    setup_write("opencode", gateway, tmp_path)
    fake_upstream.script([
        tool_step("bash", {"command": f"echo {MARK}", "description": "list"}, "call_1"),
        {"kind": "ok", "content": DONE},
    ])  # fmt: skip
    out = run_agent(
        # --title: no title request to the model, which would take the script's first answer
        [str(opencode), "run", "--title", "recipe", "--auto", "List the files."],
        tmp_path,
        clean_env(tmp_path, OPENAI_API_KEY="sk-recipe", OPENCODE_DISABLE_MODELS_FETCH="1",
                  OPENCODE_DISABLE_AUTOUPDATE="1"),
    )  # fmt: skip
    assert DONE in out
    assert tool_output_came_back(reached(fake_upstream, "/v1/chat/completions", gateway))


def test_qwen_code_recipe(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    qwen = agent("qwen")
    gateway = served(start_gateway, fake_upstream)
    setup_write("qwen-code", gateway, tmp_path)
    fake_upstream.script([
        tool_step("run_shell_command", {"command": f"echo {MARK}", "description": "list"}, "call_1"),
        {"kind": "ok", "content": DONE},
    ])  # fmt: skip
    out = run_agent(
        [str(qwen), "-p", "List the files.", "--yolo"],
        tmp_path,
        clean_env(tmp_path, OPENAI_API_KEY="sk-recipe"),
    )
    assert DONE in out
    assert tool_output_came_back(reached(fake_upstream, "/v1/chat/completions", gateway))


def test_aider_recipe(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    aider = python_agent("aider", "aider")
    gateway = served(start_gateway, fake_upstream)
    setup_write("aider", gateway, tmp_path)
    fake_upstream.script([{"kind": "ok", "content": DONE}])
    out = run_agent(
        [str(aider), "--message", "Say what you see.", "--yes-always", "--no-git",
         "--no-check-update", "--no-show-release-notes", "--analytics-disable", "--no-pretty",
         "--no-stream"],
        tmp_path, clean_env(tmp_path, OPENAI_API_KEY="sk-recipe"),
    )  # fmt: skip
    assert DONE in out
    reached(fake_upstream, "/v1/chat/completions", gateway)


def test_mini_swe_agent_recipe(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    mini = python_agent("mini-swe-agent", "mini")
    gateway = served(start_gateway, fake_upstream)
    printed = setup_write("mini-swe-agent", gateway, tmp_path)
    config = tmp_path / ".config" / "mini-swe-agent" / "compactgate.yaml"
    assert str(config) in printed  # the command it prints names the file it wrote
    fake_upstream.script([
        tool_step("bash", {"command": f"echo {MARK}"}, "call_1"),
        tool_step("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}, "call_2"),
    ])  # fmt: skip
    run_agent(
        [str(mini), "-c", "mini.yaml", "-c", str(config), "-t", "List the files.", "--yolo",
         "--exit-immediately", "-o", str(tmp_path / "trajectory.json")],
        tmp_path,
        clean_env(tmp_path, OPENAI_API_KEY="sk-recipe", MSWEA_CONFIGURED="true",
                  MSWEA_SILENT_STARTUP="1"),
    )  # fmt: skip
    assert tool_output_came_back(reached(fake_upstream, "/v1/chat/completions", gateway))
    trajectory = json.loads((tmp_path / "trajectory.json").read_text())
    assert trajectory["info"]["exit_status"] == "Submitted", trajectory["info"]


AGENTS_SDK_SCRIPT = """
import subprocess, sys
from agents import Agent, Runner, function_tool

@function_tool
def shell(command: str) -> str:
    \"\"\"Run a shell command and return its output.\"\"\"
    return subprocess.run(command, shell=True, capture_output=True, text=True).stdout

agent = Agent(name="recipe", instructions="Use the shell.", model=sys.argv[1], tools=[shell])
print(Runner.run_sync(agent, "List the files.").final_output)
"""


def test_openai_agents_sdk_recipe(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    python = python_agent("openai-agents", "python")
    gateway = served(start_gateway, fake_upstream)
    printed = subprocess.run(
        [sys.executable, "-m", "gateway", "setup", "openai-agents", "--gateway", gateway.url],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    exports = dict(
        line.removeprefix("export ").split("=", 1)
        for line in printed.splitlines()
        if line.startswith("export ")
    )
    fake_upstream.script([
        tool_step("shell", {"command": f"echo {MARK}"}, "call_1"),
        {"kind": "ok", "content": DONE},
    ])  # fmt: skip
    script = tmp_path / "recipe.py"
    script.write_text(AGENTS_SDK_SCRIPT)
    out = run_agent(
        [str(python), str(script), "m"],
        tmp_path,
        clean_env(tmp_path, OPENAI_API_KEY="sk-recipe", **exports),
    )
    assert DONE in out
    assert tool_output_came_back(reached(fake_upstream, "/v1/responses", gateway))


def test_claude_code_compacts_itself_near_ninety_percent_of_the_gateways_window(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """The settings setup writes move Claude Code's own compaction to about 90 % of a 64 000-token
    window, although Claude Code reads its window setting as at least 100 000 (see
    docs/agents/claude-code.md). Measured with Claude Code pointed at the upstream directly:
    through the gateway, which compacts first, its own compaction would not run."""
    claude = agent("claude")
    window = 64_000
    config = {"models": [{"name": "m", "upstream": {"base_url": fake_upstream.base_url},
                          "context_window": window, "max_output_tokens": 4000}]}  # fmt: skip
    setup_write("claude-code", start_gateway(config), tmp_path)
    # Straight to the upstream, every other value as written (settings outrank the environment).
    settings = tmp_path / ".claude" / "settings.json"
    written = json.loads(settings.read_text())
    written["env"]["ANTHROPIC_BASE_URL"] = fake_upstream.root
    settings.write_text(json.dumps(written))
    steps = bash_steps(STEPS + 6)
    fake_upstream.script([*steps, {"kind": "ok", "content": FINAL}])
    run_agent(
        [str(claude), "-p", "Inspect the numbered parts and report.", "--output-format", "json",
         "--allowedTools", "Bash"],
        tmp_path,
        clean_env(tmp_path, ANTHROPIC_API_KEY="sk-recipe", DISABLE_AUTOUPDATER="1",
                  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1"),
    )  # fmt: skip
    records = [r["json"] for r in fake_upstream.requests() if r["path"] == "/v1/messages"]
    sizes = [prompt_tokens(body, 4.0) for body in records]
    summaries = [i for i, body in enumerate(records) if asks_for_summary(body)]
    assert summaries, sizes  # it compacted itself before the window
    before = sizes[: summaries[0]]
    assert max(before) <= window * AGENT_SHARE, before
    assert max(before) >= window * 0.75, before  # not long before the point it was given
