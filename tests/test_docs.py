"""The docs hold: the configuration reference lists exactly the keys the gateway accepts, the
README opens with its two commands and stays a front page, every agent `compactgate setup`
knows has its page, and every link between the pages leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.config import parse_config
from gateway.devtools.config_reference import example_comments, reference, walk

pytestmark = [pytest.mark.unit]

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
FIRST_COMMANDS = ["pip install -e . && compactgate demo", "bash .ci/run"]
REGENERATE = "python -m gateway.devtools.config_reference > docs/configuration.md"


def test_the_configuration_reference_is_the_one_the_config_model_gives() -> None:
    written = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert written == reference(), f"docs/configuration.md is out of date: run {REGENERATE}"


def documented_keys() -> set[str]:
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    return set(re.findall(r"^\| `([^`]+)` \|", page, flags=re.MULTILINE))


def test_every_key_the_gateway_accepts_is_documented_and_no_other() -> None:
    from gateway.config import Config

    accepted = {key.path for key in walk(Config, "", {})}
    documented = documented_keys()
    assert accepted - documented == set(), f"undocumented keys; run {REGENERATE}"
    step_rows = {k for k in documented - accepted if "." not in k and "[" not in k}
    assert documented - accepted - step_rows == set(), "documented keys the gateway refuses"


def test_a_documented_key_is_one_the_config_loads() -> None:
    """The reference's paths are the config's: a sample of them, set as documented, loads."""
    config = parse_config(
        {
            "server": {"max_body_bytes": 1024, "log_format": "json"},
            "models": [{"name": "m", "upstream": {"base_url": "http://127.0.0.1:9/v1",
                                                   "weight": 2}, "context_window": 8192}],
            "policies": {"p": {"trigger_ratio": 0.7, "pin_rules": [{"role": "developer"}]}},
        }
    )  # fmt: skip
    assert config.server.max_body_bytes == 1024
    for path in ("server.max_body_bytes", "models[].upstream.weight",
                 "policies.<name>.pin_rules[].role"):  # fmt: skip
        assert path in documented_keys()


def test_every_key_of_the_example_config_says_what_it_does() -> None:
    comments = example_comments((ROOT / "config.example.yaml").read_text(encoding="utf-8"))
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    empty = [line for line in page.splitlines() if line.startswith("| `") and line.endswith("|  |")]
    assert empty == [], "keys with no comment in config.example.yaml nor a description"
    assert comments["server.max_body_bytes"].startswith("larger request bodies get 413")
