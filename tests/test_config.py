"""Config loading and validation: every key operators rely on, and config.example.yaml."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.config import ConfigError, default_config, load_config, parse_config
from policies import Budget

EXAMPLE = Path(__file__).resolve().parent.parent / "config.example.yaml"

ISSUE_EXAMPLE = """
server: {max_body_bytes: 33554432, upstream_timeout_s: 600}
models:
  - name: small-8k
    upstream:
      base_url: http://127.0.0.1:9000/v1
      model: real-model-name
      api_key: ${UPSTREAM_KEY:-}
      provider: openai
    context_window: 8192
    max_output_tokens: 512
    tokenizer: tiktoken:o200k_base
    policy: agent
policies:
  agent:
    trigger_ratio: 0.8
    target_ratio: 0.6
    steps:
      - {type: fifo}
"""


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_full_example_loads_with_every_key_operators_rely_on(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ISSUE_EXAMPLE), environ={})
    model = config.models[0]
    assert config.server.max_body_bytes == 33554432
    assert model.upstream.base_url == "http://127.0.0.1:9000/v1"
    assert model.upstream.model == "real-model-name"
    assert model.upstream.api_key is None  # ${UPSTREAM_KEY:-} with the variable unset
    assert model.context_window == 8192 and model.tokenizer == "tiktoken:o200k_base"
    assert config.policies["agent"].steps[0].type == "fifo"


def test_json_is_valid_yaml_too(tmp_path: Path) -> None:
    raw = {
        "models": [{"name": "m", "upstream": {"base_url": "http://h/v1"}, "context_window": 100}]
    }
    config = load_config(write(tmp_path, json.dumps(raw), "c.json"), environ={})
    assert config.models[0].context_window == 100


def test_interpolation_uses_environment_and_defaults() -> None:
    raw = {
        "models": [
            {
                "name": "m",
                "upstream": {"base_url": "${BASE:-http://fallback/v1}", "api_key": "${KEY}"},
                "context_window": "${WINDOW:-4096}",
            }
        ]
    }
    config = parse_config(raw, environ={"KEY": "sk-test"})
    assert config.models[0].upstream.base_url == "http://fallback/v1"
    assert config.models[0].upstream.api_key == "sk-test"
    assert config.models[0].context_window == 4096


def test_unset_variable_without_default_names_its_path() -> None:
    raw = {"models": [{"name": "m", "upstream": {"base_url": "http://h/v1", "api_key": "${NOPE}"}}]}
    with pytest.raises(ConfigError) as info:
        parse_config(raw, environ={})
    assert info.value.problems == [
        "models[0].upstream.api_key: environment variable NOPE is not set"
    ]


def test_every_problem_is_reported_with_its_yaml_path() -> None:
    raw = {
        "models": [
            {"name": "ok", "upstream": {"base_url": "http://h/v1"}},
            {
                "name": "bad",
                "upstream": {"base_url": "ftp://h"},
                "context_window": 0,
                "colour": "red",
            },
        ],
        "policies": {"p": {"trigger_ratio": 0.5, "target_ratio": 0.7, "steps": [{"type": "nope"}]}},
    }
    with pytest.raises(ConfigError) as info:
        parse_config(raw, environ={})
    problems = "\n".join(info.value.problems)
    assert "models[1].context_window: must be > 0" in problems
    assert "models[1].colour: unknown key" in problems
    assert "models[1].upstream.base_url: must start with http:// or https://" in problems
    assert "policies.p.steps[0]" in problems and "nope" in problems


def test_bad_step_parameter_is_reported_under_steps_index() -> None:
    raw = {"policies": {"p": {"steps": [{"type": "fifo", "keep_last_turns": 0}]}}}
    with pytest.raises(ConfigError) as info:
        parse_config(raw, environ={})
    assert info.value.problems == ["policies.p.steps[0].keep_last_turns: must be >= 1"]


def test_target_above_trigger_is_rejected() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"policies": {"p": {"trigger_ratio": 0.5, "target_ratio": 0.7}}}, environ={})
    assert "target_ratio must be <= trigger_ratio" in info.value.problems[0]


def test_a_hold_below_the_trigger_is_rejected() -> None:
    """Holding an event's result only below the trigger would make every appended turn an event."""
    with pytest.raises(ConfigError) as info:
        parse_config({"policies": {"p": {"trigger_ratio": 0.9, "hold_ratio": 0.85}}}, environ={})
    assert "hold_ratio must be >= trigger_ratio" in info.value.problems[0]
    # A trigger above the default hold, the hold unset: accepted, the hold is the trigger then.
    config = parse_config({"policies": {"p": {"trigger_ratio": 0.97}}}, environ={})
    assert config.policies["p"].hold_ratio == 0.95
    budget = Budget(10_000, 1_000, trigger_ratio=0.97, hold_ratio=0.95)
    assert budget.hold == budget.trigger


def test_model_naming_an_unknown_policy_is_rejected() -> None:
    raw = {"models": [{"name": "m", "upstream": {"base_url": "http://h/v1"}, "policy": "ghost"}]}
    with pytest.raises(ConfigError) as info:
        parse_config(raw, environ={})
    assert info.value.problems == ["models[0].policy: unknown policy 'ghost'"]


