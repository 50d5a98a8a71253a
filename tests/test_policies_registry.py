"""The step table, the configs' YAML keys, `build_policy` and `DEFAULT_STEPS`."""

from __future__ import annotations

import importlib
from typing import get_args

import pytest
from pydantic import ValidationError

from policies import DEFAULT_STEPS, build_policy, run_chain
from policies.registry import STEPS, parse_step_config
from tests.policy_strategies import budget, chat, conv, env

CONTRACT = {
    "tool_output_cache",
    "fifo",
    "sliding_window",
    "sandwich",
    "compaction",
    "summarize_old",
    "prioritize_recent",
    "content_type_chunking",
    "discard_low_rel",
    "emergency",
    "ledger",
    "excerpt",
}


def test_every_documented_step_type_is_registered() -> None:
    assert set(STEPS) == CONTRACT


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_configs_are_typed_strict_and_frozen(name: str) -> None:
    config_cls, factory = STEPS[name]
    assert config_cls.TYPE == name
    assert get_args(config_cls.model_fields["type"].annotation) == (name,)
    config = parse_step_config({"type": name})
    assert factory(config).type == name
    with pytest.raises(ValidationError):
        parse_step_config({"type": name, "no_such_key": 1})
    with pytest.raises(ValidationError):
        config.type = "x"  # type: ignore[misc]
    module = importlib.import_module(factory.__module__)
    doc = (module.__doc__ or "").lower()
    assert "never" in doc or "keeps:" in doc  # each step states what it never drops


def test_unknown_type_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="known: compaction"):
        parse_step_config({"type": "magic"})


def test_bad_values_fail_validation() -> None:
    for raw in (
        {"type": "sandwich", "preserve_bottom": 0},
        {"type": "compaction", "placement": "footer"},
        {"type": "sandwich", "template": "no slot"},
        {"type": "content_type_chunking", "ratios": {"yaml": 0.5}},
        {"type": "prioritize_recent", "scorer": "magic"},
        {"type": "tool_output_cache", "max_message_bytes": 10},
    ):
        with pytest.raises(ValidationError):
            parse_step_config(raw)


def test_default_policy_has_the_default_chain() -> None:
    policy = build_policy("default")
    assert [s.type for s in policy.steps] == [c.type for c in DEFAULT_STEPS]
    assert [c.type for c in DEFAULT_STEPS] == [
        "excerpt",
        "tool_output_cache",
        "content_type_chunking",
        "ledger",
        "fifo",
    ]
    assert (policy.max_iterations, policy.recovery_mode) == (3, "truncate")
    typed = build_policy("t", list(DEFAULT_STEPS), max_iterations=1, recovery_mode="error")
    assert typed.max_iterations == 1 and typed.recovery_mode == "error"
    result = run_chain(conv(chat(60)), budget(3000), policy, env())
    # the user's prose in the Turns that go is carried (design D5.3), then fifo drops them
    assert result.fits and result.changed_steps() == ["ledger", "fifo"]
