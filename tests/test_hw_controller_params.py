# amaranth: UnusedElaboratable=no
"""The group controller's parameter store (hw/controller/params.py), in Amaranth's simulator: a
parameter block streamed beat by beat lands in the bias, multiplier and weight-zero-point
stores (read back per channel block), the post record's words and the activation table's
write port."""

import numpy as np
from amaranth.sim import Simulator

from sfnpu import layout
from sfnpu.config import get_config
from sfnpu.hw.controller.common import POST_WORDS, param_aligned
from sfnpu.hw.controller.params import ParamStore

CONFIG = get_config("ecp5-ulx3s")            # To = 4, a 4-byte bus
TO, BUS, BLOCKS = CONFIG.to, CONFIG.dram_bus_bytes, 2


def test_parameter_block_into_the_stores():
    dut = ParamStore(TO, BUS, BLOCKS)
    rng = np.random.default_rng(3)
    cp = TO * BLOCKS
    bias = rng.integers(0, 1 << 32, cp, dtype=np.uint64)
    mult = rng.integers(0, 1 << 32, cp, dtype=np.uint64)
    wzp = rng.integers(0, 256, cp, dtype=np.uint64)
    post = rng.integers(0, 1 << 32, POST_WORDS, dtype=np.uint64)
    table = rng.integers(0, 256, 256, dtype=np.uint8)
    post_off = param_aligned(cp * 9, CONFIG)
    act_off = param_aligned(post_off + layout.POST_RECORD.itemsize, CONFIG)
    block = bytearray(act_off + 256)
    block[0:4 * cp] = bias.astype("<u4").tobytes()
    block[4 * cp:8 * cp] = mult.astype("<u4").tobytes()
    block[8 * cp:9 * cp] = wzp.astype("u1").tobytes()
    block[post_off:post_off + 4 * POST_WORDS] = post.astype("<u4").tobytes()
    block[act_off:] = table.tobytes()

    def word(values, bits, k):
        return sum(int(v) << (bits * j) for j, v in enumerate(values[k * TO:(k + 1) * TO]))

    async def bench(ctx):
        for name, value in (("mult_off", 4 * cp), ("wzp_off", 8 * cp), ("post_off", post_off),
                            ("act_off", act_off), ("ct_off", post_off), ("channels", cp),
                            ("act_table", 1)):
            ctx.set(getattr(dut, name), value)
        table_writes = {}
        for pos in range(0, len(block), BUS):
            ctx.set(dut.pos, pos)
            ctx.set(dut.beat, int.from_bytes(block[pos:pos + BUS], "little"))
            ctx.set(dut.load, 1)
            await ctx.delay(1e-9)
            assert not ctx.get(dut.ct_write_en)
            if ctx.get(dut.act_write_en):
                table_writes[ctx.get(dut.act_write_addr)] = block[pos:pos + BUS]
            await ctx.tick()
        ctx.set(dut.load, 0)
        assert table_writes == {k: block[act_off + k:act_off + k + BUS]
                                for k in range(0, 256, BUS)}
        assert ctx.get(dut.post) == sum(int(v) << (32 * k) for k, v in enumerate(post))
        for k in range(BLOCKS):
            ctx.set(dut.rq_addr, k)
            ctx.set(dut.wzp_addr, k)
            ctx.set(dut.wzp_en, 1)
            ctx.set(dut.wzp_stream_addr, k)
            await ctx.tick()
            assert ctx.get(dut.wzp_stream) == word(wzp, 8, k)
            assert ctx.get(dut.bias) == word(bias, 32, k)
            assert ctx.get(dut.mult) == word(mult, 32, k)
            assert ctx.get(dut.wzp) == word(wzp, 8, k)

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
