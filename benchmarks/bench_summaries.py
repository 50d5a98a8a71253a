"""Summaries in a simulated 100-turn agent session.

Run: `python -m benchmarks.bench_summaries [--turns 100] [--steps sandwich,compaction,...]
[--tokenizers tiktoken:o200k_base,chars:3] [--compare]`. About a minute per run (one run per
step and tokenizer); loopback only. Each run starts
the gateway (one worker, memory store) with a policy `<step>` + `fifo` over a 16 384-token
window, and an upstream in this process that answers the agent's calls after `--model-delay`
seconds and summarisation calls (told apart by the summariser's system prompt) after
`--summary-delay` seconds, about two agent cycles, each summary numbered so that the run can
tell which ones the agent's later calls carried. One deterministic agent then works through
`--turns` Turns: a user message, one to four tool rounds (tool outputs of 150 to 1 200 tokens,
`--tool-delay` for the tool to run), a final answer. The upstream reports `usage.prompt_tokens`
as the characters of the request's JSON / 4, so with a heuristic tokenizer (`chars:3`) the
gateway's calibration moves its counts toward that during the run (calibration), and the summarised
ranges must not move with them; `tiktoken:o200k_base` is exact and never calibrated. A second
gateway with a `fifo`-only policy (no summaries), behind its own upstream, gets every call of the
same session half a model delay after the first one (so the two gateways' own work never
overlaps, and both see the machine in the same state), and writes an event log like the first:
the latency reference. `--compare` adds runs without precompute.

Printed, one row per run:

* summariser calls per 100 Turns, per compaction event (the summarised range grew; the
  exact and the calibrated tokenizers count tokens differently, so they see different numbers
  of events: calls per event compares them), and how many summaries were never used (neither
  carried by an agent call nor extended by a later summary); `--uncalibrated` adds runs where
  the upstream reports no usage, so the heuristic is never calibrated;
* compacting requests (over the summarising step's threshold) and the share served from a ready
  summary: compacted with summaries that were all made before the request arrived (the newest
  may be one event old: "partial", the rest of the history verbatim). The others were sent
  whole while their summary was being made (they fit), or waited for a summary (they carried
  one that came back after they were sent);
* p50 of the gateway's added latency (client latency minus the time the upstream spent on the
  request: reading it, the model's delay, answering) on the compacting requests served from a
  ready summary, next to the gateway's normal overhead: the same measure on the run's requests
  under the threshold (non-compacting), and on the same requests through the fifo-only
  reference, with their ratio (p50 of each request's ratio).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from aiohttp import web

from gateway.devtools.echo_upstream import estimate_prompt_tokens
from gateway.summaries.transcript import SYSTEM_PROMPT

ROOT = Path(__file__).resolve().parent.parent
WINDOW = 16_384
MAX_TOKENS = 1024
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} in the repository",
            "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}},
        },
    }
    for name in ("read_file", "grep", "run_tests", "edit_file")
]
_WORDS = (
    "request context window budget policy summary token message assistant tool result file "
    "function error retry upstream gateway config model stream chunk header value index test "
    "build deploy cache memory limit offset line search match update delete create return"
).split()
_USED = re.compile(r"SUMMARY#(\d+):")
SLOW_S = 0.1  # far over the gateway's own time: a request this slow while a summary ended waited


# -- the upstream --------------------------------------------------------------------------------


@dataclass
class Upstream:
    model_delay: float
    summary_delay: float
    usage: bool = True  # report usage.prompt_tokens (what a heuristic is calibrated from)
    summaries: int = 0
    calls: int = 0
    used: set[int] = field(default_factory=set)  # summary numbers seen in the agent's calls
    arrivals: dict[str, float] = field(default_factory=dict)  # x-bench-seq -> perf_counter
    spent: dict[str, float] = field(default_factory=dict)  # x-bench-seq -> seconds in here
    carried: dict[str, set[int]] = field(default_factory=dict)  # x-bench-seq -> summary numbers
    summary_ends: dict[int, float] = field(default_factory=dict)  # number -> perf_counter

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def chat(self, request: web.Request) -> web.Response:
        entered = time.perf_counter()
        raw = await request.read()
        payload = orjson.loads(raw)
        messages = payload.get("messages") or [{}]
        # A summary is used when an agent call carries it, or a later summary extends it.
        numbers = {int(n) for n in _USED.findall(raw.decode())}
        self.used.update(numbers)
        if messages[0].get("content") == SYSTEM_PROMPT:
            self.summaries += 1
            number = self.summaries
            await asyncio.sleep(self.summary_delay)
            self.summary_ends[number] = time.perf_counter()
            text = f"<summary>SUMMARY#{number}: " + " ".join(_WORDS[:40]) * 10 + "</summary>"
        else:
            self.calls += 1
            seq = request.headers.get("x-bench-seq", "")
            self.arrivals[seq] = entered
            self.carried[seq] = numbers
            await asyncio.sleep(self.model_delay)
            text = "Working on it."
        prompt = estimate_prompt_tokens(payload)  # what a provider would report, chars/4
        body = {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": str(payload.get("model")),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 8, "total_tokens": prompt + 8},
        }
        if not self.usage:
            del body["usage"]
        response = web.json_response(body)
        if messages[0].get("content") != SYSTEM_PROMPT:
            self.spent[request.headers.get("x-bench-seq", "")] = time.perf_counter() - entered
        return response


# -- the agent -----------------------------------------------------------------------------------


def _prose(rng: random.Random, tokens: int) -> str:
    words = []
    while len(" ".join(words)) < tokens * 4:
        words.append(rng.choice(_WORDS))
    return " ".join(words)


@dataclass
class Sample:
    steps: str
    tokens_before: int
    latency: float  # as the agent saw it
    sent: float  # perf_counter when the agent sent it
    arrived: float  # perf_counter when the upstream received it
    upstream: float  # seconds the upstream spent on it (reading it, the model's delay, answering)
    carried: frozenset[int] = frozenset()  # summary numbers the forwarded request carried


@dataclass
class Result:
    samples: list[Sample] = field(default_factory=list)
    reference: list[Sample] = field(default_factory=list)  # the same requests, fifo only


@dataclass
class Target:
    """A gateway the agent sends its calls to, and the upstream behind it."""

    client: httpx.AsyncClient
    upstream: Upstream


async def send(target: Target, raw: bytes, seq: str) -> Sample:
    upstream = target.upstream
    started = time.perf_counter()
    headers = {"x-bench-seq": seq, "x-request-id": f"bench-{seq}"}
    response = await target.client.post("/chat/completions", content=raw, headers=headers)
    latency = time.perf_counter() - started
    response.raise_for_status()
    return Sample(
        response.headers["x-compactgate-steps"],
        int(response.headers["x-compactgate-tokens-before"]),
        latency,
        started,
        upstream.arrivals.get(seq, started),
        upstream.spent.get(seq, 0.0),
        frozenset(upstream.carried.get(seq, ())),
    )


async def run_agent(
    target: Target,
    turns: int,
    tool_delay: float,
    seed: int = 5,
    reference: Target | None = None,
    offset: float = 0.0,
) -> Result:
    """The agent's session against `target`. With a `reference`, every call is also sent to it,
    `offset` seconds after the call to `target` started: half a model delay puts the two
    gateways' own work (reading and compacting a request, relaying its answer) at different
    moments, while the machine is in the same state. The agent goes on when `target` answered,
    at its own pace; the reference's answer is collected before its next call.
    """
    rng = random.Random(seed)
    result = Result()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " + _prose(rng, 300)}
    ]
    shadow: asyncio.Task[Sample] | None = None  # the reference's call in flight

    async def call() -> None:
        nonlocal shadow
        body = {"model": "agent", "messages": messages, "tools": TOOLS, "max_tokens": MAX_TOKENS}
        raw = orjson.dumps(body)
        seq = str(len(result.samples))
        if reference is None:
            result.samples.append(await send(target, raw, seq))
            return
        first = asyncio.create_task(send(target, raw, seq))
        await asyncio.sleep(offset)
        if shadow is not None:
            result.reference.append(await shadow)
        shadow = asyncio.create_task(send(reference, raw, seq))
        result.samples.append(await first)

    for turn in range(turns):
        messages.append(
            {"role": "user", "content": f"Task {turn}: " + _prose(rng, rng.randint(30, 80))}
        )
        for round_ in range(rng.choice([1, 2, 2, 3, 3, 4])):
            await call()
            call_id = f"call_{turn}_{round_}"
            tool = rng.choice(TOOLS)["function"]["name"]
            arguments = orjson.dumps({"arg": f"src/module_{rng.randint(1, 60)}.py"}).decode()
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": tool, "arguments": arguments},
                        }
                    ],
                }
            )
            await asyncio.sleep(tool_delay)
            output = _prose(rng, rng.randint(150, 1200))
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        await call()
        messages.append(
            {"role": "assistant", "content": "Done: " + _prose(rng, rng.randint(60, 160))}
        )
    if shadow is not None:
        result.reference.append(await shadow)
    return result


# -- the gateway ---------------------------------------------------------------------------------


async def start_gateway(
    config: dict[str, Any], directory: Path
) -> tuple[asyncio.subprocess.Process, int, Path]:
    """`compactgate serve` on a free port; ready once /healthz answers (30 s at most)."""
    path = directory / f"gateway-{time.monotonic_ns()}.json"
    path.write_text(json.dumps(config))
    log = path.with_suffix(".log")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", str(port),
            "--log-level", "warning", cwd=ROOT, stdout=out, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 30
    async with httpx.AsyncClient(timeout=1) as client:
        while True:
            try:
                if (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200:
                    return process, port, log
            except httpx.TransportError:
                pass
            if process.returncode is not None or time.monotonic() > deadline:
                process.kill() if process.returncode is None else None
                raise RuntimeError("the gateway did not start:\n" + log.read_text()[-3000:])
            await asyncio.sleep(0.1)


def config_for(
    upstream_port: int, step: str, mode: str, tokenizer: str, lookahead: float, events: Path
) -> dict[str, Any]:
    """`mode`: precompute | no-precompute | fifo (the baseline: no summaries at all)."""
    step_config: dict[str, Any] = {"type": step}
    step_config["summary_length" if step == "summarize_old" else "summary_tokens"] = 500
    steps = [{"type": "fifo"}] if mode == "fifo" else [step_config, {"type": "fifo"}]
    return {
        "models": [
            {
                "name": "agent",
                "upstream": {"base_url": f"http://127.0.0.1:{upstream_port}/v1"},
                "context_window": WINDOW,
                "tokenizer": tokenizer,
                "policy": "agent",
            }
        ],
        "policies": {"agent": {"steps": steps}},
        "summaries": {"precompute": mode == "precompute", "lookahead_requests": lookahead},
        "events": {"path": str(events)},  # one line per compacted request, with step details
    }


async def threshold(client: httpx.AsyncClient, step: str) -> int:
    """The summarising step's threshold, in the units of `x-compactgate-tokens-before`."""
    body = {"model": "agent", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
            "max_tokens": MAX_TOKENS}  # fmt: skip
    plan = (await client.post("/compactgate/plan", content=orjson.dumps(body))).json()
    ratio = {"compaction": 0.8, "sandwich": 0.7}.get(step)
    limit = plan["budget"]
    fixed = (
        plan["tokens_before"]
        - plan["tokens_by_region"]["history"]
        - plan["tokens_by_region"]["system"]
    )
    trigger = plan["trigger"] if ratio is None else int(limit * ratio)
    return trigger + fixed


