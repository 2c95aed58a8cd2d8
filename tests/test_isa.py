"""The group instruction: layout, encoder, decoder, validation, and its use as an HDL shape."""

import dataclasses

import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import data
from amaranth.sim import Simulator
from hypothesis import given, strategies as st

from sfnpu import isa
from sfnpu.isa import (Activation, ConvKind, Eltwise, Instruction, InstructionError, MemSpace,
                       Pool, buffer, dram)
from strategies import instructions, programs


def conv3x3(**changes) -> Instruction:
    base = Instruction(conv=ConvKind.NORMAL, kh=3, kw=3, pad_top=1, pad_left=1, pad_bottom=1,
                       pad_right=1, in_h=8, in_w=8, out_h=8, out_w=8, in_c=3, out_c=8,
                       input=dram(0x100), output=buffer(0), weights=dram(0x1000),
                       params=dram(0x2000), last=1)
    return base.replace(**changes)


# -- layout ----------------------------------------------------------------------------------

def test_exactly_eleven_words():
    assert data.Layout.cast(isa.InstructionLayout).size == isa.WORDS * isa.WORD_BITS == 352
    assert len(isa.encode(conv3x3())) == 11


def test_field_table_tiles_all_bits_without_overlap_or_straddling():
    covered = [None] * (isa.WORDS * isa.WORD_BITS)
    for f in isa.field_table():
        assert f.lsb + f.width <= isa.WORD_BITS, f"{f.name} straddles a word"
        for b in range(f.word * 32 + f.lsb, f.word * 32 + f.lsb + f.width):
            assert covered[b] is None, f"bit {b} in {covered[b]} and {f.name}"
            covered[b] = f.name
    assert None not in covered


def test_every_non_reserved_field_is_documented_and_in_the_python_view():
    names = {f.name.split(".")[0] for f in isa.field_table() if f.kind != "reserved"}
    assert names == {f.name for f in dataclasses.fields(Instruction)}
    assert {f.name for f in isa.field_table() if "." not in f.name and f.kind != "reserved"} \
        <= set(isa.FIELD_DOCS)


# -- round trip ------------------------------------------------------------------------------

@given(instructions())
def test_round_trip(instr):
    words = isa.encode(instr)
    assert all(0 <= w < 1 << 32 for w in words)
    decoded = isa.decode(words)
    assert decoded == instr
    assert isa.encode(decoded) == words


