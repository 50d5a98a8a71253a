"""The fidelity benchmark's report (`python -m benchmarks.bench_fidelity`): every half of the
corpus gets its own labelled tables, in the corpus's order, and the issue's targets are checked
on each half nobody tuned on (held-out and fresh), never on the dev half."""

from __future__ import annotations

from pathlib import Path

from benchmarks.bench_fidelity import Result, report
from benchmarks.corpus_replay import Replay
from tests.corpus import HALVES, sessions


def _result(half: str, fraction: float, kept: bool) -> Result:
    return Result(
        half=half,
        shape="chat",
        language="en",
        fraction=fraction,
        session=f"{half}-chat-en-0",
        window=40_000,
        items={f"{half}-en-00a": kept},
        needed=kept,
        files=(0, 0),
        size=900,
        target=1000,
        ledger_share=0.1,
        pairs=4,
        stable=4,
        calls=(10, 10),
        tokens=(100, 120),
        errors=[],
    )


def test_each_half_has_its_tables_and_each_judged_half_its_targets() -> None:
    results = [
        _result(half, fraction, kept=half != "fresh")
        for half in reversed(HALVES)
        for fraction in (0.25, 0.5)
    ]
    text = report(results)
    headings = [line for line in text.splitlines() if line.startswith("### ")]
    assert headings == [
        "### DEV (tuned on), cut to 50%",
        "### DEV (tuned on), cut to 25%",
        "### HELD-OUT (judged, never tuned on), cut to 50%",
        "### HELD-OUT (judged, never tuned on), cut to 25%",
        "### FRESH (judged, never tuned on, written blind), cut to 50%",
        "### FRESH (judged, never tuned on, written blind), cut to 25%",
    ]
    held, fresh = text.split("Targets on the held-out half:")[1].split("Targets on the fresh half:")
    assert "worst cell chat/en 100 % (goal 95 %): met" in held
    assert "worst cell chat/en 0 % (goal 95 %): NOT met" in fresh
    assert "Targets on the dev half" not in text


def _forwarded(directory: Path) -> list[list[dict]]:
    directory.mkdir()
    chosen = [s for s in sessions("dev") if s.id == "dev-codex-en-0"]
    with Replay(directory, None) as replay:
        (case,) = replay.run(replay.measure(chosen, [0.25]))
        return [sent.upstream for sent in case.sent]


def test_two_runs_of_the_same_code_forward_the_same_bytes(tmp_path: Path) -> None:
    """A session cut to a quarter (masked outputs and excerpts, each with a ref id) forwards
    the same bodies in two runs, so two runs of the benchmark can be compared number for number
    (ref ids from a per-process random key moved sizes by a few tokens and flipped decisions)."""
    first = _forwarded(tmp_path / "one")
    assert any("ref=" in str(bodies) for bodies in first)  # refs were made
    assert _forwarded(tmp_path / "two") == first
