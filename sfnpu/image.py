"""The DRAM image: one binary holding everything the accelerator reads, in the byte order and
at the addresses it reads them.

::

    0x0000  header (64 bytes)        magic, format version, hardware fingerprint, sizes, CRC
    0x0040  section table            SECTION.size bytes per section
    ...     INSTRUCTIONS             11 words per group (sfnpu.isa)
    ...     PARAMS                   weights and parameter blocks (sfnpu.layout)
    ...     INPUT 0..n               channel-blocked int8/uint8 tensors
    ...     OUTPUT 0..m              written by the accelerator, not stored in the file
    ...     SCRATCH                  intermediate feature maps, not stored in the file

Every section starts at a multiple of :data:`SECTION_ALIGN`. Offsets are relative to the image
base, the DRAM address the image is loaded at; instruction locations use the same offsets. The
file ends with the last stored section; the accelerator's view is the file followed by zeros up
to ``image_bytes``. Packing is deterministic: the same inputs give the same bytes.
"""

from __future__ import annotations

import enum
import struct
import zlib
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from . import isa
from .config import HwConfig
from .layout import accesses, pack_tensor, param_bytes, tensor_bytes, unpack_tensor

__all__ = [
    "MAGIC", "FORMAT_VERSION", "SECTION_ALIGN", "HEADER", "SECTION", "HEADER_FIELDS", "field_offset",
    "SECTION_FIELDS", "FLAG_STORED", "SectionKind", "DType",
    "TensorDesc", "Section", "ImageLayout", "Image", "ImageError", "plan", "pack", "unpack",
    "first_groups",
]

MAGIC = b"SFNPUIMG"
#: 2: per-channel input tables in beat order [C/L][256][L] (layout.pack_channel_tables).
FORMAT_VERSION = 2
SECTION_ALIGN = 64

#: Header fields: (name, struct format, meaning). Little-endian, 64 bytes with padding.
HEADER_FIELDS = (
    ("magic", "8s", "ASCII `SFNPUIMG`"),
    ("version", "I", "format version (FORMAT_VERSION)"),
    ("header_bytes", "I", "header plus section table"),
    ("fingerprint", "Q", "HwConfig.fingerprint of the hardware the image was built for"),
    ("image_bytes", "I", "DRAM footprint: stored file plus zero-initialised sections"),
    ("section_count", "I", "entries in the section table"),
    ("group_count", "I", "instructions in the INSTRUCTIONS section"),
    ("flags", "I", "reserved, zero"),
    ("header_crc32", "I", "CRC-32 of header and section table, this field taken as zero"),
    ("reserved", "20x", "zero"),
)
#: Section table entry: (name, struct format, meaning). Little-endian, 32 bytes.
SECTION_FIELDS = (
    ("kind", "B", "SectionKind"),
    ("dtype", "B", "DType of a tensor section, RAW otherwise"),
    ("index", "H", "number among sections of the same kind"),
    ("flags", "I", "bit 0: payload stored in the file"),
    ("offset", "I", "from the image base, multiple of SECTION_ALIGN"),
    ("size", "I", "bytes"),
    ("crc32", "I", "CRC-32 of the stored payload, zero otherwise"),
    ("channels", "H", "tensor channels"),
    ("height", "H", "tensor height"),
    ("width", "H", "tensor width"),
    ("zero_point", "h", "tensor zero point"),
    ("scale", "f", "tensor scale (float32)"),
)
HEADER = struct.Struct("<" + "".join(f for _, f, _ in HEADER_FIELDS))
SECTION = struct.Struct("<" + "".join(f for _, f, _ in SECTION_FIELDS))


def field_offset(fields, name: str) -> int:
    """Byte offset of field ``name`` in a record described by ``HEADER_FIELDS`` or
    ``SECTION_FIELDS`` (what the hardware's header parser reads)."""
    names = [n for n, _, _ in fields]
    return struct.calcsize("<" + "".join(f for _, f, _ in fields[:names.index(name)]))


_HEADER_CRC_AT = field_offset(HEADER_FIELDS, "header_crc32")
assert HEADER.size == 64 and SECTION.size == 32

FLAG_STORED = 1  # section payload is in the file (otherwise zero-initialised)


