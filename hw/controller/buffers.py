"""The three interchangeable on-chip buffers {0, 1, 2} and their local readers and writer."""

from __future__ import annotations

from amaranth.hdl import Array, Module, Mux, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sfnpu.isa import MemSpace

__all__ = ["FeatureBuffers", "segment_layout", "READERS"]

#: The buffers' read sides: the input stream and the shortcut stream.
READERS = ("input", "shortcut")


def segment_layout(words: int, count=16) -> data.StructLayout:
    """A local read or write command: ``count`` words from word ``address`` on."""
    return data.StructLayout({"address": range(words + 1), "count": count})


class FeatureBuffers(wiring.Component):
    """Buffers {0, 1, 2} of feature maps (frame-mode groups): word = one pixel of one channel
    block; per buffer one read port and one write port, so that each is one simple dual-port
    memory (one DP16KD or RAMB per slice of it, not one copy per reader).

    The input and shortcut readers share the read ports: a group reads its input and its
    shortcut from different buffers (:func:`sfnpu.isa.validate`; the sequencer stops a group
    that does not with ``ILLEGAL_FIELD``), so each buffer's port takes the shortcut reader's
    address when ``shortcut_space`` names it and the input reader's otherwise. That choice is
    a register loaded every cycle: ``shortcut_space`` (an instruction field) must settle a
    cycle before the shortcut reader's first command, and the multiplexer in front of the
    block RAMs' address pins waits for no comparison.

    Each reader streams a commanded segment from the buffer at its ``space``, one word per
    cycle, and takes the next command once the last word is addressed. The writer stores a
    commanded chunk of the output, word by word as ``o_data`` delivers it; staging writes
    (the first chunk's DRAM input, copied for the later chunks) take the port of the buffer
    at ``stage_space`` before the writer.

    Parameters
    ----------
    lanes : int
        Bytes per word.
    words : int
        Words per buffer.
    chunk_words : int
        The longest write command.

    Signature
    ---------
    flush, start : In(1)
        Abort or a compute phase's start: readers and writer drop their commands.
    <reader>_cmd : In(stream.Signature(segment_layout(words))), reader in :data:`READERS`
        A segment to read; ready while the reader is idle.
    <reader>_space : In(MemSpace)
        The buffer the reader reads (BUF0 … BUF2; held while its words come).
    <reader>_data : Out(stream.Signature(8 · lanes, always_ready=True))
        The words, one cycle after their address.
    o_cmd : In(stream.Signature(segment_layout(words, range(chunk_words + 1))))
        A chunk to write; ready while the writer is idle.
    o_space : In(MemSpace)
        The buffer the writer writes.
    o_data : In(stream.Signature(8 · lanes))
        The chunk's words.
    stage : In(stream.Signature(StructLayout({"address", "data"}), always_ready=True))
        A staging write into ``stage_space``.
    stage_space : In(MemSpace)
    """

    def __init__(self, lanes: int, words: int, chunk_words: int):
        self.lanes = lanes
        self.words = words
        self.chunk_words = chunk_words
        members = {"flush": In(1), "start": In(1)}
        for name in READERS:
            members.update({
                f"{name}_cmd": In(stream.Signature(segment_layout(words))),
                f"{name}_space": In(MemSpace),
                f"{name}_data": Out(stream.Signature(8 * lanes, always_ready=True)),
            })
        members.update({
            "o_cmd": In(stream.Signature(segment_layout(words, range(chunk_words + 1)))),
            "o_space": In(MemSpace),
            "o_data": In(stream.Signature(8 * lanes)),
            "stage": In(stream.Signature(data.StructLayout({
                "address": range(words + 1), "data": 8 * lanes}), always_ready=True)),
            "stage_space": In(MemSpace),
        })
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        mems = []
        for k in range(3):
            mems.append(mem := Memory(shape=8 * self.lanes, depth=self.words, init=[]))
            m.submodules[f"buffer_{k}"] = mem
        ports = [mem.read_port() for mem in mems]
        addrs = {name: self._reader(m, name, ports) for name in READERS}
        for k, port in enumerate(ports):
            shortcut_here = Signal(name=f"shortcut_reads_{k}", reset_less=True)
            m.d.sync += shortcut_here.eq(self.shortcut_space == MemSpace(k + 1))
            m.d.comb += [port.addr.eq(Mux(shortcut_here, addrs["shortcut"], addrs["input"])),
                         port.en.eq(1)]
        self._writer(m, [mem.write_port() for mem in mems])
        return m

    def _reader(self, m, name, ports):
        """One reader's command sequencing; returns the address it reads in this cycle."""
        cmd, out = getattr(self, f"{name}_cmd"), getattr(self, f"{name}_data")
        addr = Signal(range(self.words + 1), name=f"{name}_local_addr")
        left = Signal(16, name=f"{name}_local_left")
        issued = Signal(name=f"{name}_local_issued")
        m.d.comb += cmd.ready.eq(left == 0)
        with m.If(self.flush | self.start):
            m.d.sync += left.eq(0)
        with m.Elif(cmd.valid & cmd.ready):
            m.d.sync += [addr.eq(cmd.payload.address), left.eq(cmd.payload.count)]
        with m.Elif(left != 0):
            m.d.sync += [addr.eq(addr + 1), left.eq(left - 1)]
        m.d.sync += issued.eq((left != 0) & ~self.flush)
        space = getattr(self, f"{name}_space")
        m.d.comb += [out.valid.eq(issued),
                     out.payload.eq(Array(port.data for port in ports)[
                         (Value.cast(space) - 1)[:2]])]
        return addr

    def _writer(self, m, ports):
        cmd, o_data, stage = self.o_cmd, self.o_data, self.stage
        lw_addr = Signal(range(self.words + 1))
        lw_left = Signal(range(self.chunk_words + 1))
        m.d.comb += [cmd.ready.eq(lw_left == 0), o_data.ready.eq(lw_left != 0)]
        sent = o_data.valid & o_data.ready
        with m.If(self.flush | self.start):
            m.d.sync += lw_left.eq(0)
        with m.Elif(cmd.valid & cmd.ready):
            m.d.sync += [lw_addr.eq(cmd.payload.address), lw_left.eq(cmd.payload.count)]
        with m.Elif(sent):
            m.d.sync += [lw_addr.eq(lw_addr + 1), lw_left.eq(lw_left - 1)]
        for k, port in enumerate(ports):
            staging_here = stage.valid & (self.stage_space == MemSpace(k + 1))
            m.d.comb += [port.addr.eq(Mux(staging_here, stage.payload.address, lw_addr)),
                         port.data.eq(Mux(staging_here, stage.payload.data, o_data.payload)),
                         port.en.eq(staging_here | (sent & (self.o_space == MemSpace(k + 1))))]
