# amaranth: UnusedElaboratable=no
"""The group controller's accumulator (hw/controller/accumulator.py), in Amaranth's simulator:
the array's results of ``ib_count`` input-channel blocks are summed per output pixel, the bias
is added and the requantisers produce one code per lane, in the order ``(ob, ox)``; conv NONE
passes ``acc + zero point`` with no bias."""

import struct

import numpy as np
import pytest
from amaranth.sim import Simulator

from sfnpu.hw.controller.accumulator import Accumulator

LANES, WIDTH = 4, 8


def f32(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def pack(values, bits):
    return sum((int(v) & ((1 << bits) - 1)) << (bits * k) for k, v in enumerate(values))


@pytest.mark.parametrize("identity", [False, True])
def test_sums_blocks_adds_bias_and_requantises(identity):
    dut = Accumulator(LANES, WIDTH, 4)
    rng = np.random.default_rng(7)
    conv_w, ib_count, ob_count = 3, 2, 2
    parts = rng.integers(-40, 40, (ob_count, ib_count, conv_w, LANES))
    bias = rng.integers(-20, 20, (ob_count, LANES))
    zero_point = -3
    sums = parts.sum(axis=1) + (0 if identity else bias[:, None, :])
    expect = np.clip(np.rint(sums * (1.0 if identity else 0.5)) + zero_point, -128, 127)

    async def params(ctx):
        # the bias/multiplier store: one cycle after param_addr
        async for _, _, address in ctx.tick().sample(dut.param_addr):
            ctx.set(dut.bias, pack(bias[address % ob_count], 32))
            ctx.set(dut.mult, pack([f32(0.5)] * LANES, 32))

    got = []

    async def monitor(ctx):
        async for _, _, valid, codes in ctx.tick().sample(dut.o_stream.valid,
                                                          dut.o_stream.payload):
            if valid:
                got.append([np.int8(np.uint8((codes >> (8 * k)) & 0xFF)) for k in range(LANES)])

    async def bench(ctx):
        ctx.set(dut.conv_w, conv_w)
        ctx.set(dut.ib_count, ib_count)
        ctx.set(dut.ob_count, ob_count)
        ctx.set(dut.identity, identity)
        ctx.set(dut.out_signed, 1)
        ctx.set(dut.zero_point, zero_point)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        for ob in range(ob_count):
            for ib in range(ib_count):
                for ox in range(conv_w):
                    ctx.set(dut.i_stream.payload, [int(v) for v in parts[ob, ib, ox]])
                    ctx.set(dut.i_stream.valid, 1)
                    await ctx.tick()
                    ctx.set(dut.i_stream.valid, 0)
                    if ox == 1:
                        await ctx.tick()           # a gap in the array's output
        await ctx.tick().repeat(20)
        assert np.array_equal(np.array(got), expect.reshape(-1, LANES))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_process(params)
    sim.add_process(monitor)
    sim.add_testbench(bench)
    sim.run()