class SectionKind(enum.IntEnum):
    INSTRUCTIONS = 1
    PARAMS = 2
    INPUT = 3
    OUTPUT = 4
    SCRATCH = 5


_STORED_KINDS = {SectionKind.INSTRUCTIONS, SectionKind.PARAMS, SectionKind.INPUT}
_TENSOR_KINDS = {SectionKind.INPUT, SectionKind.OUTPUT}


class DType(enum.IntEnum):
    RAW = 0
    UINT8 = 1
    INT8 = 2


class ImageError(ValueError):
    """A DRAM image that cannot be built or loaded; the message says what and where."""


@dataclass(frozen=True)
class TensorDesc:
    """An input or output tensor: shape and quantisation (value = scale * (q - zero_point))."""
    channels: int
    height: int
    width: int
    signed: bool
    zero_point: int = 0
    scale: float = 1.0

    def __post_init__(self):
        # Stored as float32 in the section table (onnxruntime scales are float32 anyway).
        object.__setattr__(self, "scale", float(np.float32(self.scale)))
        lo, hi = (-128, 127) if self.signed else (0, 255)
        if not lo <= self.zero_point <= hi:
            raise ImageError(f"tensor zero point {self.zero_point} outside {lo}..{hi}")
        if not all(1 <= n <= 0xFFFF for n in (self.channels, self.height, self.width)):
            raise ImageError(f"tensor shape {self.channels}x{self.height}x{self.width} must "
                             "be 1..65535 per dimension")

    def nbytes(self, lanes: int) -> int:
        return tensor_bytes(self.channels, self.height, self.width, lanes)

    def dtype(self):
        return np.int8 if self.signed else np.uint8


@dataclass(frozen=True)
class Section:
    kind: SectionKind
    index: int
    offset: int
    size: int
    tensor: TensorDesc | None = None
    crc32: int = 0

    @property
    def stored(self) -> bool:
        return self.kind in _STORED_KINDS

    @property
    def end(self) -> int:
        return self.offset + self.size

    @property
    def label(self) -> str:
        many = self.kind in _TENSOR_KINDS
        return f"{self.kind.name}{f' {self.index}' if many else ''}"


@dataclass(frozen=True)
class ImageLayout:
    """Where every section goes; the compiler plans this first, then writes the section bases
    into its instructions."""
    sections: tuple[Section, ...]
    image_bytes: int

    def section(self, kind: SectionKind, index: int = 0) -> Section:
        for s in self.sections:
            if s.kind == kind and s.index == index:
                return s
        raise KeyError(f"no {kind.name} section {index}")

    def base(self, kind: SectionKind, index: int = 0) -> int:
        return self.section(kind, index).offset

    def of_kind(self, kind: SectionKind) -> list[Section]:
        return [s for s in self.sections if s.kind == kind]


