"""Residual add (Eltwise.ADD): onnxruntime's QLinearAdd, bit for bit.

The numeric contract (:func:`sfnpu.numeric.qlinear_add_codes`) is::

    u = fma(b, r_b, fixed)                  float32 fused multiply-add: one rounding, ties to even
    t = fma(a, r_a, u)                      the same
    y = sat8(cvtps_epi32(t))                ties to even; |t| ≥ 2³¹ or NaN → lo

for the (signed-interpreted) codes ``a`` and ``b`` and the three float32 constants of
:func:`sfnpu.numeric.qlinear_add_params`. The zero points are folded into ``fixed``, so nothing
here is an integer sum, and each of the three roundings can decide ``y`` (``u`` can be large and
cancelled by ``a·r_a``; ``u`` or ``t`` can be a tie, or land a hair off a half-integer).

Each fused multiply-add is exact in the classic way. The product of the code (8-bit magnitude)
and a constant's significand has at most 32 bits; the addend is aligned against it in a 62-bit
window, with the addend's bits worth less than ⅛ of the product's last bit folded into a sticky
bit (the product is then ≥ 2²³ such units, so those bits can only break ties); an addend whose
last bit lies 34 or more places above the product's is the result as it stands. The window sum
is normalised and rounded once to 24 significant bits. Exponents are kept wide: results below
the float32 normal range are not rounded to subnormals, which changes nothing here (such a ``u``
only ever acts through its sign and being non-zero, as every ``t`` that can round to a non-zero
integer has its rounding points on a coarser grid). ``u`` from 2¹²⁸ − 2¹⁰³ up (after IEEE
rounding) is infinite, and every infinite or NaN constant or intermediate makes ``t`` infinite
or NaN: the result is then ``lo``, as ``cvtps_epi32`` gives INT32_MIN. The last step converts
``t`` like :class:`~sfnpu.hw.chscale.ChannelScaleLane`: ``|t| < ½`` gives 0, ``|t| ≥ 2¹⁰``
saturates by sign (``t ≥ 2³¹`` and ``t ≤ −2³¹`` give ``lo``), anything between is rounded to an
integer.

:class:`EltwiseAdd` runs ``lanes`` such lanes on the conv/post-chain stream and the shortcut
stream, one beat of each per output beat.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from . import pipeline
from .beat import code_beat, pass_through
from .held_output import HeldOutput
from .requant import FLOAT32_BIAS, Requantizer
from .shared_product import Product, lane_products, products_members

__all__ = ["EltwiseAddLane", "EltwiseAdd"]

#: Width of the exact sum window of one fused multiply-add, in units of 2^−4 of the product's
#: last bit: the product occupies bits 4…35, the addend up to bit 60, the sticky bit is bit 0.
_WINDOW = 62
#: The addend is the result when its last bit is this many places above the product's.
_ADDEND_DOMINATES = 34
#: The addend is only a sticky bit when its last bit is this many places below the product's.
_ADDEND_STICKY = -27
#: |t| ≥ 2^10 saturates: 2^10 − 256 already lies beyond every output range.
_SATURATION_EXPONENT = 10
#: Exponents of decoded constants and intermediate results (unbiased, |E| < 2^9).
_EXPONENT = signed(11)


class _Float:
    """A float32 value unpacked for the datapath: ``significand · 2^(exponent − 23)`` with the
    significand normalised (bit 23 set) unless ``zero``; subnormals are normalised too."""

    def __init__(self, zero, negative, exponent, significand):
        self.zero = zero
        self.negative = negative
        self.exponent = exponent
        self.significand = significand

    @classmethod
    def decode(cls, m, bits, name):
        """Unpack a float32 bit pattern; returns the value and its ±infinity/NaN flag."""
        biased = bits[23:31]
        fraction = bits[:23]
        subnormal_zeros = Signal(range(32), name=f"{name}_subnormal_zeros")
        m.d.comb += subnormal_zeros.eq(pipeline.leading_zeros(fraction))
        exponent = Signal(_EXPONENT, name=f"{name}_exponent")
        significand = Signal(24, name=f"{name}_significand")
        with m.If(biased == 0):                  # subnormal: fraction · 2^−149, normalised
            m.d.comb += [
                exponent.eq(-FLOAT32_BIAS - subnormal_zeros),
                significand.eq((fraction << (subnormal_zeros + 1))[:24]),
            ]
        with m.Else():
            m.d.comb += [
                exponent.eq(biased - FLOAT32_BIAS),
                significand.eq(Cat(fraction, 1)),
            ]
        value = cls((biased == 0) & (fraction == 0), bits[31], exponent, significand)
        return value, biased == 0xFF


class EltwiseAddLane(wiring.Component):
    """One lane of :class:`EltwiseAdd`: ``y`` from the codes ``a`` and ``b``, bit-exact with
    :func:`sfnpu.numeric.qlinear_add_codes` for every pair of codes and every float32
    constant (zero, subnormal, negative, huge; ±infinity and NaN give ``lo``, as numpy does).
    The fused multiply-adds round as IEEE 754 does (as the C library's ``fmaf``), also in the
    one corner where :func:`sfnpu.numeric.fma_f32` does not: a sum just below the midpoint
    between FLT_MAX and 2¹²⁸ (with bits beyond float64 precision) rounds to FLT_MAX, not to
    infinity.

    Signature
    ---------
    a, b : In(8)
        Raw codes of onnxruntime's operands A (multiplied by ``r_a``) and B (by ``r_b``).
    valid : In(1)
        Marks a meaningful input; delayed alongside the data.
    a_signed, b_signed : In(1)
        Configuration: ``a`` / ``b`` are int8 (1) or uint8 (0).
    r_a, r_b, fixed : In(32)
        Configuration: float32 bit patterns of the constants of
        :func:`sfnpu.numeric.qlinear_add_params` (the post record's ``eltwise_const``).
    out_signed : In(1)
        Configuration: output is int8 (1) or uint8 (0); ``y`` lies in that range.
    y : Out(signed(9))
        The result (its low 8 bits are the output code).
    y_valid : Out(1)
        ``valid`` delayed by :attr:`LATENCY`.
    u_product, t_product : Out(:attr:`PRODUCT`)
        The two fused multiply-adds' multipliers, outside the lane
        (:func:`~.shared_product.multiply`; the product is registered there, the stage the
        lane counts in its latency).

    Configuration inputs must be stable while the pipeline holds a valid input.

    Timing: fully pipelined, free-running, one input per cycle; ``y`` follows its inputs after
    :attr:`LATENCY` (15) cycles. Stage 0 registers the codes and the decoded constants;
    then, for each fused multiply-add ``m·x + c`` (1–6:
    ``u = fma(b, r_b, fixed)``, 7–12: ``t = fma(a, r_a, u)``):
    1. ``|m|`` × 24-bit significand of ``x`` (≤ 32 bits); ``c`` aligned to it in the window;
    2. sum or difference of product and addend (exact but for the sticky bit);
    3. its magnitude;
    4. leading zeros;
    5. normalisation to 24 bits, the guard and the sticky bit;
    6. rounding to 24 significant bits, to nearest even (or ``c`` as it stands).
    Then 13. ``t`` to an integer, ties to even, or saturation; 14. clamp to the output range.
    """

    #: Cycles from the inputs to ``y``.
    LATENCY = 15
    #: Each fused multiply-add's product: a code's magnitude × a constant's significand,
    #: registered outside the lane (stages 1 and 7).
    PRODUCT = Product(8, 24, 32)

    #: Round to nearest, ties to even, at a fixed bit position (shared with the requantiser;
    #: overridable, so a test can check that a broken rounding is caught).
    round_half_even = staticmethod(Requantizer.round_half_even)

    def __init__(self):
        super().__init__({
            "a": In(8),
            "b": In(8),
            "valid": In(1),
            "a_signed": In(1),
            "b_signed": In(1),
            "r_a": In(32),
            "r_b": In(32),
            "fixed": In(32),
            "out_signed": In(1),
            "y": Out(signed(9)),
            "y_valid": Out(1),
            "u_product": Out(self.PRODUCT),
            "t_product": Out(self.PRODUCT),
        })

    def elaborate(self, platform):
        m = Module()

        def stage(value, name, shape=None):
            return pipeline.stage(m, value, name, shape)

        def delay(value, cycles, name):
            return pipeline.delay(m, value, cycles, name)

        def fma(prefix, code, x, c, c_is_data):
            """Six pipeline stages of ``code · x + c`` (``code`` signed(10), ``x`` a decoded
            constant, ``c`` decoded; registered along the pipeline only if ``c_is_data``).
            Returns the rounded result as a :class:`_Float` (exponent range unbounded)."""
            def carry(value, index):
                """``c``, as seen by stage ``index`` (a configuration constant is not delayed)."""
                if not c_is_data:
                    return value
                return _Float(*(stage(v, f"{prefix}_s{index}_c_{n}") for v, n in (
                    (value.zero, "zero"), (value.negative, "negative"),
                    (value.exponent, "exponent"), (value.significand, "significand"))))

            # -- 1: the product |code|·X (X the significand of x) and the aligned addend.
            # In units of 2^(Ex − 27) the product is P·2^4 with 2^27 ≤ P·2^4 < 2^36 (unless 0)
            # and the addend C = Sc·2^(d + 4), d = Ec − Ex.
            negative_code = code < 0
            magnitude = Mux(negative_code, -code, code)[:8]
            # (the multiplier, one stage, is outside the lane: hw.shared_product)
            port = getattr(self, f"{prefix}_product")
            m.d.comb += [port.a.eq(magnitude), port.b.eq(x.significand)]
            product = port.p
            d = Signal(_EXPONENT, name=f"{prefix}_d")
            m.d.comb += d.eq(c.exponent - x.exponent)
            shift = Signal(range(_ADDEND_DOMINATES - _ADDEND_STICKY), name=f"{prefix}_shift")
            m.d.comb += shift.eq(d - _ADDEND_STICKY - 1)          # d + 26 ∈ [0, 59]
            # The addend placed at bit d + 26 (window bit w is bit w + 22 here); bits below the
            # window's bit 1 become the sticky bit 0: they are below ⅛ of the product's unit,
            # and the product is then ≥ 2^23 units, so they only ever break ties.
            placed = (c.significand << shift)[:_WINDOW + 22]
            aligned = Signal(_WINDOW, name=f"{prefix}_aligned")
            with m.If(c.zero):
                m.d.comb += aligned.eq(0)
            with m.Elif(d <= _ADDEND_STICKY):
                m.d.comb += aligned.eq(1)
            with m.Else():
                m.d.comb += aligned.eq(Cat(placed[:23].any(), placed[23:]))
            s1_addend = stage(aligned, f"{prefix}_s1_addend")
            s1_product_negative = stage(negative_code ^ x.negative,
                                        f"{prefix}_s1_product_negative")
            s1_subtract = stage(negative_code ^ x.negative ^ c.negative, f"{prefix}_s1_subtract")
            # The result is c itself: no product, or an addend so large that the product is
            # below a quarter of its last place (a rounding step of the result).
            s1_use_addend = stage((code == 0) | x.zero | (~c.zero & (d >= _ADDEND_DOMINATES)),
                                  f"{prefix}_s1_use_addend")
            c1 = carry(c, 1)

            # -- 2: ±(P ± C), exact: the sum's sign is the product's unless P − C < 0.
            product_w = Cat(Const(0, 4), product)
            total = product_w + Mux(s1_subtract, -s1_addend, s1_addend)
            s2_sum = stage(total, f"{prefix}_s2_sum", signed(_WINDOW + 1))
            s2_product_negative = stage(s1_product_negative, f"{prefix}_s2_product_negative")
            s2_use_addend = stage(s1_use_addend, f"{prefix}_s2_use_addend")
            c2 = carry(c1, 2)

            # -- 3: magnitude.
            s3_magnitude = stage(Mux(s2_sum < 0, -s2_sum, s2_sum), f"{prefix}_s3_magnitude",
                                 _WINDOW)
            s3_negative = stage(s2_product_negative ^ (s2_sum < 0), f"{prefix}_s3_negative")
            s3_use_addend = stage(s2_use_addend, f"{prefix}_s3_use_addend")
            c3 = carry(c2, 3)

            # -- 4: leading zeros.
            s4_zeros = stage(pipeline.leading_zeros(s3_magnitude), f"{prefix}_s4_zeros", range(64))
            s4_magnitude = stage(s3_magnitude, f"{prefix}_s4_magnitude")
            s4_zero = stage(s3_magnitude == 0, f"{prefix}_s4_zero")
            s4_negative = stage(s3_negative, f"{prefix}_s4_negative")
            s4_use_addend = stage(s3_use_addend, f"{prefix}_s4_use_addend")
            c4 = carry(c3, 4)

            # -- 5: normalise: leading one to bit 61; keep 24 bits and the guard bit.
            normalised = s4_magnitude
            for bit in reversed(range(len(s4_zeros))):  # large steps first: fewer bits kept
                normalised = Mux(s4_zeros[bit], normalised << (1 << bit), normalised)[:_WINDOW]
            s5_top = stage(normalised[_WINDOW - 25:], f"{prefix}_s5_top")      # 24 + guard
            # The sticky bit of the rounding, from the registered count beside the shifts:
            # bit i lies below the guard bit when i + 25 ≤ 61 − zeros, the leading one's bit.
            # (i + zeros < 37 as zeros < 37 − i: a comparison with a constant, no adder)
            below_guard = Cat(*(s4_zeros < _WINDOW - 25 - i for i in range(_WINDOW - 25)))
            s5_sticky = stage((s4_magnitude[:_WINDOW - 25] & below_guard).any(),
                              f"{prefix}_s5_sticky")
            # Leading one at window bit k = 61 − zeros, worth 2^(k − 27 + Ex).
            s5_exponent = stage(_WINDOW - 1 - 27 - s4_zeros + x.exponent,
                                f"{prefix}_s5_exponent", _EXPONENT)
            s5_zero = stage(s4_zero, f"{prefix}_s5_zero")
            s5_negative = stage(s4_negative, f"{prefix}_s5_negative")
            s5_use_addend = stage(s4_use_addend, f"{prefix}_s5_use_addend")
            c5 = carry(c4, 5)

            # -- 6: round to 24 bits, nearest even; or the addend as it stands.
            rounded = self.round_half_even(Cat(s5_sticky, s5_top), 2)          # 25 bits
            rounding_carry = rounded[24]
            result = _Float(
                Signal(name=f"{prefix}_zero", reset_less=True),
                Signal(name=f"{prefix}_negative", reset_less=True),
                Signal(_EXPONENT, name=f"{prefix}_exponent", reset_less=True),
                Signal(24, name=f"{prefix}_significand", reset_less=True))
            with m.If(s5_use_addend):
                m.d.sync += [
                    result.zero.eq(c5.zero), result.negative.eq(c5.negative),
                    result.exponent.eq(c5.exponent), result.significand.eq(c5.significand),
                ]
            with m.Else():
                m.d.sync += [
                    result.zero.eq(s5_zero), result.negative.eq(s5_negative),
                    result.exponent.eq(s5_exponent + rounding_carry),
                    result.significand.eq(Mux(rounding_carry, rounded[1:], rounded[:24])),
                ]
            return result

        valid = self.valid
        for index in range(self.LATENCY - 1):
            valid = stage(valid, f"valid_{index + 1}")
        m.d.sync += self.y_valid.eq(valid)

        # -- stage 0: the codes, and the constants decoded (a subnormal's normalisation would
        # otherwise run into stage 1's multipliers). The constants are configuration, identical
        # in every lane (synthesis keeps one copy), used by stages 1 and 7.
        def decoded(bits, name):
            value, special = _Float.decode(m, bits, name)
            return _Float(*(stage(getattr(value, field), f"s0_{name}_{field}") for field in
                            ("zero", "negative", "exponent", "significand"))), special

        r_a, r_a_special = decoded(self.r_a, "r_a")
        r_b, r_b_special = decoded(self.r_b, "r_b")
        fixed, fixed_special = decoded(self.fixed, "fixed")
        constant_special = stage(r_a_special | r_b_special | fixed_special, "s0_special")

        a_value = stage(Mux(self.a_signed, self.a.as_signed(), self.a), "s0_a")
        b_value = stage(Mux(self.b_signed, self.b.as_signed(), self.b), "s0_b")
        a_delayed = delay(a_value, 6, "a")

        # -- stages 1–6: u = fma(b, r_b, fixed) --------------------------------------------------
        u = fma("u", b_value, r_b, fixed, c_is_data=False)
        # u beyond the float32 range (≥ 2^128 after rounding) is infinite: t is ±inf or NaN.
        u_infinite = ~u.zero & (u.exponent > FLOAT32_BIAS)

        # -- stages 7–12: t = fma(a, r_a, u) -----------------------------------------------------
        t = fma("t", a_delayed, r_a, u, c_is_data=True)
        t_to_lo = delay(u_infinite, 6, "u_infinite") | constant_special

        # -- stage 13: rint, or saturation --------------------------------------------------------
        # t = S·2^(E − 23); for −1 ≤ E < 10, t·2^24 = S·2^(E + 1) is an integer.
        in_range = (t.exponent >= -1) & (t.exponent < _SATURATION_EXPONENT)
        shift = Signal(range(_SATURATION_EXPONENT + 1))
        m.d.comb += shift.eq(Mux(in_range, t.exponent + 1, 0))
        integer = self.round_half_even(t.significand << shift, 24)          # ≤ 2^10
        # Sign and magnitude: the negation waits for stage 14, beside the clamp's comparisons.
        s13_magnitude = stage(Mux(t.zero | ~in_range, 0, integer), "s13_magnitude", 11)
        s13_negative = stage(t.negative, "s13_negative")
        saturates = ~t.zero & (t.exponent >= _SATURATION_EXPONENT)
        # cvtps_epi32: t ≥ 2^31 is INT32_MIN, like every t ≤ −2^31 and every NaN.
        beyond_int32 = ~t.zero & (t.exponent >= 31)
        s13_to_lo = stage(t_to_lo | beyond_int32 | (saturates & t.negative), "s13_to_lo")
        s13_to_hi = stage(~t_to_lo & saturates & ~beyond_int32 & ~t.negative, "s13_to_hi")

        # -- stage 14: clamp ---------------------------------------------------------------------
        lo = Mux(self.out_signed, -128, 0)
        hi = Mux(self.out_signed, 127, 255)
        above = ~s13_negative & (s13_magnitude > hi)
        below = s13_negative & Mux(self.out_signed, s13_magnitude > 128, s13_magnitude != 0)
        with m.If(s13_to_lo):
            m.d.sync += self.y.eq(lo)
        with m.Elif(s13_to_hi | above):
            m.d.sync += self.y.eq(hi)
        with m.Elif(below):
            m.d.sync += self.y.eq(lo)
        with m.Else():
            m.d.sync += self.y.eq(Mux(s13_negative, -s13_magnitude, s13_magnitude))
        return m


class EltwiseAdd(wiring.Component):
    """Element-wise add of the shortcut stream (QLinearAdd), with its own requantisation.

    Parameters
    ----------
    lanes : int
        Codes per beat (``HwConfig.lanes``).
    shared_products : bool
        The lanes' multipliers are outside the unit (``u_products``, ``t_products``).

    Signature
    ---------
    i_stream : In(stream.Signature(ArrayLayout(8, lanes)))
        The stream operand (the conv/post-chain output).
    s_stream : In(stream.Signature(ArrayLayout(8, lanes)))
        The shortcut tensor: exactly one beat per ``i_stream`` beat (same pixel, same channel
        block), taken together with it.
    o_stream : Out(stream.Signature(ArrayLayout(8, lanes)))
        Sums, one beat per input beat.
    enable : In(1)
        Configuration: 0 bypasses the stage (``o_stream`` is ``i_stream``, combinationally;
        ``s_stream`` is not read).
    stream_signed, shortcut_signed : In(1)
        Configuration: the stream / shortcut codes are int8 (1) or uint8 (0).
    swap : In(1)
        Configuration (post record ``eltwise_swap``): 0 — onnxruntime's operand A is the
        stream and B the shortcut; 1 — A is the shortcut, B the stream.
    r_a, r_b, fixed : In(32)
        Configuration: float32 bit patterns (post record ``eltwise_const[0..2]``).
    out_signed : In(1)
        Configuration: the output is int8 (1) or uint8 (0).
    u_products, t_products : Out(EltwiseAddLane.PRODUCT).array(lanes)
        With ``shared_products``: the lanes' multipliers, built by the owner
        (:func:`~.shared_product.multiply`), which may share them with a unit never enabled
        together with this one; otherwise each lane has its own.

    Configuration may change only between groups: once every input beat has been accepted
    and every output beat delivered.

    Timing: one beat per cycle; latency :attr:`LATENCY` (15) cycles. A beat enters when both
    input streams offer one; a stall on ``o_stream`` holds the pipeline as a whole, so nothing
    inside is lost or duplicated (:class:`~.held_output.HeldOutput`: the lanes run on and
    their beats wait in a small queue; the handshakes are those of a clock-enable hold).
    """

    LATENCY = EltwiseAddLane.LATENCY

    def __init__(self, lanes: int, shared_products: bool = False):
        if lanes < 1:
            raise ValueError(f"lanes must be positive, not {lanes}")
        self.lanes = lanes
        self.shared_products = shared_products
        beat = code_beat(lanes)
        super().__init__({
            "i_stream": In(beat),
            "s_stream": In(beat),
            "o_stream": Out(beat),
            "enable": In(1),
            "stream_signed": In(1),
            "shortcut_signed": In(1),
            "swap": In(1),
            "r_a": In(32),
            "r_b": In(32),
            "fixed": In(32),
            "out_signed": In(1),
            **products_members({"u": EltwiseAddLane.PRODUCT, "t": EltwiseAddLane.PRODUCT},
                               lanes, shared_products),
        })

    def elaborate(self, platform):
        m = Module()

        # The lanes run freely; their output waits in ``held``, whose handshakes are those
        # of the lanes held as a whole while the output waits (hw.held_output).
        m.submodules.held = held = HeldOutput(8 * self.lanes, self.LATENCY)
        advance = held.advance
        accept = Signal()
        m.d.comb += [accept.eq(self.enable & advance & self.i_stream.valid
                               & self.s_stream.valid),
                     held.accept.eq(accept)]

        for lane in range(self.lanes):
            m.submodules[f"lane_{lane}"] = unit = EltwiseAddLane()
            lane_products(m, self, unit, lane, ("u", "t"))
            stream_code = self.i_stream.payload[lane]
            shortcut_code = self.s_stream.payload[lane]
            m.d.comb += [
                unit.a.eq(Mux(self.swap, shortcut_code, stream_code)),
                unit.b.eq(Mux(self.swap, stream_code, shortcut_code)),
                unit.a_signed.eq(Mux(self.swap, self.shortcut_signed, self.stream_signed)),
                unit.b_signed.eq(Mux(self.swap, self.stream_signed, self.shortcut_signed)),
                unit.valid.eq(accept),
                unit.r_a.eq(self.r_a), unit.r_b.eq(self.r_b), unit.fixed.eq(self.fixed),
                unit.out_signed.eq(self.out_signed),
                held.payload[8 * lane:8 * (lane + 1)].eq(unit.y[:8]),
            ]

        with m.If(self.enable):
            m.d.comb += [
                self.o_stream.payload.eq(held.o_stream.payload),
                self.o_stream.valid.eq(held.o_stream.valid),
                held.o_stream.ready.eq(self.o_stream.ready),
                self.i_stream.ready.eq(advance & self.s_stream.valid),
                self.s_stream.ready.eq(advance & self.i_stream.valid),
            ]
        with m.Else():
            m.d.comb += pass_through(self.i_stream, self.o_stream)
        return m
