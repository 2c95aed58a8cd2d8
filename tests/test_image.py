"""The DRAM image: pack/unpack, reproducibility, and every validation error."""

import dataclasses
import struct
import zlib

import numpy as np
import pytest

from sfnpu import image, isa
from sfnpu.config import CONFIGS, get_config
from examples import sample_image
from sfnpu.image import HEADER, SECTION, ImageError, SectionKind

TINY = get_config("tiny")


@pytest.fixture(scope="module")
def sample():
    return sample_image(TINY)


def _field_offset(fields, name):
    names = [n for n, _, _ in fields]
    return struct.calcsize("<" + "".join(f for _, f, _ in fields[:names.index(name)]))


def patch_header(blob, name, fmt, value):
    """Rewrite one header field and re-seal the header checksum (a well-formed lie)."""
    b = bytearray(blob)
    struct.pack_into("<" + fmt, b, _field_offset(image.HEADER_FIELDS, name), value)
    return reseal(b)


def patch_section(blob, index, name, fmt, value):
    b = bytearray(blob)
    at = HEADER.size + index * SECTION.size + _field_offset(image.SECTION_FIELDS, name)
    struct.pack_into("<" + fmt, b, at, value)
    return reseal(b)


def reseal(b):
    b = bytearray(b)
    crc_at = _field_offset(image.HEADER_FIELDS, "header_crc32")
    count = struct.unpack_from("<I", b, _field_offset(image.HEADER_FIELDS, "section_count"))[0]
    end = HEADER.size + count * SECTION.size
    struct.pack_into("<I", b, crc_at, 0)
    struct.pack_into("<I", b, crc_at, zlib.crc32(bytes(b[:end])))
    return bytes(b)


# -- round trip ------------------------------------------------------------------------------

@pytest.mark.parametrize("config", CONFIGS.values(), ids=lambda c: c.name)
def test_round_trip(config):
    s = sample_image(config)
    img = image.unpack(s.blob, config)
    assert img.program == s.program
    assert img.fingerprint == config.fingerprint
    # The loaded layout is the planned one plus the checksums.
    assert img.layout.image_bytes == s.layout.image_bytes
    assert [dataclasses.replace(got, crc32=0) for got in img.layout.sections] == \
        list(s.layout.sections)
    np.testing.assert_array_equal(img.tensor(SectionKind.INPUT, 0, config.lanes), s.input)
    assert len(img.dram) == s.layout.image_bytes
    assert not any(img.dram[len(s.blob):])  # OUTPUT and SCRATCH start zeroed
    assert all(sec.offset % image.SECTION_ALIGN == 0 for sec in img.layout.sections)


def test_reproducible_byte_for_byte():
    assert sample_image(TINY, seed=3).blob == sample_image(TINY, seed=3).blob
    assert sample_image(TINY, seed=3).blob != sample_image(TINY, seed=4).blob


def test_header_and_sections_on_disk(sample):
    magic, version, header_bytes, fingerprint, image_bytes, count, groups, flags, crc = \
        HEADER.unpack_from(sample.blob)
    assert (magic, version, fingerprint, groups, flags) == \
        (b"SFNPUIMG", 2, TINY.fingerprint, 4, 0)
    assert header_bytes == 64 + 32 * count and count == 5
    kinds = [SECTION.unpack_from(sample.blob, 64 + 32 * i)[0] for i in range(count)]
    assert kinds == [1, 2, 3, 4, 5]
    instr = sample.layout.section(SectionKind.INSTRUCTIONS)
    assert isa.decode_program(sample.blob[instr.offset:instr.end]) == sample.program


def test_loaded_without_config_skips_hardware_checks(sample):
    assert image.unpack(sample.blob).program == sample.program


# -- validation errors -----------------------------------------------------------------------

def test_truncated(sample):
    with pytest.raises(ImageError, match="truncated image: 10 bytes, the header alone"):
        image.unpack(sample.blob[:10])
    with pytest.raises(ImageError, match="truncated image: .* section table ends"):
        image.unpack(sample.blob[:100])
    with pytest.raises(ImageError, match="truncated image: section INPUT 0 ends"):
        image.unpack(sample.blob[:-1])


