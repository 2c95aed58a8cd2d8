"""The block-RAM FIFO against Amaranth's SyncFIFO: the same outputs in every cycle."""

import random

import pytest
from amaranth.hdl import Module, ResetInserter, Signal
from amaranth.lib.fifo import SyncFIFO
from amaranth.sim import Simulator

from sfnpu.hw.fifo import BlockRamFIFO


def _pair(width, depth):
    """Both queues on the same inputs; a shared reset (a flush) wraps both."""
    m = Module()
    flush = Signal()
    ours = ResetInserter(flush)(BlockRamFIFO(width=width, depth=depth))
    reference = ResetInserter(flush)(SyncFIFO(width=width, depth=depth))
    m.submodules.ours, m.submodules.reference = ours, reference
    inputs = dict(w_data=Signal(width), w_en=Signal(), r_en=Signal())
    for fifo in (ours, reference):
        m.d.comb += [getattr(fifo, name).eq(signal) for name, signal in inputs.items()]
    return m, flush, inputs, ours, reference


@pytest.mark.parametrize("depth", [1, 2, 5, 16, 98])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_cycle_matches_sync_fifo(depth, seed):
    m, flush, inputs, ours, reference = _pair(12, depth)
    rng = random.Random(seed * 1000 + depth)
    cycles = 30 * depth + 300
    checked = {"data": 0}

    async def bench(ctx):
        for cycle in range(cycles):
            # phases that fill, drain and hover around the middle
            phase = (cycle // (4 * depth + 7)) % 3
            p_write, p_read = ((0.9, 0.2), (0.2, 0.9), (0.6, 0.6))[phase]
            ctx.set(inputs["w_data"], rng.randrange(1 << 12))
            ctx.set(inputs["w_en"], rng.random() < p_write)
            ctx.set(inputs["r_en"], rng.random() < p_read)
            ctx.set(flush, rng.random() < 0.01)
            await ctx.delay(1e-9)
            for name in ("level", "w_rdy", "r_rdy", "w_level", "r_level"):
                assert ctx.get(getattr(ours, name)) == ctx.get(getattr(reference, name)), \
                    (cycle, name)
            if ctx.get(reference.r_rdy):
                assert ctx.get(ours.r_data) == ctx.get(reference.r_data), cycle
                checked["data"] += 1
            await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert checked["data"] > cycles // 4       # the data comparison was exercised
