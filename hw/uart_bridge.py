"""Host link bridge: bytes of the :mod:`sfnpu.hostlink` protocol in, register and memory
accesses out.

The bridge reads requests from a byte stream (a UART receiver), performs them on an
AXI4-Lite master (the accelerator's registers) or on the memory's host word port, and writes
the replies to a byte stream (a UART transmitter). One request at a time; every request gets a
reply, so a host never waits on a lost answer. Register accesses whose slave does not answer
within ``timeout`` cycles get an SLVERR reply instead of hanging the link.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from sfnpu.hostlink import HEADER_BYTES, LINK_VERSION, Command, Status

from .axi import AxiLiteSignature
from .block_ram import HostPortSignature

__all__ = ["UartBridge"]


class UartBridge(wiring.Component):
    """Signature
    ---------
    i_stream : In(stream.Signature(8))
        Request bytes.
    o_stream : Out(stream.Signature(8))
        Reply bytes.
    csr : Out(AxiLiteSignature(csr_addr_width))
        Register master.
    mem : Out(HostPortSignature(word_bits, data_width))
        The memory's host port (word addresses).
    """

    def __init__(self, *, memory_bytes: int, data_width: int, word_bits: int,
                 csr_addr_width: int, timeout: int = 1 << 16):
        self.memory_bytes = memory_bytes
        self.word_bytes = data_width // 8
        self.memory_words = memory_bytes // self.word_bytes
        self.data_width = data_width
        self.timeout = timeout
        super().__init__({
            "i_stream": In(stream.Signature(8)),
            "o_stream": Out(stream.Signature(8)),
            "csr": Out(AxiLiteSignature(csr_addr_width)),
            "mem": Out(HostPortSignature(word_bits, data_width)),
        })

    def elaborate(self, platform):
        m = Module()
        rx, tx, csr, mem = self.i_stream, self.o_stream, self.csr, self.mem
        W = self.word_bytes
        ident = Cat(Const(LINK_VERSION, 8), Const(self.memory_bytes, 32), Const(W, 8),
                    Const(Status.OKAY.value, 8))
        command = Signal(Command, init=Command.IDENT)
        header = Signal(48)
        index = Signal(range(max(W, 6) + 1))
        out = Signal(max(len(ident), self.data_width))   # bytes to send, LSB first
        left = Signal(range(len(out) // 8 + 1))          # bytes of `out` still to send
        word = Signal(32)
        count = Signal(16)
        bad = Signal()
        sent_address = Signal()
        sent_data = Signal()
        timer = Signal(range(self.timeout + 1))

        def reply(value, nbytes, next_state="COMMAND"):
            m.d.sync += [out.eq(value), left.eq(nbytes)]
            m.next = next_state

        def goto(state):
            m.next = state

        def send_state(name, then):
            with m.State(name):
                m.d.comb += [tx.valid.eq(1), tx.payload.eq(out[:8])]
                with m.If(tx.ready):
                    m.d.sync += [out.eq(out >> 8), left.eq(left - 1)]
                    with m.If(left == 1):
                        then()

        def register_timeout(reply_bytes):
            """Count a register access's cycles; give up with SLVERR after `timeout`."""
            m.d.sync += timer.eq(timer + 1)
            with m.If(timer == self.timeout):
                reply(Status.SLVERR.value << (8 * (reply_bytes - 1)), reply_bytes, "REPLY")

        m.d.comb += [
            csr.aw.payload.addr.eq(header[:16]),
            csr.ar.payload.addr.eq(header[:16]),
            csr.w.payload.data.eq(header[16:48]),
            csr.w.payload.strb.eq(0xF),
            mem.addr.eq(word),
            mem.wdata.eq(out),
        ]

        with m.FSM(name="bridge"):
            with m.State("COMMAND"):
                m.d.comb += rx.ready.eq(1)
                with m.If(rx.valid):
                    m.d.sync += [command.eq(rx.payload), index.eq(0)]
                    with m.Switch(rx.payload):
                        with m.Case(Command.IDENT):
                            reply(ident, len(ident) // 8, "REPLY")
                        for cmd in (Command.CSR_WRITE, Command.CSR_READ, Command.MEM_WRITE,
                                    Command.MEM_READ):
                            with m.Case(cmd):
                                m.next = "HEADER"
                        with m.Default():
                            reply(Status.UNKNOWN_COMMAND.value, 1, "REPLY")
            with m.State("HEADER"):
                m.d.comb += rx.ready.eq(1)
                with m.If(rx.valid):
                    m.d.sync += [header.word_select(index, 8).eq(rx.payload),
                                 index.eq(index + 1)]
                    with m.Switch(command):
                        for cmd, n in HEADER_BYTES.items():
                            if n:
                                with m.Case(cmd):
                                    with m.If(index == n - 1):
                                        m.next = "DISPATCH"
            with m.State("DISPATCH"):
                m.d.sync += [word.eq(header[:32]), count.eq(header[32:48]), bad.eq(0),
                             index.eq(0), sent_address.eq(0), sent_data.eq(0), timer.eq(0)]
                with m.Switch(command):
                    with m.Case(Command.CSR_WRITE):
                        m.next = "CSR_WRITE"
                    with m.Case(Command.CSR_READ):
                        m.next = "CSR_READ"
                    with m.Case(Command.MEM_WRITE, Command.MEM_READ):
                        with m.If(header[32:48] == 0):
                            reply(Status.OKAY.value, 1, "REPLY")
                        with m.Elif(command == Command.MEM_WRITE):
                            m.next = "MEM_WRITE_DATA"
                        with m.Else():
                            m.next = "MEM_READ"

            with m.State("CSR_WRITE"):
                m.d.comb += [csr.aw.valid.eq(~sent_address), csr.w.valid.eq(~sent_data),
                             csr.b.ready.eq(sent_address & sent_data)]
                with m.If(csr.aw.valid & csr.aw.ready):
                    m.d.sync += sent_address.eq(1)
                with m.If(csr.w.valid & csr.w.ready):
                    m.d.sync += sent_data.eq(1)
                with m.If(csr.b.valid & csr.b.ready):
                    reply(csr.b.payload.resp, 1, "REPLY")
                with m.Else():
                    register_timeout(1)
            with m.State("CSR_READ"):
                m.d.comb += [csr.ar.valid.eq(~sent_address), csr.r.ready.eq(sent_address)]
                with m.If(csr.ar.valid & csr.ar.ready):
                    m.d.sync += sent_address.eq(1)
                with m.If(csr.r.valid & csr.r.ready):
                    reply(Cat(csr.r.payload.data, csr.r.payload.resp.as_value(), Const(0, 6)),
                          5, "REPLY")
                with m.Else():
                    register_timeout(5)

            def next_word(more_state):
                m.d.sync += [word.eq(word + 1), count.eq(count - 1), index.eq(0)]
                with m.If(count == 1):
                    reply(Mux(bad | (word >= self.memory_words), Status.DECERR.value, Status.OKAY.value), 1, "REPLY")
                with m.Else():
                    m.next = more_state

            with m.State("MEM_WRITE_DATA"):
                m.d.comb += rx.ready.eq(1)
                with m.If(rx.valid):
                    m.d.sync += [out.word_select(index, 8).eq(rx.payload), index.eq(index + 1)]
                    with m.If(index == W - 1):
                        m.next = "MEM_WRITE_STORE"
            with m.State("MEM_WRITE_STORE"):
                with m.If(word < self.memory_words):
                    m.d.comb += mem.we.eq(1)
                    with m.If(mem.done):        # block RAM: at once; SDRAM: cycles later
                        next_word("MEM_WRITE_DATA")
                with m.Else():
                    m.d.sync += bad.eq(1)
                    next_word("MEM_WRITE_DATA")
            with m.State("MEM_READ"):
                with m.If(word < self.memory_words):
                    m.d.comb += mem.re.eq(1)
                    with m.If(mem.done):
                        reply(mem.rdata, W, "MEM_READ_SEND")
                with m.Else():
                    m.d.sync += bad.eq(1)
                    reply(0, W, "MEM_READ_SEND")
            send_state("MEM_READ_SEND", lambda: next_word("MEM_READ"))
            send_state("REPLY", lambda: goto("COMMAND"))
        return m