def test_bad_magic(sample):
    with pytest.raises(ImageError, match="not an sfnpu DRAM image: magic b'GARBAGE!'"):
        image.unpack(b"GARBAGE!" + sample.blob[8:])


def test_wrong_version(sample):
    newer = image.FORMAT_VERSION + 1
    with pytest.raises(ImageError, match=f"format version {newer}; this sfnpu reads version "
                       f"{image.FORMAT_VERSION}"):
        image.unpack(patch_header(sample.blob, "version", "I", newer))


def test_header_checksum(sample):
    b = bytearray(sample.blob)
    b[HEADER.size + 8] ^= 1  # first section's offset, without resealing
    with pytest.raises(ImageError, match="header checksum mismatch"):
        image.unpack(bytes(b))


def test_section_checksum(sample):
    p = sample.layout.section(SectionKind.PARAMS)
    b = bytearray(sample.blob)
    b[p.offset + 5] ^= 0x40
    with pytest.raises(ImageError, match="section PARAMS: checksum mismatch"):
        image.unpack(bytes(b))


def test_wrong_config(sample):
    with pytest.raises(ImageError, match="built for hardware fingerprint .* config 'ecp5'"):
        image.unpack(sample.blob, get_config("ecp5"))


def test_overlapping_sections(sample):
    params = sample.layout.section(SectionKind.PARAMS)
    # Move INPUT 0 onto the parameters, with a checksum of the bytes now under it, so only
    # the overlap is wrong.
    b = patch_section(sample.blob, 2, "offset", "I", params.offset)
    b = patch_section(b, 2, "crc32", "I", zlib.crc32(b[params.offset:params.offset + 2048]))
    with pytest.raises(ImageError, match=r"overlapping sections: INPUT 0 \[0x1c0, 0x9c0\) and PARAMS \[0x1c0"):
        image.unpack(b)


def test_section_over_the_header(sample):
    b = patch_section(sample.blob, 4, "offset", "I", 0)
    with pytest.raises(ImageError, match="overlapping sections: header"):
        image.unpack(b)


def test_section_beyond_image(sample):
    b = patch_section(sample.blob, 4, "size", "I", 1 << 20)
    with pytest.raises(ImageError, match="SCRATCH .* outside the image .* address out of range"):
        image.unpack(b)


def test_misaligned_section(sample):
    b = patch_section(sample.blob, 4, "offset", "I", sample.layout.base(SectionKind.SCRATCH) + 4)
    with pytest.raises(ImageError, match="not aligned to 64 bytes"):
        image.unpack(b)


def test_bad_section_kind_and_flags(sample):
    with pytest.raises(ImageError, match="unknown kind 9"):
        image.unpack(patch_section(sample.blob, 1, "kind", "B", 9))
    with pytest.raises(ImageError, match="flags 0x0 invalid"):
        image.unpack(patch_section(sample.blob, 1, "flags", "I", 0))
    with pytest.raises(ImageError, match="tensor descriptor missing"):
        image.unpack(patch_section(sample.blob, 2, "dtype", "B", 0))


def test_duplicate_and_missing_sections(sample):
    with pytest.raises(ImageError, match="exactly one INSTRUCTIONS section, found 2"):
        image.unpack(patch_section(sample.blob, 1, "kind", "B", int(SectionKind.INSTRUCTIONS)))
    with pytest.raises(ImageError, match=r"OUTPUT sections must be numbered 0..n-1, found \[3\]"):
        image.unpack(patch_section(sample.blob, 3, "index", "H", 3))


def test_trailing_bytes(sample):
    b = patch_header(sample.blob, "image_bytes", "I", len(sample.blob) + 0)
    with pytest.raises(ImageError):
        image.unpack(b)  # OUTPUT/SCRATCH now lie outside the image
    with pytest.raises(ImageError, match="longer than the image"):
        image.unpack(sample.blob + bytes(1 << 16))


def test_group_count_mismatch(sample):
    with pytest.raises(ImageError, match="header says 3 groups"):
        image.unpack(patch_header(sample.blob, "group_count", "I", 3))


