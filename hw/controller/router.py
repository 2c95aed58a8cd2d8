"""Read router: the compute phase's DMA read data to the agent whose command it answers."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, ResetInserter, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from .common import TAG_INPUT, TAG_PREFETCH, TAG_SHORTCUT, TAG_WEIGHTS

__all__ = ["ReadRouter"]


class ReadRouter(wiring.Component):
    """Read data in the compute phase — input segments, streamed weight sets, shortcut
    segments and prefetch reads — comes back in the order the commands were granted: one tag
    per DMA read, in a FIFO, tells whose each beat is. Input and shortcut beats are gathered
    into words of ``lanes`` bytes, weight beats into steps of ``Ti·To`` bytes (beats in
    address order); prefetch beats pass as they are.

    Parameters
    ----------
    bus_bytes, lanes, step_bytes : int
        Bytes per beat, per feature-map word, per weight step.

    Signature
    ---------
    flush, start, compute : In(1)
        Abort; a compute phase's first cycle; the compute phase (other phases' beats belong
        to the sequencer: ``ready`` is then 1).
    read : In(stream.Signature(StructLayout({"data", "last"})))
        The DMA's read data.
    grant_input, grant_weights, grant_shortcut, grant_prefetch : In(1)
        A DMA read of that agent is granted (at most one per cycle).
    input, shortcut : Out(stream.Signature(8 · lanes, always_ready=True))
    weights : Out(stream.Signature(8 · step_bytes, always_ready=True))
    prefetch : Out(stream.Signature(read layout, always_ready=True))
    """

    def __init__(self, bus_bytes: int, lanes: int, step_bytes: int):
        self.bus_bytes = bus_bytes
        self.lanes = lanes
        self.step_bytes = step_bytes
        beat = data.StructLayout({"data": 8 * bus_bytes, "last": 1})
        super().__init__({
            "flush": In(1), "start": In(1), "compute": In(1),
            "read": In(stream.Signature(beat)),
            "grant_input": In(1), "grant_weights": In(1), "grant_shortcut": In(1),
            "grant_prefetch": In(1),
            "input": Out(stream.Signature(8 * lanes, always_ready=True)),
            "shortcut": Out(stream.Signature(8 * lanes, always_ready=True)),
            "weights": Out(stream.Signature(8 * step_bytes, always_ready=True)),
            "prefetch": Out(stream.Signature(beat, always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        rd, compute = self.read, self.compute
        beat_fire = rd.valid & rd.ready
        m.submodules.tags = tags = ResetInserter(self.flush)(SyncFIFO(width=2, depth=16))
        m.d.comb += [
            tags.w_data.eq(Mux(self.grant_weights, TAG_WEIGHTS,
                               Mux(self.grant_shortcut, TAG_SHORTCUT,
                                   Mux(self.grant_prefetch, TAG_PREFETCH, TAG_INPUT)))),
            tags.w_en.eq(self.grant_input | self.grant_weights | self.grant_shortcut
                         | self.grant_prefetch),
            tags.r_en.eq(beat_fire & rd.payload.last & compute),
        ]
        tag = tags.r_data
        data_beat = beat_fire & compute
        with m.If(compute):
            m.d.comb += rd.ready.eq(tags.r_rdy)
        with m.Else():
            m.d.comb += rd.ready.eq(1)
        for name, code, size in (("input", TAG_INPUT, self.lanes),
                                 ("weights", TAG_WEIGHTS, self.step_bytes),
                                 ("shortcut", TAG_SHORTCUT, self.lanes)):
            out = getattr(self, name)
            push, word = self._assemble(m, data_beat & (tag == code), size, name)
            m.d.comb += [out.valid.eq(push), out.payload.eq(word)]
        m.d.comb += [self.prefetch.valid.eq(data_beat & (tag == TAG_PREFETCH)),
                     self.prefetch.payload.eq(rd.payload)]
        return m

    def _assemble(self, m, beat_valid, word_bytes, name):
        """Bus beats → words of ``word_bytes`` (beats in address order): the strobe of a
        word's last beat and the word."""
        B = self.bus_bytes
        beat = self.read.payload.data
        parts = word_bytes // B
        if parts == 1:
            return beat_valid, beat
        word = Signal(8 * word_bytes, name=f"{name}_word")
        part = Signal(range(parts), name=f"{name}_part")
        with m.If(self.flush | self.start):
            m.d.sync += part.eq(0)
        with m.Elif(beat_valid):
            m.d.sync += [word.eq(Cat(word[8 * B:], beat)),
                         part.eq(Mux(part == parts - 1, 0, part + 1))]
        return beat_valid & (part == parts - 1), Cat(word[8 * B:], beat)
