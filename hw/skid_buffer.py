"""A two-entry register slice on a stream whose ``ready`` is a flip-flop.

:class:`~sfnpu.hw.stream_register.StreamRegister` cuts a stream's data and valid but passes
``ready`` through; a slave whose ``ready`` is deep logic (the SDRAM controller's W channel:
open-row compares, timers, the burst state) then extends the master's paths. The skid buffer
cuts both directions: ``i_stream.ready`` is "the skid slot is empty", a register, and a beat
taken while the output stalls waits in the skid slot. A beat per cycle at full rate, one cycle
of latency.
"""

from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["SkidBuffer"]


class SkidBuffer(wiring.Component):
    """Parameters
    ----------
    shape : shape-castable
        The beat's payload.

    Signature
    ---------
    i_stream : In(stream.Signature(shape))
        ``ready`` is a register: high while the skid slot is empty.
    o_stream : Out(stream.Signature(shape))
        ``i_stream``'s beats in order, from the cycle after each is taken; ``valid`` and
        ``payload`` are registers.
    """

    #: Cycles from a beat taken to the beat at the output, when the output is not stalled.
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
        skid_valid = Signal()
        skid = Signal.like(i.payload)
        m.d.comb += i.ready.eq(~skid_valid)
        taken = i.valid & i.ready
        with m.If(~o.valid | o.ready):
            # The output slot is free after this cycle: the skid slot's beat first.
            with m.If(skid_valid):
                m.d.sync += [o.payload.eq(skid), o.valid.eq(1), skid_valid.eq(0)]
            with m.Else():
                m.d.sync += [o.payload.eq(i.payload), o.valid.eq(taken)]
        with m.Elif(taken):
            m.d.sync += [skid.eq(i.payload), skid_valid.eq(1)]
        return m
