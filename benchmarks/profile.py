"""Sampling profiles of the gateway under a case's load, with py-spy, summarised as text.

`py-spy record --nonblocking --format raw` writes collapsed stacks (`frame;frame;... count`),
one line per distinct stack; `summarise` turns them into the hottest lines (self time), the
hottest functions of our own code (inclusive time) and of everything else, which is what the
report shows for each missed target.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

OWN_CODE = ("gateway/", "policies/")
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^():]*)(?::(?P<line>\d+))?\)$")
_RUNTIME = (
    "runpy",
    "asyncio/runners.py",
    "uvicorn/main.py",
    "uvicorn/server.py",
    "uvicorn/_compat.py",
    "gateway/cli.py",
    "gateway/__main__.py",
)
# A sample whose innermost Python frame is the loop runner is in uvloop's C code: waiting in
# epoll or doing socket I/O for a callback. py-spy cannot tell the two apart, so those samples
# are counted apart and left out of the percentages.
_LOOP_LEAF = "asyncio/runners.py"


def _function(frame: str) -> tuple[str, str]:
    """(`function (file)`, file) of a py-spy frame `function (file:line)`."""
    match = _FRAME.match(frame)
    if match is None:
        return frame, ""
    path = match.group("file")
    short = _short_path(path)
    return f"{match.group('func')} ({short})", short


def _short_path(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker == "/lib/python3":
                path = path.split("/", 1)[1] if "/" in path else path
    for own in OWN_CODE:
        index = path.find(own)
        if index >= 0:
            return path[index:]
    return path


def summarise(collapsed: str, top: int = 12) -> list[str]:
    """Text lines: hottest lines (self), our functions (inclusive), others (inclusive)."""
    self_time: Counter[str] = Counter()
    own: Counter[str] = Counter()
    other: Counter[str] = Counter()
    total = in_loop = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        leaf = frames[-1]
        if _LOOP_LEAF in leaf:
            in_loop += count
            continue
        total += count
        match = _FRAME.match(leaf)
        if match is not None:
            where = f"{_short_path(match.group('file'))}:{match.group('line')}"
            leaf = f"{match.group('func')} ({where})"
        self_time[leaf] += count
        seen: set[str] = set()
        for frame in frames:
            function, path = _function(frame)
            if function in seen or any(path.endswith(r) or r in path for r in _RUNTIME):
                continue
            seen.add(function)
            (own if path.startswith(OWN_CODE) else other)[function] += count
    if not total:
        return ["(no samples)"]

    def block(title: str, counter: Counter[str]) -> list[str]:
        rows = [f"{title}:"]
        rows += [f"  {100 * n / total:5.1f}%  {name}" for name, n in counter.most_common(top)]
        return rows

    return [
        f"{total} samples in Python code (100 %); {in_loop} more in the event loop's C code "
        "(epoll wait or socket I/O), left out",
        *block("hottest lines (self time)", self_time),
        *block("gateway/ and policies/ functions (inclusive)", own),
        *block("library functions (inclusive)", other),
    ]


async def record(
    py_spy: str, pid: int, seconds: float, out: Path, drive: Callable[[], Awaitable[object]]
) -> tuple[str, str | None]:
    """Run `drive()` while py-spy samples `pid` for `seconds`: (collapsed stacks, problem)."""
    process = await asyncio.create_subprocess_exec(
        py_spy,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(max(1, round(seconds))),
        "--rate",
        "250",
        "--format",
        "raw",
        "--nonblocking",
        "--output",
        str(out),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    await asyncio.sleep(0.5)  # let it attach
    await drive()
    try:
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=seconds + 30)
    except TimeoutError:
        process.kill()
        await process.wait()
        return "", "py-spy did not finish in time"
    if process.returncode != 0 or not out.exists():
        return "", "py-spy failed: " + stderr.decode(errors="replace").strip()[-300:]
    return out.read_text(errors="replace"), None
