"""AvgPool (hw/avgpool.py) against sfnpu.numeric.qlinear_avg_pool, bit for bit.

The arithmetic units run on Verilator against numpy's float32 (which rounds every operation to
nearest even), hundreds of thousands of cases each: the divider (random significands, small
integer divisors, quotients a hair off a rounding midpoint), the window sum (random windows of
1–9 codes, random and power-of-two scales, significands 1.0 and 1.11…1) and the final
``rint(float32(q + y_zp))`` (half-integers and their neighbours). The whole block runs in
Amaranth's simulator with random stalls, on row-interleaved blocks (1–4 segments, order
(y, b, x)): every kernel/stride/padding combination, floor and ceil sizes, with and without
``count_include_pad``, int8 and uint8 in and out, scales from onnxruntime's range and powers of
two (ties); several groups run back to back with the configuration changed in the cycle after
the previous group's last transfer.
"""

import itertools

import numpy as np
import pytest
from amaranth.hdl import Module, Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from sfnpu.hw.avgpool import AvgPool, Float32Divider, QuantizeLane, SumLane, code_difference
from sfnpu.numeric import pool_output_size, qlinear_avg_pool, qrange
from sfnpu.tb.verilator import REPO_ROOT, VectorHarness
from stream_bench import interleaved_beats_of, interleaved_tensor_of

F32 = np.float32
BUILD = REPO_ROOT / "build" / "test_hw_avgpool"


def f32_bits(value) -> int:
    return int(np.asarray(value, dtype=np.float32).view(np.uint32))


def split_float(values):
    """Positive float32 values → (24-bit significand, exponent): value = sig · 2^exp."""
    mantissa, exponent = np.frexp(np.asarray(values, dtype=np.float64))
    return (mantissa * 2.0 ** 24).astype(np.int64), exponent.astype(np.int64) - 24


# -- the divider ---------------------------------------------------------------------------------

def divider_operands(rng, count):
    """Significand pairs: random, small-integer divisors (the window counts), equal and
    neighbouring operands, extremes, and quotients just off a rounding midpoint."""
    top = 2 ** 24 - 1
    a = rng.integers(2 ** 23, 2 ** 24, count)
    b = rng.integers(2 ** 23, 2 ** 24, count)
    kind = rng.integers(0, 6, count)
    small = rng.integers(1, 10, count)
    small_sig = small << (23 - np.floor(np.log2(small)).astype(np.int64))
    b = np.where(kind == 1, small_sig, b)
    a = np.where(kind == 2, b + rng.integers(-2, 3, count), a)
    a = np.where(kind == 3, rng.choice([2 ** 23, top, top - 1, 2 ** 23 + 1], count), a)
    b = np.where(kind == 3, rng.choice([2 ** 23, top, top - 1, 2 ** 23 + 1], count), b)
    # a ≈ b · (q + ½ ulp): the exact quotient lies within a few units of 2^-48 of a midpoint.
    q = rng.integers(2 ** 23, 2 ** 24, count)
    near = (b * (2 * q + 1)) // 2 ** 25 + rng.integers(-1, 2, count)
    near_ok = (near >= 2 ** 23) & (near < 2 ** 24)
    a = np.where((kind == 4) & near_ok, near, a)
    return np.clip(a, 2 ** 23, top), np.clip(b, 2 ** 23, top)


def divider_reference(a, b):
    quotient = (a * 2.0 ** -23).astype(F32) / (b * 2.0 ** -23).astype(F32)
    return split_float(quotient)


def run_divider(run, a, b, a_exp, b_exp, cycles):
    """Drive one division every ``cycles + 3`` cycles through ``run(vectors, flush)``."""
    period = cycles + 3
    n = a.size * period
    vectors = {name: np.zeros(n, np.int64) for name in
               ("i_valid", "a_sig", "a_exp", "b_sig", "b_exp", "tag", "o_ready")}
    starts = np.arange(a.size) * period
    vectors["i_valid"][starts] = 1
    for name, values in (("a_sig", a), ("b_sig", b), ("a_exp", a_exp), ("b_exp", b_exp),
                         ("tag", np.arange(a.size) & 1)):
        vectors[name][starts] = values
    vectors["o_ready"][:] = 1
    out = run(vectors, flush=period)
    valid = np.flatnonzero(out["o_valid"])
    assert valid.size == a.size, (valid.size, a.size)
    assert np.array_equal(valid, starts + cycles + 2)
    assert np.array_equal(out["q_tag"][valid], np.arange(a.size) & 1)
    return out["q_sig"][valid], out["q_exp"][valid]


