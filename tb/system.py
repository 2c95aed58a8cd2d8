"""Run DRAM images on the whole accelerator: cocotb's runner on Verilator, no Python per clock.

:class:`SystemHarness` builds :class:`sfnpu.hw.accelerator.SimSystem` (accelerator + timed DRAM
model) once per design (:mod:`sfnpu.tb.elaborate` caches the Verilog, :mod:`sfnpu.tb.cocotb_build`
the simulator, with only the top-level ports public). A run starts the cocotb testbench
:mod:`sfnpu.tb.cocotb_system` through the runner:

1. the image is in the DRAM model at time 0, before reset is released (``$readmemh`` of a hex
   file written here: no clock cycles, no bus cycles, not part of the run);
2. the testbench programs IMAGE_BASE, the DMA window and CONTROL (interrupt enable, start) over
   AXI4-Lite, with offsets and fields from :mod:`sfnpu.regmap`;
3. it waits on one trigger: the interrupt, or ``max_cycles`` — a timeout is reported, never a
   hang;
4. it reads STATUS, the error registers, every counter and the per-group log (cycles, DRAM
   bytes read and written) over AXI4-Lite, and the DRAM model writes its contents to a file
   (``$writememh``).

:meth:`SystemHarness.run` returns that as a :class:`RunResult`; :class:`Scoreboard` compares it
with the golden model (the whole DRAM) and the cycle model (every group's cycles and bytes).
The firmware test (:mod:`sfnpu.tb.firmware`) keeps a C++ host, because running the C driver
is its point.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sfnpu import image, regmap
from sfnpu.config import HwConfig
from sfnpu.regmap import ErrorCode

from .cocotb_build import CocotbBuild
from .cocotb_system import CLOCK_NS, COUNTERS
from .elaborate import system_verilog
from .memfile import hex_image, read_dump
from .verilator import REPO_ROOT

__all__ = ["SystemHarness", "RunResult", "Scoreboard", "COUNTERS", "wave_format",
           "system_ports"]

TOP = "sim_system"          # the accelerator and the DRAM model (tb.elaborate)
BENCH = "sim_bench"         # TOP with its clock (bench_verilog)
#: The system builds, a folder per configuration, shared by the tests, ``sfnpu sim`` and the
#: firmware harness (one Verilator build of each configuration).
SYSTEM_BUILDS = REPO_ROOT / "build" / "rtl"


def wave_format() -> tuple[str, str]:
    """("fst" or "vcd", why): FST when the lz4 headers Verilator's FST writer needs are
    installed (Debian ``liblz4-dev``), VCD (much larger files) otherwise."""
    import sysconfig
    roots = {Path("/usr/include"), Path("/usr/local/include"),
             Path(sysconfig.get_paths()["include"]).parent}
    if any((root / "lz4.h").exists() for root in roots):
        return "fst", "FST"
    return "vcd", ("VCD: FST needs the lz4 headers (Debian package liblz4-dev), which are not "
                   "installed")


@dataclass
class RunResult:
    """What the host sees after a run."""
    timeout: bool
    aborted: bool
    waited: int                     # cycles from the start write to the interrupt
    status: int
    error_code: ErrorCode
    error_group: int
    error_addr: int
    counters: dict[str, int]
    group_cycles: list[int] = field(default_factory=list)
    group_read_bytes: list[int] = field(default_factory=list)
    group_write_bytes: list[int] = field(default_factory=list)
    dram: bytes = b""

    @property
    def done(self) -> bool:
        return bool(self.status & regmap.register("STATUS").field("done").mask)

    @property
    def error(self) -> bool:
        return bool(self.status & regmap.register("STATUS").field("error").mask)


def _signature_ports(config: HwConfig, dram_bytes: int) -> list[tuple[str, int, bool]]:
    """(Verilog name, width, is input) of SimSystem's ports besides the clock."""
    from amaranth.hdl import Shape
    from amaranth.lib.wiring import In
    from sfnpu.hw.accelerator import SimSystem

    system = SimSystem(config, dram_bytes=dram_bytes)
    system._MustUse__silence = True         # built for its signature, never elaborated
    ports = [("rst", 1, True)]
    for path, member in system.signature.members.flatten():
        if member.is_port:
            ports.append(("__".join(map(str, path)), Shape.cast(member.shape).width,
                          member.flow == In))
    return ports


