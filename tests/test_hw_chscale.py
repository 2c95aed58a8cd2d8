"""ChannelScale (hw/chscale.py) against sfnpu.numeric.qlinear_mul_codes, bit for bit.

One lane (:class:`ChannelScaleLane`) on Verilator sees all 65 536 pairs of codes ``(a, b)`` for
each of a few hundred configurations: zero points and signednesses, and multipliers chosen so
that both float32 roundings and the final rounding meet ties (powers of two, odd fractions,
multipliers one or two ulps off a power of two — the ``k.49999997 + y_zp`` double-rounding
case), onnxruntime's multipliers from random scales, and the edges (zero, subnormal, negative,
±infinity, NaN, products at 2³¹ where ``cvtps_epi32`` wraps to INT32_MIN). The stream wrapper
runs in Amaranth's simulator with random stalls on all three streams, on channel blocks back to
back and row-interleaved (order (y, b, x), one scale beat per block per group, groups back to
back). A lane that rounds half up must fail.
"""

import numpy as np
import pytest

from sfnpu.hw.chscale import ChannelScale, ChannelScaleLane
from sfnpu.hw.shared_product import OwnProducts
from sfnpu.numeric import qlinear_mul_codes, qlinear_mul_multiplier, qrange
from sfnpu.tb.verilator import REPO_ROOT, VectorHarness, simulate_vectors
from stream_bench import (beats_of, interleaved_beats_of, interleaved_tensor_of, run_streams,
                          tensor_of)

LATENCY = ChannelScaleLane.LATENCY
F32 = np.float32


def codes(signed: bool) -> np.ndarray:
    lo, hi = qrange(signed)
    return np.arange(lo, hi + 1)


def f32_bits(m) -> int:
    return int(np.asarray(m, dtype=np.float32).view(np.uint32))


def reference(a, a_zp, b, b_zp, m, y_zp, out_signed) -> np.ndarray:
    with np.errstate(all="ignore"):           # infinite / NaN multipliers are legal inputs
        return qlinear_mul_codes(a, a_zp, b, b_zp, F32(m), y_zp, out_signed)


# -- configurations -----------------------------------------------------------------------------

def multiplier_classes(rng):
    """name → list of float32 multipliers."""
    def ulps(m, steps):
        m = F32(m)
        for _ in range(abs(steps)):
            m = np.nextafter(m, F32(np.inf if steps > 0 else -np.inf))
        return m
    powers = [F32(2.0 ** -k) for k in range(0, 17)]
    near_powers = [ulps(F32(2.0 ** -k), s) for k in range(1, 17) for s in (-2, -1, 1, 2)]
    odd_fractions = [F32((2 * rng.integers(0, 64) + 1) / 2.0 ** rng.integers(3, 18))
                     for _ in range(24)]
    onnxruntime = [qlinear_mul_multiplier(*np.exp2(rng.uniform(-9, -1, 3)).astype(np.float32))
                   for _ in range(48)]
    random = [F32(np.exp2(rng.uniform(-17, 2))) for _ in range(24)]
    # p·m near 2^31 (the int32 edge of cvtps) and near the saturation exponent 2^10.
    p = rng.integers(1000, 65025, 6)
    int32_edge = [ulps(F32(2.0 ** 31 / pp), s) for pp in p for s in (-1, 0, 1)]
    saturation_edge = [F32(2.0 ** 10 / pp) for pp in p]
    special = [F32(0.0), F32(-0.0), F32(1e-40), F32(1.2e-38), F32(np.inf), F32(-np.inf),
               F32(np.nan), F32(1e30), F32(3.4e38), F32(70000.0)]
    negative = [-m for m in onnxruntime[:8] + powers[4:10:2] + near_powers[:8:3]]
    return {
        "power of two": powers, "1-2 ulps off a power of two": near_powers,
        "odd fraction": odd_fractions, "onnxruntime": onnxruntime, "random": random,
        "int32 edge": int32_edge, "saturation edge": saturation_edge, "special": special,
        "negative": negative,
    }


