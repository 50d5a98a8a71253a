"""How a domain's names are spelled in code: CamelCase types, snake_case fields."""

from __future__ import annotations


def camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.replace("/", "_").split("_"))


def snake(name: str) -> str:
    out = []
    for ch in name:
        if ch.isupper() and out:
            out.append("_")
        out.append(ch.lower())
    return "".join(out)
