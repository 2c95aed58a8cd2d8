"""EltwiseAdd (hw/eltwise_add.py) against sfnpu.numeric.qlinear_add_codes, bit for bit.

One lane (:class:`EltwiseAddLane`) on Verilator sees all 65 536 pairs of codes ``(a, b)`` for
each of a few hundred sets of constants ``(r_a, r_b, fixed)`` (:func:`constant_classes`):
onnxruntime's constants from random scales and zero points for every signedness combination;
constants built so that exact ties meet the first fused multiply-add, the second one and the
final rounding (and so that the tie's outcome shows in the output code); powers of two, odd
fractions and their ulp neighbours; random magnitudes; huge constants that cancel; results at
the int32 edge of ``cvtps_epi32``; addends at both limits of each multiply-add's window;
subnormal constants whose exact value decides the output; zero, huge, ±infinity and NaN. The
C library's ``fmaf`` cross-checks the reference on a few of them. The lane's ``a`` is
onnxruntime's operand A (no swap); the stream wrapper's ``swap`` is checked in Amaranth's
simulator, with random stalls on all three streams.

The suite can fail: reference variants with one rounding changed (ties away from zero in either
fused multiply-add or in the conversion, or a multiply and an add rounded separately) disagree
with the contract on many of these pairs, and a lane whose roundings tie upwards is caught.
"""

import ctypes
import ctypes.util

import numpy as np
import pytest

from sfnpu.hw.eltwise_add import EltwiseAdd, EltwiseAddLane
from sfnpu.hw.shared_product import OwnProducts
from sfnpu.numeric import fma_f32, qlinear_add_codes, qlinear_add_params, qrange
from sfnpu.tb.verilator import REPO_ROOT, VectorHarness, simulate_vectors
from stream_bench import beats_of, run_streams, tensor_of

LATENCY = EltwiseAddLane.LATENCY
F32 = np.float32
INT32_MIN = -(1 << 31)
BUILD_DIR = REPO_ROOT / "build" / "test_hw_eltwise_add"


def codes(signed: bool) -> np.ndarray:
    lo, hi = qrange(signed)
    return np.arange(lo, hi + 1)


def f32_bits(v) -> int:
    return int(np.asarray(v, dtype=np.float32).view(np.uint32))


def ulps(v, steps: int) -> np.float32:
    v = F32(v)
    for _ in range(abs(steps)):
        v = np.nextafter(v, F32(np.inf if steps > 0 else -np.inf))
    return v


def reference(a, b, r_a, r_b, fixed, out_signed) -> np.ndarray:
    with np.errstate(all="ignore"):            # infinite / NaN constants are legal inputs
        return qlinear_add_codes(a, b, F32(r_a), F32(r_b), F32(fixed), out_signed)


# -- reference variants (one rounding changed) -------------------------------------------------

def fma_ties_away(a, b, c) -> np.ndarray:
    """float32 fused multiply-add rounding exact ties away from zero (else like fma_f32)."""
    p = np.asarray(a, np.float32).astype(np.float64) * np.asarray(b, np.float32).astype(np.float64)
    c = np.asarray(c, np.float32).astype(np.float64)
    s = p + c
    bv = s - p
    exact = ((p - (s - bv)) + (c - bv)) == 0
    r = fma_f32(a, b, c)
    other = np.nextafter(r, np.where(r.astype(np.float64) > s, -np.inf, np.inf).astype(np.float32))
    tie = exact & (s == (r.astype(np.float64) + other.astype(np.float64)) * 0.5) & (s != r)
    away = np.where(np.abs(other) > np.abs(r), other, r)
    return np.where(tie, away, r).astype(np.float32)


def mul_then_add(a, b, c) -> np.ndarray:
    """A float32 multiply and a float32 add: two roundings."""
    return (np.asarray(a, np.float32) * np.float32(b)).astype(np.float32) + np.float32(c)