def configurations(rng):
    """(class, a_signed, a_zp, b_signed, b_zp, m, y_zp, out_signed) for every multiplier."""
    for name, multipliers in multiplier_classes(rng).items():
        for m in multipliers:
            a_signed, b_signed, out_signed = (bool(v) for v in rng.integers(0, 2, 3))
            a_zp = int(rng.choice(codes(a_signed)))
            b_zp = int(rng.choice(codes(b_signed)))
            y_lo, y_hi = qrange(out_signed)
            # Zero points at the ends too: y_zp ≥ 64 matters at the int32 edge.
            y_zp = int(rng.choice([y_lo, y_hi, rng.integers(y_lo, y_hi + 1)]))
            if name == "int32 edge":
                y_zp = int(rng.integers(40, 128))
            yield name, a_signed, a_zp, b_signed, b_zp, m, y_zp, out_signed


def lane_vectors(config) -> tuple[dict, np.ndarray]:
    """All 65 536 code pairs of one configuration, plus LATENCY idle cycles so the next
    configuration meets an empty pipeline."""
    _, a_signed, a_zp, b_signed, b_zp, m, y_zp, out_signed = config
    a, b = np.meshgrid(codes(a_signed), codes(b_signed), indexing="ij")
    a, b = a.ravel(), b.ravel()
    n = a.size + LATENCY
    pad = lambda v: np.concatenate([v, np.zeros(LATENCY, np.int64)])
    vectors = {
        "a": pad(a & 0xFF), "b": pad(b & 0xFF), "valid": pad(np.ones(a.size, np.int64)),
        "a_signed": np.full(n, a_signed), "a_zp": np.full(n, a_zp),
        "b_signed": np.full(n, b_signed), "b_zp": np.full(n, b_zp),
        "multiplier": np.full(n, f32_bits(m)), "y_zp": np.full(n, y_zp),
        "out_signed": np.full(n, out_signed),
    }
    return vectors, pad(reference(a, a_zp, b, b_zp, m, y_zp, out_signed))


def concat(parts):
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def tie_statistics(config):
    """(exact ties of t, results where rounding after adding y_zp differs from rounding
    float32(p·m) and adding y_zp afterwards) over all code pairs."""
    _, a_signed, a_zp, b_signed, b_zp, m, y_zp, _ = config
    a, b = np.meshgrid(codes(a_signed), codes(b_signed), indexing="ij")
    p = ((a - a_zp) * (b - b_zp)).astype(np.float32)
    with np.errstate(all="ignore"):
        t1 = p * F32(m)
        t = t1 + F32(y_zp)
        finite = np.isfinite(t) & (np.abs(t) < 1024)
        ties = np.count_nonzero(finite & (np.abs(t) % 1 == 0.5))
        late_zp = np.count_nonzero(finite & (np.rint(t) != np.rint(t1) + y_zp))
    return ties, late_zp


# -- Verilator: every code pair, hundreds of configurations -----------------------------------

def test_every_code_pair_on_verilator():
    rng = np.random.default_rng(20240611)
    configs = list(configurations(rng))
    parts, expected = zip(*(lane_vectors(c) for c in configs))
    vectors = concat(parts)
    expected = np.concatenate(expected)
    assert len(configs) > 200 and vectors["a"].size > 14_000_000

    harness = VectorHarness(OwnProducts(ChannelScaleLane()), "channel_scale_lane",
                            REPO_ROOT / "build" / "test_hw_chscale")
    outputs = harness.run(vectors, flush=LATENCY)
    got = outputs["y"][LATENCY:LATENCY + expected.size]
    valid = vectors["valid"].astype(bool)
    assert np.array_equal(outputs["y_valid"][LATENCY:LATENCY + expected.size], vectors["valid"])

    failures = {}
    offset = 0
    for config, part in zip(configs, parts):
        n = part["a"].size
        chosen = slice(offset, offset + n)
        wrong = np.count_nonzero((got[chosen] != expected[chosen]) & valid[chosen])
        if wrong:
            failures[config] = wrong
        offset += n
    assert not failures, list(failures.items())[:5]

    # The configurations discriminate: many exact ties of t, and many results where adding the
    # zero point after rounding (the obvious shortcut) would be wrong.
    stats = np.array([tie_statistics(c) for c in configs])
    assert stats[:, 0].sum() > 100_000 and stats[:, 1].sum() > 1_000
    names = [c[0] for c in configs]
    late = {name: stats[[i for i, n in enumerate(names) if n == name], 1].sum()
            for name in set(names)}
    assert late["1-2 ulps off a power of two"] > 100
    # Millions of outputs are not clamped, so the roundings are visible.
    out_signed = np.concatenate([np.full(p["a"].size, c[7]) for c, p in zip(configs, parts)])
    lo, hi = np.where(out_signed, -128, 0), np.where(out_signed, 127, 255)
    assert np.count_nonzero(valid & (expected > lo) & (expected < hi)) > 3_000_000


