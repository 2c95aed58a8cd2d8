"""The C firmware driver on the Verilated accelerator.

:class:`FirmwareHarness` compiles the driver (``firmware/src``) and the host program's
platform-independent part (``firmware/host/sfnpu_run.c``) with the system C compiler into a
shared library, which a Verilator build of :class:`sfnpu.hw.accelerator.SimSystem` loads at run
time (so a firmware change costs a C compile, not a Verilator build). The C++ main supplies the driver's platform hooks: register access as AXI4-Lite transactions on
the model's CSR port, memory access through the DRAM model's backdoor word port, time as
simulated cycles at the configuration's clock, and ``idle`` as a few clock cycles. Everything
else — validating and loading the image, programming the DMA window, starting, polling with a
timeout, decoding the error code, reading the counters and the group log, reading the result
back — is the firmware's own code, unchanged from what runs on a board.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from sfnpu.config import HwConfig

from .elaborate import system_verilog
from .verilator import REPO_ROOT, build_verilated

__all__ = ["FIRMWARE", "FirmwareHarness", "FirmwareRun", "build_firmware_library"]

FIRMWARE = REPO_ROOT / "firmware"
#: The sources every platform links: the driver and the host program's common part.
LIBRARY_SOURCES = (FIRMWARE / "src" / "sfnpu.c", FIRMWARE / "host" / "sfnpu_run.c")
INCLUDE_DIRS = (FIRMWARE / "include", FIRMWARE / "host")
C_FLAGS = ("-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-pedantic")

_PLATFORM = r"""
// Platform hooks of the sfnpu driver over the Verilated SimSystem (see tb/firmware.py).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include "V{top}.h"
#include "verilated.h"
#include "sfnpu_run.h"
// Built against the firmware headers {headers}.

static V{top}* dut;
static uint64_t cycle = 0;
static const unsigned BUS_BYTES = {bus_bytes};
static const uint64_t WORDS = {words}ull;
static const double CLOCK_MHZ = {clock_mhz};
static const int HANDSHAKE_LIMIT = 1000;     // cycles an AXI4-Lite transfer may take

static void tick() {{
    dut->clk = 1; dut->eval();
    dut->clk = 0; dut->eval();
    ++cycle;
}}

static void die(const char* what) {{
    std::fprintf(stderr, "firmware platform: %s (cycle %llu)\n", what, (unsigned long long)cycle);
    std::exit(3);
}}

static void csr_write(void*, uint32_t offset, uint32_t value) {{
    bool address_sent = false, data_sent = false;
    dut->csr__aw__payload = offset; dut->csr__w__payload = ((uint64_t)0xF << 32) | value;
    for (int t = 0; t < HANDSHAKE_LIMIT; ++t) {{
        dut->csr__aw__valid = !address_sent; dut->csr__w__valid = !data_sent;
        dut->csr__b__ready = address_sent && data_sent;
        dut->eval();
        bool aw = dut->csr__aw__valid && dut->csr__aw__ready;
        bool w = dut->csr__w__valid && dut->csr__w__ready;
        bool b = dut->csr__b__ready && dut->csr__b__valid;
        tick();
        address_sent |= aw; data_sent |= w;
        if (b) {{
            dut->csr__aw__valid = 0; dut->csr__w__valid = 0; dut->csr__b__ready = 0;
            return;     // an error response is the driver's business: it reads STATUS
        }}
    }}
    die("register write got no response");
}}

static uint32_t csr_read(void*, uint32_t offset) {{
    bool address_sent = false;
    dut->csr__ar__payload = offset;
    for (int t = 0; t < HANDSHAKE_LIMIT; ++t) {{
        dut->csr__ar__valid = !address_sent; dut->csr__r__ready = address_sent;
        dut->eval();
        bool ar = dut->csr__ar__valid && dut->csr__ar__ready;
        bool r = dut->csr__r__ready && dut->csr__r__valid;
        uint64_t payload = dut->csr__r__payload;
        tick();
        address_sent |= ar;
        if (r) {{
            dut->csr__ar__valid = 0; dut->csr__r__ready = 0;
            return (uint32_t)payload;
        }}
    }}
    die("register read got no response");
    return 0;
}}

