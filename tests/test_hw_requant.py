"""Requantizer (hw/requant.py) against sfnpu.numeric.requantize, bit for bit.

Verilator streams millions of random accumulator/multiplier pairs plus engineered vectors for
every rounding-tie class (listed in :func:`vector_classes`); Amaranth's simulator runs a few
exhaustive small sweeps. A variant rounding half up must fail them.
"""

import numpy as np
import pytest

from sfnpu.hw.requant import Requantizer
from sfnpu.numeric import requantize
from sfnpu.tb.verilator import REPO_ROOT, VectorHarness, simulate_vectors

LATENCY = Requantizer.LATENCY
K = Requantizer().saturation_exponent          # |product| ≥ 2^K always clamps
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1

#: (zero_point, lo, hi). Index 0 is the widest window, where every rounding is visible.
CONFIGS = [
    (0, -256, 255),                                         # 9-bit extremes
    (0, -128, 127), (-128, -128, 127), (127, -128, 127), (-5, -128, 127),   # int8
    (0, 0, 255), (128, 0, 255), (255, 0, 255), (37, 0, 255),               # uint8
    (-20, -20, 127), (0, 0, 6),                             # Relu / Relu6 absorbed in the clamp
    (-256, -256, 255), (255, -256, 255),
    (3, 10, -10),                                           # lo > hi: numpy.clip gives hi
]


def f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def pow2_f32(exponents) -> np.ndarray:
    """Exact float32 powers of two (normal range)."""
    return np.ldexp(np.float32(1), np.asarray(exponents)).astype(np.float32)


def in_range_multipliers(rng, acc, low=-2.0, high=K + 1.0) -> np.ndarray:
    """Multipliers (random significands) that put |float32(acc)·m| log-uniformly in
    [2^low, 2^high), around the interesting part of the clamp window."""
    target = np.exp2(rng.uniform(low, high, acc.size))
    return f32(target / np.maximum(np.abs(acc.astype(np.float64)), 1.0))


def random_sign(rng, n) -> np.ndarray:
    return rng.choice(np.array([-1, 1]), n)


def log_uniform_acc(rng, n, low_bits=0.0, high_bits=31.0) -> np.ndarray:
    magnitude = np.floor(np.exp2(rng.uniform(low_bits, high_bits, n))).astype(np.int64)
    return np.clip(magnitude * random_sign(rng, n), INT32_MIN, INT32_MAX)


def exact_product(acc, m) -> np.ndarray:
    """float32(acc)·m without rounding: 24-bit × 24-bit significands fit float64's 53 bits."""
    return acc.astype(np.float32).astype(np.float64) * m.astype(np.float64)


def float32_product(acc, m) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return acc.astype(np.float32) * m


# -- engineered vector classes ------------------------------------------------------------------

