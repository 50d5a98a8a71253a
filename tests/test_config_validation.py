"""Config problems all at once, with paths, hints and what used to be accepted silently."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import main
from gateway.config import ConfigError, parse_config

UP = {"base_url": "http://127.0.0.1:9/v1"}


def problems(raw: dict, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(raw, environ or {})
    return info.value.problems


def test_every_problem_comes_in_one_pass_with_its_path() -> None:
    """Unset variables, field errors and cross-entry problems are reported together, not in
    rounds where fixing one reveals the next."""
    raw = {
        "server": {"max_body_bytes": 0},
        "models": [
            {"name": "a", "upstream": {"base_url": "${MISSING}"}, "policy": "ghost"},
            {"name": "b", "upstream": UP, "context_window": 8000, "max_output_tokens": 9000},
            {"name": "a", "upstream": UP, "context_windw": 10},
        ],
        "policies": {"p": {"steps": [{"type": "summarize_old", "model": "nowhere"}]}},
    }
    found = problems(raw)
    assert found == [
        "models[0].upstream.base_url: environment variable MISSING is not set",
        "server.max_body_bytes: must be > 0",
        "models[2].context_windw: unknown key (did you mean 'context_window'?)",
        "models[0].policy: unknown policy 'ghost'",
        "models[1].max_output_tokens: 9000 leaves no room for the prompt in context_window "
        "8000; it must be below it",
        "models[2].name: 'a' is already models[0].name, which would always win; list several "
        "upstreams under one model (upstreams:) instead",
        "policies.p.steps[0].model: 'nowhere' names no configured model (models: a, b); the "
        "summariser calls a model of this gateway",
    ]


def test_cross_entry_problems_are_found_when_the_fields_are_valid_too() -> None:
    raw = {"models": [{"name": "m", "upstream": UP}, {"name": "m", "upstream": UP}]}
    assert problems(raw) == [
        "models[1].name: 'm' is already models[0].name, which would always win; list several "
        "upstreams under one model (upstreams:) instead"
    ]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"modles": []}, "modles: unknown key (did you mean 'models'?)"),
        (
            {"server": {"upstream_timout_s": 5}},
            "server.upstream_timout_s: unknown key (did you mean 'upstream_timeout_s'?)",
        ),
        (
            {"models": [{"name": "m", "upstream": {**UP, "api_kye": "k"}}]},
            "models[0].upstream.api_kye: unknown key (did you mean 'api_key'?)",
        ),
        (
            {"models": [{"name": "m", "upstreams": [{**UP, "wieght": 2}]}]},
            "models[0].upstreams[0].wieght: unknown key (did you mean 'weight'?)",
        ),
        (
            {"policies": {"p": {"steps": [{"type": "fifo", "keep_last_turn": 2}]}}},
            "policies.p.steps[0].keep_last_turn: unknown key (did you mean 'keep_last_turns'?)",
        ),
        ({"zzz": 1}, "zzz: unknown key"),
    ],
)
def test_a_misspelt_key_gets_the_nearest_known_key_at_its_level(raw: dict, expected: str) -> None:
    assert problems(raw) == [expected]


def test_litellm_environment_syntax_is_refused_with_ours() -> None:
    """`os.environ/X` used to go upstream as the literal key."""
    raw = {"models": [{"name": "m", "upstream": {**UP, "api_key": "os.environ/OPENAI_API_KEY"}}]}
    assert problems(raw, {"OPENAI_API_KEY": "sk-real"}) == [
        "models[0].upstream.api_key: 'os.environ/OPENAI_API_KEY' is LiteLLM's syntax for an "
        "environment variable; write ${OPENAI_API_KEY} here"
    ]


def test_a_litellm_proxy_config_is_answered_with_how_to_convert_it() -> None:
    raw = {
        "model_list": [{"model_name": "gpt-4o", "litellm_params": {"model": "openai/gpt-4o"}}],
        "litellm_settings": {"drop_params": True},
    }
    found = problems(raw)
    assert len(found) == 2
    for line in found:
        assert "unknown key: LiteLLM's proxy config is not read here" in line
        assert "compactgate import-litellm" in line


def test_one_upstream_or_a_list_not_both_and_the_list_shares_its_model() -> None:
    both = {"models": [{"name": "m", "upstream": UP, "upstreams": [UP]}]}
    assert problems(both) == [
        "models[0]: give either upstream (one) or upstreams (a list), not both"
    ]
    mixed = {"models": [{"name": "m", "upstreams": [{**UP, "model": "x"}, {**UP, "model": "y"}]}]}
    assert "must share model" in problems(mixed)[0]
    through = {**UP, "provider": "litellm", "model": "openai/x"}
    litellm_and_http = {
        "models": [{"name": "m", "upstreams": [through, {**UP, "model": "openai/x"}]}]
    }
    assert "through litellm all or none" in problems(litellm_and_http)[0]
    embedded = {**UP, "provider": "in_process"}  # the same HTTP request, in this process
    config = parse_config({"models": [{"name": "m", "upstreams": [UP, embedded]}]})
    assert [u.provider for u in config.models[0].targets] == ["openai", "in_process"]
    config = parse_config({"models": [{"name": "m", "upstreams": [UP, {**UP, "weight": 3}]}]})
    assert [u.weight for u in config.models[0].targets] == [1.0, 3.0]


def test_a_summariser_model_matched_by_a_glob_is_accepted() -> None:
    raw = {
        "models": [{"name": "gpt-*", "upstream": UP}],
        "policies": {"p": {"steps": [{"type": "summarize_old", "model": "gpt-4o-mini"}]}},
    }
    assert parse_config(raw, {}).policies["p"].steps[0].model == "gpt-4o-mini"


def test_check_config_prints_every_problem_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "models:\n"
        "  - {name: a, upstream: {base_url: 'http://h/v1', api_key: os.environ/K}}\n"
        "  - {name: a, upstream: {base_url: 'http://h/v1'}, max_output_tokens: 0}\n"
    )
    assert main(["check-config", str(path)]) == 1
    out = capsys.readouterr().out
    assert "3 problem(s)" in out
    assert "models[0].upstream.api_key: 'os.environ/K' is LiteLLM's syntax" in out
    assert "models[1].max_output_tokens: must be > 0" in out
    assert "models[1].name: 'a' is already models[0].name" in out


def test_check_config_summarises_every_upstream_of_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "good.yaml"
    path.write_text(
        "models:\n"
        "  - name: m\n"
        "    upstreams:\n"
        "      - {base_url: 'https://user:pw@a.internal/v1', weight: 2}\n"
        "      - {base_url: 'http://b.internal/v1', api_key: sk-secret}\n"
    )
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "https://user:***@a.internal/v1 (weight 2), http://b.internal/v1 (weight 1)" in out
    assert "upstream_key=gateway (***)" in out and "sk-secret" not in out and "pw@" not in out


def test_check_config_says_each_policys_trigger_target_and_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An operator reads when each policy compacts, how far, and how long an event's result is
    held before the next (design D3.3)."""
    path = tmp_path / "good.yaml"
    path.write_text("policies:\n  p: {trigger_ratio: 0.7, target_ratio: 0.5, hold_ratio: 0.9}\n")
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "trigger=0.7 target=0.5 hold=0.9 " in out
    assert "trigger=0.8 target=0.6 hold=0.95 " in out  # the default policy
