"""Post-processing chain: the requantised codes on their way to the write buffer."""

from __future__ import annotations

from amaranth.hdl import Cat, EnableInserter, Module, Mux, ResetInserter, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from sfnpu import isa
from sfnpu.isa import Activation, ActOrder, Eltwise, Pool, eltwise_multiplies

from ..act_table import ActivationTable
from ..avgpool import AvgPool
from ..chscale import ChannelScale
from ..eltwise_add import EltwiseAdd
from ..gap import GlobalAvgPool
from ..line_store import share_lines
from ..maxpool import MaxPool
from ..pipeline import stage
from ..shared_product import multiply
from ..stream_register import StreamRegister
from ..upsample import Upsample2x
from .common import POST_WORDS, log2, post_word, stage_signed, stage_zp

__all__ = ["PostChain", "share_pool_lines"]


def gated(unit, restart):
    """A post stage held in reset between groups (``restart``) and clocked only while its
    configuration enables it (``unit.enable``): a bypassed stage's registers keep still — the
    enable is the flip-flops' clock-enable input, no logic — and a simulator skips the
    next-state logic of the stages a group does not use (about half of each cycle's
    evaluation on a network without average pools or residual adds)."""
    return ResetInserter(restart)(EnableInserter(unit.enable)(unit))


def share_pool_lines(m, maxpool, avgpool):
    """The line buffers of ``maxpool`` and ``avgpool`` (both built with ``shared_lines``):
    at most one of the two is enabled, so the max pool's two rows are the average pool's
    first two, the enabled pool's ports chosen by its configuration register (``enable``).
    Three memories instead of five: 16 DP16KD fewer on ``ecp5``."""
    share_lines(m, [(maxpool.enable, maxpool.lines, True),
                    (avgpool.enable, avgpool.lines, False)], name="pool_lines")


