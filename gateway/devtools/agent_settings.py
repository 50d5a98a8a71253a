"""Each agent's settings for a gateway: the files, environment and command that point Codex,
Claude Code, OpenCode, Qwen Code, Aider, mini-swe-agent, the OpenAI Agents SDK or an SDK at it.

The rule it owns: a renderer uses only what it is given (the gateway's URL and the models its
`/v1/models` lists) and tells an agent that compacts its history itself to do so at
`AGENT_SHARE` of the window, above the gateway's trigger (0.8 of the budget by default), so the
gateway compacts first and the agent's own compaction is the backstop (design D8.6).
docs/agents/<agent>.md explains each setting; tests/test_agent_recipes.py runs each agent on
what is rendered here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

AGENT_SHARE = 0.9  # where an agent that compacts itself is told to, as a share of the window
# Claude Code 2.1 reads CLAUDE_CODE_AUTO_COMPACT_WINDOW as at least this many tokens, and compacts
# at that window less min(its output limit, 20 000) less 13 000 (verified against the binary).
CLAUDE_MIN_WINDOW = 100_000
CLAUDE_OUTPUT_SHARE_CAP = 20_000
CLAUDE_BUFFER = 13_000
CLAUDE_DEFAULT_OUTPUT = 32_000


@dataclass(frozen=True)
class ServedModel:
    """A model as the gateway's `GET /v1/models` lists it."""

    name: str
    context_window: int | None
    max_output_tokens: int | None


@dataclass(frozen=True)
class SetupFile:
    """A settings file of the agent's: where `--write` puts it, and its text."""

    path: Path
    text: str


