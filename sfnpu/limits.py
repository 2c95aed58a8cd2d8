"""What one group may ask of the controller's on-chip stores: one definition for the RTL, the
compiler and the cycle model.

:class:`StoreSizes` are the controller's capacities for a hardware configuration (the RTL sizes
its memories from them); :func:`group_shape` derives the per-group quantities the controller
decodes (channel blocks, conv output size, weight steps, row-buffer places); :func:`overflows`
lists every capacity an instruction exceeds — exactly the conditions for which the controller
stops a run with ``BUFFER_OVERFLOW`` — so the compiler can refuse such a layer by name instead
of emitting a program that the hardware rejects.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from sfnpu import layout
from sfnpu.config import ROW_BUFFER_ROWS, HwConfig, depthwise_taps
from sfnpu.isa import (ConvKind, Eltwise, InputTransform, Instruction, Location, MemSpace, Pool,
                       Reuse, eltwise_reads_map)


__all__ = ["StoreSizes", "GroupShape", "group_shape", "overflows", "loads_whole_weights",
           "HeldWeights", "weight_store_after", "with_held_weights", "stages_input",
           "staging_buffer", "staging_location", "store_words", "prefetch_fits",
           "prefetch_pays", "chunk_blocks", "double_buffer_fits", "rtl_problems"]


def rtl_problems(config: HwConfig) -> list[str]:
    """Why the RTL's group controller cannot be generated for ``config``, one phrase each;
    empty when it can. The compiler, the golden model and the cycle model take any valid
    configuration; the gateware (``hw.controller``) checks this list when it is built."""
    problems = []
    if config.ti != config.to:
        problems.append("the group controller needs Ti == To")
    B, L = config.dram_bus_bytes, config.lanes
    if L % B:
        problems.append(f"the controller needs a bus that divides the {L}-byte word "
                        f"(bus: {B} bytes)")
    if len(set(config.buffer_bytes)) != 1:
        problems.append("the controller's on-chip buffers {0, 1, 2} are of one size")
    return problems


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class StoreSizes:
    """The controller's stores for one configuration, in their own words (a word is one pixel
    of one channel block, ``lanes`` bytes; a weight word is Ti × To bytes)."""
    lanes: int
    weight_words: int       # weight store (the paper's buffer 1)
    row_words: int          # one bank of the row buffer: the widest input row
    psum_words: int         # partial sums: the widest conv output row
    write_words: int        # output staging before DRAM
    buffer_words: int       # each on-chip feature-map buffer {0, 1, 2}
    depthwise_taps: int     # kernel taps per depthwise step (half a MAC row)
    max_channels: int       # output channels: bias, multiplier and weight-zero-point stores
    max_table_channels: int  # input channels of the per-channel input tables
    pool_row_pixels: int    # pixels × channel blocks of the pooling and upsampling line stores

    @classmethod
    @lru_cache(maxsize=64)
    def of(cls, config: HwConfig) -> "StoreSizes":
        L = config.lanes
        return cls(lanes=L, weight_words=config.weight_store_words,
                   row_words=config.max_row_bytes // L,
                   psum_words=config.psum_buffer_bytes // (4 * config.to),
                   write_words=config.write_buffer_bytes // L,
                   buffer_words=min(config.buffer_bytes) // L,
                   depthwise_taps=depthwise_taps(config), max_channels=config.max_channels,
                   max_table_channels=config.max_table_channels,
                   pool_row_pixels=config.pool_row_pixels)

    @property
    def max_channel_blocks(self) -> int:
        return self.max_channels // self.lanes


@dataclass(frozen=True)
class GroupShape:
    """The quantities the controller decodes from one instruction."""
    depthwise: bool         # depthwise, or conv NONE (a unit-weight depthwise pass)
    identity: bool          # conv NONE
    in_blocks: int
    out_blocks: int
    ib: int                 # input-channel blocks per output block (1: depthwise)
    conv_h: int
    conv_w: int
    pooled_h: int           # after pooling, before upsampling
    pooled_w: int
    taps: int
    steps: int              # weight words per (output block, input block): P
    sets: int               # (output block, input block) pairs
    row_words: int          # one input row, every channel block
    places: int             # input rows per row-buffer bank

    @property
    def weight_steps(self) -> int:
        return self.sets * self.steps


def group_shape(instr: Instruction, sizes: StoreSizes) -> GroupShape:
    L = sizes.lanes
    identity = instr.conv == ConvKind.NONE
    depthwise = identity or instr.conv == ConvKind.DEPTHWISE
    in_blocks, out_blocks = _ceil_div(instr.in_c, L), _ceil_div(instr.out_c, L)
    ib = 1 if depthwise else in_blocks
    conv_h, conv_w = layout.conv_output_hw(instr)
    taps = instr.kh * instr.kw
    steps = _ceil_div(taps, sizes.depthwise_taps) if depthwise else taps
    row_words = in_blocks * instr.in_w
    return GroupShape(
        depthwise=depthwise, identity=identity, in_blocks=in_blocks, out_blocks=out_blocks,
        ib=ib, conv_h=conv_h, conv_w=conv_w,
        pooled_h=instr.out_h >> 1 if instr.upsample else instr.out_h,
        pooled_w=instr.out_w >> 1 if instr.upsample else instr.out_w,
        taps=taps, steps=steps, sets=out_blocks * ib, row_words=row_words,
        places=sizes.row_words // row_words if row_words else 0)


def loads_whole_weights(instr: Instruction, config: HwConfig) -> bool:
    """Whether the controller loads the group's weights into the store whole — neither
    streamed per output row (row reuse) nor in output-channel chunks (frame reuse) — so that
    a following group with the same weights can set ``weights_held``."""
    if instr.conv == ConvKind.NONE:
        return False
    z = StoreSizes.of(config)
    return group_shape(instr, z).weight_steps <= z.weight_words


def streams_weights(instr: Instruction, config: HwConfig) -> bool:
    """Whether the controller streams the group's weights from DRAM once per conv output row:
    row reuse of a normal convolution whose weights exceed the weight store."""
    return (instr.reuse == Reuse.ROW and instr.conv == ConvKind.NORMAL
            and not loads_whole_weights(instr, config))


def weight_reads(instr: Instruction, config: HwConfig) -> int:
    """How many times the group's weights cross the DRAM bus: none when it has none or the
    store holds them (``weights_held``), once per conv output row when it streams them
    (:func:`streams_weights`), else once (whole, or in frame-reuse chunks that together
    read every block once)."""
    if instr.conv == ConvKind.NONE or instr.weights_held:
        return 0
    if streams_weights(instr, config):
        return layout.conv_output_hw(instr)[0]
    return 1


def stages_input(instr: Instruction, config: HwConfig) -> bool:
    """Whether the controller stages the group's input on chip: a frame-reuse convolution
    whose weights it takes in several output-channel chunks reads a DRAM input once, during
    the first chunk, copying it into :func:`staging_buffer` at offset 0, and the later chunks
    read it there."""
    return (instr.reuse == Reuse.FRAME and instr.conv == ConvKind.NORMAL
            and instr.input.space == MemSpace.DRAM and not loads_whole_weights(instr, config))


def staging_buffer(output: Location, shortcut: Location | None) -> int:
    """The on-chip buffer a staged input goes to: the lowest-numbered one that holds neither
    the group's output nor its shortcut operand (``None``: the group has none)."""
    used = {loc.space.value - MemSpace.BUF0.value for loc in (output, shortcut)
            if loc is not None and loc.space != MemSpace.DRAM}
    return next(b for b in range(3) if b not in used)