class PostChain(wiring.Component):
    """The chain of :mod:`sfnpu.isa`, in its order: activation table (before the element-wise
    stage) → ADD, CHANNEL_SCALE or MUL with the shortcut stream → a register → activation table
    (after it) → clamp → a register → max, average or global-average pool → 2× upsample →
    padding-lane mask. Every stage passes beats ``(oy, ob, ox)`` of the chunk's ``ob_count`` blocks; the type (zero
    point, signedness) of the codes after each stage is the post record's entry of each stage
    that changes it, as the golden model tracks it.

    Parameters
    ----------
    lanes : int
        Bytes per word (``L == To``).
    bus_bytes : int
        Bytes per activation-table write.
    psum_words, pool_row_pixels, max_blocks : int
        The stores' sizes (:class:`~sfnpu.limits.StoreSizes`).

    The stages take their configuration (from ``instr``, ``post`` and the chunk's shape)
    through registers: it is final in the compute phase's start cycle and the stages act
    from the next one, so the registers change no cycle and keep the instruction's wide
    fan-out off the stages' handshakes.

    Signature
    ---------
    flush : In(1)
        Abort: every stage restarts.
    compute, start : In(1)
        The compute phase (the stages keep state across beats even when bypassed: outside
        it they are held in reset) and its first cycle.
    instr : In(InstructionLayout)
    post : In(32 · POST_WORDS)
        The post record.
    conv_h, conv_w, ob_count, ob_base : In
        Convolution output shape, output blocks of the chunk and its first block.
    conv_signed : In(1), conv_zp : In(signed(9))
        The type of the requantised codes.
    table_write_addr : In(8), table_write_data : In(8 · bus_bytes), table_write_en : In(1)
        Activation-table load (both tables).
    i_stream : In(stream.Signature(ArrayLayout(8, lanes)))
        Requantised codes.
    s_stream : In(stream.Signature(8 · lanes))
        The shortcut: a residual tensor (ADD), the scale vector (CHANNEL_SCALE) or the other
        factor (MUL).
    o_stream : Out(stream.Signature(8 · lanes))
        To the write buffer; lanes past ``out_c`` are 0.
    """

    #: :class:`~sfnpu.hw.stream_register.StreamRegister` stages, both between the element-wise
    #: stage and the pools: behind the element-wise stage and behind the clamp.
    STREAM_REGISTERS = 2

    def __init__(self, lanes: int, bus_bytes: int, *, psum_words: int, pool_row_pixels: int,
                 max_blocks: int):
        self.lanes = lanes
        self.bus_bytes = bus_bytes
        self.psum_words = psum_words
        self.pool_row_pixels = pool_row_pixels
        self.max_blocks = max_blocks
        super().__init__({
            "flush": In(1), "compute": In(1), "start": In(1),
            "instr": In(isa.InstructionLayout),
            "post": In(32 * POST_WORDS),
            "conv_h": In(12), "conv_w": In(12), "ob_count": In(16), "ob_base": In(16),
            "conv_signed": In(1), "conv_zp": In(signed(9)),
            "table_write_addr": In(8), "table_write_data": In(8 * bus_bytes),
            "table_write_en": In(1),
            "i_stream": In(stream.Signature(data.ArrayLayout(8, lanes))),
            "s_stream": In(stream.Signature(8 * lanes)),
            "o_stream": Out(stream.Signature(8 * lanes)),
        })

    def elaborate(self, platform):
        m = Module()
        L, B = self.lanes, self.bus_bytes
        instr = self.instr
        flush = self.flush
        m.submodules.act = act = ResetInserter(flush)(ActivationTable(L, write_bytes=B))
        m.submodules.act_after = act_after = ResetInserter(flush)(
            ActivationTable(L, write_bytes=B))
        for table in (act, act_after):
            m.d.comb += [table.write_addr.eq(self.table_write_addr),
                         table.write_data.eq(self.table_write_data),
                         table.write_en.eq(self.table_write_en)]
        # The stages keep state across beats even when bypassed: they are held in reset
        # outside the compute phase, so each group starts them afresh. The reset is a
        # register (released in the phase's second cycle, before any beat can arrive): its
        # fan-out starts at a flip-flop, not at the sequencer's state decode.
        restart = Signal(init=1)
        m.d.sync += restart.eq(flush | ~self.compute)
        sizes = dict(max_width=self.psum_words, max_blocks=self.max_blocks)
        pooling = dict(sizes, max_row_pixels=self.pool_row_pixels)
        m.submodules.add = add = gated(EltwiseAdd(L, shared_products=True), restart)
        m.submodules.scale = scale = gated(ChannelScale(L, **sizes, shared_products=True),
                                           restart)
        # At most one of the two is enabled: they share their lanes' multipliers, the
        # enabled unit's operands chosen by its configuration register.
        for lane in range(L):
            multiply(m, [add.u_products[lane], scale.m_products[lane]], select=scale.enable,
                     name=f"eltwise_significand_product_{lane}")
            multiply(m, [add.t_products[lane], scale.p_products[lane]], select=scale.enable,
                     name=f"eltwise_code_product_{lane}")
        m.submodules.maxpool = maxpool = gated(MaxPool(L, **pooling, shared_lines=True),
                                               restart)
        m.submodules.avgpool = avgpool = gated(AvgPool(L, **pooling, shared_lines=True),
                                               restart)
        share_pool_lines(m, maxpool, avgpool)
        m.submodules.gap = gap = gated(GlobalAvgPool(L, **sizes), restart)
        m.submodules.upsample = upsample = gated(Upsample2x(L, max_width=self.pool_row_pixels),
                                                 restart)
        self._configure(m, act, act_after, add, scale, maxpool, avgpool, gap, upsample)

        # The shortcut stream: a residual tensor (ADD), the scale vector (CHANNEL_SCALE) or
        # the other factor (MUL).
        # (add.enable and scale.enable: their configuration registers)
        s = self.s_stream
        m.d.comb += [
            add.s_stream.payload.eq(s.payload),
            scale.s_stream.payload.eq(s.payload),
            add.s_stream.valid.eq(s.valid & add.enable),
            scale.s_stream.valid.eq(s.valid & scale.enable),
            s.ready.eq(Mux(add.enable, add.s_stream.ready, scale.s_stream.ready)),
        ]
        # Clamp (Activation.CLAMP) between the tables and the pooling.
        clamp = stream.Signature(data.ArrayLayout(8, L)).create()
        t3_signed = stage(m, self._types()[2][0], "clamp_signed")
        clamp_lo = stage(m, Mux(instr.out_signed, instr.clamp_lo.as_signed(), instr.clamp_lo),
                         "clamp_lo")
        clamp_hi = stage(m, Mux(instr.out_signed, instr.clamp_hi.as_signed(), instr.clamp_hi),
                         "clamp_hi")
        clamping = stage(m, instr.act == Activation.CLAMP, "clamping")
        for lane in range(L):
            code = act_after.o_stream.payload[lane]
            value = Mux(t3_signed, code.as_signed(), code)
            clamped = Mux(clamping,
                          Mux(value < clamp_lo, clamp_lo, Mux(value > clamp_hi, clamp_hi, value)),
                          value)
            m.d.comb += clamp.payload[lane].eq(clamped[:8])
        m.d.comb += [clamp.valid.eq(act_after.o_stream.valid),
                     act_after.o_stream.ready.eq(clamp.ready)]
        # Eltwise: both units in series, at most one enabled (the other passes through).
        wiring.connect(m, wiring.flipped(self.i_stream), act.i_stream)
        wiring.connect(m, act.o_stream, add.i_stream)
        wiring.connect(m, add.o_stream, scale.i_stream)
        m.submodules.eltwise_out = eltwise_out = ResetInserter(restart)(
            StreamRegister(data.ArrayLayout(8, L)))
        wiring.connect(m, scale.o_stream, eltwise_out.i_stream)
        wiring.connect(m, eltwise_out.o_stream, act_after.i_stream)
        # Registers behind the element-wise stage and the clamp: a beat would otherwise pass
        # from the result FIFO through every bypassed stage into the upsampler's line store
        # in one cycle.
        m.submodules.clamped = clamped = ResetInserter(restart)(
            StreamRegister(data.ArrayLayout(8, L)))
        wiring.connect(m, clamp, clamped.i_stream)
        self._pools(m, clamped.o_stream, (maxpool, avgpool, gap), upsample.i_stream)
        self._mask(m, upsample.o_stream)
        return m

    def _pools(self, m, source, pools, sink):
        """The pools side by side between ``source`` and ``sink``: one at most is enabled
        (``instr.pool``), and it alone takes the source's beats and feeds the sink; with none
        enabled the beats go straight through. In series, each disabled pool passing beats
        on, the enabled pool's handshakes would run through the others' logic — paths that
        cannot occur, which timing analysis would still count. The same cycles either way:
        a disabled pool passes a beat on in the cycle it comes."""
        ready, valid, payload = sink.ready, source.valid, source.payload.as_value()
        for pool in pools:
            enabled = pool.enable
            m.d.comb += [pool.i_stream.valid.eq(source.valid & enabled),
                         pool.i_stream.payload.eq(source.payload),
                         pool.o_stream.ready.eq(sink.ready & enabled)]
            ready = Mux(enabled, pool.i_stream.ready, ready)
            valid = Mux(enabled, pool.o_stream.valid, valid)
            payload = Mux(enabled, pool.o_stream.payload.as_value(), payload)
        m.d.comb += [source.ready.eq(ready), sink.valid.eq(valid), sink.payload.eq(payload)]

    def _types(self):
        """(signed, zero point) of the codes after the first table, the element-wise stage and
        the second table."""
        instr, post = self.instr, self.post
        table_first = (instr.act == Activation.TABLE) & (
            (instr.eltwise == Eltwise.NONE) | (instr.act_order == ActOrder.BEFORE_ELTWISE))
        table_after = (instr.act == Activation.TABLE) & (instr.eltwise != Eltwise.NONE) & (
            instr.act_order == ActOrder.AFTER_ELTWISE)
        t1 = (Mux(table_first, stage_signed(post, "act"), self.conv_signed),
              Mux(table_first, stage_zp(post, "act"), self.conv_zp))
        has_eltwise = instr.eltwise != Eltwise.NONE
        t2 = (Mux(has_eltwise, stage_signed(post, "eltwise"), t1[0]),
              Mux(has_eltwise, stage_zp(post, "eltwise"), t1[1]))
        t3 = (Mux(table_after, stage_signed(post, "act_after"), t2[0]),
              Mux(table_after, stage_zp(post, "act_after"), t2[1]))
        return t1, t2, t3, table_first, table_after

    def _configure(self, m, act, act_after, add, scale, maxpool, avgpool, gap, upsample):
        instr, post = self.instr, self.post
        conv_h, conv_w, ob_count = self.conv_h, self.conv_w, self.ob_count
        (t1_signed, t1_zp), _, (t3_signed, t3_zp), table_first, table_after = self._types()
        sc_zp = Mux(instr.sc_signed, instr.sc_zp.as_signed(), instr.sc_zp)
        pooled_h = Mux(instr.upsample, instr.out_h >> 1, instr.out_h)
        pooled_w = Mux(instr.upsample, instr.out_w >> 1, instr.out_w)
        m.d.sync += [
            act.enable.eq(table_first),
            act_after.enable.eq(table_after),
            add.enable.eq(instr.eltwise == Eltwise.ADD),
            add.stream_signed.eq(t1_signed),
            add.shortcut_signed.eq(instr.sc_signed),
            add.swap.eq(post_word(post, "eltwise_swap")[0]),
            add.r_a.eq(post_word(post, "eltwise_const", 0)),
            add.r_b.eq(post_word(post, "eltwise_const", 1)),
            add.fixed.eq(post_word(post, "eltwise_const", 2)),
            add.out_signed.eq(stage_signed(post, "eltwise")),
            scale.enable.eq(eltwise_multiplies(instr.eltwise)),
            scale.per_pixel.eq(instr.eltwise == Eltwise.MUL),
            scale.in_h.eq(conv_h), scale.in_w.eq(conv_w), scale.blocks.eq(ob_count),
            scale.a_signed.eq(t1_signed), scale.a_zp.eq(t1_zp),
            scale.b_signed.eq(instr.sc_signed), scale.b_zp.eq(sc_zp),
            scale.multiplier.eq(post_word(post, "eltwise_const", 0)),
            scale.y_zp.eq(stage_zp(post, "eltwise")),
            scale.out_signed.eq(stage_signed(post, "eltwise")),
            maxpool.enable.eq(instr.pool == Pool.MAX),
            maxpool.signed.eq(t3_signed),
            maxpool.kernel.eq(instr.pool_size), maxpool.stride.eq(instr.pool_stride),
            maxpool.pad.eq(instr.pool_pad),
            maxpool.in_h.eq(conv_h), maxpool.in_w.eq(conv_w),
            maxpool.out_h.eq(pooled_h), maxpool.out_w.eq(pooled_w),
            maxpool.blocks.eq(ob_count),
            avgpool.enable.eq(instr.pool == Pool.AVG),
            avgpool.in_signed.eq(t3_signed), avgpool.x_zp.eq(t3_zp),
            avgpool.out_signed.eq(stage_signed(post, "pool")),
            avgpool.y_zp.eq(stage_zp(post, "pool")),
            avgpool.x_scale.eq(post_word(post, "pool_const", 0)),
            avgpool.y_scale.eq(post_word(post, "pool_const", 1)),
            avgpool.kernel.eq(instr.pool_size), avgpool.stride.eq(instr.pool_stride),
            avgpool.pad.eq(instr.pool_pad), avgpool.count_include_pad.eq(instr.pool_count_pad),
            avgpool.in_h.eq(conv_h), avgpool.in_w.eq(conv_w),
            avgpool.out_h.eq(pooled_h), avgpool.out_w.eq(pooled_w),
            avgpool.blocks.eq(ob_count),
            gap.enable.eq(instr.pool == Pool.GLOBAL_AVG),
            gap.in_h.eq(conv_h), gap.in_w.eq(conv_w), gap.blocks.eq(ob_count),
            gap.in_signed.eq(t3_signed), gap.in_zp.eq(t3_zp),
            gap.multiplier.eq(post_word(post, "pool_const", 0)),
            gap.out_signed.eq(stage_signed(post, "pool")), gap.out_zp.eq(stage_zp(post, "pool")),
            upsample.enable.eq(instr.upsample),
        ]
        # The upsampler's interleaved row, a register: a multiplier on the configuration
        # path fed its line store's control. The chunk's block count changes outside the
        # compute phase, which starts a cycle later at the earliest.
        row_pixels = Signal.like(upsample.in_w)
        m.d.sync += row_pixels.eq(ob_count * pooled_w)
        m.d.comb += upsample.in_w.eq(row_pixels)

    def _mask(self, m, chain):
        """Padding lanes (channels past ``out_c``) to 0, into ``o_stream``."""
        L, instr = self.lanes, self.instr
        out = self.o_stream
        p_ob = Signal(16)              # channel block of the beat leaving the chain
        p_ox = Signal(12)
        out_w = stage(m, instr.out_w, "mask_out_w")
        chunk_channels = stage(m, instr.out_c - (self.ob_base << log2(L)), "chunk_channels")
        lanes_valid = Signal(range(L + 1))
        remaining = chunk_channels - (p_ob << log2(L))
        m.d.comb += lanes_valid.eq(Mux(remaining >= L, L, remaining))
        masked = [Mux(lane < lanes_valid, chain.payload[lane], 0) for lane in range(L)]
        m.d.comb += [out.payload.eq(Cat(*masked)), out.valid.eq(chain.valid),
                     chain.ready.eq(out.ready)]
        with m.If(self.flush | self.start):
            m.d.sync += [p_ob.eq(0), p_ox.eq(0)]
        with m.Elif(chain.valid & out.ready):
            with m.If(p_ox + 1 < out_w):
                m.d.sync += p_ox.eq(p_ox + 1)
            with m.Else():
                m.d.sync += p_ox.eq(0)
                m.d.sync += p_ob.eq(Mux(p_ob + 1 < self.ob_count, p_ob + 1, 0))
