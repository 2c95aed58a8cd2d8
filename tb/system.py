"""Run DRAM images on the whole accelerator in Verilator, with no Python per clock.

:class:`SystemHarness` builds :class:`sfnpu.hw.accelerator.SimSystem` (accelerator + timed DRAM
model) with a compiled C++ driver. The driver is a register-level host written against the
generated register header ``firmware/include/sfnpu_regs.h`` — the same header firmware uses — so
every run also checks that header against the RTL. A run:

1. loads the image into the DRAM model at time 0, before reset is released: ``$readmemh`` of
   a hex file it writes (no clock cycles, no bus cycles, not part of the run);
2. programs IMAGE_BASE, the DMA window and CONTROL (interrupt enable, start) over AXI4-Lite;
3. waits for the interrupt — up to ``max_cycles``, after which it reports a timeout instead of
   hanging;
4. reads STATUS, the error registers, every counter and the per-group log (cycles, DRAM
   bytes read and written) over AXI4-Lite,
   and dumps the DRAM through the backdoor.
"""

from __future__ import annotations

import os
import struct
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from sfnpu import image, regmap
from sfnpu.config import HwConfig
from sfnpu.regmap import ErrorCode

from .verilator import REPO_ROOT, build_verilated, to_verilog

from sfnpu.hw.axi_mem import SIM_DRAM_VERILOG

__all__ = ["SystemHarness", "RunResult", "COUNTERS", "wave_format"]

#: 64-bit counters read after a run (register-name stems of sfnpu.regmap).
COUNTERS = ("CYCLES", "STALL_DRAM_READ", "STALL_DRAM_WRITE", "STALL_WEIGHTS", "STALL_CONTROL",
            "DRAM_READ_BYTES", "DRAM_WRITE_BYTES")

