"""The board top's host link in simulation: the Verilated :class:`~sfnpu.hw.board.BoardSystem`
as a byte pipe.

The C++ main plays the host's UART: bytes arriving on its standard input are sent bit by bit
into ``uart_rx`` (``divisor`` cycles per bit, 8N1), and bytes the board sends on ``uart_tx``
are sampled in the middle of each bit and written to its standard output. The host tool
(:mod:`sfnpu.tools.board`) talks to that process exactly as it talks to a serial port, so the test
covers the UART receiver and transmitter, the bridge, the block RAM, the accelerator and the
host tool, with no Python per clock. When nothing is on the wire and no input is waiting for
a while, the process blocks on its input (simulated time stands still meanwhile); it exits on
end of input, or with an error after ``max_cycles``.

A harness built with ``backdoor=True`` has the block RAM's file backdoor
(:class:`~sfnpu.hw.block_ram.AxiBlockRam`): :meth:`BoardHarness.open_preloaded` starts a board
whose memory holds an image before reset is released, and the process writes the memory to a
file when it exits (:meth:`BoardHarness.memory`). Images of megabytes then cost no UART cycles
(40 per byte at divisor 4, each way); the registers still go over the link.

The Verilated top holds its own reset for its first cycles (:class:`_ResetInside`): with no
reset input, Verilator evaluates the next-state logic once a cycle instead of at every
``eval``, which makes the simulation a third faster. Its Verilog is kept in ``build/verilog``
under the design's fingerprint (:func:`sfnpu.tb.elaborate.cached_verilog`).
"""

from __future__ import annotations

import os
import select
import subprocess
from pathlib import Path

from amaranth.hdl import ClockDomain, ClockSignal, Module, ResetSignal, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from sfnpu.config import HwConfig

from .elaborate import cached_verilog, design_fingerprint
from .memfile import hex_image, read_dump
from .verilator import build_verilated, to_verilog

__all__ = ["BoardHarness", "PipeTransport"]

