"""GlobalAvgPool (hw/gap.py) against sfnpu.numeric.global_avg_pool_codes, through its streams.

Channel blocks of several sizes (1×1 up to 16×16) stream back to back with random valid/ready
stalls, for int8 and uint8 inputs and outputs; multipliers are onnxruntime's (from the scales),
exact powers of two (every other sum a rounding tie) and random. Short blocks make the input wait
for the shared requantiser. Row-interleaved blocks (rows of 2–4 segments, order (y, b, x)) use
the partial-sum memory; two groups back to back check that it restarts.
"""

import numpy as np
import pytest

from sfnpu.hw.gap import GlobalAvgPool
from sfnpu.hw.requant import Requantizer
from sfnpu.numeric import global_avg_pool_codes, global_avg_pool_multiplier, qrange
from stream_bench import beats_of, interleaved_beats_of, run_streams, tensor_of


def random_map(rng, c, h, w, signed, spread, centre=None):
    """Codes scattered around ``centre`` (random per channel when not given)."""
    lo, hi = qrange(signed)
    if centre is None:
        centre = rng.integers(lo, hi + 1, (c, 1, 1))
    x = np.clip(centre + rng.integers(-spread, spread + 1, (c, h, w)), lo, hi)
    return x.astype(np.int8 if signed else np.uint8)


def multiplier_for(kind, rng, n):
    if kind == "onnxruntime":
        x_s, y_s = np.float32(rng.uniform(0.01, 0.2)), np.float32(rng.uniform(0.01, 0.2))
        return global_avg_pool_multiplier(x_s, y_s, n)
    if kind == "tie":              # 1/(2N)-ish powers of two: half-way sums are common
        return np.float32(2.0 ** -int(np.ceil(np.log2(n)) + rng.integers(0, 2)))
    return np.float32(np.exp2(rng.uniform(-1, 1)) / n)


