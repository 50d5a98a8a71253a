"""Fidelity: how much of what the user stated survives compaction, by chain and statement type.

Run: `python -m benchmarks.bench_fidelity [--seeds 6] [--turns 40]`. No network, no LLM (the
summarising steps find no summary ready and leave their range alone, as on a gateway whose
summariser has not answered yet); about a minute.

Sessions come from `benchmarks/fidelity_sessions.py`: English, Chinese and Japanese, a chat
shape and an agent shape (tool calls with 20-60-line outputs), one statement of each of eight
types planted per session (most in the first fifth), a generic "continue" as the last message.
Each session is compacted to 50 % and to 25 % of its size (the policy's target set there) by
every chain in `config.example.yaml`, by the same chain without its `ledger` step, by `fifo`
alone and by each relevance step (`prioritize_recent`, `discard_low_rel`) alone. A statement
survives when its exact text (whitespace and case aside) is in the forwarded messages.
Printed: survival by chain and type, the ledger's tokens as a share of the budget, the invariant
check, and the CPU time of the default chain on a 200-message request with and without the
ledger, its messages given uids as the gateway gives them (`chain_time`). Tokens: 4 per message
plus a quarter of the ASCII characters and one per CJK character.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import yaml

# The token estimate and the policy environment are the chain worker's, so bench_chain_ab's
# chain times and these measure the same thing.
from benchmarks.chain_worker import count, env
from benchmarks.fidelity_sessions import (
    LANGUAGES,
    SHAPES,
    TYPES,
    Session,
    forwarded_text,
    session,
    survived,
)
from gateway.counting.prefix import PrefixCounts
from policies import Budget, Conversation, Message, build_policy, check, run_chain
from policies.registry import DEFAULT_STEPS
from policies.steps.ledger import KIND as LEDGER_KIND

CONFIG = Path(__file__).resolve().parent.parent / "config.example.yaml"
FRACTIONS = (0.5, 0.25)
TARGET_RATIO = 0.6
TRIGGER_RATIO = 0.8


def conversation(
    messages: Sequence[Mapping[str, Any]], prefix: PrefixCounts | None = None
) -> Conversation:
    """The chain's view of `messages`; with `prefix`, each message gets the uid the gateway's
    prefix memo gives it (the same uid while the client resends it unchanged)."""
    if prefix is None:
        uids: Sequence[int | None] = [None] * len(messages)
    else:
        uids = prefix.measure("bench", "approx", messages, count, 0).uids
    return Conversation(
        tuple(
            Message(dict(m), count(m), origin=i, uid=uid)
            for i, (m, uid) in enumerate(zip(messages, uids, strict=True))
        )
    )


def chains() -> dict[str, list[Any]]:
    """Every policy's steps in the example config (the default chain where none are listed),
    each also without its ledger; fifo alone, and each relevance step alone."""
    raw = yaml.safe_load(CONFIG.read_text())
    out: dict[str, list[Any]] = {}
    for name, policy in (raw.get("policies") or {}).items():
        steps = (policy or {}).get("steps") or [c.model_dump() for c in DEFAULT_STEPS]
        out[name] = steps
        without = [s for s in steps if s.get("type") != "ledger"]
        if len(without) != len(steps):
            out[f"{name} (no ledger)"] = without
    out["fifo alone"] = [{"type": "fifo"}]
    # the relevance steps on their own must do no worse than fifo
    out["prioritize_recent alone"] = [{"type": "prioritize_recent"}]
    out["discard_low_rel alone"] = [{"type": "discard_low_rel"}]
    return out


def budget_for(size: int, fraction: float) -> Budget:
    """A budget whose target is `fraction` of the session's size."""
    limit = int(size * fraction / TARGET_RATIO)
    return Budget(limit, 0, 0, TRIGGER_RATIO, TARGET_RATIO)


