"""The group instruction: exactly 11 little-endian words of 32 bits per fused group.

This module is the single definition of the instruction set. :class:`InstructionLayout` is an
Amaranth ``data.Struct``: the RTL decoder puts it on a signal, and everything on the Python side
(the frozen dataclass :class:`Instruction`, the encoder, the decoder and ``docs/isa.md``) is derived
from its fields, widths and shaped enums. No other file may restate a field position or width.

One instruction describes one group (paper Sec. III-A, Fig. 5b): an optional convolution
(normal or depthwise, any kernel up to 7×7, stride 1 or 2, asymmetric padding), the input-side
transform, then the post-processing chain in hardware order::

    conv → requantise → [act if BEFORE_ELTWISE] → eltwise (ADD / CHANNEL_SCALE / MUL)
         → [act if AFTER_ELTWISE] → pool → 2× upsample → write at channel offset

Tensors are located by :class:`Location` (DRAM byte offset from the image base, or one of the
three on-chip buffers with a byte offset). Per-group parameter data (bias, requantisation
multipliers, activation table, …) sits at ``params`` in the order given by
:func:`sfnpu.layout.param_sections`.
"""


import dataclasses
import enum as py_enum
from typing import Any, Iterable

from amaranth.lib import data, enum

__all__ = [
    "WORDS", "WORD_BITS", "Opcode", "ConvKind", "Reuse", "Activation", "ActOrder", "Pool",
    "Eltwise", "eltwise_reads_map", "eltwise_multiplies", "InputTransform", "MemSpace",
    "LocationLayout", "InstructionLayout",
    "Location", "Instruction", "InstructionError", "dram", "buffer", "FIELD_DOCS", "encode", "decode",
    "validate", "encode_program", "decode_program", "expected_output_hw", "field_table",
    "enum_types", "FieldInfo", "VALUE_SIGNEDNESS",
]

WORDS = 11
WORD_BITS = 32


# --------------------------------------------------------------------------------------------
# Enumerations (shaped: the RTL uses them directly)
# --------------------------------------------------------------------------------------------

class Opcode(enum.Enum, shape=4):
    """Instruction kind. Every other value is illegal, so a fetch of erased memory traps."""
    GROUP = 0xA


class ConvKind(enum.Enum, shape=2):
    """Convolution of the group. NONE passes the input straight to the post-processing chain."""
    NONE = 0
    NORMAL = 1
    DEPTHWISE = 2


class Reuse(enum.Enum, shape=1):
    """Weight reuse: ROW preloads the layer's weights and streams input rows from DRAM;
    FRAME keeps feature maps on chip and streams weight blocks exactly once."""
    ROW = 0
    FRAME = 1


class Activation(enum.Enum, shape=2):
    """NONE: only the output type's range; CLAMP: [clamp_lo, clamp_hi] (Relu, Relu6 absorbed
    into the quantiser); TABLE: 256-entry int8→int8 table from the parameter block."""
    NONE = 0
    CLAMP = 1
    TABLE = 2


class ActOrder(enum.Enum, shape=1):
    """Whether the activation follows the element-wise stage (ResNet: add, then ReLU)."""
    AFTER_ELTWISE = 0
    BEFORE_ELTWISE = 1


class Pool(enum.Enum, shape=2):
    NONE = 0
    MAX = 1
    AVG = 2
    GLOBAL_AVG = 3


class Eltwise(enum.Enum, shape=2):
    """Second operand stream, read from ``shortcut``: ADD a residual tensor of the output's
    shape, CHANNEL_SCALE by a per-channel vector (squeeze-and-excitation), or MUL by a tensor
    of the output's shape (QLinearMul of two feature maps: a gate, spatial attention)."""
    NONE = 0
    ADD = 1
    CHANNEL_SCALE = 2
    MUL = 3


def eltwise_reads_map(eltwise):
    """Whether the element-wise stage reads a tensor of the conv output's shape (ADD, MUL)
    rather than a per-channel vector. Takes an :class:`Eltwise` or an RTL view of one."""
    return (eltwise == Eltwise.ADD) | (eltwise == Eltwise.MUL)