def test_divider_rounds_like_float32_division_on_verilator():
    rng = np.random.default_rng(1)
    a, b = divider_operands(rng, 300_000)
    a_exp, b_exp = rng.integers(-60, 40, a.size), rng.integers(-60, 40, a.size)
    divider = Float32Divider(bits_per_cycle=2, tag_width=1)
    harness = VectorHarness(divider, "avgpool_divider", BUILD / "divider")
    q_sig, q_exp = run_divider(harness.run, a, b, a_exp, b_exp, divider.cycles)
    ref_sig, ref_exp = divider_reference(a, b)
    assert np.array_equal(q_sig, ref_sig), np.flatnonzero(q_sig != ref_sig)[:5]
    assert np.array_equal(q_exp, ref_exp + (a_exp + 23) - (b_exp + 23))
    # The near-midpoint operands make the sticky bit decide: both roundings occur.
    exact = a.astype(object) * 2 ** 25
    remainder_low = np.array([(x // int(y)) & 1 for x, y in zip(exact[:2000], b[:2000])])
    assert 0 < remainder_low.sum() < remainder_low.size


@pytest.mark.parametrize("bits_per_cycle", [1, 3])
def test_divider_other_radices(bits_per_cycle):
    """Amaranth's simulator, fewer operands: 1 and 3 quotient bits per cycle."""
    from sfnpu.tb.verilator import simulate_vectors
    rng = np.random.default_rng(2 + bits_per_cycle)
    a, b = divider_operands(rng, 150)
    exponents = np.zeros(a.size, np.int64) - 23
    divider = Float32Divider(bits_per_cycle=bits_per_cycle)
    q_sig, q_exp = run_divider(lambda v, flush: simulate_vectors(divider, v, flush), a, b,
                               exponents, exponents, divider.cycles)
    ref_sig, ref_exp = divider_reference(a, b)
    assert np.array_equal(q_sig, ref_sig) and np.array_equal(q_exp, ref_exp)


# -- the window sum -------------------------------------------------------------------------------

def scale_choices(rng, count):
    """float32 scales: onnxruntime-like, powers of two, significand 1.0 and 1.11…1."""
    kind = rng.integers(0, 4, count)
    random = np.exp2(rng.uniform(-12, 2, count)).astype(F32)
    power = np.exp2(rng.integers(-12, 3, count)).astype(F32)
    ones = (np.exp2(rng.integers(-12, 3, count)) * (2 - 2.0 ** -23)).astype(F32)
    return np.select([kind == 0, kind == 1, kind == 2], [random, power, ones],
                     (rng.integers(1, 2 ** 12, count) * np.exp2(rng.integers(-20, -8, count))
                      ).astype(F32))


class CodeDifference(wiring.Component):
    """:func:`code_difference` with its results registered, as the average pool has them."""
    code: In(8)
    in_signed: In(1)
    x_zp: In(9)
    magnitude: Out(9)
    negative: Out(1)

    def elaborate(self, platform):
        m = Module()
        magnitude, negative = code_difference(self.code, self.in_signed,
                                              self.x_zp.as_signed())
        m.d.sync += [self.magnitude.eq(magnitude), self.negative.eq(negative)]
        return m


def test_code_difference_for_every_code_and_zero_point():
    """|x − x_zp| and its sign for every code of int8 and uint8 against every zero point of
    the code's type."""
    vectors = {"code": [], "in_signed": [], "x_zp": []}
    want_d = []
    for signed in (0, 1):
        lo, hi = qrange(bool(signed))
        x, zp = np.meshgrid(np.arange(lo, hi + 1), np.arange(lo, hi + 1))
        vectors["code"].append(x.ravel() & 0xFF)
        vectors["in_signed"].append(np.full(x.size, signed))
        vectors["x_zp"].append(zp.ravel() & 0x1FF)
        want_d.append((x - zp).ravel())
    vectors = {name: np.concatenate(columns) for name, columns in vectors.items()}
    want_d = np.concatenate(want_d)
    out = VectorHarness(CodeDifference(), "avgpool_code_difference",
                        BUILD / "code_difference").run(vectors, flush=1)
    assert np.array_equal(out["magnitude"][1:], np.abs(want_d))
    assert np.array_equal(out["negative"][1:], (want_d < 0).astype(np.int64))


def test_window_sum_matches_float32_on_verilator():
    """Windows of 1–9 codes summed as v = float32(x − x_zp)·x_s, s = (0 + v₀) + v₁ + …"""
    rng = np.random.default_rng(3)
    windows = 60_000
    sizes = rng.integers(1, 10, windows)
    signed = rng.integers(0, 2, windows)
    zps = np.where(signed, rng.integers(-128, 128, windows), rng.integers(0, 256, windows))
    scales = scale_choices(rng, windows)
    period = 2 * 9 + 2 + SumLane.TO_B + SumLane.READ_OUT
    n = windows * period
    vectors = {name: np.zeros(n, np.int64) for name in
               ("d_magnitude", "d_negative", "x_significand", "x_exponent", "b_first",
                "c_valid")}
    sig, exp = split_float(scales)
    codes = []
    for k in range(windows):
        lo, hi = qrange(bool(signed[k]))
        # Codes far from the zero point on both sides, or all on one side (cancellation).
        window = rng.integers(lo, hi + 1, sizes[k])
        codes.append(window)
        base = k * period
        element_cycles = base + 2 * np.arange(sizes[k])
        d = window - zps[k]
        vectors["d_magnitude"][element_cycles] = np.abs(d)
        vectors["d_negative"][element_cycles] = d < 0
        vectors["b_first"][base + SumLane.TO_B] = 1
        vectors["c_valid"][element_cycles + SumLane.TO_B + 1] = 1
        span = slice(base, base + period)
        vectors["x_significand"][span] = sig[k]
        vectors["x_exponent"][span] = exp[k]
    harness = VectorHarness(SumLane(), "avgpool_sum_lane", BUILD / "sum_lane")
    out = harness.run(vectors)
    sample = np.arange(windows) * period + 2 * (sizes - 1) + SumLane.TO_B + 2 \
        + SumLane.READ_OUT
    expected = np.zeros(windows, F32)
    for k, window in enumerate(codes):
        s = F32(0)
        for code in window:
            s = F32(s + F32(F32(int(code) - int(zps[k])) * scales[k]))
        expected[k] = s
    got = np.where(out["negative"][sample], -1.0, 1.0) * np.ldexp(
        out["sig"][sample].astype(np.float64), out["exp"][sample])
    got = np.where(out["zero"][sample], 0.0, got)
    assert np.array_equal(got, expected.astype(np.float64)), \
        np.flatnonzero(got != expected)[:5]
    # The sums round: many differ from the exact sum of their elements.
    exact = np.array([np.sum((F32(w - zps[k]) * scales[k]).astype(np.float64))
                      for k, w in enumerate(codes[:2000])])
    assert np.count_nonzero(exact != expected[:2000]) > 200


# -- rint(float32(q + y_zp)) --------------------------------------------------------------------

class Registered(wiring.Component):
    """A combinational lane with its output registered (the vector harness needs a clock)."""

    def __init__(self, lane):
        self.lane = lane
        members = {}
        for name, member in lane.signature.members.items():
            members[name] = In(member.shape) if member.flow == wiring.In else Out(member.shape)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.lane = self.lane
        for name, member in self.lane.signature.members.items():
            if member.flow == wiring.In:
                m.d.comb += getattr(self.lane, name).eq(getattr(self, name))
            else:
                m.d.sync += getattr(self, name).eq(getattr(self.lane, name))
        return m


def test_final_rounding_on_verilator():
    rng = np.random.default_rng(4)
    count = 400_000
    out_signed = rng.integers(0, 2, count)
    y_lo = np.where(out_signed, -128, 0)
    y_zp = rng.integers(y_lo, y_lo + 256)
    kind = rng.integers(0, 5, count)
    # Half-integers around the output range, moved by 0–3 ulps; random values; tiny; huge.
    half = (rng.integers(-300, 300, count) + 0.5).astype(F32)
    ulps = rng.integers(-3, 4, count)
    nudged = half.copy()
    for step in range(1, 4):
        nudged = np.where(ulps >= step, np.nextafter(nudged, F32(np.inf)), nudged)
        nudged = np.where(ulps <= -step, np.nextafter(nudged, F32(-np.inf)), nudged)
    nudged = (nudged - y_zp.astype(F32)).astype(F32)    # q such that q + y_zp is near k + ½
    q = np.select([kind == 0, kind == 1, kind == 2, kind == 3],
                  [nudged, rng.uniform(-700, 700, count).astype(F32),
                   (rng.uniform(-1, 1, count) * np.exp2(rng.integers(-30, -1, count))).astype(F32),
                   (rng.uniform(-1, 1, count) * np.exp2(rng.integers(9, 40, count))).astype(F32)],
                  nudged)
    zero = q == 0
    magnitude = np.where(zero, F32(1), np.abs(q))
    sig, exp = split_float(magnitude)
    # The lane's stages and the wrapper's register.
    delay = QuantizeLane.LATENCY + 1
    vectors = {name: np.concatenate([values, np.zeros(delay, np.int64)]) for name, values in {
        "q_sig": sig, "q_exp": exp, "negative": (q < 0).astype(np.int64),
        "zero": zero.astype(np.int64), "y_zp": y_zp, "out_signed": out_signed}.items()}
    harness = VectorHarness(Registered(QuantizeLane()), "avgpool_quantize_lane",
                            BUILD / "quantize_lane")
    got = harness.run(vectors)["y"][delay:]
    t = (q + y_zp.astype(F32)).astype(F32)
    expected = np.clip(np.rint(t).astype(np.int64), y_lo, y_lo + 255) & 0xFF
    assert np.array_equal(got & 0xFF, expected), np.flatnonzero((got & 0xFF) != expected)[:5]
    ties = np.abs(t) % 1 == 0.5
    assert np.count_nonzero(ties & (np.abs(t) < 200)) > 10_000


# -- the whole block ----------------------------------------------------------------------------

def run_groups(dut, groups, rng, stall=0.3):
    """Stream ``groups`` (``(config, beats, expected_count)``) through ``dut`` in one
    simulation, each group's configuration set in the cycle after the previous group's last
    transfer; returns the output beats of every group."""
    outputs = [[] for _ in groups]
    state = {"group": -1, "sent": 0}
    total = sum(len(b) + 60 * e for _, b, e in groups) + 1000
    i_payload, o_payload = Value.cast(dut.i_stream.payload), Value.cast(dut.o_stream.payload)

    async def driver(ctx):
        for index, (_, beats, _) in enumerate(groups):
            while state["group"] < index:
                await ctx.tick()
            idles = rng.geometric(1 - stall, len(beats)) - 1 if stall else [0] * len(beats)
            for value, idle in zip(beats, idles):
                for _ in range(int(idle)):
                    await ctx.tick()
                ctx.set(dut.i_stream.valid, 1)
                ctx.set(i_payload, value)
                await ctx.tick().until(dut.i_stream.ready)
                ctx.set(dut.i_stream.valid, 0)
            state["sent"] = index + 1

    async def monitor(ctx):
        cycles = 0
        for index, (config, beats, expect) in enumerate(groups):
            for name, value in config.items():
                ctx.set(getattr(dut, name), value)
            state["group"] = index
            while len(outputs[index]) < expect or state["sent"] <= index:
                assert cycles < total, f"hang in group {index}: {len(outputs[index])} of " \
                                       f"{expect} beats, inputs sent: {state['sent'] > index}"
                ready = bool(rng.random() >= stall)
                ctx.set(dut.o_stream.ready, ready)
                _, _, valid, value = await ctx.tick().sample(dut.o_stream.valid, o_payload)
                cycles += 1
                if valid and ready:
                    outputs[index].append(value)
        ctx.set(dut.o_stream.ready, 1)
        for _ in range(100):                      # nothing more may come out
            _, _, valid = await ctx.tick().sample(dut.o_stream.valid)
            assert not valid, "output beyond the expected count"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(driver, background=True)
    sim.add_testbench(monitor)
    sim.run()
    return outputs


def random_scales(rng, ties):
    """(x_s, y_s): onnxruntime-like, or powers of two with x_s/y_s a small power of two (the
    averages often land on k + ½)."""
    if ties:
        e = int(rng.integers(-8, -2))
        return F32(2.0 ** e), F32(2.0 ** (e + int(rng.integers(-1, 2))))
    return F32(np.exp2(rng.uniform(-7, -2))), F32(np.exp2(rng.uniform(-7, -2)))


def make_group(rng, lanes, window, shape, blocks, ceil_mode, include_pad, in_signed,
               out_signed, ties):
    k, s, p = window
    h, w = shape
    c = lanes * blocks - int(rng.integers(0, lanes))       # the last block may be partial
    lo, hi = qrange(in_signed)
    x = rng.integers(lo, hi + 1, (c, h, w)).astype(np.int8 if in_signed else np.uint8)
    x_zp = int(rng.integers(lo, hi + 1))
    y_lo, y_hi = qrange(out_signed)
    y_zp = int(rng.integers(y_lo + 64, y_hi - 63))
    x_s, y_s = random_scales(rng, ties)
    oh = pool_output_size(h, k, s, p, p, ceil_mode)
    ow = pool_output_size(w, k, s, p, p, ceil_mode)
    assert not ((k, k) == (h, w) and p == 0), "onnxruntime's global-pool fallback"
    expected = qlinear_avg_pool(x, x_s, x_zp, y_s, y_zp, out_signed, k, s, p, include_pad,
                                ceil_mode, (oh, ow))
    config = {"enable": 1, "in_signed": int(in_signed), "out_signed": int(out_signed),
              "x_zp": x_zp, "y_zp": y_zp, "x_scale": f32_bits(x_s), "y_scale": f32_bits(y_s),
              "kernel": k, "stride": s, "pad": p, "count_include_pad": int(include_pad),
              "in_h": h, "in_w": w, "out_h": oh, "out_w": ow, "blocks": blocks}
    beats = interleaved_beats_of(x, lanes)
    return (config, beats, oh * blocks * ow), (c, oh, ow, out_signed, expected)


def check_groups(dut, lanes, made, rng, stall):
    outputs = run_groups(dut, [group for group, _ in made], rng, stall)
    for beats, (_, (c, oh, ow, out_signed, expected)) in zip(outputs, made):
        got = interleaved_tensor_of(beats, c, oh, ow, lanes, out_signed)
        assert np.array_equal(got, expected), np.argwhere(got != expected)[:5]
    return outputs


WINDOWS = [(k, s, p) for k in (2, 3) for s in (1, 2) for p in range(k)]
SHAPES = [(3, 5), (5, 4), (4, 7), (6, 3), (1, 6), (5, 1), (2, 2), (7, 6)]


def window_groups(window, rng, lanes):
    """For one window: floor and (where it differs) ceil sizes, with and without
    count_include_pad, both input and output types, block counts 1..4, odd shapes."""
    k, s, p = window
    made = []
    for index, (ceil_mode, include_pad, in_signed) in enumerate(
            itertools.product((False, True), (False, True), (True, False))):
        for attempt in range(len(SHAPES)):
            h, w = SHAPES[(index * 3 + attempt + k + s + p) % len(SHAPES)]
            oh = pool_output_size(h, k, s, p, p, ceil_mode)
            ow = pool_output_size(w, k, s, p, p, ceil_mode)
            floor = (pool_output_size(h, k, s, p, p), pool_output_size(w, k, s, p, p))
            if min(oh, ow) < 1 or ((k, k) == (h, w) and p == 0):
                continue
            if ceil_mode and (oh, ow) == floor:
                continue
            break
        else:
            continue
        blocks = 1 + index % 4
        made.append(make_group(rng, lanes, window, (h, w), blocks, ceil_mode, include_pad,
                               in_signed, bool(index % 3), ties=index % 2 == 0))
    return made


@pytest.mark.parametrize("window", WINDOWS, ids=[f"k{k}s{s}p{p}" for k, s, p in WINDOWS])
def test_avg_pool_matches_numeric(window):
    rng = np.random.default_rng(sum(window) * 31 + window[0])
    dut = AvgPool(2, max_width=8, max_height=8, max_blocks=4)
    made = window_groups(window, rng, 2)
    k, s, p = window
    has_ceil = s == 2 and p < k - 1
    assert len(made) == (8 if has_ceil else 4)
    check_groups(dut, 2, made, rng, stall=0.3)


def order_sensitive_group(rng, k, lanes):
    """A k × (k+1) map whose first channel's window sums to different float32 values row by
    row (onnxruntime's order) and column by column, with y_s chosen so that the two sums give
    different output codes."""
    x_s = F32((2 - 2.0 ** -23) * 2.0 ** -6)             # a full significand: sums round

    def sequential(values):
        total = F32(0)
        for value in values:
            total = F32(total + value)
        return total

    while True:
        x = rng.integers(0, 256, (lanes, k, k + 1)).astype(np.uint8)
        x_zp = int(rng.integers(0, 256))
        v = (F32(1) * (x[0, :, :k].astype(np.int64) - x_zp)).astype(F32) * x_s
        n = F32(k * k)
        by_rows = F32(sequential(v.ravel()) / n)
        by_columns = F32(sequential(v.T.ravel()) / n)
        if by_rows == by_columns:
            continue
        y_s = F32(abs(by_rows / F32(int(rng.integers(-100, 100)) + 0.5)))
        for _ in range(120):                           # walk y_s until the codes differ
            if np.rint(F32(by_rows / y_s)) != np.rint(F32(by_columns / y_s)):
                config = {"enable": 1, "in_signed": 0, "out_signed": 1, "x_zp": x_zp, "y_zp": 0,
                          "x_scale": f32_bits(x_s), "y_scale": f32_bits(y_s), "kernel": k,
                          "stride": 2, "pad": 0, "count_include_pad": 0, "in_h": k,
                          "in_w": k + 1, "out_h": 1, "out_w": 1, "blocks": 1}
                expected = qlinear_avg_pool(x, x_s, x_zp, y_s, 0, True, k, 2, 0)
                return (config, interleaved_beats_of(x, lanes), 1), (lanes, 1, 1, True, expected)
            y_s = np.nextafter(y_s, F32(np.inf))


def test_window_elements_are_summed_row_by_row():
    """Windows where summing column by column would give another code (float addition is not
    associative): the block must add in onnxruntime's order."""
    rng = np.random.default_rng(11)
    dut = AvgPool(2, max_width=4, max_height=4)
    made = [order_sensitive_group(rng, k, 2) for k in (2, 3) for _ in range(4)]
    check_groups(dut, 2, made, rng, stall=0.3)


def test_kernel_one_and_many_lanes():
    """Eight lanes, 1×1 windows (n = 1: only the scales' roundings) and 3×3 windows with ties,
    one divider bit per cycle."""
    rng = np.random.default_rng(7)
    dut = AvgPool(8, max_width=8, max_height=8, max_blocks=2, divider_bits=1)
    made = [make_group(rng, 8, (1, 1, 0), (3, 4), 2, False, False, True, True, ties=False),
            make_group(rng, 8, (1, 2, 0), (5, 5), 1, False, True, False, False, ties=True),
            make_group(rng, 8, (3, 2, 1), (5, 6), 2, True, False, False, True, ties=True)]
    check_groups(dut, 8, made, rng, stall=0.2)


def test_throughput_2x2_stride_2():
    """2×2 windows, two quotient bits per cycle, no stalls: the divisions (13 iterations, one
    rounding cycle, one hand-over) set the pace, 15 cycles per output pixel, plus the input
    rows that wait for a line buffer (one of the two per output row): about 17."""
    rng = np.random.default_rng(8)
    dut = AvgPool(2, max_width=16, max_height=8, max_blocks=2)
    (config, beats, expect), _ = make_group(rng, 2, (2, 2, 0), (8, 16), 2, False, False, True,
                                            True, ties=False)
    result = {}

    async def bench(ctx):
        for name, value in config.items():
            ctx.set(getattr(dut, name), value)
        ctx.set(dut.o_stream.ready, 1)
        i_payload = Value.cast(dut.i_stream.payload)
        received, sent, cycle = 0, 0, 0
        while received < expect:
            ctx.set(dut.i_stream.valid, sent < len(beats))
            if sent < len(beats):
                ctx.set(i_payload, beats[sent])
            _, _, ready, valid = await ctx.tick().sample(dut.i_stream.ready, dut.o_stream.valid)
            cycle += 1
            sent += int(ready and sent < len(beats))
            received += int(valid)
        result["cycles"] = cycle

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert 15 <= result["cycles"] / expect <= 17.5, result["cycles"] / expect


def test_bypass_passes_beats_unchanged():
    rng = np.random.default_rng(9)
    dut = AvgPool(4, max_width=8, max_height=8)
    x = rng.integers(-128, 128, (8, 3, 5)).astype(np.int8)
    beats = interleaved_beats_of(x, 4)
    outputs = run_groups(dut, [({"enable": 0}, beats, len(beats))], rng)
    assert outputs[0] == beats