def staging_location(instr: Instruction) -> Location:
    """Where the group's input is staged: offset 0 of its :func:`staging_buffer` (the
    shortcut operand counts only when the group has an element-wise stage)."""
    sc = instr.shortcut if instr.eltwise != Eltwise.NONE else None
    return Location(offset=0, space=MemSpace(MemSpace.BUF0.value
                                             + staging_buffer(instr.output, sc)))


@dataclass(frozen=True)
class HeldWeights:
    """Whole weights the weight store holds between groups: the controller keeps their DRAM
    offset and kind (``held_*``); the compiler also keeps the shape, so that it only relies on
    them for a group whose weights are the same tensor in the same layout."""
    offset: int
    conv: ConvKind
    kh: int
    kw: int
    in_c: int
    out_c: int

    @classmethod
    def of(cls, instr: Instruction) -> "HeldWeights":
        return cls(instr.weights.offset, instr.conv, instr.kh, instr.kw, instr.in_c, instr.out_c)


def weight_store_after(held: HeldWeights | None, instr: Instruction,
                       config: HwConfig) -> HeldWeights | None:
    """What the weight store holds after ``instr`` ran, given what it held before: the group's
    weights when it loads them whole; unchanged when it loads none (conv NONE, weights_held)
    or streams them per output row (row reuse past the store); nothing valid after frame-reuse
    chunks, which leave only the last chunk's blocks."""
    if instr.conv == ConvKind.NONE or instr.weights_held:
        return held
    if loads_whole_weights(instr, config):
        return HeldWeights.of(instr)
    if streams_weights(instr, config):
        return held
    return None