def cvt_pack(t, lo, hi, rint=np.rint) -> np.ndarray:
    """``_mm_cvtps_epi32`` (with a choice of rounding) and the saturating packs."""
    t = np.asarray(t, dtype=np.float32).astype(np.float64)
    r = rint(t)
    bad = ~np.isfinite(r) | (r >= 2.0**31) | (r < -2.0**31)
    return np.clip(np.where(bad, INT32_MIN, np.where(bad, 0, r)).astype(np.int64), lo, hi)


def rint_ties_away(t):
    return np.where(np.abs(t) % 1 == 0.5, np.trunc(t) + np.sign(t), np.rint(t))


VARIANTS = {
    # name: (first multiply-add, second multiply-add, conversion rounding)
    "contract": (fma_f32, fma_f32, np.rint),
    "u ties away": (fma_ties_away, fma_f32, np.rint),
    "t ties away": (fma_f32, fma_ties_away, np.rint),
    "rint ties away": (fma_f32, fma_f32, rint_ties_away),
    "u = b·r_b + fixed rounded twice": (mul_then_add, fma_f32, np.rint),
    "t = a·r_a + u rounded twice": (fma_f32, mul_then_add, np.rint),
}


def variant(name, a, b, r_a, r_b, fixed, out_signed) -> np.ndarray:
    first, second, rint = VARIANTS[name]
    with np.errstate(all="ignore"):
        u = first(np.asarray(b, np.float32), F32(r_b), F32(fixed))
        t = second(np.asarray(a, np.float32), F32(r_a), u)
        return cvt_pack(t, *qrange(out_signed), rint=rint)


# -- an independent reference: the C library's fmaf -------------------------------------------

def libm_reference(a, b, r_a, r_b, fixed, out_signed) -> np.ndarray:
    """The contract evaluated with the C library's correctly rounded ``fmaf`` (one element at a
    time), for cross-checking :func:`sfnpu.numeric.fma_f32` where it matters."""
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.fmaf.restype = ctypes.c_float
    libm.fmaf.argtypes = [ctypes.c_float] * 3
    u = {int(v): libm.fmaf(float(v), float(r_b), float(fixed)) for v in np.unique(b)}
    t = np.array([libm.fmaf(float(x), float(r_a), u[int(y)]) for x, y in zip(a, b)],
                 dtype=np.float32)
    with np.errstate(all="ignore"):
        return cvt_pack(t, *qrange(out_signed))


# -- configurations ---------------------------------------------------------------------------

def signedness(rng):
    return tuple(bool(v) for v in rng.integers(0, 2, 3))


def onnxruntime_constants(rng):
    """qlinear_add_params from random scales and zero points: every signedness combination."""
    for combo in range(8):
        a_signed, b_signed, out_signed = (bool(combo >> k & 1) for k in range(3))
        for _ in range(8):
            scales = np.exp2(rng.uniform(-9, -1, 3)).astype(np.float32)
            zps = [int(rng.choice(codes(s))) for s in (a_signed, b_signed, out_signed)]
            r_a, r_b, fixed = qlinear_add_params(scales[0], zps[0], scales[1], zps[1],
                                                 scales[2], zps[2])
            yield a_signed, b_signed, out_signed, r_a, r_b, fixed


def u_tie_constants(rng):
    """``b·r_b + fixed`` exactly halfway between two float32 (fixed ∈ [2^23, 2^25), r_b an odd
    multiple of half its ulp), and ``a0·r_a`` cancelling ``fixed`` for one code ``a0``: that
    row shows u's rounding directly."""
    for _ in range(20):
        a_signed, b_signed, out_signed = signedness(rng)
        fixed = F32(rng.uniform(2.0**23, 2.0**25) * rng.choice([-1, 1]))
        half_ulp = float(np.spacing(np.abs(fixed))) / 2
        r_b = F32(half_ulp * rng.choice([1, 3, -1, -3, 0.5]))
        a0 = int(rng.choice(codes(a_signed)[codes(a_signed) != 0]))
        r_a = F32(-fixed / a0)
        yield a_signed, b_signed, out_signed, r_a, r_b, F32(fixed)