static uint64_t backdoor_read(uint64_t word) {{
    dut->backdoor_addr = word; dut->eval();
    return dut->backdoor_rdata;
}}

static int mem_write(void*, uint64_t addr, const void* data, size_t bytes) {{
    const uint8_t* src = (const uint8_t*)data;
    if (addr + bytes > WORDS * BUS_BYTES) return -1;
    for (uint64_t word = addr / BUS_BYTES; word * BUS_BYTES < addr + bytes; ++word) {{
        uint64_t value = backdoor_read(word);
        for (unsigned b = 0; b < BUS_BYTES; ++b) {{
            uint64_t at = word * BUS_BYTES + b;
            if (at >= addr && at < addr + bytes) {{
                value &= ~((uint64_t)0xFF << (8 * b));
                value |= (uint64_t)src[at - addr] << (8 * b);
            }}
        }}
        dut->backdoor_wdata = value; dut->backdoor_we = 1;
        tick();
        dut->backdoor_we = 0;
    }}
    return 0;
}}

static int mem_read(void*, uint64_t addr, void* data, size_t bytes) {{
    uint8_t* dst = (uint8_t*)data;
    if (addr + bytes > WORDS * BUS_BYTES) return -1;
    for (size_t k = 0; k < bytes; ++k)
        dst[k] = (uint8_t)(backdoor_read((addr + k) / BUS_BYTES) >> (8 * ((addr + k) % BUS_BYTES)));
    return 0;
}}

static uint64_t now_us(void*) {{ return (uint64_t)(cycle / CLOCK_MHZ); }}

static void idle(void*) {{ for (int k = 0; k < 64; ++k) tick(); }}

int main(int argc, char** argv) {{
    if (argc != 9)
        die("usage: image dump report base window_base window_limit timeout_us library");
    // The firmware is a shared library, so changing it costs a C compile, not a Verilator build.
    void* firmware = dlopen(argv[8], RTLD_NOW);
    if (!firmware) die(dlerror());
    typedef int (*run_file_t)(const sfnpu_platform_t*, const sfnpu_run_options_t*, FILE*);
    run_file_t run_file = (run_file_t)dlsym(firmware, "sfnpu_run_file");
    if (!run_file) die("the firmware library has no sfnpu_run_file");
    Verilated::commandArgs(1, argv);
    dut = new V{top};
    dut->rst = 1; dut->clk = 0; dut->eval();
    for (int k = 0; k < 4; ++k) tick();
    dut->rst = 0; tick();

    sfnpu_platform_t platform = {{nullptr, csr_read, csr_write, mem_write, mem_read, now_us, idle}};
    sfnpu_run_options_t options;
    options.image_path = argv[1];
    options.dump_path = argv[2];
    options.base = std::strtoull(argv[4], 0, 0);
    options.window_base = std::strtoull(argv[5], 0, 0);
    options.window_limit = std::strtoull(argv[6], 0, 0);
    options.timeout_us = std::strtoull(argv[7], 0, 0);
    FILE* report = std::fopen(argv[3], "w");
    if (!report) die("cannot write the report");
    int code = run_file(&platform, &options, report);
    std::fprintf(report, "exit %d\nsimulated_cycles %llu\n", code, (unsigned long long)cycle);
    std::fclose(report);
    delete dut;
    return 0;
}}
"""


def build_firmware_library(build_dir: Path) -> Path:
    """Compile the driver and the host program core with the system C compiler (``CC`` or
    ``cc``; warnings are errors) into a shared library named after a hash of its sources."""
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise RuntimeError(f"C compiler {cc!r} not found: set CC or install cc")
    build_dir.mkdir(parents=True, exist_ok=True)
    sources = [*LIBRARY_SOURCES, *(p for d in INCLUDE_DIRS for p in sorted(d.glob("*.h")))]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)
                            + " ".join([cc, *C_FLAGS]).encode()).hexdigest()[:16]
    library = build_dir / f"libsfnpu-{digest}.so"
    if library.exists():
        return library
    partial = build_dir / f"libsfnpu-{digest}.{os.getpid()}.tmp"
    result = subprocess.run([cc, *C_FLAGS, "-shared", "-fPIC",
                             *(f"-I{d}" for d in INCLUDE_DIRS), *map(str, LIBRARY_SOURCES),
                             "-o", str(partial)], capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"the firmware does not compile:\n{result.stderr[-4000:]}")
    os.replace(partial, library)       # atomic: parallel test workers may build it too
    return library


def _headers_digest() -> str:
    headers = [p for d in INCLUDE_DIRS for p in sorted(d.glob("*.h"))]
    return hashlib.sha256(b"".join(p.read_bytes() for p in headers)).hexdigest()[:16]


@dataclass
class FirmwareRun:
    """The host program's report after one image."""
    exit_code: int
    report: dict[str, str]
    counters: dict[str, int]
    group_cycles: list[int] = field(default_factory=list)
    group_read_bytes: list[int] = field(default_factory=list)
    group_write_bytes: list[int] = field(default_factory=list)
    dram: bytes = b""
    text: str = ""

    @property
    def error_name(self) -> str:
        return self.report.get("error", "").split(":")[0].split()[-1] if "error" in self.report \
            else ""


