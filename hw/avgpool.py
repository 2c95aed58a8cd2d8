"""Average pooling, onnxruntime's float path (QLinearAveragePool,
:func:`sfnpu.numeric.qlinear_avg_pool`), bit for bit, on a row-interleaved stream.

The numeric contract works in float32, every operation rounded to nearest, ties to even::

    v   = float32(x − x_zp) · x_s                    one rounding per element
    s   = (((0 + v_0) + v_1) + …) + v_{m−1}          the window clipped to the input, row by row
                                                     (padding adds +0, i.e. nothing)
    avg = s / float32(n)                             n = kernel² with count_include_pad, else m
    t   = float32(avg / y_s) + float32(y_zp)         two roundings
    y   = clamp(rint(t))                             ties to even

Float addition is not associative, so the window sum cannot be shared between overlapping
windows or split into a horizontal and a vertical stage as in :mod:`~sfnpu.hw.maxpool`: every
window is summed from its own elements, in its own order. The block keeps the last three input
rows (raw codes) in line buffers and walks each output window's elements from them.

Exact arithmetic without a general float adder
----------------------------------------------
With ``x_s = M·2^E`` (``M`` its 24-bit significand), every ``v`` is an integer multiple of
``2^E``: ``v = round24(d·M)·2^E`` where ``d = x − x_zp`` (``|d| ≤ 383``) and ``round24`` rounds
an integer to 24 significant bits (ties to even). Sums of such values are multiples of ``2^E``
too, and the float32 sum of two of them is ``round24`` of their exact integer sum (below 2^24
units the sum is exact). So the window sum is kept as an integer ``S`` in units of ``2^E``
(``|S| < 9·2^33``): each step adds ``V`` exactly (39-bit adder) and rounds to 24 significant
bits — no alignment shifter, no exponent. Only then does ``S`` become a float (sign, exponent,
24-bit significand; exact).

The two divisions are true float32 divisions (:class:`Float32Divider`: restoring division of the
significands, one or more quotient bits per cycle, round to nearest even with guard and sticky
bits). ``n`` is the float32 of a small integer (its significand ``n·2^(23−⌊log2 n⌋)``). The last
step is exact fixed-point arithmetic as in :class:`~sfnpu.hw.chscale.ChannelScaleLane`:
``|q| < ¼`` gives ``y_zp``, ``|q| ≥ 2^10`` saturates, otherwise ``q`` and ``y_zp`` are added
with 25 fraction bits (exact), the sum is rounded to 24 significant bits (the float32 sum) and
then to an integer.

Range: ``x_s`` and ``y_s`` positive normal float32 with ``x_s ≥ 2^−90`` and
``x_s / y_s < 2^40``. Then a non-zero sum is at least ``2^E > x_s·2^−24`` and the average is
normal, the quotient stays below 2^49 (finite, and within numpy's int64 cast of ``rint``), and a
subnormal quotient is negligible (below ¼) either way. The compiler sends a window equal to
the unpadded input to :class:`~sfnpu.hw.gap.GlobalAvgPool` (onnxruntime falls back to integer
arithmetic there).
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .pipeline import FLOAT32_SIGNIFICAND as _SIG
from .pipeline import round_half_even, round_significant, signed_sum_magnitude
from .beat import code_beat, pass_through
from .held_output import HeldOutput
from .line_store import line_members, line_ports
from .requant import FLOAT32_BIAS

__all__ = ["AvgPool", "Float32Divider", "SumLane", "QuantizeLane", "MAX_HEIGHT",
           "code_difference"]

#: Largest feature-map height (the ISA's 12-bit size fields).
MAX_HEIGHT = 4095
#: Windows are at most 3 × 3; padding is below the window side.
_MAX_KERNEL = 3
#: Exponent fields: value = significand · 2^exponent, significand in [2^23, 2^24).
_EXP = signed(12)
#: |V| < 383·2^24 < 2^33; |S| ≤ 9·2^33 < 2^37.
_V_BITS = 33
_S_BITS = 37
#: Fraction bits of the fixed-point sum q + y_zp (as in ChannelScaleLane).
_FRACTION_BITS = 25
#: |q| ≥ 2^10 saturates: 2^10 − 256 already lies beyond every output range.
_SATURATION_EXPONENT = 10


class Float32Divider(wiring.Component):
    """``q = a / b`` for positive float32 values given as (24-bit significand, exponent):
    ``value = significand · 2^exponent`` with the significand in ``[2^23, 2^24)``. The quotient
    is rounded to nearest, ties to even, exactly as IEEE 754 division (as long as it is
    normal: the exponent is not limited here). Signs and zeros are the caller's business;
    ``tag`` travels with the operands.

    Restoring division: ``R₀ = a`` (or ``2a`` when ``a < b``, then the quotient's exponent is
    one lower) lies in ``[b, 2b)``; each step takes one quotient bit (``R ≥ b``) and doubles the
    remainder. ``bits_per_cycle`` steps run per cycle, for ``24 + G`` bits in total
    (``G ≥ 1``: the guard bit and the first sticky bits); the final remainder completes the
    sticky bit.

    Parameters
    ----------
    bits_per_cycle : int
        Quotient bits per cycle (chained compare-and-subtract stages).
    tag_width : int
        Width of ``tag``.

    Signature
    ---------
    i_valid, i_ready : In(1), Out(1)
        Operand handshake (``i_ready``: idle and the previous result taken or being taken).
    a_sig, b_sig : In(24)
    a_exp, b_exp : In(signed(12))
    tag : In(tag_width)
    o_valid, o_ready : Out(1), In(1)
        Result handshake; the result stays until taken.
    q_sig : Out(24)
    q_exp : Out(signed(12))
    q_tag : Out(tag_width)

    Timing: operands taken in cycle *t* give ``o_valid`` in cycle ``t + cycles + 2``
    (:attr:`cycles` ``= ⌈25 / bits_per_cycle⌉`` iterations, then one cycle to round); a new
    division can start in the cycle its predecessor's result is taken.
    """

    @staticmethod
    def iterations(bits_per_cycle: int) -> int:
        """Iteration cycles of a divider producing ``bits_per_cycle`` quotient bits a cycle."""
        return -(-(_SIG + 1) // bits_per_cycle)

    def __init__(self, bits_per_cycle: int = 1, tag_width: int = 1):
        if bits_per_cycle < 1 or tag_width < 1:
            raise ValueError(f"bits_per_cycle and tag_width must be positive "
                             f"({bits_per_cycle}, {tag_width})")
        self.bits_per_cycle = bits_per_cycle
        self.tag_width = tag_width
        #: Iteration cycles (the result follows two cycles later: rounding, then o_valid).
        self.cycles = self.iterations(bits_per_cycle)
        #: Quotient bits computed: 24 for the significand, the rest guard and sticky.
        self.quotient_bits = self.cycles * bits_per_cycle
        super().__init__({
            "i_valid": In(1),
            "i_ready": Out(1),
            "a_sig": In(_SIG),
            "a_exp": In(_EXP),
            "b_sig": In(_SIG),
            "b_exp": In(_EXP),
            "tag": In(tag_width),
            "o_valid": Out(1),
            "o_ready": In(1),
            "q_sig": Out(_SIG),
            "q_exp": Out(_EXP),
            "q_tag": Out(tag_width),
        })

    def elaborate(self, platform):
        m = Module()
        bits = self.quotient_bits
        extra = bits - _SIG                       # guard + extra sticky bits (≥ 1)

        busy = Signal()                           # iterating
        rounding = Signal()                       # the quotient is complete: round it
        count = Signal(range(self.cycles + 1))
        remainder = Signal(_SIG + 1)              # in [0, 2b): the next step's dividend
        divisor = Signal(_SIG)
        quotient = Signal(bits)
        exponent = Signal(_EXP)                   # exponent of the unrounded quotient

        start = Signal()
        m.d.comb += [
            self.i_ready.eq(~busy & ~rounding & (~self.o_valid | self.o_ready)),
            start.eq(self.i_valid & self.i_ready),
        ]
        smaller = self.a_sig < self.b_sig
        with m.If(start):
            m.d.sync += [
                busy.eq(1),
                count.eq(self.cycles),
                self.o_valid.eq(0),
                remainder.eq(Mux(smaller, self.a_sig << 1, self.a_sig)),
                divisor.eq(self.b_sig),
                exponent.eq(self.a_exp - self.b_exp - (_SIG - 1) - smaller),
                self.q_tag.eq(self.tag),
            ]
        with m.Elif(busy):
            r, q = remainder, quotient
            for _ in range(self.bits_per_cycle):
                take = r >= divisor
                r = (Mux(take, r - divisor, r) << 1)[:_SIG + 1]
                q = Cat(take, q[:-1])
            m.d.sync += [remainder.eq(r), quotient.eq(q), count.eq(count - 1)]
            with m.If(count == 1):
                m.d.sync += [busy.eq(0), rounding.eq(1)]
        with m.Elif(rounding):
            # quotient = 1.xxx (24 bits) · guard · more; the remainder completes the sticky bit.
            kept = quotient[extra:]
            guard = quotient[extra - 1]
            sticky = remainder.any()
            if extra > 1:
                sticky = sticky | quotient[:extra - 1].any()
            rounded = (kept + (guard & (sticky | kept[0])))[:_SIG + 1]
            carry = rounded[_SIG]                 # 1.111…1 + ulp = 2.0: significand 2^23
            m.d.sync += [
                rounding.eq(0),
                self.o_valid.eq(1),
                self.q_sig.eq(Mux(carry, rounded[1:], rounded[:_SIG])),
                self.q_exp.eq(exponent + carry),
            ]
        with m.Elif(self.o_ready):
            m.d.sync += self.o_valid.eq(0)
        return m


def code_difference(code, in_signed, zero_point):
    """``|d|`` and ``d < 0`` for ``d = x − x_zp`` (``x`` the code read as int8 or uint8):
    the one of ``x − x_zp`` and ``x_zp − x`` that is not negative, the two differences side by
    side rather than a negation behind the difference (one carry chain deep, not two)."""
    x = Mux(in_signed, code.as_signed(), code)
    d = x - zero_point
    return Mux(d < 0, zero_point - x, d)[:9], d < 0


class SumLane(wiring.Component):
    """One lane of the window sum: ``|d|·M`` in stage A, ``V = round24(|d|·M)`` in stage A2,
    ``S + V`` in stage B, ``S = round24(S + V)`` in stage C (integers in units of ``2^E``,
    held as sign and magnitude);
    ``S`` read out as a float (exact). The element comes as ``|d|`` and the sign of ``d``
    (``d_magnitude``, ``d_negative``: :func:`code_difference`), from a register: stage A's
    multiplier starts at it. The caller sequences the stages (``b_first``: the element in
    stage B starts a window; ``c_valid``: stage C holds an element): an element's ``|d|`` in
    cycle *t* is in stage B in cycle *t* + :attr:`TO_B`. Elements come at most every other
    cycle, so that B finds the previous element's S. The float outputs show ``S``
    :attr:`READ_OUT` cycles after it is final."""

    TO_B = 2
    READ_OUT = 1

    def __init__(self):
        super().__init__({
            "d_magnitude": In(9),
            "d_negative": In(1),
            "x_significand": In(_SIG),
            "x_exponent": In(_EXP),
            "b_first": In(1),
            "c_valid": In(1),
            "sig": Out(_SIG),
            "exp": Out(_EXP),
            "negative": Out(1),
            "zero": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        # A: the exact product |d|·M, from |d|'s register.
        product = Signal(_V_BITS)
        negative = Signal()
        m.d.sync += [product.eq(self.d_magnitude * self.x_significand),
                     negative.eq(self.d_negative)]
        # A2: |V| = the product rounded to 24 significant bits; V's sign is d's.
        b_v = Signal(_V_BITS + 1)
        b_negative = Signal()
        m.d.sync += [b_v.eq(round_significant(product, _V_BITS)), b_negative.eq(negative)]

        # S and V are kept as sign and magnitude, so that C rounds a magnitude with neither a
        # negation before it nor one after it (the loop B → C → B has a cycle per stage).
        s = Signal(_S_BITS)                       # |S| < 2^37 (module documentation)
        s_negative = Signal()
        # B: the exact sum S + V (S = 0 before the window's first element): a sum of the
        # magnitudes for equal signs, otherwise the difference with the larger magnitude's sign.
        # A zero S may carry either sign: both cases give V then.
        same_sign = s_negative == b_negative
        total = s + b_v
        difference = s - b_v                      # one bit wider than s: its sign bit
        reverse = b_v - s
        v_larger = difference[-1]
        c_sum = Signal(_S_BITS + 1)
        c_negative = Signal()
        with m.If(self.b_first):
            m.d.sync += [c_sum.eq(b_v), c_negative.eq(b_negative)]
        with m.Elif(same_sign):
            m.d.sync += [c_sum.eq(total), c_negative.eq(s_negative)]
        with m.Elif(v_larger):
            m.d.sync += [c_sum.eq(reverse), c_negative.eq(b_negative)]
        with m.Else():
            m.d.sync += [c_sum.eq(difference), c_negative.eq(s_negative)]
        # C: |S| = the sum's magnitude rounded to 24 significant bits (the float32 sum).
        with m.If(self.c_valid):
            m.d.sync += [s.eq(round_significant(c_sum, _S_BITS + 1)), s_negative.eq(c_negative)]

        # S as a float: sign, significand (exact: S has at most 24 significant bits), exponent;
        # its leading zeros registered (READ_OUT), then normalised.
        leading_zeros = Signal(range(_S_BITS))
        for bit in range(_S_BITS):                 # later assignments win: the highest one
            with m.If(s[bit]):
                m.d.comb += leading_zeros.eq(_S_BITS - 1 - bit)
        s_magnitude = Signal(_S_BITS)
        s_zeros = Signal(range(_S_BITS))
        m.d.sync += [s_magnitude.eq(s), s_zeros.eq(leading_zeros),
                     self.negative.eq(s_negative & (s != 0)), self.zero.eq(s == 0)]
        normalised = Signal(_S_BITS)
        m.d.comb += [
            normalised.eq(s_magnitude << s_zeros),
            self.sig.eq(normalised[_S_BITS - _SIG:]),
            self.exp.eq(self.x_exponent + (_S_BITS - _SIG) - s_zeros),
        ]
        return m


class QuantizeLane(wiring.Component):
    """``y = clamp(rint(float32(q + y_zp)))`` for the float32 ``q`` (sign, 24-bit significand,
    exponent), as in :class:`~sfnpu.hw.chscale.ChannelScaleLane`: ``|q| < ¼`` gives ``y_zp``,
    ``|q| ≥ 2^10`` saturates by sign, otherwise ``q + y_zp`` is exact with 25 fraction bits
    and is rounded to 24 significant bits, then to an integer.

    Pipelined, free-running: ``q`` gives ``y`` :attr:`LATENCY` cycles later (stage 0: ``q``
    shifted to fixed point; stage 1: the exact fixed-point sum; stage 2: its rounding to 24
    significant bits; ``y`` is the combinational integer rounding and clamp of stage 2).
    ``y_zp`` and ``out_signed`` travel with ``q``."""

    LATENCY = 3

    def __init__(self):
        super().__init__({
            "q_sig": In(_SIG),
            "q_exp": In(_EXP),
            "negative": In(1),
            "zero": In(1),
            "y_zp": In(signed(9)),
            "out_signed": In(1),
            "y": Out(8),
        })

    def elaborate(self, platform):
        m = Module()
        # Stage 1: q + y_zp, exact, with 25 fraction bits, as sign and magnitude.
        scale = Signal(signed(13))                 # |q| in [2^scale, 2^(scale+1))
        m.d.comb += scale.eq(self.q_exp + (_SIG - 1))
        negligible = self.zero | (scale < -2)
        saturates = ~negligible & (scale >= _SATURATION_EXPONENT)
        shift = Signal(range(_SATURATION_EXPONENT + 2))
        m.d.comb += shift.eq(Mux(negligible | saturates, 0, scale + 2))
        fixed = Signal(_SIG + _SATURATION_EXPONENT + 1)          # |q|·2^25 < 2^35
        s0_saturates, s0_negative, s0_signed = Signal(), Signal(), Signal()
        s0_zp = Signal(signed(9))
        m.d.sync += [
            fixed.eq(Mux(negligible | saturates, 0, self.q_sig << shift)),
            s0_saturates.eq(saturates), s0_negative.eq(self.negative),
            s0_signed.eq(self.out_signed), s0_zp.eq(self.y_zp),
        ]
        zp = s0_zp << _FRACTION_BITS
        minus_zp = Signal(signed(35))
        m.d.comb += minus_zp.eq(-zp)
        magnitude, below = signed_sum_magnitude(m, s0_negative, fixed, zp, minus_zp, 37)
        total_magnitude = Signal(36)
        s1_below, s1_saturates, s1_negative, s1_signed = Signal(), Signal(), Signal(), Signal()
        m.d.sync += [
            total_magnitude.eq(magnitude), s1_below.eq(below),
            s1_saturates.eq(s0_saturates), s1_negative.eq(s0_negative),
            s1_signed.eq(s0_signed),
        ]
        # Stage 2: float32(q + y_zp), a magnitude and a sign.
        t = Signal(37)
        s2_below, s2_saturates, s2_negative, s2_signed = Signal(), Signal(), Signal(), Signal()
        m.d.sync += [t.eq(round_significant(total_magnitude, 36)), s2_below.eq(s1_below),
                     s2_saturates.eq(s1_saturates), s2_negative.eq(s1_negative),
                     s2_signed.eq(s1_signed)]
        # The integer, clamped to the output range.
        lo = Mux(s2_signed, -128, 0)
        hi = Mux(s2_signed, 127, 255)
        integer = round_half_even(t, _FRACTION_BITS)
        value = Signal(signed(14))
        m.d.comb += value.eq(Mux(s2_below, -integer, integer))
        result = Signal(signed(9))
        with m.If(s2_saturates):
            m.d.comb += result.eq(Mux(s2_negative, lo, hi))
        with m.Elif(value > hi):
            m.d.comb += result.eq(hi)
        with m.Elif(value < lo):
            m.d.comb += result.eq(lo)
        with m.Else():
            m.d.comb += result.eq(value)
        m.d.comb += self.y.eq(result[:8])
        return m


class AvgPool(wiring.Component):
    """Average pooling, kernel 1–3, stride 1 or 2, padding below the kernel, any output size
    (floor or ceil mode: ``out_h``/``out_w`` are configuration), with or without
    ``count_include_pad`` — bit-exact with :func:`sfnpu.numeric.qlinear_avg_pool` within the
    range stated in the module documentation.

    Channel blocks arrive row-interleaved (row-based weight reuse): every input row is
    ``blocks`` segments of ``in_w`` pixels, segment *b* holding channel block *b* (order
    ``(y, b, x)``; with ``blocks = 1`` simply one channel block after another); the output
    follows the same order with ``out_h`` rows of ``blocks`` segments of ``out_w``.

    Parameters
    ----------
    lanes : int
        Codes per beat (``HwConfig.lanes``).
    max_width : int
        Widest input segment (pixels of one channel block in a row).
    max_height : int
        Tallest input.
    max_blocks : int
        Most channel blocks per row (the range of ``blocks``).
    max_row_pixels : int
        Depth of each of the three line buffers: the largest interleaved input row
        ``blocks · in_w`` (default ``max_blocks · max_width``).
    divider_bits : int
        Quotient bits per cycle of the two dividers (:class:`Float32Divider`): the
        throughput/area trade-off (default :attr:`DIVIDER_BITS`).
    shared_lines : bool
        The three line buffers are outside the unit (``lines``), built by the owner
        (:func:`~sfnpu.hw.line_store.share_lines`).

    Signature
    ---------
    i_stream : In(stream.Signature(ArrayLayout(8, lanes)))
        Input codes, ``in_h`` rows of ``blocks`` segments of ``in_w``.
    o_stream : Out(stream.Signature(ArrayLayout(8, lanes)))
        Output codes, ``out_h`` rows of ``blocks`` segments of ``out_w``.
    enable : In(1)
        Configuration: 0 bypasses the stage (``o_stream`` is ``i_stream``, combinationally).
    in_signed, out_signed : In(1)
        Configuration: input / output codes are int8 (1) or uint8 (0).
    x_zp, y_zp : In(signed(9))
        Configuration: zero points.
    x_scale, y_scale : In(32)
        Configuration: float32 bit patterns of the scales.
    kernel : In(range(1, 4))
        Configuration: window side.
    stride : In(range(1, 3))
        Configuration: window step.
    pad : In(range(3))
        Configuration: padding on every side, below ``kernel``.
    count_include_pad : In(1)
        Configuration: divide by ``kernel²`` (1) or by the number of input elements in the
        window (0).
    in_h, in_w, out_h, out_w : In(...)
        Configuration: sizes of one channel block. Every output window must contain an input
        element (true for sizes from :func:`sfnpu.numeric.pool_output_size`).
    blocks : In(range(1, max_blocks + 1), init=1)
        Configuration: channel blocks per row; ``blocks · in_w ≤ max_row_pixels``.
    lines : Out(LinePort(ArrayLayout(8, lanes), max_row_pixels)).array(3)
        With ``shared_lines``: the ports of the three line buffers.

    Configuration may change only between groups: once every input beat has been accepted
    and every output beat delivered.

    Timing: the input is taken one beat per cycle while a line buffer is free: the buffers
    hold rows ``max(u, 0) … max(u, 0) + 2`` of the output row being computed (``u = oy·stride −
    pad``), so input rows beyond those wait until the row's windows have been read. An output
    pixel whose window has ``m`` input elements costs ``2m + 6`` cycles to sum (one element
    every other cycle: the sum's add and rounding are separate stages) and each division
    ``⌈25 / divider_bits⌉ + 2``; summing and the two divisions run concurrently on consecutive
    pixels, so an output row of ``blocks · out_w`` pixels takes about
    ``blocks · out_w · max(2m + 6, ⌈25 / divider_bits⌉ + 2)`` cycles plus the input rows that
    could not be taken meanwhile (2×2 windows, stride 2, ``divider_bits = 2``: 15 cycles per
    output pixel, 17 with the input; 3×3 windows: 24). Latency from a window's last input
    element to its output: ``2m + 6 + 2·(⌈25 / divider_bits⌉ + 2) + 3`` cycles at most (the
    last three: the requantiser's stages, :attr:`QuantizeLane.LATENCY`).
    """

    #: Quotient bits per cycle of the dividers unless ``divider_bits`` says otherwise (the
    #: accelerator's, and so the cycle model's).
    DIVIDER_BITS = 2

    def __init__(self, lanes: int, max_width: int, max_height: int = MAX_HEIGHT,
                 max_blocks: int = 1, max_row_pixels: int | None = None,
                 divider_bits: int | None = None, shared_lines: bool = False):
        divider_bits = self.DIVIDER_BITS if divider_bits is None else divider_bits
        if min(lanes, max_width, max_height, max_blocks, divider_bits) < 1:
            raise ValueError(f"lanes, max_width, max_height, max_blocks and divider_bits must "
                             f"be positive ({lanes}, {max_width}, {max_height}, {max_blocks}, "
                             f"{divider_bits})")
        self.lanes = lanes
        self.max_width = max_width
        self.max_height = max_height
        self.max_blocks = max_blocks
        self.max_out_width = max_width + 2
        self.max_row_pixels = max_blocks * max_width if max_row_pixels is None else max_row_pixels
        if self.max_row_pixels < 1:
            raise ValueError(f"max_row_pixels must be positive ({self.max_row_pixels})")
        self.divider_bits = divider_bits
        self.shared_lines = shared_lines
        beat = code_beat(lanes)
        super().__init__({
            "i_stream": In(beat),
            "o_stream": Out(beat),
            "enable": In(1),
            "in_signed": In(1),
            "out_signed": In(1),
            "x_zp": In(signed(9)),
            "y_zp": In(signed(9)),
            "x_scale": In(32),
            "y_scale": In(32),
            "kernel": In(range(1, _MAX_KERNEL + 1)),
            "stride": In(range(1, 3)),
            "pad": In(range(_MAX_KERNEL)),
            "count_include_pad": In(1),
            "in_h": In(range(1, max_height + 1)),
            "in_w": In(range(1, max_width + 1)),
            "out_h": In(range(1, max_height + 3)),
            "out_w": In(range(1, self.max_out_width + 1)),
            "blocks": In(range(1, max_blocks + 1), init=1),
            **line_members(_MAX_KERNEL, data.ArrayLayout(8, lanes), self.max_row_pixels,
                           shared_lines),
        })

    def elaborate(self, platform):
        m = Module()
        beat_layout = data.ArrayLayout(8, self.lanes)
        writes, reads = self._line_buffers(m, beat_layout)
        rows = self._row_state(m)
        row_stored = self._store_input(m, writes, rows)
        walk = self._window(m, rows)
        pipe = self._element_pipeline(m, walk, reads)

        # Hand-over register: a finished window sum (as a float) and its divisor.
        hold_valid = Signal()
        take_hold = Signal()                                   # divider 1 takes the hold

        sum_ready = Signal()                                   # the hold takes S this cycle
        row_walked = Signal()                                  # an output row is complete
        self._walker(m, rows, walk, pipe, hold_valid, sum_ready, row_walked)
        # The sum is done once the lanes' float read-out shows it.
        summed = Signal(SumLane.READ_OUT)
        m.d.sync += summed.eq(Cat(pipe.c_valid & pipe.c_last, summed[:-1]))
        with m.If(summed[-1]):
            m.d.sync += pipe.sum_done.eq(1)
        with m.Elif(sum_ready):
            m.d.sync += pipe.sum_done.eq(0)

        # The group ends with its last input row or its last output row, whichever comes last:
        # start over in the same cycle (the configuration may change right after).
        # Both tests are taken from registers before the handshakes select one of them.
        inputs_end = Mux(row_stored, rows.rows_in + 1 == self.in_h, rows.rows_in == self.in_h)
        outputs_end = Mux(row_walked, rows.oy + 1 == self.out_h, rows.outputs_done)
        with m.If(inputs_end & outputs_end):
            m.d.sync += [rows.rows_in.eq(0), rows.in_slot.eq(0), rows.oy.eq(0), rows.w.eq(0),
                         rows.storable.eq(_MAX_KERNEL), rows.w_slot.eq(0),
                         rows.needed.eq(self._needed(0))]

        # The requantisers' stages and the output register run freely; their beats wait in
        # ``held``, whose handshakes are those of the stages held as a whole while the output
        # waits (hw.held_output).
        output_codes = Signal(beat_layout)
        m.submodules.held = held = HeldOutput(beat_layout.size, QuantizeLane.LATENCY + 1)
        advance = held.advance
        hold_n, first_divider, second_divider = self._lanes(
            m, pipe, hold_valid, sum_ready, advance, output_codes)
        m.d.comb += [held.accept.eq(second_divider[0].o_valid & advance),
                     held.payload.eq(output_codes)]

        # Lanes run in lockstep: lane 0's handshakes stand for all.
        with m.If(sum_ready):
            m.d.sync += [hold_valid.eq(1), hold_n.eq(walk.window_n)]
        with m.Elif(take_hold):
            m.d.sync += hold_valid.eq(0)
        m.d.comb += take_hold.eq(hold_valid & first_divider[0].i_ready)

        with m.If(self.enable):
            m.d.comb += [
                self.o_stream.valid.eq(held.o_stream.valid),
                self.o_stream.payload.eq(held.o_stream.payload),
                held.o_stream.ready.eq(self.o_stream.ready),
            ]
        with m.Else():
            m.d.comb += pass_through(self.i_stream, self.o_stream)
        return m

    def _line_buffers(self, m, beat_layout):
        """The three line buffers (input row r in buffer r mod 3), with their ports. The
        window's rows are never written while they are read (:meth:`_row_state`), so a
        transparent read, as a shared buffer has it, reads the same."""
        ports = line_ports(m, self, _MAX_KERNEL, beat_layout, self.max_row_pixels,
                           transparent=False)
        return [write for write, _ in ports], [read for _, read in ports]

    def _row_state(self, m):
        """Input and output row counters, and the input rows the current output row needs."""
        in_column = Signal(range(self.max_width))
        in_segment = Signal(range(max(self.max_blocks, 2)))     # (never zero-width)
        in_address = Signal(range(self.max_row_pixels))
        in_slot = Signal(range(_MAX_KERNEL))
        rows_in = Signal(range(self.max_height + 1))          # input rows stored so far

        # Output-row state: output row oy, oy·stride and its residue mod 3; the row's first
        # window row is u = oy·stride − pad (negative in the top padding).
        oy = Signal(range(self.max_height + 3))
        w = Signal(range(2 * (self.max_height + 2) + 1))
        w_slot = Signal(range(_MAX_KERNEL))
        u = Signal(signed(16))
        m.d.comb += u.eq(w - self.pad)
        outputs_done = oy == self.out_h
        # Rows output row oy needs: a register set with w (:meth:`_needed`), so the walker's
        # start test compares two registers. It follows the configuration a cycle late, which
        # no start sees: rows_in is 0 from the group's end until its input comes, and the
        # register is at least 1.
        needed = Signal(signed(16), init=1)
        m.d.sync += needed.eq(self._needed(w))
        # Rows that may be stored: up to two after output row oy's first row (the three buffers
        # hold rows max(u, 0) … max(u, 0) + 2; its window rows stay untouched). A register
        # set with w (:meth:`_storable`), so that the input's ready starts at a flip-flop and
        # not at the configuration's padding through two carry chains; u ≤ 0 at w = 0.
        storable = Signal(signed(16), init=_MAX_KERNEL)
        return SimpleNamespace(
            in_column=in_column, in_segment=in_segment, in_address=in_address, in_slot=in_slot,
            rows_in=rows_in, oy=oy, w=w, w_slot=w_slot, u=u, outputs_done=outputs_done,
            needed=needed, storable=storable)

    def _store_input(self, m, writes, rows):
        """Input: beats into the line buffers while one is free; returns "a row is complete"."""
        in_column, in_segment, in_address = rows.in_column, rows.in_segment, rows.in_address
        in_row_end = (in_column == self.in_w - 1) & (in_segment == self.blocks - 1)
        accept = Signal()
        m.d.comb += [
            self.i_stream.ready.eq(self.enable & (rows.rows_in < self.in_h)
                                   & (rows.outputs_done | (rows.rows_in < rows.storable))),
            accept.eq(self.i_stream.valid & self.i_stream.ready),
        ]
        for index, write in enumerate(writes):
            m.d.comb += [
                write.addr.eq(in_address),
                write.data.eq(self.i_stream.payload),
                write.en.eq(accept & (rows.in_slot == index)),
            ]
        with m.If(accept):
            m.d.sync += [
                in_column.eq(Mux(in_column == self.in_w - 1, 0, in_column + 1)),
                in_address.eq(Mux(in_row_end, 0, in_address + 1)),
            ]
            with m.If(in_column == self.in_w - 1):
                m.d.sync += in_segment.eq(Mux(in_row_end, 0, in_segment + 1))
        row_stored = accept & in_row_end
        with m.If(row_stored):
            m.d.sync += [
                rows.rows_in.eq(rows.rows_in + 1),
                rows.in_slot.eq(Mux(rows.in_slot == _MAX_KERNEL - 1, 0, rows.in_slot + 1)),
            ]
        return row_stored

    def _small_product(self, m, a, b, name):
        """``a · b`` for numbers up to 3, by table: no multiplier."""
        product = Signal(range(_MAX_KERNEL ** 2 + 1), name=name)
        with m.Switch(Cat(a[:2], b[:2])):
            for x in range(1, _MAX_KERNEL + 1):
                for y in range(1, _MAX_KERNEL + 1):
                    with m.Case(x | (y << 2)):
                        m.d.comb += product.eq(x * y)
        return product

    def _window(self, m, rows):
        """The current window: position, extent clipped to the input, divisor, walk state."""
        segment = Signal(range(max(self.max_blocks, 2)))
        segment_base = Signal(range(self.max_row_pixels))     # segment · in_w
        ox = Signal(range(self.max_out_width + 1))
        h = Signal(range(2 * (self.max_out_width + 1) + 1))   # ox · stride
        v = Signal(signed(16))                                 # the window's first column
        m.d.comb += v.eq(h - self.pad)

        def clip(start, size):
            last = start + self.kernel - 1
            first = Mux(start < 0, 0, start)
            end = Mux(last < size - 1, last, size - 1)
            return first, end

        r_first, r_end = clip(rows.u, self.in_h)
        c_first, c_end = clip(v, self.in_w)
        window_rows = Signal(range(_MAX_KERNEL + 1))
        window_columns = Signal(range(_MAX_KERNEL + 1))
        m.d.comb += [window_rows.eq(r_end - r_first + 1), window_columns.eq(c_end - c_first + 1)]

        # The divisor: kernel² or the window's element count.
        kernel_area = self._small_product(m, self.kernel, self.kernel, "kernel_area")
        window_area = self._small_product(m, window_rows, window_columns, "window_area")

        # Walk state: the element being issued (row countdown, buffer, column).
        walk_row_left = Signal(range(_MAX_KERNEL))             # rows after the current one
        walk_slot = Signal(range(_MAX_KERNEL))
        walk_column = Signal(range(self.max_width))
        walk_column_end = Signal(range(self.max_width))
        walk_column_first = Signal(range(self.max_width))
        walk_first = Signal()                                  # the window's first element
        phase = Signal()                                       # issue on phase 0
        window_n = Signal(range(_MAX_KERNEL ** 2 + 1))
        # Buffer of the window's first row: row u (u ≥ 0) is in buffer u mod 3.
        first_slot = Signal(range(_MAX_KERNEL))
        slot_difference = Signal(signed(3))
        m.d.comb += [
            slot_difference.eq(rows.w_slot - self.pad),
            first_slot.eq(Mux(rows.u < 0, 0, Mux(slot_difference < 0,
                                                 slot_difference + _MAX_KERNEL,
                                                 slot_difference))),
        ]
        # The element the line buffers are read for: the next one to issue (the walker's
        # :meth:`_walker`).
        read_column = Signal.like(walk_column)
        read_slot = Signal.like(walk_slot)
        return SimpleNamespace(
            read_column=read_column, read_slot=read_slot,
            segment=segment, segment_base=segment_base, ox=ox, h=h, c_first=c_first,
            c_end=c_end, window_rows=window_rows,
            divisor=Mux(self.count_include_pad, kernel_area, window_area),
            walk_row_left=walk_row_left, walk_slot=walk_slot, walk_column=walk_column,
            walk_column_end=walk_column_end, walk_column_first=walk_column_first,
            walk_first=walk_first, phase=phase, window_n=window_n, first_slot=first_slot)

    def _element_pipeline(self, m, walk, reads):
        """The element pipeline's valid/first/last flags and the line buffers' read address."""
        # Issue (address) → A: code read, |d|·M → A2: V = round24(|d|·M) → B: S + V → C: S
        # rounded to 24 significant bits. Elements are issued every other cycle, so B always
        # finds the previous element's S.
        issue = Signal()
        issue_last = Signal()
        a_valid, a_first, a_last = Signal(), Signal(), Signal()
        b_first, b_last, b_valid = Signal(), Signal(), Signal()
        c_valid, c_last = Signal(), Signal()
        sum_done = Signal()                                    # S holds a finished window sum
        m.d.sync += [
            a_valid.eq(issue), a_first.eq(issue & walk.walk_first), a_last.eq(issue_last),
            c_valid.eq(b_valid), c_last.eq(b_valid & b_last),
        ]
        # A → B through the lane's product stages.
        flags = Cat(a_valid, a_first, a_last)
        for _ in range(SumLane.TO_B):
            delayed = Signal.like(flags)
            m.d.sync += delayed.eq(flags)
            flags = delayed
        m.d.comb += Cat(b_valid, b_first, b_last).eq(flags)
        # The line buffers are read a cycle ahead of the issue (the walker's next element), and
        # the issue cycle registers each code's |d| = |x − x_zp| and its sign: stage A's
        # multiplier starts at a register, not at a block RAM's output through the buffers'
        # multiplexer, nor at a code through the differences.
        walk_address = walk.segment_base + walk.read_column
        for read in reads:
            m.d.comb += read.addr.eq(walk_address)
        data_slot = Signal(range(_MAX_KERNEL))            # the buffer the read data is from
        codes = data.ArrayLayout(8, self.lanes)(
            Mux(data_slot == 0, reads[0].data.as_value(),
                Mux(data_slot == 1, reads[1].data.as_value(), reads[2].data.as_value())))
        magnitudes = Signal(data.ArrayLayout(9, self.lanes))
        negatives = Signal(self.lanes)
        m.d.sync += data_slot.eq(walk.read_slot)
        for lane in range(self.lanes):
            magnitude, negative = code_difference(codes[lane], self.in_signed, self.x_zp)
            m.d.sync += [magnitudes[lane].eq(magnitude), negatives[lane].eq(negative)]
        return SimpleNamespace(issue=issue, issue_last=issue_last, magnitudes=magnitudes,
                               negatives=negatives,
                               b_first=b_first, c_valid=c_valid, c_last=c_last,
                               sum_done=sum_done)

    def _walker(self, m, rows, walk, pipe, hold_valid, sum_ready, row_walked):
        """The window walker: the elements of one window after another, in the sum's order."""
        with m.FSM(name="walker") as walker:
            with m.State("NEXT"):
                # Start the window (segment, ox) of output row oy once its rows are stored.
                with m.If(self.enable & ~rows.outputs_done & (rows.rows_in >= rows.needed)):
                    m.d.sync += [
                        walk.walk_row_left.eq(walk.window_rows - 1),
                        walk.walk_slot.eq(walk.first_slot),
                        walk.walk_column.eq(walk.c_first),
                        walk.walk_column_first.eq(walk.c_first),
                        walk.walk_column_end.eq(walk.c_end),
                        walk.walk_first.eq(1),
                        walk.phase.eq(0),
                        walk.window_n.eq(walk.divisor),
                    ]
                    m.next = "WALK"
            with m.State("WALK"):
                self._walk_elements(m, walk, pipe)
            with m.State("SUM"):
                # Wait for the sum to leave the pipeline, hand it over, go to the next window.
                m.d.comb += sum_ready.eq(pipe.sum_done & ~hold_valid)
                with m.If(sum_ready):
                    m.next = "NEXT"
                    self._next_window(m, rows, walk, row_walked)
        # The next element to issue: a window's first while the walker waits to start it, then
        # the walk state, which moves to the following element as one issues (its reads in
        # the cycles between are not used).
        starting = walker.ongoing("NEXT")
        m.d.comb += [walk.read_column.eq(Mux(starting, walk.c_first, walk.walk_column)),
                     walk.read_slot.eq(Mux(starting, walk.first_slot, walk.walk_slot))]

    def _walk_elements(self, m, walk, pipe):
        """Walker state WALK: issues the window's elements, one every other cycle."""
        phase = walk.phase
        last_column = walk.walk_column == walk.walk_column_end
        last_element = last_column & (walk.walk_row_left == 0)
        m.d.comb += [pipe.issue.eq(~phase), pipe.issue_last.eq(~phase & last_element)]
        m.d.sync += phase.eq(~phase)
        with m.If(~phase):
            m.d.sync += walk.walk_first.eq(0)
            with m.If(last_element):
                m.next = "SUM"
            with m.Elif(last_column):
                m.d.sync += [
                    walk.walk_column.eq(walk.walk_column_first),
                    walk.walk_row_left.eq(walk.walk_row_left - 1),
                    walk.walk_slot.eq(Mux(walk.walk_slot == _MAX_KERNEL - 1, 0,
                                          walk.walk_slot + 1)),
                ]
            with m.Else():
                m.d.sync += walk.walk_column.eq(walk.walk_column + 1)

    def _needed(self, w):
        """The input rows output row oy needs once its first window row is ``w − pad``
        (at least 1: the window's last row is row 0 or later)."""
        end = w - self.pad + self.kernel
        needed = Mux(end < self.in_h, end, self.in_h)
        return Mux(needed < 1, 1, needed)

    def _storable(self, w):
        """The rows that may be stored once output row oy's first window row is ``w − pad``."""
        u = w - self.pad
        return Mux(u < 0, 0, u) + _MAX_KERNEL

    def _next_window(self, m, rows, walk, row_walked):
        """Advances to the next window: column, then channel block, then output row."""
        ox, h, segment, segment_base = walk.ox, walk.h, walk.segment, walk.segment_base
        with m.If(ox == self.out_w - 1):
            m.d.sync += [ox.eq(0), h.eq(0)]
            with m.If(segment == self.blocks - 1):
                w_slot_sum = rows.w_slot + self.stride
                m.d.comb += row_walked.eq(1)
                m.d.sync += [
                    segment.eq(0), segment_base.eq(0),
                    rows.oy.eq(rows.oy + 1), rows.w.eq(rows.w + self.stride),
                    rows.storable.eq(self._storable(rows.w + self.stride)),
                    rows.needed.eq(self._needed(rows.w + self.stride)),
                    rows.w_slot.eq(Mux(w_slot_sum >= _MAX_KERNEL,
                                       w_slot_sum - _MAX_KERNEL, w_slot_sum)),
                ]
            with m.Else():
                m.d.sync += [segment.eq(segment + 1),
                             segment_base.eq(segment_base + self.in_w)]
        with m.Else():
            m.d.sync += [ox.eq(ox + 1), h.eq(h + self.stride)]

    def _lanes(self, m, pipe, hold_valid, sum_ready, advance, output_codes):
        """Per lane: dequantise, sum, convert, divide twice (the second one's result taken
        with ``advance``), requantise."""
        x_significand = Cat(self.x_scale[:23], 1)
        x_exponent = Signal(_EXP)                  # x_s = M · 2^E
        m.d.comb += x_exponent.eq(self.x_scale[23:31] - FLOAT32_BIAS - (_SIG - 1))
        y_significand = Cat(self.y_scale[:23], 1)
        y_exponent = Signal(_EXP)
        m.d.comb += y_exponent.eq(self.y_scale[23:31] - FLOAT32_BIAS - (_SIG - 1))

        # n as a float: significand n·2^(23 − ⌊log2 n⌋), exponent ⌊log2 n⌋ − 23.
        hold_n = Signal(range(_MAX_KERNEL ** 2 + 1))
        n_significand = Signal(_SIG)
        n_exponent = Signal(_EXP)
        with m.Switch(hold_n):
            for value in range(1, _MAX_KERNEL ** 2 + 1):
                log = value.bit_length() - 1
                with m.Case(value):
                    m.d.comb += [n_significand.eq(value << (_SIG - 1 - log)),
                                 n_exponent.eq(log - (_SIG - 1))]

        first_divider = []
        second_divider = []
        for lane in range(self.lanes):
            summer = SumLane()
            m.submodules[f"sum_{lane}"] = summer
            m.d.comb += [
                summer.d_magnitude.eq(pipe.magnitudes[lane]),
                summer.d_negative.eq(pipe.negatives[lane]),
                summer.x_significand.eq(x_significand), summer.x_exponent.eq(x_exponent),
                summer.b_first.eq(pipe.b_first), summer.c_valid.eq(pipe.c_valid),
            ]
            hold_sig = Signal(_SIG, name=f"hold_sig_{lane}")
            hold_exp = Signal(_EXP, name=f"hold_exp_{lane}")
            hold_tag = Signal(2, name=f"hold_tag_{lane}")
            with m.If(sum_ready):
                m.d.sync += [hold_sig.eq(summer.sig), hold_exp.eq(summer.exp),
                             hold_tag.eq(Cat(summer.negative, summer.zero))]

            # avg = S / n, then q = avg / y_s.
            first = Float32Divider(self.divider_bits, tag_width=2)
            second = Float32Divider(self.divider_bits, tag_width=2)
            m.submodules[f"divide_n_{lane}"] = first
            m.submodules[f"divide_scale_{lane}"] = second
            first_divider.append(first)
            second_divider.append(second)
            m.d.comb += [
                first.i_valid.eq(hold_valid),
                first.a_sig.eq(hold_sig), first.a_exp.eq(hold_exp),
                first.b_sig.eq(n_significand), first.b_exp.eq(n_exponent),
                first.tag.eq(hold_tag),
                second.i_valid.eq(first.o_valid),
                first.o_ready.eq(second.i_ready),
                second.a_sig.eq(first.q_sig), second.a_exp.eq(first.q_exp),
                second.b_sig.eq(y_significand), second.b_exp.eq(y_exponent),
                second.tag.eq(first.q_tag),
                second.o_ready.eq(advance),
            ]

            # q → y, through the requantiser's stages (free-running: HeldOutput holds y).
            requantise = QuantizeLane()
            m.submodules[f"output_{lane}"] = requantise
            m.d.comb += [
                requantise.q_sig.eq(second.q_sig), requantise.q_exp.eq(second.q_exp),
                requantise.negative.eq(second.q_tag[0]), requantise.zero.eq(second.q_tag[1]),
                requantise.y_zp.eq(self.y_zp), requantise.out_signed.eq(self.out_signed),
            ]
            m.d.sync += output_codes[lane].eq(requantise.y)
        return hold_n, first_divider, second_divider
