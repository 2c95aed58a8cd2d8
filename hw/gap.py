"""Global average pool (QLinearGlobalAveragePool, :func:`sfnpu.numeric.global_avg_pool_codes`).

``y = clamp(rint(float32(Σx − x_zp·N) · m) + y_zp)`` per channel, ``N = H·W``, with the sum
exact in int32 and the float32-exact :class:`~sfnpu.hw.requant.Requantizer`. The sum is kept as
``Σ(x − x_zp)`` (the same int32 value, no multiply). One output beat per channel block is rare
(every ``H·W`` input beats), so a single requantiser serves all lanes one after another; the
finished sums move to a holding bank so the next channel block accumulates meanwhile.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .beat import code_beat
from .requant import Requantizer

__all__ = ["GlobalAvgPool", "ACC_BITS"]

#: Accumulator width: the int32 sum of the numeric contract (it wraps like int32).
ACC_BITS = 32


class GlobalAvgPool(wiring.Component):
    """Per-channel average of a channel block's ``in_h × in_w`` pixels, requantised.

    Parameters
    ----------
    lanes : int
        Codes per beat (``HwConfig.lanes``).
    max_height, max_width : int
        Largest input sizes (the ISA's 12-bit fields by default).

    Signature
    ---------
    i_stream : In(stream.Signature(ArrayLayout(8, lanes)))
        Input pixels of one channel block after another (``in_h · in_w`` beats each).
    o_stream : Out(stream.Signature(ArrayLayout(8, lanes)))
        One beat per channel block: the pooled codes.
    enable : In(1)
        Configuration: 0 bypasses the stage (``o_stream`` is ``i_stream``, combinationally).
    in_h, in_w : In(...)
        Configuration: pixels per channel block, ``N = in_h · in_w``.
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

    Timing: one input beat per cycle. The output beat of a block is ready ``lanes +``
    :attr:`Requantizer.LATENCY <sfnpu.hw.requant.Requantizer.LATENCY>` ``+ 1`` cycles after
    its last input beat; the last beat of the next block waits until that output has left
    (blocks of at least ``lanes + 7`` pixels never wait when the output is not stalled).
    """

    def __init__(self, lanes: int, max_height: int = 4095, max_width: int = 4095):
        if lanes < 1 or max_height < 1 or max_width < 1:
            raise ValueError(f"lanes and sizes must be positive ({lanes}, {max_height}, "
                             f"{max_width})")
        self.lanes = lanes
        self.max_height = max_height
        self.max_width = max_width
        beat = code_beat(lanes)
        super().__init__({
            "i_stream": In(beat),
            "o_stream": Out(beat),
            "enable": In(1),
            "in_h": In(range(1, max_height + 1)),
            "in_w": In(range(1, max_width + 1)),
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

        # -- accumulate Σ(x − x_zp) per lane ---------------------------------------------------
        column = Signal(range(self.max_width))
        row = Signal(range(self.max_height))
        block_start = Signal(init=1)            # the next beat is a block's first pixel
        sums = [Signal(signed(ACC_BITS), name=f"sum_{lane}") for lane in range(lanes)]
        held = [Signal(signed(ACC_BITS), name=f"held_{lane}") for lane in range(lanes)]

        busy = Signal()                         # the held sums or their output are in use
        last_pixel = (column == self.in_w - 1) & (row == self.in_h - 1)
        accept = Signal()
        m.d.comb += [
            self.i_stream.ready.eq(self.enable & (~last_pixel | ~busy)),
            accept.eq(self.i_stream.valid & self.i_stream.ready),
        ]
        with m.If(accept):
            m.d.sync += [
                column.eq(Mux(column == self.in_w - 1, 0, column + 1)),
                block_start.eq(last_pixel),
            ]
            with m.If(column == self.in_w - 1):
                m.d.sync += row.eq(Mux(last_pixel, 0, row + 1))

        for lane in range(lanes):
            code = self.i_stream.payload[lane]
            value = Mux(self.in_signed, code.as_signed(), code)       # 9-bit signed
            total = Signal(signed(ACC_BITS), name=f"total_{lane}")
            m.d.comb += total.eq(Mux(block_start, 0, sums[lane]) + (value - self.in_zp))
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
            m.d.comb += [
                self.o_stream.payload.eq(self.i_stream.payload),
                self.o_stream.valid.eq(self.i_stream.valid),
                self.i_stream.ready.eq(self.o_stream.ready),
            ]
        return m
