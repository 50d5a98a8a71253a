"""Sends the corpus's sessions through a real `compactgate serve` and records what went upstream.

One fake upstream (`tests/fake_upstream.py`, a real process speaking the three wire formats and
checking the providers' pairing rules) records every request it gets; one gateway started from
its CLI sits in front of it. First a probe model with a huge window measures each session's
last request (`POST /v1/compactgate/plan`): its messages' tokens and the tokens outside them.
Then every (session, fraction) gets a model of its own whose window makes the policy's target
`fraction` of the last request's messages (so the session ends cut to about a half, a quarter),
and every request of the session is sent, in order, as the client would send it. Only the
gateway's HTTP surface is used, so this keeps working while the gateway's modules move.

Per request the recorder keeps what a metric needs: the gateway's answer (status, the
`x-compactgate-*` headers) and the upstream bodies it caused (usually one; more when the gateway
called the upstream itself). `Replay.run` yields one `Case` per (session, fraction).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks import targets
from tests.corpus import Session, shapes

JSON = dict[str, Any]
PROBE_MODEL = "probe"
PROBE_WINDOW = 2_000_000
MAX_OUTPUT = 4096
TARGET_RATIO = 0.6  # the default policy's
TOKENIZER = "tiktoken:o200k_base"


@dataclass
class Sent:
    """One client request and what it caused."""

    status: int
    headers: Mapping[str, str]
    raw: JSON  # what the client sent
    upstream: list[JSON]  # the bodies the upstream received (in order)
    error: str = ""


@dataclass
class Case:
    session: Session
    fraction: float
    model: str
    window: int = 0
    target: int = 0  # the policy's target (messages' tokens), from the plan
    limit: int = 0
    outside: int = 0  # tokens outside the messages' limit (tools, priming, margin)
    tools: int = 0  # the tool definitions' tokens and reply priming, gateway's count
    full: int = 0  # the last request's messages' tokens, gateway's count
    sent: list[Sent] = field(default_factory=list)
    seconds: float = 0.0


def gateway_config(upstream: str, models: Iterable[tuple[str, int]], policy: str | None) -> JSON:
    """Every model the run needs, one upstream, one tokenizer, the default or a named policy."""
    out: JSON = {
        "server": {"log_format": "text"},
        # A fixed key: ref ids (masked outputs, excerpts) are then the same bytes on every run,
        # so two runs of unchanged code give the same tokens (a random key moved them).
        "tool_outputs": {"ref_secret": "corpus-replay-fixed-ref-key"},
        "models": [
            {
                "name": name,
                "upstream": {"base_url": f"{upstream}/v1"},
                "context_window": window,
                "max_output_tokens": MAX_OUTPUT,
                "tokenizer": TOKENIZER,
                **({"policy": policy} if policy else {}),
            }
            for name, window in models
        ],
    }
    if policy:
        import yaml

        example = yaml.safe_load((targets.ROOT / "config.example.yaml").read_text())
        out["policies"] = {policy: example["policies"][policy]}
    return out


class Replay:
    """The two processes and the client; a context manager (both stop at exit)."""

    def __init__(
        self,
        workdir: Path,
        policy: str | None = None,
        log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
        root: Path = targets.ROOT,
    ) -> None:
        self.workdir = workdir
        self.policy = policy
        self.log = log
        self.root = root  # the checkout whose gateway is measured (this one unless told)
        self.client = httpx.Client(timeout=600)
        self.services: list[targets.Service] = []

    def __enter__(self) -> Replay:
        argv = [sys.executable, "-m", "tests.fake_upstream", "--port", "0"]
        process, log = targets.spawn("fake-upstream", argv, self.workdir)
        port = targets._read_ready(process, 60)
        self.upstream = targets.Service("fake-upstream", process, port or 0, log)
        self.services.append(self.upstream)
        if port is None:
            raise targets.StartError(f"fake upstream did not start:\n{self.upstream.log_tail()}")
        return self

    def __exit__(self, *_: object) -> None:
        self.client.close()
        for service in reversed(self.services):
            service.stop()

    def _gateway(self, models: Sequence[tuple[str, int]], name: str) -> targets.Service:
        config = gateway_config(self.upstream.origin, models, self.policy)
        service = targets.start_gateway(self.workdir, json.dumps(config), name=name, root=self.root)
        self.services.append(service)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if not service.alive():
                break
            try:
                if self.client.get(f"{service.origin}/healthz", timeout=2).status_code == 200:
                    return service
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise targets.StartError(f"{name} did not start:\n{service.log_tail()}")

    def measure(self, sessions: Sequence[Session], fractions: Sequence[float]) -> list[Case]:
        """Each (session, fraction) with the window that cuts it there."""
        probe = self._gateway([(PROBE_MODEL, PROBE_WINDOW)], "gateway-probe")
        cases = []
        for s in sessions:
            last = list(s.requests())[-1]
            plan = self._plan(probe, dict(last, model=PROBE_MODEL), s.api)
            regions = plan["tokens_by_region"]
            full = int(plan["tokens_before"]) - int(regions.get("tools", 0))
            outside = PROBE_WINDOW - int(plan["budget"]) - int(plan["reserved_output"])
            for fraction in fractions:
                limit = math.ceil(full * fraction / TARGET_RATIO)
                window = limit + outside + MAX_OUTPUT
                if MAX_OUTPUT > window // 2:  # the reserve is then half the window (design D2.2)
                    window = 2 * (limit + outside)
                name = f"{s.id}-{round(fraction * 100)}"
                cases.append(Case(s, fraction, name, window=window, full=full, outside=outside))
        probe.stop()
        self.services.remove(probe)
        return cases

    def _plan(self, gateway: targets.Service, body: JSON, api: str) -> JSON:
        response = self.client.post(
            f"{gateway.origin}/v1/compactgate/plan",
            params={"api": api},
            json=body,
            headers=_headers(api),
        )
        response.raise_for_status()
        plan: JSON = response.json()
        return plan

    def run(self, cases: Sequence[Case]) -> Iterator[Case]:
        """Every request of every case through one gateway; each case yielded when done."""
        gateway = self._gateway([(c.model, c.window) for c in cases], "gateway")
        for n, case in enumerate(cases, 1):
            started = time.monotonic()
            bodies = list(case.session.requests())
            plan = self._plan(gateway, dict(bodies[-1], model=case.model), case.session.api)
            case.target, case.limit = int(plan["target"]), int(plan["budget"])
            regions = plan["tokens_by_region"]
            case.tools = (
                int(plan["tokens_after"]) - int(regions["system"]) - int(regions["history"])
            )
            for body in bodies:
                case.sent.append(
                    self._send(gateway, dict(body, model=case.model), case.session.api)
                )
            case.seconds = time.monotonic() - started
            self.log(
                f"[{n}/{len(cases)}] {case.model}: {len(bodies)} requests, {case.seconds:.1f} s"
            )
            yield case

    def _send(self, gateway: targets.Service, body: JSON, api: str) -> Sent:
        url = f"{gateway.origin}{shapes.PATH[api]}"
        error = ""
        try:
            with self.client.stream("POST", url, json=body, headers=_headers(api)) as response:
                data = response.read()
                status, headers = response.status_code, dict(response.headers)
        except httpx.HTTPError as exc:
            status, headers, data, error = 0, {}, b"", repr(exc)
        if status != 200 and not error:
            error = data[:400].decode("utf-8", "replace")
        records = self.client.get(f"{self.upstream.origin}/_fake/requests").json()
        self.client.post(f"{self.upstream.origin}/_fake/reset")
        upstream = [r["json"] for r in records if r.get("method") == "POST" and r.get("json")]
        return Sent(status, headers, body, upstream, error)


def _headers(api: str) -> dict[str, str]:
    if api == "messages":
        return {"x-api-key": "sk-corpus", "anthropic-version": "2023-06-01"}
    return {"authorization": "Bearer sk-corpus"}