def eltwise_multiplies(eltwise):
    """Whether the element-wise stage is a QLinearMul (CHANNEL_SCALE, MUL: the channel
    scaler) rather than a QLinearAdd. Takes an :class:`Eltwise` or an RTL view of one."""
    return (eltwise == Eltwise.CHANNEL_SCALE) | (eltwise == Eltwise.MUL)


class InputTransform(enum.Enum, shape=2):
    """CHANNEL_TABLE: one 256-entry table per input channel applied to the input before the
    convolution — a pre-activation BatchNorm (+ ReLU) that cannot fold into a producer, exact
    as onnxruntime computes it. The transformed input's zero point (also the padding value)
    and type come from the parameter block's post record."""
    NONE = 0
    CHANNEL_TABLE = 1


class MemSpace(enum.Enum, shape=2):
    DRAM = 0
    BUF0 = 1
    BUF1 = 2
    BUF2 = 3


# --------------------------------------------------------------------------------------------
# Bit layout: one Struct, word by word. Fields named reserved_* must be zero.
# --------------------------------------------------------------------------------------------

class LocationLayout(data.Struct):
    offset: 30          # bytes from the image base (DRAM) or from the buffer start
    space: MemSpace


class InstructionLayout(data.Struct):
    # word 0: control
    opcode: Opcode
    conv: ConvKind
    reuse: Reuse
    last: 1
    act: Activation
    act_order: ActOrder
    pool: Pool
    upsample: 1
    in_transform: InputTransform
    in_signed: 1
    out_signed: 1
    eltwise: Eltwise
    sc_signed: 1
    sc_zp: 8
    weights_held: 1
    prefetch: 1
    windowed: 1
    # word 1: convolution and pooling windows
    kh: 3
    kw: 3
    sh: 2
    sw: 2
    pad_top: 3
    pad_left: 3
    pad_bottom: 3
    pad_right: 3
    pool_size: 2
    pool_stride: 2
    pool_pad: 2
    pool_count_pad: 1
    double_buffer: 1
    psum_keep: 1
    psum_hold: 1
    # word 2: input shape and zero point
    in_h: 12
    in_w: 12
    in_zp: 8
    # word 3: output shape and zero point
    out_h: 12
    out_w: 12
    out_zp: 8
    # word 4: channels
    in_c: 16
    out_c: 16
    # word 5: output placement and clamp
    out_c_offset: 16
    clamp_lo: 8
    clamp_hi: 8
    # words 6..10: where the data lives
    input: LocationLayout
    output: LocationLayout
    shortcut: LocationLayout
    weights: LocationLayout
    params: LocationLayout


#: The tensor whose signedness decides how each 8-bit value field is read (int8 or uint8).
VALUE_SIGNEDNESS = {
    "in_zp": "in_signed", "out_zp": "out_signed", "sc_zp": "sc_signed",
    "clamp_lo": "out_signed", "clamp_hi": "out_signed",
}

