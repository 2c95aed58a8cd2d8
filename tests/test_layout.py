"""Tensor, weight and parameter-block layouts."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from sfnpu import isa, layout
from sfnpu.config import get_config
from sfnpu.isa import ConvKind, Eltwise, Instruction, buffer, dram

TINY = get_config("tiny")
KCU = get_config("kcu1500")


@given(c=st.integers(1, 40), h=st.integers(1, 9), w=st.integers(1, 9),
       lanes=st.sampled_from([2, 8, 64]), signed=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_tensor_round_trip(c, h, w, lanes, signed, seed):
    dtype = np.int8 if signed else np.uint8
    x = np.random.default_rng(seed).integers(np.iinfo(dtype).min, np.iinfo(dtype).max,
                                             (c, h, w), dtype=dtype, endpoint=True)
    blob = layout.pack_tensor(x, lanes, fill=7)
    assert len(blob) == layout.tensor_bytes(c, h, w, lanes)
    np.testing.assert_array_equal(layout.unpack_tensor(blob, c, h, w, lanes, signed), x)


def test_tensor_byte_positions():
    """Channel c of pixel (y, x) sits at ((c // L) * H + y) * W * L + x * L + c % L."""
    c, h, w, lanes = 11, 3, 5, 4
    x = np.arange(c * h * w, dtype=np.int64).reshape(c, h, w) % 251
    blob = layout.pack_tensor(x.astype(np.uint8), lanes, fill=255)
    for ch in range(c):
        for y in range(h):
            for xx in range(w):
                pos = ((ch // lanes) * h + y) * w * lanes + xx * lanes + ch % lanes
                assert blob[pos] == x[ch, y, xx]
    padding = [blob[((2 * h + y) * w + xx) * lanes + lane]
               for y in range(h) for xx in range(w) for lane in (3,)]
    assert set(padding) == {255}


def test_pack_tensor_rejects_wrong_input():
    with pytest.raises(ValueError, match=r"\(C, H, W\) int8 or uint8"):
        layout.pack_tensor(np.zeros((2, 2), np.uint8), 8)
    with pytest.raises(ValueError, match=r"\(C, H, W\) int8 or uint8"):
        layout.pack_tensor(np.zeros((1, 2, 2), np.float32), 8)
    with pytest.raises(ValueError, match="needs 64 bytes"):
        layout.unpack_tensor(bytes(10), 3, 2, 4, 8, False)


def conv(kind, in_c, out_c, k, **changes):
    return Instruction(conv=kind, kh=k, kw=k, in_h=k, in_w=k, out_h=1, out_w=1, in_c=in_c,
                       out_c=out_c, weights=dram(0), **changes)


@pytest.mark.parametrize("config", [TINY, KCU], ids=lambda c: c.name)
@pytest.mark.parametrize("kind, in_c, out_c, k", [
    (ConvKind.NORMAL, 3, 16, 3), (ConvKind.NORMAL, 20, 9, 1), (ConvKind.NORMAL, 5, 3, 7),
    (ConvKind.DEPTHWISE, 12, 12, 3), (ConvKind.DEPTHWISE, 70, 70, 5)])
def test_weight_round_trip(config, kind, in_c, out_c, k):
    instr = conv(kind, in_c, out_c, k)
    shape = layout.weight_shape(instr)
    w = np.random.default_rng(1).integers(-128, 127, shape, dtype=np.int8, endpoint=True)
    blob = layout.pack_weights(w, instr, config)
    assert len(blob) == layout.weight_bytes(instr, config)
    np.testing.assert_array_equal(layout.unpack_weights(blob, instr, config), w)


def test_normal_weight_block_order():
    """[O/To][I/Ti][kh][kw][To][Ti]: one To×Ti block per tap, padding zero."""
    config = TINY.replace(ti=2, to=4)
    instr = conv(ConvKind.NORMAL, 3, 5, 2)
    w = (np.arange(5 * 3 * 2 * 2).reshape(5, 3, 2, 2) % 100 + 1).astype(np.int8)
    blob = np.frombuffer(layout.pack_weights(w, instr, config), np.int8)
    assert blob.size == 2 * 2 * 2 * 2 * 4 * 2
    for o in range(8):
        for i in range(4):
            for ky in range(2):
                for kx in range(2):
                    pos = ((((o // 4) * 2 + i // 2) * 2 + ky) * 2 + kx) * 8 + (o % 4) * 2 + i % 2
                    expect = w[o, i, ky, kx] if o < 5 and i < 3 else 0
                    assert blob[pos] == expect


def test_pack_weights_checks_shape():
    with pytest.raises(ValueError, match=r"shape \(8, 3, 3, 3\)"):
        layout.pack_weights(np.zeros((8, 3, 1, 1), np.int8), conv(ConvKind.NORMAL, 3, 8, 3),
                            TINY)


def test_param_sections_follow_the_instruction():
    plain = conv(ConvKind.NORMAL, 3, 10, 3)
    names = [s.name for s in layout.param_sections(plain, TINY)]
    assert names == ["bias", "multiplier", "weight_zp", "post"]
    full = plain.replace(act=isa.Activation.TABLE, eltwise=Eltwise.ADD,
                         in_transform=isa.InputTransform.CHANNEL_TABLE)
    sections = layout.param_sections(full, TINY)
    assert [s.name for s in sections] == ["bias", "multiplier", "weight_zp", "channel_table",
                                          "post", "act_table"]
    for a, b in zip(sections, sections[1:]):
        assert a.offset % layout.PARAM_ALIGN == 0 and a.offset + a.nbytes <= b.offset
    assert sections[0].count == 16  # padded to To
    assert layout.param_bytes(full, TINY) % layout.PARAM_ALIGN == 0
    none = Instruction(conv=ConvKind.NONE, in_h=1, in_w=1, out_h=1, out_w=1, in_c=1, out_c=1)
    assert [s.name for s in layout.param_sections(none, TINY)] == ["post"]
    assert layout.param_bytes(none, TINY) == 80  # the 72-byte post record, aligned


def test_param_sections_start_a_bus_beat():
    # kcu1500's 64-byte bus: every section starts a beat, so the controller reads it whole.
    kcu = KCU
    assert layout.param_align(kcu) == 64 and layout.param_align(TINY) == layout.PARAM_ALIGN
    full = conv(ConvKind.NORMAL, 3, 10, 3).replace(
        act=isa.Activation.TABLE, eltwise=Eltwise.ADD, windowed=True,
        in_transform=isa.InputTransform.CHANNEL_TABLE)
    sections = layout.param_sections(full, kcu)
    assert [s.offset % 64 for s in sections] == [0] * len(sections)
    assert layout.param_bytes(full, kcu) % 64 == 0


def test_param_round_trip_and_errors():
    instr = conv(ConvKind.NORMAL, 3, 10, 3, act=isa.Activation.TABLE)
    rng = np.random.default_rng(0)
    arrays = dict(bias=rng.integers(-2**31, 2**31 - 1, 10, dtype=np.int32),
                  multiplier=rng.random(10).astype(np.float32),
                  weight_zp=np.zeros(10, np.int8),
                  act_table=np.arange(256, dtype=np.uint8),
                  post=np.array([((7, 1, -2, 3, 0, 5), (1, 0, 1, 0, 0, 1), (0.5, 0.25, 2.0), 1,
                                  (3.0, 0.5))], layout.POST_RECORD))
    blob = layout.pack_params(instr, TINY, **arrays)
    out = layout.unpack_params(blob, instr, TINY)
    for name, values in arrays.items():
        np.testing.assert_array_equal(out[name][:values.size], values)
        assert out[name][values.size:].tobytes() == bytes(out[name][values.size:].nbytes)
    with pytest.raises(ValueError, match=r"missing \['act_table'\]"):
        layout.pack_params(instr, TINY, **{k: v for k, v in arrays.items() if k != "act_table"})
    with pytest.raises(ValueError, match=r"unexpected \['channel_table'\]"):
        layout.pack_params(instr, TINY, channel_table=np.zeros(1), **arrays)
    with pytest.raises(ValueError, match="holds 256 values, got 300"):
        layout.pack_params(instr, TINY, **{**arrays, "act_table": np.zeros(300, np.uint8)})


def test_accesses_cover_every_operand():
    instr = Instruction(conv=ConvKind.NORMAL, kh=1, kw=1, in_h=4, in_w=4, out_h=2, out_w=2,
                        in_c=20, out_c=10, pool=isa.Pool.MAX, pool_size=2, pool_stride=2,
                        eltwise=Eltwise.ADD, out_c_offset=12, input=dram(0x1000),
                        output=dram(0x8000), shortcut=buffer(2, 0x40), weights=dram(0x2000),
                        params=dram(0x4000))
    got = {a.operand: a for a in layout.accesses(instr, TINY)}
    assert (got["input"].start, got["input"].end) == (0x1000, 0x1000 + 3 * 16 * 8)
    # Channels 12..21 touch blocks 1 and 2 of a 2x2 plane of 8 lanes.
    assert (got["output"].start, got["output"].end, got["output"].write) == \
        (0x8000 + 32, 0x8000 + 96, True)
    # The residual is added before pooling: 4x4, not 2x2.
    assert got["shortcut"].space == isa.MemSpace.BUF2
    assert got["shortcut"].end - got["shortcut"].start == 2 * 4 * 4 * 8
    assert got["weights"].end - got["weights"].start == 16 * 24
    assert got["params"].end - got["params"].start == layout.param_bytes(instr, TINY)


def test_channel_tables_in_beat_order():
    """[C/L][256][L]: consecutive bytes are one code of consecutive lanes; the inverse
    restores the tables (a partly filled last block is padded with zeros)."""
    rng = np.random.default_rng(3)
    tables = rng.integers(0, 256, (13, 256)).astype(np.uint8)
    raw = layout.pack_channel_tables(tables, 8)
    assert raw.size == 16 * 256
    block, code, lane = 1, 200, 4
    assert raw[(block * 256 + code) * 8 + lane] == tables[block * 8 + lane, code]
    assert not raw.reshape(2, 256, 8)[1, :, 5:].any()
    assert np.array_equal(layout.unpack_channel_tables(raw, 8, 13), tables)
