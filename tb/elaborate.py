"""The simulation system's Verilog, elaborated once per design and kept on disk.

Elaborating the accelerator with Amaranth costs 40–90 s per process; a test suite on several
xdist workers, ``sfnpu sim`` and the benchmarks would pay it again and again for the same
design. :func:`system_verilog` keys the Verilog by a fingerprint of everything it depends on —
the configuration's fields, the DRAM model's size, the module name, the source of
:mod:`sfnpu` and :mod:`sfnpu.hw`, and the Amaranth version — so a cached file is reused exactly
when elaborating again would write the same text. :func:`cached_verilog` does the same for
other designs (the board top of :mod:`sfnpu.tb.board`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from importlib.metadata import version
from pathlib import Path
from typing import Callable

from sfnpu.config import HwConfig
from sfnpu.fingerprint import source_digest

from .verilator import REPO_ROOT, to_verilog

__all__ = ["system_verilog", "system_fingerprint", "design_fingerprint", "cached_verilog",
           "VERILOG_CACHE"]

#: Where elaborated designs are kept (``build/`` is the project's scratch folder).
VERILOG_CACHE = REPO_ROOT / "build" / "verilog"


def design_fingerprint(*parts: str, packages=("sfnpu", "sfnpu.hw")) -> str:
    """A design's key: what its elaboration depends on (``parts``: its parameters), the source
    of ``packages`` and the Amaranth version."""
    identity = "\0".join([*parts, source_digest(*packages), version("amaranth")])
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def system_fingerprint(config: HwConfig, dram_bytes: int, name: str) -> str:
    return design_fingerprint(repr(config), str(dram_bytes), name)


def cached_verilog(stem: str, elaborate: Callable[[], str]) -> Path:
    """``VERILOG_CACHE/<stem>.v`` (the stem carries the design's fingerprint), written from
    ``elaborate()`` only when no process has done it before. Concurrent callers wait on a lock
    for the first to finish."""
    VERILOG_CACHE.mkdir(parents=True, exist_ok=True)
    path = VERILOG_CACHE / f"{stem}.v"
    if path.exists():
        return path
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(elaborate())
            partial.replace(path)
    return path


def system_verilog(config: HwConfig, dram_bytes: int, name: str = "sim_system") -> Path:
    """The Verilog file of :class:`~sfnpu.hw.accelerator.SimSystem` (with the DRAM model's
    storage module) for ``config``; elaborated only when no process has done it before."""
    from sfnpu.hw.accelerator import SimSystem
    from sfnpu.hw.axi_mem import SIM_DRAM_VERILOG

    return cached_verilog(
        f"{name}-{config.name}-{system_fingerprint(config, dram_bytes, name)}",
        lambda: to_verilog(SimSystem(config, dram_bytes=dram_bytes), name) + SIM_DRAM_VERILOG)
