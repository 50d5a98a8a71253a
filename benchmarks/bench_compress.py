"""`POST /v1/compress` side by side: CompactGate and headroom, called as agentgateway calls them.

    python -m benchmarks.bench_compress [--halves dev,heldout] [--seeds 1] [--fraction 0.5]
        [--shapes aider,codex,...] [--languages en,zh,ja] [--json out.json]

Sessions come from `tests/corpus` (dev and held-out unless told, `--halves dev,heldout,fresh`
adds the third: `dev` may be tuned on, `heldout` and `fresh` are judged only). Every request of
a session whose body is at least 16 KiB (what agentgateway's `contextCompression` sends on by
default) becomes what agentgateway sends its engine: `{"messages": <the request's message list
or Responses input>, "model": ...}`, without the system prompt (Anthropic's `system`, Responses'
`instructions`), and is posted to both engines' `/v1/compress`, one after the other. CompactGate
(`compactgate serve`, the default policy) is given a window per session that cuts its last
request to about `fraction` of its size; headroom (the peer `benchmarks/peers.py` installs, its
proxy with its ML compressor off and nothing downloaded) takes no window in this contract and
compresses what it compresses. Nothing goes upstream from either.

Reported per engine and half, with one ruler for both (o200k tokens of the JSON of the message
list the engine answered, against the one it was sent):

- **calls** and **errors** (answers other than 200; agentgateway would fail open on them);
- **latency**: the client's wall time per call, median and p95, and the ratio of the medians;
- **saved**: the share of tokens the answers removed, over all calls, and over each session's
  last call (its whole conversation);
- **fits**: the share of sessions whose last answer is within the session's window less the
  output reserve (the window CompactGate was given);
- **stated**: the share of the sessions' stated items (rules, constraints, facts...) found word
  for word (whitespace and case aside) in the last answer.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from benchmarks import peers, targets
from benchmarks.bench_fidelity import _strings, normalised
from gateway.counting.tokenizers import load_tokenizer
from tests.corpus import LANGUAGES, SHAPES, Session, sessions

JSON = dict[str, Any]
MIN_BODY = 16 * 1024  # agentgateway's default minSizeBytes
MAX_OUTPUT = 1024
TARGET_RATIO = 0.6  # the default policy's target
ENGINES = ("compactgate", "headroom")


@dataclass
class Call:
    status: int
    seconds: float
    before: int  # o200k tokens of the list sent
    after: int  # ... of the list answered (the list sent when the answer is not 200)
    error: str = ""


@dataclass
class Outcome:
    """One engine on one session."""

    session: Session
    window: int
    calls: list[Call] = field(default_factory=list)
    last: list[Any] = field(default_factory=list)  # the last answer's list

    def stated(self) -> tuple[int, int]:
        text = normalised("\n".join(_strings(self.last, [])))
        return sum(normalised(i.text) in text for i in self.session.items), len(self.session.items)


class Ruler:
    """o200k tokens of a list's JSON, the same for both engines."""

    def __init__(self) -> None:
        self._tokenizer = load_tokenizer("tiktoken:o200k_base")

    def __call__(self, messages: Any) -> int:
        return self._tokenizer.count(orjson.dumps(messages).decode())


def engine_body(body: JSON, model: str) -> JSON:
    """What agentgateway sends its engine for a client's request: the raw list, the model, no
    system prompt."""
    listed = body.get("messages") if "messages" in body else body.get("input")
    return {"messages": listed, "model": model}


def gateway_config(windows: Sequence[tuple[str, int]]) -> str:
    models = [
        {
            "name": name,
            "upstream": {"base_url": "http://127.0.0.1:9/v1"},  # never called: no summaries
            "context_window": window,
            "max_output_tokens": MAX_OUTPUT,
            "tokenizer": "tiktoken:o200k_base",
        }
        for name, window in windows
    ]
    return json.dumps({"server": {"log_format": "text"}, "models": models})


