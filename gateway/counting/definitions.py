"""Tool definitions as the model is understood to see them: the TypeScript-like namespace
OpenAI renders function definitions into (`render_function_definitions`), counted by
`MessageCounter.tools`. OpenAI publishes no formula; see there for the counts it reproduces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson


def render_function_definitions(functions: Sequence[Mapping[str, Any]]) -> str:
    """The TypeScript-like text of `functions` (see `MessageCounter.tools`)."""
    out = ["namespace functions {", ""]
    for function in functions:
        out.extend(_comment(function.get("description"), ""))
        name = function.get("name", "")
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
        if isinstance(parameters, Mapping) and isinstance(properties, Mapping) and properties:
            out.append(f"type {name} = (_: {{")
            out.extend(_property_lines(parameters, ""))
            out.append("}) => any;")
        else:
            out.append(f"type {name} = () => any;")
        out.append("")
    out.append("} // namespace functions")
    return "\n".join(out)


def _comment(description: object, indent: str) -> list[str]:
    if not isinstance(description, str) or not description:
        return []
    return [f"{indent}// {line}" for line in description.splitlines() or [""]]


def _property_lines(schema: Mapping[str, Any], indent: str) -> list[str]:
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return []
    required = schema.get("required")
    required_names = set(required) if isinstance(required, list) else set()
    lines: list[str] = []
    for name, prop in properties.items():
        prop_schema = prop if isinstance(prop, Mapping) else {}
        lines.extend(_comment(prop_schema.get("description"), indent))
        optional = "" if name in required_names else "?"
        lines.append(f"{indent}{name}{optional}: {_type_text(prop_schema, indent)},")
    return lines


def _type_text(schema: Mapping[str, Any], indent: str) -> str:
    """The TypeScript type for a JSON-schema node; unknown constructs become `any`."""
    if "enum" in schema and isinstance(schema["enum"], list):
        return " | ".join(_literal(value) for value in schema["enum"]) or "never"
    if "const" in schema:
        return _literal(schema["const"])
    for union_key in ("anyOf", "oneOf"):
        options = schema.get(union_key)
        if isinstance(options, list) and options:
            return " | ".join(
                _type_text(o if isinstance(o, Mapping) else {}, indent) for o in options
            )
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(_type_text({**schema, "type": k}, indent) for k in kind) or "any"
    if kind == "string":
        return "string"
    if kind in ("number", "integer"):
        return "number"
    if kind in ("boolean", "null"):
        return kind
    if kind == "array":
        items = schema.get("items")
        return f"{_type_text(items, indent)}[]" if isinstance(items, Mapping) else "any[]"
    if kind == "object" or "properties" in schema:
        inner = _property_lines(schema, indent + "  ")
        return "{\n" + "\n".join(inner) + "\n}" if inner else "object"
    return "any"


def _literal(value: object) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:  # e.g. an integer beyond 64 bits
        return str(value)
