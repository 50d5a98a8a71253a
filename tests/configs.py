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


def compacting(base_url: str = "http://127.0.0.1:9/v1") -> dict[str, Any]:
    """A config whose model `m` (100,000-token window, `chars:4`, 100 output tokens) compacts
    with the default steps at trigger 0.8, target 0.5; the upstream is never reached when the
    test only prepares requests."""
    config = one_model(
        base_url, tokenizer="chars:4", context_window=100_000, max_output_tokens=100, policy="p"
    )
    config["policies"] = {"p": {"trigger_ratio": 0.8, "target_ratio": 0.5}}
    return config