_DRIVER = r"""
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include "V{top}.h"
#include "verilated.h"
#include "sfnpu_regs.h"
#if defined(SFNPU_TRACE_FST)
#include "verilated_fst_c.h"
typedef VerilatedFstC Trace;
#elif defined(SFNPU_TRACE_VCD)
#include "verilated_vcd_c.h"
typedef VerilatedVcdC Trace;
#endif

static V{top}* dut;
static uint64_t cycle = 0;
#if defined(SFNPU_TRACE_FST) || defined(SFNPU_TRACE_VCD)
static Trace* trace = nullptr;
static void dump(uint64_t t) {{ if (trace) trace->dump(t); }}
#else
static void dump(uint64_t) {{}}
#endif

static void tick() {{
    dut->clk = 1; dut->eval(); dump(2 * cycle + 1);
    dut->clk = 0; dut->eval(); dump(2 * cycle + 2);
    ++cycle;
}}

static void fail(const char* what) {{
    std::fprintf(stderr, "system driver: %s (cycle %llu)\n", what, (unsigned long long)cycle);
    std::exit(3);
}}

static void csr_write(uint32_t addr, uint32_t value) {{
    dut->csr__aw__payload = addr; dut->csr__aw__valid = 1;
    dut->csr__w__payload = ((uint64_t)0xF << 32) | value; dut->csr__w__valid = 1;
    dut->csr__b__ready = 1;
    for (int t = 0; t < 1000; ++t) {{
        dut->eval();
        bool aw = dut->csr__aw__valid && dut->csr__aw__ready;
        bool w = dut->csr__w__valid && dut->csr__w__ready;
        bool b = dut->csr__b__valid;
        unsigned resp = dut->csr__b__payload & 3;
        tick();
        if (aw) dut->csr__aw__valid = 0;
        if (w) dut->csr__w__valid = 0;
        if (b) {{
            dut->csr__b__ready = 0;
            if (resp != 0) fail("register write answered with an error");
            return;
        }}
    }}
    fail("register write timed out");
}}

static uint32_t csr_read(uint32_t addr) {{
    dut->csr__ar__payload = addr; dut->csr__ar__valid = 1; dut->csr__r__ready = 1;
    for (int t = 0; t < 1000; ++t) {{
        dut->eval();
        bool ar = dut->csr__ar__valid && dut->csr__ar__ready;
        bool r = dut->csr__r__valid;
        uint64_t payload = dut->csr__r__payload;
        tick();
        if (ar) dut->csr__ar__valid = 0;
        if (r) {{
            dut->csr__r__ready = 0;
            if (((payload >> 32) & 3) != 0) fail("register read answered with an error");
            return (uint32_t)payload;
        }}
    }}
    fail("register read timed out");
    return 0;
}}

int main(int argc, char** argv) {{
    if (argc != 10) fail("usage: image dram_out result_out base window_base window_limit "
                         "max_cycles dump_bytes abort_after");
    dut = new V{top};
#if defined(SFNPU_TRACE_FST) || defined(SFNPU_TRACE_VCD)
    // Waves of the whole run (image load included) to $SFNPU_WAVES.
    if (const char* waves = std::getenv("SFNPU_WAVES")) {{
        Verilated::traceEverOn(true);
        trace = new Trace;
        dut->trace(trace, 99);
        trace->open(waves);
    }}
#endif
    uint64_t base = std::strtoull(argv[4], 0, 0);
    uint64_t window_base = std::strtoull(argv[5], 0, 0);
    uint64_t window_limit = std::strtoull(argv[6], 0, 0);
    uint64_t max_cycles = std::strtoull(argv[7], 0, 0);
    uint64_t dump_bytes = std::strtoull(argv[8], 0, 0);
    uint64_t abort_after = std::strtoull(argv[9], 0, 0);
    const unsigned B = {bus_bytes};

    FILE* f = std::fopen(argv[1], "rb");
    if (!f) fail("cannot open the image");
    std::vector<uint8_t> img;
    int c;
    while ((c = std::fgetc(f)) != EOF) img.push_back((uint8_t)c);
    std::fclose(f);

    // The DRAM model reads the image at time 0 from a hex file ($readmemh, no clock cycles).
    std::string hex = std::string(argv[1]) + ".hex";
    FILE* h = std::fopen(hex.c_str(), "w");
    if (!h) fail("cannot write the image's hex file");
    std::fprintf(h, "@%llx\n", (unsigned long long)(base / B));
    for (size_t off = 0; off < img.size(); off += B) {{
        uint64_t word = 0;
        for (unsigned b = 0; b < B && off + b < img.size(); ++b)
            word |= (uint64_t)img[off + b] << (8 * b);
        std::fprintf(h, "%0*llx\n", (int)(2 * B), (unsigned long long)word);
    }}
    std::fclose(h);
    std::string load = "+sfnpu_load=" + hex;
    const char* args[] = {{argv[0], load.c_str()}};
    Verilated::commandArgs(2, args);
    dut->rst = 1; dut->clk = 0; dut->eval();
    std::remove(hex.c_str());
    for (int k = 0; k < 4; ++k) tick();
    dut->rst = 0; tick();
    cycle = 0;

    if (csr_read(SFNPU_REG_ID) != SFNPU_ID_MAGIC) fail("ID register");
    csr_write(SFNPU_REG_IMAGE_BASE_LO, (uint32_t)base);
    csr_write(SFNPU_REG_IMAGE_BASE_HI, (uint32_t)(base >> 32));
    csr_write(SFNPU_REG_DMA_WINDOW_BASE_LO, (uint32_t)window_base);
    csr_write(SFNPU_REG_DMA_WINDOW_BASE_HI, (uint32_t)(window_base >> 32));
    csr_write(SFNPU_REG_DMA_WINDOW_LIMIT_LO, (uint32_t)window_limit);
    csr_write(SFNPU_REG_DMA_WINDOW_LIMIT_HI, (uint32_t)(window_limit >> 32));
    csr_write(SFNPU_REG_CONTROL, SFNPU_CONTROL_IRQ_ENABLE_MASK);
    csr_write(SFNPU_REG_CONTROL, SFNPU_CONTROL_IRQ_ENABLE_MASK | SFNPU_CONTROL_START_MASK);
    uint64_t started = cycle;
    bool timeout = false, aborted = false;
    while (!dut->irq) {{
        if (abort_after && !aborted && cycle - started >= abort_after) {{
            csr_write(SFNPU_REG_CONTROL, SFNPU_CONTROL_SOFT_RESET_MASK);
            aborted = true;
            break;
        }}
        if (cycle - started >= max_cycles) {{ timeout = true; break; }}
        tick();
    }}
    uint64_t waited = cycle - started;
    // Let an aborted or failed core finish its bus transactions before reading the status.
    for (int k = 0; k < 10000 && (csr_read(SFNPU_REG_STATUS) & SFNPU_STATUS_BUSY_MASK); ++k)
        for (int t = 0; t < 16; ++t) tick();

    FILE* r = std::fopen(argv[3], "w");
    std::fprintf(r, "timeout %d\naborted %d\nwaited %llu\n", timeout ? 1 : 0, aborted ? 1 : 0,
                 (unsigned long long)waited);
    std::fprintf(r, "STATUS %u\nERROR_CODE %u\nERROR_GROUP %u\n", csr_read(SFNPU_REG_STATUS),
                 csr_read(SFNPU_REG_ERROR_CODE), csr_read(SFNPU_REG_ERROR_GROUP));
    {{
        uint64_t lo = csr_read(SFNPU_REG_ERROR_ADDR_LO);
        uint64_t hi = csr_read(SFNPU_REG_ERROR_ADDR_HI);
        std::fprintf(r, "ERROR_ADDR %llu\n", (unsigned long long)(lo | hi << 32));
    }}
{read_counters}
    uint32_t groups = csr_read(SFNPU_REG_GROUP_COUNT);
    uint32_t depth = csr_read(SFNPU_REG_GROUP_LOG_DEPTH);
    std::fprintf(r, "GROUP_COUNT %u\n", groups);
    csr_write(SFNPU_REG_GROUP_LOG_INDEX, 0);
    for (uint32_t k = 0; k < groups && k < depth; ++k) {{
        // The byte fields first: reading GROUP_LOG_DATA advances the index.
        uint32_t read = csr_read(SFNPU_REG_GROUP_LOG_READ_BYTES);
        uint32_t written = csr_read(SFNPU_REG_GROUP_LOG_WRITE_BYTES);
        std::fprintf(r, "GROUP_LOG %u %u %u\n", csr_read(SFNPU_REG_GROUP_LOG_DATA), read,
                     written);
    }}
    std::fclose(r);

    FILE* d = std::fopen(argv[2], "wb");
    for (uint64_t off = 0; off < dump_bytes; off += B) {{
        dut->backdoor_addr = off / B; dut->eval();
        uint64_t word = dut->backdoor_rdata;
        for (unsigned b = 0; b < B; ++b) std::fputc((int)((word >> (8 * b)) & 0xFF), d);
    }}
    std::fclose(d);
#if defined(SFNPU_TRACE_FST) || defined(SFNPU_TRACE_VCD)
    if (trace) trace->close();
#endif
    delete dut;
    return 0;
}}
"""

