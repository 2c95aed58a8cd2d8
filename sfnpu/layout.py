"""Memory layouts of tensors, weights and per-group parameters — defined once, used by the
compiler (packing), the golden and cycle models (reading), the RTL address generators and the
DRAM-image checks.

Feature maps: channel-blocked ``[C/L][H][W][L]`` with ``L = config.lanes`` ("NCHWc"). A block of
``L`` channels of one pixel is one bank-wide word of an on-chip buffer; a concat writes at a
channel offset by starting at a later block (and lane) without knowing the destination's total
channel count. Channels past ``C`` in the last block are padding.

Weights, normal convolution: ``[O/To][I/Ti][kh][kw][To][Ti]`` — one ``To×Ti`` weight block per
tap, streamed in order. Depthwise: ``[C/L][kh][kw][L]``. Padding entries are zero.

Parameter block: the sections of :func:`param_sections`, each aligned to :func:`param_align`
(a bus beat, and at least :data:`PARAM_ALIGN` bytes), so every section starts a beat.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

import numpy as np

from .config import HwConfig
from .isa import Activation, ConvKind, Eltwise, Instruction, InputTransform, Location, \
    MemSpace, eltwise_reads_map

__all__ = [
    "PARAM_ALIGN", "param_align", "channel_blocks", "tensor_bytes", "pack_tensor", "unpack_tensor",
    "weight_shape", "weight_bytes", "pack_weights", "unpack_weights", "ParamSection",
    "param_sections", "param_bytes", "pack_params", "unpack_params", "pack_channel_tables",
    "unpack_channel_tables", "Access", "accesses",
    "conv_output_hw", "STAGES", "POST_RECORD", "WINDOW_RECORD", "Geometry", "geometry",
    "window_extent",
]

#: Least alignment of parameter sections (and of the parameter block itself).
PARAM_ALIGN = 16


def param_align(config: HwConfig) -> int:
    """Alignment of ``config``'s parameter sections and blocks: :data:`PARAM_ALIGN`, or one
    bus beat when that is wider, so that the controller finds every section at a beat's first
    byte (a bus is a power of two bytes)."""
    return max(PARAM_ALIGN, config.dram_bus_bytes)


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def channel_blocks(c: int, lanes: int) -> int:
    return ceil(c / lanes)


# --------------------------------------------------------------------------------------------
# Feature maps
# --------------------------------------------------------------------------------------------

def tensor_bytes(c: int, h: int, w: int, lanes: int) -> int:
    """Bytes of a ``c×h×w`` feature map in the channel-blocked layout."""
    return channel_blocks(c, lanes) * h * w * lanes


def pack_tensor(x: np.ndarray, lanes: int, fill: int = 0) -> bytes:
    """``(C, H, W)`` int8/uint8 → channel-blocked bytes; padding channels hold ``fill``."""
    if x.ndim != 3 or x.dtype not in (np.int8, np.uint8):
        raise ValueError(f"expected a (C, H, W) int8 or uint8 array, got {x.dtype} {x.shape}")
    c, h, w = x.shape
    blocks = channel_blocks(c, lanes)
    padded = np.full((blocks * lanes, h, w), fill, dtype=x.dtype)
    padded[:c] = x
    return padded.reshape(blocks, lanes, h, w).transpose(0, 2, 3, 1).tobytes()


def unpack_tensor(buf: bytes, c: int, h: int, w: int, lanes: int, signed: bool) -> np.ndarray:
    """Inverse of :func:`pack_tensor` (padding channels dropped)."""
    size = tensor_bytes(c, h, w, lanes)
    if len(buf) < size:
        raise ValueError(f"a {c}x{h}x{w} tensor needs {size} bytes, got {len(buf)}")
    blocks = channel_blocks(c, lanes)
    arr = np.frombuffer(buf, dtype=np.int8 if signed else np.uint8, count=size)
    return arr.reshape(blocks, h, w, lanes).transpose(0, 3, 1, 2).reshape(-1, h, w)[:c].copy()


def conv_output_hw(instr: Instruction) -> tuple[int, int]:
    """Height and width after the convolution, before pooling and upsampling (the shape of the
    element-wise operand)."""
    h = (instr.in_h + instr.pad_top + instr.pad_bottom - instr.kh) // instr.sh + 1
    w = (instr.in_w + instr.pad_left + instr.pad_right - instr.kw) // instr.sw + 1
    return h, w


# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------

def weight_shape(instr: Instruction) -> tuple[int, ...]:
    """ONNX weight shape of the group's convolution (``(O, I, kh, kw)``; depthwise I = 1)."""
    if instr.conv == ConvKind.NORMAL:
        return (instr.out_c, instr.in_c, instr.kh, instr.kw)
    if instr.conv == ConvKind.DEPTHWISE:
        return (instr.out_c, 1, instr.kh, instr.kw)
    return ()


