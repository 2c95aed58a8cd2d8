"""Double weight-block buffer (ShortcutFusion Sec. III-B: "double weight block buffer").

A *set* is the weights of one pass: ``steps`` weight steps (one ``To×Ti`` block per kernel tap,
or ``Ti/2`` depthwise taps per step; :func:`~sfnpu.hw.conv_array.weight_step_layout`). The buffer
has two banks of ``MAX_KERNEL²`` steps. While one bank replays its set ``uses`` times (once per
output pixel of the pass: ``out_w`` in row-reuse order, ``out_h·out_w`` in frame-reuse order),
the other loads the next set from ``i_stream`` — so a set of ``steps`` steps is hidden behind a
pass of at least ``steps`` cycles.

Timing: a bank is free from the cycle after the read of its last step; it loads one step per
cycle; once loaded it can be read from the next cycle; ``o_stream`` is registered (the memory's
read register) and moves one step per cycle while ready. A set written in cycles ``w … w +
steps − 1`` is therefore valid on ``o_stream`` from cycle ``w + steps + 1``, and with a weight
stream that offers a step every cycle each later set is loaded before it is needed (the other
bank replays for at least ``steps`` cycles), so only the first set can stall the array.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from sfnpu.config import MAX_KERNEL, HwConfig

from .conv_array import _check, weight_step_layout

__all__ = ["WeightBuffer", "USES_BITS"]

#: Width of ``uses``: a whole output frame (12-bit height × 12-bit width) for frame reuse.
USES_BITS = 24
_BANK_STEPS = MAX_KERNEL * MAX_KERNEL


class WeightBuffer(wiring.Component):
    """Two banks of weight steps, ping-pong: load one set while replaying the other.

    Signature
    ---------
    i_stream : In(stream.Signature(weight_step_layout(config)))
        Sets of ``steps`` weight steps, back to back.
    o_stream : Out(stream.Signature(weight_step_layout(config)))
        Each set ``uses`` times over, in order.
    steps : In(range(MAX_KERNEL² + 1))
        Steps per set (the row buffer's ``steps``); held while sets are in flight.
    uses : In(USES_BITS)
        Replays of each set (≥ 1).
    start : In(1)
        Empties both banks (begin a convolution).
    """

    def __init__(self, config: HwConfig):
        _check(config)
        self.config = config
        layout = weight_step_layout(config)
        super().__init__({
            "i_stream": In(stream.Signature(layout)),
            "o_stream": Out(stream.Signature(layout)),
            "steps": In(range(_BANK_STEPS + 1)),
            "uses": In(USES_BITS),
            "start": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        step_bits = (_BANK_STEPS - 1).bit_length()
        # Bank index in the top address bit: the two banks are one memory.
        memory = Memory(shape=weight_step_layout(self.config), depth=2 << step_bits, init=[])
        m.submodules.memory = memory
        write = memory.write_port()
        read = memory.read_port()

        full = Signal(2)                       # bank holds a complete set not yet used up
        load_bank = Signal()
        load_step = Signal(step_bits)
        read_bank = Signal()
        read_step = Signal(step_bits)
        read_use = Signal(USES_BITS)

        # -- loading ----------------------------------------------------------------------------
        m.d.comb += [
            self.i_stream.ready.eq(~Mux(load_bank, full[1], full[0])),
            write.addr.eq(Cat(load_step, load_bank)),
            write.data.eq(self.i_stream.payload),
            write.en.eq(self.i_stream.valid & self.i_stream.ready),
        ]
        loaded = Signal()                      # the last step of a set is written this cycle
        m.d.comb += loaded.eq(write.en & (load_step + 1 == self.steps))
        with m.If(self.start):
            m.d.sync += [load_bank.eq(0), load_step.eq(0)]
        with m.Elif(write.en):
            with m.If(loaded):
                m.d.sync += [load_step.eq(0), load_bank.eq(~load_bank)]
            with m.Else():
                m.d.sync += load_step.eq(load_step + 1)

        # -- replay -----------------------------------------------------------------------------
        out = self.o_stream
        advance = ~out.valid | out.ready
        available = Mux(read_bank, full[1], full[0])
        fetch = advance & available
        last_step = read_step + 1 == self.steps
        released = Signal()                    # the last read of a set is issued this cycle
        m.d.comb += [
            released.eq(fetch & last_step & (read_use + 1 == self.uses)),
            read.addr.eq(Cat(read_step, read_bank)),
            read.en.eq(advance),
            out.payload.eq(read.data),
        ]
        with m.If(self.start):
            m.d.sync += [read_bank.eq(0), read_step.eq(0), read_use.eq(0), out.valid.eq(0)]
        with m.Else():
            with m.If(advance):
                m.d.sync += out.valid.eq(available)
            with m.If(fetch):
                with m.If(~last_step):
                    m.d.sync += read_step.eq(read_step + 1)
                with m.Elif(~released):
                    m.d.sync += [read_step.eq(0), read_use.eq(read_use + 1)]
                with m.Else():
                    m.d.sync += [read_step.eq(0), read_use.eq(0), read_bank.eq(~read_bank)]

        # Both ends may change `full` in one cycle, always in different banks.
        for bank in range(2):
            with m.If(self.start):
                m.d.sync += full[bank].eq(0)
            with m.Elif(loaded & (load_bank == bank)):
                m.d.sync += full[bank].eq(1)
            with m.Elif(released & (read_bank == bank)):
                m.d.sync += full[bank].eq(0)
        return m