_DRIVER = r"""
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <poll.h>
#include <unistd.h>
#include "V{top}.h"
#include "verilated.h"

static const int DIVISOR = {divisor};
static const int RESET_CYCLES = {reset_cycles};

int main(int argc, char** argv) {{
    if (argc < 2) {{ std::fprintf(stderr, "usage: max_cycles [+plusargs]\n"); return 2; }}
    Verilated::commandArgs(argc, argv);
    uint64_t max_cycles = std::strtoull(argv[1], 0, 0);
    V{top}* dut = new V{top};
    uint64_t cycle = 0;
    auto tick = [&]() {{ dut->clk = 1; dut->eval(); dut->clk = 0; dut->eval(); ++cycle; }};
    dut->uart_rx = 1; dut->clk = 0; dut->eval();
    for (int k = 0; k < RESET_CYCLES; ++k) tick();      // the design resets itself meanwhile

    std::deque<uint8_t> to_board;
    std::vector<uint8_t> from_board;
    int send_bit = -1, send_timer = 0; uint16_t send_frame = 0;     // host -> board
    int recv_bit = -1, recv_timer = 0; uint8_t recv_byte = 0;       // board -> host
    uint64_t quiet = 0;                  // cycles with nothing on either wire
    bool input_open = true;
    const uint64_t QUIET_LIMIT = 64ull * DIVISOR;

    while (cycle < max_cycles) {{
        bool idle = send_bit < 0 && to_board.empty() && recv_bit < 0;
        // Input is looked for every 16 cycles, not every cycle: each look is a system call.
        if (input_open && cycle % 16 == 0 && (to_board.empty() || cycle % 1024 == 0)) {{
            if (!from_board.empty() && (idle || from_board.size() >= 4096)) {{
                if (write(1, from_board.data(), from_board.size()) != (ssize_t)from_board.size())
                    return 4;
                from_board.clear();
            }}
            struct pollfd p = {{0, POLLIN, 0}};
            // Block only when the link is quiet: the host is thinking, not waiting.
            int wait_ms = (idle && quiet > QUIET_LIMIT && from_board.empty()) ? -1 : 0;
            if (poll(&p, 1, wait_ms) > 0) {{
                uint8_t buffer[4096];
                ssize_t n = read(0, buffer, sizeof buffer);
                if (n <= 0) input_open = false;
                for (ssize_t k = 0; k < n; ++k) to_board.push_back(buffer[k]);
                quiet = 0;
            }}
        }}
        if (!input_open && idle) break;

        if (send_bit < 0 && !to_board.empty()) {{
            send_frame = (uint16_t)(0x200 | (to_board.front() << 1));   // start, data, stop
            to_board.pop_front();
            send_bit = 0; send_timer = DIVISOR;
        }}
        dut->uart_rx = send_bit < 0 ? 1 : (send_frame >> send_bit) & 1;
        tick();
        if (send_bit >= 0 && --send_timer == 0) {{
            send_timer = DIVISOR;
            if (++send_bit == 10) send_bit = -1;
        }}

        int tx = dut->uart_tx;
        if (recv_bit < 0) {{
            if (!tx) {{ recv_bit = 0; recv_timer = DIVISOR + DIVISOR / 2; recv_byte = 0; }}
        }} else if (--recv_timer == 0) {{
            recv_timer = DIVISOR;
            if (recv_bit < 8) recv_byte |= (uint8_t)(tx << recv_bit);
            else {{
                if (!tx) {{ std::fprintf(stderr, "board: framing error\n"); return 5; }}
                from_board.push_back(recv_byte);
            }}
            recv_bit = recv_bit == 8 ? -1 : recv_bit + 1;
        }}
        quiet = (send_bit < 0 && recv_bit < 0 && tx) ? quiet + 1 : 0;
    }}
    if (!from_board.empty()) {{ ssize_t n = write(1, from_board.data(), from_board.size()); (void)n; }}
    bool limit = cycle >= max_cycles;
    std::fprintf(stderr, limit ? "board: stopped at the limit of %llu cycles\n"
                               : "board: %llu cycles\n", (unsigned long long)cycle);
{dump}
    delete dut;
    return limit ? 6 : 0;
}}
"""


class PipeTransport:
    """The simulated board process as a serial port: ``read`` gives up after ``timeout_s``."""

    def __init__(self, process: subprocess.Popen, timeout_s: float = 60.0):
        self.process = process
        self.timeout_s = timeout_s

    def write(self, data: bytes):
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def read(self, n: int) -> bytes:
        out = bytearray()
        fd = self.process.stdout.fileno()
        while len(out) < n:
            ready, _, _ = select.select([fd], [], [], self.timeout_s)
            if not ready:
                break
            chunk = os.read(fd, n - len(out))
            if not chunk:
                break
            out += chunk
        return bytes(out)


#: Cycles the simulated board holds itself in reset from time 0.
RESET_CYCLES = 4


class _ResetInside(wiring.Component):
    """``system`` holding its own reset for the first :data:`RESET_CYCLES` cycles, as a board's
    PLL lock does: the Verilated top then has no reset input. Verilator evaluates all logic
    that depends on a top-level input at every ``eval`` (twice a cycle), and a reset input
    reaches every register's next-state logic; without one that logic runs once a cycle, after
    the clock edge."""

    def __init__(self, system: wiring.Component):
        self.system = system
        super().__init__({**system.signature.members, "clk": In(1)})

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = ClockDomain()
        m.domains.por = ClockDomain(reset_less=True)
        left = Signal(range(RESET_CYCLES + 1), init=RESET_CYCLES)
        with m.If(left != 0):
            m.d.por += left.eq(left - 1)
        m.d.comb += [ClockSignal("sync").eq(self.clk), ClockSignal("por").eq(self.clk),
                     ResetSignal("sync").eq(left != 0)]
        m.submodules.system = system = self.system
        for name, member in system.signature.members.items():
            outer, inner = getattr(self, name), getattr(system, name)
            m.d.comb += inner.eq(outer) if member.flow == In else outer.eq(inner)
        return m