def test_one_key_for_two_entries_is_refused_naming_both() -> None:
    """Two entries sharing a key would give one caller two tenants: a start-up error."""
    digest = "ab" * 32
    keys = [
        {"key_sha256": digest, "tenant": "alpha"},
        {"key_sha256": "cd" * 32, "tenant": "beta"},
        {"key_sha256": digest.upper(), "tenant": "gamma"},  # the same key, spelt in capitals
    ]
    with pytest.raises(ConfigError) as info:
        parse_config({"auth": {"keys": keys}}, environ={})
    assert info.value.problems == [
        "auth.keys[2].key_sha256: the same key as auth.keys[0].key_sha256; "
        "each key must name exactly one tenant"
    ]


@pytest.mark.parametrize(
    "value", ["sk-the-key-itself", "ab" * 31, "ab" * 33, "zz" * 32, "ab" * 31 + "a ", ""]
)
def test_key_sha256_must_be_a_hex_digest(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"auth": {"keys": [{"key_sha256": value, "tenant": "t"}]}}, environ={})
    assert info.value.problems == [
        "auth.keys[0].key_sha256: must be 64 hex characters: the sha256 of the key, not the key"
    ]


def test_key_sha256_is_kept_in_lower_case() -> None:
    config = parse_config({"auth": {"keys": [{"key_sha256": "AB" * 32, "tenant": "t"}]}})
    assert config.auth is not None and config.auth.keys[0].key_sha256 == "ab" * 32


def test_tokenizer_spec_is_checked() -> None:
    raw = {
        "models": [{"name": "m", "upstream": {"base_url": "http://h/v1"}, "tokenizer": "chars:-1"}]
    }
    with pytest.raises(ConfigError) as info:
        parse_config(raw, environ={})
    assert info.value.problems[0].startswith("models[0].tokenizer:")


def test_default_config_forwards_every_model_to_the_upstream_env() -> None:
    config = default_config({"COMPACTGATE_UPSTREAM": "http://10.0.0.1:8000/v1"})
    assert config.models[0].name == "*"
    assert config.models[0].upstream.base_url == "http://10.0.0.1:8000/v1"
    assert default_config({}).models[0].upstream.base_url == "https://api.openai.com/v1"


def test_check_config_exit_codes_and_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write(tmp_path, ISSUE_EXAMPLE, "good.yaml")
    assert main(["check-config", str(good)]) == 0
    out = capsys.readouterr().out
    assert "small-8k" in out and "window=8192 (config)" in out and "agent" in out and "fifo" in out
    bad = write(
        tmp_path,
        "models:\n  - name: x\n    upstream: {base_url: http://h/v1}\n    context_window: -5\n",
        "bad.yaml",
    )
    assert main(["check-config", str(bad)]) == 1
    assert "models[0].context_window: must be > 0" in capsys.readouterr().out


def test_check_config_never_prints_a_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The summary is what gets pasted into tickets and CI logs: passwords in URLs, upstream
    keys (also from the environment) and the admin token are masked, the rest still shown."""
    monkeypatch.setenv("UPSTREAM_KEY", "sk-env-upstream-secret")
    config = write(
        tmp_path,
        """
store: "redis://:redis-pass-secret@redis.internal:6379/0"
server: {admin_token: admin-token-secret}
models:
  - name: a
    upstream: {base_url: "https://user:url-pass-secret@llm.internal/v1", api_key: sk-conf-secret}
  - name: b
    upstream: {base_url: "http://llm.internal/v1?api_key=query-secret", api_key: "${UPSTREAM_KEY}"}
  - name: c
    upstream: {base_url: "http://llm.internal/v1"}
""",
        "secrets.yaml",
    )
    assert main(["check-config", str(config)]) == 0
    out = capsys.readouterr().out
    for secret in ("redis-pass", "url-pass", "sk-conf", "sk-env", "query-secret", "admin-token"):
        assert secret not in out, out
    assert "redis://:***@redis.internal:6379/0" in out
    assert "https://user:***@llm.internal/v1" in out
    assert "http://llm.internal/v1?api_key=***" in out
    assert out.count("upstream_key=gateway (***)") == 2 and "upstream_key=client" in out
    assert "admin: token (***)" in out


def test_check_config_passes_on_the_shipped_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-config", str(EXAMPLE)]) == 0, capsys.readouterr().out


def test_the_example_documents_every_key() -> None:
    """config.example.yaml must show every key of every config section and step."""
    from pydantic import BaseModel

    from gateway.config import Config
    from policies.registry import STEPS

    text = EXAMPLE.read_text()
    seen: set[type[BaseModel]] = set()
    missing: list[str] = []

    def walk(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, field in model.model_fields.items():
            if f"{field.alias or name}:" not in text:
                missing.append(f"{model.__name__}.{name}")
            for arg in (field.annotation, *getattr(field.annotation, "__args__", ())):
                for inner in (arg, *getattr(arg, "__args__", ())):
                    if isinstance(inner, type) and issubclass(inner, BaseModel):
                        walk(inner)

    walk(Config)
    for config_cls, _ in STEPS.values():
        walk(config_cls)
    assert missing == []