FIELD_DOCS = {
    "offset": "byte offset from the image base (DRAM) or from the start of the buffer",
    "space": "DRAM or on-chip buffer 0/1/2",
    "opcode": "instruction kind; any other value stops the accelerator (illegal opcode)",
    "conv": "convolution kind",
    "reuse": "weight-reuse scheme of this group",
    "last": "1 on the final group of the program",
    "act": "activation",
    "act_order": "activation before or after the element-wise stage",
    "pool": "pooling after the activation",
    "upsample": "1: 2× nearest-neighbour upsample of the pooled output",
    "in_transform": "input-side transform before the convolution",
    "in_signed": "input tensor is int8 (1) or uint8 (0)",
    "out_signed": "output tensor is int8 (1) or uint8 (0)",
    "eltwise": "element-wise stage fed by the `shortcut` stream",
    "sc_signed": "shortcut operand is int8 (1) or uint8 (0)",
    "sc_zp": "shortcut operand zero point",
    "weights_held": "1: the weight store still holds this group's weights, loaded whole by the "
                    "previous group that read weights or by the previous group's prefetch (the "
                    "same DRAM offset); they are not read again",
    "prefetch": "1: while this group computes, the controller reads the next instruction and "
                "loads the next group's weights (a normal convolution's, whole) into the part of "
                "the weight store this group does not use; the next group sets weights_held",
    "windowed": "1: the feature-map operands are windows of larger DRAM tensors: the parameter "
                "block ends with a window record giving each operand's row pitch and channel-"
                "block pitch in bytes (sfnpu.layout.WINDOW_RECORD); row reuse, DRAM operands "
                "only",
    "double_buffer": "1: frame reuse takes the weights in output-channel chunks of at most half "
                     "the weight store and loads each next chunk while the current one computes "
                     "(a group whose weights the store holds whole has one chunk)",
    "psum_keep": "1: the convolution's sums start from the partial sums the previous group "
                 "left in the partial-sum buffer (psum_hold) instead of zero: the next share "
                 "of an input-channel split",
    "psum_hold": "1: the convolution's sums (without bias) also stay in the partial-sum buffer "
                 "for the next group (psum_keep); its codes are written as usual and the next "
                 "group overwrites them. Both need a normal convolution in row reuse computing "
                 "one output row (out_c / To · conv width ≤ the buffer's words)",
    "kh": "kernel height 1..7",
    "kw": "kernel width 1..7",
    "sh": "vertical stride 1..2",
    "sw": "horizontal stride 1..2",
    "pad_top": "rows of input zero point above the input",
    "pad_left": "columns of input zero point left of the input",
    "pad_bottom": "rows of input zero point below the input",
    "pad_right": "columns of input zero point right of the input",
    "pool_size": "pooling window side 2..3 (MAX/AVG)",
    "pool_stride": "pooling stride 1..2 (MAX/AVG)",
    "pool_pad": "pooling padding on every side, below the window side",
    "pool_count_pad": "AVG: padded positions count in the divisor",
    "in_h": "input height",
    "in_w": "input width",
    "in_zp": "input zero point (also the padding value unless an input transform is set)",
    "out_h": "output height after pool and upsample",
    "out_w": "output width after pool and upsample",
    "out_zp": "output zero point",
    "in_c": "input channels",
    "out_c": "output channels written by this group",
    "out_c_offset": "first channel written in the destination tensor (concat by redirection)",
    "clamp_lo": "CLAMP: lowest output value",
    "clamp_hi": "CLAMP: highest output value",
    "input": "input feature map",
    "output": "output feature map (the destination tensor when concatenating)",
    "shortcut": "ADD: residual tensor; CHANNEL_SCALE: per-channel scale vector; MUL: the "
                "other factor, a tensor of the output's shape",
    "weights": "weights in the hardware layout (DRAM)",
    "params": "parameter block: bias, requantisation, activation table, … (DRAM)",
}


class InstructionError(ValueError):
    """An instruction that cannot be encoded, decoded or executed; names the field."""

    def __init__(self, field: str, value: Any, reason: str):
        self.field, self.value, self.reason = field, value, reason
        super().__init__(f"instruction field {field!r} = {value!r}: {reason}")


# --------------------------------------------------------------------------------------------
# Python view, derived from the layout
# --------------------------------------------------------------------------------------------

def _is_enum(shape) -> bool:
    return isinstance(shape, type) and issubclass(shape, py_enum.Enum)


def _is_struct(shape) -> bool:
    return isinstance(shape, type) and issubclass(shape, data.Struct)


def _is_reserved(name: str) -> bool:
    return name.startswith("reserved")


def _python_type(shape):
    if _is_enum(shape):
        return shape
    if _is_struct(shape):
        return _VIEWS[shape]
    return int


def _default(shape):
    if _is_enum(shape):
        return shape(0)
    if _is_struct(shape):
        return dataclasses.field(default_factory=_VIEWS[shape])
    return 0


_VIEWS: dict[type, type] = {}


