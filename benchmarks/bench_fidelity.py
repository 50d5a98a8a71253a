"""Fidelity on traffic-shaped sessions: what survives compaction, through a real gateway.

    python -m benchmarks.bench_fidelity [--halves dev,heldout,fresh] [--seeds 2]
        [--fractions 0.5,0.25]
        [--shapes aider,codex,...] [--languages en,zh,ja] [--policy NAME] [--json out.json]
        [--gateway-root ../other-checkout]

Sessions come from `tests/corpus` (its docstring says which half is which: `dev` may be
tuned on, `heldout` and `fresh` are judged only, `fresh` written blind after the rules were
tuned; every run reports all three unless told otherwise, and checks the issue's targets on
each judged half). They are
sent request by request, as their clients send them, through `compactgate serve` in front of a
recording fake upstream (`tests/corpus_replay.py`), with a window per session that cuts
its last request to about `fraction` of its size (the policy's target there). No network, no
LLM. Reported per half, fraction, shape and language:

- **stated** items kept word for word (whitespace and case aside) in the last request's
  forwarded body;
- **needed**: the content the last question depends on kept (a statement word for word; for a
  file, tool output or pasted log, its first 160 characters), and for Aider every **file** the
  client added keeping a part;
- **size/target**: the last forwarded request's messages against the policy's target (gateway
  token counts; the target is met from 1.0 down, 0.7 is the floor the issue sets);
- **ledger**: the ledger block's share of the last forwarded body (o200k tokens);
- **prefix**: of the consecutive requests where the client only appended, the share whose
  forwarded body also only appended (fields other than the history equal, the history a prefix;
  `cache_control` markers aside), with windows of 32k tokens and more apart (`prefix>=32k`);
- **calls**, **tokens**: upstream requests and the tokens the upstream read (o200k over each
  body's JSON, background work included) against the same session sent straight to it.

Run time: a few minutes for the three halves with two seeds (about 4500 requests; a half
adds half the time of two, `--halves dev,heldout` for the shorter run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from benchmarks import targets
from benchmarks.corpus_replay import Case, Replay
from tests.corpus import HALVES, JUDGED, LANGUAGES, SHAPES, Content, Item, sessions

JSON = dict[str, Any]
LEDGER_HEADER = "[Stated earlier in this conversation, kept word for word:]"
BIG_WINDOW = 32_000
LABELS = {
    "dev": "DEV (tuned on)",
    "heldout": "HELD-OUT (judged, never tuned on)",
    "fresh": "FRESH (judged, never tuned on, written blind)",
}
ARRAYS = ("messages", "input")


@dataclass
class Result:
    half: str
    shape: str
    language: str
    fraction: float
    session: str
    window: int
    items: dict[str, bool]
    needed: bool
    files: tuple[int, int]  # (kept a part, sent)
    size: int  # the last forwarded request's messages, gateway tokens
    target: int
    ledger_share: float
    pairs: int  # consecutive requests where the client only appended
    stable: int  # ... and the forwarded body only appended too
    calls: tuple[int, int]  # (upstream requests, client requests)
    tokens: tuple[int, int]  # (upstream read, the same session sent straight)
    errors: list[str]


class Counter:
    """o200k tokens of a body's JSON, counted per field and per history element (cached)."""

    def __init__(self) -> None:
        from gateway.counting.tokenizers import load_tokenizer

        self.tokenizer = load_tokenizer("tiktoken:o200k_base")
        self.cache: dict[bytes, int] = {}

    def text(self, text: str) -> int:
        return self.tokenizer.count(text)

    def body(self, body: Mapping[str, Any]) -> int:
        total = 0
        for key, value in body.items():
            parts = value if key in ARRAYS and isinstance(value, list) else [value]
            for part in parts:
                data = orjson.dumps(part)
                found = self.cache.get(data)
                if found is None:
                    found = self.cache[data] = self.tokenizer.count(data.decode())
                total += found
        return total


def _strings(value: Any, out: list[str]) -> list[str]:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, list):
        for v in value:
            _strings(v, out)
    elif isinstance(value, dict):
        for k, v in value.items():
            if k != "tools":
                _strings(v, out)
    return out


