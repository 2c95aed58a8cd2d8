"""HeldOutput against a pipeline held by its clock enable: the same handshakes and beats in
every cycle, under random input gaps, output stalls and restarts."""

import random

import pytest
from amaranth.hdl import Elaboratable, EnableInserter, Module, ResetInserter, Signal
from amaranth.sim import Simulator

from sfnpu.hw.held_output import HeldOutput


def _pipeline(m, value, valid, latency, name):
    """``latency`` registers of (value, valid); the valids reset, the data does not."""
    for index in range(latency):
        data = Signal.like(value, name=f"{name}_data_{index}", reset_less=True)
        flag = Signal(name=f"{name}_valid_{index}")
        m.d.sync += [data.eq(value), flag.eq(valid)]
        value, valid = data, flag
    return value, valid


class _Pipeline(Elaboratable):
    """A pipeline of ``latency`` stages between a valid/ready input and output."""

    def __init__(self, width, latency):
        self.width, self.latency = width, latency
        self.i_valid, self.i_data, self.o_ready = Signal(), Signal(width), Signal()
        self.i_ready, self.o_valid, self.o_data = Signal(), Signal(), Signal(width)


class _Reference(_Pipeline):
    """The pipeline every stage of which is held while its output waits."""

    def elaborate(self, platform):
        m = Module()
        inner = Module()
        data, valid = _pipeline(inner, self.i_data, self.i_valid, self.latency, "held")
        advance = ~valid | self.o_ready
        m.submodules.inner = EnableInserter(advance)(inner)
        m.d.comb += [self.i_ready.eq(advance), self.o_valid.eq(valid), self.o_data.eq(data)]
        return m


class _Ours(_Pipeline):
    """A free-running pipeline of the same latency behind HeldOutput."""

    def elaborate(self, platform):
        m = Module()
        m.submodules.held = held = HeldOutput(self.width, self.latency)
        accept = self.i_valid & held.advance
        data, _ = _pipeline(m, self.i_data, accept, self.latency, "free")
        m.d.comb += [held.accept.eq(accept), held.payload.eq(data),
                     held.o_stream.ready.eq(self.o_ready),
                     self.i_ready.eq(held.advance), self.o_valid.eq(held.o_stream.valid),
                     self.o_data.eq(held.o_stream.payload)]
        return m


@pytest.mark.parametrize("latency", [1, 2, 3, 7, 8, 15, 16])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_cycle_matches_the_held_pipeline(latency, seed):
    width = 10
    m = Module()
    restart = Signal()
    ours = ResetInserter(restart)(_Ours(width, latency))
    reference = ResetInserter(restart)(_Reference(width, latency))
    m.submodules.ours, m.submodules.reference = ours, reference
    i_valid, i_data, o_ready = Signal(), Signal(width), Signal()
    for unit in (ours, reference):
        m.d.comb += [unit.i_valid.eq(i_valid), unit.i_data.eq(i_data),
                     unit.o_ready.eq(o_ready)]
    rng = random.Random(seed * 100 + latency)
    cycles = 40 * latency + 600
    counts = {"beats": 0, "stalled": 0}

    async def bench(ctx):
        for cycle in range(cycles):
            # phases that fill the pipeline against a stalled output, drain it, and mix
            phase = (cycle // (3 * latency + 11)) % 3
            p_valid, p_ready = ((0.9, 0.15), (0.2, 0.95), (0.7, 0.6))[phase]
            ctx.set(i_valid, rng.random() < p_valid)
            ctx.set(i_data, rng.randrange(1 << width))
            ctx.set(o_ready, rng.random() < p_ready)
            ctx.set(restart, rng.random() < 0.003)
            await ctx.delay(1e-9)
            for name in ("i_ready", "o_valid"):
                assert ctx.get(getattr(ours, name)) == ctx.get(getattr(reference, name)), \
                    (cycle, name)
            if ctx.get(reference.o_valid):
                assert ctx.get(ours.o_data) == ctx.get(reference.o_data), cycle
                counts["beats"] += 1
                counts["stalled"] += not ctx.get(o_ready)
            await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    # both the data and the holding were exercised
    assert counts["beats"] > cycles // 5 and counts["stalled"] > cycles // 20
