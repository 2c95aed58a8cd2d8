"""A two-entry register slice on a stream whose ``ready`` is a flip-flop.

:class:`~sfnpu.hw.stream_register.StreamRegister` cuts a stream's data and valid but passes
``ready`` through; a slave whose ``ready`` is deep logic (the SDRAM controller's W channel:
open-row compares, timers, the burst state) then extends the master's paths. The skid buffer
cuts both directions: ``i_stream.ready`` is "a slot is free", a register, and a beat taken
while the output stalls waits in the second slot. A beat per cycle at full rate, one cycle
of latency.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal

from .stream_register import StreamRegister

__all__ = ["SkidBuffer"]


class SkidBuffer(StreamRegister):
    """:class:`StreamRegister`'s ports and latency (one cycle when the output is not
    stalled), with ``i_stream.ready`` a register: high while a slot is free.

    Two forms with the same behaviour at the ports (a two-beat queue):

    - default: the beats wait in two slots written and read in turn, so ``o_stream.ready``
      drives only the read pointer and the occupancy flags; no slot's enable waits for it (a
      ready at the end of deep logic would otherwise reach every payload bit's enable).
      ``o_stream.payload`` is the slot the read pointer picks: a multiplexer after the
      registers. For a slave whose ready is deep (the SDRAM controller's W channel).
    - ``payload_register=True``: ``o_stream.payload`` is a register (the head), refilled from
      the input or the second slot when it is empty or read; ``o_stream.ready`` reaches the
      payload's enables, but nothing stands between the registers and the far end. For a
      stream whose ready is shallow and whose data travels far (the AXI R channel into the
      DMA's queues).

    Parameters
    ----------
    shape : shape-castable
        The beat's payload.
    payload_register : bool
        The second form.
    """

    def __init__(self, shape, *, payload_register: bool = False):
        self.payload_register = payload_register
        super().__init__(shape)

    def elaborate(self, platform):
        if self.payload_register:
            return self._head_and_skid()
        m = Module()
        i, o = self.i_stream, self.o_stream
        slots = [Signal.like(i.payload, name=f"slot_{k}") for k in range(2)]
        write, read = Signal(), Signal()           # the slot written next, the head
        full = Signal()
        m.d.comb += [i.ready.eq(~full), o.payload.eq(Mux(read, slots[1], slots[0]))]
        taken = i.valid & ~full
        given = o.valid & o.ready
        with m.If(taken):
            m.d.sync += write.eq(~write)
            for k, slot in enumerate(slots):
                with m.If(write == k):
                    m.d.sync += slot.eq(i.payload)
        with m.If(given):
            m.d.sync += read.eq(~read)
        # Occupancy 0, 1 or 2 as (valid, full).
        with m.If(taken & ~given):
            m.d.sync += [o.valid.eq(1), full.eq(o.valid)]
        with m.Elif(given & ~taken):
            m.d.sync += [full.eq(0), o.valid.eq(full)]
        return m

    def _head_and_skid(self):
        m = Module()
        i, o = self.i_stream, self.o_stream
        skid = Signal.like(i.payload, name="skid")
        full = Signal()                            # the skid slot holds a beat (two held)
        m.d.comb += i.ready.eq(~full)
        with m.If(~o.valid | o.ready):             # the head is empty or being read
            m.d.sync += [o.payload.eq(Mux(full, skid, i.payload)),
                         o.valid.eq(full | i.valid), full.eq(0)]
        with m.Elif(i.valid & ~full):              # the head stalls: the beat skids
            m.d.sync += [skid.eq(i.payload), full.eq(1)]
        return m
