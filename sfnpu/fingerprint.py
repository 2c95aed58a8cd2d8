"""Hashes of sfnpu's own source: what a cached result (a design-space point, an elaborated
design, a Verilator build) depends on, so any change to that source invalidates it."""

from __future__ import annotations

import hashlib
import importlib
from functools import lru_cache
from pathlib import Path

__all__ = ["source_digest"]


@lru_cache(maxsize=None)
def source_digest(*packages: str) -> str:
    """sha256 (16 hex digits) of the ``.py`` files of ``packages`` and of their direct
    sub-folders. The top-level ``sfnpu`` package counts only its own files: its mapped
    sub-packages (``sfnpu.hw``, ``sfnpu.sim``, ...) are named separately."""
    digest = hashlib.sha256()
    for package in packages:
        folder = Path(importlib.import_module(package).__file__).parent
        for path in sorted(folder.glob("*.py")) + sorted(folder.glob("*/*.py")):
            if package == "sfnpu" and path.parent != folder:
                continue
            digest.update(f"{package}/{path.relative_to(folder)}".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