def _make_view(struct: type, name: str, defaults: dict, doc: str) -> type:
    fields = []
    for fname, field in data.Layout.cast(struct):
        if _is_reserved(fname):
            continue
        default = defaults[fname] if fname in defaults else _default(field.shape)
        if not isinstance(default, dataclasses.Field):
            default = dataclasses.field(default=default)
        fields.append((fname, _python_type(field.shape), default))
    view = dataclasses.make_dataclass(name, fields, frozen=True)
    view.__module__, view.__doc__ = __name__, doc
    view.replace = lambda self, **changes: dataclasses.replace(self, **changes)
    _VIEWS[struct] = view
    return view


Location = _make_view(
    LocationLayout, "Location", {},
    "Where a tensor lives; see :func:`dram` and :func:`buffer`.")


def dram(offset: int) -> Location:
    """A DRAM location, ``offset`` bytes from the image base."""
    return Location(offset=offset, space=MemSpace.DRAM)


def buffer(index: int, offset: int = 0) -> Location:
    """On-chip buffer ``index`` (0, 1 or 2) at byte ``offset``."""
    if index not in (0, 1, 2):
        raise InstructionError("space", index, "on-chip buffers are 0, 1 and 2")
    return Location(offset=offset, space=MemSpace(MemSpace.BUF0.value + index))


Instruction = _make_view(
    InstructionLayout, "Instruction",
    {"opcode": Opcode.GROUP, "kh": 1, "kw": 1, "sh": 1, "sw": 1},
    "One group instruction, field for field as in :class:`InstructionLayout` "
    "(reserved bits omitted). Build with keywords; :func:`encode` validates it.")


# --------------------------------------------------------------------------------------------
# Encoding and decoding (bit positions from the layout only)
# --------------------------------------------------------------------------------------------

def _value_range(name: str, width: int, obj) -> tuple[int, int]:
    if name in VALUE_SIGNEDNESS and getattr(obj, VALUE_SIGNEDNESS[name]):
        return -(1 << (width - 1)), (1 << (width - 1)) - 1
    return 0, (1 << width) - 1


def _pack(struct: type, obj, prefix: str = "") -> int:
    bits = 0
    for name, field in data.Layout.cast(struct):
        path = prefix + name
        if _is_reserved(name):
            continue
        value = getattr(obj, name)
        if _is_enum(field.shape):
            if not isinstance(value, field.shape):
                raise InstructionError(path, value, f"must be a {field.shape.__name__} member "
                                       f"({', '.join(m.name for m in field.shape)})")
            raw = value.value
        elif _is_struct(field.shape):
            if not isinstance(value, _VIEWS[field.shape]):
                raise InstructionError(path, value, f"must be a {_VIEWS[field.shape].__name__}")
            raw = _pack(field.shape, value, path + ".")
        else:
            if isinstance(value, bool) or not isinstance(value, int):
                raise InstructionError(path, value, "must be an integer")
            lo, hi = _value_range(name, field.width, obj)
            if not lo <= value <= hi:
                raise InstructionError(path, value, f"out of range {lo}..{hi} "
                                       f"({field.width}-bit field)")
            raw = value & ((1 << field.width) - 1)
        bits |= raw << field.offset
    return bits


def _unpack(struct: type, bits: int, prefix: str = "", base: int = 0):
    values = {}
    for name, field in data.Layout.cast(struct):
        path = prefix + name
        raw = (bits >> field.offset) & ((1 << field.width) - 1)
        if _is_reserved(name):
            if raw:
                pos = base + field.offset
                raise InstructionError(path, raw, f"reserved bits (word {pos // WORD_BITS}, "
                                       f"bit {pos % WORD_BITS}) must be zero")
        elif _is_enum(field.shape):
            try:
                values[name] = field.shape(raw)
            except ValueError:
                legal = ", ".join(f"{m.name}={m.value}" for m in field.shape)
                raise InstructionError(path, raw, f"illegal {field.shape.__name__} "
                                       f"(legal: {legal})") from None
        elif _is_struct(field.shape):
            values[name] = _unpack(field.shape, raw, path + ".", base + field.offset)
        else:
            values[name] = raw
    # Fields read through a signedness flag are sign-extended once the flags are known.
    for name, flag in VALUE_SIGNEDNESS.items():
        if name in values and values.get(flag):
            width = data.Layout.cast(struct)[name].width
            if values[name] >> (width - 1):
                values[name] -= 1 << width
    return _VIEWS[struct](**values)


