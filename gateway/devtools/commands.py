"""The operator's commands besides `serve`: `check-config` (every problem, or a summary fit to
paste, its secrets masked), `hash-key` (the config line of a gateway key read from stdin) and
`import-litellm` (a LiteLLM proxy config converted). `gateway/cli.py` parses and dispatches."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping

from ..config import Config, ConfigError, parse_config
from ..store.urls import masked_url


def hash_key() -> int:
    """Print the config line for a key read from stdin; exit 2 when there is no key. Surrounding
    whitespace (the newline of `echo`) is dropped, as the gateway drops it from a presented key."""
    from ..http.auth import key_sha256

    if sys.stdin.isatty():
        import getpass

        key = getpass.getpass("API key: ").encode()
    else:
        key = sys.stdin.buffer.read()
    key = key.strip()
    if not key:
        print(
            'hash-key: no key on stdin (pipe the key in, e.g. printf %s "$KEY" | '
            "compactgate hash-key)",
            file=sys.stderr,
        )
        return 2
    print(f"key_sha256: {key_sha256(key)}")
    return 0


def import_litellm(path: str, output: str | None) -> int:
    """Write our config for a LiteLLM proxy config; exit 1 if it cannot be read or converted."""
    import yaml

    from .litellm_import import convert

    try:
        with open(path, encoding="utf-8") as handle:
            raw = yaml.safe_load(handle)
        converted = convert(raw if isinstance(raw, dict) else {})
    except (OSError, yaml.YAMLError, ValueError) as error:
        print(f"import-litellm: {path}: {error}", file=sys.stderr)
        return 1
    try:  # what we write must load: checked with every ${VAR} standing for a value
        parse_config(converted.config, _AnyVariable())
    except ConfigError as error:
        print(f"import-litellm: {path}: the converted config is not valid:", file=sys.stderr)
        for problem in error.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    for warning in converted.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    text = (
        f"# Converted from the LiteLLM config {os.path.basename(path)} by compactgate "
        "import-litellm.\n# Check it with `compactgate check-config`; config.example.yaml "
        "documents every key.\n" + yaml.safe_dump(converted.config, sort_keys=False)
    )
    if output is None:
        sys.stdout.write(text)
    else:
        with open(output, "w", encoding="utf-8") as handle:
            handle.write(text)
    return 0


class _AnyVariable(Mapping[str, str]):
    """An environment in which every variable is set (to a URL, valid wherever one may stand)."""

    def __getitem__(self, name: str) -> str:
        return "http://set.invalid"

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def check(path: str, load: Callable[[str], Config]) -> int:
    """`compactgate check-config PATH`: every problem (exit 1), or a summary (exit 0)."""
    try:
        config = load(path)
    except ConfigError as error:
        print(f"{path}: {len(error.problems)} problem(s)")
        for problem in error.problems:
            print(f"  {problem}")
        return 1
    print(summarise(config, path))
    return 0


def summarise(config: Config, path: str) -> str:
    """One screen: models with their windows/tokenizers/policies, and each policy's chain."""
    from ..http.admin import admin_token
    from ..routing import Router

    router = Router(config)
    lines = [f"{path}: valid", "", "models:"]
    for model in config.models:
        route = router.resolve(model.name) if "*" not in model.name else None
        window = (
            f"{route.context_window} ({route.window_source})" if route else "from registry per name"
        )
        upstream = ", ".join(
            mask_url(u.base_url or f"litellm:{u.model or model.name}")
            + (f" (weight {u.weight:g})" if len(model.targets) > 1 else "")
            for u in model.targets
        )
        held = any(u.api_key for u in model.targets)
        lines.append(
            f"  {model.name:<24} -> {upstream}  window={window}  "
            f"tokenizer={(route.tokenizer if route else model.tokenizer) or 'auto'}  "
            f"policy={model.policy}  mode={model.mode or config.mode}  "
            f"upstream_key={'gateway (***)' if held else 'client'}"
        )
    lines += ["", "policies:"]
    names = sorted({*config.policies, "default"})
    for name in names:
        policy = router._policies[name]
        pc = config.policy(name)
        chain = " -> ".join(step.type for step in policy.steps)
        lines.append(
            f"  {name:<12} trigger={pc.trigger_ratio} target={pc.target_ratio} "
            f"hold={pc.hold_ratio} recovery={pc.recovery_mode}: {chain}"
        )
    if admin_token(config.server) is not None:
        admin = "token (***)"
    else:
        admin = "no token, " + ("open" if config.server.admin_port else "this machine only")
    if config.server.admin_port is not None:
        admin += f" on port {config.server.admin_port}"
    lines += [
        "",
        f"store: {mask_url(config.store)}   "
        f"auth: {'on' if config.auth and config.auth.keys else 'off'}   admin: {admin}",
    ]
    return "\n".join(lines)


_SECRET_PARAM = re.compile(r"pass|secret|token|key|auth|cred|sig", re.IGNORECASE)


def mask_url(url: str) -> str:
    """`url` fit to print: a password in it (`redis://:secret@host`, `https://user:pw@host`),
    a lone user name (often a token) and query values named like credentials become `***`.
    A summary is pasted into tickets and CI logs; the config's secrets must not go with it."""
    return masked_url(url, lambda name: _SECRET_PARAM.search(name) is not None)