# -- Amaranth simulator: the rounding mutant ---------------------------------------------------

class LaneRoundingHalfUp(ChannelScaleLane):
    """Every rounding step ties away from zero: must be caught."""

    @staticmethod
    def round_half_even(value, drop):
        return value[drop:] + value[drop - 1]


def test_rounding_half_up_is_caught():
    """m = ½: every odd product is a tie k + ½ (a: 0..15 against every b)."""
    config = ("power of two", False, 0, True, 0, F32(0.5), 0, True)
    vectors, expected = lane_vectors(config)
    n = 16 * 256
    idle = np.zeros(LATENCY, np.int64)
    vectors = {k: np.concatenate([v[:n], idle]) if k in ("a", "b", "valid") else v[:n + LATENCY]
               for k, v in vectors.items()}
    results = [simulate_vectors(lane, vectors, flush=LATENCY)["y"][LATENCY:LATENCY + n]
               for lane in (OwnProducts(ChannelScaleLane()), OwnProducts(LaneRoundingHalfUp()))]
    assert np.array_equal(results[0], expected[:n])
    assert np.count_nonzero(results[1] != expected[:n]) > 150     # the in-range ties, k even


# -- Amaranth simulator: the stream wrapper with back-pressure ---------------------------------

@pytest.mark.parametrize("lanes, c, h, w, seed", [
    (8, 24, 5, 7, 1), (8, 16, 1, 1, 2), (4, 10, 3, 4, 3), (4, 8, 9, 2, 4), (2, 3, 2, 5, 5),
])
def test_channel_scale_stream_matches_numeric(lanes, c, h, w, seed):
    rng = np.random.default_rng(seed)
    a_signed, b_signed, out_signed = (bool(v) for v in rng.integers(0, 2, 3))
    a_zp, b_zp = int(rng.choice(codes(a_signed))), int(rng.choice(codes(b_signed)))
    y_zp = int(rng.choice(codes(out_signed)))
    m = qlinear_mul_multiplier(*np.exp2(rng.uniform(-8, -2, 3)).astype(np.float32))
    x = rng.choice(codes(a_signed), (c, h, w)).astype(np.int8 if a_signed else np.uint8)
    scale = rng.choice(codes(b_signed), (c, 1, 1)).astype(np.int8 if b_signed else np.uint8)
    dut = ChannelScale(lanes, max_height=16, max_width=16)
    config = {"enable": 1, "in_h": h, "in_w": w, "a_signed": int(a_signed), "a_zp": a_zp,
              "b_signed": int(b_signed), "b_zp": b_zp, "multiplier": f32_bits(m),
              "y_zp": y_zp, "out_signed": int(out_signed)}
    beats = beats_of(x, lanes)
    run = run_streams(dut, {"i_stream": beats, "s_stream": beats_of(scale, lanes)}, len(beats),
                      config=config, rng=rng, stall=0.4)
    got = tensor_of(run.beats, c, h, w, lanes, out_signed)
    expected = reference(x, a_zp, scale, b_zp, m, y_zp, out_signed)
    assert np.array_equal(got, expected), np.argwhere(got != expected)[:5]
    assert run.extra == 0