#: The backdoor's end of a run: one edge with backdoor_dump high writes the memory file.
_DUMP = """    dut->backdoor_dump = 1; tick(); dut->backdoor_dump = 0;"""


class BoardHarness:
    """The Verilated board system with ``memory_bytes`` of block RAM; :meth:`open` starts a
    simulated board process. ``backdoor`` builds the block RAM's file backdoor in (see the
    module docstring)."""

    def __init__(self, config: HwConfig, build_dir, *, memory_bytes: int,
                 uart_divisor: int = 4, jobs: int = 2, backdoor: bool = False):
        from sfnpu.hw.axi_mem import SIM_DRAM_VERILOG
        from sfnpu.hw.board import BoardSystem
        self.config = config
        self.build_dir = Path(build_dir)
        self.memory_bytes = memory_bytes
        self.backdoor = backdoor
        name = "board_system"

        def elaborate() -> str:
            top = _ResetInside(BoardSystem(config, memory="bram", memory_bytes=memory_bytes,
                                           uart_divisor=uart_divisor, heartbeat_bits=8,
                                           backdoor=backdoor))
            return to_verilog(top, name) + (SIM_DRAM_VERILOG if backdoor else "")

        # The top is in this package: its source is part of the key.
        fingerprint = design_fingerprint(repr(config), str(memory_bytes), str(uart_divisor),
                                         str(backdoor), name,
                                         packages=("sfnpu", "sfnpu.hw", "sfnpu.tb"))
        verilog = cached_verilog(f"{name}-{config.name}-{fingerprint}", elaborate).read_text()
        driver = _DRIVER.format(top=name, divisor=uart_divisor, reset_cycles=RESET_CYCLES,
                                dump=_DUMP if backdoor else "")
        # GCC -O2 for the model's per-cycle code (the wheel's makefile uses -Os): faster runs.
        self.executable = build_verilated(self.build_dir, name, verilog, driver,
                                          ("-O2", "-MAKEFLAGS", "OPT_FAST=-O2"), jobs)

    def open(self, max_cycles: int = 50_000_000, plusargs=()) -> subprocess.Popen:
        return subprocess.Popen([str(self.executable), str(max_cycles), *plusargs],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, bufsize=0)

    def open_preloaded(self, blob: bytes, workdir, *, dump_bytes: int,
                       max_cycles: int = 50_000_000) -> subprocess.Popen:
        """A board whose block RAM holds ``blob`` from address 0 (and zeros after it) before
        reset is released; when the process exits it writes the memory's first ``dump_bytes``
        to ``workdir``, for :meth:`memory`."""
        if not self.backdoor:
            raise ValueError("this harness was built without the backdoor (backdoor=True)")
        B = self.config.dram_bus_bytes
        if len(blob) > self.memory_bytes or dump_bytes > self.memory_bytes or dump_bytes % B:
            raise ValueError(f"an image of {len(blob)} bytes, {dump_bytes} bytes read back: "
                             f"the block RAM has {self.memory_bytes}, in {B}-byte words")
        workdir = Path(workdir)
        (workdir / "image.hex").write_text(hex_image(blob, 0, B))
        (workdir / "memory.hex").unlink(missing_ok=True)
        return self.open(max_cycles, [f"+sfnpu_load={workdir / 'image.hex'}",
                                      f"+sfnpu_dump={workdir / 'memory.hex'}",
                                      f"+sfnpu_dump_words={dump_bytes // B}"])

    def memory(self, workdir) -> bytes:
        """The memory an :meth:`open_preloaded` process wrote when it exited."""
        path = Path(workdir) / "memory.hex"
        if not path.exists():
            raise RuntimeError(f"{path}: the board process wrote no memory file (did it exit?)")
        return read_dump(path, self.config.dram_bus_bytes)
