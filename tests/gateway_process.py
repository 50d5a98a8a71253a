"""A real `compactgate serve` shared by the tests of one module (the fixture in conftest.py starts
one per test, and a start costs seconds on a small machine).

    with gateway_process(config, tmp_path_factory.mktemp("gw")) as gateway:
        ...

The process is stopped (SIGTERM to its group, SIGKILL if it lingers) when the block exits, so a
module-scoped fixture built on this cannot leak a server either.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.conftest import GatewayProcess, free_port, serve_argv, start_process


@contextlib.contextmanager
def gateway_process(
    config: dict[str, Any],
    directory: Path,
    *,
    env: dict[str, str] | None = None,
    args: Sequence[str] = (),
) -> Iterator[GatewayProcess]:
    path = directory / "gateway.json"
    path.write_text(json.dumps(config))
    port = free_port()
    process = start_process(
        serve_argv(path, port, args),
        r"Uvicorn running on|CompactGate listening on",
        60,
        env={**os.environ, **(env or {})},
    )
    try:
        yield GatewayProcess(process, port, path)
    finally:
        process.stop()