def u_rounding_constants(rng):
    """u = fma(b, R, fixed) with a 24-bit R ∈ [2^14, 2^20) and a fixed that is not a multiple
    of u's ulp, against r_a = −R: on the diagonal a = b, t is u's rounding error (a few units),
    where rounding b·R before adding fixed goes wrong."""
    for _ in range(12):
        a_signed, b_signed, out_signed = signedness(rng)
        b_signed = a_signed                     # the diagonal a = b needs common codes
        R = F32(rng.choice([-1, 1]) * np.exp2(rng.uniform(14, 20)))
        fixed = F32(rng.uniform(-100, 100))
        yield a_signed, b_signed, out_signed, F32(-R), R, fixed


def t_tie_constants(rng):
    """``a·r_a + u`` exactly halfway between two float32 next to a half-integer: in the binade
    [2^e, 2^(e+1)) of the output range, r_a = ±(1 + 2^(e−24)), u = ±(½ + (c0 − b)·2^(e−24))
    (exact), so t = ±(a + ½ + (a + c0 − b)·2^(e−24)) is a tie for every odd a + c0 − b, and
    rint sees it when a + c0 − b = ±1."""
    for _ in range(20):
        a_signed, b_signed, out_signed = signedness(rng)
        sign = int(rng.choice([-1, 1])) if out_signed else 1
        e = 6 if out_signed else 7
        a_signed = a_signed and out_signed          # a ∈ [2^e, 2^(e+1)) must be a code
        step = 2.0**(e - 24)
        c0 = int(rng.integers(-64, 65))
        r_a = F32(sign * (1 + step))
        r_b = F32(-sign * step)
        fixed = F32(sign * (0.5 + c0 * step))
        yield a_signed, b_signed, out_signed, r_a, r_b, fixed


def rint_tie_constants(rng):
    """t = a/2^p + b/2^q + fixed with p, q ∈ {1, 2} and fixed a multiple of ¼: exact ties of
    the conversion; and odd fractions k/2^n."""
    for _ in range(12):
        a_signed, b_signed, out_signed = signedness(rng)
        r_a = F32(rng.choice([-1, 1]) * 2.0 ** -int(rng.integers(1, 3)))
        r_b = F32(rng.choice([-1, 1]) * 2.0 ** -int(rng.integers(1, 3)))
        fixed = F32(int(rng.integers(-200, 400)) / 4)
        yield a_signed, b_signed, out_signed, r_a, r_b, fixed
    for _ in range(12):
        a_signed, b_signed, out_signed = signedness(rng)
        r_a, r_b = (F32((2 * int(rng.integers(0, 64)) + 1) / 2.0 ** int(rng.integers(3, 12)))
                    for _ in range(2))
        fixed = F32((2 * int(rng.integers(-300, 300)) + 1) / 2.0 ** int(rng.integers(1, 10)))
        yield a_signed, b_signed, out_signed, r_a, r_b, fixed


def power_of_two_constants(rng):
    for _ in range(16):
        a_signed, b_signed, out_signed = signedness(rng)
        r_a, r_b = (F32(rng.choice([-1, 1]) * 2.0 ** int(rng.integers(-12, 3))) for _ in "ab")
        fixed = F32(rng.uniform(-300, 300))
        yield a_signed, b_signed, out_signed, r_a, r_b, fixed


def ulp_neighbour_constants(rng):
    """Each constant of a tie configuration or a power of two moved by ±1 or ±2 ulps: sums a
    hair off a tie (``k.49999997``), which double rounding would turn into ties."""
    sources = (list(t_tie_constants(rng))[:6] + list(rint_tie_constants(rng))[:6]
               + list(power_of_two_constants(rng))[:6])
    for a_signed, b_signed, out_signed, r_a, r_b, fixed in sources:
        steps = rng.choice([-2, -1, 0, 1, 2], 3)
        if not steps.any():
            steps[2] = 1
        yield (a_signed, b_signed, out_signed, ulps(r_a, steps[0]), ulps(r_b, steps[1]),
               ulps(fixed, steps[2]))


