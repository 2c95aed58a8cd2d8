"""MaxPool (hw/maxpool.py) against sfnpu.numeric.max_pool, through its streams.

Every kernel/stride/padding combination the ISA allows (kernel 2 and 3, stride 1 and 2, padding
below the kernel), floor and ceil output sizes (:func:`sfnpu.numeric.pool_output_size`), int8
and uint8 codes, on random feature maps of several shapes — two or more channel blocks back to
back, so every map also checks the wrap from one block to the next — with random valid/ready
stalls. Row-interleaved blocks (rows of 2–4 segments, order (y, b, x), on a 4-block instance)
meet every window, floor and ceil mode and both types, with odd shapes and one-pixel segments.
"""

import itertools

import numpy as np
import pytest

from sfnpu.hw.maxpool import MaxPool
from sfnpu.numeric import max_pool, pool_output_size, qrange
from stream_bench import (beats_of, interleaved_beats_of, interleaved_tensor_of, run_streams,
                          tensor_of)

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
    """2×2 stride 2: every input beat is taken in its cycle, the output follows
    ``MaxPool.LATENCY`` cycles after the last window's last pixel."""
    rng = np.random.default_rng(4)
    dut = MaxPool(8, max_width=16)
    x = random_map(rng, 16, 8, 16, False)
    _, run = run_pool(dut, x, 2, 2, 0, (4, 8), 8, rng, False, stall=0)
    input_beats = 2 * 8 * 16
    # +1: the driver may start a cycle late
    assert run.cycles <= input_beats + MaxPool.LATENCY + 1


def test_bypass_passes_beats_unchanged():
    rng = np.random.default_rng(5)
    dut = MaxPool(4, max_width=8)
    beats = beats_of(random_map(rng, 8, 3, 8, True), 4)
    run = run_streams(dut, {"i_stream": beats}, len(beats), config={"enable": 0}, rng=rng)
    assert run.beats == beats and run.extra == 0


# -- row-interleaved channel blocks: rows of `blocks` segments, order (y, b, x) -------------------

INTERLEAVED_SHAPES = [(5, 7), (3, 3), (7, 5), (1, 9), (9, 1), (2, 3), (4, 11), (6, 1), (1, 1),
                      (3, 8), (8, 5)]


