# amaranth: UnusedElaboratable=no
"""The group controller's output writer (hw/controller/writer.py), in Amaranth's simulator: the
output's segments ``(oy, ob)`` are commanded in chunks of at most half the write buffer, each
only once the buffer holds all of it, at the destination's addresses; in DRAM the words leave
as bus beats of commanded chunks only, in an on-chip buffer as local writes. ``drained`` once
the last word is out."""

import pytest
from amaranth.sim import Simulator

from sfnpu.hw.controller.writer import OutputWriter
from sfnpu.hw.dma import Direction, command_layout
from sfnpu.isa import MemSpace

LANES, BUS, WORDS, BUFFER = 8, 4, 8, 256          # chunks of 4 words, 2 beats per word
OUT_H, OUT_W, OB, BLOCK0, OFFSET, BASE = 2, 5, 2, 1, 0x40, 0x1000


def expected_chunks(local):
    plane, row = OUT_H * OUT_W * LANES, OUT_W * LANES
    first = (0 if local else BASE) + OFFSET + BLOCK0 * plane
    chunks = []
    for oy in range(OUT_H):
        for ob in range(OB):
            start = first + oy * row + ob * plane
            for x in range(0, OUT_W, WORDS // 2):
                n = min(WORDS // 2, OUT_W - x)
                chunks.append((start + x * LANES, n))
    return chunks


@pytest.mark.parametrize("local", [False, True], ids=["dram", "buffer"])
def test_chunks_addresses_and_data(local):
    dut = OutputWriter(LANES, BUS, 32, WORDS, BUFFER, command_layout(32, 24))
    words = [0x0101010101010101 * (k + 1) for k in range(OUT_H * OB * OUT_W)]
    commands, data = [], []

    async def producer(ctx):
        for word in words:
            ctx.set(dut.i_stream.payload, word)
            ctx.set(dut.i_stream.valid, 1)
            await ctx.tick().until(dut.i_stream.ready)
            ctx.set(dut.i_stream.valid, 0)
            await ctx.tick()                   # the post chain is slower than the writer

    async def consumer(ctx):
        """The DMA (always ready) or the buffers' writer (a chunk at a time)."""
        cmd = dut.local_cmd if local else dut.cmd
        out = dut.local_data if local else dut.bus
        left = 0
        while True:
            ctx.set(cmd.ready, not local or left == 0)
            ctx.set(out.ready, not local or left > 0)
            _, _, cv, cr, address, count, length, direction, dv, dr, payload = \
                await ctx.tick().sample(cmd.valid, cmd.ready, cmd.payload.address,
                                        dut.local_cmd.payload.count, dut.cmd.payload.length,
                                        dut.cmd.payload.direction, out.valid, out.ready,
                                        out.payload)
            if cv and cr:
                if local:
                    commands.append((address * LANES, count))
                    left = count
                else:
                    assert direction == Direction.WRITE
                    commands.append((address, length // LANES))
            if dv and dr:
                data.append(payload)
                left -= 1
                # no more words leave than have been commanded
                assert len(data) * (LANES if local else BUS) <= \
                    sum(n for _, n in commands) * LANES

    async def bench(ctx):
        instr = dut.instr
        ctx.set(instr.out_h, OUT_H)
        ctx.set(instr.out_w, OUT_W)
        ctx.set(instr.output.offset, OFFSET)
        ctx.set(instr.output.space, MemSpace.BUF1 if local else MemSpace.DRAM)
        ctx.set(dut.base, BASE)
        ctx.set(dut.ob_count, OB)
        ctx.set(dut.out_block0, BLOCK0)
        ctx.set(dut.out_plane, OUT_H * OUT_W * LANES)
        ctx.set(dut.out_row_bytes, OUT_W * LANES)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        ctx.set(dut.compute, 1)
        await ctx.tick().until(dut.drained)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_process(producer)
    sim.add_process(consumer)
    sim.add_testbench(bench)
    sim.run_until(1e-3)
    assert commands == expected_chunks(local)
    if local:
        assert data == words
    else:
        assert data == [(w >> (32 * k)) & 0xFFFFFFFF for w in words for k in range(2)]
