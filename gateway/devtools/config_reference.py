"""The configuration reference (docs/configuration.md), generated from the config model.

The rule it owns: the reference lists exactly the keys `gateway.config.Config` (and each policy
step's config in `policies.registry.STEPS`) accepts, with the type and default the model
declares; what each key does comes from its comment in config.example.yaml, else from the
field's description. tests/test_docs.py fails when docs/configuration.md differs from what this
writes, so a key added, renamed or removed shows up in the reference in the same commit:

    python -m gateway.devtools.config_reference > docs/configuration.md
"""

from __future__ import annotations

import json
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from gateway.config import Config
from policies.registry import DEFAULT_STEPS, STEPS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config.example.yaml"
INTRO = """# Configuration reference

Every key the gateway's config accepts, with its type, its default and what it does. The config
is YAML (JSON loads too); `compactgate check-config FILE` validates one and names every problem
with its YAML path. `config.example.yaml` shows every key in place with a comment. Strings may
use `${VAR}` (required) and `${VAR:-default}`. Unknown keys are errors.

`<name>` stands for a name you choose (a policy's), `[]` for each item of a list.
This page is generated from the config model (`python -m gateway.devtools.config_reference >
docs/configuration.md`); `tests/test_docs.py` fails when a key is missing here or listed here
but unknown to the gateway.
"""


HEADER = "| key | type | default | what it does |"
RULE = "|---|---|---|---|"


@dataclass(frozen=True)
class Key:
    path: str
    type: str
    default: str
    what: str


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        joined = " or ".join(names)
        return f"{joined} or null" if type(None) in args else joined
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) if isinstance(a, str) else str(a) for a in args)
    if origin is list:
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return "map"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return ""
    if isinstance(value, (list, tuple)) and any(isinstance(v, BaseModel) for v in value):
        return f"{len(value)} built in"
    return f"`{json.dumps(value)}`"


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The config sections an annotation holds (a model, a list or map of them)."""
    found: list[type[BaseModel]] = []
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    for arg in typing.get_args(annotation):
        found += _models(arg)
    return found


def _container(annotation: Any) -> str:
    """`[]` for a list of sections, `.<name>` for a map of them, `` for one."""
    for arg in (annotation, *typing.get_args(annotation)):
        origin = typing.get_origin(arg)
        if origin is list:
            return "[]"
        if origin is dict:
            return ".<name>"
    return ""


def walk(model: type[BaseModel], prefix: str, seen: dict[type, str]) -> Iterator[Key]:
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        sections = _models(field.annotation)
        if name == "steps" and prefix.startswith("policies."):
            yield Key(path, "list of steps", "the default chain", "")
            continue
        yield Key(path, _type_name(field.annotation), _default(field), field.description or "")
        for section in sections:
            inner = f"{path}{_container(field.annotation)}"
            if section in seen:
                yield Key(f"{inner}.*", "", "", f"the keys of `{seen[section]}`")
                continue
            seen[section] = inner
            yield from walk(section, f"{inner}.", seen)


def step_keys() -> Iterator[tuple[str, list[Key]]]:
    for type_name in sorted(STEPS):
        config_cls = STEPS[type_name][0]
        keys = [
            Key(f"steps[].{name}", _type_name(f.annotation), _default(f), f.description or "")
            for name, f in config_cls.model_fields.items()
            if name != "type"
        ]
        yield type_name, keys


# -- comments of config.example.yaml ---------------------------------------------------------

_KEY = re.compile(r"^(\s*)(- )?([A-Za-z_][\w]*):(.*)$")


def example_comments(text: str) -> dict[str, str]:
    """Each key path of the example file (`policies.<name>.trigger_ratio`, `step:fifo.x`) with
    the comment beside it and the comment lines continuing it."""
    comments: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    step: str | None = None
    last: str | None = None
    started = False
    for line in text.splitlines():
        if line.startswith("# ") and started and _KEY.match(line[2:]):
            line = line[2:]  # a commented-out example of an optional section (auth)
        started = started or (not line.startswith("#") and bool(line.strip()))
        match = _KEY.match(line)
        if match is None:
            column = line.find("#")
            if last and column >= 20:  # a comment continued at the comment column
                more = line[column:].lstrip("#").strip()
                comments[last] = f"{comments[last]} {more}".strip()
            elif line.strip() and not line.lstrip().startswith("#"):
                last = None
            continue
        indent, dash, key, rest = match.groups()
        depth = len(indent) + (2 if dash else 0)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents = [k for _, k in stack]
        if dash and parents and not parents[-1].endswith("[]"):
            parents[-1] += "[]"
            stack[-1] = (stack[-1][0], parents[-1])
        if key == "type" and dash and parents and parents[-1] == "steps[]":
            step = rest.split("#")[0].strip()
        path = ".".join([*parents, key])
        path = re.sub(r"^policies\.[^.]+", "policies.<name>", path)
        if path.startswith("policies.<name>.steps[]."):
            path = f"step:{step}.{key}"
        comment = rest.split("#", 1)[1].strip() if "#" in rest else ""
        if comment and path not in comments:
            comments[path] = comment
        last = path if comment else None
        stack.append((depth, key))
    return comments


# -- the page --------------------------------------------------------------------------------


def _row(key: Key, what: str, shown: str) -> str:
    cell = what.replace("|", "\\|")
    return f"| `{shown}` | {key.type} | {key.default} | {cell} |"


def reference() -> str:
    comments = example_comments(EXAMPLE.read_text(encoding="utf-8"))
    out = [INTRO]
    keys = list(walk(Config, "", {}))
    sections: dict[str, list[Key]] = {}
    for key in keys:
        sections.setdefault(key.path.split(".")[0].split("[")[0], []).append(key)
    for section, rows in sections.items():
        out += [f"## `{section}`", "", HEADER, RULE]
        for key in rows:
            what = comments.get(key.path, "") or key.what
            out.append(_row(key, what, key.path))
        out.append("")
    out += [
        "## Policy steps",
        "",
        "Each item of `policies.<name>.steps` is `{type: <step>, ...}` with that step's keys;",
        "a policy without `steps` runs the default chain ("
        + ", ".join(f"`{step.type}`" for step in DEFAULT_STEPS)
        + ").",
        "",
    ]
    for type_name, rows in step_keys():
        out += [f"### `{type_name}`", ""]
        if not rows:
            out += ["No keys besides `type`.", ""]
            continue
        out += [HEADER, RULE]
        for key in rows:
            name = key.path.split(".", 1)[1]
            what = comments.get(f"step:{type_name}.{name}", "") or key.what
            out.append(_row(key, what, name))
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


if __name__ == "__main__":
    print(reference(), end="")