def system_ports(config: HwConfig, dram_bytes: int) -> list[str]:
    """The Verilog names of the bench's signals the testbench touches: the clock and
    SimSystem's ports."""
    return ["clk"] + [name for name, _, _ in _signature_ports(config, dram_bytes)]


def bench_verilog(config: HwConfig, dram_bytes: int) -> str:
    """The top the simulator runs: SimSystem with its clock generated in Verilog and its
    reset through a register (a reset synchroniser).

    The clock is Verilator's own timed process rather than a cocotb clock driver, so a half
    period costs an evaluation of the model and no VPI write (1.4× faster on PP-LCNet). The
    reset register matters as much: Verilator re-evaluates all logic that depends on a signal
    the testbench may write (a port or a public register) at every evaluation, since it
    cannot know which changed, and Amaranth's next-state logic depends on the reset — the
    model would evaluate a fifth of the design twice per clock for nothing (156 → 202 k
    cycles/s). The other inputs reach only the CSR and backdoor decoders. The clock's period
    is :data:`~sfnpu.tb.cocotb_system.CLOCK_NS`, the testbench's."""
    ports = _signature_ports(config, dram_bytes)

    def declaration(name, width, is_input):
        return f"  {'reg' if is_input else 'wire'} [{width - 1}:0] {name};"

    lines = ["`timescale 1ns/1ps", f"module {BENCH};",
             *(declaration(*port) for port in ports),
             "  reg clk = 1'b0;",
             f"  always #{CLOCK_NS / 2:g} clk = ~clk;",
             "  reg rst_sync = 1'b1;",
             "  always @(posedge clk) rst_sync <= rst;",
             f"  {TOP} system(",
             ",\n".join(["    .clk(clk)", "    .rst(rst_sync)"]
                       + [f"    .{name}({name})" for name, _, _ in ports if name != "rst"]),
             "  );", "endmodule", ""]
    return "\n".join(lines)


def _footprint(blob: bytes) -> int:
    """The image's DRAM footprint: its header's image_bytes (outputs and intermediates lie
    past the blob's end)."""
    if len(blob) < image.HEADER.size:
        return len(blob)
    at = image.field_offset(image.HEADER_FIELDS, "image_bytes")
    return max(len(blob), struct.unpack_from("<I", blob, at)[0])


