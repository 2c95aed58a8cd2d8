"""Float32-exact requantiser: int32 accumulator → 8-bit output, as onnxruntime computes it.

The numeric contract (:func:`sfnpu.numeric.requantize`) is
``clamp(rint(float32(acc) · m) + zp, lo, hi)`` with every rounding to nearest, ties to even:
int32 → float32 (24-bit significand), the float32 product (24×24-bit significand product
rounded back to 24 bits), and float → integer. A fixed-point multiply-and-shift rounds once and
differs at ties; this block performs the three roundings in the same order.

Only results within the clamp range need their exact value: a rounded product of magnitude below
½ is 0 and one of at least 2^width clamps to ``lo`` or ``hi`` whatever ``zp`` is. So the
datapath keeps the float32 exponent only to decide those two cases and converts the significand
to an integer with a short (width+1)-position shifter.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from . import pipeline
from .pipeline import round_half_even, split_significand_product

__all__ = ["Requantizer", "FLOAT32_BIAS"]

#: IEEE 754 binary32 exponent bias.
FLOAT32_BIAS = 127
_MANTISSA_BITS = 23          # stored fraction bits; the significand has 24 with the hidden one


class Requantizer(wiring.Component):
    """``y = clamp(rint(float32(acc) · multiplier) + zero_point, lo, hi)``, bit-exact with
    :func:`sfnpu.numeric.requantize` (``min(max(·, lo), hi)``, as ``numpy.clip``).

    Parameters
    ----------
    width : int
        Signed width of ``zero_point``, ``lo``, ``hi`` and ``y``. The default 9 covers both
        int8 (−128..127) and uint8 (0..255) outputs and zero points.

    Signature
    ---------
    acc : In(signed(32))
        Accumulator; every int32 value is supported.
    multiplier : In(32)
        IEEE 754 binary32 bit pattern of the requantisation multiplier.
    zero_point, lo, hi : In(signed(width))
        Output zero point and clamp bounds; sampled with ``acc`` (they may change per cycle).
    valid : In(1)
        Marks a meaningful input; delayed alongside the data.
    y : Out(signed(width))
        The requantised value.
    y_valid : Out(1)
        ``valid`` delayed by :attr:`LATENCY`.
    invalid : Out(1)
        The multiplier was ±infinity or NaN (no defined result; ``y`` is then
        ``clamp(zero_point, lo, hi)``).

    Supported multipliers: every finite float32, either sign. numpy's reference is itself only
    defined while ``|float32(acc) · m| < 2⁶³`` (it casts to int64), i.e. for ``|m| < 2³²``; the
    block keeps saturating beyond that, and for products that overflow float32 to infinity,
    as onnxruntime's MLAS does (it clamps in float before converting).
    Subnormal and zero multipliers give ``rint(·) = 0`` (``|acc · m| < 2⁻⁹⁵``).

    Timing: fully pipelined, one input per cycle, no back-pressure; the result of the inputs
    applied in cycle *k* is on ``y`` in cycle *k* + :attr:`LATENCY` (7). Stages:
    0. the magnitude of ``acc`` and its leading one (side by side);
    1. int32 → float32 (normalise, round to 24 bits);
    2. 24×24-bit significand product and exponent sum, in two stages: the product of the
       significands' top 18 bits (one MULT18X18D) beside the narrow cross products in
       logic, then their sum (:func:`~sfnpu.hw.pipeline.split_significand_product`);
    3. round the 48-bit product to 24 bits (the float32 product);
    4. round to an integer (or 0 / saturate, by exponent);
    5. apply the sign, add the zero point and clamp.
    """

    #: Cycles from ``acc`` to ``y``.
    LATENCY = 7

    def __init__(self, width: int = 9):
        if not 2 <= width <= 24:
            raise ValueError(f"width must be 2..24, not {width}")
        self.width = width
        super().__init__({
            "acc": In(signed(32)),
            "multiplier": In(32),
            "zero_point": In(signed(width)),
            "lo": In(signed(width)),
            "hi": In(signed(width)),
            "valid": In(1),
            "y": Out(signed(width)),
            "y_valid": Out(1),
            "invalid": Out(1),
        })

    @property
    def saturation_exponent(self) -> int:
        """K: a rounded product ≥ 2^K in magnitude clamps to ``lo``/``hi`` for every ``zp``,
        ``lo``, ``hi`` of this width, as 2^K − 2^(width−1) > 2^(width−1) − 1 for K = width."""
        return self.width

    # -- rounding helper (overridable, so a test can check that a broken rounding is caught) --

    round_half_even = staticmethod(round_half_even)

    def elaborate(self, platform):
        m = Module()
        K = self.saturation_exponent

        def stage(value, name, shape=None):
            return pipeline.stage(m, value, name, shape)

        def delay(value, cycles, name):
            return pipeline.delay(m, value, cycles, name)

        # -- stage 0: |acc| and its leading zeros, side by side ------------------------------
        # The leading zeros are those of the one's complement ~acc = |acc| − 1 of a negative
        # acc, so that they need not wait for the negation's carry chain: they are |acc|'s,
        # or one more when |acc| is a power of two (stage 1 finds out). 0 counts 31 of them.
        acc_negative = self.acc[31]
        magnitude = Signal(32)              # |−2³¹| = 2³¹ still fits unsigned
        m.d.comb += magnitude.eq(Mux(acc_negative, -self.acc, self.acc))
        ones = Signal(32)
        m.d.comb += ones.eq(Mux(acc_negative, ~self.acc, self.acc))
        leading_zeros = Signal(range(32))   # 31 for 0, as for 1
        m.d.comb += leading_zeros.eq(pipeline.leading_zeros(ones))

        m_sign = self.multiplier[31]
        m_exponent_bits = self.multiplier[_MANTISSA_BITS:31]
        m_fraction = self.multiplier[:_MANTISSA_BITS]

        s0_magnitude = stage(magnitude, "s0_magnitude", 32)
        s0_leading_zeros = stage(leading_zeros, "s0_leading_zeros", range(32))
        s0_zero = stage((self.acc == 0) | (m_exponent_bits == 0), "s0_zero")
        s0_invalid = stage(m_exponent_bits == 0xFF, "s0_invalid")
        s0_negative = stage(acc_negative ^ m_sign, "s0_negative")
        s0_m_exponent = stage(m_exponent_bits, "s0_m_exponent")
        s0_m_significand = stage(Cat(m_fraction, Const(1, 1)), "s0_m_significand")

        # -- stage 1: int32 → float32 (normalise, round to nearest even) ----------------------
        # Shifted by the count of stage 0, the leading one is at bit 31, or at bit 32 when the
        # count was one too many.
        shifted = Signal(33)
        m.d.comb += shifted.eq(s0_magnitude << s0_leading_zeros)
        overshoot = shifted[32]
        normalised = Signal(32)             # leading one moved to bit 31
        m.d.comb += normalised.eq(Mux(overshoot, shifted[1:], shifted[:32]))
        rounded = self.round_half_even(normalised, 32 - 24)       # 25 bits
        # A carry out of the significand (…111.1 → 1000…) bumps the exponent; the significand
        # is then exactly 2^23 (rounded >> 1).
        acc_carry = rounded[24]
        acc_significand = Mux(acc_carry, rounded[1:], rounded[:24])
        # float32(|acc|) in [2^e, 2^e+1)
        acc_exponent = 31 - s0_leading_zeros + overshoot + acc_carry

        s1_significand = stage(acc_significand, "s1_significand", 24)
        s1_exponent = stage(acc_exponent, "s1_exponent", range(33))
        s1_zero = stage(s0_zero, "s1_zero")
        s1_invalid = stage(s0_invalid, "s1_invalid")
        s1_negative = stage(s0_negative, "s1_negative")
        s1_m_exponent = stage(s0_m_exponent, "s1_m_exponent")
        s1_m_significand = stage(s0_m_significand, "s1_m_significand")

        # -- stage 2: significand product ------------------------------------------------------
        # float32(acc) = A·2^(e−23), m = M·2^(E−127−23), A, M ∈ [2^23, 2^24): the exact product
        # is P·2^(e+E−173), P ∈ [2^46, 2^48). Reading P's top bit as 2^46 gives the exponent
        # e + E − 127 (one more when bit 47 is set).
        # Two register stages (one multiplier and narrow products in logic, then their sum):
        # a MULT18X18D per product instead of four, no adder behind it.
        s2_product = split_significand_product(m, s1_significand, s1_m_significand,
                                               "s2_product")
        s2_exponent = delay(stage(s1_exponent + s1_m_exponent - FLOAT32_BIAS, "s2_exponent",
                                  signed(10)), 1, "s2_exponent")
        s2_zero = delay(s1_zero, 2, "s2_zero")
        s2_invalid = delay(s1_invalid, 2, "s2_invalid")
        s2_negative = delay(s1_negative, 2, "s2_negative")

        # -- stage 3: the float32 product (48 → 24 significant bits, nearest even) -------------
        high = s2_product[47]
        product_rounded = Mux(high, self.round_half_even(s2_product, 24),
                              self.round_half_even(s2_product[:47], 23))   # 25 bits
        product_carry = product_rounded[24]
        product_significand = Mux(product_carry, product_rounded[1:], product_rounded[:24])
        product_exponent = s2_exponent + high + product_carry    # |p| in [2^X, 2^X+1)

        s3_significand = stage(product_significand, "s3_significand", 24)
        s3_exponent = stage(product_exponent, "s3_exponent", signed(10))
        s3_zero = stage(s2_zero, "s3_zero")
        s3_invalid = stage(s2_invalid, "s3_invalid")
        s3_negative = stage(s2_negative, "s3_negative")

        # -- stage 4: rint to an integer --------------------------------------------------------
        # |p| = S·2^(X−23). For −1 ≤ X < K, |p|·2^24 = S·2^(X+1) is an integer: shift S left
        # by X+1 ∈ [0, K], and its bits from 24 up are the integer part, bit 23 the half.
        # X ≤ −2 means |p| < ½ (X is taken after the float32 rounding): rint gives 0.
        # X ≥ K saturates; the magnitude 2^K is enough to reach either clamp bound.
        in_range = (s3_exponent >= -1) & (s3_exponent < K)
        shift = Signal(range(K + 1))
        m.d.comb += shift.eq(Mux(in_range, s3_exponent + 1, 0))
        fixed = Signal(24 + K)
        m.d.comb += fixed.eq(s3_significand << shift)
        integer = self.round_half_even(fixed, 24)                   # ≤ 2^K, K+1 bits
        magnitude_int = Signal(K + 1)
        with m.If(s3_zero | s3_invalid | (s3_exponent < -1)):
            m.d.comb += magnitude_int.eq(0)
        with m.Elif(s3_exponent >= K):
            m.d.comb += magnitude_int.eq(1 << K)
        with m.Else():
            m.d.comb += magnitude_int.eq(integer)
        # Sign and magnitude: stage 5 applies the sign as it adds the zero point.
        s4_magnitude = stage(magnitude_int, "s4_magnitude", K + 1)
        s4_negative = stage(s3_negative, "s4_negative")
        s4_invalid = stage(s3_invalid, "s4_invalid")

        # -- stage 5: the sign, the zero point and the clamp ---------------------------------
        zero_point = delay(self.zero_point, self.LATENCY - 1, "zero_point")
        lo = delay(self.lo, self.LATENCY - 1, "lo")
        hi = delay(self.hi, self.LATENCY - 1, "hi")
        shifted = Signal(signed(K + 2))            # |value| ≤ 2^K, |zp| ≤ 2^(K−1)
        m.d.comb += shifted.eq(Mux(s4_negative, zero_point - s4_magnitude,
                                   zero_point + s4_magnitude))
        raised = Mux(shifted < lo, lo, shifted)
        clamped = Mux(raised > hi, hi, raised)
        m.d.sync += [
            self.y.eq(clamped),
            self.invalid.eq(s4_invalid),
            self.y_valid.eq(delay(self.valid, self.LATENCY - 1, "valid")),
        ]
        return m
