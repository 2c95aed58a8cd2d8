"""Everything a board needs around the accelerator, short of pins and clocks.

:class:`BoardSystem` holds the :class:`~sfnpu.hw.accelerator.Accelerator`, block RAM as its
DRAM (:class:`~sfnpu.hw.block_ram.AxiBlockRam`), a UART host link
(:class:`~sfnpu.hw.uart_bridge.UartBridge` on the registers and the memory) and a heartbeat.
A board top (:mod:`sfnpu.hw.ulx3s`) adds the PLL, the reset and the pins; simulation drives the
UART pin directly (:mod:`sfnpu.tb.board`).
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from sfnpu.config import HwConfig

from .accelerator import CSR_ADDR_WIDTH, Accelerator
from .block_ram import AxiBlockRam
from .uart import UartRx, UartTx
from .uart_bridge import UartBridge

__all__ = ["BoardSystem"]


class BoardSystem(wiring.Component):
    """Accelerator + block RAM + UART bridge.

    Parameters
    ----------
    config : HwConfig
    memory_bytes : int
        Block RAM serving as the accelerator's DRAM, at bus address 0.
    uart_divisor : int
        Clock cycles per UART bit.
    heartbeat_bits : int
        The heartbeat toggles every 2**(heartbeat_bits - 1) cycles.
    with_accelerator : bool
        False leaves the accelerator out (register accesses then time out with SLVERR): the
        link alone, for a quick check of a board's build flow.

    Signature
    ---------
    uart_rx : In(1)
    uart_tx : Out(1)
    heartbeat : Out(1)
        Blinks while the clock runs.
    irq : Out(1)
        The accelerator's interrupt (a run ended, if enabled).
    """

    def __init__(self, config: HwConfig, *, memory_bytes: int, uart_divisor: int,
                 heartbeat_bits: int = 26, with_accelerator: bool = True):
        self.config = config
        self.with_accelerator = with_accelerator
        self.memory_bytes = memory_bytes
        self.uart_divisor = uart_divisor
        self.heartbeat_bits = heartbeat_bits
        super().__init__({
            "uart_rx": In(1, init=1),
            "uart_tx": Out(1, init=1),
            "heartbeat": Out(1),
            "irq": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        m.submodules.memory = memory = AxiBlockRam(
            size=self.memory_bytes, data_width=cfg.dram_bus_bits, addr_width=32)
        m.submodules.uart_rx = rx = UartRx(self.uart_divisor)
        m.submodules.uart_tx = tx = UartTx(self.uart_divisor)
        m.submodules.bridge = bridge = UartBridge(
            memory_bytes=self.memory_bytes, data_width=cfg.dram_bus_bits,
            word_bits=memory.word_bits, csr_addr_width=CSR_ADDR_WIDTH)
        if self.with_accelerator:
            m.submodules.accel = accel = Accelerator(cfg, addr_width=32)
            wiring.connect(m, accel.bus, memory.bus)
            wiring.connect(m, bridge.csr, accel.csr)
            m.d.comb += self.irq.eq(accel.irq)
        wiring.connect(m, bridge.mem, memory.host)
        wiring.connect(m, rx.o_stream, bridge.i_stream)
        wiring.connect(m, bridge.o_stream, tx.i_stream)
        counter = Signal(self.heartbeat_bits)
        m.d.sync += counter.eq(counter + 1)
        m.d.comb += [
            rx.rx.eq(self.uart_rx),
            self.uart_tx.eq(tx.tx),
            self.heartbeat.eq(counter[-1]),
        ]
        return m
