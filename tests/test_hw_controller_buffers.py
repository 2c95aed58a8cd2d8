# amaranth: UnusedElaboratable=no
"""The group controller's on-chip buffers (hw/controller/buffers.py), in Amaranth's simulator:
staging writes and chunk writes land in the buffer their space names, both readers stream a
commanded segment back (one word per cycle, one cycle after its address) from any buffer, and
a reader or the writer takes a command only when idle."""

import numpy as np
from amaranth.sim import Simulator

from sfnpu.hw.controller.buffers import FeatureBuffers
from sfnpu.isa import MemSpace

LANES, WORDS, CHUNK = 4, 64, 8
SPACES = (MemSpace.BUF0, MemSpace.BUF1, MemSpace.BUF2)


def test_write_then_read_every_buffer():
    dut = FeatureBuffers(LANES, WORDS, CHUNK)
    rng = np.random.default_rng(1)
    content = {space: [int(v) for v in rng.integers(0, 1 << (8 * LANES), 12, dtype=np.uint64)]
               for space in SPACES}

    async def command(ctx, cmd, address, count):
        ctx.set(cmd.payload.address, address)
        ctx.set(cmd.payload.count, count)
        ctx.set(cmd.valid, 1)
        await ctx.tick().until(cmd.ready)
        ctx.set(cmd.valid, 0)

    async def bench(ctx):
        for space in SPACES:
            # words 0…5 staged, 6…11 written as one chunk (with a stall in between)
            ctx.set(dut.stage_space, space)
            for k in range(6):
                ctx.set(dut.stage.payload.address, 10 + k)
                ctx.set(dut.stage.payload.data, content[space][k])
                ctx.set(dut.stage.valid, 1)
                await ctx.tick()
            ctx.set(dut.stage.valid, 0)
            ctx.set(dut.o_space, space)
            await command(ctx, dut.o_cmd, 16, 6)
            assert not ctx.get(dut.o_cmd.ready)
            for k in range(6, 12):
                ctx.set(dut.o_data.payload, content[space][k])
                ctx.set(dut.o_data.valid, 1)
                await ctx.tick().until(dut.o_data.ready)
                ctx.set(dut.o_data.valid, 0)
                if k == 8:
                    await ctx.tick()
            await ctx.tick()
            assert ctx.get(dut.o_cmd.ready)
        for reader in ("input", "shortcut"):
            for space in SPACES:
                ctx.set(getattr(dut, f"{reader}_space"), space)
                cmd, out = getattr(dut, f"{reader}_cmd"), getattr(dut, f"{reader}_data")
                await command(ctx, cmd, 10, 12)
                got = []
                while len(got) < 12:
                    assert len(got) == 11 or not ctx.get(cmd.ready)
                    _, _, valid, word = await ctx.tick().sample(out.valid, out.payload)
                    if valid:
                        got.append(word)
                assert got == content[space], (reader, space)
                assert ctx.get(cmd.ready)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


def test_start_drops_a_segment():
    dut = FeatureBuffers(LANES, WORDS, CHUNK)

    async def bench(ctx):
        ctx.set(dut.input_space, MemSpace.BUF1)
        ctx.set(dut.input_cmd.payload.count, 20)
        ctx.set(dut.input_cmd.valid, 1)
        await ctx.tick()
        ctx.set(dut.input_cmd.valid, 0)
        assert not ctx.get(dut.input_cmd.ready)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        assert ctx.get(dut.input_cmd.ready)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