def test_channel_scale_throughput_and_bypass():
    rng = np.random.default_rng(6)
    dut = ChannelScale(8, max_height=8, max_width=8)
    x = rng.integers(0, 256, (16, 8, 8)).astype(np.uint8)
    scale = rng.integers(0, 256, (16, 1, 1)).astype(np.uint8)
    config = {"enable": 1, "in_h": 8, "in_w": 8, "a_signed": 0, "a_zp": 3, "b_signed": 0,
              "b_zp": 0, "multiplier": f32_bits(1 / 256), "y_zp": 0, "out_signed": 0}
    beats = beats_of(x, 8)
    run = run_streams(dut, {"i_stream": beats, "s_stream": beats_of(scale, 8)}, len(beats),
                      config=config, rng=rng, stall=0)
    assert run.cycles <= len(beats) + LATENCY + 1
    assert np.array_equal(tensor_of(run.beats, 16, 8, 8, 8, False),
                          reference(x, 3, scale, 0, 1 / 256, 0, False))
    run = run_streams(dut, {"i_stream": beats}, len(beats), config={"enable": 0}, rng=rng)
    assert run.beats == beats and run.extra == 0


@pytest.mark.parametrize("lanes, blocks, h, w, stall", [
    (8, 2, 3, 5, 0.4), (4, 3, 2, 1, 0.6), (2, 1, 4, 4, 0.0), (4, 4, 1, 3, 0.3),
])
def test_product_of_two_maps_per_pixel(lanes, blocks, h, w, stall):
    """``per_pixel`` (Eltwise.MUL): the other factor is a map of the same shape, one beat with
    each pixel, in the same (row-interleaved) order; random stalls on all three streams."""
    rng = np.random.default_rng(lanes * 100 + blocks * 10 + h)
    c = lanes * blocks - int(rng.integers(0, lanes))
    x, _, config, _ = scale_group(rng, lanes, c, h, w, True, False, True)
    other = rng.choice(codes(False), (c, h, w)).astype(np.uint8)
    m = np.uint32(config["multiplier"]).view(np.float32)
    dut = ChannelScale(lanes, max_height=8, max_width=16, max_blocks=4)
    beats = interleaved_beats_of(x, lanes)
    run = run_streams(dut, {"i_stream": beats, "s_stream": interleaved_beats_of(other, lanes)},
                      len(beats), config=dict(config, per_pixel=1), rng=rng, stall=stall)
    got = interleaved_tensor_of(run.beats, c, h, w, lanes, True)
    expected = reference(x, config["a_zp"], other, config["b_zp"], m, config["y_zp"], True)
    assert np.array_equal(got, expected), np.argwhere(got != expected)[:5]
    assert run.extra == 0
    if not stall:
        assert run.cycles <= len(beats) + LATENCY + 1        # a pixel per cycle


# -- row-interleaved channel blocks: rows of `blocks` segments, order (y, b, x) -------------------

