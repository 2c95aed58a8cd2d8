"""StreamRegister: one cycle of latency, a beat per cycle, no beat lost or repeated, and the
handshake of a held pipeline stage (the cycle model counts it as one)."""

import random

import pytest
from amaranth.hdl import Module, ResetInserter, Signal
from amaranth.sim import Simulator

from sfnpu.hw.stream_register import StreamRegister


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beats_pass_in_order_one_cycle_later(seed):
    width = 12
    m = Module()
    restart = Signal()
    m.submodules.dut = dut = ResetInserter(restart)(StreamRegister(width))
    i, o = dut.i_stream, dut.o_stream
    rng = random.Random(seed)
    cycles = 3000
    counts = {"beats": 0, "stalled": 0, "back_to_back": 0}

    async def bench(ctx):
        sent, expected = [], []          # beats taken; beats still to come out
        taken_at = None                  # the cycle of the last beat taken
        offered = None
        last_out = None
        for cycle in range(cycles):
            phase = (cycle // 37) % 3
            p_valid, p_ready = ((0.95, 0.2), (0.3, 0.95), (0.8, 0.7))[phase]
            if offered is None and rng.random() < p_valid:
                offered = rng.randrange(1 << width)
            flush = rng.random() < 0.002
            ctx.set(i.valid, offered is not None)
            ctx.set(i.payload, offered if offered is not None else 0)
            ctx.set(o.ready, rng.random() < p_ready)
            ctx.set(restart, flush)
            await ctx.delay(1e-9)
            assert len(expected) <= 1, (cycle, "more than one beat held")
            o_valid, o_ready = ctx.get(o.valid), ctx.get(o.ready)
            # the held stage's handshake: take a beat when empty or being read
            assert ctx.get(i.ready) == (not o_valid or o_ready), cycle
            if o_valid:
                assert expected, (cycle, "a beat out that was not taken")
                assert ctx.get(o.payload) == expected[0], cycle
                assert taken_at is not None and taken_at < cycle
                if o_ready:
                    last_out = cycle
                    counts["beats"] += 1
                    expected.pop(0)
                else:
                    counts["stalled"] += 1
            else:
                # an empty register holds nothing: every beat taken is out
                assert not expected, (cycle, "a taken beat did not come out")
            if offered is not None and ctx.get(i.ready):
                counts["back_to_back"] += last_out == cycle
                sent.append(offered)
                expected.append(offered)
                taken_at = cycle
                offered = None
            if flush:
                expected.clear()
            await ctx.tick()
        assert len(sent) >= counts["beats"]

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    # the data, the holding and the full rate (a beat in and out in the same cycle) were seen
    assert counts["beats"] > cycles // 4
    assert counts["stalled"] > cycles // 20
    assert counts["back_to_back"] > cycles // 20


def test_a_taken_beat_is_out_the_next_cycle():
    m = Module()
    m.submodules.dut = dut = StreamRegister(8)
    i, o = dut.i_stream, dut.o_stream

    async def bench(ctx):
        ctx.set(o.ready, 1)
        ctx.set(i.valid, 1)
        ctx.set(i.payload, 0x5A)
        await ctx.delay(1e-9)
        assert not ctx.get(o.valid) and ctx.get(i.ready)
        await ctx.tick()
        ctx.set(i.valid, 0)
        await ctx.delay(1e-9)
        assert ctx.get(o.valid) and ctx.get(o.payload) == 0x5A
        await ctx.tick()
        await ctx.delay(1e-9)
        assert not ctx.get(o.valid)

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
