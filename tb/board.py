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
"""

from __future__ import annotations

import os
import select
import subprocess
from pathlib import Path

from sfnpu.config import HwConfig

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

int main(int argc, char** argv) {{
    if (argc != 2) {{ std::fprintf(stderr, "usage: max_cycles\n"); return 2; }}
    Verilated::commandArgs(1, argv);
    uint64_t max_cycles = std::strtoull(argv[1], 0, 0);
    V{top}* dut = new V{top};
    uint64_t cycle = 0;
    auto tick = [&]() {{ dut->clk = 1; dut->eval(); dut->clk = 0; dut->eval(); ++cycle; }};
    dut->uart_rx = 1; dut->rst = 1; dut->clk = 0; dut->eval();
    for (int k = 0; k < 4; ++k) tick();
    dut->rst = 0;

    std::deque<uint8_t> to_board;
    std::vector<uint8_t> from_board;
    int send_bit = -1, send_timer = 0; uint16_t send_frame = 0;     // host -> board
    int recv_bit = -1, recv_timer = 0; uint8_t recv_byte = 0;       // board -> host
    uint64_t quiet = 0;                  // cycles with nothing on either wire
    bool input_open = true;
    const uint64_t QUIET_LIMIT = 64ull * DIVISOR;

    while (cycle < max_cycles) {{
        bool idle = send_bit < 0 && to_board.empty() && recv_bit < 0;
        if (input_open && (to_board.empty() || cycle % 1024 == 0)) {{
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
    std::fprintf(stderr, "board: %llu cycles\n", (unsigned long long)cycle);
    delete dut;
    return cycle >= max_cycles ? 6 : 0;
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


class BoardHarness:
    """The Verilated board system; :meth:`open` starts a simulated board process."""

    def __init__(self, config: HwConfig, build_dir, *, memory_bytes: int,
                 uart_divisor: int = 4, jobs: int = 2):
        from sfnpu.hw.board import BoardSystem
        self.config = config
        self.build_dir = Path(build_dir)
        name = "board_system"
        top = BoardSystem(config, memory="bram", memory_bytes=memory_bytes,
                          uart_divisor=uart_divisor,
                          heartbeat_bits=8)
        driver = _DRIVER.format(top=name, divisor=uart_divisor)
        self.executable = build_verilated(self.build_dir, name, to_verilog(top, name), driver,
                                          ("-O2",), jobs)

    def open(self, max_cycles: int = 50_000_000) -> subprocess.Popen:
        return subprocess.Popen([str(self.executable), str(max_cycles)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
