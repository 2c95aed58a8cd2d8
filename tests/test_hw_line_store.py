"""The max and average pools with their line buffers shared, as the post chain builds them
(hw/line_store.py, ``share_pool_lines``): each pool, enabled beside the other disabled one,
against sfnpu.numeric through its streams — every window of the pools' own tests, on a few
shapes and block counts, with random stalls."""

import numpy as np
import pytest
from amaranth.hdl import Module
from amaranth.lib import wiring

from sfnpu.hw.avgpool import AvgPool
from sfnpu.hw.controller.post import share_pool_lines
from sfnpu.hw.maxpool import MaxPool
from sfnpu.numeric import max_pool
from test_hw_avgpool import check_groups, window_groups
from test_hw_maxpool import WINDOWS, random_map, pooled_size, run_interleaved

MAX_WIDTH = 12


class SharedPools(wiring.Component):
    """``MaxPool`` and ``AvgPool`` on shared line buffers, the ports of the one under test
    (``tested``) outside and the other disabled."""

    def __init__(self, lanes, tested, **sizes):
        self.maxpool = MaxPool(lanes, **sizes, shared_lines=True)
        self.avgpool = AvgPool(lanes, **sizes, shared_lines=True)
        self.tested = getattr(self, tested)
        self.other = self.avgpool if tested == "maxpool" else self.maxpool
        super().__init__({name: member for name, member
                          in self.tested.signature.members.items() if name != "lines"})

    def elaborate(self, platform):
        m = Module()
        m.submodules.maxpool, m.submodules.avgpool = self.maxpool, self.avgpool
        tested = self.tested
        wiring.connect(m, wiring.flipped(self.i_stream), tested.i_stream)
        wiring.connect(m, tested.o_stream, wiring.flipped(self.o_stream))
        for name, member in self.signature.members.items():
            if not member.is_signature:
                m.d.comb += getattr(tested, name).eq(getattr(self, name))
        m.d.comb += self.other.enable.eq(0)
        share_pool_lines(m, self.maxpool, self.avgpool)
        return m


@pytest.mark.parametrize("k, s, p", WINDOWS, ids=[f"k{k}s{s}p{p}" for k, s, p in WINDOWS])
def test_max_pool_on_shared_lines(k, s, p):
    rng = np.random.default_rng(100 * k + 10 * s + p)
    dut = SharedPools(2, "maxpool", max_width=MAX_WIDTH, max_blocks=4)
    # (one-pixel rows: the next row reads the pixel being written, a transparent read)
    for (h, w), ceil_mode, signed, blocks in (((5, 7), False, True, 3), ((1, 1), True, False, 2),
                                              ((6, MAX_WIDTH), True, True, 4),
                                              ((5, 1), False, False, 1)):
        out_hw = pooled_size(h, w, k, s, p, ceil_mode)
        if min(out_hw) < 1:
            continue
        x = random_map(rng, 2 * blocks - 1, h, w, signed)
        got, _ = run_interleaved(dut, x, k, s, p, out_hw, 2, rng, signed)
        assert np.array_equal(got, max_pool(x, k, s, p, out_hw))


@pytest.mark.parametrize("window", WINDOWS, ids=[f"k{k}s{s}p{p}" for k, s, p in WINDOWS])
def test_avg_pool_on_shared_lines(window):
    rng = np.random.default_rng(sum(window) * 17 + window[0])
    dut = SharedPools(2, "avgpool", max_width=8, max_height=8, max_blocks=4)
    check_groups(dut, 2, window_groups(window, rng, 2), rng, stall=0.3)