@dataclass
class Report:
    step: str
    tokenizer: str  # with " (no usage)" when the upstream reported none: never calibrated
    mode: str
    turns: int
    summary_calls: int
    unused: int
    samples: list[Sample]
    model_delay: float
    summary_ends: dict[int, float]
    over: int  # the summarising step's threshold, as x-compactgate-tokens-before counts
    states: dict[int, tuple[str, int]]  # request index -> (summary state, messages summarised)
    reference: list[Sample]  # the same requests through the fifo-only gateway, in lockstep


async def serve_upstream(upstream: Upstream) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(upstream.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, int(runner.addresses[0][1])


async def one_run(
    args: argparse.Namespace, step: str, variant: str, mode: str, directory: Path
) -> Report:
    """One session; `variant` is a tokenizer, `<tokenizer> (no usage)` for an upstream that
    reports no usage (the heuristic is then never calibrated).

    A second gateway with a fifo-only policy gets the same requests in lockstep, half a model
    delay later (`run_agent`): the reference. Run minutes apart, as it once was, machine noise
    between the runs moved the comparison by more than the difference measured.
    """
    tokenizer, _, rest = variant.partition(" ")
    model_delay, tool_delay = args.model_delay, args.tool_delay
    upstream = Upstream(model_delay, args.summary_delay, usage=not rest)
    plain = Upstream(model_delay, args.summary_delay, usage=not rest)
    runner, upstream_port = await serve_upstream(upstream)
    plain_runner, plain_port = await serve_upstream(plain)
    events = directory / f"events-{step}-{mode}-{time.monotonic_ns()}.jsonl"
    config = config_for(upstream_port, step, mode, tokenizer, args.lookahead, events)
    # The reference writes its own event log: one line per compacted request costs each gateway
    # the same (tens of µs), so the comparison is of the policies alone.
    reference_events = directory / f"events-{step}-{mode}-reference-{time.monotonic_ns()}.jsonl"
    reference = config_for(plain_port, step, "fifo", tokenizer, args.lookahead, reference_events)
    process, port, _ = await start_gateway(config, directory)
    plain_process, plain_gateway, _ = await start_gateway(reference, directory)
    try:
        auth = {"authorization": "Bearer sk-bench"}
        async with (
            httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}/v1", timeout=120, headers=auth
            ) as client,
            httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{plain_gateway}/v1", timeout=120, headers=auth
            ) as plain_client,
        ):
            over = await threshold(client, step)
            result = await run_agent(
                Target(client, upstream),
                args.turns,
                tool_delay,
                reference=Target(plain_client, plain),
                offset=model_delay / 2,
            )
            await asyncio.sleep(args.summary_delay + 0.5)  # let the last precomputation land
    finally:
        for started in (process, plain_process):
            started.terminate()
            await started.wait()
        await runner.cleanup()
        await plain_runner.cleanup()
    unused = upstream.summaries - len(upstream.used)
    return Report(
        step,
        variant,
        mode,
        args.turns,
        upstream.summaries,
        unused,
        result.samples,
        model_delay,
        upstream.summary_ends,
        over,
        _summary_states(events, step),
        result.reference,
    )


