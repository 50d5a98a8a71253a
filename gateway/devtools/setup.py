"""`compactgate setup <agent> --gateway URL`: the settings that point one coding agent or SDK at a
running gateway, written from what that gateway serves.

The rule it owns: every model name and context window in a snippet comes from the gateway's own
`GET /v1/models` at the moment it runs, never from a guess, so the agent and the gateway agree on
the window. An agent that compacts its history itself is told to do so at `AGENT_SHARE` of that
window, above the gateway's trigger (0.8 of the budget by default): the gateway compacts first,
without a model call, and the agent's own compaction is the backstop. Files are written only with
`--write`, and a file that exists is never replaced without `--force` (the old one is kept
beside it as `<name>.bak`). Each agent's page in docs/agents/ shows the same snippet.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

AGENT_SHARE = 0.9  # where an agent that compacts itself is told to, as a share of the window
KEY_ENV = "COMPACTGATE_API_KEY"  # a gateway key (auth.keys) for reading /v1/models, if needed
TIMEOUT_S = 10.0
# Claude Code 2.1 reads CLAUDE_CODE_AUTO_COMPACT_WINDOW as at least this many tokens, and compacts
# at that window less min(its output limit, 20 000) less 13 000 (verified against the binary).
CLAUDE_MIN_WINDOW = 100_000
CLAUDE_OUTPUT_SHARE_CAP = 20_000
CLAUDE_BUFFER = 13_000
CLAUDE_DEFAULT_OUTPUT = 32_000


class SetupError(Exception):
    """Something a newcomer can act on: the message says what went wrong and what to do."""


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


# -- reading the gateway ---------------------------------------------------------------------


def gateway_origin(url: str) -> str:
    """`http://host:port` from what a user typed (`host:port`, with or without `/v1`)."""
    url = url.strip().rstrip("/")
    if not url:
        raise SetupError("--gateway is empty: give the gateway's URL, e.g. http://127.0.0.1:8080")
    if "://" not in url:
        url = f"http://{url}"
    if not url.startswith(("http://", "https://")):
        raise SetupError(f"--gateway {url}: only http:// and https:// URLs are served")
    return url.removesuffix("/v1")


def fetch_models(origin: str, key: str | None, timeout: float = TIMEOUT_S) -> list[ServedModel]:
    """The gateway's models, from its `GET /v1/models`."""
    request = urllib.request.Request(f"{origin}/v1/models")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            body = answer.read()
    except urllib.error.HTTPError as error:
        if error.code in (401, 403):
            raise SetupError(
                f"the gateway at {origin} refused GET /v1/models ({error.code}): it has gateway "
                f"keys (auth.keys); export {KEY_ENV}=<your gateway key> and run this again"
            ) from None
        raise SetupError(
            f"the gateway at {origin} answered GET /v1/models with {error.code}: is this a "
            "CompactGate gateway?"
        ) from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise SetupError(
            f"no gateway answers at {origin} ({reason}): start one with `compactgate serve` "
            "(or `compactgate serve --config gateway.yaml`) and give its URL to --gateway"
        ) from None
    try:
        data = json.loads(body)["data"]
        models = [_served(entry) for entry in data]
    except (ValueError, KeyError, TypeError):
        raise SetupError(
            f"{origin}/v1/models did not answer with a model list: is this a CompactGate gateway?"
        ) from None
    if not models:
        raise SetupError(
            f"the gateway at {origin} serves no models: add one under `models:` in its config "
            "(see docs/configuration.md) and restart it"
        )
    return models


def _served(entry: Mapping[str, Any]) -> ServedModel:
    window = entry.get("context_window")
    output = entry.get("max_output_tokens")
    return ServedModel(
        name=str(entry["id"]),
        context_window=window if isinstance(window, int) and window > 0 else None,
        max_output_tokens=output if isinstance(output, int) and output > 0 else None,
    )


def choose(models: Sequence[ServedModel], name: str | None) -> ServedModel:
    if name is None:
        return models[0]
    for model in models:
        if model.name == name:
            return model
    served = ", ".join(m.name for m in models)
    raise SetupError(f"the gateway does not serve a model named {name!r}; it serves: {served}")


# -- the agents ------------------------------------------------------------------------------


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


def snippet(
    agent: str,
    gateway: str,
    *,
    model: str | None = None,
    home: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Snippet:
    """The settings for `agent` against the gateway at `gateway`, read from its /v1/models."""
    render = AGENTS.get(agent)
    if render is None:
        known = ", ".join(AGENTS)
        raise SetupError(f"no setup for an agent named {agent!r}; known agents: {known}")
    environ = os.environ if environ is None else environ
    origin = gateway_origin(gateway)
    models = tuple(fetch_models(origin, environ.get(KEY_ENV)))
    chosen = choose(models, model)
    target = Target(origin, models, chosen, home or Path.home(), environ)
    return render(target)


# -- output ----------------------------------------------------------------------------------


def render_text(snip: Snippet) -> str:
    """The snippet as printed: each file with its path, then the environment and the command."""
    out: list[str] = []
    for f in snip.files:
        out += [f"# {f.path}", f.text.rstrip("\n"), ""]
    for name, value in snip.env:
        out.append(f"export {name}={value}")
    if snip.env:
        out.append("")
    if snip.command:
        out += [f"# then: {snip.command}"]
    for note in snip.notes:
        out.append(f"# note: {note}")
    return "\n".join(out).rstrip("\n") + "\n"


def write_files(snip: Snippet, force: bool, say: Callable[[str], None]) -> None:
    """Write the snippet's files; one that exists only with `force`, keeping a `.bak` copy."""
    if not snip.files:
        raise SetupError(
            f"{snip.agent} is set up with environment variables only: nothing to write; "
            "run without --write and add the printed lines to your shell profile"
        )
    existing = [f.path for f in snip.files if f.path.exists()]
    if existing and not force:
        names = ", ".join(str(p) for p in existing)
        raise SetupError(
            f"{names} exists: not overwritten. Merge the printed settings into it, or run "
            "again with --force (the old file is kept as <name>.bak)"
        )
    for f in snip.files:
        f.path.parent.mkdir(parents=True, exist_ok=True)
        if f.path.exists():
            backup = f.path.with_name(f.path.name + ".bak")
            backup.write_bytes(f.path.read_bytes())
            say(f"overwrote {f.path} (the old file is {backup})")
        else:
            say(f"wrote {f.path}")
        f.path.write_text(f.text)


def run_setup(agent: str, gateway: str, *, model: str | None, write: bool, force: bool) -> int:
    """The `compactgate setup` command: print (or write) the snippet; 1 with a message on error."""
    try:
        snip = snippet(agent, gateway, model=model)
        if write:
            write_files(snip, force, lambda line: print(line, file=sys.stderr))
            if snip.env or snip.command or snip.notes:
                print(render_text(Snippet(snip.agent, (), snip.env, snip.command, snip.notes)))
        else:
            print(render_text(snip), end="")
    except SetupError as error:
        print(f"compactgate setup: {error}", file=sys.stderr)
        return 1
    return 0