def random_constants(rng):
    for _ in range(24):
        a_signed, b_signed, out_signed = signedness(rng)
        r_a, r_b = (F32(rng.choice([-1, 1]) * np.exp2(rng.uniform(-20, 10))) for _ in "ab")
        fixed = F32(rng.choice([-1, 1]) * np.exp2(rng.uniform(-10, 12)))
        yield a_signed, b_signed, out_signed, r_a, r_b, fixed


def cancellation_constants(rng):
    """Large products that cancel: u = fma(b, R, fixed) against a·(−R·k) with R up to 2^120,
    so t is u's rounding error (or a small difference of huge values) for some pairs."""
    for _ in range(16):
        a_signed, b_signed, out_signed = signedness(rng)
        R = F32(np.exp2(rng.uniform(10, 120)))
        k = F32(rng.choice([1, 1, 2, 3, 0.5, 1 + 2.0**-20]))
        fixed = F32(rng.choice([0.0, rng.uniform(-100, 100), float(R) * rng.uniform(-200, 200)]))
        yield a_signed, b_signed, out_signed, F32(-R * k), R, fixed


def int32_edge_constants(rng):
    """a0·r_a + u around 2^31 − 64, where float32 rounding reaches 2^31 and cvtps_epi32 gives
    INT32_MIN: the row a = a0 switches between hi and lo (ties included)."""
    for _ in range(12):
        a_signed, b_signed, _ = signedness(rng)
        out_signed = bool(rng.integers(0, 2))
        a0 = int(rng.choice([1, 3, 5, 31, 127]))
        r_a = ulps(F32((2.0**31 - 128) / a0), int(rng.integers(-2, 3)))
        r_b = F32(rng.choice([1, -1]) * 2.0 ** -int(rng.integers(0, 4)))
        fixed = F32(rng.choice([64.0, 63.5, 64.5, 32.0, 96.0]))
        yield a_signed, b_signed, out_signed, r_a, r_b, fixed


