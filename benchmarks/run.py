"""Run the side-by-side benchmarks and write docs/benchmarks.md.

    python -m benchmarks.run             # full run: about 11-12 minutes (bounded by --max-minutes)
    python -m benchmarks.run --quick     # smoke run: about 3 minutes

It starts, on loopback, a fast fake upstream (and a second one that rejects large requests once
with `context_length_exceeded`), the gateway (one worker) with a generated config, a do-nothing
Starlette + aiohttp relay, the LiteLLM proxy and the headroom proxy (`benchmarks.peers`: pinned,
installed once into benchmarks/.peers/; the run goes on without a peer that fails). Then it
measures the cases of `benchmarks/cases.py` (chat, and Codex-like Responses and Claude-Code-like
Messages bodies) against them in interleaved rounds, measures the gateway's memory with 1,000
distinct conversations on a fresh process, profiles every missed target with py-spy, and writes
the report: ratios first, then absolute numbers, versions and machine facts.
`benchmarks/analysis.md`, if present, is included as the hand-written analysis of the misses;
sections written by hand below the generated part of the report are kept (`report.keep_tail`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import aiohttp

from . import agent_answers, agent_bodies, load, peers, profile, report, targets, workloads
from .cases import (
    CASES,
    MEMORY_CONVERSATIONS,
    MEMORY_MESSAGES,
    ROUNDS_FULL,
    ROUNDS_QUICK,
    Case,
    warmup_requests,
)
from .load import Batch
from .targets import Service

ROOT = targets.ROOT
ANALYSIS = ROOT / "benchmarks" / "analysis.md"
CHAT = "/v1/chat/completions"
PATHS = {"chat": CHAT, "responses": "/v1/responses", "messages": "/v1/messages"}
# Claude Code's headers besides the credential (it sends the Bearer token of ANTHROPIC_AUTH_TOKEN)
MESSAGES_HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description="Benchmark CompactGate against the upstream, a Python relay floor, the "
        "LiteLLM proxy and the headroom proxy on loopback, and write docs/benchmarks.md.",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 2 rounds of small batches (about 3 minutes)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help=f"rounds per case (default {ROUNDS_FULL}, quick {ROUNDS_QUICK})",
    )
    parser.add_argument(
        "--cases",
        default=None,
        help="comma-separated case keys to run (default: all): " + ", ".join(c.key for c in CASES),
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "docs" / "benchmarks.md",
        help="the report to write (default docs/benchmarks.md)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write raw figures as JSON")
    parser.add_argument("--no-litellm", action="store_true", help="leave the LiteLLM peer out")
    parser.add_argument("--no-headroom", action="store_true", help="leave the headroom peer out")
    parser.add_argument(
        "--install-timeout",
        type=float,
        default=900,
        help="seconds allowed for installing each peer (default 900)",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the memory measurement")
    parser.add_argument(
        "--no-profile", action="store_true", help="do not profile missed targets with py-spy"
    )
    parser.add_argument(
        "--profile-seconds",
        type=float,
        default=None,
        help="seconds of load per profiled miss (default 6, quick 3)",
    )
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=11,
        help="once the targets are up, start no new batch after this many "
        "minutes (default 11; a first install of the peers comes on top)",
    )
    parser.add_argument(
        "--keep-workdir",
        action="store_true",
        help="keep the temporary directory with configs and process logs",
    )
    return parser


class Bench:
    """One run: its processes, its request numbering, its results."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.quick: bool = args.quick
        self.rounds: int = max(1, args.rounds or (ROUNDS_QUICK if self.quick else ROUNDS_FULL))
        self.workdir = Path(tempfile.mkdtemp(prefix="compactgate-bench-"))
        self.services: dict[str, Service] = {}
        self.authorization = "Bearer " + peers.new_master_key()
        self.results: dict[str, dict[str, Batch]] = {}
        self.index = 0  # request numbers are never reused in a run: distinct conversations
        self.notes: list[str] = []
        self.sample_headers: dict[str, dict[str, str]] = {}
        self.workloads: dict[tuple[str, str, bool], workloads.Workload] = {}
        self.started = time.monotonic()
        self.deadline = self.started + args.max_minutes * 60  # reset once the targets are up
        self.peer_versions: dict[str, str | None] = {}

    def log(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:6.1f}s] {message}", flush=True)

    # -- targets ---------------------------------------------------------------------------

    def service_of(self, target: str) -> Service | None:
        names = {
            "direct": "upstream",
            "relay": "relay",
            "litellm": "litellm",
            "headroom": "headroom",
        }
        return self.services.get(names.get(target, "gateway"))

    def workload(self, shape: str, kind: str, stream: bool) -> workloads.Workload:
        key = (shape, kind, stream)
        if key not in self.workloads:
            model = {
                "passthrough": targets.PASSTHROUGH_MODEL,
                "compact": targets.COMPACT_MODEL,
                "emergency": targets.EMERGENCY_PREFIX + workloads.MODEL_MARK.decode(),
                "summary": targets.SUMMARY_MODEL,
                "count": targets.COUNT_MODEL,
            }[kind]
            build = {
                "small": workloads.small,
                "agent": workloads.agent,
                "codex": lambda _, stream: agent_bodies.codex(targets.RESPONSES_MODEL, stream),
                "claude": lambda _, stream: agent_bodies.claude(targets.MESSAGES_MODEL, stream),
            }[shape]
            self.workloads[key] = build(model, stream)
        return self.workloads[key]

    def body_for(self, case: Case, target: str) -> load.BodyFor:
        kinds = {
            "gateway-compact": "compact",
            "gateway-emergency": "emergency",
            "gateway-summary": "summary",
            "gateway-count": "count",
        }
        kind = kinds.get(target, "passthrough")
        workload = self.workload(case.shape, kind, case.stream)
        if kind == "emergency":
            return workload.distinct_model
        return getattr(workload, case.variant)

    @staticmethod
    def headers_for(target: str) -> load.HeadersFor | None:
        if target == "gateway-emergency":
            return lambda i: {"x-bench-conversation": f"c{i}"}
        return None

    # -- start-up --------------------------------------------------------------------------

    async def start(self, session: aiohttp.ClientSession) -> None:
        upstream = targets.start_upstream(self.workdir)
        self.services["upstream"] = upstream
        emergency = targets.start_upstream(
            self.workdir, "upstream-emergency", targets.EMERGENCY_REJECT_ABOVE
        )
        self.services["upstream-emergency"] = emergency
        self.services["gateway"] = targets.start_gateway(
            self.workdir, targets.gateway_config(upstream, emergency)
        )
        try:
            self.services["relay"] = targets.start_relay(self.workdir, upstream)
        except targets.StartError as error:
            self.notes.append(f"the relay floor did not start: {error}")
        starting = []
        for peer, left_out in (
            (peers.LITELLM, self.args.no_litellm),
            (peers.HEADROOM, self.args.no_headroom),
        ):
            if left_out:
                self.notes.append(f"{peer.name} left out (--no-{peer.name}): its ratios are n/a")
            else:
                starting.append(asyncio.create_task(self.start_peer(session, peer)))
        if not await self.wait_ready(session, self.services["gateway"], 120):
            raise targets.StartError(
                "the gateway did not become ready:\n" + self.services["gateway"].log_tail()
            )
        relay = self.services.get("relay")
        if relay is not None and not await self.wait_ready(session, relay, 60):
            self.notes.append("the relay floor did not answer; left out")
            self.services.pop("relay").stop()
        for task in starting:
            await task
        running = (f"{name} pid {s.pid} port {s.port}" for name, s in self.services.items())
        self.log("ready: " + ", ".join(running))

    async def start_peer(self, session: aiohttp.ClientSession, peer: peers.Peer) -> None:
        """Install `peer` once, start it, wait for it to answer; a failure becomes a note."""
        if not peer.installed():
            self.log(f"installing {peer.spec} into {peer.venv} (once)")
        problem = await asyncio.to_thread(peer.install, self.args.install_timeout)
        if problem is not None:
            self.notes.append(f"{peer.name} left out: {problem}")
            self.log(self.notes[-1])
            return
        version = await asyncio.to_thread(peer.version)
        self.peer_versions[peer.name] = version
        upstream = self.services["upstream"]
        if peer is peers.LITELLM:
            service = peers.start_litellm(
                self.workdir, upstream, self.authorization.removeprefix("Bearer ")
            )
        else:
            service = peers.start_headroom(self.workdir, upstream)
        self.services[peer.name] = service
        if not await self.wait_ready(session, service, 300):
            self.notes.append(
                f"{peer.name} left out: the proxy did not become ready in 300 s; its log "
                "ends: " + service.log_tail(3).replace("\n", " / ")[:300]
            )
            self.log(self.notes[-1])
            self.services.pop(peer.name).stop()
            return
        self.notes.append(PEER_NOTES[peer.name].format(version=version))

    async def wait_ready(
        self, session: aiohttp.ClientSession, service: Service, timeout: float
    ) -> bool:
        """Poll with a real chat request until it answers 200 (bounded by `timeout`)."""
        body = self.workload("small", "passthrough", False).template
        headers = {"content-type": "application/json", "authorization": self.authorization}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and service.alive():
            try:
                async with session.post(
                    service.origin + CHAT,
                    data=body,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=10),
                ) as response:
                    await response.read()
                    if response.status == 200:
                        return True
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.5)
        return False

    # -- measuring -------------------------------------------------------------------------

    def target(self, case: Case, name: str) -> load.Target:
        service = self.service_of(name)
        assert service is not None
        return load.Target(
            service.origin + PATHS[case.api],
            self.body_for(case, name),
            self.headers_for(name),
            (service.pid,),
            headers=MESSAGES_HEADERS if case.api == "messages" else None,
            stream_end=agent_answers.STREAM_END[case.api],
        )

    def keep_headers(self, case: Case, name: str, batch: Batch) -> None:
        if name != "gateway" and name.startswith("gateway") and batch.sample_headers:
            self.sample_headers.setdefault(f"{case.key}/{name}", batch.sample_headers)

    async def batch(
        self,
        session: aiohttp.ClientSession,
        case: Case,
        name: str,
        requests: int,
        seconds: float,
        warmup: bool = True,
    ) -> Batch:
        """Closed-loop load on one target at the case's concurrency."""
        target = self.target(case, name)
        common = dict(
            stream=case.stream, concurrency=case.concurrency, authorization=self.authorization
        )
        if warmup:
            warm = await load.run(
                session,
                target,
                requests=warmup_requests(case.concurrency),
                max_seconds=10,
                first_index=self.index,
                **common,
            )
            self.index += warm.sent
        measured = await load.run(
            session,
            target,
            requests=requests,
            max_seconds=seconds,
            first_index=self.index,
            **common,
        )
        self.index += measured.sent
        self.keep_headers(case, name, measured)
        return measured

    async def paired(
        self,
        session: aiohttp.ClientSession,
        case: Case,
        names: list[str],
        requests: int,
        seconds: float,
    ) -> list[Batch]:
        """Concurrency 1: one request to each target in turn (`load.run_paired`)."""
        targets = [self.target(case, name) for name in names]
        common = dict(stream=case.stream, authorization=self.authorization)
        warm = await load.run_paired(
            session,
            targets,
            requests=warmup_requests(1),
            max_seconds=10 * len(targets),
            first_index=self.index,
            **common,
        )
        self.index += warm[0].sent
        batches = await load.run_paired(
            session,
            targets,
            requests=requests,
            max_seconds=seconds * len(targets),
            first_index=self.index,
            **common,
        )
        self.index += batches[0].sent
        for name, batch in zip(names, batches, strict=True):
            self.keep_headers(case, name, batch)
        return batches

    async def run_case(self, session: aiohttp.ClientSession, case: Case) -> None:
        """Rounds; at concurrency 1 the targets alternate request by request, above it they
        take turns batch by batch (the order rotating every round)."""
        available = [t for t in case.targets_for(self.quick) if self.service_of(t) is not None]
        merged = {t: Batch() for t in available}
        budget = case.load(self.quick)
        self.results[case.key] = merged
        rounds = self.rounds
        if case.rounds is not None and not self.args.rounds:
            rounds = case.rounds[1] if self.quick else case.rounds[0]
        for round_number in range(rounds):
            if time.monotonic() > self.deadline:
                self.notes.append(
                    f"--max-minutes reached: case {case.key} has {round_number} of {rounds} rounds"
                )
                return
            if case.concurrency == 1:
                batches = await self.paired(
                    session, case, available, budget.requests, budget.seconds
                )
                for name, batch in zip(available, batches, strict=True):
                    merged[name].merge(batch)
                continue
            shift = round_number % len(available)
            for name in available[shift:] + available[:shift]:
                # A peer that takes a second or more per agent API request gets no warm-up
                # batch: the connections it reopens cost a millisecond of that.
                warmup = case.api == "chat" or name not in ("litellm", "headroom")
                merged[name].merge(
                    await self.batch(
                        session, case, name, budget.requests, budget.seconds, warmup=warmup
                    )
                )
        for target in available:
            f = report.figures(self.results, case.key, target)
            if f is None:
                self.log(
                    f"  {case.key:18s} {target:18s} no answers; first error: "
                    f"{merged[target].first_error[:200]}"
                )
                continue
            ttfb = f" ttfb {f.ttfb50:7.3f}" if case.stream else ""
            self.log(
                f"  {case.key:18s} {target:18s} n {f.n:6d} err {f.errors:3d} p50 {f.p50:8.3f} "
                f"p99 {f.p99:8.3f}{ttfb} ms  {f.rps:7.0f} req/s  cpu {f.cpu_ms:6.3f} ms/req"
            )

    async def memory(self, session: aiohttp.ClientSession) -> dict[str, float]:
        """RSS of a fresh gateway: idle (after a warm-up) and after N distinct conversations."""
        config = targets.gateway_config(
            self.services["upstream"], self.services["upstream-emergency"]
        )
        service = targets.start_gateway(self.workdir, config, name="gateway-memory")
        self.services["gateway-memory"] = service
        try:
            if not await self.wait_ready(session, service, 120):
                self.notes.append("memory: the second gateway did not become ready")
                return {}
            conversation = workloads.agent(targets.PASSTHROUGH_MODEL, count=MEMORY_MESSAGES)
            target = load.Target(service.origin + CHAT, conversation.first_time)
            common = dict(stream=False, authorization=self.authorization, max_seconds=60)
            base = 90_000_000  # numbers no other batch uses
            await load.run(session, target, concurrency=1, requests=10, first_index=base, **common)
            await asyncio.sleep(1.0)
            idle = load.rss_bytes(service.pid)
            batch = await load.run(
                session,
                target,
                concurrency=4,
                requests=MEMORY_CONVERSATIONS,
                first_index=base + 100,
                **common,
            )
            await asyncio.sleep(1.0)
            after = load.rss_bytes(service.pid)
            figures = {
                "idle_mib": idle / 2**20,
                "after_mib": after / 2**20,
                "delta_mib": (after - idle) / 2**20,
                "conversations": batch.count,
                "messages": MEMORY_MESSAGES,
                "errors": batch.errors,
                "per_conversation_kib": (after - idle) / 1024 / max(1, batch.count),
            }
            if not self.quick:  # a second thousand: the growth once start-up garbage is reused
                more = await load.run(
                    session,
                    target,
                    concurrency=4,
                    requests=MEMORY_CONVERSATIONS,
                    first_index=base + 100 + MEMORY_CONVERSATIONS,
                    **common,
                )
                await asyncio.sleep(1.0)
                second = load.rss_bytes(service.pid)
                figures["second_mib"] = second / 2**20
                growth = (second - after) / 1024 / max(1, more.count)
                figures["second_per_conversation_kib"] = growth
                figures["errors"] += more.errors
        finally:
            service.stop()
            self.services.pop("gateway-memory", None)
        return figures

    async def summary_metrics(self, session: aiohttp.ClientSession) -> dict[str, float]:
        """The gateway's summary counters: only `bench-summary` summarises, so they tell how
        the `summary-ready` requests were served (cache hits) and how often it summarised."""
        wanted = ("compactgate_summary_cache_total", "compactgate_summarizer_calls_total")
        try:
            async with session.get(self.services["gateway"].origin + "/metrics") as response:
                text = await response.text()
        except aiohttp.ClientError:
            return {}
        found: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith(wanted):
                name, _, value = line.rpartition(" ")
                found[name] = float(value)
        return found

    async def profile_misses(self, session: aiohttp.ClientSession) -> dict[str, list[str]]:
        misses = [v for v in report.verdicts(self.results) if v.status == "MISS"]
        if not misses:
            return {}
        py_spy, problem = await asyncio.to_thread(targets.py_spy, 300)
        if py_spy is None:
            self.notes.append(f"misses not profiled: {problem}")
            return {}
        seconds = self.args.profile_seconds or (3.0 if self.quick else 6.0)
        profiles: dict[str, list[str]] = {}
        done: dict[tuple[str, str], str] = {}
        for verdict in misses:
            key = (verdict.case, verdict.profile_target)
            title = f"{verdict.case}: {verdict.profile_target} ({verdict.goal}: {verdict.shown()})"
            if key in done:
                profiles[title] = [f"same load as `{done[key]}` above"]
                continue
            case = report.case_by_key(verdict.case)
            service = self.service_of(verdict.profile_target)
            if service is None or time.monotonic() > self.deadline:
                continue
            self.log(f"profiling {title}")
            out = self.workdir / f"profile-{verdict.case}-{verdict.profile_target}.txt"

            async def drive(case: Case = case, target: str = verdict.profile_target) -> Batch:
                return await self.batch(session, case, target, 10**6, seconds, warmup=False)

            collapsed, failure = await profile.record(py_spy, service.pid, seconds, out, drive)
            profiles[title] = [failure] if failure else profile.summarise(collapsed)
            done[key] = title
            kept = targets.PEERS / "profiles"
            if not failure:
                kept.mkdir(parents=True, exist_ok=True)
                shutil.copy(out, kept / out.name)
        return profiles

    # -- the whole run ---------------------------------------------------------------------

    async def run(self) -> int:
        selected = set(self.args.cases.split(",")) if self.args.cases else None
        unknown = (selected or set()) - {c.key for c in CASES}
        if unknown:
            print(f"unknown case(s): {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        # SIGTERM (a `timeout`, a stopped job) cancels the run, so that `finally` below stops
        # every process it started instead of leaving them running.
        main_task = asyncio.current_task()
        assert main_task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
        session = load.new_session(max(c.concurrency for c in CASES))
        info = report.RunInfo(
            command="python -m benchmarks.run" + (" --quick" if self.quick else ""),
            mode="quick" if self.quick else "full",
            started=time.strftime("%Y-%m-%d %H:%M %Z"),
            seconds=0.0,
            rounds=self.rounds,
            loadavg_before=_loadavg(),
            loadavg_after="",
            foreign_cores=math.nan,
        )
        try:
            await self.start(session)
            self.deadline = time.monotonic() + self.args.max_minutes * 60
            own_before, busy_before = self._own_cpu(), report.busy_seconds()
            wall_before = time.monotonic()
            for case in CASES:
                if selected is None or case.key in selected:
                    self.log(f"case {case.key}: {case.title}")
                    await self.run_case(session, case)
            own_cpu = self._own_cpu() - own_before
            busy = report.busy_seconds() - busy_before
            wall = max(1e-9, time.monotonic() - wall_before)
            info.foreign_cores = max(0.0, busy - own_cpu) / wall
            info.loadavg_after = _loadavg()
            if not self.args.no_memory and time.monotonic() < self.deadline:
                self.log(
                    f"memory: {MEMORY_CONVERSATIONS} distinct {MEMORY_MESSAGES}-message "
                    "conversations"
                )
                info.memory = await self.memory(session)
                self.log(f"  {info.memory}")
            info.summary_metrics = await self.summary_metrics(session)
            self.log("verdicts:")
            report.summary_lines(self.results, self.log)
            if not self.args.no_profile:
                info.profiles = await self.profile_misses(session)
        finally:
            await session.close()
            for service in self.services.values():
                service.stop()
        info.seconds = time.monotonic() - self.started
        info.notes = self.notes
        info.sample_headers = self.sample_headers
        info.compaction = targets.compaction_steps()[1]
        info.tokens = {
            "small": workloads.token_count(self.workload("small", "passthrough", False).template),
            "200-message agent request": workloads.token_count(
                self.workload("agent", "passthrough", False).template
            ),
        }
        info.agent_sizes = {
            label: agent_bodies.sizes(self.workload(shape, "passthrough", True).template)
            for shape, label in (("codex", "Responses"), ("claude", "Messages"))
        }
        analysis = ANALYSIS.read_text() if ANALYSIS.exists() else ""
        text = report.render(self.results, info, ROOT, self.peer_versions, analysis)
        self.args.out.parent.mkdir(parents=True, exist_ok=True)
        previous = self.args.out.read_text() if self.args.out.exists() else ""
        self.args.out.write_text(text + report.keep_tail(previous))
        self.log(f"wrote {self.args.out}")
        if self.args.json is not None:
            self.args.json.write_text(json.dumps(_raw(self.results), indent=1))
        if not self.args.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        else:
            self.log(f"kept {self.workdir}")
        return 0

    def _own_cpu(self) -> float:
        times = os.times()
        pids = [s.pid for s in self.services.values()]
        return times.user + times.system + load.cpu_seconds(pids)


PEER_NOTES = {
    "litellm": "LiteLLM {version} ran as its own CLI starts it (`litellm --config ... "
    "--num_workers 1`): uvicorn with its default HTTP parser (h11: httptools is not a "
    "dependency of litellm[proxy]), a master key (it refuses to start without one), no "
    "database, cost map from its package (LITELLM_LOCAL_MODEL_COST_MAP); chat and Responses "
    "to the upstream as an OpenAI provider, the Messages model as an Anthropic provider.",
    "headroom": "headroom {version} ran as `headroom proxy --openai-api-url <upstream>/v1 "
    "--anthropic-api-url <upstream> --no-rate-limit --no-cache --no-telemetry "
    "--disable-kompress`: one process, otherwise its defaults (cache mode, its structural "
    "compressors on). Without those flags it would throttle the run to 60 requests a minute, "
    "could answer from its response cache, and would try to download its Kompress model from a "
    "model hub at start (retried in the background; requests pass uncompressed meanwhile). Its "
    "tiktoken files come from the wheel of its own litellm (TIKTOKEN_CACHE_DIR), model hubs "
    "are offline (HF_HUB_OFFLINE), and it assumes a 128k window for the benchmark's model names.",
}


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def _raw(results: Mapping[str, Mapping[str, Batch]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for case, by_target in results.items():
        out[case] = {
            target: report.Figures.of(batch).__dict__ if batch.count else {"errors": batch.errors}
            for target, batch in by_target.items()
        }
    out["verdicts"] = [
        {"goal": v.goal, "measured": v.measured, "limit": v.limit, "status": v.status}
        for v in report.verdicts(results)
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    bench = Bench(args)
    try:
        import uvloop
    except ImportError:
        uvloop = None
    runner = uvloop.run if uvloop is not None else asyncio.run
    try:
        return runner(bench.run())
    except targets.StartError as error:
        print(f"benchmark aborted: {error}", file=sys.stderr)
        return 1
    except asyncio.CancelledError:
        print("benchmark stopped (SIGTERM); its processes were stopped", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
