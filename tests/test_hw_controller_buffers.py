# amaranth: UnusedElaboratable=no
"""The group controller's on-chip buffers (hw/controller/buffers.py), in Amaranth's simulator:
staging writes and chunk writes land in the buffer their space names, both readers stream a
commanded segment back (one word per cycle, one cycle after its address) from any buffer, both
at once from two different buffers (one read port per buffer, shared), and a reader or the
writer takes a command only when idle."""

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
        for reader, other in (("input", "shortcut"), ("shortcut", "input")):
            ctx.set(getattr(dut, f"{other}_space"), MemSpace.DRAM)
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


def test_both_readers_at_once_from_different_buffers():
    """Input and shortcut stream side by side, each from its own buffer, through the buffers'
    shared read ports; buffer k holds 1000·k + address in every lane's low half."""
    dut = FeatureBuffers(LANES, WORDS, CHUNK)

    def word(space, address):
        return 1000 * (space.value - 1) + address

    async def bench(ctx):
        for space in SPACES:
            ctx.set(dut.stage_space, space)
            ctx.set(dut.stage.valid, 1)
            for address in range(WORDS):
                ctx.set(dut.stage.payload.address, address)
                ctx.set(dut.stage.payload.data, word(space, address))
                await ctx.tick()
            ctx.set(dut.stage.valid, 0)
        for in_space in SPACES:
            for sc_space in SPACES:
                if in_space == sc_space:
                    continue
                ctx.set(dut.input_space, in_space)
                ctx.set(dut.shortcut_space, sc_space)
                for reader, address in (("input", 3), ("shortcut", 40)):
                    cmd = getattr(dut, f"{reader}_cmd")
                    ctx.set(cmd.payload.address, address)
                    ctx.set(cmd.payload.count, 10)
                    ctx.set(cmd.valid, 1)
                await ctx.tick()
                ctx.set(dut.input_cmd.valid, 0)
                ctx.set(dut.shortcut_cmd.valid, 0)
                got = {"input": [], "shortcut": []}
                for _ in range(12):
                    _, _, *sampled = await ctx.tick().sample(
                        dut.input_data.valid, dut.input_data.payload,
                        dut.shortcut_data.valid, dut.shortcut_data.payload)
                    for reader, (valid, data) in zip(got, (sampled[:2], sampled[2:])):
                        if valid:
                            got[reader].append(data)
                assert got["input"] == [word(in_space, 3 + k) for k in range(10)]
                assert got["shortcut"] == [word(sc_space, 40 + k) for k in range(10)]

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
