"""Output writer: the write buffer and its commands, to DRAM or an on-chip buffer."""

from __future__ import annotations

from amaranth.hdl import Module, Mux, ResetInserter, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from sfnpu import isa

from ..dma import Direction
from ..fifo import BlockRamFIFO
from .buffers import segment_layout
from .common import log2, split_product

__all__ = ["OutputWriter", "SETTLE_CYCLES"]

#: Cycles from start to the chunk's first output address: the first block's offset is a
#: product in three register stages. The first command waits for results, which come later.
SETTLE_CYCLES = 3


class OutputWriter(wiring.Component):
    """The write buffer and the commands that empty it.

    The output is written in segments ``(oy, ob)`` of ``out_w`` words at the destination's
    channel block ``out_block0 + ob_base + ob``, each in chunks of at most half the buffer: a
    chunk is commanded only once the buffer holds all of it, so write data never waits for
    the post chain. In DRAM a chunk is one DMA write (its words leave the buffer as bus beats);
    in an on-chip buffer it is a local write command.

    Parameters
    ----------
    lanes : int
        Bytes per word.
    bus_bytes : int
        Bytes per bus beat (divides ``lanes``).
    addr_width : int
    words : int
        Write-buffer words.
    buffer_words : int
        Words of an on-chip buffer.

    Signature
    ---------
    flush, start, compute : In(1)
        Abort; a compute phase's first cycle; the compute phase.
    instr : In(InstructionLayout)
    base : In(addr_width)
        The image base (DRAM addresses are relative to it).
    ob_base, ob_count, out_block0 : In(16)
        The chunk's first output block and its count; the destination's channel-block offset.
    out_plane : In(32), out_row_bytes : In(32)
        Bytes from one channel block of the output to the next and from one row to the next
        (the whole tensor's, when the output is a window of it).
    i_stream : In(stream.Signature(8 · lanes))
        Output words, ``(oy, ob, ox)``.
    cmd : Out(stream.Signature(dma command))
        DMA writes.
    bus : Out(stream.Signature(8 · bus_bytes))
        Their data.
    local_cmd : Out(stream.Signature(segment_layout(buffer_words, …)))
        Local writes (output in buffer {0, 1, 2}).
    local_data : Out(stream.Signature(8 · lanes))
        Their data.
    drained : Out(1)
        Every word of the output has been commanded and has left the buffer.
    """

    def __init__(self, lanes: int, bus_bytes: int, addr_width: int, words: int,
                 buffer_words: int, cmd_layout):
        self.lanes = lanes
        self.bus_bytes = bus_bytes
        self.words = words
        self.chunk_words = max(1, words // 2)
        super().__init__({
            "flush": In(1), "start": In(1), "compute": In(1),
            "instr": In(isa.InstructionLayout), "base": In(addr_width),
            "ob_base": In(16), "ob_count": In(16), "out_block0": In(16),
            "out_plane": In(32), "out_row_bytes": In(32),
            "i_stream": In(stream.Signature(8 * lanes)),
            "cmd": Out(stream.Signature(cmd_layout)),
            "bus": Out(stream.Signature(8 * bus_bytes)),
            "local_cmd": Out(stream.Signature(segment_layout(buffer_words,
                                                             range(self.chunk_words + 1)))),
            "local_data": Out(stream.Signature(8 * lanes)),
            "drained": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        L, instr = self.lanes, self.instr
        m.submodules.fifo = fifo = ResetInserter(self.flush)(
            BlockRamFIFO(width=8 * L, depth=self.words))
        wiring.connect(m, wiring.flipped(self.i_stream), fifo.w_stream)
        chunk_words = self.chunk_words
        aw = len(self.base)
        o_oy = Signal(12)
        o_ob = Signal(16)
        o_left = Signal(12)            # words of the current segment not yet commanded
        o_addr = Signal(aw)
        o_row_addr = Signal(aw)
        o_seg_base = Signal(aw)        # first word of the current segment
        o_done = Signal()
        # The chunk's first block's offset is added in the last of SETTLE_CYCLES after start,
        # from a product in three register stages formed every cycle (the block sum, then
        # split_product's two): no multiplier and no adder chain between the sequencer's
        # registers and the addresses. Its operands are final at start at the latest, and
        # nothing is written before: the buffer is empty at start, results come later.
        first_block = Signal(17)
        m.d.sync += first_block.eq(self.out_block0 + self.ob_base)
        o_first_block = split_product(m, first_block, self.out_plane, "o_first_block")
        o_settle = Signal(range(SETTLE_CYCLES + 1))
        o_committed = Signal(range(self.words + 1))
        # The next command's words and the buffer level it needs, registers set with the
        # counts they derive from: the request is one comparison of registers, with no
        # adder or minimum in front of the arbiter.
        o_chunk = Signal(range(chunk_words + 1))
        o_needed = Signal(range(self.words + chunk_words + 1))
        o_req = self.compute & ~o_done & (o_settle == 0) & (fifo.level >= o_needed)

        chunk_next = Signal.like(o_chunk)
        m.d.comb += chunk_next.eq(o_chunk)
        m.d.sync += o_chunk.eq(chunk_next)

        def set_left(words):
            m.d.sync += o_left.eq(words)
            m.d.comb += chunk_next.eq(Mux(words < chunk_words, words, chunk_words))

        out_local = instr.output.space != isa.MemSpace.DRAM
        cmd, local = self.cmd, self.local_cmd
        m.d.comb += [
            cmd.valid.eq(o_req & ~out_local), cmd.payload.address.eq(o_addr),
            cmd.payload.length.eq(o_chunk * L), cmd.payload.direction.eq(Direction.WRITE),
            local.valid.eq(o_req & out_local),
            local.payload.address.eq(o_addr >> log2(L)),
            local.payload.count.eq(o_chunk),
        ]
        grant = (cmd.valid & cmd.ready) | (local.valid & local.ready)

        # Commands per chunk of a (oy, ob) segment.
        out_plane, out_row_bytes = self.out_plane, self.out_row_bytes
        with m.If(self.start):
            operand = Mux(out_local, 0, self.base) + instr.output.offset
            m.d.sync += [o_oy.eq(0), o_ob.eq(0), o_done.eq(0),
                         o_addr.eq(operand), o_row_addr.eq(operand), o_seg_base.eq(operand),
                         o_settle.eq(SETTLE_CYCLES)]
            set_left(instr.out_w)
        with m.Elif(o_settle > 1):
            m.d.sync += o_settle.eq(o_settle - 1)
        with m.Elif(o_settle == 1):
            m.d.sync += [o_addr.eq(o_addr + o_first_block),
                         o_row_addr.eq(o_row_addr + o_first_block),
                         o_seg_base.eq(o_seg_base + o_first_block), o_settle.eq(0)]
        with m.Elif(grant):
            with m.If(o_left > o_chunk):
                m.d.sync += o_addr.eq(o_addr + o_chunk * L)
                set_left(o_left - o_chunk)
            with m.Elif(o_ob + 1 < self.ob_count):
                m.d.sync += [o_ob.eq(o_ob + 1),
                             o_addr.eq(o_seg_base + out_plane),
                             o_seg_base.eq(o_seg_base + out_plane)]
                set_left(instr.out_w)
            with m.Else():
                m.d.sync += [o_ob.eq(0), o_oy.eq(o_oy + 1),
                             o_addr.eq(o_row_addr + out_row_bytes),
                             o_row_addr.eq(o_row_addr + out_row_bytes),
                             o_seg_base.eq(o_row_addr + out_row_bytes)]
                set_left(instr.out_w)
                with m.If(o_oy + 1 == instr.out_h):
                    m.d.sync += o_done.eq(1)

        # Only words of commands already issued leave the buffer: as bus beats (DRAM) or
        # word by word (a local chunk).
        word_sent = self._beats(m, fifo)
        local_sent = self.local_data.valid & self.local_data.ready
        m.d.comb += [self.local_data.payload.eq(fifo.r_data),
                     self.local_data.valid.eq(fifo.r_rdy & out_local)]
        with m.If(out_local):
            m.d.comb += fifo.r_en.eq(local_sent)
        with m.Else():
            m.d.comb += [
                self.bus.valid.eq(fifo.r_rdy & (o_committed != 0)),
                fifo.r_en.eq(word_sent),
            ]
        committed = Signal.like(o_committed)
        with m.If(~self.flush):
            m.d.comb += committed.eq(o_committed + Mux(grant, o_chunk, 0)
                                     - Mux(word_sent | local_sent, 1, 0))
        m.d.sync += [o_committed.eq(committed), o_needed.eq(committed + chunk_next)]
        m.d.comb += self.drained.eq(o_done & (o_committed == 0) & ~fifo.r_rdy)
        return m

    def _beats(self, m, fifo):
        """Words → bus beats; returns the strobe of a word's last beat."""
        B = self.bus_bytes
        beats_per_word = self.lanes // B
        wd = self.bus
        w_part = Signal(range(max(beats_per_word, 2)))
        word_sent = Signal()
        if beats_per_word == 1:
            m.d.comb += [wd.payload.eq(fifo.r_data), word_sent.eq(wd.valid & wd.ready)]
        else:
            m.d.comb += [wd.payload.eq(fifo.r_data.word_select(w_part, 8 * B)),
                         word_sent.eq(wd.valid & wd.ready & (w_part == beats_per_word - 1))]
            with m.If(self.flush):
                m.d.sync += w_part.eq(0)
            with m.Elif(wd.valid & wd.ready):
                m.d.sync += w_part.eq(Mux(w_part == beats_per_word - 1, 0, w_part + 1))
        return word_sent
