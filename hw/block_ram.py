"""On-chip block RAM behind an AXI4 slave: the DRAM of a board without a memory controller.

:class:`AxiBlockRam` serves the accelerator's AXI4 master (full-width INCR bursts, byte
strobes) from one ``lib.memory.Memory`` with one read and one write port, which maps onto
true dual-port block RAM (ECP5 DP16KD, Xilinx RAMB36). A second, word-wide *host* port gives a
bridge (:mod:`sfnpu.hw.uart_bridge`) access to the same memory; it takes a port for one cycle
ahead of the AXI side, which simply waits.

Reads have two cycles of latency: the memory's own output register plus one register after
the multiplexer that joins the block RAMs of a deep memory, which keeps that multiplexer off
the accelerator's critical path. Read beats are issued only when the response FIFO has room
for them, so RREADY may be low at any time without losing data.

Beats outside the memory answer DECERR (reads return zero, writes are dropped).

For simulation, ``backdoor=True`` keeps the same logic around a Verilog array instead of an
Amaranth memory (Amaranth writes every word's initial value, so a memory of megabytes would make
megabytes of Verilog): :data:`~sfnpu.hw.axi_mem.SIM_DRAM_VERILOG`, read through a register as
the block RAM is, with its file backdoor — the plusarg ``+sfnpu_load=FILE`` preloads the array
at time 0 (``$readmemh``), and a clock edge with ``backdoor_dump`` high writes words ``[0,
+sfnpu_dump_words)`` to ``+sfnpu_dump=FILE`` (``$writememh``).
"""

from __future__ import annotations

from amaranth.hdl import ClockSignal, Const, Instance, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.memory import Memory, ReadPort, WritePort
from amaranth.lib.wiring import In, Out

from .axi import Axi4Signature, Resp
from .axi_mem import SIM_DRAM_MODULE

__all__ = ["AxiBlockRam", "HostPortSignature"]

#: Cycles from a read address to its data at the output register.
READ_LATENCY = 2


class HostPortSignature(wiring.Signature):
    """A word port from the host's side: hold ``re`` or ``we`` until ``done``; read data is
    valid with ``done``. ``addr`` counts words."""

    def __init__(self, addr_width: int, data_width: int):
        super().__init__({
            "addr": Out(addr_width),
            "wdata": Out(data_width),
            "we": Out(1),
            "re": Out(1),
            "rdata": In(data_width),
            "done": In(1),
        })


