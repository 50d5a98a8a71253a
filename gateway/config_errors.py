"""A config's validation errors as its readers see them: `yaml.path: message` lines, an unknown
key with the nearest known one at its level ("did you mean ..."), LiteLLM's keys answered with how
to convert them. What the config's model is, `config.py` says; this only reads pydantic's errors
against it."""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ValidationError

from policies.registry import STEPS

# LiteLLM proxy config keys, answered with how to convert rather than a bare "unknown key".
LITELLM_KEYS = frozenset(
    {"model_list", "litellm_settings", "router_settings", "general_settings", "litellm_params"}
)
LITELLM_HINT = (
    "LiteLLM's proxy config is not read here; convert it with "
    "`compactgate import-litellm <litellm config.yaml>`, which writes this gateway's `models:`"
)


def format_validation_error(
    exc: ValidationError, root: type[BaseModel], grouped: type[Exception]
) -> list[str]:
    """pydantic errors as `yaml.path: message` lines (`root`: the config's model; `grouped`: a
    validator's error carrying its own `problems` lines)."""
    lines: list[str] = []
    for error in exc.errors():
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, grouped):
            lines.extend(getattr(cause, "problems", [str(cause)]))
        elif error.get("type") == "extra_forbidden":
            lines.append(f"{_format_loc(error['loc'])}: {_unknown_key(root, error['loc'])}")
        else:
            lines.append(f"{_format_loc(error['loc'])}: {_format_msg(error)}")
    return lines


def _unknown_key(root: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """ "unknown key", with the nearest key known at that level, or how to convert LiteLLM's."""
    key = str(loc[-1])
    if key in LITELLM_KEYS or (key == "model_name" and "models" in loc):
        return f"unknown key: {LITELLM_HINT}"
    known = known_keys(root, loc[:-1])
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f"unknown key (did you mean {close[0]!r}?)" if close else "unknown key"


def known_keys(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys a mapping at `loc` (a pydantic error location under `root`) may have."""
    node: Any = root
    for part in loc:
        node = _descend(node, part)
        if node is None:
            return []
    return [
        field.alias or name
        for option in _options(node)
        if isinstance(option, type) and issubclass(option, BaseModel)
        for name, field in option.model_fields.items()
    ]


def _options(node: Any) -> list[Any]:
    """A type annotation's alternatives: Optional, unions and Annotated unwrapped."""
    origin = typing.get_origin(node)
    if origin is Annotated:
        return _options(typing.get_args(node)[0])
    if origin is typing.Union or type(node).__name__ == "UnionType":
        return [o for arg in typing.get_args(node) for o in _options(arg)]
    return [node]


def _descend(node: Any, part: Any) -> Any:
    for option in _options(node):
        origin = typing.get_origin(option)
        if isinstance(option, type) and issubclass(option, BaseModel) and isinstance(part, str):
            field = option.model_fields.get(part)
            if field is not None:
                return field.annotation
        if origin is list and isinstance(part, int):
            return typing.get_args(option)[0]
        if origin is dict and isinstance(part, str):
            return typing.get_args(option)[1]
    if isinstance(part, str) and part in STEPS:  # the discriminator's tag in a step's path
        step_class = STEPS[part][0]
        if step_class in _options(node):
            return step_class
    return None


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif (
            i > 0
            and isinstance(loc[i - 1], int)
            and part in STEPS
            and i >= 2
            and loc[i - 2] == "steps"
        ):
            continue  # pydantic puts the discriminator tag in the path; YAML has no such level
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _format_msg(error: Mapping[str, Any]) -> str:
    kind = error.get("type", "")
    ctx = error.get("ctx") or {}
    if kind == "greater_than":
        return f"must be > {ctx.get('gt')}"
    if kind == "greater_than_equal":
        return f"must be >= {ctx.get('ge')}"
    if kind == "less_than_equal":
        return f"must be <= {ctx.get('le')}"
    if kind == "less_than":
        return f"must be < {ctx.get('lt')}"
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required"
    if kind == "union_tag_invalid":
        return f"unknown step type {ctx.get('tag')!r} (known: {', '.join(sorted(STEPS))})"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    message = str(error.get("msg", "invalid"))
    return message.removeprefix("Value error, ")
