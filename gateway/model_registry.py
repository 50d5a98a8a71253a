"""Known models' context windows, read from the registry file litellm ships (design D2.4).

We read litellm's bundled `model_prices_and_context_window_backup.json` as a file, never
importing litellm (that costs seconds of start-up). Loaded once on first use.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from functools import cache

import orjson

_FILE = "model_prices_and_context_window_backup.json"


@dataclass(frozen=True, slots=True)
class ModelInfo:
    max_input_tokens: int | None
    max_output_tokens: int | None
    provider: str | None


@cache
def _registry() -> dict[str, ModelInfo]:
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = os.path.join(next(iter(spec.submodule_search_locations)), _FILE)
    try:
        with open(path, "rb") as handle:
            raw = orjson.loads(handle.read())
    except (OSError, orjson.JSONDecodeError):
        return {}
    out: dict[str, ModelInfo] = {}
    for name, info in raw.items():
        if not isinstance(info, dict) or info.get("mode") not in (None, "chat", "responses"):
            continue
        max_in = info.get("max_input_tokens") or info.get("max_tokens")
        max_out = info.get("max_output_tokens")
        out[name] = ModelInfo(
            max_input_tokens=max_in if isinstance(max_in, int) and max_in > 0 else None,
            max_output_tokens=max_out if isinstance(max_out, int) and max_out > 0 else None,
            provider=info.get("litellm_provider"),
        )
    return out


def lookup(model: str) -> ModelInfo | None:
    """Registry entry for `model`, trying it without a `provider/` prefix too."""
    registry = _registry()
    found = registry.get(model)
    if found is None and "/" in model:
        found = registry.get(model.split("/", 1)[1])
    return found