def test_corrupt_instruction(sample):
    instr = sample.layout.section(SectionKind.INSTRUCTIONS)
    b = bytearray(sample.blob)
    b[instr.offset + 44] = 0  # group 1 opcode nibble
    b = patch_section(bytes(b), 0, "crc32", "I", zlib.crc32(bytes(b[instr.offset:instr.end])))
    with pytest.raises(ImageError, match="invalid instruction stream: .*group 1: opcode"):
        image.unpack(b)


def _repack(sample, program):
    params = sample.layout.section(SectionKind.PARAMS)
    return image.pack(sample.layout, TINY, program,
                      sample.blob[params.offset:params.end], [sample.input])


def test_instruction_writing_outside_output_and_scratch(sample):
    program = list(sample.program)
    program[0] = program[0].replace(output=isa.dram(sample.layout.base(SectionKind.PARAMS)))
    with pytest.raises(ImageError, match="group 0 output .* DRAM writes must fall inside"):
        image.unpack(_repack(sample, program), TINY)
    assert image.unpack(_repack(sample, program)).program == program  # no config: no check


def test_instruction_reading_past_the_image(sample):
    program = list(sample.program)
    program[1] = program[1].replace(input=isa.dram(sample.layout.image_bytes - 64))
    with pytest.raises(ImageError, match="group 1 input .* outside every section"):
        image.unpack(_repack(sample, program), TINY)


def test_instruction_overflowing_a_buffer(sample):
    program = list(sample.program)
    program[2] = program[2].replace(output=isa.buffer(1, TINY.buffer_bytes[1] - 256))
    with pytest.raises(ImageError, match="group 2 output .* in BUF1 exceeds the buffer"):
        image.unpack(_repack(sample, program), TINY)


def test_pack_rejects_mismatched_inputs(sample):
    params = sample.layout.section(SectionKind.PARAMS)
    raw = sample.blob[params.offset:params.end]
    with pytest.raises(ImageError, match=r"INPUT 0: expected uint8 \(3, 16, 16\)"):
        image.pack(sample.layout, TINY, sample.program, raw, [sample.input.astype(np.int8)])
    with pytest.raises(ImageError, match="layout has 1 inputs, got 0"):
        image.pack(sample.layout, TINY, sample.program, raw, [])
    with pytest.raises(ImageError, match="PARAMS: layout reserves"):
        image.pack(sample.layout, TINY, sample.program, raw + b"x", [sample.input])


def test_plan_rejections():
    t = image.TensorDesc(3, 4, 4, signed=False)
    with pytest.raises(ImageError, match="at least one instruction"):
        image.plan(0, 0, [t], [t], 0, 8)
    with pytest.raises(ImageError, match="at least one input and one output"):
        image.plan(1, 0, [], [t], 0, 8)
    with pytest.raises(ImageError, match="exceeds the 1 GiB"):
        image.plan(1, 1 << 30, [t], [t], 0, 8)
    with pytest.raises(ImageError, match="zero point 300 outside 0..255"):
        image.TensorDesc(3, 4, 4, signed=False, zero_point=300)


def test_first_groups_keeps_every_other_section_in_place(sample):
    full = image.unpack(sample.blob, TINY)
    assert len(full.program) >= 2, "the sample image needs groups beyond the first"
    head = image.unpack(image.first_groups(sample.blob, TINY, 1), TINY)
    assert len(head.program) == 1 and head.program[0].last == 1
    assert head.program[0].replace(last=0, prefetch=0) == \
        full.program[0].replace(last=0, prefetch=0)
    kept = [s for s in full.layout.sections if s.kind != SectionKind.INSTRUCTIONS]
    assert [(s.kind, s.offset, s.size) for s in kept] == \
        [(s.kind, s.offset, s.size) for s in head.layout.sections
         if s.kind != SectionKind.INSTRUCTIONS]
    for bad in (0, len(full.program) + 1):
        with pytest.raises(ImageError, match=f"groups={bad}"):
            image.first_groups(sample.blob, TINY, bad)
