"""Constants, layouts and small helpers shared by the group controller's components."""

from __future__ import annotations

from math import ceil

from amaranth.hdl import Cat, Const, Mux, Signal
from amaranth.lib import data

from sfnpu import isa, layout

from ..conv_array import array_latency
from ..requant import Requantizer

__all__ = ["INSTRUCTION_BYTES", "POST_WORDS", "result_fifo_depth", "results_in_flight",
           "FLOAT32_ONE", "TAG_INPUT", "TAG_WEIGHTS", "TAG_SHORTCUT", "TAG_PREFETCH",
           "ISA", "log2", "param_aligned", "one_hot", "post_word", "stage_zp", "stage_signed",
           "code_types", "fetch_beats", "shifted_in", "instruction_shift",
           "aligned_instruction", "next_chunk", "split_product", "fifo_room"]

INSTRUCTION_BYTES = isa.WORDS * isa.WORD_BITS // 8
#: The post record (:data:`sfnpu.layout.POST_RECORD`) as 32-bit words.
POST_WORDS = layout.POST_RECORD.itemsize // 4


def results_in_flight(config) -> int:
    """Results still on their way to the result FIFO after the array takes a step (array,
    partial-sum stage, requantiser): the datapath holds while the FIFO's level plus these
    would overflow it."""
    from .accumulator import Accumulator
    return array_latency(config) + Accumulator.LATENCY + Requantizer.LATENCY + 2


def result_fifo_depth(config) -> int:
    """Words of the result FIFO between the requantisers and the post-processing chain: 32,
    or the smallest power of two that holds twice the results in flight (a deeper array,
    kcu1500's)."""
    depth = 32
    while depth < 2 * results_in_flight(config):
        depth *= 2
    return depth


ISA = data.Layout.cast(isa.InstructionLayout)
FLOAT32_ONE = 0x3F800000
#: Tags of the compute phase's DMA reads (the order their data comes back in).
TAG_INPUT, TAG_WEIGHTS, TAG_SHORTCUT, TAG_PREFETCH = 0, 1, 2, 3

_STAGE = {name: k for k, name in enumerate(layout.STAGES)}
_POST_FIELD_WORD = {name: layout.POST_RECORD.fields[name][1] // 4
                    for name in layout.POST_RECORD.names}


def log2(n: int) -> int:
    assert n & (n - 1) == 0, n
    return n.bit_length() - 1


def param_aligned(value, config):
    """``value`` rounded up to the alignment of ``config``'s parameter sections."""
    align = layout.param_align(config)
    return ((value + align - 1) >> log2(align)) << log2(align)


def one_hot(index, count):
    return Const(1, count) << index


def post_word(post, field, index=0):
    """Word ``index`` of the post record's ``field`` (``post``: the record's words, word 0
    lowest)."""
    k = _POST_FIELD_WORD[field] + index
    return post[32 * k:32 * (k + 1)]


def stage_zp(post, stage):
    return post_word(post, "zp", _STAGE[stage])[:9].as_signed()


def stage_signed(post, stage):
    return post_word(post, "signed", _STAGE[stage])[0]


def code_types(instr, post, has_ct, identity):
    """The type (signedness, zero point) of the convolution's input — the transformed one
    (from the post record; also the padding value) or the instruction's — and of the codes
    the requantisers produce (conv NONE passes codes unchanged)."""
    x_signed = Mux(has_ct, stage_signed(post, "in_transform"), instr.in_signed)
    x_zp = Mux(has_ct, stage_zp(post, "in_transform"),
               Mux(instr.in_signed, instr.in_zp.as_signed(), instr.in_zp))
    conv_signed = Mux(identity, x_signed, stage_signed(post, "conv"))
    conv_zp = Mux(identity, x_zp, stage_zp(post, "conv"))
    return x_signed, x_zp, conv_signed, conv_zp


def fetch_beats(bus_bytes: int) -> int:
    """Bus beats of an instruction read (an instruction starts at any 32-bit word)."""
    return ceil((bus_bytes - 4 + INSTRUCTION_BYTES) / bus_bytes)


def shifted_in(buf, beat):
    """An instruction buffer with the bus beat shifted in at the top."""
    return Cat(buf[len(beat):], beat)


