"""Convolution datapath: row buffer → convolution array ← double weight buffer.

The path from the input-word and weight-set streams to the int32 accumulators, as the group
controller (:mod:`sfnpu.hw.controller`) drives it and :mod:`sfnpu.hw.verilog` exports it.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from sfnpu.config import HwConfig

from .conv_array import ACC_BITS, ConvArray, array_latency, weight_step_layout
from .row_buffer import RowBuffer, window_params_layout
from .weight_buffer import USES_BITS, WeightBuffer

__all__ = ["ConvDatapath"]


class ConvDatapath(wiring.Component):
    """Input rows and weight sets in, one To-lane int32 result per pixel and pass out.

    Signature
    ---------
    i_stream : In(stream.Signature(ArrayLayout(unsigned(8), lanes)))
        Input words for the row buffer (:class:`~sfnpu.hw.row_buffer.RowBuffer`).
    w_stream : In(stream.Signature(weight_step_layout(config)))
        Weight sets for the weight buffer, in pass order.
    params : In(window_params_layout(config))
        The convolution (row buffer parameters); ``depthwise`` and ``zero_point`` also set the
        array's mode and input zero point.
    x_signed : In(1)
        The input is int8 (1) or uint8 (0).
    uses : In(USES_BITS)
        Pixels per weight set (``out_w`` for row reuse).
    hold : In(1)
        Stops the array taking steps (the consumer of ``o_stream`` is short of room);
        results already in the array's pipeline still come out.
    start : In(1)
        Begins a convolution (ignored while busy).
    busy : Out(1)
        From the cycle after ``start`` until the last result has left ``o_stream``.
    o_stream : Out(stream.Signature(ArrayLayout(signed(32), To), always_ready=True))
        The array's results (no back-pressure: the consumer takes one per cycle).
    """

    def __init__(self, config: HwConfig):
        self.config = config
        super().__init__({
            "i_stream": In(stream.Signature(data.ArrayLayout(unsigned(8), config.lanes))),
            "w_stream": In(stream.Signature(weight_step_layout(config))),
            "params": In(window_params_layout(config)),
            "x_signed": In(1),
            "uses": In(USES_BITS),
            "hold": In(1),
            "start": In(1),
            "busy": Out(1),
            "o_stream": Out(stream.Signature(data.ArrayLayout(signed(ACC_BITS), config.to),
                                             always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.rows = rows = RowBuffer(self.config)
        m.submodules.weights = weights = WeightBuffer(self.config)
        m.submodules.array = array = ConvArray(self.config)
        wiring.connect(m, wiring.flipped(self.i_stream), rows.i_stream)
        wiring.connect(m, wiring.flipped(self.w_stream), weights.i_stream)
        # The array joins the two step streams; `hold` withholds the window steps.
        m.d.comb += [
            array.windows.payload.eq(rows.o_stream.payload),
            array.windows.valid.eq(rows.o_stream.valid & ~self.hold),
            rows.o_stream.ready.eq(array.windows.ready & ~self.hold),
        ]
        wiring.connect(m, weights.o_stream, array.weights)
        start = self.start & ~self.busy
        # Busy until the array has drained: results trail the last step by its latency.
        in_flight = Signal(array_latency(self.config) + 1)
        m.d.sync += in_flight.eq(Cat(rows.busy, in_flight))
        # `in_flight.any()` as a register of its own, formed a cycle early from the bits that
        # shift into it: `start` (and the row buffer's reset of its window state behind it)
        # sees one flip-flop, not an OR over the array's latency.
        in_flight_any = Signal()
        m.d.sync += in_flight_any.eq(rows.busy | in_flight[:-1].any())
        m.d.comb += [
            rows.params.eq(self.params),
            rows.start.eq(start),
            weights.start.eq(start),
            weights.steps.eq(rows.steps),
            weights.uses.eq(self.uses),
            array.depthwise.eq(self.params.depthwise),
            array.x_zero_point.eq(self.params.zero_point),
            array.x_signed.eq(self.x_signed),
            self.busy.eq(rows.busy | in_flight_any),
            self.o_stream.payload.eq(array.o_stream.payload),
            self.o_stream.valid.eq(array.o_stream.valid),
        ]
        return m
