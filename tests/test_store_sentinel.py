"""Redis Sentinel as the store (design D13.5), with real processes: a master, two replicas and
three `redis-server --sentinel` processes, shared by this module's tests (`slow`).

- the store reaches the master through the sentinels and follows a failover: writes resume on
  the new master, what Redis replicated before it is still read (measured: seconds from the
  master's death to the first write that succeeds);
- three gateway replicas from the CLI on the set: a tool output masked on one expands on
  another; after `SENTINEL FAILOVER` mid-run, old refs still expand and new ones are written.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

from gateway.ops.metrics import Metrics
from gateway.store import open_store
from tests.conftest import GatewayProcess, GatewayStarter, Starter
from tests.fake_upstream import FakeUpstream
from tests.redis_server import SentinelSet, start_sentinel_set
from tests.test_tool_outputs_e2e import (
    CLIENT_TOOLS,
    LOG_LINES,
    config_for,
    history,
    internal_call,
    masked_ref_of_process,
    tool_results,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sentinels(
    start_module_process: Starter, tmp_path_factory: pytest.TempPathFactory
) -> SentinelSet:
    return start_sentinel_set(start_module_process, tmp_path_factory.mktemp("sentinel"))


def other_history(tag: str) -> list[dict[str, Any]]:
    """The conversation of `history()` whose big log is another one (another ref)."""
    lines = [
        f"{tag} line {n}: all good, nothing to report from this host today" for n in range(400)
    ]
    lines[77] = f"{tag} line 77: FATAL quota exceeded"
    return [
        {**m, "content": "\n".join(lines)} if m.get("tool_call_id") == "call_0" else m
        for m in history()
    ]


def expand(
    gateway: GatewayProcess,
    upstream: FakeUpstream,
    ref: str,
    messages: list[dict[str, Any]],
    pattern: str,
) -> str:
    """`messages` sent through `gateway`, the model grepping `ref`: the tool result it got."""
    import openai

    upstream.reset()
    upstream.script(
        [
            internal_call("tool_output_cache_grep", ref_id=ref, pattern=pattern),
            {"kind": "ok", "content": "done"},
        ]
    )
    chat = openai.OpenAI(base_url=gateway.base_url, api_key="sk-tenant-a", max_retries=0)
    answer = chat.chat.completions.create(model="m", messages=messages, tools=CLIENT_TOOLS)
    assert answer.choices[0].message.content == "done"
    [result] = tool_results(upstream.chat_requests()[1])
    return result


def masked_ref_for(gateway: GatewayProcess, messages: list[dict[str, Any]]) -> str:
    import httpx

    from tests.test_tool_outputs_e2e import ref_in

    plan = httpx.post(
        f"{gateway.base_url}/compactgate/plan",
        json={"model": "m", "messages": messages, "tools": CLIENT_TOOLS},
        headers={"authorization": "Bearer sk-tenant-a"},
        timeout=20,
    )
    return ref_in(plan.json())


def test_three_replicas_share_tool_outputs_across_a_failover(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, sentinels: SentinelSet
) -> None:
    config = config_for(fake_upstream, store=sentinels.url)
    replicas = [start_gateway(config) for _ in range(3)]
    ref = masked_ref_of_process(replicas[0])
    assert {masked_ref_of_process(r) for r in replicas} == {ref}  # one key for the three

    # Masked (and stored) on the first, expanded through the second, which masks another.
    assert LOG_LINES[123] in expand(replicas[0], fake_upstream, ref, history(), "disk full")
    other = other_history("before")
    other_ref = masked_ref_for(replicas[1], other)
    assert LOG_LINES[123] in expand(replicas[1], fake_upstream, ref, other, "disk full")

    old_master = sentinels.master_port()
    assert sentinels.failover() != old_master

    # An old ref expands through a replica that never saw its output; none of them resends it.
    result = retried(lambda: expand(replicas[2], fake_upstream, other_ref, history(), "FATAL"))
    assert "before line 77: FATAL quota exceeded" in result

    # A new output is written (to the new master) and read through another replica. A write
    # made in the instant a replica still talked to the demoted master is lost when Redis
    # reconfigures it, as Redis loses it; the next resend stores it again (design D13.4).
    after = other_history("after")
    after_ref = masked_ref_for(replicas[2], after)

    def resend_then_read() -> str:
        expand(replicas[2], fake_upstream, ref, after, "disk full")  # stores it
        return expand(replicas[0], fake_upstream, after_ref, history(), "FATAL")

    assert "after line 77: FATAL quota exceeded" in retried(resend_then_read)


def retried(attempt: Any, timeout: float = 15.0) -> str:
    """`attempt()` until its result names no unknown ref (a replica that has not yet found the
    new master reads nothing, as during any outage), or `timeout`."""
    deadline = time.monotonic() + timeout
    while "unknown ref_id" in (result := attempt()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return str(result)


def holds(port: int, key: str) -> bool:
    with redis.Redis(port=port, socket_timeout=2) as client:
        return bool(client.exists("compactgate:" + key))


async def test_writes_follow_a_failover_and_resume_after_the_master_dies(
    sentinels: SentinelSet,
) -> None:
    """A forced failover leaves the old master taking writes until the sentinels reconfigure
    it (seconds later); writes sent there would be lost then. A store opened during the
    failover writes to the new master, one opened before follows within its check. Then the
    new master is killed (SIGKILL) and the sentinels promote a replica: writes resume."""
    before = open_store(sentinels.url, Metrics())
    try:
        assert await before.put("acked", b"before", None)
        old = sentinels.master_port()
        new = await asyncio.to_thread(sentinels.failover)

        during = open_store(sentinels.url, Metrics())
        assert await during.put("during", b"x", None)
        assert holds(new, "during") and not holds(old, "during")
        await during.close()

        moved = time.monotonic()
        while not (await before.put("followed", b"x", None) and holds(new, "followed")):
            assert time.monotonic() - moved < 5, "the open store kept writing to the old master"
            await asyncio.sleep(0.05)
        print(f"an open store wrote to the new master {time.monotonic() - moved:.2f} s after it")

        await asyncio.to_thread(sentinels.wait_replicated)
        master = sentinels.servers[new].popen
        master.kill()
        await asyncio.to_thread(master.wait, 5)
        killed = time.monotonic()
        while not await before.put("after", b"written", None):
            assert time.monotonic() - killed < 30, "writes never resumed"
            await asyncio.sleep(0.05)
        print(f"writes resumed {time.monotonic() - killed:.2f} s after the master was killed")
        assert await before.get("acked") == b"before"
        assert await before.get("followed") == b"x"
        assert await before.get("after") == b"written"
    finally:
        await before.close()
