"""Any replica serves any turn (issue 41, design D13.3): a long agent session sent round-robin over
three `compactgate serve` processes sharing one real redis-server forwards what one replica
forwards, body for body, to the fake upstream.

The session, in Chat Completions, is an agent's: a task, then shell calls whose outputs are
long, every turn resending the whole history. Inside it:

- the upstream's real window is smaller than the configured one: one turn gets a context error,
  is compacted again and retried, and the window learnt there is the one every replica uses
  from the next turn (else each would be refused once);
- compaction masks tool outputs and holds its result between events: the replica a turn lands
  on extends the event another replica made (else it would compact anew);
- the model reads a masked output back with the expansion tool, on a replica that did not mask
  it;
- the agent compacts (a signature configured for it): its first compaction is forwarded and
  teaches the gateway; in its next conversation, the summary the gateway makes ahead of need
  on one replica answers the agent's compaction on another.

The same session goes through one replica, then through three in turn, each run on a Redis of
its own; the bodies the upstream got during each turn must be the same. The replicas read what
the others learnt every `store_sync_s` (0.1 s here); each turn is given that long (and the time
for what it starts in the background) before the next, as an agent's own pace would.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import httpx
import pytest

from gateway.devtools.echo_upstream import estimate_prompt_tokens
from tests.conftest import GatewayProcess, GatewayStarter, Starter
from tests.fake_upstream import FakeUpstream
from tests.redis_server import start_redis

pytestmark = pytest.mark.slow

KEY = {"authorization": "Bearer sk-round-robin"}
PROMPT = "COMPACT THE CONVERSATION NOW and write a summary for the next model."
UPSTREAM_LIMIT = 5000  # the upstream's real window, in its own tokens (the config says 9000)
SYNC_S = 0.1
PAUSE_S = 0.6  # after each turn: several sync periods, and what the turn started in the background
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
    }
]


def config(upstream: FakeUpstream, store: str) -> dict[str, Any]:
    return {
        "store": store,
        "store_sync_s": SYNC_S,
        "tool_outputs": {"ref_secret": "round-robin-test-secret"},
        "agent_compaction": {
            "signatures": [{"name": "tester", "api": "chat", "starts_with": PROMPT[:28]}]
        },
        "models": [
            {
                "name": "m",
                "upstream": {"base_url": upstream.base_url},
                "context_window": 9000,
                "max_output_tokens": 200,
                "tokenizer": "chars:4",
                "policy": "p",
            }
        ],
        "policies": {
            "p": {
                "steps": [
                    {"type": "tool_output_cache", "context_budget_tokens": 300},
                    {"type": "fifo"},
                ]
            }
        },
    }


def history(task: str, steps: int) -> list[dict[str, Any]]:
    """An agent's history after `steps` shell calls: each output ~1,600 characters, its lines
    telling the step apart."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the shell tool. " * 10},
        {"role": "user", "content": task},
    ]
    for step in range(steps):
        call = {
            "id": f"call_{step}",
            "type": "function",
            "function": {"name": "shell", "arguments": json.dumps({"cmd": f"make step{step}"})},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        lines = [f"step {step} line {n}: build output for module_{n % 7}" for n in range(40)]
        messages.append(
            {"role": "tool", "tool_call_id": f"call_{step}", "content": "\n".join(lines)}
        )
    return messages


def body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "m", "messages": messages, "tools": TOOLS, "max_tokens": 200}


def compaction(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return body([*messages, {"role": "user", "content": PROMPT}])


def masked_ref(records: Sequence[dict[str, Any]]) -> str:
    """A ref of a masked output in the latest body the upstream got that has one."""
    for record in reversed(records):
        for message in (record.get("json") or {}).get("messages") or []:
            content = message.get("content")
            if message.get("role") == "tool" and isinstance(content, str) and "ref=" in content:
                return content.split("ref=")[1].split("]")[0].split(":")[0]
    raise AssertionError("no masked tool output was forwarded")


def read_call(ref: str) -> dict[str, Any]:
    arguments = {"ref_id": ref, "offset": 10, "limit": 3}
    call = {"id": "call_read", "function": {"name": "tool_output_cache", "arguments": arguments}}
    return {"kind": "tool_calls", "tool_calls": [call]}


class Run:
    """One run of the session over `replicas`, turn by turn, round-robin."""

    def __init__(self, replicas: Sequence[GatewayProcess], upstream: FakeUpstream) -> None:
        self.replicas = replicas
        self.upstream = upstream
        self.turn = 0
        self.turns: list[list[str]] = []  # per turn: the bodies the upstream got, canonical
        self.answers: list[tuple[int, int, str]] = []  # replica, status, agent header
        self.http = httpx.Client(timeout=60)

    def send(self, payload: dict[str, Any]) -> httpx.Response:
        replica = self.turn % len(self.replicas)
        self.turn += 1
        before = len(self.upstream.requests())
        url = f"{self.replicas[replica].base_url}/chat/completions"
        response = self.http.post(url, headers=KEY, json=payload)
        time.sleep(PAUSE_S)
        self.upstream.wait_idle()
        records = self.upstream.requests()[before:]
        self.turns.append(sorted(json.dumps(r["json"], sort_keys=True) for r in records))
        header = response.headers.get("x-compactgate-agent-compaction", "")
        self.answers.append((replica, response.status_code, header))
        return response

    def windows(self) -> list[int]:
        return [
            self.http.get(f"{r.base_url}/models/m").json()["context_window"] for r in self.replicas
        ]

    def metric(self, replica: GatewayProcess, series: str) -> float:
        text = self.http.get(f"{replica.url}/metrics").text
        return sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series)
        )


