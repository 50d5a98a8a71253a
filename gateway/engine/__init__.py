"""The engine: what to forward for a request (`Engine.prepare`), in three parts (measure,
decide, render); see engine.py."""

from .engine import Engine
from .prepared import ExactCount, Prepared, when_settled

__all__ = ["Engine", "ExactCount", "Prepared", "when_settled"]