def exact_ties(rng, n):
    """float32(acc)·m is exactly ±(k + ½): m = M·2^−q (M odd), acc = c·2^(q−1) (c odd),
    k = (c·M − 1)/2 mostly below 320 (inside the clamp window)."""
    M = 2 * rng.integers(0, 321, 4 * n) + 1
    q = rng.integers(1, 32, 4 * n)
    c = 2 * np.floor(rng.uniform(0, np.maximum(641 // M, 1) / 2 + 0.5)).astype(np.int64) + 1
    acc = c << (q - 1)
    keep = acc <= INT32_MAX
    acc, M, q = acc[keep][:n], M[keep][:n], q[keep][:n]
    acc = acc * random_sign(rng, acc.size)
    m = f32(np.ldexp(M.astype(np.float64), -q) * random_sign(rng, acc.size))
    p = float32_product(acc, m)
    assert np.all(np.abs(p) % 1 == 0.5) and np.array_equal(p, exact_product(acc, m))
    return acc, m


def rounded_ties(rng, n):
    """The float32 product is a tie ±(k + ½) but the exact product is not (double rounding):
    a single rounding of the exact product would go the other way half of the time."""
    acc = log_uniform_acc(rng, 6 * n, 10, 31)
    target = rng.integers(0, 300, acc.size) + 0.5
    m = f32(target / np.abs(acc.astype(np.float32).astype(np.float64)))
    p, exact = float32_product(acc, m), exact_product(acc, m)
    keep = (np.abs(p) == target) & (exact != p)
    return acc[keep][:n], m[keep][:n]


def near_ties(rng, n):
    """Multipliers one or two ulps away from a rounded tie."""
    acc, m = rounded_ties(rng, n)
    steps = rng.choice(np.array([-2, -1, 1, 2]), acc.size)
    direction = np.where(steps > 0, np.inf, -np.inf).astype(np.float32)
    once = np.nextafter(m, direction)
    m = np.where(np.abs(steps) == 1, once, np.nextafter(once, direction))
    return acc, f32(m)


def int_to_float_ties(rng, n):
    """|acc| in 2^24..2^31 exactly halfway between two float32 values, with m a power of two
    that turns float32(acc) into k + ½: rounding the conversion the wrong way moves the
    result off the tie. Both significand parities (the tie goes down or up), both signs."""
    k = rng.integers(0, 1 << K - 1, n)
    odd = 2 * k + 1
    bits = np.floor(np.log2(odd)).astype(np.int64) + 1
    shift_t = 24 - bits                              # A = odd·2^shift_t ∈ [2^23, 2^24)
    A = odd << shift_t
    s = rng.integers(1, 8, n)                        # dropped bits: |acc| ∈ [2^24, 2^31)
    below = (rng.random(n) < 0.5) & (odd > 1)       # A−1 (odd) ties up to A
    A = np.where(below, A - 1, A)
    acc = ((A << s) + (1 << (s - 1))) * random_sign(rng, n)
    m = pow2_f32(-(s + shift_t + 1))
    p = float32_product(acc, m)
    assert np.all(np.abs(p) % 1 == 0.5)
    return acc, m


def int_to_float_random_ties(rng, n):
    """Conversion ties (and their ±1 neighbours) with random multipliers."""
    A = rng.integers(1 << 23, 1 << 24, n)
    s = rng.integers(1, 8, n)
    offset = rng.choice(np.array([-1, 0, 0, 0, 1]), n)
    acc = ((A << s) + (1 << (s - 1)) + offset) * random_sign(rng, n)
    return acc, in_range_multipliers(rng, acc)


def int32_extremes(rng, n):
    """Accumulators at and next to ±2^31, where int → float rounds up to 2^31."""
    base = np.array([INT32_MAX, INT32_MAX - 63, INT32_MAX - 64, INT32_MAX - 65, INT32_MAX - 127,
                     INT32_MAX - 128, INT32_MAX - 191, INT32_MIN, INT32_MIN + 64, INT32_MIN + 1,
                     INT32_MIN + 191, (1 << 30) + 32, (1 << 30) + 64, (1 << 30) + 96,
                     1 << 24, (1 << 24) + 1, (1 << 24) + 3, -(1 << 24) - 1, (1 << 24) - 1])
    acc = rng.choice(base, n)
    exact = rng.random(n) < 0.5                      # m = k/2^31-ish powers hit ties too
    m = np.where(exact, pow2_f32(-rng.integers(23, 34, n)), in_range_multipliers(rng, acc))
    return acc, f32(m)


def all_ones_multipliers(rng, n):
    """Multiplier significand all ones (1.11…1 × 2^e) and exactly one (powers of two)."""
    e = rng.integers(-40, 9, n)
    ones = rng.random(n) < 0.5
    significand = np.where(ones, (1 << 24) - 1, 1 << 23).astype(np.float64)
    m = f32(np.ldexp(significand, e - 23))
    target = np.exp2(rng.uniform(-2, K + 1, n))
    acc = np.clip(np.round(target / m.astype(np.float64)), 0, INT32_MAX).astype(np.int64)
    return acc * random_sign(rng, n), m


def product_carries(rng, n):
    """Significand products just below 2^48 or 2^47 whose rounding carries into the next
    binade (…111.1 → 1000…), and their neighbours that do not."""
    A = rng.integers(1 << 23, 1 << 24, 4 * n)
    top = rng.random(A.size) < 0.5
    limit = np.where(top, (1 << 48) - (1 << 23), (1 << 47) - (1 << 22))
    M = -(-limit // A) + rng.choice(np.array([-1, 0, 0, 1]), A.size)
    keep = (M >= 1 << 23) & (M < 1 << 24)
    A, M, top = A[keep][:n], M[keep][:n], top[keep][:n]
    s = rng.integers(0, 8, A.size)
    acc = (A << s) * random_sign(rng, A.size)
    # p ≈ A·M·2^(s+E−150): choose the biased exponent E for p ≈ 2^j.
    j = rng.integers(-2, K + 1, A.size)
    E = j + 150 - s - np.where(top, 48, 47)
    bits = (E << 23) | (M - (1 << 23))
    return acc, bits.astype(np.uint32).view(np.float32)


def saturation_and_zero(rng, n):
    """Zero accumulators and multipliers (±0, subnormal), products around ±2^K, huge and
    tiny multipliers inside numpy's defined range (|m| < 2^32), negative multipliers."""
    kinds = rng.integers(0, 5, n)
    acc = log_uniform_acc(rng, n)
    m = in_range_multipliers(rng, acc)
    acc = np.where(kinds == 0, 0, acc)
    tiny = np.array([0.0, -0.0, 1e-45, 1e-40, -1e-42, 1.1754942e-38, 1.1754944e-38], np.float32)
    m = np.where(kinds == 1, rng.choice(tiny, n), m)
    near_sat = f32(np.exp2(rng.uniform(K - 0.05, K + 0.05, n)) / np.maximum(np.abs(acc), 1))
    m = np.where(kinds == 2, near_sat, m)
    m = np.where(kinds == 3, f32(np.exp2(rng.uniform(8, 31.99, n))), m)
    m = np.where(kinds == 4, -m, m)
    return acc, f32(m)


def random_int32(rng, n):
    """Uniform int32 accumulators × log-uniform multipliers 2^−40 … 2^8 (mostly clamped)."""
    acc = rng.integers(INT32_MIN, INT32_MAX + 1, n)
    return acc, f32(np.exp2(rng.uniform(-40, 8, n)))


def random_in_range(rng, n):
    """Log-uniform accumulators (any magnitude) with products inside the clamp window."""
    acc = log_uniform_acc(rng, n)
    return acc, in_range_multipliers(rng, acc)


def random_large(rng, n):
    """|acc| ≥ 2^24, where the int → float conversion rounds."""
    acc = rng.integers(1 << 24, INT32_MAX, n) * random_sign(rng, n)
    return acc, in_range_multipliers(rng, acc)


def vector_classes():
    """name → (generator, vector count)."""
    return {
        "random int32, m 2^-40..2^8": (random_int32, 1_000_000),
        "random, product in clamp range": (random_in_range, 1_500_000),
        "random |acc| >= 2^24": (random_large, 500_000),
        "exact tie k+1/2": (exact_ties, 100_000),
        "float32 product rounds to a tie": (rounded_ties, 100_000),
        "1-2 ulp from a rounded tie": (near_ties, 100_000),
        "int32->float32 tie, m power of two": (int_to_float_ties, 100_000),
        "int32->float32 tie or neighbour": (int_to_float_random_ties, 100_000),
        "acc near +-2^31 and 2^24": (int32_extremes, 50_000),
        "m significand all ones / one": (all_ones_multipliers, 100_000),
        "significand product carry": (product_carries, 100_000),
        "zero, subnormal, saturation, m<0": (saturation_and_zero, 200_000),
    }


# -- reference and scoreboard -------------------------------------------------------------------

def assemble(rng, acc, m, config=None, observe_share=0.5) -> dict:
    """Port vectors; each vector gets a (zp, lo, hi) from CONFIGS (index 0 half of the time)."""
    n = acc.size
    if config is None:
        config = np.where(rng.random(n) < observe_share, 0, rng.integers(0, len(CONFIGS), n))
    table = np.array(CONFIGS)
    return {
        "acc": np.asarray(acc, np.int64), "multiplier": f32(m).view(np.uint32).astype(np.int64),
        "zero_point": table[config, 0], "lo": table[config, 1], "hi": table[config, 2],
        "valid": rng.random(n) < 0.9,
        "config": np.broadcast_to(config, (n,)),
    }


def reference(vectors: dict) -> np.ndarray:
    """sfnpu.numeric.requantize, one call per (zp, lo, hi) configuration."""
    expected = np.empty(vectors["acc"].size, np.int64)
    acc = vectors["acc"].astype(np.int32)
    m = vectors["multiplier"].astype(np.uint32).view(np.float32)
    for index, (zp, lo, hi) in enumerate(CONFIGS):
        chosen = vectors["config"] == index
        if chosen.any():
            expected[chosen] = requantize(acc[chosen], m[chosen], zp, lo, hi)
    return expected


def saturating_reference(vectors: dict) -> np.ndarray:
    """The block's documented behaviour where numpy's int64 cast is undefined
    (|m| ≥ 2^32, ±inf, NaN): saturate by sign; non-finite multipliers give clamp(zp)."""
    acc = vectors["acc"].astype(np.int32)
    m = vectors["multiplier"].astype(np.uint32).view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = np.clip(np.rint(float32_product(acc, m).astype(np.float64)), -2.0**40, 2.0**40)
    rounded = np.where(np.isfinite(m), np.nan_to_num(rounded), 0).astype(np.int64)
    y = rounded + vectors["zero_point"]
    return np.minimum(np.maximum(y, vectors["lo"]), vectors["hi"])


def port_inputs(vectors: dict) -> dict:
    return {k: v for k, v in vectors.items() if k != "config"}


def scoreboard(vectors: dict, outputs: dict, expected: np.ndarray,
               expected_invalid=None) -> dict[str, int]:
    n = expected.size
    got = {k: v[LATENCY:LATENCY + n] for k, v in outputs.items()}
    if expected_invalid is None:
        expected_invalid = np.zeros(n, bool)
    return {
        "y": int(np.count_nonzero(got["y"] != expected)),
        "invalid": int(np.count_nonzero(got["invalid"] != expected_invalid)),
        "y_valid": int(np.count_nonzero(got["y_valid"] != vectors["valid"])),
    }


# -- Amaranth simulator: exhaustive small sweeps -------------------------------------------------

TIE_ACC = 257 << 17          # float32(TIE_ACC)·2^-18 = 128.5; ±2 are int→float ties onto it


def rounded_tie_sweep(target=100.5, span=1024):
    """A 24-bit accumulator and 2·span consecutive float32 multipliers centred on one whose
    float32 product rounds onto ``target`` although the exact product is not ``target``."""
    for acc in range(12345679, 12345679 + 200, 2):
        centre = int(f32(target / acc).view(np.uint32))
        bits = np.arange(centre - span, centre + span)
        m = bits.astype(np.uint32).view(np.float32)
        acc_array = np.full(m.size, acc)
        hit = ((float32_product(acc_array, m) == target)
               & (exact_product(acc_array, m) != target))
        if hit.any():
            m = (bits - span + np.flatnonzero(hit)[0]).astype(np.uint32).view(np.float32)
            return acc_array, m
    raise AssertionError("no rounded tie found")


def powers_of_two():
    """acc = ±2^k and its neighbours ±(2^k ± 1) for every k (the magnitude's leading one
    moves with the carry of a negation exactly there), with m = 75·2^−(k+1): ±2^k gives the
    tie ±37.5."""
    k = np.repeat(np.arange(32), 6)
    acc = (np.int64(1) << k) + np.tile([-1, 0, 1, -1, 0, 1], 32)
    acc = np.where(np.tile([1, 1, 1, -1, -1, -1], 32) < 0, -acc, acc)
    acc = np.clip(acc, INT32_MIN, INT32_MAX)
    return acc, f32(75 * np.exp2(-(k + 1.0)))


def sweeps():
    """name → (acc, m, config index): every accumulator (or multiplier) in a small window.
    All but the float32(0.3) sweep contain float32 products that are exact ties."""
    window = np.arange(-2048, 2048)
    return {
        "acc +-2^k and +-(2^k +- 1), m=75*2^-(k+1)": (*powers_of_two(), 1),
        "acc -2048..2047, m=1/8 (all tie classes)": (window, f32([0.125] * 4096), 0),
        "acc -2048..2047, m=float32(0.3)": (window, f32([0.3] * 4096), 1),
        "2048 ulps of m across a rounded tie 100.5": (*rounded_tie_sweep(), 0),
        "acc 257*2^17 +-2048, m=2^-18": (TIE_ACC + window, f32([2.0**-18] * 4096), 0),
        "acc -257*2^17 +-1024, m=2^-18, uint8": (-TIE_ACC + window[1024:3072],
                                                  f32([-(2.0**-18)] * 2048), 5),
    }


@pytest.mark.parametrize("name", list(sweeps()))
def test_exhaustive_sweep_in_amaranth_simulator(name):
    acc, m, config = sweeps()[name]
    vectors = assemble(np.random.default_rng(7), acc, m, config=np.full(acc.size, config))
    outputs = simulate_vectors(Requantizer(), port_inputs(vectors), flush=LATENCY)
    expected = reference(vectors)
    assert np.unique(expected).size > 1          # the sweep is not all clamped
    ties = np.count_nonzero(np.abs(float32_product(acc.astype(np.int32), m)) % 1 == 0.5)
    assert ties > 0 or "0.3" in name
    assert scoreboard(vectors, outputs, expected) == {"y": 0, "invalid": 0, "y_valid": 0}


class RequantizerRoundingHalfUp(Requantizer):
    """Every rounding step ties away from zero (the fixed-point habit): must be caught."""

    @staticmethod
    def round_half_even(value, drop):
        return value[drop:] + value[drop - 1]


def test_rounding_half_up_is_caught():
    acc, m, config = sweeps()["acc -2048..2047, m=1/8 (all tie classes)"]
    vectors = assemble(np.random.default_rng(7), acc, m, config=np.full(acc.size, config))
    outputs = simulate_vectors(RequantizerRoundingHalfUp(), port_inputs(vectors), flush=LATENCY)
    errors = scoreboard(vectors, outputs, reference(vectors))
    # Ties at even k: x.5 for x in −256..255 → half the 512 in-window ties, none elsewhere.
    assert errors["y"] > 200 and errors["invalid"] == errors["y_valid"] == 0


# -- Verilator: millions of vectors, every tie class ----------------------------------------------

@pytest.fixture(scope="module")
def harness():
    return VectorHarness(Requantizer(), "requantizer", REPO_ROOT / "build" / "test_hw_requant")


def test_vector_classes_on_verilator(harness):
    rng = np.random.default_rng(20240607)
    classes = {name: generate(rng, count) for name, (generate, count) in vector_classes().items()}
    labels = np.concatenate([np.full(acc.size, i) for i, (acc, _) in enumerate(classes.values())])
    acc = np.concatenate([np.asarray(a, np.int64) for a, _ in classes.values()])
    m = np.concatenate([f32(mm) for _, mm in classes.values()])
    assert acc.size > 3_500_000 and acc.min() >= INT32_MIN and acc.max() <= INT32_MAX
    vectors = assemble(rng, acc, m)
    outputs = harness.run(port_inputs(vectors), flush=LATENCY)
    expected = reference(vectors)
    got = outputs["y"][LATENCY:LATENCY + acc.size]

    failures, coverage = {}, {}
    for i, name in enumerate(classes):
        chosen = labels == i
        failures[name] = int(np.count_nonzero(got[chosen] != expected[chosen]))
        _, lo, hi = np.array(CONFIGS)[vectors["config"][chosen]].T
        coverage[name] = np.mean((expected[chosen] > lo) & (expected[chosen] < hi))
    assert failures == {name: 0 for name in classes}
    errors = scoreboard(vectors, outputs, expected)
    assert errors == {"y": 0, "invalid": 0, "y_valid": 0}
    # Engineered classes must land mostly inside the clamp window, or they test nothing.
    for name in classes:
        if not name.startswith(("random int32", "zero")):
            assert coverage[name] > 0.3, (name, coverage[name])
    # The tie classes tell correct arithmetic from plausible shortcuts: skipping the float32
    # rounding of the product, or converting the accumulator without rounding, changes the
    # result of a large share of them (rint of the exact value, computed exactly in float64).
    def changed_share(name, shortcut):
        chosen = labels == list(classes).index(name)
        a, mm = acc[chosen], m[chosen]
        return np.mean(np.rint(shortcut(a, mm)) != np.rint(float32_product(a, mm)))
    assert changed_share("float32 product rounds to a tie", exact_product) > 0.4
    assert changed_share("int32->float32 tie, m power of two",
                         lambda a, mm: a.astype(np.float64) * mm.astype(np.float64)) > 0.4
    # Ties of both parities and signs are present.
    tie = np.isin(labels, [list(classes).index(n) for n in
                           ("exact tie k+1/2", "float32 product rounds to a tie",
                            "int32->float32 tie, m power of two")])
    p = float32_product(acc[tie].astype(np.int32), m[tie])
    k = np.floor(np.abs(p)).astype(np.int64)
    for even in (0, 1):
        for negative in (False, True):
            assert np.count_nonzero((k % 2 == even) & ((p < 0) == negative)) > 10_000


def test_outside_numpy_range_saturates_on_verilator(harness):
    """|m| ≥ 2^32 (numpy's int64 cast is undefined there), ±inf and NaN multipliers."""
    rng = np.random.default_rng(11)
    n = 200_000
    acc = log_uniform_acc(rng, n)
    big = f32(np.exp2(rng.uniform(32, 127.99, n)) * random_sign(rng, n))
    special = f32(rng.choice(np.array([np.inf, -np.inf, np.nan], np.float32), n))
    m = np.where(rng.random(n) < 0.8, big, special)
    m = np.where(rng.random(n) < 0.05, np.float32(np.finfo(np.float32).max), m)
    vectors = assemble(rng, acc, m)
    outputs = harness.run(port_inputs(vectors), flush=LATENCY)
    expected = saturating_reference(vectors)
    errors = scoreboard(vectors, outputs, expected, expected_invalid=~np.isfinite(m))
    assert errors == {"y": 0, "invalid": 0, "y_valid": 0}
    # The saturating reference agrees with numeric.requantize wherever that is defined.
    defined = assemble(rng, *random_in_range(rng, 100_000))
    assert np.array_equal(saturating_reference(defined), reference(defined))