def rounding_tie_product(rng, sign):
    """A constant r with 3·r = ±(n + ½ + 2^(E−24)), n + ½ ∈ [2^E, 2^(E+1)): the product of the
    code 3 and r is halfway between two float32 next to a half-integer (25 bits, both exact),
    so an addend far below it decides which one, and rint sees the difference."""
    while True:
        E = int(rng.integers(1, 7))
        n = int(rng.integers(2**E, 2**(E + 1)))
        K = (2 * n + 1) * 2**(23 - E) + 1
        if K % 3 == 0:
            return F32(sign * (K // 3) * 2.0**(E - 24))


def threshold_constants(rng):
    """Addends around the two window limits of each fused multiply-add: far above the product
    (where the product stops moving the result: ``fixed`` or ``u`` a half-integer with the
    product around a quarter of its ulp, or a power of two ``fixed`` with the product around
    half the ulp below it) and far below it (a sticky bit that breaks the tie of a product of
    :func:`rounding_tie_product`). Zero constants pass u or t through."""
    sign = lambda: int(rng.choice([-1, 1]))
    for _ in range(6):      # fma(b, r_b, fixed): fixed dominates; t = u
        a_signed, b_signed, out_signed = signedness(rng)
        fixed = F32(sign() * (int(rng.integers(0, 100)) + 0.5))
        e_fixed = int(np.floor(np.log2(abs(float(fixed)))))
        r_b = F32(sign() * np.exp2(e_fixed - int(rng.integers(30, 39)) + rng.uniform(0, 1)))
        yield a_signed, b_signed, out_signed, F32(0.0), r_b, fixed
    for _ in range(6):      # fma(a, r_a, u): u = fixed dominates
        a_signed, b_signed, out_signed = signedness(rng)
        fixed = F32(sign() * (int(rng.integers(0, 100)) + 0.5))
        e_fixed = int(np.floor(np.log2(abs(float(fixed)))))
        r_a = F32(sign() * np.exp2(e_fixed - int(rng.integers(30, 39)) + rng.uniform(0, 1)))
        yield a_signed, b_signed, out_signed, r_a, F32(0.0), fixed
    for d in (32, 33, 33, 34):  # fixed = ±2^k, the product of the opposite sign
        a_signed, out_signed = (bool(v) for v in rng.integers(0, 2, 2))
        k = int(rng.integers(24, 31))
        s = sign()
        # u = 2^k − 2^(k−24) once |b·r_b| passes 2^(k−25) (the float32 below 2^k is closer),
        # and a = 1 subtracts 2^k again.
        r_b = F32(-s * 2.0**(k - d) * rng.uniform(1, 2))
        yield a_signed, False, out_signed, F32(-s * 2.0**k), r_b, F32(s * 2.0**k)
    for _ in range(6):      # fma(b, r_b, fixed): 3·r_b a tie, fixed tiny
        a_signed, b_signed, out_signed = signedness(rng)
        r_b = rounding_tie_product(rng, sign())
        fixed = F32(sign() * np.exp2(-int(rng.integers(20, 40)) + rng.uniform(0, 1)))
        yield a_signed, b_signed, out_signed, F32(0.0), r_b, fixed
    for _ in range(6):      # fma(a, r_a, u): 3·r_a a tie, u = fixed tiny
        a_signed, b_signed, out_signed = signedness(rng)
        r_a = rounding_tie_product(rng, sign())
        fixed = F32(sign() * np.exp2(-int(rng.integers(20, 40)) + rng.uniform(0, 1)))
        yield a_signed, b_signed, out_signed, r_a, F32(0.0), fixed


def subnormal_constants(rng):
    """A subnormal r_b and a normal fixed = −(b0 + δ)·r_b: u = b·r_b + fixed is tiny and
    changes sign at b = b0 (zero there when δ = 0), against a product a·r_a that is a tie
    (:func:`rounding_tie_product`): u's sign, i.e. the exact value of r_b, decides the
    output."""
    for _ in range(6):
        a_signed, b_signed, out_signed = signedness(rng)
        s = int(rng.choice([-1, 1]))
        r_b = F32(s * 2.0**-int(rng.integers(127, 134)) * rng.choice([1, 3, 5]))
        b0 = int(rng.choice([-1, 1]) * rng.integers(100, 128)) if b_signed else \
            int(rng.integers(128, 256))
        fixed = F32(-(b0 + rng.choice([0, 0.5])) * float(r_b))
        yield a_signed, b_signed, out_signed, rounding_tie_product(rng, s), r_b, fixed


def special_constants(rng):
    values = [F32(0.0), F32(-0.0), F32(1e-40), F32(-1.4e-45), F32(1.1754944e-38), F32(3e-39),
              F32(3.4028235e38), F32(-3.4028235e38), F32(1e30), F32(np.inf), F32(-np.inf),
              F32(np.nan)]
    ordinary = [F32(0.75), F32(-1.25), F32(37.5)]
    for _ in range(24):
        a_signed, b_signed, out_signed = signedness(rng)
        picked = [rng.choice(values) if rng.random() < 0.5 else rng.choice(ordinary)
                  for _ in range(3)]
        yield (a_signed, b_signed, out_signed, *picked)
    # a·r_a = −FLT_MAX against u = FLT_MAX (exact); 2·2^127 against u = 2·2^127, which is
    # infinite (lo), not 2^128 (which would give 0); subnormal products next to a tie.
    yield True, True, True, F32(-3.4028235e38), F32(3.4028235e38), F32(0.0)
    yield False, False, True, F32(-2.0**127), F32(2.0**127), F32(0.0)
    yield False, False, False, F32(2.0**-140), F32(-2.0**-140), F32(0.5)
    yield False, True, False, F32(0.5), F32(1e-45), F32(0.0)


def constant_classes(rng):
    """class name → list of (a_signed, b_signed, out_signed, r_a, r_b, fixed)."""
    generators = {
        "onnxruntime": onnxruntime_constants, "u ties": u_tie_constants,
        "u rounding": u_rounding_constants,
        "t ties": t_tie_constants, "rint ties": rint_tie_constants,
        "power of two": power_of_two_constants, "ulp neighbours": ulp_neighbour_constants,
        "random": random_constants, "cancellation": cancellation_constants,
        "int32 edge": int32_edge_constants, "window limits": threshold_constants,
        "subnormal": subnormal_constants, "special": special_constants,
    }
    return {name: list(gen(rng)) for name, gen in generators.items()}


def code_pairs(a_signed, b_signed):
    a, b = np.meshgrid(codes(a_signed), codes(b_signed), indexing="ij")
    return a.ravel(), b.ravel()


def padded_vectors(config, a, b) -> dict:
    """Lane inputs for the code pairs ``(a, b)`` of one configuration, plus LATENCY idle
    cycles so the next configuration meets an empty pipeline."""
    a_signed, b_signed, out_signed, r_a, r_b, fixed = config
    n = a.size + LATENCY
    pad = lambda v: np.concatenate([v, np.zeros(LATENCY, np.int64)])
    return {
        "a": pad(a & 0xFF), "b": pad(b & 0xFF), "valid": pad(np.ones(a.size, np.int64)),
        "a_signed": np.full(n, a_signed), "b_signed": np.full(n, b_signed),
        "r_a": np.full(n, f32_bits(r_a)), "r_b": np.full(n, f32_bits(r_b)),
        "fixed": np.full(n, f32_bits(fixed)), "out_signed": np.full(n, out_signed),
    }


def concat(parts):
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def run_lane(harness, configs, pairs=None):
    """y of every code pair (or of the given ``(a, b)`` per configuration), one array per
    configuration, from one Verilator run."""
    pairs = pairs or [code_pairs(c[0], c[1]) for c in configs]
    parts = [padded_vectors(c, a, b) for c, (a, b) in zip(configs, pairs)]
    vectors = concat(parts)
    outputs = harness.run(vectors, flush=LATENCY)
    y = outputs["y"][LATENCY:LATENCY + vectors["a"].size]
    assert np.array_equal(outputs["y_valid"][LATENCY:LATENCY + vectors["a"].size],
                          vectors["valid"])
    results, offset = [], 0
    for (a, _), part in zip(pairs, parts):
        results.append(y[offset:offset + a.size])
        offset += part["a"].size
    return results


@pytest.fixture(scope="module")
def harness():
    return VectorHarness(OwnProducts(EltwiseAddLane()), "eltwise_add_lane", BUILD_DIR)


# -- Verilator: every code pair, hundreds of configurations -----------------------------------

def tie_counts(config):
    """Exact ties over all code pairs of a configuration: of u and of t where ties to even
    and ties away from zero differ, and of the conversion of t."""
    a_signed, b_signed, _, r_a, r_b, fixed = config
    a, b = code_pairs(a_signed, b_signed)
    with np.errstate(all="ignore"):
        u = fma_f32(b.astype(np.float32), F32(r_b), F32(fixed))
        t = fma_f32(a.astype(np.float32), F32(r_a), u)
        counts = [np.count_nonzero(fma_ties_away(x, r, c) != fma_f32(x, r, c))
                  for x, r, c in ((b, r_b, fixed), (a, r_a, u))]
        counts.append(np.count_nonzero(np.isfinite(t) & (np.abs(t) < 2**10)
                                       & (np.abs(t) % 1 == 0.5)))
    return counts


def test_every_code_pair_on_verilator(harness):
    rng = np.random.default_rng(20240612)
    classes = constant_classes(rng)
    configs = [(name, c) for name, cs in classes.items() for c in cs]
    assert len(configs) > 200
    results = run_lane(harness, [c for _, c in configs])

    failures, in_range = {}, 0
    for (name, config), got in zip(configs, results):
        a, b = code_pairs(config[0], config[1])
        expected = reference(a, b, *config[3:], config[2])
        wrong = np.count_nonzero(got != expected)
        if wrong:
            failures[(name, *config)] = wrong
        lo, hi = qrange(config[2])
        in_range += np.count_nonzero((expected > lo) & (expected < hi))
    assert not failures, list(failures.items())[:5]
    assert sum(r.size for r in results) > 18_000_000
    # Millions of outputs are not clamped, so the roundings are visible.
    assert in_range > 3_000_000

    # The engineered classes do produce ties of every rounding step.
    counts = {name: np.sum([tie_counts(c) for c in cs], axis=0)
              for name, cs in classes.items() if "ties" in name}
    assert counts["u ties"][0] > 150_000
    assert counts["t ties"][1] > 80_000
    assert counts["rint ties"][2] > 100_000


def test_wrong_roundings_change_the_outputs():
    """Every variant with one rounding changed differs from the contract on pairs the Verilator
    test checks, so a lane making that mistake fails it."""
    rng = np.random.default_rng(20240612)
    classes = constant_classes(rng)
    configs = (classes["u ties"] + classes["u rounding"] + classes["t ties"]
               + classes["rint ties"] + classes["ulp neighbours"][:6])
    differences = dict.fromkeys(VARIANTS, 0)
    for config in configs:
        a, b = code_pairs(config[0], config[1])
        expected = reference(a, b, *config[3:], config[2])
        for name in VARIANTS:
            differences[name] += np.count_nonzero(
                variant(name, a, b, *config[3:], config[2]) != expected)
    assert differences.pop("contract") == 0
    assert all(count > 200 for count in differences.values()), differences


def test_libm_fmaf_cross_check(harness):
    """The lane against the C library's fmaf, including the overflow edge where u rounds to
    FLT_MAX (not to infinity) and a·r_a = −FLT_MAX cancels it: 31·(1082401·2^103) is halfway
    between FLT_MAX and 2^128, fixed = −1e−30 pulls it below."""
    rng = np.random.default_rng(5)
    edge = (False, False, True, F32(-3.4028235e38), F32(1082401 * 2.0**103), F32(-1e-30))
    configs = [edge, *list(onnxruntime_constants(rng))[::21], *list(u_tie_constants(rng))[:2]]
    pairs = [code_pairs(c[0], c[1]) for c in configs]
    pairs[0] = (np.arange(256), np.full(256, 31))               # the row that overflows
    for config, (a, b), got in zip(configs, pairs, run_lane(harness, configs, pairs)):
        assert np.array_equal(got, libm_reference(a, b, *config[3:], config[2])), config
    # On that row a = 1 gives t = 0, not lo (numeric.fma_f32 rounds that u to infinity).
    assert run_lane(harness, [edge], [(np.array([1]), np.array([31]))])[0][0] == 0


# -- Amaranth simulator: the rounding mutant ---------------------------------------------------

class LaneRoundingHalfUp(EltwiseAddLane):
    """Every rounding step ties away from zero: must be caught."""

    @staticmethod
    def round_half_even(value, drop):
        return value[drop:] + value[drop - 1]


def test_rounding_half_up_is_caught():
    """Pairs where one tie decides the output, in the u, t and rint tie classes."""
    rng = np.random.default_rng(7)
    chosen = [list(u_tie_constants(rng))[0], list(t_tie_constants(rng))[0],
              (False, False, False, F32(0.5), F32(0.5), F32(0.0))]
    pairs = []
    for config in chosen:
        a, b = code_pairs(config[0], config[1])
        expected = reference(a, b, *config[3:], config[2])
        sensitive = np.flatnonzero(variant("u ties away", a, b, *config[3:], config[2])
                                   != expected)
        sensitive = np.union1d(sensitive, np.flatnonzero(
            variant("t ties away", a, b, *config[3:], config[2]) != expected))
        sensitive = np.union1d(sensitive, np.flatnonzero(
            variant("rint ties away", a, b, *config[3:], config[2]) != expected))
        pick = rng.choice(sensitive, min(60, sensitive.size), replace=False)
        assert pick.size >= 20
        pairs.append((a[pick], b[pick]))
    vectors = concat([padded_vectors(c, a, b) for c, (a, b) in zip(chosen, pairs)])
    expected = np.concatenate([
        np.concatenate([reference(a, b, *c[3:], c[2]), np.zeros(LATENCY, np.int64)])
        for c, (a, b) in zip(chosen, pairs)])
    valid = vectors["valid"].astype(bool)
    n = vectors["a"].size
    results = [simulate_vectors(lane, vectors, flush=LATENCY)["y"][LATENCY:LATENCY + n]
               for lane in (OwnProducts(EltwiseAddLane()), OwnProducts(LaneRoundingHalfUp()))]
    assert np.array_equal(results[0][valid], expected[valid])
    assert np.count_nonzero(results[1][valid] != expected[valid]) > 60


# -- Amaranth simulator: the stream wrapper with back-pressure ---------------------------------

def stream_config(rng, swap):
    stream_signed, shortcut_signed, out_signed = signedness(rng)
    scales = np.exp2(rng.uniform(-6, -2, 3)).astype(np.float32)
    zps = [int(rng.choice(codes(s))) for s in (stream_signed, shortcut_signed, out_signed)]
    a_index, b_index = (1, 0) if swap else (0, 1)              # A is the shortcut when swapped
    r_a, r_b, fixed = qlinear_add_params(scales[a_index], zps[a_index], scales[b_index],
                                         zps[b_index], scales[2], zps[2])
    return {"enable": 1, "stream_signed": int(stream_signed),
            "shortcut_signed": int(shortcut_signed), "swap": int(swap),
            "r_a": f32_bits(r_a), "r_b": f32_bits(r_b), "fixed": f32_bits(fixed),
            "out_signed": int(out_signed)}, (r_a, r_b, fixed)


def random_codes(rng, signed, shape) -> np.ndarray:
    return rng.choice(codes(signed), shape).astype(np.int8 if signed else np.uint8)


@pytest.mark.parametrize("lanes, c, h, w, swap, seed", [
    (8, 16, 3, 4, 0, 1), (8, 12, 2, 3, 1, 2), (4, 6, 3, 3, 0, 3), (2, 3, 4, 5, 1, 4),
])
def test_eltwise_add_stream_matches_numeric(lanes, c, h, w, swap, seed):
    rng = np.random.default_rng(seed)
    config, constants = stream_config(rng, swap)
    x = random_codes(rng, config["stream_signed"], (c, h, w))
    shortcut = random_codes(rng, config["shortcut_signed"], (c, h, w))
    dut = EltwiseAdd(lanes)
    run = run_streams(dut, {"i_stream": beats_of(x, lanes), "s_stream": beats_of(shortcut, lanes)},
                      len(beats_of(x, lanes)), config=config, rng=rng, stall=0.4)
    got = tensor_of(run.beats, c, h, w, lanes, bool(config["out_signed"]))
    # As the golden model: A, B = (shortcut, stream) if eltwise_swap else (stream, shortcut).
    a_codes, b_codes = (shortcut, x) if swap else (x, shortcut)
    expected = reference(a_codes, b_codes, *constants, bool(config["out_signed"]))
    assert np.array_equal(got, expected), np.argwhere(got != expected)[:5]
    assert run.extra == 0


def test_eltwise_add_throughput_and_bypass():
    rng = np.random.default_rng(6)
    dut = EltwiseAdd(8)
    config, constants = stream_config(rng, 0)
    x = random_codes(rng, config["stream_signed"], (8, 6, 6))
    shortcut = random_codes(rng, config["shortcut_signed"], (8, 6, 6))
    beats = beats_of(x, 8)
    run = run_streams(dut, {"i_stream": beats, "s_stream": beats_of(shortcut, 8)}, len(beats),
                      config=config, rng=rng, stall=0)
    assert run.cycles <= len(beats) + LATENCY + 1
    assert np.array_equal(tensor_of(run.beats, 8, 6, 6, 8, bool(config["out_signed"])),
                          reference(x, shortcut, *constants, bool(config["out_signed"])))
    # Bypass: the stream passes unchanged, the shortcut stream is never read.
    run = run_streams(dut, {"i_stream": beats}, len(beats), config={"enable": 0}, rng=rng)
    assert run.beats == beats and run.extra == 0
