"""Global average pool (QLinearGlobalAveragePool, :func:`sfnpu.numeric.global_avg_pool_codes`).

``y = clamp(rint(float32(Σx − x_zp·N) · m) + y_zp)`` per channel, ``N = H·W``, with the sum
exact in int32 and the float32-exact :class:`~sfnpu.hw.requant.Requantizer`. The sum is kept as
``Σ(x − x_zp)`` (the same int32 value, no multiply). One output beat per channel block is rare
(every ``H·W`` input beats), so a single requantiser serves all lanes one after another; the
finished sums move to a holding bank so the next channel block accumulates meanwhile.

Channel blocks arrive row-interleaved: every input row is ``blocks`` segments of ``in_w``
pixels, segment *b* holding channel block *b* (order ``(y, b, x)``). A segment accumulates in
one bank of registers; at its end the bank's sums are written to a memory of ``max_blocks``
words (one int32 per lane), from which the block's next segment starts. The memory's read port
always addresses the block of the next input beat, so its (registered) output is ready when
that beat arrives: a segment end writes block *b* while the port already reads block *b + 1*
(with one block the bank itself carries the sums from row to row). The last
row's segments finish the blocks in order; each one's sums go to the holding bank and out.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from .beat import code_beat, pass_through
from .requant import Requantizer

__all__ = ["GlobalAvgPool", "ACC_BITS"]

#: Accumulator width: the int32 sum of the numeric contract (it wraps like int32).
ACC_BITS = 32


class GlobalAvgPool(wiring.Component):
    """Per-channel average of every channel block's ``in_h × in_w`` pixels, requantised.

    Parameters
    ----------
    lanes : int
        Codes per beat (``HwConfig.lanes``).
    max_height, max_width : int
        Largest input sizes (the ISA's 12-bit fields by default).
    max_blocks : int
        Most channel blocks per row (the range of ``blocks``; the depth of the partial-sum
        memory, ``max_blocks`` words of ``lanes`` int32 sums; none when 1, the default).

    Signature
    ---------
    i_stream : In(stream.Signature(ArrayLayout(8, lanes)))
        Input pixels: ``in_h`` rows of ``blocks`` segments of ``in_w`` (order ``(y, b, x)``);
        the next group follows without a gap. With ``blocks = 1``: one channel block after
        another, ``in_h · in_w`` beats each.
    o_stream : Out(stream.Signature(ArrayLayout(8, lanes)))
        One beat per channel block, in block order: the pooled codes.
    enable : In(1)
        Configuration: 0 bypasses the stage (``o_stream`` is ``i_stream``, combinationally).
    in_h, in_w : In(...)
        Configuration: pixels per channel block, ``N = in_h · in_w``.
    blocks : In(range(1, max_blocks + 1), init=1)
        Configuration: channel blocks per row.
    in_signed : In(1)
        Configuration: input codes are int8 (1) or uint8 (0).
    in_zp : In(signed(9))
        Configuration: input zero point ``x_zp``.
    multiplier : In(32)
        Configuration: float32 bit pattern of the requantisation multiplier (the post
        record's ``pool_const[0]``, :func:`sfnpu.numeric.global_avg_pool_multiplier`).
    out_signed : In(1)
        Configuration: output codes are int8 (1) or uint8 (0).
    out_zp : In(signed(9))
        Configuration: output zero point.

    Configuration may change only between groups: once every input beat has been accepted
    and every output beat delivered.

    Timing: one input beat per cycle. A beat is taken into an input register and added to
    its sums in the next cycle at the earliest (:attr:`INPUT_LATENCY`): the sums' adders are
    not behind the upstream stages' bypass multiplexers. The output beat of a block is ready
    :meth:`output_latency` ``= INPUT_LATENCY + lanes +``
    :attr:`Requantizer.LATENCY <sfnpu.hw.requant.Requantizer.LATENCY>` ``+ 1`` cycles after
    its last input beat was taken; that beat's successor in the next block waits in the input
    register until the output has left (blocks whose last beats are at least ``lanes +
    LATENCY + 2`` beats apart never wait when the output is not stalled: with ``blocks = 1``
    blocks of ``in_h · in_w`` at least that many pixels, with several blocks last-row segments
    of ``in_w`` that wide; the other rows never wait).
    """

    #: Cycles from a beat's acceptance to its accumulation.
    INPUT_LATENCY = 1

    @classmethod
    def output_latency(cls, lanes: int) -> int:
        """Cycles from a block's last input beat (taken) to its output beat (ready)."""
        return cls.INPUT_LATENCY + lanes + Requantizer.LATENCY + 1

    def __init__(self, lanes: int, max_height: int = 4095, max_width: int = 4095,
                 max_blocks: int = 1):
        if lanes < 1 or max_height < 1 or max_width < 1 or max_blocks < 1:
            raise ValueError(f"lanes, sizes and max_blocks must be positive ({lanes}, "
                             f"{max_height}, {max_width}, {max_blocks})")
        self.lanes = lanes
        self.max_height = max_height
        self.max_width = max_width
        self.max_blocks = max_blocks
        beat = code_beat(lanes)
        super().__init__({
            "i_stream": In(beat),
            "o_stream": Out(beat),
            "enable": In(1),
            "in_h": In(range(1, max_height + 1)),
            "in_w": In(range(1, max_width + 1)),
            "blocks": In(range(1, max_blocks + 1), init=1),
            "in_signed": In(1),
            "in_zp": In(signed(9)),
            "multiplier": In(32),
            "out_signed": In(1),
            "out_zp": In(signed(9)),
        })

    def elaborate(self, platform):
        m = Module()
        lanes = self.lanes
        m.submodules.requantizer = requantizer = Requantizer(width=9)

        # -- the input register ------------------------------------------------------------------
        codes = Signal(data.ArrayLayout(8, lanes))
        pending = Signal()                      # codes hold a beat not yet accumulated
        accept = Signal()                       # the pending beat is added to the sums

        # -- accumulate Σ(x − x_zp) per lane ---------------------------------------------------
        # Column and row of the pending beat count from 1, and the channel block (an address of
        # the partial sums) has its successor in a register: the end tests are equalities with
        # the configuration, with no carry chain ahead of the input's ready.
        column = Signal(range(1, self.max_width + 1), init=1)
        # (at least one bit: a zero-width signal becomes an invalid Verilog range)
        segment = Signal(range(max(self.max_blocks, 2)))    # channel block of the next beat
        segment_next = Signal(range(max(self.max_blocks, 2) + 1), init=1)
        row = Signal(range(1, self.max_height + 1), init=1)
        sums = [Signal(signed(ACC_BITS), name=f"sum_{lane}") for lane in range(lanes)]
        held = [Signal(signed(ACC_BITS), name=f"held_{lane}") for lane in range(lanes)]

        busy = Signal()                         # the held sums or their output are in use
        segment_start = column == 1
        segment_end = column == self.in_w
        last_segment = segment_next == self.blocks
        first_row = row == 1
        last_row = row == self.in_h
        last_pixel = segment_end & last_row     # a block's sums are complete
        m.d.comb += [
            accept.eq(pending & (~last_pixel | ~busy)),
            self.i_stream.ready.eq(self.enable & (~pending | accept)),
        ]
        with m.If(self.i_stream.valid & self.i_stream.ready):
            m.d.sync += [codes.eq(self.i_stream.payload), pending.eq(1)]
        with m.Elif(accept):
            m.d.sync += pending.eq(0)
        with m.If(accept):
            m.d.sync += column.eq(Mux(segment_end, 1, column + 1))
            with m.If(segment_end):
                m.d.sync += [segment.eq(Mux(last_segment, 0, segment_next)),
                             segment_next.eq(Mux(last_segment, 1, segment_next + 1))]
                with m.If(last_segment):
                    m.d.sync += row.eq(Mux(last_row, 1, row + 1))

        totals = Signal(data.ArrayLayout(signed(ACC_BITS), lanes))
        if self.max_blocks == 1:
            previous = sums                     # the bank carries the block from row to row
        else:
            m.submodules.partial = partial = Memory(
                shape=data.ArrayLayout(signed(ACC_BITS), lanes), depth=self.max_blocks, init=[])
            write = partial.write_port()
            read = partial.read_port()
            next_segment = Mux(last_segment, 0, segment_next)
            m.d.comb += [
                read.addr.eq(Mux(accept & segment_end, next_segment, segment)),
                write.addr.eq(segment),
                write.data.eq(totals),
                write.en.eq(accept & segment_end),
            ]
            # A segment continues its block's sums from the memory, except with one block: the
            # segment that ended in the previous cycle wrote the very word the port was reading
            # (no forwarding), so the port may be a row behind while the bank holds the sums.
            from_memory = segment_start & (self.blocks != 1)
            previous = [Mux(from_memory, read.data[lane], sums[lane]) for lane in range(lanes)]

        for lane in range(lanes):
            code = codes[lane]
            value = Mux(self.in_signed, code.as_signed(), code)       # 9-bit signed
            total = totals[lane]
            m.d.comb += total.eq(Mux(segment_start & first_row, 0, previous[lane])
                                 + (value - self.in_zp))
            with m.If(accept):
                m.d.sync += sums[lane].eq(total)
                with m.If(last_pixel):
                    m.d.sync += held[lane].eq(total)

        # -- requantise the held sums one lane per cycle -------------------------------------
        feeding = Signal()
        fed = Signal(range(lanes + 1))
        collected = Signal(range(lanes + 1))
        results = Signal(data.ArrayLayout(8, lanes))
        with m.If(accept & last_pixel):
            m.d.sync += [busy.eq(1), feeding.eq(1), fed.eq(0), collected.eq(0)]
        with m.If(feeding):
            # The held bank shifts down: lane k reaches the requantiser in cycle k.
            m.d.sync += [held[lane].eq(held[lane + 1]) for lane in range(lanes - 1)]
            m.d.sync += fed.eq(fed + 1)
            with m.If(fed == lanes - 1):
                m.d.sync += feeding.eq(0)
        m.d.comb += [
            requantizer.acc.eq(held[0]),
            requantizer.valid.eq(feeding),
            requantizer.multiplier.eq(self.multiplier),
            requantizer.zero_point.eq(self.out_zp),
            requantizer.lo.eq(Mux(self.out_signed, -128, 0)),
            requantizer.hi.eq(Mux(self.out_signed, 127, 255)),
        ]
        with m.If(requantizer.y_valid):
            # Results enter at the top lane and shift down, so lane 0's ends up in lane 0.
            m.d.sync += [
                results.eq(Cat(results.as_value()[8:], requantizer.y[:8])),
                collected.eq(collected + 1),
            ]

        output_valid = busy & (collected == lanes)
        with m.If(self.enable):
            m.d.comb += [
                self.o_stream.valid.eq(output_valid),
                self.o_stream.payload.eq(results),
            ]
            with m.If(output_valid & self.o_stream.ready):
                m.d.sync += busy.eq(0)
        with m.Else():
            m.d.comb += pass_through(self.i_stream, self.o_stream)
        return m