def _align(n: int) -> int:
    return -(-n // SECTION_ALIGN) * SECTION_ALIGN


def plan(groups: int, params_bytes: int, inputs: Sequence[TensorDesc],
         outputs: Sequence[TensorDesc], scratch_bytes: int, lanes: int) -> ImageLayout:
    """Place the sections of an image for ``groups`` instructions."""
    if groups < 1:
        raise ImageError("an image needs at least one instruction")
    if not inputs or not outputs:
        raise ImageError("an image needs at least one input and one output tensor")
    wanted = [(SectionKind.INSTRUCTIONS, 0, groups * isa.WORDS * 4, None),
              (SectionKind.PARAMS, 0, params_bytes, None)]
    wanted += [(SectionKind.INPUT, i, t.nbytes(lanes), t) for i, t in enumerate(inputs)]
    wanted += [(SectionKind.OUTPUT, i, t.nbytes(lanes), t) for i, t in enumerate(outputs)]
    wanted += [(SectionKind.SCRATCH, 0, scratch_bytes, None)]
    offset = _align(HEADER.size + SECTION.size * len(wanted))
    sections = []
    for kind, index, size, tensor in wanted:
        sections.append(Section(kind, index, offset, size, tensor))
        offset = _align(offset + size)
    if offset > 1 << 30:
        raise ImageError(f"image of {offset} bytes exceeds the 1 GiB reachable by instruction "
                         "locations")
    return ImageLayout(tuple(sections), offset)


@dataclass
class Image:
    """A loaded (validated) image."""
    layout: ImageLayout
    fingerprint: int
    program: list
    dram: bytearray = field(repr=False)   # image_bytes long: the accelerator's view

    def params(self) -> bytes:
        s = self.layout.section(SectionKind.PARAMS)
        return bytes(self.dram[s.offset:s.end])

    def tensor(self, kind: SectionKind, index: int, lanes: int) -> np.ndarray:
        """An input or output section as a ``(C, H, W)`` array (read from :attr:`dram`)."""
        s = self.layout.section(kind, index)
        t = s.tensor
        return unpack_tensor(bytes(self.dram[s.offset:s.end]), t.channels, t.height, t.width,
                             lanes, t.signed)


# --------------------------------------------------------------------------------------------
# Packing
# --------------------------------------------------------------------------------------------

def _section_record(s: Section) -> bytes:
    t = s.tensor
    dtype, c, h, w, zp, scale = (DType.RAW, 0, 0, 0, 0, 0.0) if t is None else (
        DType.INT8 if t.signed else DType.UINT8, t.channels, t.height, t.width, t.zero_point,
        t.scale)
    return SECTION.pack(s.kind, dtype, s.index, FLAG_STORED if s.stored else 0, s.offset,
                        s.size, s.crc32, c, h, w, zp, scale)


def pack(layout: ImageLayout, config: HwConfig, program: Sequence, params: bytes,
         inputs: Sequence[np.ndarray]) -> bytes:
    """Serialise an image. ``inputs`` are ``(C, H, W)`` arrays matching the INPUT sections."""
    instr_bytes = isa.encode_program(program)
    payload = {(SectionKind.INSTRUCTIONS, 0): instr_bytes, (SectionKind.PARAMS, 0): params}
    input_sections = layout.of_kind(SectionKind.INPUT)
    if len(inputs) != len(input_sections):
        raise ImageError(f"layout has {len(input_sections)} inputs, got {len(inputs)} arrays")
    for s, x in zip(input_sections, inputs):
        t = s.tensor
        x = np.asarray(x)
        if x.shape != (t.channels, t.height, t.width) or x.dtype != t.dtype():
            raise ImageError(f"{s.label}: expected {np.dtype(t.dtype()).name} "
                             f"{(t.channels, t.height, t.width)}, got {x.dtype} {x.shape}")
        payload[(s.kind, s.index)] = pack_tensor(x, config.lanes, fill=t.zero_point)

    sections, end = [], 0
    for s in layout.sections:
        data = payload.get((s.kind, s.index), b"")
        if s.stored and len(data) != s.size:
            raise ImageError(f"{s.label}: layout reserves {s.size} bytes, payload has "
                             f"{len(data)}")
        sections.append(replace(s, crc32=zlib.crc32(data) if s.stored else 0))
        if s.stored:
            end = max(end, s.end)
    blob = bytearray(end)
    for s in sections:
        if s.stored:
            blob[s.offset:s.end] = payload[(s.kind, s.index)]

    table = b"".join(_section_record(s) for s in sections)
    header = HEADER.pack(MAGIC, FORMAT_VERSION, HEADER.size + len(table), config.fingerprint,
                         layout.image_bytes, len(sections), len(program), 0, 0)
    crc = zlib.crc32(header + table)
    header = header[:_HEADER_CRC_AT] + struct.pack("<I", crc) + header[_HEADER_CRC_AT + 4:]
    blob[:HEADER.size + len(table)] = header + table
    return bytes(blob)


# --------------------------------------------------------------------------------------------
# Loading and validation
# --------------------------------------------------------------------------------------------

def _read_header(blob: bytes):
    if len(blob) < HEADER.size:
        raise ImageError(f"truncated image: {len(blob)} bytes, the header alone needs "
                         f"{HEADER.size}")
    magic, version, header_bytes, fingerprint, image_bytes, count, groups, flags, crc = \
        HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise ImageError(f"not an sfnpu DRAM image: magic {magic!r}, expected {MAGIC!r}")
    if version != FORMAT_VERSION:
        raise ImageError(f"image format version {version}; this sfnpu reads version "
                         f"{FORMAT_VERSION} — recompile the model")
    if header_bytes != HEADER.size + SECTION.size * count:
        raise ImageError(f"header says {header_bytes} header bytes for {count} sections, "
                         f"expected {HEADER.size + SECTION.size * count}")
    if len(blob) < header_bytes:
        raise ImageError(f"truncated image: {len(blob)} bytes, the section table ends at "
                         f"{header_bytes}")
    zeroed = blob[:_HEADER_CRC_AT] + b"\0\0\0\0" + blob[_HEADER_CRC_AT + 4:header_bytes]
    if zlib.crc32(zeroed) != crc:
        raise ImageError(f"header checksum mismatch (stored {crc:#010x}, computed "
                         f"{zlib.crc32(zeroed):#010x}): the header or section table is corrupt")
    if flags:
        raise ImageError(f"unknown header flags {flags:#x}")
    return fingerprint, image_bytes, count, groups


def _read_sections(blob: bytes, count: int, image_bytes: int) -> list[Section]:
    sections = []
    for i in range(count):
        kind, dtype, index, flags, offset, size, crc, c, h, w, zp, scale = SECTION.unpack_from(
            blob, HEADER.size + i * SECTION.size)
        try:
            kind, dtype = SectionKind(kind), DType(dtype)
        except ValueError:
            raise ImageError(f"section {i}: unknown kind {kind} or dtype {dtype}") from None
        tensor = None
        if kind in _TENSOR_KINDS:
            if dtype == DType.RAW or min(c, h, w) < 1:
                raise ImageError(f"section {i} ({kind.name} {index}): tensor descriptor "
                                 f"missing (dtype {dtype.name}, shape {c}x{h}x{w})")
            tensor = TensorDesc(c, h, w, dtype == DType.INT8, zp, scale)
        s = Section(kind, index, offset, size, tensor, crc)
        if bool(flags & FLAG_STORED) != s.stored or flags & ~FLAG_STORED:
            raise ImageError(f"section {i} ({s.label}): flags {flags:#x} invalid for its kind")
        if offset % SECTION_ALIGN:
            raise ImageError(f"section {s.label} at {offset:#x} is not aligned to "
                             f"{SECTION_ALIGN} bytes")
        if s.end > image_bytes:
            raise ImageError(f"section {s.label} [{offset:#x}, {s.end:#x}) lies outside the "
                             f"image ({image_bytes:#x} bytes): address out of range")
        if s.stored and s.end > len(blob):
            raise ImageError(f"truncated image: section {s.label} ends at {s.end:#x} but the "
                             f"file has {len(blob):#x} bytes")
        if s.stored and zlib.crc32(blob[offset:s.end]) != crc:
            raise ImageError(f"section {s.label}: checksum mismatch (stored {crc:#010x}, "
                             f"computed {zlib.crc32(blob[offset:s.end]):#010x})")
        sections.append(s)

    # The header, every section and no two sections overlap.
    spans = sorted([(0, HEADER.size + SECTION.size * count, "header")] +
                   [(s.offset, s.end, s.label) for s in sections if s.size])
    for (a0, a1, a), (b0, b1, b) in zip(spans, spans[1:]):
        if b0 < a1:
            raise ImageError(f"overlapping sections: {a} [{a0:#x}, {a1:#x}) and "
                             f"{b} [{b0:#x}, {b1:#x})")
    for kind in (SectionKind.INSTRUCTIONS, SectionKind.PARAMS, SectionKind.SCRATCH):
        n = sum(s.kind == kind for s in sections)
        if n != 1:
            raise ImageError(f"an image has exactly one {kind.name} section, found {n}")
    for kind in _TENSOR_KINDS:
        indices = sorted(s.index for s in sections if s.kind == kind)
        if indices != list(range(len(indices))) or not indices:
            raise ImageError(f"{kind.name} sections must be numbered 0..n-1, found {indices}")
    return sections


def _check_accesses(layout: ImageLayout, program: Sequence, config: HwConfig, blob: bytes):
    writable = [s for s in layout.sections
                if s.kind in (SectionKind.OUTPUT, SectionKind.SCRATCH)]
    buffer_size = {isa.MemSpace.BUF0: config.buffer_bytes[0],
                   isa.MemSpace.BUF1: config.buffer_bytes[1],
                   isa.MemSpace.BUF2: config.buffer_bytes[2]}
    for g, instr in enumerate(program):
        params = None
        if instr.windowed:
            size = param_bytes(instr, config)
            params = blob[instr.params.offset:instr.params.offset + size]
            if len(params) < size:
                raise ImageError(f"group {g}: parameter block [{instr.params.offset:#x}, "
                                 f"{instr.params.offset + size:#x}) with its window record "
                                 "passes the image's end")
        for a in accesses(instr, config, params):
            where = f"group {g} {a.operand} [{a.start:#x}, {a.end:#x})"
            if a.space != isa.MemSpace.DRAM:
                if a.end > buffer_size[a.space]:
                    raise ImageError(f"{where} in {a.space.name} exceeds the buffer "
                                     f"({buffer_size[a.space]:#x} bytes in config "
                                     f"{config.name!r}): address out of range")
            elif a.write and not any(s.offset <= a.start and a.end <= s.end for s in writable):
                raise ImageError(f"{where}: DRAM writes must fall inside an OUTPUT or SCRATCH "
                                 "section: address out of range")
            elif not a.write and not any(s.offset <= a.start and a.end <= s.end
                                         for s in layout.sections):
                raise ImageError(f"{where}: DRAM read outside every section: address out of "
                                 "range")


def unpack(blob: bytes, config: HwConfig | None = None) -> Image:
    """Load and validate an image. With ``config``, also check that it was built for that
    hardware and that every instruction stays inside its sections and buffers."""
    blob = bytes(blob)
    fingerprint, image_bytes, count, groups = _read_header(blob)
    sections = _read_sections(blob, count, image_bytes)
    if len(blob) > image_bytes:
        raise ImageError(f"file of {len(blob)} bytes is longer than the image it describes "
                         f"({image_bytes} bytes)")
    layout = ImageLayout(tuple(sections), image_bytes)
    if config is not None and fingerprint != config.fingerprint:
        raise ImageError(f"image built for hardware fingerprint {fingerprint:#018x}, but "
                         f"config {config.name!r} is {config.fingerprint:#018x}: recompile "
                         "for this configuration")
    instr = layout.section(SectionKind.INSTRUCTIONS)
    if instr.size != groups * isa.WORDS * 4:
        raise ImageError(f"INSTRUCTIONS holds {instr.size} bytes, header says {groups} groups")
    try:
        program = isa.decode_program(blob[instr.offset:instr.end])
    except isa.InstructionError as e:
        raise ImageError(f"invalid instruction stream: {e}") from None
    if len(program) != groups:
        raise ImageError(f"`last` set on group {len(program) - 1}, header says {groups} groups")
    if config is not None:
        _check_accesses(layout, program, config, blob)
    dram = bytearray(image_bytes)
    dram[:len(blob)] = blob
    return Image(layout, fingerprint, program, dram)


def first_groups(blob: bytes, config: HwConfig, groups: int) -> bytes:
    """The image that runs only the first ``groups`` groups of ``blob``: the instruction
    section shrinks in place (every other section keeps its offset, so the instructions'
    locations stay valid), the last group kept is marked ``last`` and prefetches nothing.
    To run a slice of a large network on the RTL, or to bisect one."""
    img = unpack(blob, config)
    if not 1 <= groups <= len(img.program):
        raise ImageError(f"groups={groups}: the image has {len(img.program)} groups")
    program = list(img.program[:groups])
    program[-1] = program[-1].replace(last=1, prefetch=0)
    sections = tuple(replace(s, size=groups * isa.WORDS * 4)
                     if s.kind == SectionKind.INSTRUCTIONS else s for s in img.layout.sections)
    layout = ImageLayout(sections, img.layout.image_bytes)
    inputs = [img.tensor(SectionKind.INPUT, s.index, config.lanes)
              for s in layout.of_kind(SectionKind.INPUT)]
    return pack(layout, config, program, img.params(), inputs)
