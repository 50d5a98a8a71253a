"""Gateway configs tests start from: one model, `m`, on the upstream under test."""

from __future__ import annotations

from typing import Any


def one_model(
    base_url: str, steps: list[dict[str, Any]] | None = None, **model: Any
) -> dict[str, Any]:
    """A config whose one model `m` forwards to `base_url`; `model`: more of the model's keys;
    `steps`: the steps of its policy (`p`), else the default policy."""
    entry: dict[str, Any] = {"name": "m", "upstream": {"base_url": base_url}, **model}
    if steps is None:
        return {"models": [entry]}
    return {"models": [{**entry, "policy": "p"}], "policies": {"p": {"steps": steps}}}
