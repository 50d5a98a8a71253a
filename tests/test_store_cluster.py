"""Redis Cluster as the store (design D13.5), with real processes: three masters made with
`redis-cli --cluster create`, shared by this module's tests (`slow`).

- every store operation works on keys that live on different nodes (no CROSSSLOT, no MOVED
  left to the caller), and one conversation's keys share a slot;
- two gateway replicas from the CLI on the cluster: a tool output masked on one expands on the
  other; two in-process replicas share each message's count (many keys in one round trip)
  without a store error.
"""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest
import redis

from gateway.ops.metrics import Metrics
from gateway.store import RedisStore, conversation_key, open_store
from tests.conftest import GatewayStarter, Starter
from tests.fake_upstream import FakeUpstream
from tests.in_process import AppStarter, LocalUpstream
from tests.redis_server import ClusterSet, start_cluster
from tests.test_counting import eventually, exact_tokens, gpt, plan, post
from tests.test_counting import history as counted_history
from tests.test_metrics import metric, scrape
from tests.test_store_sentinel import expand, masked_ref_for, other_history
from tests.test_tool_outputs_e2e import LOG_LINES, config_for, history, masked_ref_of_process

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(start_module_process: Starter, tmp_path_factory: pytest.TempPathFactory) -> ClusterSet:
    return start_cluster(start_module_process, tmp_path_factory.mktemp("cluster"))


def node_of(cluster: ClusterSet, key: str) -> int:
    """The port of the node holding `key`'s slot."""
    port = next(iter(cluster.nodes))
    with redis.RedisCluster(host="127.0.0.1", port=port) as client:
        node = client.get_node_from_key("compactgate:" + key)
    return int(node.port)


async def test_every_operation_works_on_keys_spread_over_the_nodes(cluster: ClusterSet) -> None:
    keys = [f"count:t:{n}" for n in range(40)]
    assert len({node_of(cluster, key) for key in keys}) == 3  # the batch spans every node
    store = RedisStore(cluster.url)
    other = RedisStore(cluster.url)
    try:
        await store.put_many([(key, key.encode()) for key in keys], 60)
        assert await other.get_many(keys) == [key.encode() for key in keys]
        assert await other.touch_many([*keys, "count:t:none"], 60) == [True] * 40 + [False]
        assert await store.put_new("secret", b"a", None) is None
        assert await other.put_new("secret", b"b", None) == b"a"
        lock = await store.lock("lock:x", 5)
        assert lock is not None and await other.lock("lock:x", 5) is None
        await store.release(lock)
        assert await other.lock("lock:x", 5) is not None
        assert [await s.incr("n", 60) for s in (store, other, store)] == [1, 2, 3]
        await store.delete(keys[0])
        assert await other.get(keys[0]) is None
        await store.ping()
    finally:
        await store.close()
        await other.close()


def test_one_conversations_keys_share_a_slot(cluster: ClusterSet) -> None:
    names = ["window", "calibration", "compaction", "summary:1", "summary:2"]
    nodes = {node_of(cluster, conversation_key("tenant-a", "conv-1", n)) for n in names}
    assert len(nodes) == 1
    port = next(iter(cluster.nodes))
    with redis.RedisCluster(host="127.0.0.1", port=port) as client:
        slots = {client.keyslot("compactgate:" + conversation_key("t", "c", n)) for n in names}
        spread = {
            client.keyslot("compactgate:" + conversation_key("t", f"c{i}", "w")) for i in range(50)
        }
    assert len(slots) == 1
    assert len(spread) > 40  # conversations themselves spread over the slots
    assert "{" not in conversation_key("{odd}", "}x{", "w").split("}", 1)[1]  # one tag only


async def test_a_safe_store_on_the_cluster_reports_no_error(cluster: ClusterSet) -> None:
    metrics = Metrics()
    store = open_store(cluster.url, metrics)
    try:
        assert await store.put_many([(f"k{n}", b"v") for n in range(30)], 60)
        assert await store.get_many([f"k{n}" for n in range(30)]) == [b"v"] * 30
        assert store.reachable
        assert (
            metrics.registry.get_sample_value("compactgate_store_errors_total", {"op": "get"})
            is None
        )
    finally:
        await store.close()


def store_errors(base_url: str) -> float:
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("compactgate_store_errors_total")
    )


def test_two_replicas_share_tool_outputs_on_the_cluster(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, cluster: ClusterSet
) -> None:
    config = config_for(fake_upstream, store=cluster.url)
    first, second = start_gateway(config), start_gateway(config)
    ref = masked_ref_of_process(first)
    assert masked_ref_of_process(second) == ref
    assert LOG_LINES[123] in expand(first, fake_upstream, ref, history(), "disk full")
    other = other_history("cluster")
    other_ref = masked_ref_for(second, other)
    assert LOG_LINES[123] in expand(second, fake_upstream, ref, other, "disk full")
    assert "cluster line 77: FATAL" in expand(first, fake_upstream, other_ref, history(), "FATAL")
    assert store_errors(first.base_url) == store_errors(second.base_url) == 0


async def test_counts_shared_through_the_cluster_are_found_by_another_replica(
    start_app: AppStarter, local_upstream: LocalUpstream, cluster: ClusterSet
) -> None:
    """Each message's count is kept under its own key (keys on every node), read back by the
    other replica in one batch."""
    config = {"store": cluster.url, "models": [gpt(local_upstream, 1_000_000)]}
    one, two = await start_app(config), await start_app(config)
    messages = counted_history("cluster")
    exact = exact_tokens(messages)
    assert (await post(one, orjson.dumps({"model": "m", "messages": messages}))).status_code == 200

    async def counted() -> bool:
        return metric(await scrape(one), "compactgate_tokens_before_total", model="m") == exact

    await eventually(counted)
    await asyncio.sleep(0.2)  # the counts are written to the store without waiting for it
    assert (await plan(two, messages))["tokens_before"] == exact
    other = two.app.core.engine.counting
    assert other.shared > 50  # found in the cluster, not counted again
    for gateway in (one, two):
        assert metric(await scrape(gateway), "compactgate_store_errors_total", op="get") == 0