@given(instructions(), st.integers(0, isa.WORDS * isa.WORD_BITS - 1))
def test_any_single_bit_flip_decodes_cleanly_or_is_rejected(instr, bit):
    words = list(isa.encode(instr))
    words[bit // 32] ^= 1 << (bit % 32)
    try:
        decoded = isa.decode(words)
    except InstructionError as e:
        assert e.field and e.reason
    else:
        assert list(isa.encode(decoded)) == words


@given(programs())
def test_program_round_trip(program):
    blob = isa.encode_program(program)
    assert len(blob) == 44 * len(program)
    assert isa.decode_program(blob) == program
    # Trailing bytes after the last group are not part of the program.
    assert isa.decode_program(blob + bytes(44)) == program


# -- encoder errors name the field -----------------------------------------------------------

@pytest.mark.parametrize("field, value, message", [
    ("in_h", 4096, "out of range 0..4095"),
    ("in_c", -1, "out of range 0..65535"),
    ("in_zp", 256, "out of range 0..255"),
    ("last", 2, "out of range 0..1"),
    ("kh", 8, "out of range 0..7"),
    ("conv", 1, "must be a ConvKind member"),
    ("input", 0x100, "must be a Location"),
    ("in_w", 3.0, "must be an integer"),
    ("upsample", True, "must be an integer"),
])
def test_encoder_rejects_unrepresentable_values(field, value, message):
    with pytest.raises(InstructionError, match=message) as e:
        isa.encode(conv3x3(**{field: value}))
    assert e.value.field == field and e.value.value == value


def test_signed_fields_follow_their_tensor():
    assert isa.decode(isa.encode(conv3x3(in_signed=1, in_zp=-128))).in_zp == -128
    with pytest.raises(InstructionError, match="in_zp.*-128..127"):
        isa.encode(conv3x3(in_signed=1, in_zp=200))
    with pytest.raises(InstructionError, match="in_zp.*0..255"):
        isa.encode(conv3x3(in_zp=-1))


def test_location_offset_range():
    with pytest.raises(InstructionError, match=r"input\.offset"):
        isa.encode(conv3x3(input=dram(1 << 30)))
    with pytest.raises(InstructionError, match="buffers are 0, 1 and 2"):
        buffer(3)


@pytest.mark.parametrize("changes, field", [
    (dict(out_h=7), "out_h"),
    (dict(out_w=16), "out_w"),
    (dict(in_c=0), "in_c"),
    (dict(kh=0), "kh"),
    (dict(sh=3, out_h=3), "sh"),
    (dict(pad_top=3), "pad_top"),
    (dict(conv=ConvKind.DEPTHWISE), "out_c"),
    (dict(conv=ConvKind.NONE), "kh"),
    (dict(weights=buffer(1)), "weights"),
    (dict(params=buffer(2)), "params"),
    (dict(pool=Pool.MAX, out_h=4, out_w=4), "pool_size"),
    (dict(pool=Pool.MAX, pool_size=2, pool_stride=2, pool_count_pad=1, out_h=4, out_w=4),
     "pool_count_pad"),
    (dict(pool=Pool.MAX, pool_size=2, pool_stride=2, pool_pad=2, out_h=6, out_w=6),
     "pool_pad"),
    (dict(pool=Pool.GLOBAL_AVG, out_h=2, out_w=2, upsample=1), "upsample"),
    (dict(pool_size=2), "pool_size"),
    (dict(act=Activation.CLAMP, clamp_lo=9, clamp_hi=3), "clamp_lo"),
    (dict(act=Activation.TABLE, clamp_hi=3), "clamp_hi"),
    (dict(sc_zp=4), "sc_zp"),
    (dict(shortcut=buffer(2)), "shortcut"),
    (dict(eltwise=Eltwise.ADD, input=buffer(1), shortcut=buffer(1, 0x800)), "shortcut"),
    (dict(act_order=isa.ActOrder.BEFORE_ELTWISE), "act_order"),
    (dict(out_c_offset=0xFFFF), "out_c_offset"),
])
def test_semantic_rules(changes, field):
    with pytest.raises(InstructionError) as e:
        isa.encode(conv3x3(**changes))
    assert e.value.field == field, str(e.value)


def test_valid_variants_are_accepted():
    # Pooling in floor and ceil mode, upsample, concat offset, both element-wise kinds.
    isa.encode(conv3x3(pool=Pool.MAX, pool_size=3, pool_stride=2, out_h=3, out_w=4))
    isa.encode(conv3x3(pool=Pool.AVG, pool_size=3, pool_stride=1, pool_pad=1,
                       pool_count_pad=1, upsample=1, out_h=16, out_w=16, out_c_offset=24))
    isa.encode(conv3x3(eltwise=Eltwise.ADD, shortcut=buffer(2, 64), sc_zp=7))
    isa.encode(conv3x3(eltwise=Eltwise.CHANNEL_SCALE, shortcut=dram(0x40), sc_signed=1,
                       sc_zp=-3, act_order=isa.ActOrder.BEFORE_ELTWISE, act=Activation.TABLE))


# -- decoder errors --------------------------------------------------------------------------

def _field(name):
    return next(f for f in isa.field_table() if f.name == name)


def _set_bits(words, name, value):
    f = _field(name)
    mask = ((1 << f.width) - 1) << f.lsb
    words[f.word] = (words[f.word] & ~mask) | (value << f.lsb)
    return words


@pytest.mark.parametrize("name", [f.name for f in isa.field_table() if f.kind not in
                                  ("reserved", "uint", "int8/uint8")])
def test_every_illegal_enum_value_is_rejected(name):
    f = _field(name)
    enum_type = next(e for e in isa.enum_types() if e.__name__ == f.kind)
    legal = {m.value for m in enum_type}
    illegal = [v for v in range(1 << f.width) if v not in legal]
    for value in illegal:
        with pytest.raises(InstructionError, match=f"illegal {f.kind}") as e:
            isa.decode(_set_bits(list(isa.encode(conv3x3())), name, value))
        assert e.value.field == name and e.value.value == value


def test_reserved_bits_are_rejected_and_every_other_bit_is_a_field():
    table = isa.field_table()
    for f in (f for f in table if f.kind == "reserved"):
        for bit in range(f.width):
            with pytest.raises(InstructionError, match="reserved bits") as e:
                isa.decode(_set_bits(list(isa.encode(conv3x3())), f.name, 1 << bit))
            assert e.value.field == f.name
    bits = sorted(f.word * 32 + f.lsb + k for f in table for k in range(f.width))
    assert bits == list(range(isa.WORDS * 32))      # no bit is both fields, or neither


def test_erased_memory_is_an_illegal_opcode():
    with pytest.raises(InstructionError, match="illegal Opcode") as e:
        isa.decode([0] * 11)
    assert e.value.field == "opcode"
    with pytest.raises(InstructionError, match="illegal Opcode"):
        isa.decode([0xFFFFFFFF] * 11)


def test_decoder_rejects_wrong_word_count_and_width():
    with pytest.raises(InstructionError, match="exactly 11 words"):
        isa.decode([0] * 10)
    with pytest.raises(InstructionError, match="32-bit"):
        isa.decode([1 << 32] + [0] * 10)


def test_program_last_flag_rules():
    body = conv3x3(last=0)
    with pytest.raises(InstructionError, match="`last` must be set on the final group"):
        isa.encode_program([body, body])
    with pytest.raises(InstructionError, match="`last` must be set on the final group"):
        isa.encode_program([conv3x3(), conv3x3()])
    with pytest.raises(InstructionError, match="at least one group"):
        isa.encode_program([])
    unterminated = b"".join(w.to_bytes(4, "little") for w in isa.encode(body))
    with pytest.raises(InstructionError, match="no group with `last` set"):
        isa.decode_program(unterminated)
    corrupt = bytearray(isa.encode_program([body, conv3x3()]))
    corrupt[44 + 8] = 0xFF  # group 1, word 2: input height no longer matches its output
    with pytest.raises(InstructionError, match="group 1"):
        isa.decode_program(bytes(corrupt))


# -- the same layout as an HDL shape ---------------------------------------------------------

@given(st.lists(instructions(), min_size=1, max_size=8))
def test_hdl_view_reads_the_fields_the_python_decoder_reads(instrs):
    """Drive the encoded bits onto a Signal(InstructionLayout) and read every field through
    Amaranth's view: positions and enum values agree with the Python encoding."""
    m = Module()
    flat = Signal(isa.WORDS * isa.WORD_BITS)
    view = isa.InstructionLayout(flat)
    m.d.comb += Signal().eq(flat[0])  # keep the module non-empty

    leaves = [f for f in isa.field_table() if f.kind != "reserved"]

    def read(path):
        value = view
        for part in path.split("."):
            value = getattr(value, part)
        return value

    async def bench(ctx):
        for instr in instrs:
            words = isa.encode(instr)
            ctx.set(flat, sum(w << (32 * i) for i, w in enumerate(words)))
            for f in leaves:
                got = ctx.get(read(f.name))
                expect = instr
                for part in f.name.split("."):
                    expect = getattr(expect, part)
                if f.kind == "int8/uint8":
                    got = got - 256 if (getattr(instr, isa.VALUE_SIGNEDNESS[f.name])
                                        and got >= 128) else got
                assert got == expect, f.name

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()


def test_memspace_names_match_buffers():
    assert [buffer(i).space for i in range(3)] == [MemSpace.BUF0, MemSpace.BUF1, MemSpace.BUF2]
