"""Pipeline registers and rounding shared by the float32-exact arithmetic blocks.

:func:`stage` and :func:`delay` build the reset-less datapath registers of the requantiser, the
SE channel scale and the QLinearAdd unit; :func:`round_half_even` is the one round-to-nearest,
ties-to-even step they (and the average pool) apply to significands and fixed-point values;
:func:`round_significant` rounds an integer to a float32's 24 significant bits;
:func:`signed_sum_magnitude` adds a signed constant to a sign-and-magnitude value;
:func:`leading_zeros` counts a value's leading zeros; :func:`split_significand_product`
multiplies two significands with one hardware multiplier and logic.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Mux, Signal, signed

__all__ = ["stage", "delay", "round_half_even", "round_significant", "signed_sum_magnitude",
           "leading_zeros", "MULTIPLIER_WIDTH", "logic_product", "split_significand_product"]

#: Significant bits of a float32.
FLOAT32_SIGNIFICAND = 24


def stage(m, value, name: str, shape=None):
    """One pipeline register holding ``value``; datapath registers need no reset."""
    reg = Signal(shape if shape is not None else value.shape(), name=name, reset_less=True)
    m.d.sync += reg.eq(value)
    return reg


def delay(m, value, cycles: int, name: str):
    """``value`` through ``cycles`` pipeline registers."""
    for i in range(cycles):
        value = stage(m, value, f"{name}_{i + 1}")
    return value


def round_half_even(value, drop: int):
    """``value`` shifted right by ``drop`` bits, rounded to nearest, ties to even.
    The result is one bit wider than ``value[drop:]`` (the rounding may carry out)."""
    kept = value[drop:]
    guard = value[drop - 1]
    sticky = value[:drop - 1].any() if drop > 1 else Const(0)
    return kept + (guard & (sticky | kept[0]))


def round_significant(value, width: int, keep: int = FLOAT32_SIGNIFICAND):
    """``value`` (unsigned, ``width`` bits) rounded to ``keep`` significant bits, to nearest,
    ties to even, staying an integer (the dropped bits become 0). ``width + 1`` bits."""
    droppable = width - keep
    if droppable <= 0:
        return value
    # dropped[i]: bit i is dropped, i.e. the leading one is at keep + i or above.
    dropped = [value[i + keep:].any() for i in range(droppable)] + [Const(0, 1)]
    guard = Cat(*(value[i] & dropped[i] & ~dropped[i + 1]
                  for i in range(droppable))).any()
    sticky = Cat(*(value[i] & dropped[i + 1] for i in range(droppable))).any()
    last_kept = Cat(Const(0, 1), *(~dropped[i] & dropped[i - 1]
                                   for i in range(1, droppable + 1)))   # one-hot, or 0
    odd = (value[:droppable + 1] & last_kept).any()
    mask = Cat(*(~bit for bit in dropped[:droppable]), Const((1 << keep) - 1, keep))
    return (value & mask) + Mux(guard & (sticky | odd), last_kept, 0)


def signed_sum_magnitude(m, negative, magnitude, addend, minus_addend, width: int):
    """``(−1)^negative · magnitude + addend`` as ``(|sum|, sum < 0)``, ``width`` bits signed
    for the sum. The sum and its negation are formed side by side (``minus_addend`` is
    ``−addend``, given so a caller can register it) and the sum's sign picks one: no negation
    follows the adder."""
    total, negated = Signal(signed(width)), Signal(signed(width))
    m.d.comb += [total.eq(Mux(negative, addend - magnitude, addend + magnitude)),
                 negated.eq(Mux(negative, magnitude + minus_addend, minus_addend - magnitude))]
    below = total < 0
    return Mux(below, negated, total)[:width - 1], below


def leading_zeros(value):
    """Leading zeros of ``value`` as a log-depth tree of multiplexers, not a priority chain.
    The count is meaningless for 0 (it is 2^k − 1 for a 2^k-bit ``value``)."""
    width = 1
    while width < len(value):
        width *= 2
    padded = Cat(Const(0, width - len(value)), value)        # pad below: same leading zeros

    def tree(bits):
        if len(bits) == 2:
            return ~bits[1] & ~bits[0], ~bits[1]
        half = len(bits) // 2
        high_zero, high_count = tree(bits[half:])
        low_zero, low_count = tree(bits[:half])
        return high_zero & low_zero, Mux(high_zero, Cat(low_count, 1), Cat(high_count, 0))

    return tree(padded)[1]


#: Operand width of one hardware multiplier for unsigned operands (ECP5's MULT18X18D; an
#: UltraScale DSP48E2 takes 27 × 18 bits signed, so it holds this too).
MULTIPLIER_WIDTH = 18


def logic_product(m, a, b, name: str):
    """``a · b`` for unsigned ``a`` and ``b`` as a sum of ``a`` shifted by ``b``'s set bits,
    added as a balanced tree: no multiplication for synthesis to map onto a hardware
    multiplier. For a narrow ``b``, where a multiplier would be mostly idle. Each sum is a
    signal of its own, kept, so that synthesis maps it onto a carry chain rather than
    merging the tree into one multi-operand adder of LUTs."""
    terms = [Mux(b[i], a << i, 0) for i in range(len(b))]
    level = 0
    while len(terms) > 1:
        sums = []
        for i in range(0, len(terms) - 1, 2):
            total = terms[i] + terms[i + 1]
            kept = Signal(total.shape(), name=f"{name}_sum_{level}_{i // 2}",
                          attrs={"keep": 1})
            m.d.comb += kept.eq(total)
            sums.append(kept)
        terms = sums + terms[len(terms) - len(terms) % 2:]
        level += 1
    return terms[0]


def split_significand_product(m, a, b, name: str):
    """The exact unsigned product ``a · b`` of operands of up to 24 bits in two register
    stages, with one hardware multiplier: each operand is split below its top
    :data:`MULTIPLIER_WIDTH` bits, the stage-1 registers take the product of the two top
    parts (the multiplier) and the narrow cross products (:func:`logic_product`), and the
    stage-2 register their sum. A 24 × 24-bit product takes one MULT18X18D instead of four,
    for about 560 LUT positions more on ECP5 (the requantiser alone: 1 261 against 702), and
    no adder follows the multiplier in its stage."""
    for operand in (a, b):
        if len(operand) > FLOAT32_SIGNIFICAND:
            raise ValueError(f"{name}: operands of at most {FLOAT32_SIGNIFICAND} bits")
    cut_a, cut_b = max(0, len(a) - MULTIPLIER_WIDTH), max(0, len(b) - MULTIPLIER_WIDTH)
    a_high, b_high = a[cut_a:], b[cut_b:]
    parts = [(stage(m, a_high * b_high, f"{name}_high"), cut_a + cut_b)]
    narrow = []
    if cut_b:
        narrow.append((a_high, b[:cut_b], cut_a, "a_high"))
    if cut_a:
        narrow.append((b_high, a[:cut_a], cut_b, "b_high"))
    if cut_a and cut_b:
        narrow.append((a[:cut_a], b[:cut_b], 0, "low"))
    for wide, bits, shift, part in narrow:
        product = logic_product(m, wide, bits, f"{name}_{part}")
        parts.append((stage(m, product, f"{name}_{part}"), shift))
    total = sum((part << shift for part, shift in parts[1:]), parts[0][0] << parts[0][1])
    return stage(m, total, name, len(a) + len(b))