_READ_COUNTER = """    {{
        uint64_t lo = csr_read(SFNPU_REG_{name}_LO);
        uint64_t hi = csr_read(SFNPU_REG_{name}_HI);
        std::fprintf(r, "{name} %llu\\n", (unsigned long long)(lo | hi << 32));
    }}"""


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


class SystemHarness:
    """The Verilated :class:`~sfnpu.hw.accelerator.SimSystem` of one configuration."""

    def __init__(self, config: HwConfig, build_dir, *, dram_bytes: int = 1 << 24,
                 jobs: int = 2, waves: str | None = None):
        from sfnpu.hw.accelerator import SimSystem
        if config.dram_bus_bytes > 8:
            raise ValueError("the system driver handles DRAM buses of up to 64 bits")
        self.config = config
        self.dram_bytes = dram_bytes
        self.build_dir = Path(build_dir)
        name = "sim_system"
        verilog = to_verilog(SimSystem(config, dram_bytes=dram_bytes), name) + SIM_DRAM_VERILOG
        counters = "\n".join(_READ_COUNTER.format(name=n) for n in COUNTERS)
        driver = _DRIVER.format(top=name, bus_bytes=config.dram_bus_bytes,
                                read_counters=counters)
        # Verilator escapes "__" in port names (the Verilog backend's member separator).
        driver = re.sub(r"dut->(\w+)", lambda m: "dut->" + m[1].replace("__", "___05F"),
                        driver)
        # The model's per-cycle code with GCC's -O2 instead of the wheel's -Os: about 25 %
        # faster simulation (PP-LCNet: 126 → 159 k cycles/s) for a similar build time.
        args = ["-O2", "-MAKEFLAGS", "OPT_FAST=-O2"]
        if waves not in (None, "fst", "vcd"):
            raise ValueError(f"waves={waves!r}: choose 'fst', 'vcd' or None")
        if waves:
            args += [f"--trace{'-fst' if waves == 'fst' else ''}",
                     "-CFLAGS", f"-DSFNPU_TRACE_{waves.upper()}"]
        self.waves = waves
        self.executable = build_verilated(self.build_dir, name, verilog, driver, args, jobs,
                                          include_dirs=[REPO_ROOT / "firmware" / "include"])

    def run(self, blob: bytes, *, base: int = 0, window: tuple[int, int] | None = None,
            max_cycles: int = 5_000_000, abort_after: int = 0,
            waves_file: Path | None = None) -> RunResult:
        """Run the image ``blob`` loaded at ``base``; the DMA window defaults to the whole
        DRAM model. ``abort_after`` > 0 writes CONTROL.soft_reset that many cycles after the
        start instead of waiting for the interrupt."""
        if base + len(blob) > self.dram_bytes:
            raise ValueError(f"an image of {len(blob)} bytes at {base:#x} does not fit the "
                             f"{self.dram_bytes}-byte DRAM model")
        lo, hi = window if window is not None else (0, self.dram_bytes)
        # The DRAM read back: the image's footprint (its header's image_bytes), in pages.
        footprint = len(blob)
        if len(blob) >= image.HEADER.size:
            at = image.field_offset(image.HEADER_FIELDS, "image_bytes")
            footprint = max(footprint, struct.unpack_from("<I", blob, at)[0])
        dump = min(self.dram_bytes, -(-(base + footprint) // 4096) * 4096)
        tag = f"run-{os.getpid()}-{id(blob):x}"
        paths = [self.build_dir / f"{tag}.{ext}" for ext in ("img", "dram", "txt")]
        try:
            paths[0].write_bytes(blob)
            env = dict(os.environ)
            if waves_file is not None:
                if not self.waves:
                    raise ValueError("this harness was built without waves (waves='fst'/'vcd')")
                env["SFNPU_WAVES"] = str(waves_file)
            subprocess.run([str(self.executable), *map(str, paths), hex(base), hex(lo), hex(hi),
                            str(max_cycles), str(dump), str(abort_after)],
                           check=True, timeout=600, env=env)
            dram = paths[1].read_bytes()
            lines = [line.split() for line in paths[2].read_text().splitlines()]
        finally:
            for p in paths:
                p.unlink(missing_ok=True)
        log = [[int(v) for v in line[1:]] for line in lines if line[0] == "GROUP_LOG"]
        values = {k: int(v) for k, v in (line for line in lines if line[0] != "GROUP_LOG")}
        return RunResult(
            timeout=bool(values["timeout"]), aborted=bool(values["aborted"]),
            waited=values["waited"], status=values["STATUS"],
            error_code=ErrorCode(values["ERROR_CODE"]), error_group=values["ERROR_GROUP"],
            error_addr=values["ERROR_ADDR"],
            counters={n: values[n] for n in COUNTERS},
            group_cycles=[entry[0] for entry in log],
            group_read_bytes=[entry[1] for entry in log],
            group_write_bytes=[entry[2] for entry in log],
            dram=dram)