def run_interleaved(dut, x, k, s, p, out_hw, lanes, rng, signed, stall=0.3):
    c, h, w = x.shape
    oh, ow = out_hw
    blocks = -(-c // lanes)
    config = {"enable": 1, "signed": int(signed), "kernel": k, "stride": s, "pad": p,
              "in_h": h, "in_w": w, "out_h": oh, "out_w": ow, "blocks": blocks}
    run = run_streams(dut, {"i_stream": interleaved_beats_of(x, lanes)}, oh * blocks * ow,
                      config=config, rng=rng, stall=stall)
    assert run.extra == 0
    return interleaved_tensor_of(run.beats, c, oh, ow, lanes, signed), run


def interleaved_cases():
    """Every window, floor and (where it differs) ceil mode, both types; shapes and block
    counts (2..4, the last block partly padding channels) vary from case to case."""
    index = 0
    for (k, s, p), ceil_mode, signed in itertools.product(WINDOWS, (False, True), (True, False)):
        if ceil_mode and not (s == 2 and p < k - 1):
            continue
        for _ in range(2):
            for _ in range(len(INTERLEAVED_SHAPES)):
                h, w = INTERLEAVED_SHAPES[index % len(INTERLEAVED_SHAPES)]
                index += 1
                out_hw = pooled_size(h, w, k, s, p, ceil_mode)
                if min(out_hw) >= 1 and (not ceil_mode
                                         or out_hw != pooled_size(h, w, k, s, p, False)):
                    break
            else:
                continue
            blocks = 2 + index % 3
            yield pytest.param(k, s, p, h, w, blocks, ceil_mode, signed,
                               id=f"k{k}s{s}p{p}-{h}x{w}x{blocks}b-"
                                  f"{'ceil' if ceil_mode else 'floor'}-"
                                  f"{'int8' if signed else 'uint8'}")


@pytest.fixture(scope="module")
def interleaved_dut():
    return MaxPool(2, max_width=MAX_WIDTH, max_blocks=4)


@pytest.mark.parametrize("k, s, p, h, w, blocks, ceil_mode, signed", list(interleaved_cases()))
def test_interleaved_blocks_match_numeric(interleaved_dut, k, s, p, h, w, blocks, ceil_mode,
                                          signed):
    rng = np.random.default_rng(hash((k, s, p, h, w, blocks, ceil_mode, signed)) % 2**32)
    x = random_map(rng, 2 * blocks - 1, h, w, signed)    # last block: one padding channel
    out_hw = pooled_size(h, w, k, s, p, ceil_mode)
    got, _ = run_interleaved(interleaved_dut, x, k, s, p, out_hw, 2, rng, signed)
    expected = max_pool(x, k, s, p, out_hw)
    assert np.array_equal(got, expected), np.argwhere(got != expected)[:5]


def test_interleaved_cases_cover_every_window():
    chosen = [c.values for c in interleaved_cases()]
    for window in WINDOWS:
        picked = [v for v in chosen if tuple(v[:3]) == window]
        has_ceil = window[1] == 2 and window[2] < window[0] - 1
        assert {v[6] for v in picked} == ({False, True} if has_ceil else {False}), window
        assert {v[7] for v in picked} == {False, True}, window
        assert {v[5] for v in picked} == {2, 3, 4}, window


@pytest.mark.parametrize("k, s, p, ceil_mode", [(3, 1, 2, False), (2, 2, 0, True),
                                                (3, 2, 1, True)])
def test_interleaved_row_fills_the_line_buffers(k, s, p, ceil_mode):
    """Eight lanes, four blocks, ``max_row_pixels`` exactly ``blocks · out_w``: the last
    reduced pixel of a row lands in the last line-buffer word."""
    rng = np.random.default_rng(k * 100 + s * 10 + p)
    h, w = 7, 9
    out_hw = pooled_size(h, w, k, s, p, ceil_mode)
    dut = MaxPool(8, max_width=w, max_height=h, max_blocks=4, max_row_pixels=4 * out_hw[1])
    x = random_map(rng, 29, h, w, True)
    got, _ = run_interleaved(dut, x, k, s, p, out_hw, 8, rng, True, stall=0.5)
    assert np.array_equal(got, max_pool(x, k, s, p, out_hw))


def test_one_block_on_a_multi_block_instance():
    """``blocks = 1`` on an instance built for four: channel blocks back to back, as before."""
    rng = np.random.default_rng(7)
    x = random_map(rng, 8, 5, 7, False)
    out_hw = pooled_size(5, 7, 3, 2, 1, True)
    dut = MaxPool(4, max_width=MAX_WIDTH, max_blocks=4)
    config = {"enable": 1, "signed": 0, "kernel": 3, "stride": 2, "pad": 1, "in_h": 5,
              "in_w": 7, "out_h": out_hw[0], "out_w": out_hw[1], "blocks": 1}
    run = run_streams(dut, {"i_stream": beats_of(x, 4)}, 2 * out_hw[0] * out_hw[1],
                      config=config, rng=rng)
    assert run.extra == 0
    assert np.array_equal(tensor_of(run.beats, 8, *out_hw, 4, False),
                          max_pool(x, 3, 2, 1, out_hw))


def test_interleaved_one_beat_per_cycle_without_stalls():
    """2×2 stride 2 on three interleaved blocks: segment boundaries cost no cycle."""
    rng = np.random.default_rng(8)
    dut = MaxPool(8, max_width=16, max_blocks=3)
    x = random_map(rng, 24, 8, 16, False)
    _, run = run_interleaved(dut, x, 2, 2, 0, (4, 8), 8, rng, False, stall=0)
    assert run.cycles <= 3 * 8 * 16 + MaxPool.LATENCY + 1