class FirmwareHarness:
    """The C driver and host program linked against the Verilated SimSystem of ``config``."""

    def __init__(self, config: HwConfig, build_dir, *, dram_bytes: int = 1 << 24, jobs: int = 2):
        if config.dram_bus_bytes > 8:
            raise ValueError(f"config {config.name!r}: the firmware harness handles DRAM buses "
                             f"of up to 64 bits, not {config.dram_bus_bits}")
        self.config = config
        self.dram_bytes = dram_bytes
        self.build_dir = Path(build_dir)
        self.library = build_firmware_library(self.build_dir / "lib")
        name = "sim_system"        # the system harness's design: its elaboration is reused
        verilog = system_verilog(config, dram_bytes, name).read_text()
        platform = _PLATFORM.format(top=name, bus_bytes=config.dram_bus_bytes,
                                    words=dram_bytes // config.dram_bus_bytes,
                                    clock_mhz=float(config.clock_mhz),
                                    headers=_headers_digest())
        # Verilator escapes "__" in port names (the Verilog backend's member separator).
        platform = re.sub(r"dut->(\w+)", lambda m: "dut->" + m[1].replace("__", "___05F"),
                          platform)
        args = ["-O2", "-LDFLAGS", "-ldl"]
        self.executable = build_verilated(self.build_dir, name, verilog, platform, args, jobs,
                                          include_dirs=INCLUDE_DIRS)

    def run(self, blob: bytes, *, base: int = 0, window: tuple[int, int] | None = None,
            timeout_us: int = 100_000) -> FirmwareRun:
        """Run the host program on ``blob``; the DMA window defaults to the whole memory."""
        lo, hi = window if window is not None else (0, self.dram_bytes)
        tag = f"run-{os.getpid()}-{id(blob):x}"
        paths = [self.build_dir / f"{tag}.{ext}" for ext in ("img", "dump", "txt")]
        try:
            paths[0].write_bytes(blob)
            subprocess.run([str(self.executable), *map(str, paths), hex(base), hex(lo), hex(hi),
                            str(timeout_us), str(self.library)], check=True, timeout=900)
            text = paths[2].read_text()
            dram = paths[1].read_bytes() if paths[1].exists() else b""
        finally:
            for p in paths:
                p.unlink(missing_ok=True)
        report, counters, groups = {}, {}, []      # groups: (cycles, read, written)
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "counter":
                name, number = value.split()
                counters[name] = int(number)
            elif key == "group":
                groups.append(tuple(int(v) for v in value.split()[1:]))
            else:
                report[key] = value
        return FirmwareRun(exit_code=int(report["exit"]), report=report, counters=counters,
                           group_cycles=[g[0] for g in groups],
                           group_read_bytes=[g[1] for g in groups],
                           group_write_bytes=[g[2] for g in groups], dram=dram, text=text)
