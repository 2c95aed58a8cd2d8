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

from .stream_register import StreamRegister

__all__ = ["SkidBuffer"]


class SkidBuffer(StreamRegister):
    """:class:`StreamRegister`'s ports and latency (one cycle when the output is not
    stalled), with ``i_stream.ready`` a register: high while the skid slot is empty.
    ``o_stream``'s ``valid`` and ``payload`` are registers."""

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