def instruction_shift(m, address, bus_bytes, name):
    """The bit offset of the instruction at byte ``address`` in its fetch buffer once its read
    has shifted in (:func:`shifted_in`) every beat: ``(fetch_beats − beats)·B + address mod B``
    bytes, where the read of ``INSTRUCTION_BYTES`` from ``address`` takes ``beats`` beats.
    A register formed every cycle from the address's low bits, which hold still from the read's
    command to its alignment: the alignment's shifter has no arithmetic in front of it."""
    B = bus_bytes
    shift = Signal(range(fetch_beats(B) * B * 8), name=name)
    with m.Switch(address[2:log2(B)] if B > 4 else Const(0, 1)):
        for word in range(B // 4):
            byte = 4 * word
            beats = ceil((byte + INSTRUCTION_BYTES) / B)
            with m.Case(word):
                m.d.sync += shift.eq((fetch_beats(B) - beats) * B * 8 + byte * 8)
    return shift


def aligned_instruction(buf, shift):
    """The instruction ``shift`` bits into ``buf`` (:func:`instruction_shift`)."""
    return buf.bit_select(shift, ISA.size)


def next_chunk(ob_base, ob_count, out_blocks, chunk_obs):
    """The next chunk of output-channel blocks: (first block, blocks, whether there is one)."""
    next_ob = ob_base + ob_count
    next_rest = out_blocks - next_ob
    return next_ob, Mux(next_rest < chunk_obs, next_rest, chunk_obs), next_ob < out_blocks


def split_product(m, a, b, name: str) -> Signal:
    """``a · b`` (unsigned) in two register stages, formed every cycle: the products of
    ``b``'s two halves, then their sum. It is that of the operands two cycles before; a
    multiplier no wider than 18 × 18 bits per half, and no adder behind it in that cycle."""
    half = (len(b) + 1) // 2
    low = Signal(len(a) + half, name=f"{name}_low")
    high = Signal(len(a) + len(b) - half, name=f"{name}_high")
    product = Signal(len(a) + len(b), name=name)
    m.d.sync += [low.eq(a * b[:half]), high.eq(a * b[half:]),
                 product.eq(low + (high << half))]
    return product


def fifo_room(m, fifo, words, granted, *, flush, start, counted=None, name="room"):
    """Whether ``fifo`` has room for ``words`` more words besides those in it or commanded
    (an agent's request test), from registers only: no adder sits in front of the command
    arbiter, and the FIFO's reader (often the end of a long ready chain) reaches a single
    flip-flop.

    The words in or commanded are one register, the FIFO's level plus those in flight
    (``granted`` at a grant), less the word read in the cycle before (``popped``, a register
    of its own, taken out a cycle later). A pushed word was in flight (``counted=None``):
    it moves into the FIFO and the sum stays, so the read data's path (from the DRAM's
    read queue through the DMA and the router) does not reach the register. Otherwise
    ``counted`` says which pushed words were in flight; the others add to the sum. Nothing
    is in flight at ``start`` (the last compute phase ended with all its reads in) and after
    ``flush`` (the FIFO's reset). ``words`` is final before ``start``, so the limits are
    registers too. Words are requested only with room for them, so a push never finds the
    FIFO full."""
    committed = Signal(range(2 * fifo.depth + 2), name=f"{name}_committed")
    popped = Signal(name=f"{name}_popped")
    arrived = 0 if counted is None else fifo.w_en & fifo.w_rdy & ~counted
    with m.If(flush):
        m.d.sync += committed.eq(0)
    with m.Elif(start):
        m.d.sync += committed.eq(fifo.level + arrived)
    with m.Else():
        m.d.sync += committed.eq(committed - popped + granted + arrived)
    m.d.sync += popped.eq(fifo.r_rdy & fifo.r_en & ~flush)
    # committed − popped ≤ depth − words, with popped a bit.
    limit = Signal(range(fifo.depth + 1), name=f"{name}_limit")
    limit_popped = Signal(range(fifo.depth + 2), name=f"{name}_limit_popped")
    fits = Signal(name=f"{name}_fits")
    room = Mux(words > fifo.depth, 0, fifo.depth - words)
    m.d.sync += [limit.eq(room), limit_popped.eq(room + 1), fits.eq(words <= fifo.depth)]
    return fits & Mux(popped, committed <= limit_popped, committed <= limit)
