"""`compactgate setup <agent> --gateway URL` against a real gateway process: each agent's
settings carry the gateway's URL and the models and windows its `GET /v1/models` reports; the
errors say what to do; `--write` writes where the agent reads and never replaces a file silently.

The agents reading these settings for real: tests/test_agent_recipes.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.devtools.agent_settings import AGENT_SHARE, AGENTS, claude_window
from gateway.http.auth import key_sha256
from tests.gateway_process import gateway_process

pytestmark = [pytest.mark.e2e]

WINDOW = 64_000
OUTPUT = 4_000
BIG = 300_000
KEY = "sk-gateway-test"


def config(upstream: str) -> dict[str, Any]:
    return {
        "models": [
            {"name": "coder", "upstream": {"base_url": upstream},
             "context_window": WINDOW, "max_output_tokens": OUTPUT},
            {"name": "big", "upstream": {"base_url": upstream}, "context_window": BIG},
        ]
    }  # fmt: skip


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with gateway_process(config("http://127.0.0.1:9/v1"), tmp_path_factory.mktemp("gw")) as gw:
        yield gw


def setup(*args: str, home: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`compactgate setup ...` as a user runs it, with `home` as their home directory."""
    environ = {"HOME": str(home), "PATH": "/usr/bin:/bin", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "gateway", "setup", *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


def files(stdout: str) -> dict[str, str]:
    """The files of a printed snippet: `# <path>` then its text, up to a blank line."""
    found: dict[str, str] = {}
    current: list[str] | None = None
    for line in stdout.splitlines():
        if current is None and line.startswith("# /"):
            current = found.setdefault(line[2:], [])  # type: ignore[arg-type]
        elif current is not None:
            if line == "":
                current = None
            else:
                current.append(line)
    return {path: "\n".join(lines) + "\n" for path, lines in found.items()}  # type: ignore[misc]


def test_codex_gets_a_provider_with_the_gateways_window(gateway: Any, tmp_path: Path) -> None:
    run = setup("codex", "--gateway", gateway.url, home=tmp_path)
    assert run.returncode == 0, run.stderr
    [(path, text)] = files(run.stdout).items()
    assert path == str(tmp_path / ".codex" / "config.toml")
    toml = tomllib.loads(text)
    assert toml["model"] == "coder" and toml["model_provider"] == "compactgate"
    assert toml["model_context_window"] == WINDOW
    assert toml["model_auto_compact_token_limit"] == int(WINDOW * AGENT_SHARE)
    provider = toml["model_providers"]["compactgate"]
    assert provider["base_url"] == gateway.base_url and provider["wire_api"] == "responses"


def test_claude_code_gets_settings_env_with_its_compaction_point(
    gateway: Any, tmp_path: Path
) -> None:
    run = setup("claude-code", "--gateway", gateway.url, "--model", "big", home=tmp_path)
    assert run.returncode == 0, run.stderr
    [(path, text)] = files(run.stdout).items()
    assert path == str(tmp_path / ".claude" / "settings.json")
    env = json.loads(text)["env"]
    assert env["ANTHROPIC_BASE_URL"] == gateway.url  # no /v1: Claude Code appends it
    assert env["ANTHROPIC_MODEL"] == "big"
    assert env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == str(BIG)
    # 300 000 less 20 000 less 13 000 = 267 000, under 90 % of the window: no override needed.
    assert "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE" not in env


@pytest.mark.unit
@pytest.mark.parametrize(
    ("window", "output", "point"),
    [(64_000, 4_000, 57_600), (32_000, None, 28_800), (128_000, None, 95_000),
     (200_000, 8_000, 179_000), (1_000_000, None, 900_000)],
)  # fmt: skip
def test_claude_codes_compaction_point_is_at_most_ninety_percent_of_the_window(
    window: int, output: int | None, point: int
) -> None:
    """Claude Code 2.1 compacts at min(pct % of (W - min(out, 20 000)), W - min(out, 20 000) -
    13 000), W its window setting read as at least 100 000 (docs/agents/claude-code.md)."""
    env = claude_window(window, output)
    told = int(env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"])
    usable = told - min(output or 32_000, 20_000)
    pct = env.get("CLAUDE_AUTOCOMPACT_PCT_OVERRIDE")
    at = usable - 13_000 if pct is None else min(usable * int(pct) // 100, usable - 13_000)
    assert told >= 100_000
    assert at <= window * AGENT_SHARE
    assert abs(at - point) <= usable // 100  # within the override's 1 % steps


def test_opencode_gets_every_served_model_with_its_limits(gateway: Any, tmp_path: Path) -> None:
    run = setup("opencode", "--gateway", gateway.url, home=tmp_path)
    assert run.returncode == 0, run.stderr
    [(path, text)] = files(run.stdout).items()
    assert path == str(tmp_path / ".config" / "opencode" / "opencode.json")
    provider = json.loads(text)["provider"]["compactgate"]
    assert provider["options"]["baseURL"] == gateway.base_url
    assert provider["models"]["coder"]["limit"] == {"context": WINDOW, "output": OUTPUT}
    assert provider["models"]["big"]["limit"]["context"] == BIG
    assert json.loads(text)["model"] == "compactgate/coder"


def test_qwen_code_gets_a_provider_with_the_window(gateway: Any, tmp_path: Path) -> None:
    run = setup("qwen-code", "--gateway", gateway.url, home=tmp_path)
    assert run.returncode == 0, run.stderr
    [(path, text)] = files(run.stdout).items()
    assert path == str(tmp_path / ".qwen" / "settings.json")
    settings = json.loads(text)
    [provider] = settings["modelProviders"]["openai"]
    assert provider["baseUrl"] == gateway.base_url and provider["id"] == "coder"
    assert provider["generationConfig"]["contextWindowSize"] == WINDOW
    assert settings["context"]["autoCompactThreshold"] == AGENT_SHARE


@pytest.mark.parametrize("agent", ["aider", "mini-swe-agent"])
def test_litellm_based_agents_get_the_window_in_a_model_registry(
    gateway: Any, tmp_path: Path, agent: str
) -> None:
    run = setup(agent, "--gateway", gateway.url, home=tmp_path)
    assert run.returncode == 0, run.stderr
    written = files(run.stdout)
    [registry] = [json.loads(t) for p, t in written.items() if p.endswith(".json")]
    entry = registry["openai/coder"]
    assert entry["max_input_tokens"] + entry["max_output_tokens"] == WINDOW
    [settings] = [yaml.safe_load(t) for p, t in written.items() if not p.endswith(".json")]
    if agent == "aider":
        assert settings["openai-api-base"] == gateway.base_url
        assert settings["model"] == "openai/coder"
    else:
        assert settings["model"]["model_kwargs"]["api_base"] == gateway.base_url
        assert settings["model"]["model_name"] == "openai/coder"


@pytest.mark.parametrize(
    ("agent", "line"),
    [("openai", "export OPENAI_BASE_URL={base}"), ("openai-agents", "export OPENAI_BASE_URL={base}"),
     ("anthropic", "export ANTHROPIC_BASE_URL={origin}")],
)  # fmt: skip
def test_sdks_get_their_base_url(gateway: Any, tmp_path: Path, agent: str, line: str) -> None:
    run = setup(agent, "--gateway", gateway.base_url, home=tmp_path)  # `/v1` is accepted too
    assert run.returncode == 0, run.stderr
    assert line.format(base=gateway.base_url, origin=gateway.url) in run.stdout.splitlines()


def test_an_unknown_agent_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    run = setup("vim", home=tmp_path)
    assert run.returncode == 1
    assert "no setup for an agent named 'vim'" in run.stderr
    assert all(name in run.stderr for name in AGENTS)


def test_no_gateway_running_says_how_to_start_one(tmp_path: Path) -> None:
    run = setup("codex", "--gateway", "http://127.0.0.1:9", home=tmp_path)
    assert run.returncode == 1
    assert "no gateway answers at http://127.0.0.1:9" in run.stderr
    assert "compactgate serve" in run.stderr


def test_an_unknown_model_lists_the_served_ones(gateway: Any, tmp_path: Path) -> None:
    run = setup("codex", "--gateway", gateway.url, "--model", "gpt-9", home=tmp_path)
    assert run.returncode == 1
    assert "does not serve a model named 'gpt-9'; it serves: coder, big" in run.stderr


def test_a_gateway_with_keys_needs_one_and_lists_only_its_models(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    keyed = config("http://127.0.0.1:9/v1")
    keyed["auth"] = {"keys": [
        {"key_sha256": key_sha256(KEY.encode()), "tenant": "a", "models": ["big"]},
        {"key_sha256": key_sha256(b"sk-none"), "tenant": "b", "models": ["nothing-*"]},
    ]}  # fmt: skip
    with gateway_process(keyed, tmp_path_factory.mktemp("gw")) as gw:
        refused = setup("codex", "--gateway", gw.url, home=tmp_path)
        assert refused.returncode == 1
        assert "export COMPACTGATE_API_KEY=" in refused.stderr
        allowed = setup(
            "codex", "--gateway", gw.url, home=tmp_path, env={"COMPACTGATE_API_KEY": KEY}
        )
        assert allowed.returncode == 0, allowed.stderr
        assert 'model = "big"' in allowed.stdout
        none = setup(
            "codex", "--gateway", gw.url, home=tmp_path, env={"COMPACTGATE_API_KEY": "sk-none"}
        )
        assert none.returncode == 1
        assert "serves no models" in none.stderr


def test_write_creates_the_file_and_never_replaces_one_silently(
    gateway: Any, tmp_path: Path
) -> None:
    settings = tmp_path / ".claude" / "settings.json"
    first = setup("claude-code", "--gateway", gateway.url, "--write", home=tmp_path)
    assert first.returncode == 0, first.stderr
    assert f"wrote {settings}" in first.stderr
    assert json.loads(settings.read_text())["env"]["ANTHROPIC_MODEL"] == "coder"
    settings.write_text('{"theme": "mine"}\n')
    again = setup("claude-code", "--gateway", gateway.url, "--write", home=tmp_path)
    assert again.returncode == 1
    assert f"{settings} exists: not overwritten" in again.stderr
    assert settings.read_text() == '{"theme": "mine"}\n'
    forced = setup("claude-code", "--gateway", gateway.url, "--write", "--force", home=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert f"overwrote {settings}" in forced.stderr
    assert (tmp_path / ".claude" / "settings.json.bak").read_text() == '{"theme": "mine"}\n'
    assert json.loads(settings.read_text())["env"]["ANTHROPIC_MODEL"] == "coder"


def test_write_for_an_sdk_says_there_is_no_file(gateway: Any, tmp_path: Path) -> None:
    run = setup("openai", "--gateway", gateway.url, "--write", home=tmp_path)
    assert run.returncode == 1
    assert "environment variables only" in run.stderr
