"""Accumulator: partial sums over input-channel blocks, bias and the per-lane requantisers."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, ResetInserter, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from ..conv_array import ACC_BITS
from ..requant import Requantizer
from .common import FLOAT32_ONE

__all__ = ["Accumulator"]


class Accumulator(wiring.Component):
    """Sums the array's per-pass results over the ``ib_count`` input-channel blocks in the
    32-bit partial-sum buffer (one output row of ``lanes`` channels), adds the bias and
    requantises: one code per channel for every output pixel, in the order ``(oy, ob, ox)``.

    The array's results come ``(oy, ob, ib, ox)``. A result of the first block overwrites the
    partial sum, one of the last goes (with the partial sum and the bias) to the
    requantisers, and their codes to ``o_stream``.

    Parameters
    ----------
    lanes : int
        Output channels per block (``To``).
    psum_words : int
        Partial-sum buffer words (the widest convolution output row).
    blocks : int
        Channel blocks of the parameter stores.

    Signature
    ---------
    flush, start : In(1)
        Abort; a compute phase's start (counters restart).
    i_stream : In(stream.Signature(ArrayLayout(signed(32), lanes), always_ready=True))
        The array's results.
    conv_w, ib_count, ob_count, ob_base : In
        Convolution output width, input blocks per output block, output blocks of the chunk,
        the chunk's first output block.
    identity : In(1)
        conv NONE: no bias, multiplier 1.0.
    psum_keep, psum_hold : In(1)
        An input-channel split's share (one output row, ``sfnpu.isa``): the first block adds
        to the sums the previous group held instead of starting from zero; the last block
        also holds its sums (without bias) for the next group. Both address the buffer by
        ``(ob, ox)`` — ``ob_count · conv_w`` words — where other groups reuse one row of it.
    out_signed : In(1), zero_point : In(signed(9))
        The codes' type.
    param_addr : Out(range(blocks)), bias, mult : In(32 · lanes)
        The bias and multiplier store's read port (one cycle).
    o_stream : Out(stream.Signature(8 · lanes, always_ready=True))
        The codes, lane 0 lowest.

    Timing: a result taken in cycle *k* reaches the requantisers in cycle *k* +
    :attr:`LATENCY` (the partial-sum stage, whose buffer read feeds the addition, then the sum
    with its bias in a register of its own), its code :attr:`Requantizer.LATENCY
    <sfnpu.hw.requant.Requantizer.LATENCY>` cycles later.
    """

    LATENCY = 2

    def __init__(self, lanes: int, psum_words: int, blocks: int):
        self.lanes = lanes
        self.psum_words = psum_words
        self.blocks = blocks
        super().__init__({
            "flush": In(1), "start": In(1),
            "i_stream": In(stream.Signature(data.ArrayLayout(signed(ACC_BITS), lanes),
                                            always_ready=True)),
            "conv_w": In(12), "ib_count": In(16), "ob_count": In(16), "ob_base": In(16),
            "identity": In(1), "psum_keep": In(1), "psum_hold": In(1),
            "out_signed": In(1), "zero_point": In(signed(9)),
            "param_addr": Out(range(blocks)),
            "bias": In(32 * lanes), "mult": In(32 * lanes),
            "o_stream": Out(stream.Signature(8 * lanes, always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        To = self.lanes
        flush = self.flush
        acc_in = self.i_stream
        r_ox = Signal(12)
        r_ib = Signal(16)
        r_ob = Signal(16)
        m.submodules.psum = psum = Memory(shape=32 * To, depth=self.psum_words, init=[])
        psum_w = psum.write_port()
        psum_r = psum.read_port(transparent_for=(psum_w,))
        carry = self.psum_keep | self.psum_hold
        r_row = Signal(range(self.psum_words + 1))     # carried sums: this block's first word
        addr = Signal(range(self.psum_words))
        a_valid = Signal()
        a_first = Signal()
        a_last = Signal()
        a_addr = Signal.like(addr)
        a_acc = Signal(32 * To)
        m.d.comb += [addr.eq(Mux(carry, r_row + r_ox, r_ox)),
                     psum_r.addr.eq(addr), psum_r.en.eq(1),
                     self.param_addr.eq(self.ob_base + r_ob)]
        m.d.sync += [
            a_valid.eq(acc_in.valid & ~flush),
            a_first.eq((r_ib == 0) & ~self.psum_keep),
            a_last.eq(r_ib + 1 == self.ib_count),
            a_addr.eq(addr),
            a_acc.eq(acc_in.payload.as_value()),
        ]
        with m.If(flush | self.start):
            m.d.sync += [r_ox.eq(0), r_ib.eq(0), r_ob.eq(0), r_row.eq(0)]
        with m.Elif(acc_in.valid):
            with m.If(r_ox + 1 < self.conv_w):
                m.d.sync += r_ox.eq(r_ox + 1)
            with m.Else():
                m.d.sync += r_ox.eq(0)
                with m.If(r_ib + 1 < self.ib_count):
                    m.d.sync += r_ib.eq(r_ib + 1)
                with m.Else():
                    m.d.sync += [r_ib.eq(0), r_row.eq(r_row + self.conv_w)]
                    with m.If(r_ob + 1 < self.ob_count):
                        m.d.sync += r_ob.eq(r_ob + 1)
                    with m.Else():
                        m.d.sync += r_ob.eq(0)
        sums = []
        for lane in range(To):
            part = a_acc[32 * lane:32 * (lane + 1)].as_signed()
            prev = psum_r.data[32 * lane:32 * (lane + 1)].as_signed()
            s = Signal(signed(32), name=f"psum_{lane}")
            m.d.comb += s.eq(part + Mux(a_first, 0, prev))
            sums.append(s)
        m.d.comb += [
            psum_w.addr.eq(a_addr),
            psum_w.data.eq(Cat(*sums)),
            psum_w.en.eq(a_valid & (~a_last | self.psum_hold)),
        ]
        # conv NONE: codes pass unchanged (acc = x − x_zp, multiplier 1.0, zero point x_zp).
        lo = Mux(self.out_signed, -128, 0)
        hi = Mux(self.out_signed, 127, 255)
        # The sums with their bias, registered: the buffer's read and two additions would
        # otherwise run into the requantiser's normalisation in one cycle.
        r_valid = Signal()
        m.d.sync += r_valid.eq(a_valid & a_last & ~flush)
        codes = []
        for lane in range(To):
            rq = ResetInserter(flush)(Requantizer())
            m.submodules[f"requant_{lane}"] = rq
            b = Mux(self.identity, 0, self.bias[32 * lane:32 * (lane + 1)].as_signed())
            r_acc = Signal(signed(32), name=f"acc_{lane}")
            r_mult = Signal(32, name=f"mult_{lane}")
            m.d.sync += [r_acc.eq(sums[lane] + b),
                         r_mult.eq(Mux(self.identity, FLOAT32_ONE,
                                       self.mult[32 * lane:32 * (lane + 1)]))]
            m.d.comb += [
                rq.acc.eq(r_acc), rq.multiplier.eq(r_mult),
                rq.zero_point.eq(self.zero_point),
                rq.lo.eq(lo), rq.hi.eq(hi),
                rq.valid.eq(r_valid),
            ]
            codes.append(rq.y[:8])
            if lane == 0:
                m.d.comb += self.o_stream.valid.eq(rq.y_valid)
        m.d.comb += self.o_stream.payload.eq(Cat(*codes))
        return m
