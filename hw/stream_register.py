"""A one-stage pipeline register on a stream.

It cuts the data and valid paths of a chain of stages that would otherwise pass a beat
through several bypass multiplexers in one cycle (the post chain's bypassed stages). It
behaves at its ports like every held pipeline stage of the post chain (one of
:class:`~sfnpu.hw.held_output.HeldOutput`'s latency): it takes a beat when it is empty or its
beat is being read, so the chain keeps a beat per cycle and the cycle model counts it as one
cycle of latency. ``ready`` still passes through combinationally (one gate).
"""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["StreamRegister"]


class StreamRegister(wiring.Component):
    """Parameters
    ----------
    shape : shape-castable
        The beat's payload.

    Signature
    ---------
    i_stream : In(stream.Signature(shape))
    o_stream : Out(stream.Signature(shape))
        ``i_stream``'s beats one cycle later.
    """

    #: Cycles from a beat taken to the beat at the output (the cycle model's post latency).
    LATENCY = 1

    def __init__(self, shape):
        self.shape = shape
        super().__init__({
            "i_stream": In(stream.Signature(shape)),
            "o_stream": Out(stream.Signature(shape)),
        })

    def elaborate(self, platform):
        m = Module()
        i, o = self.i_stream, self.o_stream
        m.d.comb += i.ready.eq(~o.valid | o.ready)
        with m.If(i.ready):
            m.d.sync += [o.valid.eq(i.valid), o.payload.eq(i.payload)]
        return m