def _summary_states(events: Path, step: str) -> dict[int, tuple[str, int]]:
    """From the event log, the summarising step's state (`ready`, or `partial, ...`: an earlier
    summary, the rest verbatim) and how many messages its summary replaced."""
    states: dict[int, tuple[str, int]] = {}
    if not events.exists():
        return states
    for line in events.read_bytes().splitlines():
        event = orjson.loads(line)
        request_id = str(event.get("request_id", ""))
        for report in event.get("steps", []):
            if report.get("type") == step and request_id.startswith("bench-"):
                summarised = int(report.get("summarised_messages") or 0)
                states[int(request_id[6:])] = (str(report.get("summary", "")), summarised)
    return states


@dataclass
class Row:
    """One run's figures, as printed."""

    step: str
    tokenizer: str
    mode: str
    calls: int
    calls_per_100: float
    events: int  # compaction events served: the summarised range grew
    unused: int
    compacting: int
    ready: int
    partial: int  # of `ready`: the newest summary was one event old
    waited: int
    deferred: int
    added_ready: list[float]  # ms, the gateway's added latency on the ready ones
    added_plain: list[float]  # ms, on the run's requests under the threshold
    added_fifo: list[float]  # ms, the ready ones through the fifo-only policy

    @property
    def share(self) -> float:
        return self.ready / self.compacting * 100 if self.compacting else 0.0