def encode(instr: Instruction) -> tuple[int, ...]:
    """Validate ``instr`` and return its 11 words (word 0 holds layout bits 0..31)."""
    if not isinstance(instr, Instruction):
        raise TypeError(f"expected an isa.Instruction, got {type(instr).__name__}")
    bits = _pack(InstructionLayout, instr)  # types and ranges first, then semantics
    validate(instr)
    mask = (1 << WORD_BITS) - 1
    return tuple((bits >> (WORD_BITS * i)) & mask for i in range(WORDS))


def decode(words: Iterable[int]) -> Instruction:
    """Inverse of :func:`encode`; rejects illegal enum values, nonzero reserved bits and
    semantically invalid groups with an :class:`InstructionError` naming the field."""
    words = list(words)
    if len(words) != WORDS:
        raise InstructionError("words", len(words), f"an instruction is exactly {WORDS} words")
    bits = 0
    for i, word in enumerate(words):
        if not 0 <= word < 1 << WORD_BITS:
            raise InstructionError(f"word {i}", word, "not a 32-bit unsigned value")
        bits |= word << (WORD_BITS * i)
    instr = _unpack(InstructionLayout, bits)
    validate(instr)
    return instr


def encode_program(instrs: Iterable[Instruction]) -> bytes:
    """The instruction stream of a program: every group encoded, ``last`` set only at the end."""
    instrs = list(instrs)
    if not instrs:
        raise InstructionError("program", 0, "needs at least one group")
    for i, instr in enumerate(instrs):
        if bool(instr.last) != (i == len(instrs) - 1):
            raise InstructionError("last", instr.last,
                                   f"group {i} of {len(instrs)}: `last` must be set on the "
                                   "final group and only there")
    return b"".join(w.to_bytes(4, "little") for instr in instrs for w in encode(instr))


def decode_program(blob: bytes) -> list[Instruction]:
    """Decode groups until the one with ``last`` set; errors name the group index."""
    size = WORDS * 4
    program = []
    for start in range(0, len(blob) - size + 1, size):
        words = [int.from_bytes(blob[start + 4 * i:start + 4 * i + 4], "little")
                 for i in range(WORDS)]
        try:
            program.append(decode(words))
        except InstructionError as e:
            raise InstructionError(f"group {len(program)}: {e.field}", e.value, e.reason) \
                from None
        if program[-1].last:
            return program
    raise InstructionError("last", 0, f"no group with `last` set in {len(blob)} bytes "
                           f"({len(program)} groups decoded)")


# --------------------------------------------------------------------------------------------
# Semantic validation: what the hardware decoder also checks
# --------------------------------------------------------------------------------------------

def _conv_output(size: int, pad_a: int, pad_b: int, k: int, s: int) -> int:
    return (size + pad_a + pad_b - k) // s + 1


def _pool_outputs(size: int, k: int, s: int, p: int) -> set[int]:
    from .numeric import pool_output_size  # floor and ceil mode, as onnxruntime sizes them
    return {pool_output_size(size, k, s, p, p, ceil) for ceil in (False, True)}


def expected_output_hw(instr: Instruction) -> tuple[set[int], set[int]]:
    """The output heights and widths consistent with the input and window fields (pooling
    admits both floor and ceil mode, hence sets)."""
    def axis(size, pad_a, pad_b, k, s):
        size = _conv_output(size, pad_a, pad_b, k, s)
        if size < 1:
            return set()
        if instr.pool in (Pool.MAX, Pool.AVG):
            sizes = {o for o in _pool_outputs(size, instr.pool_size, instr.pool_stride,
                                              instr.pool_pad) if o >= 1}
        elif instr.pool == Pool.GLOBAL_AVG:
            sizes = {1}
        else:
            sizes = {size}
        return {2 * o for o in sizes} if instr.upsample else sizes
    return (axis(instr.in_h, instr.pad_top, instr.pad_bottom, instr.kh, instr.sh),
            axis(instr.in_w, instr.pad_left, instr.pad_right, instr.kw, instr.sw))


