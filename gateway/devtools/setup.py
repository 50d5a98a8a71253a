"""`compactgate setup <agent> --gateway URL`: the settings that point one coding agent or SDK at a
running gateway, written from what that gateway serves.

The rule it owns: every model name and context window in a snippet comes from the gateway's own
`GET /v1/models` at the moment it runs, never from a guess, so the agent and the gateway agree on
the window (what each agent is told: `agent_settings`). Errors name what to do. Files are
written only with `--write`, and a file that exists is never replaced without `--force` (the old
one is kept beside it as `<name>.bak`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .agent_settings import AGENTS, ServedModel, Snippet, Target

KEY_ENV = "COMPACTGATE_API_KEY"  # a gateway key (auth.keys) for reading /v1/models, if needed
TIMEOUT_S = 10.0


class SetupError(Exception):
    """Something a newcomer can act on: the message says what went wrong and what to do."""


def add_parser(commands: Any) -> None:
    """The `compactgate setup` subcommand, added to the CLI's subparsers (gateway/cli.py)."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "setup",
        help="print (or write) an agent's settings for a running gateway",
        description="Reads the running gateway's GET /v1/models and prints the settings that "
        "point the agent at it, with the model names and context windows it serves. "
        f"A gateway with keys needs {KEY_ENV} in the environment.",
    )
    parser.add_argument("agent", help=f"one of: {', '.join(AGENTS)}")
    parser.add_argument(
        "--gateway", default="http://127.0.0.1:8080", help="the running gateway's URL"
    )
    parser.add_argument("--model", help="a model the gateway serves (default: its first)")
    parser.add_argument(
        "--write", action="store_true", help="write the agent's settings files (paths shown)"
    )
    parser.add_argument(
        "--force", action="store_true", help="with --write: replace existing files (kept as .bak)"
    )


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