def scale_group(rng, lanes, c, h, w, a_signed, b_signed, out_signed):
    """A random group: feature map, scale vector, configuration and expected output."""
    a_zp, b_zp = int(rng.choice(codes(a_signed))), int(rng.choice(codes(b_signed)))
    y_zp = int(rng.choice(codes(out_signed)))
    m = qlinear_mul_multiplier(*np.exp2(rng.uniform(-8, -2, 3)).astype(np.float32))
    x = rng.choice(codes(a_signed), (c, h, w)).astype(np.int8 if a_signed else np.uint8)
    scale = rng.choice(codes(b_signed), (c, 1, 1)).astype(np.int8 if b_signed else np.uint8)
    config = {"enable": 1, "in_h": h, "in_w": w, "blocks": -(-c // lanes),
              "a_signed": int(a_signed), "a_zp": a_zp, "b_signed": int(b_signed), "b_zp": b_zp,
              "multiplier": f32_bits(m), "y_zp": y_zp, "out_signed": int(out_signed)}
    return x, scale, config, reference(x, a_zp, scale, b_zp, m, y_zp, out_signed)


@pytest.mark.parametrize("lanes, blocks, h, w, a_signed, b_signed, out_signed, stall", [
    (8, 3, 5, 7, True, True, True, 0.4),
    (8, 2, 1, 1, False, False, False, 0.4),     # one pixel per block
    (4, 4, 3, 1, True, False, True, 0.4),       # one-pixel segments: a new block every beat
    (4, 3, 1, 6, False, True, False, 0.6),      # one row: every scale used at once
    (2, 4, 4, 3, True, True, False, 0.3),
    (2, 2, 7, 5, False, False, True, 0.7),
    (8, 4, 2, 9, True, False, False, 0.0),
])
def test_interleaved_blocks_match_numeric(lanes, blocks, h, w, a_signed, b_signed, out_signed,
                                          stall):
    rng = np.random.default_rng(lanes * 1000 + blocks * 100 + h * 10 + w)
    c = lanes * blocks - int(rng.integers(0, lanes))        # the last block may be partial
    x, scale, config, expected = scale_group(rng, lanes, c, h, w, a_signed, b_signed,
                                             out_signed)
    dut = ChannelScale(lanes, max_height=8, max_width=16, max_blocks=4)
    beats = interleaved_beats_of(x, lanes)
    run = run_streams(dut, {"i_stream": beats, "s_stream": beats_of(scale, lanes)}, len(beats),
                      config=config, rng=rng, stall=stall)
    got = interleaved_tensor_of(run.beats, c, h, w, lanes, out_signed)
    assert np.array_equal(got, expected), np.argwhere(got != expected)[:5]
    assert run.extra == 0


@pytest.mark.parametrize("seed", range(8))
def test_interleaved_groups_back_to_back(seed):
    """Two groups (1..4 blocks on a 4-block instance) in one run: the second group's scale
    beats are offered early and must not replace the first group's before its last pixel."""
    rng = np.random.default_rng(900 + seed)
    lanes = int(rng.choice([2, 4, 8]))
    blocks = int(rng.integers(1, 5))
    h, w = (int(v) for v in rng.integers(1, 6, 2))
    c = lanes * blocks - int(rng.integers(0, lanes))
    a_signed, b_signed, out_signed = (bool(v) for v in rng.integers(0, 2, 3))
    x1, scale1, config, expected1 = scale_group(rng, lanes, c, h, w, a_signed, b_signed,
                                                out_signed)
    x2 = rng.choice(codes(a_signed), x1.shape).astype(x1.dtype)
    scale2 = rng.choice(codes(b_signed), scale1.shape).astype(scale1.dtype)
    expected2 = reference(x2, config["a_zp"], scale2, config["b_zp"],
                          np.uint32(config["multiplier"]).view(np.float32), config["y_zp"],
                          out_signed)
    dut = ChannelScale(lanes, max_height=8, max_width=8, max_blocks=4)
    beats = interleaved_beats_of(x1, lanes) + interleaved_beats_of(x2, lanes)
    scales = beats_of(scale1, lanes) + beats_of(scale2, lanes)
    run = run_streams(dut, {"i_stream": beats, "s_stream": scales}, len(beats), config=config,
                      rng=rng, stall=float(rng.choice([0.0, 0.3, 0.7])))
    half = len(beats) // 2
    for part, expected in ((run.beats[:half], expected1), (run.beats[half:], expected2)):
        assert np.array_equal(interleaved_tensor_of(part, c, h, w, lanes, out_signed),
                              expected)
    assert run.extra == 0


def test_interleaved_throughput():
    """Four blocks: one beat per cycle when both streams are offered from the start."""
    rng = np.random.default_rng(7)
    x, scale, config, expected = scale_group(rng, 8, 32, 4, 6, False, True, True)
    dut = ChannelScale(8, max_height=8, max_width=8, max_blocks=4)
    beats = interleaved_beats_of(x, 8)
    run = run_streams(dut, {"i_stream": beats, "s_stream": beats_of(scale, 8)}, len(beats),
                      config=config, rng=rng, stall=0)
    assert run.cycles <= len(beats) + LATENCY + 1
    assert np.array_equal(interleaved_tensor_of(run.beats, 32, 4, 6, 8, True), expected)