def chunk_blocks(instr: Instruction, config: HwConfig) -> int:
    """Output-channel blocks per weight chunk, as the controller's CHUNK state counts them:
    all of them when the store holds the whole weights, else as many as fit the store — half
    of it with ``double_buffer`` (0: not even one block fits)."""
    z = StoreSizes.of(config)
    s = group_shape(instr, z)
    if s.weight_steps <= z.weight_words or instr.reuse != Reuse.FRAME:
        return s.out_blocks
    return min(s.out_blocks, _chunk_words(instr, s, z) // (s.ib * s.steps))


def _chunk_words(instr: Instruction, s: GroupShape, z: StoreSizes) -> int:
    """Store words one weight chunk may take: half the store with ``double_buffer`` when the
    weights exceed it (the controller's CHUNK state), else the whole store."""
    half = bool(instr.double_buffer) and s.weight_steps > z.weight_words
    return z.weight_words // 2 if half else z.weight_words


def double_buffer_fits(instr: Instruction, config: HwConfig) -> bool:
    """Whether ``double_buffer`` on ``instr`` takes its weights in chunks of half the store:
    a frame-reuse normal convolution whose weights exceed the store, one output block of
    which fits half of it."""
    if instr.conv != ConvKind.NORMAL or instr.reuse != Reuse.FRAME \
            or loads_whole_weights(instr, config):
        return False
    z = StoreSizes.of(config)
    s = group_shape(instr, z)
    return s.ib * s.steps <= z.weight_words // 2


def store_words(instr: Instruction, config: HwConfig) -> int:
    """Weight-store words the group's own weights occupy while its last chunk computes: none
    for conv NONE (unit weights) or weights streamed from DRAM, else its weight steps — of
    the last chunk when ``double_buffer`` takes them in chunks, more than the store when
    frame reuse takes them in chunks of the whole store."""
    if instr.conv == ConvKind.NONE or streams_weights(instr, config):
        return 0
    s = group_shape(instr, StoreSizes.of(config))
    if instr.double_buffer and double_buffer_fits(instr, config):
        per = chunk_blocks(instr, config)
        return ((s.out_blocks - 1) % per + 1) * s.ib * s.steps
    return s.weight_steps


def prefetch_fits(instr: Instruction, nxt: Instruction, config: HwConfig) -> bool:
    """Whether ``instr`` may set ``prefetch`` for ``nxt``, exactly as the controller checks
    it: ``nxt`` is a normal convolution, and its weights fit the weight store beside the ones
    ``instr`` computes with (the controller puts them at the store's other end)."""
    if nxt.conv != ConvKind.NORMAL:
        return False
    z = StoreSizes.of(config)
    return store_words(instr, config) + group_shape(nxt, z).weight_steps <= z.weight_words


def prefetch_pays(instr: Instruction, config: HwConfig) -> bool:
    """Whether the compiler lets ``instr`` prefetch: its compute phase has the DRAM bus to
    itself (every feature-map operand on chip, no streamed weights), so the next group's
    weights arrive behind its computation instead of delaying its reads and writes. The same
    rule decides ``double_buffer``."""
    operands = [instr.input, instr.output]
    if instr.eltwise != Eltwise.NONE:
        operands.append(instr.shortcut)
    return (not streams_weights(instr, config)
            and all(loc.space != MemSpace.DRAM for loc in operands))


def with_held_weights(instructions: Sequence[Instruction],
                      config: HwConfig) -> list[Instruction]:
    """``instructions`` with ``weights_held`` and ``prefetch`` set exactly where the weight
    store already holds the group's weights: groups sharing a weight tensor back to back (a
    detection head over pyramid levels) read it from DRAM once, and a group whose predecessor
    can load its weights during its own compute phase (:func:`prefetch_pays`,
    :func:`prefetch_fits`) finds them there. Either way the store then holds the group's
    weights, as if it had loaded them. ``double_buffer`` is set where frame reuse takes the
    weights in chunks and the compute phase has the bus to itself
    (:func:`double_buffer_fits`), so each next chunk loads behind the current one."""
    out, held = [], None
    for k, instr in enumerate(instructions):
        double = prefetch_pays(instr, config) and double_buffer_fits(instr, config)
        if bool(instr.double_buffer) != double:
            instr = instr.replace(double_buffer=int(double))
        prefetched = k > 0 and bool(out[-1].prefetch)
        keep = prefetched or (instr.conv != ConvKind.NONE and held == HeldWeights.of(instr)
                              and loads_whole_weights(instr, config))
        if bool(instr.weights_held) != keep:
            instr = instr.replace(weights_held=int(keep))
        held = HeldWeights.of(instr) if prefetched else weight_store_after(held, instr, config)
        nxt = instructions[k + 1] if k + 1 < len(instructions) and not instr.last else None
        prefetch = (nxt is not None and prefetch_pays(instr, config)
                    and loads_whole_weights(nxt, config) and held != HeldWeights.of(nxt)
                    and prefetch_fits(instr, nxt, config))
        if bool(instr.prefetch) != prefetch:
            instr = instr.replace(prefetch=int(prefetch))
        out.append(instr)
    return out


def overflows(instr: Instruction, config: HwConfig, *, buffers: bool = True) -> list[str]:
    """Every on-chip store that ``instr`` overflows on ``config``, one sentence each; empty
    when the controller accepts it. Mirrors the controller's ``BUFFER_OVERFLOW`` checks.
    ``buffers=False`` leaves out the operands' extents in buffers {0, 1, 2} (a memory-size
    sweep sizes those itself)."""
    z = StoreSizes.of(config)
    s = group_shape(instr, z)
    L = z.lanes
    found = []

    def check(over: bool, what: str):
        if over:
            found.append(what)

    check(s.out_blocks > z.max_channel_blocks,
          f"{instr.out_c} output channels exceed the parameter stores' {z.max_channels} "
          f"(max_channels)")
    check(s.row_words > z.row_words,
          f"an input row of {instr.in_w} pixels × {s.in_blocks} channel blocks is "
          f"{s.row_words} words; the row buffer holds {z.row_words} "
          f"(row_buffer_bytes {config.row_buffer_bytes})")
    line = {Pool.MAX: s.pooled_w, Pool.AVG: s.conv_w}.get(instr.pool, 0)
    if instr.upsample:
        line = max(line, s.pooled_w)
    check(s.out_blocks * line > z.pool_row_pixels,
          f"a pooled row of {line} pixels × {s.out_blocks} channel blocks exceeds the line "
          f"store's {z.pool_row_pixels} (pool_row_pixels)")
    check(instr.in_transform == InputTransform.CHANNEL_TABLE
          and s.in_blocks > z.max_table_channels // L,
          f"an input table over {instr.in_c} channels exceeds the {z.max_table_channels} the "
          f"table store holds (max_table_channels)")
    check(s.conv_w > z.psum_words,
          f"a conv output row of {s.conv_w} pixels exceeds the partial-sum buffer's "
          f"{z.psum_words} (psum_buffer_bytes {config.psum_buffer_bytes})")
    check((instr.psum_keep or instr.psum_hold) and s.out_blocks * s.conv_w > z.psum_words,
          f"partial sums of a row of {s.conv_w} pixels × {s.out_blocks} channel blocks "
          f"carried to the next group exceed the partial-sum buffer's {z.psum_words} words "
          f"(psum_buffer_bytes {config.psum_buffer_bytes})")
    if s.row_words <= z.row_words:
        check(instr.kh > s.places * ROW_BUFFER_ROWS,
              f"a {instr.kh}-row kernel needs {instr.kh} input rows on chip; rows of "
              f"{s.row_words} words leave room for {s.places * ROW_BUFFER_ROWS}")
    check(s.depthwise and s.weight_steps > z.weight_words,
          f"the depthwise weights take {s.weight_steps} words; the weight store holds "
          f"{z.weight_words}")
    if instr.reuse == Reuse.FRAME and not s.depthwise:
        store = _chunk_words(instr, s, z)
        check(s.ib * s.steps > store,
              f"one output block's weights take {s.ib * s.steps} words; frame reuse needs "
              f"them in the weight store ({store}" + (", half of it with double_buffer)"
                                                       if store < z.weight_words else ")"))
    size = z.buffer_words * L
    operands = [("input", instr.input, s.in_blocks * instr.in_h * instr.in_w * L),
                ("output", instr.output, (instr.out_c_offset // L + s.out_blocks)
                 * instr.out_h * instr.out_w * L)]
    if instr.eltwise != Eltwise.NONE:
        per_block = s.conv_h * s.conv_w * L if eltwise_reads_map(instr.eltwise) else L
        operands.append(("shortcut", instr.shortcut, s.out_blocks * per_block))
    for name, loc, extent in operands:
        check(buffers and loc.space != MemSpace.DRAM and loc.offset + extent > size,
              f"the {name} at buffer offset {loc.offset} + {extent} bytes passes the "
              f"buffer's end ({size} bytes)")
    return found