def _require(cond: bool, field: str, value, reason: str):
    if not cond:
        raise InstructionError(field, value, reason)


def _require_zero(instr, fields: Iterable[str], why: str):
    for name in fields:
        value = getattr(instr, name)
        _require(not value, name, value, f"must be 0 {why}")


def validate(instr: Instruction) -> None:
    """Check the semantic rules of one group; raise :class:`InstructionError` on the first
    violation. Field ranges are checked by the encoder."""
    i = instr
    _require(i.opcode == Opcode.GROUP, "opcode", i.opcode, "only GROUP is defined")
    for name in ("in_h", "in_w", "out_h", "out_w", "in_c", "out_c"):
        _require(getattr(i, name) >= 1, name, getattr(i, name), "must be at least 1")

    # Convolution window.
    if i.conv == ConvKind.NONE:
        for name in ("kh", "kw", "sh", "sw"):
            _require(getattr(i, name) == 1, name, getattr(i, name), "must be 1 when conv is NONE")
        _require_zero(i, ("pad_top", "pad_left", "pad_bottom", "pad_right"), "when conv is NONE")
        _require(i.weights == Location(), "weights", i.weights, "must be unset when conv is NONE")
    else:
        for name in ("kh", "kw"):
            _require(1 <= getattr(i, name) <= 7, name, getattr(i, name), "kernel side is 1..7")
        for name in ("sh", "sw"):
            _require(getattr(i, name) in (1, 2), name, getattr(i, name), "stride is 1 or 2")
        for name, k in (("pad_top", i.kh), ("pad_bottom", i.kh),
                        ("pad_left", i.kw), ("pad_right", i.kw)):
            _require(getattr(i, name) < k, name, getattr(i, name),
                     f"padding must be below the kernel side ({k})")
        _require(i.weights.space == MemSpace.DRAM, "weights", i.weights,
                 "weights are streamed from DRAM")
    if i.conv == ConvKind.NONE:
        _require_zero(i, ("weights_held",), "when conv is NONE (no weights)")
    if i.last:
        _require_zero(i, ("prefetch",), "on the last group (no next group to prefetch for)")
    if i.conv != ConvKind.NORMAL or i.reuse != Reuse.FRAME:
        _require_zero(i, ("double_buffer",), "except for a normal convolution in frame reuse")
    if i.windowed:
        _require(i.reuse == Reuse.ROW, "reuse", i.reuse, "a windowed group runs in row reuse")
        operands = ["input", "output"] + (["shortcut"] if i.eltwise != Eltwise.NONE else [])
        for name in operands:
            _require(getattr(i, name).space == MemSpace.DRAM, name, getattr(i, name),
                     "a windowed group's feature-map operands are in DRAM")
    if i.conv != ConvKind.NORMAL:
        _require(i.in_c == i.out_c, "out_c", i.out_c,
                 f"{i.conv.name} convolution keeps the channel count (in_c={i.in_c})")
    if i.psum_keep or i.psum_hold:
        field = "psum_keep" if i.psum_keep else "psum_hold"
        _require(i.conv == ConvKind.NORMAL, field, 1, "partial sums carry a normal convolution")
        _require(i.reuse == Reuse.ROW, "reuse", i.reuse,
                 "a group carrying partial sums runs in row reuse")
        conv_h = (i.in_h + i.pad_top + i.pad_bottom - i.kh) // max(1, i.sh) + 1
        _require(conv_h == 1, field, 1, "a group carrying partial sums computes one output "
                 f"row (this one {conv_h})")

    # Pooling.
    if i.pool in (Pool.MAX, Pool.AVG):
        _require(i.pool_size in (2, 3), "pool_size", i.pool_size, "pooling window is 2 or 3")
        _require(i.pool_stride in (1, 2), "pool_stride", i.pool_stride, "pool stride is 1 or 2")
        _require(i.pool_pad < i.pool_size, "pool_pad", i.pool_pad,
                 f"must be below the pooling window ({i.pool_size})")
        if i.pool == Pool.MAX:
            _require_zero(i, ("pool_count_pad",), "for MAX pooling")
    else:
        _require_zero(i, ("pool_size", "pool_stride", "pool_pad", "pool_count_pad"),
                      f"when pool is {i.pool.name}")
    if i.pool == Pool.GLOBAL_AVG:
        _require(not i.upsample, "upsample", i.upsample, "cannot follow global pooling")

    # Activation.
    if i.act == Activation.CLAMP:
        _require(i.clamp_lo <= i.clamp_hi, "clamp_lo", i.clamp_lo,
                 f"must not exceed clamp_hi ({i.clamp_hi})")
    else:
        _require_zero(i, ("clamp_lo", "clamp_hi"), f"when act is {i.act.name}")

    # Element-wise stage.
    if i.eltwise == Eltwise.NONE:
        _require_zero(i, ("sc_signed", "sc_zp"), "without an element-wise stage")
        _require(i.act_order == ActOrder.AFTER_ELTWISE, "act_order", i.act_order,
                 "must be AFTER_ELTWISE (the default) without an element-wise stage")
        _require(i.shortcut == Location(), "shortcut", i.shortcut,
                 "must be unset without an element-wise stage")
    else:
        _require(i.shortcut.space == MemSpace.DRAM or i.shortcut.space != i.input.space,
                 "shortcut", i.shortcut, "must not be in the input's on-chip buffer (each "
                 "buffer has one read port; keep one of them in DRAM or another buffer)")
    _require(i.params.space == MemSpace.DRAM, "params", i.params,
             "the parameter block is read from DRAM")

    # Shapes.
    hs, ws = expected_output_hw(i)
    _require(i.out_h in hs, "out_h", i.out_h, f"inconsistent with the input and windows "
             f"(expected {' or '.join(map(str, sorted(hs))) or 'a positive size'})")
    _require(i.out_w in ws, "out_w", i.out_w, f"inconsistent with the input and windows "
             f"(expected {' or '.join(map(str, sorted(ws))) or 'a positive size'})")
    _require(i.out_c_offset + i.out_c <= 0xFFFF, "out_c_offset", i.out_c_offset,
             f"channel {i.out_c_offset}+{i.out_c} beyond the 16-bit channel range")


