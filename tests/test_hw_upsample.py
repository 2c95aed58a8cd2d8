"""Upsample2x (hw/upsample.py) against sfnpu.numeric.upsample_nearest2x, through its streams.

Feature maps of several shapes (1-pixel rows and columns included) and both signednesses stream
through with random valid/ready stalls; several channel blocks follow each other without a gap,
or are row-interleaved (order (y, b, x): one row of ``blocks · W`` pixels).
"""

import numpy as np
import pytest

from sfnpu.hw.upsample import Upsample2x
from sfnpu.numeric import qrange, upsample_nearest2x
from stream_bench import (beats_of, interleaved_beats_of, interleaved_tensor_of, run_streams,
                          tensor_of)


def random_map(rng, c, h, w, signed):
    lo, hi = qrange(signed)
    return rng.integers(lo, hi + 1, (c, h, w)).astype(np.int8 if signed else np.uint8)


@pytest.mark.parametrize("lanes, c, h, w, signed", [
    (8, 16, 5, 7, True),
    (8, 8, 3, 13, False),
    (4, 12, 1, 9, True),       # one row per channel block
    (4, 8, 6, 1, False),       # one pixel per row: the replay reads the pixel just written
    (2, 2, 1, 1, True),
    (8, 8, 7, 16, True),       # a row as wide as the line buffer
])
def test_upsample_matches_numeric(lanes, c, h, w, signed):
    rng = np.random.default_rng(lanes * 100 + h * 10 + w)
    dut = Upsample2x(lanes, max_width=16)
    x = random_map(rng, c, h, w, signed)
    expected = upsample_nearest2x(x)
    run = run_streams(dut, {"i_stream": beats_of(x, lanes)}, 4 * len(beats_of(x, lanes)),
                      config={"enable": 1, "in_w": w}, rng=rng)
    got = tensor_of(run.beats, c, 2 * h, 2 * w, lanes, signed)
    assert np.array_equal(got, expected), np.argwhere(got != expected)[:5]
    assert run.extra == 0


@pytest.mark.parametrize("stall", [0.0, 0.6])
def test_width_changes_between_maps(stall):
    """Groups of different widths back to back (the width is configuration, set when idle)."""
    rng = np.random.default_rng(11)
    dut = Upsample2x(4, max_width=12)
    maps = [random_map(rng, 4, 3, w, True) for w in (12, 1, 5)]

    outputs = []
    for x in maps:
        run = run_streams(dut, {"i_stream": beats_of(x, 4)}, 4 * x[0].size,
                          config={"enable": 1, "in_w": x.shape[2]}, rng=rng, stall=stall)
        outputs.append(tensor_of(run.beats, 4, 2 * x.shape[1], 2 * x.shape[2], 4, True))
    for x, got in zip(maps, outputs):
        assert np.array_equal(got, upsample_nearest2x(x))


def test_one_output_beat_per_cycle():
    rng = np.random.default_rng(12)
    dut = Upsample2x(8, max_width=16)
    x = random_map(rng, 8, 4, 16, False)
    run = run_streams(dut, {"i_stream": beats_of(x, 8)}, 4 * x[0].size,
                      config={"enable": 1, "in_w": 16}, rng=rng, stall=0)
    assert run.cycles <= 4 * x[0].size + 1       # +1: the driver may start a cycle late


def test_bypass_passes_beats_unchanged():
    rng = np.random.default_rng(13)
    dut = Upsample2x(8, max_width=16)
    beats = beats_of(random_map(rng, 16, 4, 5, True), 8)
    run = run_streams(dut, {"i_stream": beats}, len(beats), config={"enable": 0, "in_w": 5},
                      rng=rng)
    assert run.beats == beats and run.extra == 0


@pytest.mark.parametrize("seed", range(16))
def test_random_maps(seed):
    rng = np.random.default_rng(300 + seed)
    lanes = int(rng.choice([2, 4, 8]))
    c = int(rng.integers(1, 3 * lanes + 1))
    h, w = (int(v) for v in rng.integers(1, 17, 2))
    signed = bool(rng.integers(0, 2))
    dut = Upsample2x(lanes, max_width=16)
    x = random_map(rng, c, h, w, signed)
    run = run_streams(dut, {"i_stream": beats_of(x, lanes)}, 4 * len(beats_of(x, lanes)),
                      config={"enable": 1, "in_w": w}, rng=rng,
                      stall=float(rng.choice([0.0, 0.3, 0.7])))
    assert np.array_equal(tensor_of(run.beats, c, 2 * h, 2 * w, lanes, signed),
                          upsample_nearest2x(x))
    assert run.extra == 0


@pytest.mark.parametrize("lanes, blocks, h, w, signed, stall", [
    (8, 3, 5, 4, True, 0.3),
    (4, 2, 3, 7, False, 0.5),
    (4, 4, 1, 3, True, 0.3),      # one row
    (2, 3, 4, 1, False, 0.3),     # one-pixel segments
    (2, 4, 2, 2, True, 0.0),
    (8, 2, 6, 8, False, 0.7),     # an interleaved row as wide as the line buffer
])
def test_interleaved_blocks_are_one_wide_row(lanes, blocks, h, w, signed, stall):
    """Rows of ``blocks`` segments (order (y, b, x)) with ``in_w = blocks · W``: the output is
    each channel's 2× upsample, in the same interleaved order."""
    rng = np.random.default_rng(500 + lanes * 10 + blocks)
    c = lanes * blocks - int(rng.integers(0, lanes))        # the last block may be partial
    x = random_map(rng, c, h, w, signed)
    dut = Upsample2x(lanes, max_width=16)
    beats = interleaved_beats_of(x, lanes)
    run = run_streams(dut, {"i_stream": beats}, 4 * len(beats),
                      config={"enable": 1, "in_w": blocks * w}, rng=rng, stall=stall)
    got = interleaved_tensor_of(run.beats, c, 2 * h, 2 * w, lanes, signed)
    expected = upsample_nearest2x(x)
    assert np.array_equal(got, expected), np.argwhere(got != expected)[:5]
    assert run.extra == 0
