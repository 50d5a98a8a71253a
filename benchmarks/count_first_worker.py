"""Times one checkout's `Pipeline.prepare` on first-seen requests that must be counted first.

Started by `benchmarks.bench_count_first` as `python count_first_worker.py N OFFSET` with
PYTHONPATH set to the checkout under test, so it runs that checkout's gateway code (and its
`benchmarks.workloads`). Each of the N requests is the 200-message agent body with every message
new (numbers OFFSET to OFFSET + N - 1), sent to the 128k model whose trigger the body's byte
bound reaches, prepared as a served request is (`count_late`); the rest of its count is awaited
before the next one, as at one request at a time. Prints the median wall and CPU ms per request.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

from benchmarks import targets, workloads
from gateway.config import parse_config
from gateway.devtools.parts import parts
from gateway.wire import CHAT

CONFIG = {
    "models": [
        {
            "name": targets.COUNT_MODEL,
            "upstream": {"base_url": "http://127.0.0.1:9/v1"},
            "context_window": targets.COUNT_WINDOW,
            "max_output_tokens": 1024,
            "tokenizer": "tiktoken:o200k_base",
        }
    ]
}


async def run(requests: int, offset: int) -> tuple[float, float]:
    gateway = parts(parse_config(CONFIG))
    route = gateway.router.resolve(targets.COUNT_MODEL)
    assert route is not None
    body = workloads.agent(targets.COUNT_MODEL)
    walls, cpus = [], []
    try:
        for number in range(offset, offset + requests):
            raw = body.first_time(number)
            wall, cpu = time.perf_counter(), time.process_time()
            request = CHAT.parse(raw, 100_000)
            prepared = await gateway.engine.prepare(
                request, route, "t", window=gateway.effective_window(route), count_late=True
            )
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
            if prepared.late is not None:
                await asyncio.wait([prepared.late])
    finally:
        await gateway.engine.counting.close()
    return statistics.median(walls) * 1000, statistics.median(cpus) * 1000


if __name__ == "__main__":
    wall, cpu = asyncio.run(run(int(sys.argv[1]), int(sys.argv[2])))
    print(f"{wall:.3f} {cpu:.3f}")