def summarise_run(report: Report) -> Row:
    samples = report.samples
    compacting = [
        i for i, s in enumerate(samples) if s.steps != "none" or s.tokens_before > report.over
    ]

    def waited_for_summary(sample: Sample) -> bool:
        # It carried a summary that came back after it was sent, or it spent longer than
        # SLOW_S in the gateway while a summary call ended: it waited for one.
        ends = report.summary_ends
        if any(ends.get(number, 0.0) > sample.sent for number in sample.carried):
            return True
        slow = sample.arrived - sample.sent > SLOW_S
        return slow and any(sample.sent < end <= sample.arrived for end in ends.values())

    deferred = [i for i in compacting if samples[i].steps == "none"]
    waited = [i for i in compacting if i not in deferred and waited_for_summary(samples[i])]
    ready = [i for i in compacting if i not in deferred and i not in waited]
    partial = [i for i in ready if report.states.get(i, ("ready", 0))[0].startswith("partial")]
    ranges = {n for state, n in report.states.values() if n and not state.startswith("partial")}

    def added(samples: list[Sample], indices: list[int]) -> list[float]:
        return [(samples[i].latency - samples[i].upstream) * 1000 for i in indices]

    plain = sorted(set(range(len(samples))) - set(compacting))
    return Row(
        step=report.step,
        tokenizer=report.tokenizer,
        mode=report.mode,
        calls=report.summary_calls,
        calls_per_100=report.summary_calls * 100 / report.turns,
        events=len(ranges),
        unused=report.unused,
        compacting=len(compacting),
        ready=len(ready),
        partial=len(partial),
        waited=len(waited),
        deferred=len(deferred),
        added_ready=added(samples, ready),
        added_plain=added(samples, plain),
        added_fifo=added(report.reference, ready),
    )


def _p50(values: list[float]) -> str:
    return f"{statistics.median(values):.1f}" if values else "-"


def _spread(values: list[float]) -> str:
    """p25-p75: how much the gateway's own time varies from request to request."""
    if len(values) < 4:
        return "-"
    low, _, high = statistics.quantiles(values, n=4)
    return f"{low:.1f}-{high:.1f}"