def normalised(text: str) -> str:
    return " ".join(text.split()).casefold()


def _bare(value: Any) -> Any:
    """`value` without `cache_control` markers (a client moves them every request)."""
    if isinstance(value, dict):
        return {k: _bare(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_bare(v) for v in value]
    return value


def extends(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Whether `after` is `before` with history appended (other fields equal)."""
    a, b = _bare(dict(before)), _bare(dict(after))
    for key in ARRAYS:
        if key in a or key in b:
            old, new = a.pop(key, []), b.pop(key, [])
            if new[: len(old)] != old:
                return False
    a.pop("tools", None), b.pop("tools", None)  # expansion tools come and go with masked outputs
    return a == b


def measure(case: Case, counter: Counter) -> Result:
    s = case.session
    errors = [f"{x.status}: {x.error[:200]}" for x in case.sent if x.status != 200]
    last = case.sent[-1]
    forwarded = last.upstream[0] if last.upstream else last.raw
    text = normalised("\n".join(_strings(forwarded, [])))

    def kept(need: Item | Content) -> bool:
        probe = need.probe() if isinstance(need, Content) else need.text
        return normalised(probe) in text

    steps = last.headers.get("x-compactgate-steps", "none")
    if steps == "none" and last.headers.get("x-compactgate-tokens-counted") == "upper-bound":
        size = case.full
    else:
        size = int(last.headers.get("x-compactgate-tokens-after", "0")) - case.tools
    ledger = [t for t in _strings(forwarded, []) if t.startswith(LEDGER_HEADER)]
    body_tokens = counter.body(forwarded)
    pairs = stable = 0
    for before, after in zip(case.sent, case.sent[1:], strict=False):
        if extends(before.raw, after.raw):
            pairs += 1
            if before.upstream and after.upstream:
                stable += extends(before.upstream[0], after.upstream[0])
    return Result(
        half=s.half,
        shape=s.shape,
        language=s.language,
        fraction=case.fraction,
        session=s.id,
        window=case.window,
        items={i.id: kept(i) for i in s.items},
        needed=all(kept(d) for d in s.depends_on),
        files=(sum(kept(f) for f in s.files), len(s.files)),
        size=size,
        target=case.target,
        ledger_share=sum(counter.text(t) for t in ledger) / max(1, body_tokens),
        pairs=pairs,
        stable=stable,
        calls=(sum(len(x.upstream) for x in case.sent), len(case.sent)),
        tokens=(
            sum(counter.body(b) for x in case.sent for b in x.upstream),
            sum(counter.body(x.raw) for x in case.sent),
        ),
        errors=errors,
    )


# -- the report ------------------------------------------------------------------------------


def _pct(values: Sequence[float]) -> str:
    return f"{100 * statistics.mean(values):.0f}" if values else "-"


def report(results: Sequence[Result]) -> str:
    lines: list[str] = []
    groups: dict[tuple[str, float], list[Result]] = defaultdict(list)
    for r in results:
        groups[(r.half, r.fraction)].append(r)
    for (half, fraction), rs in sorted(
        groups.items(), key=lambda kv: (HALVES.index(kv[0][0]), -kv[0][1])
    ):
        lines += [f"### {LABELS[half]}, cut to {fraction:.0%}", ""]
        lines += [
            "| shape | stated en | stated zh | stated ja | needed | files | size/target "
            "(min) | ledger | prefix | prefix>=32k | calls | tokens |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for shape in [*SHAPES, "all"]:
            cell = [r for r in rs if shape in (r.shape, "all")]
            if not cell:
                continue
            stated = [
                _pct([v for r in cell if r.language == lang for v in r.items.values()])
                for lang in LANGUAGES
            ]
            ratios = [r.size / r.target for r in cell if r.target]
            files = (sum(r.files[0] for r in cell), sum(r.files[1] for r in cell))
            pairs = sum(r.pairs for r in cell)
            big = [r for r in cell if r.window >= BIG_WINDOW]
            big_pairs = sum(r.pairs for r in big)
            lines.append(
                f"| {shape} | {' | '.join(stated)} | {_pct([r.needed for r in cell])} | "
                + (f"{files[0]}/{files[1]}" if files[1] else "-")
                + f" | {statistics.mean(ratios):.2f} ({min(ratios):.2f}) | "
                f"{_pct([r.ledger_share for r in cell])} % | "
                f"{100 * sum(r.stable for r in cell) / max(1, pairs):.0f} | "
                + (
                    f"{100 * sum(r.stable for r in big) / max(1, big_pairs):.0f}"
                    if big_pairs
                    else "-"
                )
                + f" | {sum(r.calls[0] for r in cell) / sum(r.calls[1] for r in cell):.2f} | "
                f"{sum(r.tokens[0] for r in cell) / sum(r.tokens[1] for r in cell):.2f} |"
            )
        windows = sorted(r.window for r in rs)
        errors = [e for r in rs for e in r.errors]
        lines += [
            "",
            f"{len(rs)} sessions, {sum(len(r.items) for r in rs)} stated items, windows "
            f"{windows[0]}..{windows[-1]} tokens (median {windows[len(windows) // 2]}); "
            f"errors: {len(errors)}" + (f" (first: {errors[0]})" if errors else ""),
            "",
        ]
    for half in JUDGED:
        lines += _targets([r for r in results if r.half == half], half)
    return "\n".join(lines)


def _targets(held: Sequence[Result], half: str) -> list[str]:
    """The issue's targets, checked on one judged half (held-out, fresh)."""
    if not held:
        return []
    out = [f"Targets on the {'held-out' if half == 'heldout' else half} half:"]
    for fraction, goal in ((0.5, 0.95), (0.25, 0.90)):
        cells = defaultdict(list)
        for r in held:
            if r.fraction == fraction:
                for v in r.items.values():
                    cells[(r.shape, r.language)].append(v)
        if cells:
            worst = min(cells.items(), key=lambda kv: statistics.mean(kv[1]))
            low = statistics.mean(worst[1])
            out.append(
                f"- stated items at {fraction:.0%}: worst cell {worst[0][0]}/{worst[0][1]} "
                f"{100 * low:.0f} % (goal {100 * goal:.0f} %): {_met(low >= goal)}"
            )
    files = (sum(r.files[0] for r in held), sum(r.files[1] for r in held))
    out.append(f"- every file keeps a part: {files[0]}/{files[1]}: {_met(files[0] == files[1])}")
    ratios = [r.size / r.target for r in held if r.target]
    under = [r.session for r in held if r.target and r.size < 0.7 * r.target]
    out.append(
        f"- size at least 70 % of the target: {len(ratios) - len(under)}/{len(ratios)}"
        + (f" (under: {', '.join(under[:6])})" if under else "")
    )
    big = [r for r in held if r.window >= BIG_WINDOW]
    pairs = sum(r.pairs for r in big)
    if pairs:
        share = sum(r.stable for r in big) / pairs
        out.append(f"- prefix stability from 32k windows: {100 * share:.0f} % (goal 90 %)")
    return [*out, ""]


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--halves", default=",".join(HALVES))
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--fractions", default="0.5,0.25")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--languages", default=",".join(LANGUAGES))
    parser.add_argument("--policy", default=None, help="a policy of config.example.yaml")
    parser.add_argument("--json", type=Path, default=None, help="write every result here")
    parser.add_argument(
        "--gateway-root", type=Path, default=None, help="measure the gateway of another checkout"
    )
    args = parser.parse_args(argv)
    chosen = [
        s
        for half in args.halves.split(",")
        for s in sessions(half, args.seeds, args.shapes.split(","), args.languages.split(","))
    ]
    fractions = [float(f) for f in args.fractions.split(",")]
    counter = Counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-fidelity-") as directory:
        root = args.gateway_root.resolve() if args.gateway_root else targets.ROOT
        with Replay(Path(directory), args.policy, root=root) as replay:
            cases = replay.measure(chosen, fractions)
            for case in replay.run(cases):
                results.append(measure(case, counter))
                case.sent.clear()
    print(report(results))
    if args.json:
        args.json.write_text(
            json.dumps([r.__dict__ for r in results], indent=1, ensure_ascii=False)
        )
    return 0 if not any(r.errors for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
