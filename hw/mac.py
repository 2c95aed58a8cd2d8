"""Shared MAC multiplier: two signed 9×9 products from one wide multiply (ShortcutFusion Fig. 7).

In a normal convolution one input value ``x`` meets the weights of two output channels, so one
multiplier can compute both products. The two weights are placed side by side in one 27-bit
operand, ``w1`` in the top 9 bits and ``w0`` as an 18-bit two's-complement field below it, and
multiplied by ``x``: a 27×18-bit multiply, the shape of one DSP48E2. Operands are 9-bit signed
(``x − x_zp`` and ``w − w_zp`` of 8-bit signed or unsigned tensors), so both fields of the
product are signed; correction logic after the multiplier recovers both products exactly (see
:meth:`SharedMac.split_packed_product`). A depthwise convolution has no shared input, so it uses
one product per multiplier (Fig. 7b).

Why not ``(w1·2¹⁸ + w0)·x`` with the DSP pre-adder: for ``w1 = −256`` and ``w0 < 0`` that sum
needs 28 bits and no longer fits the 27-bit port. The side-by-side packing always fits.

ECP5's MULT18X18D cannot hold a 27-bit operand, so ``packing=False`` builds two ordinary 9×9
multipliers with the same ports, latency and results.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["OPERAND_BITS", "PRODUCT_BITS", "PACK_SHIFT", "SharedMac"]

#: Width of the signed multiplier operands (an 8-bit value minus its zero point).
OPERAND_BITS = 9
#: Width of one signed product: |x·w| ≤ 2¹⁶, so 18 bits hold it with room to spare.
PRODUCT_BITS = 2 * OPERAND_BITS
#: Position of ``w1`` in the packed operand: one product width, so the fields never overlap.
PACK_SHIFT = PRODUCT_BITS


class SharedMac(wiring.Component):
    """Two signed products ``x·w0`` and ``x·w1`` that share the input operand ``x``.

    Parameters
    ----------
    packing : bool
        True: one 27×9-bit multiply ``(w1·2¹⁸ + (w0 mod 2¹⁸)) · x`` plus correction logic
        (one DSP48E2).
        False: two separate 9×9 multipliers (ECP5 MULT18X18D). Same ports, latency, results.

    Signature
    ---------
    x : In(signed(9))
        Input feature value (``x − x_zp``), shared by both products.
    w0, w1 : In(signed(9))
        Weights (``w − w_zp``) of two output channels.
    depthwise : In(1)
        Single-product mode: ``p0 = x·w0`` and ``p1 = 0`` (``w1`` is ignored and gated to
        zero before the multiplier, so the unused half does not toggle).
    valid : In(1)
        Marks a cycle whose operands are meaningful; delayed alongside the data.
    p0, p1 : Out(signed(18))
        ``x·w0`` and ``x·w1`` (``0`` in depthwise mode), exact for all 9-bit operands.
    p_valid : Out(1)
        ``valid`` delayed by :attr:`LATENCY`.

    Timing: fully pipelined, one operand set per cycle, no back-pressure. Operands applied in
    cycle *k* appear on ``p0``/``p1`` in cycle *k* + :attr:`LATENCY` (2): a product register
    (the DSP's M register) and an output register holding the corrected products (P register).
    """

    #: Cycles from operands to products.
    LATENCY = 2

    def __init__(self, packing: bool = True):
        self.packing = bool(packing)
        super().__init__({
            "x": In(signed(OPERAND_BITS)),
            "w0": In(signed(OPERAND_BITS)),
            "w1": In(signed(OPERAND_BITS)),
            "depthwise": In(1),
            "valid": In(1),
            "p0": Out(signed(PRODUCT_BITS)),
            "p1": Out(signed(PRODUCT_BITS)),
            "p_valid": Out(1),
        })

    @staticmethod
    def split_packed_product(product, w0_sign_term):
        """The signed products ``(x·w0, x·w1)`` inside ``product = packed · x``.

        ``packed = w1·2¹⁸ + (w0 mod 2¹⁸)`` is ``w1·2¹⁸ + w0 + s0·2¹⁸`` with ``s0 = (w0 < 0)``,
        so ``product = x·w1·2¹⁸ + x·w0 + s0·x·2¹⁸``. Its low 18 bits are ``x·w0`` modulo 2¹⁸,
        and since ``|x·w0| ≤ 2¹⁶`` they *are* that product, read as signed. The upper field
        holds ``x·w1`` plus two corrections to undo: ``s0·x`` (``w0`` was not sign-extended
        into the upper field; ``w0_sign_term`` is ``x`` when ``w0 < 0``, else 0) and −1 when
        ``x·w0 < 0`` (the low product borrowed from it: its sign bit). Returns Amaranth values.
        """
        low = product[:PRODUCT_BITS]
        high = product[PACK_SHIFT:PACK_SHIFT + PRODUCT_BITS]
        borrow = low[PRODUCT_BITS - 1]
        return low.as_signed(), (high + borrow - w0_sign_term)[:PRODUCT_BITS].as_signed()

    def elaborate(self, platform):
        m = Module()

        # Depthwise mode: the second weight is gated off; with packing, the upper field then holds
        # only the two corrections, which cancel, so p1 comes out 0.
        w1 = Mux(self.depthwise, 0, self.w1)

        # Stage 1 (M register): the raw multiplier output(s).
        if self.packing:
            # {w1, w0 sign-extended to 18 bits}: 27 bits, the DSP48E2 A port.
            w0_field = Cat(self.w0, self.w0[-1].replicate(PACK_SHIFT - OPERAND_BITS))
            packed = Cat(w0_field, w1).as_signed()
            product = Signal(signed(PACK_SHIFT + 2 * OPERAND_BITS), reset_less=True)
            w0_sign_term = Signal(signed(OPERAND_BITS), reset_less=True)
            m.d.sync += [
                product.eq(packed * self.x),                   # 27 × 9 bits: one DSP48E2
                w0_sign_term.eq(Mux(self.w0 < 0, self.x, 0)),
            ]
            p0, p1 = self.split_packed_product(product, w0_sign_term)
        else:
            p0 = Signal(signed(PRODUCT_BITS), reset_less=True)
            p1 = Signal(signed(PRODUCT_BITS), reset_less=True)
            m.d.sync += [
                p0.eq(self.x * self.w0),
                p1.eq(self.x * w1),
            ]
        stage1_valid = Signal()
        m.d.sync += stage1_valid.eq(self.valid)

        # Stage 2 (P register): corrected products.
        m.d.sync += [
            self.p0.eq(p0),
            self.p1.eq(p1),
            self.p_valid.eq(stage1_valid),
        ]
        return m