def weight_bytes(instr: Instruction, config: HwConfig) -> int:
    if instr.conv == ConvKind.NORMAL:
        return (channel_blocks(instr.out_c, config.to) * config.to
                * channel_blocks(instr.in_c, config.ti) * config.ti * instr.kh * instr.kw)
    if instr.conv == ConvKind.DEPTHWISE:
        return tensor_bytes(instr.out_c, instr.kh, instr.kw, config.lanes)
    return 0


def pack_weights(weights: np.ndarray, instr: Instruction, config: HwConfig) -> bytes:
    """ONNX-shaped int8 weights → the hardware layout of the group's convolution kind."""
    expect = weight_shape(instr)
    if weights.shape != expect or weights.dtype != np.int8:
        raise ValueError(f"expected int8 weights of shape {expect}, got {weights.dtype} "
                         f"{weights.shape}")
    if instr.conv == ConvKind.DEPTHWISE:
        return pack_tensor(weights[:, 0], config.lanes)
    o, i, kh, kw = weights.shape
    ob, ib = channel_blocks(o, config.to), channel_blocks(i, config.ti)
    padded = np.zeros((ob * config.to, ib * config.ti, kh, kw), dtype=np.int8)
    padded[:o, :i] = weights
    blocks = padded.reshape(ob, config.to, ib, config.ti, kh, kw)
    return blocks.transpose(0, 2, 4, 5, 1, 3).tobytes()


def unpack_weights(buf: bytes, instr: Instruction, config: HwConfig) -> np.ndarray:
    """Inverse of :func:`pack_weights`."""
    if instr.conv == ConvKind.DEPTHWISE:
        return unpack_tensor(buf, instr.out_c, instr.kh, instr.kw, config.lanes, True)[:, None]
    o, i, kh, kw = weight_shape(instr)
    ob, ib = channel_blocks(o, config.to), channel_blocks(i, config.ti)
    size = weight_bytes(instr, config)
    arr = np.frombuffer(buf, dtype=np.int8, count=size)
    blocks = arr.reshape(ob, ib, kh, kw, config.to, config.ti).transpose(0, 4, 1, 5, 2, 3)
    return blocks.reshape(ob * config.to, ib * config.ti, kh, kw)[:o, :i].copy()


# --------------------------------------------------------------------------------------------
# Parameter block
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ParamSection:
    name: str
    dtype: np.dtype | str   # little-endian numpy dtype
    count: int
    offset: int     # from the start of the parameter block

    @property
    def nbytes(self) -> int:
        return np.dtype(self.dtype).itemsize * self.count


#: Post-processing stages, in hardware order; index into the POST_RECORD arrays.
STAGES = ("in_transform", "conv", "act", "eltwise", "act_after", "pool")

#: The quantisation of every stage's output code (zero point, int8 or uint8) and the float32
#: constants of the stages that requantise; their use is fixed by :mod:`sfnpu.numeric`:
#:   eltwise_const  ADD: (r_a, r_b, fixed) of QLinearAdd; CHANNEL_SCALE, MUL: (m, 0, 0)
#:   eltwise_swap   ADD: 1 when onnxruntime's operand A is the shortcut, not the stream
#:   pool_const     GLOBAL_AVG: (multiplier, 0); AVG: (input scale, output scale)
#: A stage the group does not use holds zeros. The final stage's entry equals the
#: instruction's out_zp / out_signed.
POST_RECORD = np.dtype([("zp", "<i4", (len(STAGES),)), ("signed", "<i4", (len(STAGES),)),
                        ("eltwise_const", "<f4", (3,)), ("eltwise_swap", "<i4"),
                        ("pool_const", "<f4", (2,))])