def wait_ready(client: httpx.Client, service: targets.Service, path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and service.alive():
        try:
            if client.get(f"{service.origin}{path}", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise targets.StartError(f"{service.name} did not start:\n{service.log_tail()}")


def call(client: httpx.Client, origin: str, body: JSON, ruler: Ruler) -> tuple[Call, list[Any]]:
    sent = body["messages"]
    started = time.perf_counter()
    try:
        response = client.post(f"{origin}/v1/compress", json=body)
        status, data = response.status_code, response.content
    except httpx.HTTPError as exc:
        status, data = 0, repr(exc).encode()
    seconds = time.perf_counter() - started
    answered = sent
    error = ""
    if status == 200:
        document = orjson.loads(data)
        if isinstance(document, dict) and isinstance(document.get("messages"), list):
            answered = document["messages"]
        else:
            status, error = -1, "no messages in the answer"
    else:
        error = data[:200].decode("utf-8", "replace")
    return Call(status, seconds, ruler(sent), ruler(answered), error), answered


def run(chosen: Sequence[Session], fraction: float, workdir: Path) -> dict[str, list[Outcome]]:
    ruler = Ruler()
    plans: list[tuple[Session, str, int, list[JSON]]] = []
    for s in chosen:
        bodies = [b for b in s.requests() if len(orjson.dumps(b)) >= MIN_BODY]
        if not bodies:
            continue
        full = ruler(engine_body(bodies[-1], "")["messages"])
        window = math.ceil(full * fraction / TARGET_RATIO) + MAX_OUTPUT + 256
        plans.append((s, s.id, window, bodies))
    services: list[targets.Service] = []
    client = httpx.Client(timeout=120)
    try:
        ours = targets.start_gateway(
            workdir, gateway_config([(name, w) for _, name, w, _ in plans]), name="gateway"
        )
        services.append(ours)
        wait_ready(client, ours, "/healthz", 90)
        stand_in = targets.Service("none", ours.process, 9, ours.log)  # its URLs: never called
        theirs = peers.start_headroom(workdir, stand_in)
        services.append(theirs)
        wait_ready(client, theirs, "/livez", 180)
        results: dict[str, list[Outcome]] = {e: [] for e in ENGINES}
        for n, (s, name, window, bodies) in enumerate(plans, 1):
            mine, peer = Outcome(s, window), Outcome(s, window)
            # headroom picks its tokenizer and limits by the name: a real model's
            peer_model = "claude-sonnet-4-5" if s.api == "messages" else "gpt-4o-mini"
            for body in bodies:
                made, mine.last = call(client, ours.origin, engine_body(body, name), ruler)
                mine.calls.append(made)
                made, peer.last = call(client, theirs.origin, engine_body(body, peer_model), ruler)
                peer.calls.append(made)
            results["compactgate"].append(mine)
            results["headroom"].append(peer)
            print(f"[{n}/{len(plans)}] {name}: {len(bodies)} calls each", file=sys.stderr)
        return results
    finally:
        client.close()
        for service in reversed(services):
            service.stop()


def summary(outcomes: Sequence[Outcome]) -> JSON:
    calls = [c for o in outcomes for c in o.calls]
    times = sorted(c.seconds for c in calls)
    ok = [c for c in calls if c.status == 200]
    kept = [o.stated() for o in outcomes]
    fits = [o.calls[-1].after <= o.window - MAX_OUTPUT for o in outcomes]
    before = sum(c.before for c in calls)
    last = sum(o.calls[-1].before for o in outcomes)
    return {
        "sessions": len(outcomes),
        "calls": len(calls),
        "errors": len(calls) - len(ok),
        "latency_ms_p50": round(statistics.median(times) * 1000, 1) if times else None,
        "latency_ms_p95": round(times[int(0.95 * (len(times) - 1))] * 1000, 1) if times else None,
        "saved": round(1 - sum(c.after for c in calls) / before, 3) if before else 0.0,
        "saved_last": round(1 - sum(o.calls[-1].after for o in outcomes) / last, 3)
        if last
        else 0.0,
        "fits": round(sum(fits) / len(fits), 3) if fits else None,
        "stated": round(sum(k for k, _ in kept) / max(1, sum(t for _, t in kept)), 3),
        "error_examples": sorted({c.error[:120] for c in calls if c.error})[:3],
    }


def report(results: dict[str, list[Outcome]], halves: Sequence[str]) -> JSON:
    out: JSON = {}
    for half in (*halves, "all"):
        row = {
            engine: summary([o for o in outcomes if half == "all" or o.session.half == half])
            for engine, outcomes in results.items()
        }
        ours, theirs = row["compactgate"]["latency_ms_p50"], row["headroom"]["latency_ms_p50"]
        row["latency_ratio"] = round(theirs / ours, 2) if ours and theirs else None
        out[half] = row
    return out


def table(summaries: JSON) -> str:
    lines = [
        "| half | engine | sessions | calls | errors | p50 ms | p95 ms | saved | saved, last "
        "| fits | stated |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for half, row in summaries.items():
        for engine in ENGINES:
            r = row[engine]
            lines.append(
                f"| {half} | {engine} | {r['sessions']} | {r['calls']} | {r['errors']} | "
                f"{r['latency_ms_p50']} | {r['latency_ms_p95']} | {r['saved']:.1%} | "
                f"{r['saved_last']:.1%} | {r['fits']:.0%} | {r['stated']:.1%} |"
            )
    ratios = ", ".join(f"{h}: {r['latency_ratio']}" for h, r in summaries.items())
    return "\n".join(lines) + f"\n\nheadroom's median latency / CompactGate's: {ratios}\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--halves", default="dev,heldout")  # fresh: told, headroom is slow
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--languages", default=",".join(LANGUAGES))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    why = peers.HEADROOM.install(timeout=1800)
    if why is not None:
        print(f"headroom could not be installed: {why}", file=sys.stderr)
        return 1
    halves = args.halves.split(",")
    chosen = [
        s
        for half in halves
        for s in sessions(half, args.seeds, args.shapes.split(","), args.languages.split(","))
    ]
    with tempfile.TemporaryDirectory(prefix="bench-compress-") as tmp:
        results = run(chosen, args.fraction, Path(tmp))
    summaries = report(results, halves)
    version = peers.HEADROOM.version()
    print(f"headroom-ai {version}; fraction {args.fraction}; seeds {args.seeds}\n")
    print(table(summaries))
    if args.json:
        args.json.write_text(json.dumps(summaries, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
