"""SE channel scale (Eltwise.CHANNEL_SCALE) and the product of two feature maps (Eltwise.MUL):
onnxruntime's QLinearMul, bit for bit.

The numeric contract (:func:`sfnpu.numeric.qlinear_mul_codes`) is::

    p = (a − a_zp)(b − b_zp)                               exact integer
    t = float32(float32(float32(p) · m) + float32(y_zp))   two float32 roundings, ties to even
    y = sat8(cvtps_epi32(t))                               ties to even; |t| ≥ 2³¹ or NaN → lo

``a`` is the feature map, ``b`` the channel's scale code (constant over the channel block) or,
for MUL, the other map's code at the same pixel.
The zero point is added in float32 *before* the conversion to an integer, so a product just
below a half (``k.49999997``) can become a tie; adding it after rounding would differ.

Only results inside the output range need their exact value, and ``|float32(p)·m| < ¼`` gives
``y = clamp(y_zp)`` whatever the roundings do, so :class:`ChannelScaleLane` converts the
float32 product to fixed point (25 fraction bits) whenever ``¼ ≤ |p·m| < 2¹⁰``, adds the zero
point exactly there, and rounds that sum to 24 significant bits and then to an integer. Larger
products saturate by sign — except that ``cvtps_epi32`` turns ``t ≥ 2³¹`` into INT32_MIN, i.e.
``lo``, which the lane reproduces too.

:class:`ChannelScale` runs ``lanes`` such lanes on a feature-map stream and takes one beat of
scale codes per channel block (or, ``per_pixel``, one per pixel) from a second stream.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from . import pipeline
from .beat import code_beat, pass_through
from .fifo import UNCHECKED_COLLISIONS, unchecked_read
from .held_output import HeldOutput
from .requant import FLOAT32_BIAS, Requantizer
from .shared_product import Product, lane_products, products_members

__all__ = ["ChannelScaleLane", "ChannelScale"]

#: Fraction bits of the fixed-point sum float32(p)·m + y_zp: enough for every float32 product
#: of magnitude ≥ ¼ below 2^10 (its last significand bit is then worth ≥ 2^−25).
_FRACTION_BITS = 25
#: Products of magnitude ≥ 2^10 saturate: 2^10 − 256 already lies beyond every output range.
_SATURATION_EXPONENT = 10


class ChannelScaleLane(wiring.Component):
    """One lane of :class:`ChannelScale`: ``y`` from the codes ``a`` and ``b``, bit-exact
    with :func:`sfnpu.numeric.qlinear_mul_codes` for every input, zero point and float32
    multiplier (including 0, subnormal, negative, huge, ±infinity and NaN).

    Signature
    ---------
    a, b : In(8)
        Raw codes of the two operands (feature map, channel scale).
    valid : In(1)
        Marks a meaningful input; delayed alongside the data.
    a_signed, b_signed : In(1)
        Configuration: ``a`` / ``b`` are int8 (1) or uint8 (0).
    a_zp, b_zp : In(signed(9))
        Configuration: zero points of ``a`` and ``b``.
    multiplier : In(32)
        Configuration: float32 bit pattern of ``m`` (:func:`sfnpu.numeric.qlinear_mul_multiplier`;
        the post record's ``eltwise_const[0]``).
    y_zp : In(signed(9))
        Configuration: output zero point.
    out_signed : In(1)
        Configuration: output is int8 (1) or uint8 (0); ``y`` lies in that range.
    y : Out(signed(9))
        The result (its low 8 bits are the output code).
    y_valid : Out(1)
        ``valid`` delayed by :attr:`LATENCY`.
    p_product : Out(:attr:`CODE_PRODUCT`), m_product : Out(:attr:`SIGNIFICAND_PRODUCT`)
        The lane's multipliers, outside it (:func:`~.shared_product.multiply`; the product
        is registered there, the stage the lane counts in its latency).

    Configuration inputs must be stable while the pipeline holds a valid input.

    Timing: fully pipelined, free-running, one input per cycle; ``y`` follows its inputs after
    :attr:`LATENCY` (9) cycles. Stages:
    0. ``a − a_zp`` and ``b − b_zp`` (``b`` comes from a block RAM's output or the shortcut
       queue's: the multiplier gets a cycle of its own);
    1. ``p = (a − a_zp)(b − b_zp)``;
    2. float32(p): magnitude normalised to its leading one (exact, |p| < 2^18);
    3. 18 × 24-bit significand product;
    4. round it to 24 bits (the float32 product);
    5. classify (negligible / fixed point / saturate) and shift the in-range ones to fixed
       point;
    6. add ``y_zp`` in fixed point (exact);
    7. round the sum to 24 significant bits (the float32 sum);
    8. round to an integer, apply the sign, saturate.
    """

    #: Cycles from the inputs to ``y``.
    LATENCY = 9
    #: The lane's products, registered outside it: ``(a − a_zp)(b − b_zp)`` (stage 1) and
    #: float32(p)'s significand × the multiplier's (stage 3).
    CODE_PRODUCT = Product(signed(10), signed(10), signed(20))
    SIGNIFICAND_PRODUCT = Product(18, 24, 42)

    #: Round to nearest, ties to even, at a fixed bit position (shared with the requantiser;
    #: overridable, so a test can check that a broken rounding is caught).
    round_half_even = staticmethod(Requantizer.round_half_even)

    def __init__(self):
        super().__init__({
            "a": In(8),
            "b": In(8),
            "valid": In(1),
            "a_signed": In(1),
            "a_zp": In(signed(9)),
            "b_signed": In(1),
            "b_zp": In(signed(9)),
            "multiplier": In(32),
            "y_zp": In(signed(9)),
            "out_signed": In(1),
            "y": Out(signed(9)),
            "y_valid": Out(1),
            "p_product": Out(self.CODE_PRODUCT),
            "m_product": Out(self.SIGNIFICAND_PRODUCT),
        })

    def elaborate(self, platform):
        m = Module()

        def stage(value, name, shape=None):
            return pipeline.stage(m, value, name, shape)

        valid = self.valid
        for index in range(self.LATENCY - 1):
            valid = stage(valid, f"valid_{index + 1}")
        m.d.sync += self.y_valid.eq(valid)

        # The multiplier is configuration: decoded once, used by stages 2–4.
        m_biased_exponent = self.multiplier[23:31]
        m_special = m_biased_exponent == 0xFF              # ±infinity or NaN: t is ±inf/NaN
        # Zero and subnormal multipliers are read with the hidden one too: their products then
        # come out below 2^−100, negligible like the true ones (below 2^−108).
        m_significand = Cat(self.multiplier[:23], 1)

        # -- stage 1: the exact integer product ----------------------------------------------
        a_value = Mux(self.a_signed, self.a.as_signed(), self.a)
        b_value = Mux(self.b_signed, self.b.as_signed(), self.b)
        s0_a = stage(a_value - self.a_zp, "s0_a", signed(10))
        s0_b = stage(b_value - self.b_zp, "s0_b", signed(10))
        # (the multipliers, one stage each, are outside the lane: hw.shared_product)
        m.d.comb += [self.p_product.a.eq(s0_a), self.p_product.b.eq(s0_b)]
        s1_product = self.p_product.p                                 # |p| ≤ 383² < 2^18

        # -- stage 2: float32(p), exact: sign and magnitude normalised to bit 17 -------------
        magnitude = Signal(18)
        m.d.comb += magnitude.eq(Mux(s1_product < 0, -s1_product, s1_product))
        leading_zeros = Signal(range(18))
        for bit in range(18):                              # later assignments win
            with m.If(magnitude[bit]):
                m.d.comb += leading_zeros.eq(17 - bit)
        s2_significand = stage((magnitude << leading_zeros)[:18], "s2_significand", 18)
        s2_exponent = stage(17 - leading_zeros, "s2_exponent", range(18))   # |p| ∈ [2^e, 2^e+1)
        s2_zero = stage(magnitude == 0, "s2_zero")
        s2_negative = stage((s1_product < 0) ^ self.multiplier[31], "s2_negative")

        # -- stage 3: significand product ------------------------------------------------------
        # |p| = P·2^(e−17), m = M·2^(E−150), P ∈ [2^17, 2^18), M ∈ [2^23, 2^24): the product is
        # P·M·2^(e+E−167) with P·M ∈ [2^40, 2^42); reading bit 40 as the leading one gives the
        # exponent e + E − 127 (one more when bit 41 is set).
        m.d.comb += [self.m_product.a.eq(s2_significand), self.m_product.b.eq(m_significand)]
        s3_product = self.m_product.p
        s3_exponent = stage(s2_exponent + m_biased_exponent - FLOAT32_BIAS, "s3_exponent",
                            signed(10))
        s3_zero = stage(s2_zero, "s3_zero")
        s3_negative = stage(s2_negative, "s3_negative")

        # -- stage 4: the float32 product, rounded to 24 bits -------------------------------
        high = s3_product[41]
        rounded = Mux(high, self.round_half_even(s3_product, 18),
                      self.round_half_even(s3_product[:41], 17))          # 25 bits
        carry = rounded[24]
        s4_significand = stage(Mux(carry, rounded[1:], rounded[:24]), "s4_significand", 24)
        # |float32(p)·m| ∈ [2^X, 2^X+1)
        s4_exponent = stage(s3_exponent + high + carry, "s4_exponent", signed(11))
        s4_zero = stage(s3_zero, "s4_zero")
        s4_negative = stage(s3_negative, "s4_negative")

        # -- stage 5: classified, and the in-range ones shifted to fixed point ---------------
        significand, exponent = s4_significand, s4_exponent
        # |product| < ¼ (X ≤ −3): rint(float32(product + y_zp)) = y_zp, as for a zero product.
        negligible = s4_zero | (exponent < -2)
        saturates = ~negligible & (exponent >= _SATURATION_EXPONENT)
        # cvtps_epi32 gives INT32_MIN for t ≥ 2^31. Below 2^31 the largest float32 is
        # 2^31 − 128 (X = 30, all-ones significand): adding y_zp ≥ 64 rounds it up to 2^31.
        beyond_int32 = (exponent >= 31) | ((exponent == 30) & (significand == 0xFFFFFF)
                                           & (self.y_zp >= 64))
        shift = Signal(range(_SATURATION_EXPONENT + 2))
        m.d.comb += shift.eq(Mux(negligible | saturates, 0, exponent + 2))
        fixed = Signal(24 + _SATURATION_EXPONENT + 1)      # |product|·2^25 < 2^35
        m.d.comb += fixed.eq(Mux(negligible | saturates, 0, significand << shift))
        s5_fixed = stage(fixed, "s5_fixed")
        s5_negative = stage(s4_negative, "s5_negative")
        # Saturated and special results, decided here; the datapath then carries y_zp only.
        s5_to_lo = stage(m_special | (saturates & (s4_negative | beyond_int32)), "s5_to_lo")
        s5_to_hi = stage(~m_special & saturates & ~s4_negative & ~beyond_int32, "s5_to_hi")

        # -- stage 6: ± fixed + y_zp, exactly, in fixed point, as sign and magnitude ----------
        # y_zp·2^25 and its negation are registered configuration.
        zp = stage(self.y_zp << _FRACTION_BITS, "s0_zp", signed(35))
        minus_zp = stage(-(self.y_zp << _FRACTION_BITS), "s0_minus_zp", signed(35))
        # |sum| < (2^10 + 2^8)·2^25 < 2^36
        magnitude, below = pipeline.signed_sum_magnitude(m, s5_negative, s5_fixed, zp, minus_zp,
                                                         37)
        s6_magnitude = stage(magnitude, "s6_magnitude", 36)
        s6_negative = stage(below, "s6_negative")
        s6_to_lo = stage(s5_to_lo, "s6_to_lo")
        s6_to_hi = stage(s5_to_hi, "s6_to_hi")

        # -- stage 7: the float32 sum: round |sum| to 24 significant bits ---------------------
        s7_rounded = stage(pipeline.round_significant(s6_magnitude, 36), "s7_rounded", 37)
        s7_negative = stage(s6_negative, "s7_negative")
        s7_to_lo = stage(s6_to_lo, "s7_to_lo")
        s7_to_hi = stage(s6_to_hi, "s7_to_hi")

        # -- stage 8: rint, sign, saturate ----------------------------------------------------
        integer = self.round_half_even(s7_rounded, _FRACTION_BITS)        # < 2^11
        value = Signal(signed(13))
        m.d.comb += value.eq(Mux(s7_negative, -integer, integer))
        lo = Mux(self.out_signed, -128, 0)
        hi = Mux(self.out_signed, 127, 255)
        with m.If(s7_to_lo):
            m.d.sync += self.y.eq(lo)
        with m.Elif(s7_to_hi | (value > hi)):
            m.d.sync += self.y.eq(hi)
        with m.Elif(value < lo):
            m.d.sync += self.y.eq(lo)
        with m.Else():
            m.d.sync += self.y.eq(value)
        return m


class ChannelScale(wiring.Component):
    """Squeeze-and-excitation channel scale: every pixel of channel block *k* of the feature
    map multiplied (QLinearMul) by channel block *k* of the scale vector.

    The feature map arrives row-interleaved: ``in_h`` rows of ``blocks`` segments of ``in_w``
    pixels, segment *b* holding channel block *b* (order ``(y, b, x)``; with ``blocks = 1``
    simply one channel block after another). Every block recurs in every row, so the group's
    ``blocks`` scale beats are kept in a register file indexed by block (a memory of
    ``max_blocks`` words; a register when ``max_blocks`` is 1).

    Parameters
    ----------
    lanes : int
        Codes per beat (``HwConfig.lanes``).
    max_height, max_width : int
        Largest feature-map sizes (the ISA's 12-bit fields by default).
    max_blocks : int
        Most channel blocks per row (the range of ``blocks`` and the depth of the scale
        register file); 1 by default.
    shared_products : bool
        The lanes' multipliers are outside the unit (``p_products``, ``m_products``).

    Signature
    ---------
    i_stream : In(stream.Signature(ArrayLayout(8, lanes)))
        Feature map ``a``: ``in_h`` rows of ``blocks`` segments of ``in_w`` beats; the next
        group follows without a gap.
    s_stream : In(stream.Signature(ArrayLayout(8, lanes)))
        With ``per_pixel`` (Eltwise.MUL): the codes ``b`` of a tensor of the feature map's
        shape, one beat with each pixel, in the same order (a pixel waits for its beat).
        Otherwise scale codes ``b`` (the ``shortcut`` tensor, ``C × 1 × 1``): ``blocks`` beats per group,
        in block order. They are read as soon as they are offered, from the cycle after the
        previous group's last pixel was accepted (from reset for the first group) until
        ``blocks`` of them are stored — independently of ``i_stream`` and ``o_stream``, so a
        producer may deliver the whole vector before the feature map. A pixel of block *b*
        that arrives before scale beat *b* waits for it; the scale beat may arrive in the same
        cycle as the pixel and is used at once (no added latency).
    o_stream : Out(stream.Signature(ArrayLayout(8, lanes)))
        Scaled codes, one beat per input beat, in the input's order.
    enable : In(1)
        Configuration: 0 bypasses the stage (``o_stream`` is ``i_stream``, combinationally;
        ``s_stream`` is not read).
    per_pixel : In(1)
        Configuration: ``b`` comes with every pixel (Eltwise.MUL), not once per channel block.
    in_h, in_w : In(...)
        Configuration: pixels per channel block.
    blocks : In(range(1, max_blocks + 1), init=1)
        Configuration: channel blocks per row (scale beats per group).
    a_signed, a_zp, b_signed, b_zp, multiplier, y_zp, out_signed :
        Configuration, as in :class:`ChannelScaleLane` (instruction: ``sc_signed``/``sc_zp``
        for ``b``; post record: ``eltwise_const[0]`` and the eltwise stage's zero point/type).
    p_products, m_products : Out(Product).array(lanes)
        With ``shared_products``: the lanes' multipliers, built by the owner
        (:func:`~.shared_product.multiply`), which may share them with a unit never enabled
        together with this one; otherwise each lane has its own.

    Configuration may change only between groups: once every input beat has been accepted
    and every output beat delivered.

    Timing: one beat per cycle; latency :attr:`LATENCY` (9) cycles. A stall on ``o_stream``
    holds the pipeline as a whole, so nothing inside is lost or duplicated
    (:class:`~.held_output.HeldOutput`: the lanes run on and their beats wait in a small
    queue; the handshakes are those of a clock-enable hold). The
    feature map waits only for scale beats not yet offered (in the first row).
    """

    LATENCY = ChannelScaleLane.LATENCY

    def __init__(self, lanes: int, max_height: int = 4095, max_width: int = 4095,
                 max_blocks: int = 1, shared_products: bool = False):
        if lanes < 1 or max_height < 1 or max_width < 1 or max_blocks < 1:
            raise ValueError(f"lanes, sizes and max_blocks must be positive ({lanes}, "
                             f"{max_height}, {max_width}, {max_blocks})")
        self.lanes = lanes
        self.max_height = max_height
        self.max_width = max_width
        self.max_blocks = max_blocks
        self.shared_products = shared_products
        beat = code_beat(lanes)
        super().__init__({
            **products_members({"p": ChannelScaleLane.CODE_PRODUCT,
                                "m": ChannelScaleLane.SIGNIFICAND_PRODUCT},
                               lanes, shared_products),
            "i_stream": In(beat),
            "s_stream": In(beat),
            "o_stream": Out(beat),
            "enable": In(1),
            "per_pixel": In(1),
            "in_h": In(range(1, max_height + 1)),
            "in_w": In(range(1, max_width + 1)),
            "blocks": In(range(1, max_blocks + 1), init=1),
            "a_signed": In(1),
            "a_zp": In(signed(9)),
            "b_signed": In(1),
            "b_zp": In(signed(9)),
            "multiplier": In(32),
            "y_zp": In(signed(9)),
            "out_signed": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        lanes = self.lanes

        # The lanes run freely; their output waits in ``held``, whose handshakes are those
        # of the lanes held as a whole while the output waits (hw.held_output).
        m.submodules.held = held = HeldOutput(8 * lanes, self.LATENCY)
        advance = held.advance

        column = Signal(range(self.max_width))
        # (at least one bit: a zero-width signal becomes an invalid Verilog range)
        segment = Signal(range(max(self.max_blocks, 2)))    # channel block of the next pixel
        row = Signal(range(self.max_height))
        segment_end = column == self.in_w - 1
        last_segment = segment == self.blocks - 1
        last_row = row == self.in_h - 1
        last_pixel = segment_end & last_segment & last_row

        # Scale beats of the group stored so far. In the first row the pixels of block b come
        # after those of blocks < b, which needed their scale beats: loaded ≥ segment always,
        # and loaded == segment means the beat of this block is still to come.
        # With ``per_pixel`` every pixel takes the beat offered with it.
        loaded = Signal(range(self.max_blocks + 1))
        scale_missing = (loaded == segment) | self.per_pixel
        scale_ready = ~scale_missing | self.s_stream.valid
        s_take = Signal()
        accept = Signal()
        m.d.comb += [
            accept.eq(self.enable & advance & self.i_stream.valid & scale_ready),
            held.accept.eq(accept),
            self.s_stream.ready.eq(self.enable & Mux(self.per_pixel, accept,
                                                     loaded != self.blocks)),
            s_take.eq(self.s_stream.valid & self.s_stream.ready & ~self.per_pixel),
        ]
        next_segment = Signal.like(segment)
        m.d.comb += next_segment.eq(Mux(accept & segment_end,
                                        Mux(last_segment, 0, segment + 1), segment))
        m.d.sync += segment.eq(next_segment)
        with m.If(accept):
            m.d.sync += column.eq(Mux(segment_end, 0, column + 1))
            with m.If(segment_end & last_segment):
                m.d.sync += row.eq(Mux(last_row, 0, row + 1))
        with m.If(accept & last_pixel):
            m.d.sync += loaded.eq(0)                    # the next group brings new scales
        with m.Elif(s_take):
            m.d.sync += loaded.eq(loaded + 1)

        stored = Signal(data.ArrayLayout(8, lanes))
        if self.max_blocks == 1:
            with m.If(s_take):
                m.d.sync += stored.eq(self.s_stream.payload)
        else:
            m.submodules.scales = scales = Memory(shape=data.ArrayLayout(8, lanes),
                                                  depth=self.max_blocks, init=[],
                                                  attrs=UNCHECKED_COLLISIONS)
            # Block RAM: the port reads the next cycle's block. A beat stored in the last
            # cycle at that block comes from a register instead (compared register with
            # register), so a read that collides with the write is never used.
            # ``stored`` is only used once a beat has been stored after a restart, so the
            # read in a restart cycle (of a stale block) is never used either.
            write = scales.write_port()
            read = unchecked_read(m, scales, next_segment, "scale_read")
            took = Signal()
            took_block = Signal.like(loaded)
            took_beat = Signal.like(self.s_stream.payload)
            m.d.sync += took.eq(s_take)
            with m.If(s_take):
                m.d.sync += [took_block.eq(loaded), took_beat.eq(self.s_stream.payload)]
            m.d.comb += [
                write.addr.eq(loaded), write.data.eq(self.s_stream.payload),
                write.en.eq(s_take),
                stored.eq(Mux(took & (took_block == segment), took_beat, read)),
            ]
        current_scale = Signal(data.ArrayLayout(8, lanes))
        m.d.comb += current_scale.eq(Mux(scale_missing, self.s_stream.payload, stored))

        for lane in range(lanes):
            m.submodules[f"lane_{lane}"] = unit = ChannelScaleLane()
            lane_products(m, self, unit, lane, ("p", "m"))
            m.d.comb += [
                unit.a.eq(self.i_stream.payload[lane]),
                unit.b.eq(current_scale[lane]),
                unit.valid.eq(accept),
                unit.a_signed.eq(self.a_signed), unit.a_zp.eq(self.a_zp),
                unit.b_signed.eq(self.b_signed), unit.b_zp.eq(self.b_zp),
                unit.multiplier.eq(self.multiplier),
                unit.y_zp.eq(self.y_zp), unit.out_signed.eq(self.out_signed),
                held.payload[8 * lane:8 * (lane + 1)].eq(unit.y[:8]),
            ]

        with m.If(self.enable):
            m.d.comb += [
                self.o_stream.payload.eq(held.o_stream.payload),
                self.o_stream.valid.eq(held.o_stream.valid),
                held.o_stream.ready.eq(self.o_stream.ready),
                self.i_stream.ready.eq(advance & scale_ready),
            ]
        with m.Else():
            m.d.comb += pass_through(self.i_stream, self.o_stream)
        return m
