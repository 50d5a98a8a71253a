"""`policies/` is a functional core: it imports no web framework, HTTP client, Redis,
Prometheus, litellm or asyncio, neither at import time nor lazily inside a function."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

FORBIDDEN = {"starlette", "aiohttp", "httpx", "redis", "prometheus_client", "litellm", "asyncio"}
ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "policies"


def test_importing_every_policy_module_loads_nothing_forbidden() -> None:
    modules = sorted(
        "policies." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py"
    )
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded = {name.split(".")[0] for name in json.loads(out.stdout)}
    assert not loaded & FORBIDDEN


def test_no_policy_source_imports_anything_forbidden() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []


def test_policy_modules_state_their_rule() -> None:
    for path in PACKAGE.rglob("*.py"):
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        assert docstring, f"{path} has no module docstring"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set[str]:
    """The policies modules `path` imports, at the top or inside a function."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(0, node.level - 1)):
                base = base.rpartition(".")[0]
            module = f"{base}.{node.module}" if node.level and node.module else node.module or base
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def test_policy_modules_import_each_other_without_a_cycle() -> None:
    """A cycle (even one closed by an import inside a function) means two modules that cannot
    be read, tested or changed one without the other."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {
        name: {m for m in _imports(path, name) if m in modules and m != name}
        for name, path in modules.items()
        if not path.name == "__init__.py"  # the package re-exports; its modules do not need it
    }
    done: set[str] = set()

    def visit(name: str, trail: tuple[str, ...]) -> None:
        assert name not in trail, "import cycle: " + " -> ".join([*trail, name])
        if name in done or name not in graph:
            return
        for imported in sorted(graph[name]):
            visit(imported, (*trail, name))
        done.add(name)

    for name in sorted(graph):
        visit(name, ())
