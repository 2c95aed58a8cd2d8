"""hw/shared_product.py: one registered multiplier for lanes never active together."""

import pytest
from amaranth.hdl import Module, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from sfnpu.hw.chscale import ChannelScaleLane
from sfnpu.hw.eltwise_add import EltwiseAddLane
from sfnpu.hw.shared_product import multiply


class TwoUsers(wiring.Component):
    """An element-wise adder's product port (8 × 24 bits, unsigned) and a channel scaler's
    (10 × 10 bits, signed) on one multiplier, chosen by ``select``."""

    def __init__(self):
        super().__init__({
            "select": In(1),
            "add_a": In(8), "add_b": In(24), "add_p": Out(32),
            "scale_a": In(signed(10)), "scale_b": In(signed(10)), "scale_p": Out(signed(20)),
        })

    def elaborate(self, platform):
        m = Module()
        add = EltwiseAddLane.PRODUCT.create()
        scale = ChannelScaleLane.CODE_PRODUCT.create()
        m.d.comb += [add.a.eq(self.add_a), add.b.eq(self.add_b),
                     scale.a.eq(self.scale_a), scale.b.eq(self.scale_b),
                     self.add_p.eq(add.p), self.scale_p.eq(scale.p)]
        multiply(m, [add, scale], select=self.select)
        return m


def test_the_selected_lanes_product_reaches_it_a_cycle_later():
    dut = TwoUsers()
    cases = [(0, 255, (1 << 24) - 1, -383, 383), (1, 200, 12345, -383, 383),
             (1, 7, 9, 383, -1), (0, 0, 77, -5, -7), (1, 1, 1, -511, -512)]

    async def bench(ctx):
        for select, add_a, add_b, scale_a, scale_b in cases:
            ctx.set(dut.select, select)
            ctx.set(dut.add_a, add_a)
            ctx.set(dut.add_b, add_b)
            ctx.set(dut.scale_a, scale_a)
            ctx.set(dut.scale_b, scale_b)
            await ctx.tick()
            if select == 0:
                assert ctx.get(dut.add_p) == add_a * add_b
            else:
                assert ctx.get(dut.scale_p) == scale_a * scale_b

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


def test_several_ports_need_a_select():
    with pytest.raises(ValueError, match="select"):
        multiply(None, [EltwiseAddLane.PRODUCT.create(), ChannelScaleLane.CODE_PRODUCT.create()])
