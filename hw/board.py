"""Everything a board needs around the accelerator, short of pins and clocks.

:class:`BoardSystem` holds the :class:`~sfnpu.hw.accelerator.Accelerator`, its DRAM — the
board's SDRAM through :class:`~sfnpu.hw.sdram.SdramController`, or block RAM
(:class:`~sfnpu.hw.block_ram.AxiBlockRam`) —, a UART host link
(:class:`~sfnpu.hw.uart_bridge.UartBridge` on the registers and the memory) and a heartbeat.
A board top (:mod:`sfnpu.hw.ulx3s`) adds the PLL, the reset and the pins; simulation drives the
UART pin directly (:mod:`sfnpu.tb.board`, with block RAM: Verilator has no SDRAM).
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from sfnpu.config import HwConfig

from .accelerator import CSR_ADDR_WIDTH, Accelerator
from .block_ram import AxiBlockRam
from .sdram import SdramController, SdramPinsSignature
from .sdram_timing import AS4C_7, ULX3S_SDRAM
from .skid_buffer import SkidBuffer
from .uart import UartRx, UartTx
from .uart_bridge import UartBridge

__all__ = ["BoardSystem", "MEMORIES"]

#: What can serve as the accelerator's DRAM.
MEMORIES = ("sdram", "bram")


class BoardSystem(wiring.Component):
    """Accelerator + memory + UART bridge.

    Parameters
    ----------
    config : HwConfig
    memory : "sdram" or "bram"
        The accelerator's DRAM, at bus address 0: the board's 32 MB SDRAM (pins on ``sdram``;
        AS4C-7 timing at ``clock_mhz``) or ``memory_bytes`` of block RAM.
    memory_bytes : int
        The block RAM's size (``memory="bram"`` only).
    backdoor : bool
        Simulation only (``memory="bram"``): the block RAM's storage is a Verilog array with a
        file backdoor (:class:`~sfnpu.hw.block_ram.AxiBlockRam`'s ``backdoor``), so a
        simulated board may have megabytes of it and start with an image in it.
    clock_mhz : float
        The clock the SDRAM timing is computed for (default: the configuration's).
    sdram_read_delay : int
        Register stages the board adds between the SDRAM controller and the pins
        (:class:`~sfnpu.hw.sdram.SdramController`'s ``read_delay``).
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
    sdram : Out(SdramPinsSignature(ULX3S_SDRAM))
        The SDRAM's pins (``memory="sdram"`` only).
    backdoor_dump : In(1)
        With ``backdoor`` only: an edge with it high writes the block RAM to a file.
    """

    def __init__(self, config: HwConfig, *, memory: str = "sdram",
                 memory_bytes: int | None = None, uart_divisor: int,
                 clock_mhz: float | None = None, sdram_read_delay: int = 0,
                 heartbeat_bits: int = 26, with_accelerator: bool = True,
                 backdoor: bool = False):
        if memory not in MEMORIES:
            raise ValueError(f"memory={memory!r}: choose one of {', '.join(MEMORIES)}")
        if (memory == "bram") != (memory_bytes is not None):
            raise ValueError("memory_bytes sizes the block RAM: give it with memory='bram' only")
        if backdoor and memory != "bram":
            raise ValueError("backdoor is the simulated block RAM's: give it with memory='bram'")
        self.config = config
        self.memory = memory
        self.with_accelerator = with_accelerator
        self.sdram_cycles = AS4C_7.cycles(clock_mhz or config.clock_mhz)
        self.sdram_read_delay = sdram_read_delay
        self.memory_bytes = memory_bytes if memory == "bram" else ULX3S_SDRAM.size_bytes
        self.uart_divisor = uart_divisor
        self.heartbeat_bits = heartbeat_bits
        self.backdoor = backdoor
        members = {
            "uart_rx": In(1, init=1),
            "uart_tx": Out(1, init=1),
            "heartbeat": Out(1),
            "irq": Out(1),
        }
        if memory == "sdram":
            members["sdram"] = Out(SdramPinsSignature(ULX3S_SDRAM))
        if backdoor:
            members["backdoor_dump"] = In(1)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        if self.memory == "sdram":
            m.submodules.memory = memory = SdramController(
                self.sdram_cycles, geometry=ULX3S_SDRAM, data_width=cfg.dram_bus_bits,
                addr_width=32, read_delay=self.sdram_read_delay)
            wiring.connect(m, memory.sdram, wiring.flipped(self.sdram))
        else:
            m.submodules.memory = memory = AxiBlockRam(
                size=self.memory_bytes, data_width=cfg.dram_bus_bits, addr_width=32,
                backdoor=self.backdoor)
            if self.backdoor:
                m.d.comb += memory.backdoor_dump.eq(self.backdoor_dump)
        m.submodules.uart_rx = rx = UartRx(self.uart_divisor)
        m.submodules.uart_tx = tx = UartTx(self.uart_divisor)
        m.submodules.bridge = bridge = UartBridge(
            memory_bytes=self.memory_bytes, data_width=cfg.dram_bus_bits,
            word_bits=memory.word_bits, csr_addr_width=CSR_ADDR_WIDTH)
        if self.with_accelerator:
            m.submodules.accel = accel = Accelerator(cfg, addr_width=32)
            for channel in ("aw", "b", "ar"):
                wiring.connect(m, getattr(accel.bus, channel), getattr(memory.bus, channel))
            # The W channel through a skid buffer: the SDRAM controller's W ready is deep
            # logic (open-row compares, timers, the burst state), and the DMA's write path
            # behind it ran to the write buffer's counters in the same cycle.
            m.submodules.w_slice = w_slice = SkidBuffer(accel.bus.w.payload.shape())
            wiring.connect(m, accel.bus.w, w_slice.i_stream)
            wiring.connect(m, w_slice.o_stream, memory.bus.w)
            # The R channel too: a read beat left the memory's read queue (a multiplexer on
            # its read pointer) and ran through the DMA and the router into the weight and
            # input FIFOs' write ports in one cycle. Its payload is a register: the DMA's
            # R ready is shallow, and the beat goes far (with two slots, their multiplexer
            # stood at the near end of an 18 ns route into the input FIFO's block RAM).
            m.submodules.r_slice = r_slice = SkidBuffer(accel.bus.r.payload.shape(),
                                                        payload_register=True)
            wiring.connect(m, memory.bus.r, r_slice.i_stream)
            wiring.connect(m, r_slice.o_stream, accel.bus.r)
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