class SystemHarness:
    """The Verilated :class:`~sfnpu.hw.accelerator.SimSystem` of one configuration under
    cocotb. ``waves`` ("fst" or "vcd") builds with tracing for runs given a ``waves_file``."""

    def __init__(self, config: HwConfig, build_dir, *, dram_bytes: int = 1 << 24,
                 waves: str | None = None):
        self.config = config
        self.dram_bytes = dram_bytes
        self.build_dir = Path(build_dir).resolve()
        self.waves = waves
        self.build_dir.mkdir(parents=True, exist_ok=True)
        bench = self.build_dir / f"{BENCH}.v"
        text = bench_verilog(config, dram_bytes)
        if not bench.exists() or bench.read_text() != text:
            # Whole or not at all: another worker's build may be reading the file.
            partial = bench.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(text)
            partial.replace(bench)
        self.build = CocotbBuild([bench, system_verilog(config, dram_bytes, TOP)], BENCH,
                                 system_ports(config, dram_bytes), self.build_dir,
                                 waves=waves).ensure()

    _runs = itertools.count()

    def run(self, blob: bytes, *, base: int = 0, window: tuple[int, int] | None = None,
            max_cycles: int = 5_000_000, abort_after: int = 0,
            waves_file: Path | None = None) -> RunResult:
        """Run the image ``blob`` loaded at ``base``; the DMA window defaults to the whole
        DRAM model. ``abort_after`` > 0 writes CONTROL.soft_reset that many cycles after the
        start instead of waiting for the interrupt."""
        B = self.config.dram_bus_bytes
        if base + len(blob) > self.dram_bytes:
            raise ValueError(f"an image of {len(blob)} bytes at {base:#x} does not fit the "
                             f"{self.dram_bytes}-byte DRAM model")
        if base % B:
            raise ValueError(f"base {base:#x} is not a multiple of the {B}-byte bus")
        if waves_file is not None and not self.waves:
            raise ValueError("this harness was built without waves (waves='fst'/'vcd')")
        lo, hi = window if window is not None else (0, self.dram_bytes)
        # The DRAM read back: the image's footprint, in pages.
        dump_bytes = min(self.dram_bytes, -(-(base + _footprint(blob)) // 4096) * 4096)
        run_dir = self.build_dir / f"run-{os.getpid()}-{next(self._runs)}"
        run_dir.mkdir(parents=True, exist_ok=True)
        paths = {name: run_dir / name for name in
                 ("image.hex", "run.json", "result.json", "dram.hex", "results.xml", "sim.log")}
        try:
            paths["image.hex"].write_text(hex_image(blob, base, B))
            paths["run.json"].write_text(json.dumps({
                "base": base, "window": [lo, hi], "max_cycles": max_cycles,
                "abort_after": abort_after, "result": str(paths["result.json"]),
                "registers": regmap.offsets_and_masks()}))
            self._simulate(run_dir, paths, dump_bytes // B, waves_file)
            values = json.loads(paths["result.json"].read_text())
            dram = read_dump(paths["dram.hex"], B)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
        log = values["group_log"]
        return RunResult(
            timeout=values["timeout"], aborted=values["aborted"], waited=values["waited"],
            status=values["STATUS"], error_code=ErrorCode(values["ERROR_CODE"]),
            error_group=values["ERROR_GROUP"], error_addr=values["ERROR_ADDR"],
            counters=values["counters"],
            group_cycles=[entry[0] for entry in log],
            group_read_bytes=[entry[1] for entry in log],
            group_write_bytes=[entry[2] for entry in log],
            dram=dram)

    def _simulate(self, run_dir: Path, paths: dict[str, Path], dump_words: int,
                  waves_file: Path | None) -> None:
        """The cocotb run; a failed testbench is an error that quotes its log."""
        plusargs = [f"+sfnpu_load={paths['image.hex']}", f"+sfnpu_dump={paths['dram.hex']}",
                    f"+sfnpu_dump_words={dump_words}"]
        test_args = ["--trace-file", str(waves_file)] if waves_file is not None else []
        try:
            self.build.runner().test(
                test_module="sfnpu.tb.cocotb_system", testcase="run_image", hdl_toplevel=BENCH,
                hdl_toplevel_lang="verilog",
                build_dir=self.build_dir, test_dir=run_dir, plusargs=plusargs,
                test_args=test_args, waves=waves_file is not None,
                extra_env={"SFNPU_RUN": str(paths["run.json"])},
                results_xml=str(paths["results.xml"]), log_file=paths["sim.log"])
            failed = not paths["result.json"].exists()
        except (RuntimeError, SystemExit):
            failed = True
        if failed:
            log = paths["sim.log"].read_text() if paths["sim.log"].exists() else "(no log)"
            raise RuntimeError(f"the cocotb system testbench failed on {self.config.name}:\n"
                               f"{log[-6000:]}")


class Scoreboard:
    """A run against the models: the whole DRAM against the golden model's after the same
    image, every group's cycles and DRAM bytes against the cycle model's (bytes exactly,
    cycles within its tolerance)."""

    def __init__(self, config: HwConfig):
        from sfnpu.sim.cycle import CycleModel
        from sfnpu.sim.golden import GoldenModel
        self.golden = GoldenModel(config)
        self.cycle_model = CycleModel(config)

    def problems(self, blob: bytes, result: RunResult) -> list[str]:
        """What differs; empty when the run is bit-exact and cycle-exact."""
        from sfnpu.sim.cycle import compare
        if result.timeout:
            return ["no interrupt: the accelerator hung"]
        if result.error or not result.done:
            return [f"the accelerator stopped with {result.error_code.name} in group "
                    f"{result.error_group}"]
        golden = np.frombuffer(bytes(self.golden.run(blob).dram), np.uint8)
        dram = np.frombuffer(result.dram[:golden.size], np.uint8)
        differ = np.flatnonzero(dram != golden)
        found = [f"{differ.size} DRAM bytes differ from the golden model, first at "
                 f"{differ[:8].tolist()}"] if differ.size else []
        comparison = compare(self.cycle_model.run(blob), result.group_cycles,
                             result.group_read_bytes, result.group_write_bytes)
        return found + comparison.problems()