def _ratio(values: list[float], references: list[float]) -> str:
    """p50 of the per-request ratios: a request and its reference ran at the same moment."""
    pairs = [v / r for v, r in zip(values, references, strict=True) if r > 0]
    return f"{statistics.median(pairs):.2f}" if pairs else "-"


COLUMNS = (
    ("step", 13),
    ("tokenizer", 29),
    ("precompute", 10),
    ("calls/100 turns", 15),
    ("events", 6),
    ("calls/event", 11),
    ("unused", 6),
    ("compacting", 10),
    ("ready", 13),
    ("partial", 7),
    ("waited", 6),
    ("sent whole", 10),
    ("p50 added ms, ready", 19),
    ("p50 ms, under threshold", 23),
    ("p50 ms, fifo only", 17),
    ("fifo only p25-p75", 17),
    ("ratio", 5),
)


def print_table(rows: list[Row]) -> None:
    print(" | ".join(name.ljust(width) for name, width in COLUMNS))
    print("-+-".join("-" * width for _, width in COLUMNS))
    for row in rows:
        cells = (
            row.step,
            row.tokenizer,
            "yes" if row.mode == "precompute" else "no",
            f"{row.calls_per_100:.1f}",
            str(row.events),
            f"{row.calls / row.events:.2f}" if row.events else "-",
            str(row.unused),
            str(row.compacting),
            f"{row.ready} ({row.share:.1f} %)",
            str(row.partial),
            str(row.waited),
            str(row.deferred),
            _p50(row.added_ready),
            _p50(row.added_plain),
            _p50(row.added_fifo),
            _spread(row.added_fifo),
            _ratio(row.added_ready, row.added_fifo),
        )
        widths = [width for _, width in COLUMNS]
        print(" | ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)))


async def main_async(args: argparse.Namespace) -> None:
    steps = [s for s in args.steps.split(",") if s]
    tokenizers = [t for t in args.tokenizers.split(",") if t]
    if args.uncalibrated:
        tokenizers += [f"{t} (no usage)" for t in tokenizers if t.startswith("chars:")]
    modes = ["precompute"] + (["no-precompute"] if args.compare else [])
    started = time.perf_counter()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-summaries-") as tmp:
        for tokenizer in tokenizers:
            for step in steps:
                for mode in modes:
                    report = await one_run(args, step, tokenizer, mode, Path(tmp))
                    rows.append(summarise_run(report))
                    print(f"  done: {step}, {tokenizer}, {mode}", file=sys.stderr)
    print(
        f"\n{args.turns} turns; each run: <step> + fifo, 16 384-token window; "
        f"model delay {args.model_delay} s, summary delay {args.summary_delay} s, "
        f"tool delay {args.tool_delay} s\n"
    )
    print_table(rows)
    print(
        "\nevents: compaction events served (distinct summarised ranges); calls/event: summariser "
        "calls per event (1.00: every event extended the summary once, nothing made twice). "
        "ready: compacted with summaries made before the request arrived (partial: the newest "
        "one event old, the rest verbatim); waited: carried a summary that came back after it "
        "was sent; sent whole: sent uncompacted while its summary was made (it fit). p50 added "
        "ms: client latency minus the time the upstream spent on the request, on the ready "
        "requests; under threshold: "
        "the same on this run's non-compacting requests (the gateway's normal overhead); fifo "
        "only: the same requests through the fifo-only gateway, sent in lockstep (p25-p75: how "
        "much its own time varies between those requests); ratio: p50 of each request's added "
        "ms over its fifo-only added ms."
    )
    print(f"(total {time.perf_counter() - started:.0f} s)")


STEPS = ("sandwich", "compaction", "summarize_old")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_summaries")
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument(
        "--steps", default=",".join(STEPS), help=f"comma-separated, of {', '.join(STEPS)}"
    )
    parser.add_argument(
        "--tokenizers",
        default="tiktoken:o200k_base,chars:3",
        help="comma-separated; a chars: heuristic is calibrated toward the upstream's usage",
    )
    parser.add_argument("--model-delay", type=float, default=0.1)
    parser.add_argument("--summary-delay", type=float, default=0.3)
    parser.add_argument("--tool-delay", type=float, default=0.02)
    parser.add_argument("--lookahead", type=float, default=2.0, help="summaries.lookahead_requests")
    parser.add_argument("--compare", action="store_true", help="also run without precompute")
    parser.add_argument(
        "--uncalibrated",
        action="store_true",
        help="also run each chars: tokenizer with an upstream that reports no usage",
    )
    args = parser.parse_args(argv)
    unknown = set(args.steps.split(",")) - set(STEPS)
    if unknown:
        parser.error(f"unknown steps: {', '.join(sorted(unknown))}")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
