"""Small integer helpers shared by the engine's layers (torch-free, so engine/core may use them)."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling of a / b for b > 0: e.g. the number of b-token blocks that hold a tokens."""
    return -(-a // b)