#: A windowed group's operand geometry (instruction field ``windowed``), the last section of
#: its parameter block: for each feature-map operand the bytes from one row to the next
#: (``row``) and from one channel block to the next (``plane``). A column strip of a wider
#: tensor reads and writes it in place: the operand's location is the window's first pixel,
#: the pitches are the whole tensor's.
WINDOW_RECORD = np.dtype([("in_row", "<u4"), ("in_plane", "<u4"), ("out_row", "<u4"),
                          ("out_plane", "<u4"), ("sc_row", "<u4"), ("sc_plane", "<u4")])


@dataclass(frozen=True)
class Geometry:
    """Row and channel-block pitches in bytes of a group's input, output and shortcut."""
    in_row: int
    in_plane: int
    out_row: int
    out_plane: int
    sc_row: int
    sc_plane: int

    @classmethod
    def dense(cls, instr: Instruction, lanes: int) -> "Geometry":
        """The pitches of tensors stored whole: rows of ``in_w`` / ``out_w`` / conv-output
        pixels; a CHANNEL_SCALE vector's blocks are one word apart."""
        h, w = conv_output_hw(instr)
        sc_plane = h * w * lanes if eltwise_reads_map(instr.eltwise) else lanes
        return cls(instr.in_w * lanes, instr.in_h * instr.in_w * lanes, instr.out_w * lanes,
                   instr.out_h * instr.out_w * lanes, w * lanes, sc_plane)

    def record(self) -> np.ndarray:
        rec = np.zeros(1, WINDOW_RECORD)
        for name in WINDOW_RECORD.names:
            rec[name] = getattr(self, name)
        return rec


def geometry(instr: Instruction, config: HwConfig, params: bytes | None = None) -> Geometry:
    """The group's operand pitches: dense, or a windowed group's from the window record of
    its parameter block ``params``."""
    if not instr.windowed:
        return Geometry.dense(instr, config.lanes)
    if params is None:
        raise ValueError("a windowed group's geometry is in its parameter block's window "
                         "record; pass the block")
    rec = unpack_params(params, instr, config)["window"][0]
    return Geometry(**{name: int(rec[name]) for name in WINDOW_RECORD.names})


def window_extent(rows: int, words: int, blocks: int, row: int, plane: int, lanes: int) -> int:
    """Bytes from a window's first byte to one past its last: ``blocks`` channel blocks of
    ``rows`` rows of ``words`` pixels, ``plane`` and ``row`` bytes apart."""
    if not rows or not words or not blocks:
        return 0
    return (blocks - 1) * plane + (rows - 1) * row + words * lanes

def param_sections(instr: Instruction, config: HwConfig) -> list[ParamSection]:
    """The sections of a group's parameter block, in order, with their offsets."""
    out_cp = channel_blocks(instr.out_c, config.to) * config.to
    in_cp = channel_blocks(instr.in_c, config.lanes) * config.lanes
    wanted: list[tuple[str, np.dtype | str, int]] = []
    if instr.conv != ConvKind.NONE:
        wanted += [("bias", "<i4", out_cp), ("multiplier", "<f4", out_cp),
                   ("weight_zp", "i1", out_cp)]
    if instr.in_transform == InputTransform.CHANNEL_TABLE:
        wanted += [("channel_table", "u1", in_cp * 256)]
    wanted += [("post", POST_RECORD, 1)]
    if instr.act == Activation.TABLE:
        wanted += [("act_table", "u1", 256)]
    if instr.windowed:
        wanted += [("window", WINDOW_RECORD, 1)]
    sections, offset, align = [], 0, param_align(config)
    for name, dtype, count in wanted:
        section = ParamSection(name, dtype, count, offset)
        sections.append(section)
        offset = _align(offset + section.nbytes, align)
    return sections


def param_bytes(instr: Instruction, config: HwConfig) -> int:
    sections = param_sections(instr, config)
    if not sections:
        return 0
    return _align(sections[-1].offset + sections[-1].nbytes, param_align(config))


