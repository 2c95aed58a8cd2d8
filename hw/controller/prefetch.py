"""Weight prefetch: the next weights into the store while the current group computes."""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from sfnpu import isa
from sfnpu.config import HwConfig
from sfnpu.isa import ConvKind, MemSpace, Opcode
from sfnpu.regmap import ErrorCode

from ..dma import Direction
from .common import INSTRUCTION_BYTES, ISA, aligned_instruction, fetch_beats, instruction_shift, \
    log2, shifted_in

__all__ = ["WeightPrefetch"]

# States (one-hot free: the encoding of the original controller).
IDLE, INSTR_CMD, INSTR_DATA, ALIGN, BLOCKS, WORDS, CHECK, CHUNK, PLACE, WEIGHT_CMD, \
    WEIGHT_DATA, DONE, FAIL = range(13)


class WeightPrefetch(wiring.Component):
    """In the compute phase, at the lowest bus priority, the next weights load at the other
    end of the weight store from the ones computing (word 0 when those are above it, else
    the top), so that their DRAM time hides behind the array's.

    ``double_buffer`` (frame reuse whose weights exceed the store): while a chunk computes,
    the group's next chunk (chunks of at most half the store); its first word goes to
    ``chunk_base``. ``prefetch``, during the group's (last) chunk: read the next instruction,
    size its weights (a normal convolution: OB·IB·kh·kw words), check that they fit beside
    this chunk's, load them whole; ``loaded`` then tells the sequencer that the store holds
    them as if the next group had loaded them (at ``pf_base``, DRAM offset ``held_offset``).
    A next group that is not a normal convolution with DRAM weights fails with UNSUPPORTED,
    weights that do not fit with BUFFER_OVERFLOW.

    Parameters
    ----------
    config : HwConfig
    addr_width : int
    words : int
        Weight-store words.
    cmd_layout : Layout

    Signature
    ---------
    flush, start : In(1)
        Abort; a compute phase's first cycle (the prefetch starts).
    instr : In(InstructionLayout), base, fetch_addr : In(addr_width)
        The group's instruction, the image base, the instruction's address.
    ob_base, ob_count, out_blocks : In(16)
        The chunk's output blocks and the group's.
    load_words : In(32)
        The computing chunk's weight words (the sequencer's).
    next_src : In(addr_width), next_words : In(32)
        The group's next chunk: its DRAM address and words (the sequencer's registers).
    identity, streaming : In(1)
        The group has no weights in the store.
    weights_base : In(range(words + 1))
        Where the computing weights start.
    cmd : Out(stream.Signature(cmd_layout))
        DMA reads.
    beats : In(stream.Signature(StructLayout({"data", "last"}), always_ready=True))
        Their data.
    pf_write : Out(1), pf_base : Out(range(words + 1)), pf_pos : Out(24)
        Store writes: the beat at byte ``pf_pos`` of weights placed from word ``pf_base``.
    chunk_base : Out(range(words + 1))
        Where the next double-buffered chunk starts.
    loaded : Out(1), held_offset : Out(30)
        The next group's weights are in (at ``pf_base``; their DRAM offset).
    busy, failed : Out(1), error : Out(ErrorCode)
    """

    def __init__(self, config: HwConfig, addr_width: int, words: int, cmd_layout):
        self.config = config
        self.words = words
        B = config.dram_bus_bytes
        super().__init__({
            "flush": In(1), "start": In(1),
            "instr": In(isa.InstructionLayout),
            "base": In(addr_width), "fetch_addr": In(addr_width),
            "ob_base": In(16), "ob_count": In(16), "out_blocks": In(16),
            "load_words": In(32), "next_src": In(addr_width), "next_words": In(32),
            "identity": In(1), "streaming": In(1),
            "weights_base": In(range(words + 1)),
            "cmd": Out(stream.Signature(cmd_layout)),
            "beats": In(stream.Signature(data.StructLayout({"data": 8 * B, "last": 1}),
                                         always_ready=True)),
            "pf_write": Out(1), "pf_base": Out(range(words + 1)), "pf_pos": Out(24),
            "chunk_base": Out(range(words + 1)),
            "loaded": Out(1), "held_offset": Out(30),
            "busy": Out(1), "failed": Out(1), "error": Out(ErrorCode),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        B, Ti, To = cfg.dram_bus_bytes, cfg.ti, cfg.to
        instr, cmd, beats = self.instr, self.cmd, self.beats
        state = Signal(range(13))
        buf = Signal(fetch_beats(B) * B * 8)
        bits = Signal(ISA.size)
        nxt = data.View(isa.InstructionLayout, bits)
        words = Signal(32)
        src = Signal(len(self.base))    # DRAM address of the weights to load
        chunk = Signal()                # they are this group's next chunk
        pf_base, pf_pos, error = self.pf_base, self.pf_pos, self.error
        own_words = Signal(32)          # the computing chunk's words in the store
        more_chunks = self.ob_base + self.ob_count < self.out_blocks
        # The next instruction's weight words, products of registers set in ALIGN, formed
        # every cycle (read in CHECK): no multiplier shared with another state.
        instr_blocks = Signal(32)
        instr_words = Signal(32)
        m.d.sync += [instr_blocks.eq(((nxt.out_c + To - 1) >> log2(To))
                                     * ((nxt.in_c + Ti - 1) >> log2(Ti))),
                     instr_words.eq(instr_blocks * (nxt.kh * nxt.kw))]
        instr_addr = self.fetch_addr + INSTRUCTION_BYTES
        shift = instruction_shift(m, instr_addr, B, "instr_shift")
        grant = cmd.valid & cmd.ready
        m.d.comb += [
            cmd.payload.direction.eq(Direction.READ),
            self.busy.eq((state != IDLE) & (state != DONE) & (state != FAIL)),
            self.failed.eq(state == FAIL),
            self.held_offset.eq(nxt.weights.offset),
        ]
        with m.Switch(state):
            with m.Case(INSTR_CMD):
                m.d.comb += [cmd.valid.eq(1), cmd.payload.address.eq(instr_addr),
                             cmd.payload.length.eq(INSTRUCTION_BYTES)]
                with m.If(grant):
                    m.d.sync += state.eq(INSTR_DATA)
            with m.Case(INSTR_DATA):
                with m.If(beats.valid):
                    m.d.sync += buf.eq(shifted_in(buf, beats.payload.data))
                    with m.If(beats.payload.last):
                        m.d.sync += state.eq(ALIGN)
            with m.Case(ALIGN):
                m.d.sync += [bits.eq(aligned_instruction(buf, shift)),
                             state.eq(BLOCKS)]
            with m.Case(BLOCKS):
                m.d.sync += state.eq(WORDS)
            with m.Case(WORDS):
                m.d.sync += state.eq(CHECK)
            with m.Case(CHECK):
                with m.If((nxt.opcode != Opcode.GROUP) | (nxt.conv != ConvKind.NORMAL)
                          | (nxt.weights.space != MemSpace.DRAM)):
                    m.d.sync += [error.eq(ErrorCode.UNSUPPORTED), state.eq(FAIL)]
                with m.Elif(own_words + instr_words > self.words):
                    m.d.sync += [error.eq(ErrorCode.BUFFER_OVERFLOW), state.eq(FAIL)]
                with m.Else():
                    m.d.sync += [words.eq(instr_words), src.eq(self.base + nxt.weights.offset),
                                 chunk.eq(0), state.eq(PLACE)]
            with m.Case(CHUNK):
                m.d.sync += [words.eq(self.next_words), src.eq(self.next_src),
                             chunk.eq(1), state.eq(PLACE)]
            with m.Case(PLACE):
                m.d.sync += [pf_base.eq(Mux(self.weights_base == 0, self.words - words, 0)),
                             pf_pos.eq(0), state.eq(WEIGHT_CMD)]
            with m.Case(WEIGHT_CMD):
                m.d.comb += [cmd.valid.eq(1), cmd.payload.address.eq(src),
                             cmd.payload.length.eq(words << log2(Ti * To))]
                with m.If(grant):
                    m.d.sync += state.eq(WEIGHT_DATA)
            with m.Case(WEIGHT_DATA):
                with m.If(beats.valid):
                    m.d.comb += self.pf_write.eq(1)
                    m.d.sync += pf_pos.eq(pf_pos + B)
                    with m.If(beats.payload.last):
                        m.d.sync += state.eq(DONE)
                        with m.If(chunk):
                            m.d.sync += self.chunk_base.eq(pf_base)
                        with m.Else():
                            m.d.comb += self.loaded.eq(1)
        with m.If(self.flush):
            m.d.sync += state.eq(IDLE)
        with m.Elif(self.start):
            m.d.sync += [state.eq(Mux(instr.double_buffer & more_chunks, CHUNK,
                                      Mux(instr.prefetch, INSTR_CMD, IDLE))),
                         own_words.eq(Mux(self.identity | self.streaming, 0, self.load_words))]
        return m
