"""What replicas learn, shared through the store (design D13.3): learnt windows
(gateway/path/windows.py), the heuristic tokenizer's calibration (gateway/path/calibration.py)
and agents' compaction memory (gateway/agents/shared.py).

Each replica here is its own `Windows` or `Calibration` with its own `SafeStore` on one store: a
real redis-server, or (for the property, which runs hundreds of interleavings) one memory
backend the replicas' stores share. `SafeStore.sync` runs the checks a replica runs every
`store_sync_s`. The session-level check is tests/test_round_robin.py.
"""

from __future__ import annotations

import asyncio
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.agents.payback import Payback
from gateway.agents.shared import SharedMemory
from gateway.agents.timing import CompactionTiming, Point
from gateway.config import parse_config
from gateway.counting.tokenizers import CharsTokenizer
from gateway.ops.metrics import Metrics
from gateway.path.calibration import Calibration
from gateway.path.windows import Windows
from gateway.routing import Route, Router
from gateway.store import MemoryStore, SafeStore, open_store
from tests.conftest import Starter
from tests.redis_server import free_port, start_redis

CONFIGURED = 100_000


def route(tokenizer: str = "chars:4") -> Route:
    """The model `m` as one replica resolves it (each replica has its own)."""
    model = {
        "name": "m",
        "upstream": {"base_url": "http://127.0.0.1:9/v1"},
        "context_window": CONFIGURED,
        "tokenizer": tokenizer,
    }
    found = Router(parse_config({"models": [model]})).resolve("m")
    assert found is not None
    return found


def correction(model: Route) -> float:
    tokenizer = model.counter.tokenizer
    assert isinstance(tokenizer, CharsTokenizer)
    return tokenizer.correction


async def test_a_window_learnt_on_one_replica_is_used_by_the_others_after_one_sync(
    start_process: Starter,
) -> None:
    redis = start_redis(start_process)
    stores = [open_store(redis.url, Metrics()) for _ in range(3)]
    windows = [Windows(Metrics(), store) for store in stores]
    models = [route() for _ in stores]
    for w, m in zip(windows, models, strict=True):
        assert w.effective(m) == CONFIGURED
    windows[0].learn(models[0], 8_000, "test")
    windows[1].learn(models[1], 9_000, "test")  # learnt meanwhile, higher: it must not win
    for store in (*stores, *stores):  # each replica's next check, twice round
        await store.sync()
    assert [w.effective(m) for w, m in zip(windows, models, strict=True)] == [8_000] * 3
    # The largest prompt answered is shared too: a refusal without numbers of a prompt another
    # replica saw answered teaches nothing, as on one replica.
    windows[2].served(models[2], 7_000)
    await stores[2].sync()
    await stores[0].sync()
    windows[0].refused(models[0], 6_500, 100, "test")
    assert windows[0].effective(models[0]) == 8_000
    # A replica started later reads it at its first check.
    late_store = open_store(redis.url, Metrics())
    late, late_model = Windows(Metrics(), late_store), route()
    assert late.effective(late_model) == CONFIGURED
    await late_store.sync()
    assert late.effective(late_model) == 8_000
    for store in (*stores, late_store):
        await store.close()


ROUTES = [route() for _ in range(3)]
replica = st.integers(0, 2)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("learn"), replica, st.integers(1, 150_000)),
        st.tuples(st.just("sync"), replica, st.just(0)),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(steps)
def test_sharing_never_raises_a_replicas_window_and_ends_at_the_lowest_learnt(
    happened: list[tuple[str, int, int]],
) -> None:
    async def run() -> None:
        backend = MemoryStore(1 << 20)
        stores = [SafeStore(backend, Metrics(), shared=True) for _ in range(3)]
        windows = [Windows(Metrics(), store) for store in stores]
        models = ROUTES  # a window is never kept in the route: each replica may share one
        before = [w.effective(m) for w, m in zip(windows, models, strict=True)]
        learnt = [CONFIGURED]
        for kind, who, tokens in happened:
            if kind == "learn":
                windows[who].learn(models[who], tokens, "test")
                learnt.append(tokens)
            else:
                await stores[who].sync()
            now = [w.effective(m) for w, m in zip(windows, models, strict=True)]
            assert all(
                a is not None and b is not None and a <= b for a, b in zip(now, before, strict=True)
            )
            before = now
        for store in (*stores, *stores):
            await store.sync()
        assert [w.effective(m) for w, m in zip(windows, models, strict=True)] == [min(learnt)] * 3
        for store in stores:
            await store.close()

    asyncio.run(run())


