"""What the gateway writes into the store as JSON: one versioned record (`{"v": 1, ...}`), read
back the same way by every part that shares state through the store (design D13.3).

A value under one of our keys that is not JSON, not an object or of another version is treated
as absent: it was not written by this version of the gateway, and nothing read from the store
may fail a request.
"""

from __future__ import annotations

from typing import Any

import orjson

VERSION = 1


def record(value: bytes | None) -> dict[str, Any] | None:
    """The record stored as `value`, or None for nothing or anything not ours."""
    if value is None:
        return None
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or data.get("v") != VERSION:
        return None
    return data
