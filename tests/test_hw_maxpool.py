"""MaxPool (hw/maxpool.py) against sfnpu.numeric.max_pool, through its streams.

Every kernel/stride/padding combination the ISA allows (kernel 2 and 3, stride 1 and 2, padding
below the kernel), floor and ceil output sizes (:func:`sfnpu.numeric.pool_output_size`), int8
and uint8 codes, on random feature maps of several shapes — two or more channel blocks back to
back, so every map also checks the wrap from one block to the next — with random valid/ready
stalls.
"""

import itertools

import numpy as np
import pytest

from sfnpu.hw.maxpool import MaxPool
from sfnpu.numeric import max_pool, pool_output_size, qrange
from stream_bench import beats_of, run_streams, tensor_of

MAX_WIDTH = 12
WINDOWS = [(k, s, p) for k in (2, 3) for s in (1, 2) for p in range(k)]
SHAPES = [(5, 7), (6, 6), (3, 3), (2, 9), (9, 1), (1, 1), (4, MAX_WIDTH), (8, 11)]


def random_map(rng, c, h, w, signed):
    lo, hi = qrange(signed)
    x = rng.integers(lo, hi + 1, (c, h, w))
    # Extremes often, so the lowest code (the neutral element) and the highest both win.
    x = np.where(rng.random(x.shape) < 0.1, rng.choice([lo, hi], x.shape), x)
    return x.astype(np.int8 if signed else np.uint8)


def pooled_size(h, w, k, s, p, ceil_mode):
    return (pool_output_size(h, k, s, p, p, ceil_mode), pool_output_size(w, k, s, p, p, ceil_mode))


def run_pool(dut, x, k, s, p, out_hw, lanes, rng, signed, stall=0.3):
    c, h, w = x.shape
    oh, ow = out_hw
    config = {"enable": 1, "signed": int(signed), "kernel": k, "stride": s, "pad": p,
              "in_h": h, "in_w": w, "out_h": oh, "out_w": ow}
    blocks = -(-c // lanes)
    run = run_streams(dut, {"i_stream": beats_of(x, lanes)}, blocks * oh * ow, config=config,
                      rng=rng, stall=stall)
    assert run.extra == 0
    return tensor_of(run.beats, c, oh, ow, lanes, signed), run


def cases():
    """(window, shape, ceil mode, signedness) — every window with every shape whose output is
    not empty, both types; ceil mode where it differs from floor mode on at least one axis."""
    for (k, s, p), (h, w), ceil_mode, signed in itertools.product(
            WINDOWS, SHAPES, (False, True), (True, False)):
        oh, ow = pooled_size(h, w, k, s, p, ceil_mode)
        if oh < 1 or ow < 1:
            continue
        if ceil_mode and (oh, ow) == pooled_size(h, w, k, s, p, False):
            continue
        yield pytest.param(k, s, p, h, w, ceil_mode, signed,
                           id=f"k{k}s{s}p{p}-{h}x{w}-{'ceil' if ceil_mode else 'floor'}"
                              f"-{'int8' if signed else 'uint8'}")


@pytest.fixture(scope="module")
def dut():
    return MaxPool(4, max_width=MAX_WIDTH)


@pytest.mark.parametrize("k, s, p, h, w, ceil_mode, signed", list(cases()))
def test_max_pool_matches_numeric(dut, k, s, p, h, w, ceil_mode, signed):
    rng = np.random.default_rng(hash((k, s, p, h, w, ceil_mode)) % 2**32)
    x = random_map(rng, 8, h, w, signed)            # two channel blocks of 4 lanes
    out_hw = pooled_size(h, w, k, s, p, ceil_mode)
    got, _ = run_pool(dut, x, k, s, p, out_hw, 4, rng, signed)
    expected = max_pool(x, k, s, p, out_hw)
    assert np.array_equal(got, expected), np.argwhere(got != expected)[:5]


def test_every_window_meets_both_modes_and_types():
    """Ceil mode differs from floor mode only with stride 2 and padding below kernel − 1
    (otherwise the extra window would start in the end padding, and it is dropped)."""
    chosen = [c.values for c in cases()]
    for window in WINDOWS:
        picked = [v for v in chosen if tuple(v[:3]) == window]
        has_ceil = window[1] == 2 and window[2] < window[0] - 1
        assert {v[5] for v in picked} == ({False, True} if has_ceil else {False}), window
        assert {v[6] for v in picked} == {False, True}, window
        assert len(picked) >= 10, window


@pytest.mark.parametrize("k, s, p, ceil_mode", [(3, 2, 1, False), (3, 2, 1, True),
                                                (2, 2, 0, True), (3, 1, 2, False)])
def test_eight_lanes_several_blocks(k, s, p, ceil_mode):
    rng = np.random.default_rng(3)
    dut = MaxPool(8, max_width=16)
    x = random_map(rng, 20, 11, 16, True)            # three blocks, the last one padded
    out_hw = pooled_size(11, 16, k, s, p, ceil_mode)
    got, _ = run_pool(dut, x, k, s, p, out_hw, 8, rng, True, stall=0.5)
    assert np.array_equal(got, max_pool(x, k, s, p, out_hw))


def test_one_beat_per_cycle_without_stalls():
    """2×2 stride 2: every input beat is taken in its cycle, the output follows 2 cycles
    after the last window's last pixel."""
    rng = np.random.default_rng(4)
    dut = MaxPool(8, max_width=16)
    x = random_map(rng, 16, 8, 16, False)
    _, run = run_pool(dut, x, 2, 2, 0, (4, 8), 8, rng, False, stall=0)
    input_beats = 2 * 8 * 16
    assert run.cycles <= input_beats + 2 + 1       # +1: the driver may start a cycle late


def test_bypass_passes_beats_unchanged():
    rng = np.random.default_rng(5)
    dut = MaxPool(4, max_width=8)
    beats = beats_of(random_map(rng, 8, 3, 8, True), 4)
    run = run_streams(dut, {"i_stream": beats}, len(beats), config={"enable": 0}, rng=rng)
    assert run.beats == beats and run.extra == 0
