"""What a newcomer reads carries no internal labels.

Requirement numbers ("R4.13"), issue numbers ("issue 5"), contract letters ("contract C") and
design-document numbers ("004's reward", "(003)") mean nothing outside the project's own notes.
Checked in every file an operator reads (README, config.example.yaml, docs/, deploy/ and the
`/ui` page) and in the `--help` of every command.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from gateway.cli import build_parser
from gateway.ops.metrics import Metrics
from tests.conftest import REPO_ROOT

LABELS = re.compile(
    r"\bissues?\s*#?\d+"  # issue 5, issue #5
    r"|\bR\d+(?:\.\d+)*\b"  # R3, R4.13
    r"|\bcontract\s+[A-Z]\b"  # contract C
    r"|(?<![\w.,\s#])00\d(?!\w)"  # (003)
    r"|\b00\d(?:['’]s\b|:|/)"  # 004's, 001:, 000/003
    r"|§",
    re.IGNORECASE,
)
DEPLOY_TEXT = ("*.md", "*.yml", "*.yaml", "*.json", "Dockerfile*")


def user_facing_files() -> list[Path]:
    files = [REPO_ROOT / "README.md", REPO_ROOT / "config.example.yaml"]
    files += sorted((REPO_ROOT / "docs").rglob("*.md"))
    files += sorted({p for pattern in DEPLOY_TEXT for p in (REPO_ROOT / "deploy").rglob(pattern)})
    files += sorted((REPO_ROOT / "gateway" / "static").rglob("*.html"))
    return files


def labels_in(text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if LABELS.search(line):
            found.append(f"{number}: {line.strip()}")
    return found


def test_the_pattern_catches_the_labels_and_spares_ordinary_numbers() -> None:
    for labelled in (
        "computed ahead of need (issue 5)",
        "never cached (R4.13)",
        "see R3",
        "plan, demo (contract C)",
        "and 004's reward",
        "system (003) | user (001)",
        "# 000/003: keep the most recent",
        "# 002: drop the oldest half",
        "001 §1.8",
    ):
        assert labels_in(labelled), labelled
    for ordinary in (
        "3 000 characters",
        "0.004 s",
        "1,000 conversations",
        "p99 2.5 ms, RSS 173.1 MiB",
        "127.0.0.1:8080",
        "sha256 of the key",
        "--blue:#007acc;",
    ):
        assert not labels_in(ordinary), ordinary


@pytest.mark.parametrize(
    "path", user_facing_files(), ids=lambda p: p.relative_to(REPO_ROOT).as_posix()
)
def test_no_internal_labels_in_files_operators_read(path: Path) -> None:
    found = labels_in(path.read_text(encoding="utf-8"))
    assert not found, f"{path.relative_to(REPO_ROOT)}:\n" + "\n".join(found)


def every_help(parser: argparse.ArgumentParser) -> list[str]:
    helps = [parser.format_help()]
    for action in parser._actions:  # argparse offers no public way to reach the subcommands
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                helps += every_help(sub)
    return helps


def test_no_internal_labels_in_help() -> None:
    helps = every_help(build_parser())
    assert len(helps) >= 6  # the command and each subcommand
    found = [line for text in helps for line in labels_in(text)]
    assert not found, "\n".join(found)


def test_no_internal_labels_in_metric_descriptions() -> None:
    exposition = Metrics().render().decode()
    found = [line for line in labels_in(exposition) if "# HELP" in line]
    assert "# HELP compactgate_requests_total" in exposition
    assert not found, "\n".join(found)