@dataclass(frozen=True)
class Snippet:
    """What an agent needs: files, environment variables, and the command that starts it."""

    agent: str
    files: tuple[SetupFile, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    command: str = ""
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Target:
    """What a renderer gets: the gateway's URLs, the models it serves and the one chosen."""

    origin: str  # http://host:port, no /v1
    models: tuple[ServedModel, ...]
    model: ServedModel
    home: Path
    environ: Mapping[str, str]

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    def agent_limit(self) -> int | None:
        """The size at which an agent that compacts itself should: AGENT_SHARE of the window."""
        window = self.model.context_window
        return None if window is None else int(window * AGENT_SHARE)


def _codex(t: Target) -> Snippet:
    home = Path(t.environ.get("CODEX_HOME") or t.home / ".codex")
    lines = [
        f'model = "{t.model.name}"',
        'model_provider = "compactgate"',
    ]
    if t.model.context_window:
        lines += [
            f"model_context_window = {t.model.context_window}",
            f"model_auto_compact_token_limit = {t.agent_limit()}",
        ]
    lines += [
        "[model_providers.compactgate]",
        'name = "CompactGate"',
        f'base_url = "{t.base_url}"',
        'env_key = "OPENAI_API_KEY"',
        'wire_api = "responses"',
    ]
    return Snippet(
        "codex",
        files=(SetupFile(home / "config.toml", "\n".join(lines) + "\n"),),
        command='codex exec "your task"   # or `codex` for the interactive agent',
        notes=("OPENAI_API_KEY: the key your upstream expects, or a gateway key (auth.keys)",),
    )


def claude_window(window: int, max_output: int | None) -> dict[str, str]:
    """Claude Code's auto-compaction settings for a gateway window: it compacts at AGENT_SHARE
    of it. Its window setting reads as at least CLAUDE_MIN_WINDOW, so a smaller gateway window
    lowers the compaction point with the percentage override instead."""
    wanted = int(window * AGENT_SHARE)
    told = max(window, CLAUDE_MIN_WINDOW)
    usable = told - min(max_output or CLAUDE_DEFAULT_OUTPUT, CLAUDE_OUTPUT_SHARE_CAP)
    settings = {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(told)}
    if usable - CLAUDE_BUFFER > wanted:
        settings["CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"] = str(max(1, wanted * 100 // usable))
    return settings


def _claude_code(t: Target) -> Snippet:
    env = {
        "ANTHROPIC_BASE_URL": t.origin,  # no /v1: Claude Code appends /v1/messages
        "ANTHROPIC_MODEL": t.model.name,
        "ANTHROPIC_SMALL_FAST_MODEL": t.model.name,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": t.model.name,
    }
    if t.model.max_output_tokens:
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(t.model.max_output_tokens)
    if t.model.context_window:
        env.update(claude_window(t.model.context_window, t.model.max_output_tokens))
    home = Path(t.environ.get("CLAUDE_CONFIG_DIR") or t.home / ".claude")
    text = json.dumps({"env": env}, indent=2) + "\n"
    return Snippet(
        "claude-code",
        files=(SetupFile(home / "settings.json", text),),
        command='claude -p "your task"   # or `claude` for the interactive agent',
        notes=(
            "ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN): the key your upstream expects, or a "
            "gateway key (auth.keys)",
            "Claude Code prints `[claude-code:unrecognized_model]` once for a model name outside "
            "its catalog: a warning, the session goes on (docs/agents/claude-code.md)",
        ),
    )


def _opencode(t: Target) -> Snippet:
    models: dict[str, Any] = {}
    for m in t.models:
        entry: dict[str, Any] = {"name": m.name}
        if m.context_window:
            entry["limit"] = {
                "context": m.context_window,
                "output": m.max_output_tokens or min(32_000, m.context_window // 4),
            }
        models[m.name] = entry
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "compactgate": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "CompactGate",
                "options": {"baseURL": t.base_url, "apiKey": "{env:OPENAI_API_KEY}"},
                "models": models,
            }
        },
        "model": f"compactgate/{t.model.name}",
    }
    base = Path(t.environ.get("XDG_CONFIG_HOME") or t.home / ".config")
    return Snippet(
        "opencode",
        files=(
            SetupFile(base / "opencode" / "opencode.json", json.dumps(config, indent=2) + "\n"),
        ),
        command='opencode run "your task"   # or `opencode` for the interactive agent',
        notes=("an opencode.json in a project's directory takes precedence over this one",),
    )


def _qwen_code(t: Target) -> Snippet:
    generation: dict[str, Any] = {}
    if t.model.context_window:
        generation["contextWindowSize"] = t.model.context_window
    if t.model.max_output_tokens:
        generation["samplingParams"] = {"max_tokens": t.model.max_output_tokens}
    provider: dict[str, Any] = {
        "id": t.model.name,
        "name": f"{t.model.name} (CompactGate)",
        "envKey": "OPENAI_API_KEY",
        "baseUrl": t.base_url,
    }
    if generation:
        provider["generationConfig"] = generation
    settings: dict[str, Any] = {
        "modelProviders": {"openai": [provider]},
        "security": {"auth": {"selectedType": "openai"}},
        "model": {"name": t.model.name},
    }
    if t.model.context_window:
        settings["context"] = {"autoCompactThreshold": AGENT_SHARE}
    home = t.home / ".qwen"
    return Snippet(
        "qwen-code",
        files=(SetupFile(home / "settings.json", json.dumps(settings, indent=2) + "\n"),),
        command='qwen -p "your task"   # or `qwen` for the interactive agent',
        notes=("OPENAI_API_KEY: the key your upstream expects, or a gateway key (auth.keys)",),
    )


def _litellm_entry(t: Target) -> dict[str, Any]:
    """The model's window in litellm's registry format (aider and mini-swe-agent read it)."""
    window = t.model.context_window or 0
    output = t.model.max_output_tokens or min(8192, window // 4)
    return {
        f"openai/{t.model.name}": {
            "max_tokens": output,
            "max_input_tokens": window - output,
            "max_output_tokens": output,
            "input_cost_per_token": 0.0,
            "output_cost_per_token": 0.0,
            "litellm_provider": "openai",
            "mode": "chat",
        }
    }


def _aider(t: Target) -> Snippet:
    metadata = t.home / ".aider.model.metadata.json"
    lines = [
        f"openai-api-base: {t.base_url}",
        f"model: openai/{t.model.name}",
        f"weak-model: openai/{t.model.name}",
        "show-model-warnings: false",
    ]
    files = []
    if t.model.context_window:
        lines.append(f"model-metadata-file: {metadata}")
        files.append(SetupFile(metadata, json.dumps(_litellm_entry(t), indent=2) + "\n"))
    files.insert(0, SetupFile(t.home / ".aider.conf.yml", "\n".join(lines) + "\n"))
    return Snippet(
        "aider",
        files=tuple(files),
        command='aider --message "your task"   # or `aider` for the interactive chat',
        notes=("OPENAI_API_KEY: the key your upstream expects, or a gateway key (auth.keys)",),
    )


def _mini_swe_agent(t: Target) -> Snippet:
    base = Path(t.environ.get("MSWEA_GLOBAL_CONFIG_DIR") or t.home / ".config" / "mini-swe-agent")
    registry = base / "compactgate-models.json"
    lines = [
        "model:",
        f"  model_name: openai/{t.model.name}",
        "  cost_tracking: ignore_errors",
        "  model_kwargs:",
        f"    api_base: {t.base_url}",
        "    drop_params: true",
    ]
    files = []
    if t.model.context_window:
        lines.insert(3, f"  litellm_model_registry: {registry}")
        files.append(SetupFile(registry, json.dumps(_litellm_entry(t), indent=2) + "\n"))
    files.insert(0, SetupFile(base / "compactgate.yaml", "\n".join(lines) + "\n"))
    return Snippet(
        "mini-swe-agent",
        files=tuple(files),
        command=f'mini -c mini.yaml -c {base / "compactgate.yaml"} -t "your task"',
        notes=("OPENAI_API_KEY: the key your upstream expects, or a gateway key (auth.keys)",),
    )


def _openai_sdk(t: Target, agent: str, extra: Sequence[tuple[str, str]] = ()) -> Snippet:
    return Snippet(
        agent,
        env=(("OPENAI_BASE_URL", t.base_url), *extra),
        notes=(
            f'model="{t.model.name}" in your calls'
            + (f"; the gateway compacts to {t.model.context_window} tokens"
               if t.model.context_window else ""),
        ),
    )  # fmt: skip


def _openai(t: Target) -> Snippet:
    return _openai_sdk(t, "openai")


def _openai_agents(t: Target) -> Snippet:
    return _openai_sdk(t, "openai-agents", (("OPENAI_AGENTS_DISABLE_TRACING", "1"),))


def _anthropic(t: Target) -> Snippet:
    return Snippet(
        "anthropic",
        env=(("ANTHROPIC_BASE_URL", t.origin),),
        notes=(f'model="{t.model.name}" in your calls',),
    )


AGENTS: dict[str, Callable[[Target], Snippet]] = {
    "codex": _codex,
    "claude-code": _claude_code,
    "opencode": _opencode,
    "qwen-code": _qwen_code,
    "aider": _aider,
    "mini-swe-agent": _mini_swe_agent,
    "openai-agents": _openai_agents,
    "openai": _openai,
    "anthropic": _anthropic,
}