def observations(count: int) -> list[tuple[int, int]]:
    """(estimated, reported) pairs: an upstream that counts ~30 % more than `chars:4`."""
    return [
        (1_000 + 37 * n, math.ceil((1_000 + 37 * n) * (1.3 + 0.01 * (n % 3)))) for n in range(count)
    ]


async def test_replicas_calibrate_as_one_process_would_from_the_same_responses(
    start_process: Starter,
) -> None:
    """The responses go to the replicas in turn: after each sync round every replica counts
    with the multiplier one process given them all would use."""
    redis = start_redis(start_process)
    stores = [open_store(redis.url, Metrics()) for _ in range(3)]
    replicas = [Calibration(Metrics(), store) for store in stores]
    models = [route() for _ in stores]
    alone, alone_model = Calibration(Metrics()), route()
    for n, (estimated, reported) in enumerate(observations(12)):
        who = n % 3
        replicas[who].observe(models[who], estimated, reported, correction(models[who]))
        alone.observe(alone_model, estimated, reported, correction(alone_model))
        await stores[who].sync()  # the observing replica's next check
        for store in stores:
            await store.sync()
        assert [correction(m) for m in models] == [correction(alone_model)] * 3
    assert correction(alone_model) != 1.0  # it did change
    for store in stores:
        await store.close()


async def test_without_the_store_each_replica_keeps_what_it_learnt_itself() -> None:
    """A store that does not answer (nothing listens on its port): learning and calibrating go
    on locally, as in a single process, and no request waits for the store."""
    store = open_store(f"redis://127.0.0.1:{free_port()}/0", Metrics())
    windows, model = Windows(Metrics(), store), route()
    windows.learn(model, 8_000, "test")
    await store.sync()  # fails: the outage begins
    assert store.down
    assert windows.effective(model) == 8_000
    calibration, calibrated = Calibration(Metrics(), store), route()
    alone, alone_model = Calibration(Metrics()), route()
    for estimated, reported in observations(6):
        calibration.observe(calibrated, estimated, reported, correction(calibrated))
        alone.observe(alone_model, estimated, reported, correction(alone_model))
    assert correction(calibrated) == correction(alone_model) != 1.0
    await store.close()


async def test_agents_memory_one_replica_wrote_is_the_next_ones_and_foreign_values_are_ignored(
    start_process: Starter,
) -> None:
    """gateway/agents/shared.py: the conversation's last ordinary request, its payback books and
    the agent's compaction point, written by one replica, are what another adopts; a value
    under those keys that is not ours is taken for nothing, never an error."""
    redis = start_redis(start_process)
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    replicas = []
    for _ in range(2):
        store = open_store(redis.url, Metrics())
        timing, payback = CompactionTiming(), Payback()
        replicas.append((store, timing, payback, SharedMemory(store, timing, payback)))
    (_, timing_a, payback_a, shared_a), (store_b, timing_b, payback_b, shared_b) = replicas
    here, there = ("t", "chat", 1), ("t", "chat", 7)  # each replica's own key for it
    timing_a.seen(here, 1_000)
    timing_a.seen(here, 1_400)
    payback_a.made(here, 900)
    await shared_a.save_seen("t", "chat", messages, here)
    await shared_a.save_books("t", "chat", messages, here)
    await shared_b.load("t", "chat", messages, there, "codex")
    assert timing_b.last(there) == timing_a.last(here)
    assert payback_b.books(there) == payback_a.books(here)
    timing_b.seen(there, 1_800)
    timing_b.compacted("t", "codex", there, 1_900)  # the bracket: 1 400 then 1 800
    await shared_b.save_compaction("t", "chat", messages, there, "codex")
    await shared_a.load("t", "chat", messages, here, "codex")
    assert timing_a.point("t", "codex") == timing_b.point("t", "codex")
    assert timing_a.point("t", "codex") == Point(1_900, 1_800, 1_400, 400)
    # Foreign values under the conversation's keys: nothing adopted, no error.
    seen_key = SharedMemory._key("t", "chat", messages, "seen")
    books_key = SharedMemory._key("t", "chat", messages, "books")
    await store_b.put(seen_key, b'{"v": 1, "seen": ["x", 1, 2]}', None)
    await store_b.put(books_key, b'{"v": 1, "made": "many", "lost": true}', None)
    fresh_timing, fresh_payback = CompactionTiming(), Payback()
    await SharedMemory(store_b, fresh_timing, fresh_payback).load(
        "t", "chat", messages, there, None
    )
    assert fresh_timing.last(there) is None
    assert fresh_payback.may_prepare(there)
    for store, *_ in replicas:
        await store.close()