# --------------------------------------------------------------------------------------------
# Field table (documentation, coverage, RTL decoders)
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FieldInfo:
    name: str          # dotted path, e.g. "input.offset"
    word: int
    lsb: int           # within the word
    width: int
    kind: str          # "uint", "int8/uint8", an enum name, or "reserved"
    doc: str


def field_table() -> list[FieldInfo]:
    """Every leaf field with its word and bit position, in layout order."""
    rows = []

    def walk(struct, prefix, base):
        for name, field in data.Layout.cast(struct):
            pos = base + field.offset
            if _is_struct(field.shape):
                walk(field.shape, f"{prefix}{name}.", pos)
                continue
            assert pos // WORD_BITS == (pos + field.width - 1) // WORD_BITS, \
                f"field {prefix}{name} straddles a word boundary"
            if _is_reserved(name):
                kind, doc = "reserved", "must be zero"
            elif _is_enum(field.shape):
                kind, doc = field.shape.__name__, FIELD_DOCS[name]
            else:
                kind = "int8/uint8" if name in VALUE_SIGNEDNESS else "uint"
                doc = FIELD_DOCS[name]
            if prefix and not _is_reserved(name):
                doc = f"{FIELD_DOCS[prefix[:-1]]}: {doc}"
            rows.append(FieldInfo(prefix + name, pos // WORD_BITS, pos % WORD_BITS,
                                  field.width, kind, doc))
    walk(InstructionLayout, "", 0)
    return rows


def enum_types() -> list[type]:
    """The shaped enums of the layout, in order of first appearance."""
    found = []

    def walk(struct):
        for _, field in data.Layout.cast(struct):
            if _is_struct(field.shape):
                walk(field.shape)
            elif _is_enum(field.shape) and field.shape not in found:
                found.append(field.shape)
    walk(InstructionLayout)
    return found


_SIZE = data.Layout.cast(InstructionLayout).size
assert _SIZE == WORDS * WORD_BITS, \
    "an instruction must be exactly 11 words of 32 bits"
