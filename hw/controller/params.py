"""Parameter loader: the group's parameter block into the bias, multiplier, weight-zero-point
and post-record stores, and the activation tables' write port."""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Const, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sfnpu import layout

from .common import POST_WORDS, log2, one_hot

__all__ = ["ParamStore"]


class ParamStore(wiring.Component):
    """The per-channel parameter stores, loaded beat by beat from the parameter block (the
    sections of :func:`sfnpu.layout.param_sections`, in order, at the byte offsets the
    sequencer derives from the instruction).

    Parameters
    ----------
    lanes : int
        Output channels per block (``To``): one store word per channel block.
    bus_bytes : int
        Bytes per bus beat.
    blocks : int
        Channel blocks of the stores.

    Signature
    ---------
    load : In(1)
        ``beat`` is the parameter block's byte ``pos`` on.
    beat : In(8 · bus_bytes)
    pos : In(24)
    mult_off, wzp_off, post_off, act_off, ct_off : In(24)
        Byte offsets of the sections (bias at 0).
    channels : In(17)
        Channels of the bias/multiplier/zero-point sections.
    act_table, channel_table : In(1)
        The block has the activation table / the input transform's per-channel tables.
    act_write_en, ct_write_en : Out(1)
        ``beat`` belongs to the activation table / per-channel tables, at byte
        ``act_write_addr`` / ``ct_write_addr`` of the section.
    act_write_addr, ct_write_addr : Out(24)
    post : Out(32 · POST_WORDS)
        The post record (word 0 lowest).
    rq_addr : In(range(blocks))
        Bias and multiplier read address; ``bias``, ``mult`` one cycle later.
    bias, mult : Out(32 · lanes)
    wzp_addr, wzp_en : In, wzp : Out(8 · lanes)
        Weight zero points, synchronous read port.
    wzp_stream_addr : In, wzp_stream : Out(8 · lanes)
        Weight zero points, synchronous read port that is always enabled and transparent
        for the loads (the streamed weights read the next cycle's block).
    """

    def __init__(self, lanes: int, bus_bytes: int, blocks: int):
        self.lanes = lanes
        self.bus_bytes = bus_bytes
        self.blocks = blocks
        super().__init__({
            "load": In(1), "beat": In(8 * bus_bytes), "pos": In(24),
            "mult_off": In(24), "wzp_off": In(24), "post_off": In(24), "act_off": In(24),
            "ct_off": In(24), "channels": In(17),
            "act_table": In(1), "channel_table": In(1),
            "act_write_en": Out(1), "act_write_addr": Out(24),
            "ct_write_en": Out(1), "ct_write_addr": Out(24),
            "post": Out(32 * POST_WORDS),
            "rq_addr": In(range(blocks)), "bias": Out(32 * lanes), "mult": Out(32 * lanes),
            "wzp_addr": In(range(blocks)), "wzp_en": In(1), "wzp": Out(8 * lanes),
            "wzp_stream_addr": In(range(blocks)), "wzp_stream": Out(8 * lanes),
        })

    def elaborate(self, platform):
        m = Module()
        To, B = self.lanes, self.bus_bytes
        wpb = B // 4
        beat = self.beat
        m.submodules.bias = bias_mem = Memory(shape=32 * To, depth=self.blocks, init=[])
        m.submodules.mult = mult_mem = Memory(shape=32 * To, depth=self.blocks, init=[])
        m.submodules.wzp = wzp_mem = Memory(shape=8 * To, depth=self.blocks, init=[])
        bias_w = bias_mem.write_port(granularity=8 * B)
        mult_w = mult_mem.write_port(granularity=8 * B)
        wzp_w = wzp_mem.write_port(granularity=8 * B)
        post = [Signal(32, name=f"post_{k}") for k in range(POST_WORDS)]
        m.d.comb += self.post.eq(Cat(*post))

        bias_r, mult_r = bias_mem.read_port(), mult_mem.read_port()
        # The streamed weights' port reads the next cycle's block, with this cycle's write
        wzp_r, wzp_stream = wzp_mem.read_port(), wzp_mem.read_port(transparent_for=(wzp_w,))
        m.d.comb += [
            bias_r.addr.eq(self.rq_addr), bias_r.en.eq(1), self.bias.eq(bias_r.data),
            mult_r.addr.eq(self.rq_addr), mult_r.en.eq(1), self.mult.eq(mult_r.data),
            wzp_r.addr.eq(self.wzp_addr), wzp_r.en.eq(self.wzp_en), self.wzp.eq(wzp_r.data),
            wzp_stream.addr.eq(self.wzp_stream_addr), wzp_stream.en.eq(1),
            self.wzp_stream.eq(wzp_stream.data),
        ]

        bias_chunks = 4 * To // B
        wzp_chunks = To // B
        m.d.comb += [
            bias_w.data.eq(Cat(*([beat] * bias_chunks))),
            mult_w.data.eq(Cat(*([beat] * bias_chunks))),
            wzp_w.data.eq(Cat(*([beat] * wzp_chunks))),
        ]
        pos = self.pos
        in_act = self.act_table & (pos >= self.act_off) & (pos < self.act_off + 256)
        in_ct = self.channel_table & (pos >= self.ct_off) & (pos < self.post_off)
        with m.If(self.load):
            with m.If(pos < self.mult_off):
                rel = pos
                m.d.comb += [bias_w.addr.eq(rel >> log2(4 * To)),
                             bias_w.en.eq(one_hot(rel[log2(B):log2(4 * To)], bias_chunks))]
            with m.Elif(pos < self.wzp_off):
                rel = pos - self.mult_off
                m.d.comb += [mult_w.addr.eq(rel >> log2(4 * To)),
                             mult_w.en.eq(one_hot(rel[log2(B):log2(4 * To)], bias_chunks))]
            with m.Elif(pos < self.wzp_off + self.channels):
                rel = pos - self.wzp_off
                if wzp_chunks > 1:
                    en = one_hot(rel[log2(B):log2(To)], wzp_chunks)
                else:
                    en = Const(1, 1)
                m.d.comb += [wzp_w.addr.eq(rel >> log2(To)), wzp_w.en.eq(en)]
            with m.Elif((pos >= self.post_off)
                        & (pos < self.post_off + layout.POST_RECORD.itemsize)):
                word0 = (pos - self.post_off) >> 2
                post_array = Array(post)
                for j in range(wpb):
                    with m.If(word0 + j < POST_WORDS):
                        m.d.sync += post_array[word0 + j].eq(beat[32 * j:32 * (j + 1)])
            with m.Elif(in_act):
                m.d.comb += [self.act_write_addr.eq(pos - self.act_off),
                             self.act_write_en.eq(1)]
            with m.Elif(in_ct):
                m.d.comb += [self.ct_write_addr.eq(pos - self.ct_off), self.ct_write_en.eq(1)]
        return m
