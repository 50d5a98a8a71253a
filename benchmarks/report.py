"""From measured batches to `docs/benchmarks.md`: figures, the issue's targets, PASS/MISS.

Every comparison is within one case (the targets took turns in the same minutes). "Added" is a
target's p50 minus the direct (upstream-only) p50 of the same case; for streaming, the same for
the time to the first body byte (TTFB). Ratios come first, then absolute numbers, then the
compaction path and memory, the profiles of misses, versions and the machine.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import platform
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .cases import CASES, Case
from .load import Batch, median, percentile

Results = Mapping[str, Mapping[str, Batch]]  # case key -> target -> merged batch


@dataclass(frozen=True)
class Figures:
    n: int
    errors: int
    p50: float  # ms
    p99: float
    ttfb50: float
    ttfb99: float
    rps: float
    cpu_ms: float  # CPU ms of the target's process tree per answered request

    @classmethod
    def of(cls, batch: Batch) -> Figures:
        n = batch.count
        return cls(
            n=n,
            errors=batch.errors,
            p50=median(batch.latencies) * 1000,
            p99=percentile(batch.latencies, 99) * 1000,
            ttfb50=median(batch.ttfb) * 1000,
            ttfb99=percentile(batch.ttfb, 99) * 1000,
            rps=n / batch.elapsed if batch.elapsed > 0 else math.nan,
            cpu_ms=batch.cpu_seconds * 1000 / n if n else math.nan,
        )


def figures(results: Results, case: str, target: str) -> Figures | None:
    batch = results.get(case, {}).get(target)
    return Figures.of(batch) if batch is not None and batch.count else None


def added(results: Results, case: str, target: str, ttfb: bool = False) -> float:
    """Target p50 minus direct p50 in ms (TTFB when `ttfb`); NaN if either is missing."""
    mine, base = figures(results, case, target), figures(results, case, "direct")
    if mine is None or base is None:
        return math.nan
    return (mine.ttfb50 - base.ttfb50) if ttfb else (mine.p50 - base.p50)


def overhead_ratio(results: Results, case: str, slower: str, faster: str) -> float:
    """How many times more latency `slower` adds than `faster` (inf if `faster` adds none)."""
    a, b = added(results, case, slower), added(results, case, faster)
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return math.inf if b <= 0 else a / b


def cpu_over(results: Results, case: str, target: str, floor: str) -> float:
    """CPU ms per request of `target` minus that of `floor`."""
    mine, base = figures(results, case, target), figures(results, case, floor)
    if mine is None or base is None:
        return math.nan
    return mine.cpu_ms - base.cpu_ms


def added_over(results: Results, case: str, target: str, floor: str) -> float:
    """The latency `target` adds beyond what `floor` adds, in ms (p50s of the same case)."""
    return added(results, case, target) - added(results, case, floor)


def cpu_ratio(results: Results, case: str, target: str, floor: str) -> float:
    """CPU per request of `target` over that of `floor`."""
    mine, base = figures(results, case, target), figures(results, case, floor)
    if mine is None or base is None or not base.cpu_ms:
        return math.nan
    return mine.cpu_ms / base.cpu_ms


def throughput_ratio(results: Results, case: str, a: str, b: str) -> float:
    fa, fb = figures(results, case, a), figures(results, case, b)
    if fa is None or fb is None or not fb.rps:
        return math.nan
    return fa.rps / fb.rps


def compaction_cost(results: Results, case: str, target: str = "gateway-compact") -> float:
    """p50 of a compacting model minus p50 of the passthrough model on the same request."""
    compact, plain = figures(results, case, target), figures(results, case, "gateway")
    if compact is None or plain is None:
        return math.nan
    return compact.p50 - plain.p50


# -- targets -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    goal: str
    measured: float
    unit: str  # "ms" or "x"
    limit: float
    higher_is_better: bool
    case: str
    profile_target: str  # the gateway target to profile when missed
    note: str = ""

    @property
    def status(self) -> str:
        if math.isnan(self.measured):
            return "N/A"
        ok = self.measured >= self.limit if self.higher_is_better else self.measured <= self.limit
        return "PASS" if ok else "MISS"

    def shown(self) -> str:
        return _fmt(self.measured, self.unit)

    def wanted(self) -> str:
        sign = ">=" if self.higher_is_better else "<="
        return f"{sign} {_fmt(self.limit, self.unit)}"


RELAY_RATIO = 1.5  # the performance issue's limit on the gateway's CPU and latency over the relay's


def verdicts(results: Results) -> list[Verdict]:
    return [
        Verdict(
            "small request: added p50",
            added(results, "small", "gateway"),
            "ms",
            0.3,
            False,
            "small",
            "gateway",
        ),
        Verdict(
            "small request: added beyond the relay's, p50",
            added_over(results, "small", "gateway", "relay"),
            "ms",
            0.15,
            False,
            "small",
            "gateway",
        ),
        Verdict(
            "small request: overhead lower than LiteLLM's",
            overhead_ratio(results, "small", "litellm", "gateway"),
            "x",
            20,
            True,
            "small",
            "gateway",
        ),
        Verdict(
            "200 messages, seen before: added p50",
            added(results, "agent-seen", "gateway"),
            "ms",
            1.0,
            False,
            "agent-seen",
            "gateway",
        ),
        *(
            Verdict(
                goal,
                ratio(results, case, "gateway", "relay"),
                "x",
                RELAY_RATIO,
                False,
                case,
                "gateway",
            )
            for goal, ratio, case in (
                ("200 messages, seen before: CPU per request / relay's", cpu_ratio, "agent-seen"),
                ("200 messages at c=32: CPU per request / relay's", cpu_ratio, "agent-seen-c32"),
                ("200 messages at c=32: added p50 / relay added", overhead_ratio, "agent-seen-c32"),
            )
        ),
        Verdict(
            "200 messages, first time seen: added p50",
            added(results, "agent-first", "gateway"),
            "ms",
            10.0,
            False,
            "agent-first",
            "gateway",
        ),
        Verdict(
            "200 messages, first time seen, fits by its upper bound: added / relay added",
            overhead_ratio(results, "agent-first", "gateway", "relay"),
            "x",
            2.0,
            False,
            "agent-first",
            "gateway",
        ),
        Verdict(
            "200 messages, first time seen, counted before forwarding: added p50",
            added(results, "agent-count", "gateway-count"),
            "ms",
            10.0,
            False,
            "agent-count",
            "gateway-count",
        ),
        Verdict(
            "streaming: TTFB added (small)",
            added(results, "small-stream", "gateway", ttfb=True),
            "ms",
            0.5,
            False,
            "small-stream",
            "gateway",
        ),
        Verdict(
            "throughput c=32 vs LiteLLM, small",
            throughput_ratio(results, "small-c32", "gateway", "litellm"),
            "x",
            10,
            True,
            "small-c32",
            "gateway",
        ),
        Verdict(
            "throughput c=32 vs LiteLLM, 200 messages",
            throughput_ratio(results, "agent-seen-c32", "gateway", "litellm"),
            "x",
            10,
            True,
            "agent-seen-c32",
            "gateway",
        ),
        Verdict(
            "compaction without LLM (mask + trim): adds, 200 messages seen before",
            compaction_cost(results, "compact-seen"),
            "ms",
            2.0,
            False,
            "compact-seen",
            "gateway-compact",
            "p50 of the 32k-window model minus p50 of the passthrough model, same requests",
        ),
        Verdict(
            "served from a ready summary: adds, 200 messages seen before",
            compaction_cost(results, "summary-ready", "gateway-summary"),
            "ms",
            2.0,
            False,
            "summary-ready",
            "gateway-summary",
            "p50 of the summarising model minus p50 of the passthrough model, same requests "
            "(issue 5: within the gateway's normal overhead; held to the LLM-free compaction "
            "target)",
        ),
    ]


# -- formatting ----------------------------------------------------------------------------


def _fmt(value: float, unit: str = "ms") -> str:
    if math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return "inf"
    if unit == "x":  # two decimals near a limit such as 1.5x, where one would round across it
        return f"{value:.2f}x" if value < 10 else f"{value:.1f}x"
    if unit == "ms":
        return f"{value:.2f} ms" if abs(value) < 100 else f"{value:.0f} ms"
    return f"{value:.2f}"


def _num(value: float, digits: int = 2) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:.{digits}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


# -- facts about this run ------------------------------------------------------------------


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def gateway_commit(root: Path) -> str:
    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, timeout=20
            ).stdout.strip()
        except (subprocess.SubprocessError, OSError):
            return ""

    commit = git("rev-parse", "--short=12", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "gateway", "policies")
    return commit + (" + uncommitted changes in gateway/ or policies/" if dirty else "")


def versions(root: Path, peers: Mapping[str, str | None]) -> list[tuple[str, str]]:
    return [
        ("python", platform.python_version()),
        ("gateway commit", gateway_commit(root)),
        ("litellm (peer venv)", peers.get("litellm") or "not installed"),
        ("headroom-ai (peer venv)", peers.get("headroom") or "not installed"),
        *(
            (name, _version(name))
            for name in (
                "aiohttp",
                "uvicorn",
                "starlette",
                "uvloop",
                "httptools",
                "orjson",
                "tiktoken",
            )
        ),
    ]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_total() -> str:
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                if line.startswith("MemTotal:"):
                    return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def busy_seconds() -> float:
    """CPU seconds spent non-idle by the whole machine since boot (from /proc/stat)."""
    try:
        with open("/proc/stat") as file:
            fields = [int(v) for v in file.readline().split()[1:]]
    except OSError:
        return math.nan
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@dataclass
class RunInfo:
    command: str
    mode: str
    started: str
    seconds: float
    rounds: int
    loadavg_before: str
    loadavg_after: str
    foreign_cores: float  # average cores busy with processes not started by the run
    notes: list[str] = field(default_factory=list)
    memory: dict[str, float] = field(default_factory=dict)
    profiles: dict[str, list[str]] = field(default_factory=dict)
    sample_headers: dict[str, dict[str, str]] = field(default_factory=dict)
    compaction: str = ""
    tokens: dict[str, int] = field(default_factory=dict)
    agent_sizes: dict[str, dict[str, int]] = field(default_factory=dict)
    summary_metrics: dict[str, float] = field(default_factory=dict)


# -- the document --------------------------------------------------------------------------


# The last line of the generated part: what follows it in docs/benchmarks.md is written by hand
# (other benchmarks' results) and kept when the report is written again.
GENERATED_END = (
    "<!-- end of the part written by `python -m benchmarks.run`; sections below it are kept "
    "when it rewrites this file -->"
)


def keep_tail(previous: str) -> str:
    """The hand-written sections of an earlier report: what follows `GENERATED_END`, or, in a
    report from before that line existed, every section after "Versions and machine"."""
    if GENERATED_END in previous:
        tail = previous.split(GENERATED_END, 1)[1]
    else:
        facts = previous.find("\n## Versions and machine")
        following = previous.find("\n## ", facts + 1) if facts >= 0 else -1
        tail = "" if following < 0 else previous[following:]
    return "\n" + tail.lstrip("\n") if tail.strip() else ""


def render(
    results: Results,
    info: RunInfo,
    root: Path,
    peers: Mapping[str, str | None],
    analysis: str,
) -> str:
    out: list[str] = [
        "# Benchmarks",
        "",
        f"Written by `{info.command}` ({info.mode}, {info.rounds} rounds, {info.seconds:.0f} s, "
        f"started {info.started}). Regenerate with the same command; `python -m benchmarks.run "
        "--help` lists the flags. Everything runs on loopback: a fast fake upstream, the gateway, "
        "a do-nothing Starlette + aiohttp relay (the Python floor), the LiteLLM proxy and the "
        "headroom proxy, each its own process with one worker, measured in the same run: at "
        "concurrency 1 the targets alternate request by request, at 32 they take turns batch by "
        "batch. Chat Completions, Codex-like Responses and Claude-Code-like Messages requests.",
        "",
        f"Machine load while measuring: load average {info.loadavg_before} before, "
        f"{info.loadavg_after} after; processes not started by this run kept "
        f"{info.foreign_cores:.2f} of {os.cpu_count()} cores busy on average. Absolute numbers "
        "move with that load; the ratios are the figures to compare.",
        "",
    ]
    out += _section_targets(results)
    out += _section_ratios(results)
    out += _section_absolute(results)
    out += _section_paths(results, info)
    out += _section_profiles(info)
    if analysis.strip():
        out += ["## What the misses would take (analysis by hand)", "", analysis.strip(), ""]
    out += _section_facts(info, root, peers)
    return "\n".join(out) + "\n" + GENERATED_END + "\n"


def _section_targets(results: Results) -> list[str]:
    rows = [
        [v.goal, v.shown(), v.wanted(), f"**{v.status}**", f"`{v.case}`"] for v in verdicts(results)
    ]
    lines = ["## Targets", ""]
    lines += _table(("target", "measured", "goal", "result", "case"), rows)
    return [*lines, ""]


def _ratio_row(results: Results, case: Case) -> list[str]:
    row = [case.title]
    for target in ("gateway", "relay", "litellm", "headroom"):
        value = added(results, case.key, target)
        row.append(_fmt(value) if target in case.targets else "")
    if "relay" in case.targets:
        floor = added(results, case.key, "gateway") - added(results, case.key, "relay")
        row.append(_fmt(floor))
        row.append(_fmt(cpu_over(results, case.key, "gateway", "relay")))
    else:
        row += ["", ""]
    row.append(_fmt(added(results, case.key, "gateway", ttfb=True)) if case.stream else "")
    for peer in ("litellm", "headroom"):
        shown = peer in case.targets
        row.append(_fmt(overhead_ratio(results, case.key, peer, "gateway"), "x") if shown else "")
    for other in ("litellm", "headroom", "direct"):
        shown = case.concurrency > 1 and other in case.targets
        row.append(
            _fmt(throughput_ratio(results, case.key, "gateway", other), "x") if shown else ""
        )
    extra = [t for t in case.targets if t.startswith("gateway") and t != "gateway"]
    row.append(", ".join(f"{t}: {_fmt(added(results, case.key, t))}" for t in extra))
    return row


RATIO_COLUMNS = (
    "case",
    "gateway added",
    "relay floor added",
    "LiteLLM added",
    "headroom added",
    "gateway over floor",
    "CPU/req over floor",
    "gateway TTFB added",
    "LiteLLM / gateway",
    "headroom / gateway",
    "throughput gateway / LiteLLM",
    "throughput gateway / headroom",
    "throughput gateway / direct",
    "other gateway targets, added",
)


def _section_ratios(results: Results) -> list[str]:
    lines = [
        "## Ratios",
        "",
        'Added p50 = target p50 minus direct p50 in the same case; "gateway over floor" = '
        "gateway added minus relay added, the gateway's own cost above a do-nothing Python "
        "relay on the same stack (less sensitive to machine load than the absolute figures); "
        '"CPU/req over floor" the same for CPU time per request. '
        '"LiteLLM / gateway" and "headroom / gateway" are how many times more latency that '
        "proxy adds than the gateway; throughput ratios are requests per second at that "
        "concurrency. An empty cell: the case leaves that target out (see the case list below).",
        "",
    ]
    groups = (
        ("Agent APIs: Codex-like `/v1/responses`, Claude-Code-like `/v1/messages`", False),
        ("Chat Completions", True),
    )
    for heading, chat in groups:
        rows = [
            _ratio_row(results, case)
            for case in CASES
            if case.key in results and (case.api == "chat") == chat
        ]
        if rows:
            lines += [f"### {heading}", "", *_table(RATIO_COLUMNS, rows), ""]
    return lines


def _section_absolute(results: Results) -> list[str]:
    rows = []
    for case in CASES:
        for target in case.targets:
            f = figures(results, case.key, target)
            batch = results.get(case.key, {}).get(target)
            if f is None:
                if batch is not None:
                    rows.append(
                        [
                            case.key,
                            target,
                            "0",
                            str(batch.errors),
                            "",
                            "",
                            "",
                            "",
                            "",
                            "",
                            batch.first_error[:80].replace("|", "/"),
                        ]
                    )
                continue
            rows.append(
                [
                    case.key,
                    target,
                    str(f.n),
                    str(f.errors),
                    _num(f.p50, 3),
                    _num(f.p99, 3),
                    _num(f.ttfb50, 3) if case.stream else "",
                    _num(f.ttfb99, 3) if case.stream else "",
                    _num(f.rps, 0),
                    _num(f.cpu_ms, 3),
                    (batch.first_error[:80].replace("|", "/") if batch and batch.errors else ""),
                ]
            )
    lines = [
        "## Absolute numbers",
        "",
        "Latency in ms over all rounds; throughput in requests/s while the batches ran; CPU = user "
        "+ system time of the target's process tree (from /proc) per answered request, in ms (for "
        "`direct`, the upstream's own).",
        "",
    ]
    lines += _table(
        (
            "case",
            "target",
            "n",
            "errors",
            "p50",
            "p99",
            "TTFB p50",
            "TTFB p99",
            "req/s",
            "CPU ms/req",
            "first error",
        ),
        rows,
    )
    lines.append("")
    lines.append("Cases:")
    lines.append("")
    lines += [
        f"- `{c.key}`: {c.title}; targets {', '.join(c.targets)}" for c in CASES if c.key in results
    ]
    lines += [
        "",
        "Requests (`benchmarks/workloads.py`, deterministic): the small one is system + assistant "
        "+ user; the agent one has 200 messages (system prompt, user task, assistant tool calls, "
        "some parallel, code and log tool results, remarks and follow-ups) and 4 tool "
        'definitions. Every agent message carries a conversation marker: "first time seen" '
        "changes it, so none of the 200 messages is in the gateway's count cache (changing only "
        'the first user message would leave 199 of them cached); "seen before" keeps it and '
        "changes only the last message. Each batch starts with a few uncounted warm-up "
        "requests that reopen keep-alive connections.",
        "",
        "Agent API requests (`benchmarks/agent_bodies.py`, shapes from captured Codex CLI and "
        "Claude Code requests, our own generated text): the same 200-message conversation as "
        "the chat case, behind a Codex-like head (developer instructions in `input`, 9 function "
        "tools, `reasoning` items with `encrypted_content` before each tool round, `include`, "
        "`store: false`, `prompt_cache_key`) or a Claude-Code-like one (`system` blocks with "
        "`cache_control`, 12 tools, `thinking`, `metadata`, `max_tokens` 32000, the "
        "`anthropic-version` and `anthropic-beta` headers), streamed as both agents stream. "
        '"Seen" appends a new user message to the same conversation; "first time seen" makes '
        "every item new (the instructions too). The fast upstream answers each API in its own "
        "shape (`benchmarks/agent_answers.py`: Responses events ending in `response.completed`, "
        "Messages events ending in `message_stop`); a stream without its last event counts as "
        "an error. headroom serves one request at a time at 20-200 ms of CPU on chat and up to "
        "seconds on these bodies, so at c=32 it is measured on the seen agent API requests only "
        "(its c=1 CPU per request bounds its throughput: 1000 / CPU ms requests per second); "
        "first-seen c=32 cases leave LiteLLM out too (it keeps nothing per conversation: its "
        "seen figure holds), and at c=32 neither peer gets a warm-up batch on these bodies (a "
        "reopened connection costs a millisecond of their seconds).",
    ]
    return [*lines, ""]


def _section_paths(results: Results, info: RunInfo) -> list[str]:
    lines = ["## Compaction path, emergency retry, memory", ""]
    lines.append(f"- Compaction chain of `bench-compact` (32,768-token window): {info.compaction}.")
    if info.tokens:
        lines.append(
            "- Request sizes (o200k tokens of messages + tools, as the gateway counts them): "
            + ", ".join(f"{k} {v:,}" for k, v in info.tokens.items())
            + "."
        )
    for api, size in info.agent_sizes.items():
        lines.append(
            f"- {api} request size: {size['instructions_and_tools'] / 1000:.1f} KB of "
            f"instructions and tools, {size['history'] / 1000:.1f} KB of history."
        )
    for key, headers in info.sample_headers.items():
        shown = ", ".join(
            f"{k.removeprefix('x-compactgate-')}={v}"
            for k, v in sorted(headers.items())
            if not k.endswith("request-id")
        )
        lines.append(f"- Gateway headers of one `{key}` answer: {shown}.")
    for case, label in (("compact-seen", "seen before"), ("compact-first", "first time seen")):
        cost = compaction_cost(results, case)
        if not math.isnan(cost):
            lines.append(
                f"- Compaction, {label}: the compacting model's p50 is {_fmt(cost)} above the "
                "passthrough model's on the same requests "
                f"({_fmt(added(results, case, 'gateway-compact'))} above direct)."
            )
    emergency = figures(results, "emergency", "gateway-emergency")
    direct = figures(results, "emergency", "direct")
    if emergency and direct:
        lines.append(
            f"- Emergency retry: {_fmt(emergency.p50 - direct.p50)} added at p50, which includes a "
            f"second upstream round trip (one direct round trip here: {_fmt(direct.p50)}); each "
            "request uses a model name of its own, so the window the gateway learns from the 400 "
            "never turns the retry into a proactive compaction."
        )
    cost = compaction_cost(results, "summary-ready", "gateway-summary")
    if not math.isnan(cost):
        counters = ", ".join(
            f"{name.removeprefix('compactgate_')} {value:g}"
            for name, value in sorted(info.summary_metrics.items())
        )
        lines.append(
            f"- Served from a ready summary (`bench-summary`, policy `compaction`): the "
            f"summarising model's p50 is {_fmt(cost)} above the passthrough model's on the same "
            f"requests ({_fmt(added(results, 'summary-ready', 'gateway-summary'))} above direct). "
            f"The gateway's summary counters after the run: {counters or 'not read'} (every "
            "request but the first finds the summary in the cache)."
        )
    memory = info.memory
    if memory:
        lines.append(
            f"- Memory: a fresh gateway process idles at {memory['idle_mib']:.1f} MiB RSS; after "
            f"{int(memory['conversations']):,} distinct {int(memory['messages'])}-message "
            f"conversations it holds {memory['after_mib']:.1f} MiB (+{memory['delta_mib']:.1f} "
            f"MiB, {memory['per_conversation_kib']:.1f} KiB per conversation; "
            f"{int(memory['errors'])} errors)."
        )
        if "second_mib" in memory:
            lines.append(
                f"  After {int(memory['conversations']):,} more: {memory['second_mib']:.1f} MiB "
                f"({memory['second_per_conversation_kib']:.1f} KiB per conversation). The first "
                "thousand partly reuses memory freed at start-up (loading the tokenizer), so the "
                "second is the steadier growth rate."
            )
    for note in info.notes:
        lines.append(f"- Note: {note}")
    return [*lines, ""]


def _section_profiles(info: RunInfo) -> list[str]:
    if not info.profiles:
        return []
    lines = [
        "## Profiles of the misses (py-spy)",
        "",
        "`py-spy record --nonblocking --rate 250` on the gateway process while the case's load "
        "ran. Percentages are of the samples that were in Python code; samples whose innermost "
        "frame is the event loop itself (uvloop's C code: waiting, or socket I/O) are counted "
        "apart. The collapsed stacks are kept in `benchmarks/.peers/profiles/` (not committed).",
        "",
    ]
    for key, text in info.profiles.items():
        lines += [f"### `{key}`", "", "```", *text, "```", ""]
    return lines


def _section_facts(info: RunInfo, root: Path, peers: Mapping[str, str | None]) -> list[str]:
    rows = [[name, value] for name, value in versions(root, peers)]
    rows += [
        ["nproc", str(os.cpu_count())],
        ["CPU", cpu_model()],
        ["memory", memory_total()],
        ["kernel", platform.release()],
    ]
    lines = ["## Versions and machine", ""]
    lines += _table(("what", "value"), rows)
    return [*lines, ""]


def case_by_key(key: str) -> Case:
    for case in CASES:
        if case.key == key:
            return case
    raise KeyError(key)


def summary_lines(results: Results, emit: Callable[[str], None]) -> None:
    """A short console summary: every verdict."""
    for v in verdicts(results):
        emit(f"  {v.status:4s}  {v.goal}: {v.shown()} (goal {v.wanted()})")