@pytest.mark.parametrize("lanes, c, h, w, in_signed, out_signed, kind", [
    (8, 24, 7, 7, True, True, "onnxruntime"),
    (8, 16, 4, 4, False, False, "tie"),
    (8, 16, 16, 16, False, True, "random"),
    (4, 20, 3, 5, True, False, "tie"),
    (4, 12, 1, 1, False, True, "onnxruntime"),    # N = 1: the input waits for the requantiser
    (4, 16, 2, 2, True, True, "tie"),
    (2, 6, 1, 9, False, False, "random"),
])
def test_global_avg_pool_matches_numeric(lanes, c, h, w, in_signed, out_signed, kind):
    rng = np.random.default_rng(lanes * 1000 + h * 31 + w)
    dut = GlobalAvgPool(lanes, max_height=16, max_width=16)
    lo, hi = qrange(in_signed)
    x_zp = int(rng.integers(lo, hi + 1))
    # Channel averages within ±40 of the zero point, outputs around a mid-range zero point:
    # most results land inside the clamp window, where the rounding is visible.
    centre = np.clip(x_zp + rng.integers(-40, 41, (c, 1, 1)), lo, hi)
    x = random_map(rng, c, h, w, in_signed, int(rng.choice([3, 40, 120])), centre)
    y_lo, y_hi = qrange(out_signed)
    y_zp = int(rng.integers(y_lo + 64, y_hi - 63))
    multiplier = multiplier_for(kind, rng, h * w)
    config = {"enable": 1, "in_h": h, "in_w": w, "in_signed": int(in_signed), "in_zp": x_zp,
              "multiplier": int(np.float32(multiplier).view(np.uint32)),
              "out_signed": int(out_signed), "out_zp": y_zp}
    blocks = -(-c // lanes)
    run = run_streams(dut, {"i_stream": beats_of(x, lanes)}, blocks, config=config, rng=rng)
    got = tensor_of(run.beats, c, 1, 1, lanes, out_signed)
    expected = global_avg_pool_codes(x, x_zp, multiplier, y_zp, out_signed)
    assert np.array_equal(got, expected), (got.ravel(), expected.ravel())
    assert run.extra == 0
    # The outputs are not all clamped: the comparison sees the rounding.
    assert np.count_nonzero((expected > y_lo) & (expected < y_hi)) >= c // 2


def test_ties_are_exercised_and_round_to_even():
    """Exact ties (sum·m = k + ½) in every lane, for both parities of k."""
    rng = np.random.default_rng(9)
    lanes, h, w = 8, 2, 2
    dut = GlobalAvgPool(lanes, max_height=4, max_width=4)
    # Σ(x − 0)·¼ with Σ ≡ 2 (mod 4): k + ½ with k even and odd alternating.
    sums = 4 * rng.integers(0, 60, 4 * lanes) + 2
    x = np.zeros((4 * lanes, h, w), np.uint8)
    for ch, s in enumerate(sums):
        parts = rng.multinomial(s, [0.25] * 4)
        while parts.max() > 255:
            parts = rng.multinomial(s, [0.25] * 4)
        x[ch] = parts.reshape(h, w)
    config = {"enable": 1, "in_h": h, "in_w": w, "in_signed": 0, "in_zp": 0,
              "multiplier": int(np.float32(0.25).view(np.uint32)), "out_signed": 0,
              "out_zp": 0}
    run = run_streams(dut, {"i_stream": beats_of(x, lanes)}, 4, config=config, rng=rng)
    got = tensor_of(run.beats, 4 * lanes, 1, 1, lanes, False).ravel()
    expected = global_avg_pool_codes(x, 0, np.float32(0.25), 0, False).ravel()
    assert np.array_equal(got, expected)
    assert set(expected % 2) == {0}                  # ties went to the even neighbour
    assert set((sums // 4) % 2) == {0, 1}            # …from below and from above


def test_bypass_passes_beats_unchanged():
    rng = np.random.default_rng(10)
    dut = GlobalAvgPool(4, max_height=8, max_width=8)
    beats = beats_of(random_map(rng, 8, 3, 3, True, 100), 4)
    run = run_streams(dut, {"i_stream": beats}, len(beats), config={"enable": 0, "in_h": 3,
                                                                      "in_w": 3}, rng=rng)
    assert run.beats == beats and run.extra == 0


def test_throughput_one_beat_per_cycle():
    """Blocks of 7×7 = 49 pixels: no input wait when the output is always ready."""
    rng = np.random.default_rng(11)
    dut = GlobalAvgPool(8, max_height=8, max_width=8)
    x = random_map(rng, 32, 7, 7, True, 20)
    config = {"enable": 1, "in_h": 7, "in_w": 7, "in_signed": 1, "in_zp": 0,
              "multiplier": int(np.float32(1 / 49).view(np.uint32)), "out_signed": 1,
              "out_zp": 0}
    run = run_streams(dut, {"i_stream": beats_of(x, 8)}, 4, config=config, rng=rng, stall=0)
    assert run.cycles <= 4 * 49 + GlobalAvgPool.output_latency(8) + 1


@pytest.mark.parametrize("seed", range(24))
def test_random_groups(seed):
    """Random sizes, types, zero points and multipliers (any of the three kinds)."""
    rng = np.random.default_rng(100 + seed)
    lanes = int(rng.choice([2, 4, 8]))
    h, w = (int(v) for v in rng.integers(1, 9, 2))
    c = int(rng.integers(1, 3 * lanes + 1))
    in_signed, out_signed = (bool(v) for v in rng.integers(0, 2, 2))
    lo, hi = qrange(in_signed)
    x_zp = int(rng.integers(lo, hi + 1))
    centre = np.clip(x_zp + rng.integers(-40, 41, (c, 1, 1)), lo, hi)
    x = random_map(rng, c, h, w, in_signed, int(rng.choice([3, 40, 120])), centre)
    y_lo, y_hi = qrange(out_signed)
    y_zp = int(rng.integers(y_lo, y_hi + 1))
    multiplier = multiplier_for(rng.choice(["onnxruntime", "tie", "random"]), rng, h * w)
    dut = GlobalAvgPool(lanes, max_height=8, max_width=8)
    config = {"enable": 1, "in_h": h, "in_w": w, "in_signed": int(in_signed), "in_zp": x_zp,
              "multiplier": int(np.float32(multiplier).view(np.uint32)),
              "out_signed": int(out_signed), "out_zp": y_zp}
    run = run_streams(dut, {"i_stream": beats_of(x, lanes)}, -(-c // lanes), config=config,
                      rng=rng, stall=float(rng.choice([0.0, 0.3, 0.7])))
    got = tensor_of(run.beats, c, 1, 1, lanes, out_signed)
    assert np.array_equal(got, global_avg_pool_codes(x, x_zp, multiplier, y_zp, out_signed))
    assert run.extra == 0


@pytest.mark.parametrize("in_signed, out_signed", [(False, False), (True, True), (False, True)])
def test_many_small_blocks(in_signed, out_signed):
    """Hundreds of 2×2 blocks (sum·m often a tie) back to back: the requantiser is shared by
    the lanes and the next block waits for it."""
    rng = np.random.default_rng(400 + 2 * in_signed + out_signed)
    lanes, c = 8, 8 * 150
    lo, hi = qrange(in_signed)
    x_zp = int(rng.integers(lo, hi + 1))
    centre = np.clip(x_zp + rng.integers(-100, 101, (c, 1, 1)), lo, hi)
    x = random_map(rng, c, 2, 2, in_signed, 30, centre)
    y_lo, y_hi = qrange(out_signed)
    y_zp = int(rng.integers(y_lo + 32, y_hi - 31))
    multiplier = np.float32(rng.choice([0.25, 0.125, 0.375, 0.3]))
    dut = GlobalAvgPool(lanes, max_height=4, max_width=4)
    config = {"enable": 1, "in_h": 2, "in_w": 2, "in_signed": int(in_signed), "in_zp": x_zp,
              "multiplier": int(multiplier.view(np.uint32)), "out_signed": int(out_signed),
              "out_zp": y_zp}
    run = run_streams(dut, {"i_stream": beats_of(x, lanes)}, c // lanes, config=config,
                      rng=rng, stall=0.2)
    expected = global_avg_pool_codes(x, x_zp, multiplier, y_zp, out_signed)
    assert np.array_equal(tensor_of(run.beats, c, 1, 1, lanes, out_signed), expected)
    assert np.count_nonzero((expected > y_lo) & (expected < y_hi)) > c // 2


# -- row-interleaved channel blocks: rows of `blocks` segments, order (y, b, x) -------------------

def interleaved_group(rng, lanes, c, h, w, in_signed, out_signed, kind, spread=None):
    """A random group: feature map, zero points, multiplier, configuration and expectation."""
    lo, hi = qrange(in_signed)
    x_zp = int(rng.integers(lo, hi + 1))
    centre = np.clip(x_zp + rng.integers(-40, 41, (c, 1, 1)), lo, hi)
    spread = int(rng.choice([3, 40, 120])) if spread is None else spread
    x = random_map(rng, c, h, w, in_signed, spread, centre)
    y_lo, y_hi = qrange(out_signed)
    y_zp = int(rng.integers(y_lo + 32, y_hi - 31))
    multiplier = multiplier_for(kind, rng, h * w)
    config = {"enable": 1, "in_h": h, "in_w": w, "blocks": -(-c // lanes),
              "in_signed": int(in_signed), "in_zp": x_zp,
              "multiplier": int(np.float32(multiplier).view(np.uint32)),
              "out_signed": int(out_signed), "out_zp": y_zp}
    return x, config, global_avg_pool_codes(x, x_zp, multiplier, y_zp, out_signed)


@pytest.mark.parametrize("lanes, blocks, h, w, in_signed, out_signed, kind", [
    (8, 3, 7, 7, True, True, "onnxruntime"),
    (8, 2, 4, 4, False, False, "tie"),
    (4, 4, 5, 3, True, False, "tie"),
    (4, 3, 1, 1, False, True, "onnxruntime"),  # one pixel per block: every beat ends a block
    (4, 2, 3, 1, True, True, "random"),        # one-pixel segments: blocks alternate each beat
    (2, 4, 2, 9, False, True, "tie"),
    (2, 2, 9, 2, True, False, "random"),
    (8, 4, 1, 13, False, False, "onnxruntime"),   # one row: no sums carried between rows
    (2, 3, 5, 5, True, True, "onnxruntime"),
])
def test_interleaved_blocks_match_numeric(lanes, blocks, h, w, in_signed, out_signed, kind):
    rng = np.random.default_rng(lanes * 1000 + blocks * 100 + h * 10 + w)
    c = lanes * blocks - int(rng.integers(0, lanes))        # the last block may be partial
    x, config, expected = interleaved_group(rng, lanes, c, h, w, in_signed, out_signed, kind)
    dut = GlobalAvgPool(lanes, max_height=16, max_width=16, max_blocks=4)
    run = run_streams(dut, {"i_stream": interleaved_beats_of(x, lanes)}, blocks, config=config,
                      rng=rng, stall=0.3)
    assert np.array_equal(tensor_of(run.beats, c, 1, 1, lanes, out_signed), expected)
    assert run.extra == 0
    y_lo, y_hi = qrange(out_signed)
    assert np.count_nonzero((expected > y_lo) & (expected < y_hi)) >= c // 2


@pytest.mark.parametrize("seed", range(16))
def test_interleaved_random_groups(seed):
    """Random sizes, block counts (1..4 on a 4-block instance), types, multipliers and
    stalls; two groups back to back, so the second starts from a used partial-sum memory."""
    rng = np.random.default_rng(700 + seed)
    lanes = int(rng.choice([2, 4, 8]))
    blocks = int(rng.integers(1, 5))
    h, w = (int(v) for v in rng.integers(1, 8, 2))
    c = lanes * blocks - int(rng.integers(0, lanes))
    in_signed, out_signed = (bool(v) for v in rng.integers(0, 2, 2))
    kind = rng.choice(["onnxruntime", "tie", "random"])
    x1, config, expected1 = interleaved_group(rng, lanes, c, h, w, in_signed, out_signed, kind)
    # Same configuration (zero points and multiplier), new pixels.
    lo, hi = qrange(in_signed)
    x2 = rng.integers(lo, hi + 1, x1.shape).astype(x1.dtype)
    expected2 = global_avg_pool_codes(x2, config["in_zp"],
                                      np.uint32(config["multiplier"]).view(np.float32),
                                      config["out_zp"], out_signed)
    dut = GlobalAvgPool(lanes, max_height=8, max_width=8, max_blocks=4)
    beats = interleaved_beats_of(x1, lanes) + interleaved_beats_of(x2, lanes)
    run = run_streams(dut, {"i_stream": beats}, 2 * blocks, config=config, rng=rng,
                      stall=float(rng.choice([0.0, 0.3, 0.7])))
    got = [tensor_of(run.beats[k * blocks:(k + 1) * blocks], c, 1, 1, lanes, out_signed)
           for k in range(2)]
    assert np.array_equal(got[0], expected1) and np.array_equal(got[1], expected2)
    assert run.extra == 0


def test_one_block_on_a_multi_block_instance():
    """``blocks = 1`` on an instance built for four: channel blocks back to back, as before,
    with one-pixel rows (the bank, not the memory, carries the sums)."""
    rng = np.random.default_rng(12)
    x, config, expected = interleaved_group(rng, 4, 16, 5, 1, True, True, "tie")
    config["blocks"] = 1
    dut = GlobalAvgPool(4, max_height=8, max_width=8, max_blocks=4)
    run = run_streams(dut, {"i_stream": beats_of(x, 4)}, 4, config=config, rng=rng)
    assert np.array_equal(tensor_of(run.beats, 16, 1, 1, 4, True), expected)


def test_interleaved_throughput_one_beat_per_cycle():
    """Three blocks of 4 × 16 pixels (last-row segments of lanes + the requantiser's
    latency + 2): no input wait."""
    rng = np.random.default_rng(13)
    lanes, h = 8, 4
    w = lanes + Requantizer.LATENCY + 2
    x, config, expected = interleaved_group(rng, lanes, 24, h, w, True, True, "onnxruntime")
    dut = GlobalAvgPool(lanes, max_height=8, max_width=16, max_blocks=3)
    run = run_streams(dut, {"i_stream": interleaved_beats_of(x, lanes)}, 3, config=config,
                      rng=rng, stall=0)
    assert np.array_equal(tensor_of(run.beats, 24, 1, 1, lanes, True), expected)
    assert run.cycles <= 3 * h * w + lanes + Requantizer.LATENCY + 1 + 2