def session(run: Run) -> None:
    """The agent's two conversations (module docstring)."""
    upstream = run.upstream
    upstream.configure({"context_limit": UPSTREAM_LIMIT})
    first = "Fix the failing build in the gateway package."
    for steps in range(1, 15):
        assert run.send(body(history(first, steps))).status_code == 200
        if steps == 12:  # masked outputs by now: the model reads one back on the next turn
            upstream.script([read_call(masked_ref(upstream.requests())), {"kind": "ok"}])
    assert run.send(compaction(history(first, 15))).status_code == 200  # forwarded, learnt
    second = "Now make the tests pass in the store package."
    for steps in range(1, 15):
        assert run.send(body(history(second, steps))).status_code == 200
    assert run.send(compaction(history(second, 15))).status_code == 200  # answered


def replicas_on_redis(
    count: int,
    start_gateway: GatewayStarter,
    start_process: Starter,
    upstream: FakeUpstream,
) -> list[GatewayProcess]:
    redis = start_redis(start_process)
    return [start_gateway(config(upstream, redis.url)) for _ in range(count)]


@pytest.fixture
def single(
    start_gateway: GatewayStarter, start_process: Starter, fake_upstream: FakeUpstream
) -> Run:
    run = Run(replicas_on_redis(1, start_gateway, start_process, fake_upstream), fake_upstream)
    session(run)
    return run


def test_a_session_round_robin_over_three_replicas_forwards_what_one_replica_does(
    single: Run, start_gateway: GatewayStarter, start_process: Starter, fake_upstream: FakeUpstream
) -> None:
    # What one replica did: the interesting things happened, once each.
    limit = UPSTREAM_LIMIT
    refused = [t for t in single.turns if any(_size(b) > limit for b in t)]
    assert len(refused) == 1  # one context error in the whole session, then the learnt window
    assert any('"call_read"' in b for t in single.turns for b in t)  # a masked output read back
    agent = [header for _, _, header in single.answers if header]
    assert agent == ["tester; forwarded", "tester; answered"]

    fake_upstream.reset()
    replicas = replicas_on_redis(3, start_gateway, start_process, fake_upstream)
    spread = Run(replicas, fake_upstream)
    session(spread)

    assert spread.windows() == [single.windows()[0]] * 3 and single.windows()[0] < 9000
    assert [h for _, _, h in spread.answers if h] == agent
    assert len(spread.turns) == len(single.turns)
    for turn, (one, three) in enumerate(zip(single.turns, spread.turns, strict=True)):
        assert three == one, f"turn {turn}: the upstream got other bodies round-robin"
    # The agent's compaction was answered, from the store, by another replica than the one
    # that made the summary (on the turn before the last that started one).
    made = [t for t, bodies in enumerate(spread.turns) if any(PROMPT in b for b in bodies)]
    maker, answerer = spread.answers[made[-1]][0], spread.answers[-1][0]
    assert maker != answerer
    answered = 'compactgate_agent_compactions_total{agent="tester",outcome="answered"}'
    assert spread.metric(replicas[answerer], answered) == 1


def _size(canonical: str) -> int:
    return estimate_prompt_tokens(json.loads(canonical))


def test_replicas_whose_redis_stops_half_way_go_on_with_what_each_learnt(
    start_gateway: GatewayStarter, start_process: Starter, fake_upstream: FakeUpstream
) -> None:
    """Redis stops half-way through the session (design D13.1, D13.3): every turn is still
    answered, each replica going on with what it holds itself."""
    redis = start_redis(start_process)
    replicas = [start_gateway(config(fake_upstream, redis.url)) for _ in range(3)]
    run = Run(replicas, fake_upstream)
    fake_upstream.configure({"context_limit": UPSTREAM_LIMIT})
    task = "Fix the failing build in the gateway package."
    statuses = []
    for steps in range(1, 15):
        if steps == 7:
            redis.stop()
        statuses.append(run.send(body(history(task, steps))).status_code)
    statuses.append(run.send(compaction(history(task, 15))).status_code)
    assert statuses == [200] * 15
    assert run.answers[-1][2] == "tester; forwarded"
    assert all(w < 9000 for w in run.windows())  # each learnt the window, or was told before