class AxiBlockRam(wiring.Component):
    """``size`` bytes of block RAM on an AXI4 slave with a host word port.

    Signature
    ---------
    bus : In(Axi4Signature(addr_width, data_width))
        The slave port (the accelerator's DRAM master connects here).
    host : In(HostPortSignature(word_bits, data_width))
        Word access for a bridge; takes priority over the bus for one cycle at a time.
    backdoor_dump : In(1)
        With ``backdoor=True`` only (simulation): a clock edge with it high writes the memory
        to the file named by ``+sfnpu_dump`` (see the module docstring).
    """

    def __init__(self, *, size: int, data_width: int = 32, addr_width: int = 32,
                 backdoor: bool = False):
        self.bus_bytes = data_width // 8
        if size <= 0 or size % self.bus_bytes:
            raise ValueError(f"block RAM size {size} must be a positive multiple of "
                             f"{self.bus_bytes} bytes (the bus width)")
        self.size = size
        self.words = size // self.bus_bytes
        self.data_width = data_width
        self.addr_width = addr_width
        self.word_bits = max(1, (self.words - 1).bit_length())
        self.backdoor = backdoor
        members = {
            "bus": In(Axi4Signature(addr_width, data_width)),
            "host": In(HostPortSignature(self.word_bits, data_width)),
        }
        if backdoor:
            members["backdoor_dump"] = In(1)
        super().__init__(members)

    def _storage(self, m):
        """The read port (data one cycle after the address) and the byte-wide write port."""
        if not self.backdoor:
            m.submodules.storage = storage = Memory(shape=self.data_width, depth=self.words,
                                                    init=[])
            read = storage.read_port()
            write = storage.write_port(granularity=8)
            return read, write
        read = ReadPort.Signature(addr_width=self.word_bits,
                                  shape=self.data_width).create(path=("read",))
        write = WritePort.Signature(addr_width=self.word_bits, shape=self.data_width,
                                    granularity=8).create(path=("write",))
        array_data = Signal(self.data_width)
        m.submodules.storage = Instance(
            SIM_DRAM_MODULE, p_WORDS=self.words, p_WIDTH=self.data_width,
            i_clk=ClockSignal(), i_raddr=read.addr, o_rdata=array_data,
            i_waddr=write.addr, i_wdata=write.data, i_wstrb=write.en,
            i_baddr=0, i_bwdata=0, i_bwe=0, i_bdump=self.backdoor_dump)
        m.d.sync += read.data.eq(array_data)
        return read, write

    def elaborate(self, platform):
        m = Module()
        bus, host = self.bus, self.host
        offset_bits = self.bus_bytes.bit_length() - 1
        bus_word_bits = self.addr_width - offset_bits
        read, write = self._storage(m)

        def in_range(word):
            return word < self.words

        # -- reads: issue → memory output → output register → response FIFO ---------------
        beat = data.StructLayout({"data": self.data_width, "resp": Resp, "last": 1})
        fifo_depth = 4
        m.submodules.r_fifo = r_fifo = SyncFIFO(width=beat.size, depth=fifo_depth)
        r_active = Signal()
        r_word = Signal(bus_word_bits)
        r_left = Signal(9)
        stage = [Signal(data.StructLayout({"valid": 1, "host": 1, "resp": Resp, "last": 1}),
                        name=f"read_stage{k}") for k in range(READ_LATENCY)]
        in_flight = sum(s.valid for s in stage)
        room = r_fifo.level + in_flight < fifo_depth
        issue_bus = r_active & room & ~host.re
        issue_host = host.re & ~(stage[0].valid & stage[0].host) & \
            ~(stage[1].valid & stage[1].host)

        m.d.comb += bus.ar.ready.eq(~r_active)
        with m.If(bus.ar.valid & bus.ar.ready):
            m.d.sync += [r_active.eq(1), r_word.eq(bus.ar.payload.addr[offset_bits:]),
                         r_left.eq(bus.ar.payload.len + 1)]
        with m.If(issue_bus):
            m.d.sync += [r_word.eq(r_word + 1), r_left.eq(r_left - 1)]
            with m.If(r_left == 1):
                m.d.sync += r_active.eq(0)

        m.d.comb += read.addr.eq(Mux(issue_host, host.addr, r_word))
        m.d.sync += [
            stage[0].valid.eq(issue_bus | issue_host),
            stage[0].host.eq(issue_host),
            stage[0].resp.eq(Mux(issue_host | in_range(r_word), Resp.OKAY, Resp.DECERR)),
            stage[0].last.eq(r_left == 1),
            stage[1].eq(stage[0]),
        ]
        read_data = Signal(self.data_width)
        m.d.sync += read_data.eq(Mux(stage[0].resp == Resp.OKAY, read.data, 0))
        out = data.View(beat, r_fifo.w_data)
        m.d.comb += [
            out.data.eq(read_data), out.resp.eq(stage[1].resp), out.last.eq(stage[1].last),
            r_fifo.w_en.eq(stage[1].valid & ~stage[1].host),
        ]
        head = data.View(beat, r_fifo.r_data)
        m.d.comb += [
            bus.r.valid.eq(r_fifo.r_rdy),
            bus.r.payload.data.eq(head.data),
            bus.r.payload.resp.eq(head.resp),
            bus.r.payload.last.eq(head.last),
            r_fifo.r_en.eq(bus.r.ready),
        ]

        # -- writes: AW, then W beats into the write port, then one B ------------------------
        w_word = Signal(bus_word_bits)
        w_bad = Signal()
        with m.FSM(name="write"):
            with m.State("ADDRESS"):
                m.d.comb += bus.aw.ready.eq(1)
                with m.If(bus.aw.valid):
                    m.d.sync += [w_word.eq(bus.aw.payload.addr[offset_bits:]), w_bad.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                m.d.comb += bus.w.ready.eq(~host.we)
                with m.If(bus.w.valid & bus.w.ready):
                    m.d.sync += w_word.eq(w_word + 1)
                    with m.If(~in_range(w_word)):
                        m.d.sync += w_bad.eq(1)
                    with m.If(bus.w.payload.last):
                        m.next = "RESPONSE"
            with m.State("RESPONSE"):
                m.d.comb += [bus.b.valid.eq(1),
                             bus.b.payload.resp.eq(Mux(w_bad, Resp.DECERR, Resp.OKAY))]
                with m.If(bus.b.ready):
                    m.next = "ADDRESS"

        bus_write = bus.w.valid & bus.w.ready & in_range(w_word)
        m.d.comb += [
            write.addr.eq(Mux(host.we, host.addr, w_word)),
            write.data.eq(Mux(host.we, host.wdata, bus.w.payload.data)),
            write.en.eq(Mux(host.we, Const(-1, len(write.en)),
                             Mux(bus_write, bus.w.payload.strb, 0))),
        ]

        # Host completion: a write in its cycle, a read when its data reaches the output.
        m.d.comb += [
            host.rdata.eq(read_data),
            host.done.eq(host.we | (stage[1].valid & stage[1].host)),
        ]
        return m