def run(seeds: int, turns: int) -> dict[str, Any]:
    sessions = [
        session(seed, language, shape, turns)
        for seed in range(seeds)
        for language in LANGUAGES
        for shape in SHAPES
    ]
    table: dict[tuple[str, float], dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    ledger_share: dict[tuple[str, float], list[float]] = defaultdict(list)
    violations: dict[str, int] = defaultdict(int)
    for name, steps in chains().items():
        policy = build_policy(name, steps)
        for fraction in FRACTIONS:
            for s in sessions:
                kept, share, problems = compact(s, policy, fraction)
                for planted in s.planted:
                    table[(name, fraction)][planted.kind].append(int(kept[planted.text]))
                ledger_share[(name, fraction)].append(share)
                violations[name] += problems
    return {
        "sessions": len(sessions),
        "table": table,
        "ledger_share": ledger_share,
        "violations": violations,
    }


def compact(s: Session, policy: Any, fraction: float) -> tuple[dict[str, bool], float, int]:
    """(whether each planted statement survived, the ledger's share of the budget, invariant
    violations) for one session through one chain."""
    before = conversation(s.messages)
    budget = budget_for(before.tokens, fraction)
    result = run_chain(before, budget, policy, env())
    text = forwarded_text([dict(m.data) for m in result.conversation.messages])
    ledger = sum(m.tokens for m in result.conversation.messages if m.kind == LEDGER_KIND)
    kept = {p.text: survived(p, text) for p in s.planted}
    return kept, ledger / budget.limit, len(check(before, result.conversation))


def chain_time(repeat: int = 60) -> dict[str, float]:
    """Median CPU ms of the default chain on a 200-message request (agent and chat shapes),
    with and without the ledger, compacted to half its size.

    As the gateway runs it: every request is parsed afresh (new strings), and its messages get
    uids from the gateway's prefix memo. "first seen": a new memo and new uids per request (a
    conversation this process never saw); "resent": one memo and one prefix memo across
    requests (the client sends the same history again). CPU time of this process, the four
    variants interleaved, so a busy machine slows them alike.
    """
    out: dict[str, float] = {}
    for shape, turns in (("agent", 67), ("chat", 100)):
        s = session(0, "en", shape, turns=turns)
        body = orjson.dumps([*s.messages[:200], s.messages[-1]])
        variants = {
            (seen, name): (build_policy(name, steps), shared)
            for name, steps in (
                ("with ledger", [c.model_dump() for c in DEFAULT_STEPS]),
                ("without", [c.model_dump() for c in DEFAULT_STEPS if c.type != "ledger"]),
            )
            for seen, shared in (("first seen", None), ("resent", (PrefixCounts(), env())))
        }
        times: dict[tuple[str, str], list[float]] = defaultdict(list)
        for _ in range(repeat):
            for (seen, name), (policy, shared) in variants.items():
                prefix, run_env = shared or (PrefixCounts(), env())
                before = conversation(orjson.loads(body), prefix)
                budget = budget_for(before.tokens, 0.5)
                started = time.process_time()
                run_chain(before, budget, policy, run_env)
                times[(seen, name)].append((time.process_time() - started) * 1000)
        for (seen, name), values in sorted(times.items(), key=lambda kv: kv[0][1]):
            out[f"{shape} {seen} {name}"] = statistics.median(values)
    return out


def report(results: Mapping[str, Any], times: Mapping[str, float]) -> str:
    table = results["table"]
    lines = [
        f"{results['sessions']} sessions (seeds x en/zh/ja x chat/agent), {len(TYPES)} planted "
        "statements each; survival in % of planted statements",
        "",
        "| chain | compacted to | all | " + " | ".join(TYPES) + " | ledger tokens / budget |",
        "|---|---|---|" + "---|" * len(TYPES) + "---|",
    ]
    for (name, fraction), by_type in table.items():
        every = [v for values in by_type.values() for v in values]
        cells = [f"{100 * statistics.mean(by_type[t]):.0f}" for t in TYPES]
        shares = results["ledger_share"][(name, fraction)]
        lines.append(
            f"| {name} | {fraction:.0%} | {100 * statistics.mean(every):.1f} | "
            + " | ".join(cells)
            + f" | {100 * statistics.mean(shares):.1f} % (max {100 * max(shares):.1f} %) |"
        )
    bad = {name: n for name, n in results["violations"].items() if n}
    lines += [
        "",
        f"invariant violations: {bad or 'none'}",
        "default chain on a 200-message request, median ms: "
        + ", ".join(f"{name} {ms:.2f}" for name, ms in times.items()),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--turns", type=int, default=40)
    args = parser.parse_args(argv)
    results = run(args.seeds, args.turns)
    print(report(results, chain_time()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