def pack_params(instr: Instruction, config: HwConfig, **arrays) -> bytes:
    """The parameter block from one array per section (shorter arrays are zero-padded);
    a missing or unexpected section is an error naming it."""
    sections = {s.name: s for s in param_sections(instr, config)}
    unknown = set(arrays) - set(sections)
    missing = set(sections) - set(arrays)
    if unknown or missing:
        raise ValueError(f"parameter block of this group has sections {list(sections)}; "
                         f"missing {sorted(missing)}, unexpected {sorted(unknown)}")
    out = bytearray(param_bytes(instr, config))
    for name, section in sections.items():
        values = np.asarray(arrays[name]).astype(section.dtype).reshape(-1)
        if values.size > section.count:
            raise ValueError(f"parameter section {name!r} holds {section.count} values, "
                             f"got {values.size}")
        raw = values.tobytes()
        out[section.offset:section.offset + len(raw)] = raw
    return bytes(out)


def unpack_params(buf: bytes, instr: Instruction, config: HwConfig) -> dict[str, np.ndarray]:
    return {s.name: np.frombuffer(buf, dtype=s.dtype, count=s.count, offset=s.offset).copy()
            for s in param_sections(instr, config)}


def pack_channel_tables(tables: np.ndarray, lanes: int) -> np.ndarray:
    """Per-channel tables ``(C, 256)`` in the ``channel_table`` section's order
    ``[C/L][256][L]`` (channels padded to whole blocks): consecutive bytes are one code's
    entries for consecutive lanes, so every bus beat fills one entry of several lanes' tables
    at once, where a channel-major order would fill one table a byte per cycle."""
    c = tables.shape[0]
    padded = np.zeros((channel_blocks(c, lanes) * lanes, 256), tables.dtype)
    padded[:c] = tables
    return padded.reshape(-1, lanes, 256).transpose(0, 2, 1).reshape(-1)


def unpack_channel_tables(section: np.ndarray, lanes: int, channels: int) -> np.ndarray:
    """Inverse of :func:`pack_channel_tables`: the ``(channels, 256)`` tables."""
    return section.reshape(-1, 256, lanes).transpose(0, 2, 1).reshape(-1, 256)[:channels]


# --------------------------------------------------------------------------------------------
# Address ranges an instruction touches
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Access:
    operand: str        # instruction field: input, output, shortcut, weights, params
    space: MemSpace
    start: int          # byte addresses in that space, end exclusive
    end: int
    write: bool


def accesses(instr: Instruction, config: HwConfig, params: bytes | None = None,
             geo: Geometry | None = None) -> list[Access]:
    """Every memory range the group reads or writes (for window checks and traffic counts);
    a windowed group's from the window record in its parameter block ``params`` (or its
    pitches ``geo``, read from it before): the span from its window's first byte to its
    last, which other tiles' windows interleave."""
    lanes = config.lanes
    geo = geo or geometry(instr, config, params)

    def rng(operand: str, loc: Location, start: int, end: int, write=False):
        return Access(operand, loc.space, loc.offset + start, loc.offset + end, write)

    first_block = instr.out_c_offset // lanes
    end_block = channel_blocks(instr.out_c_offset + instr.out_c, lanes)
    start = first_block * geo.out_plane
    result = [
        rng("input", instr.input, 0, window_extent(
            instr.in_h, instr.in_w, channel_blocks(instr.in_c, lanes), geo.in_row,
            geo.in_plane, lanes)),
        rng("output", instr.output, start, start + window_extent(
            instr.out_h, instr.out_w, end_block - first_block, geo.out_row, geo.out_plane,
            lanes), write=True),
    ]
    blocks = channel_blocks(instr.out_c, lanes)
    if eltwise_reads_map(instr.eltwise):
        h, w = conv_output_hw(instr)
        result.append(rng("shortcut", instr.shortcut, 0, window_extent(
            h, w, blocks, geo.sc_row, geo.sc_plane, lanes)))
    elif instr.eltwise == Eltwise.CHANNEL_SCALE:
        result.append(rng("shortcut", instr.shortcut, 0, tensor_bytes(instr.out_c, 1, 1, lanes)))
    if instr.conv != ConvKind.NONE and not instr.weights_held:
        result.append(rng("weights", instr.weights, 0, weight_bytes(instr, config)))
    size = param_bytes(instr, config)
    if size:
        result.append(rng("params", instr.params, 0, size))
    return result
