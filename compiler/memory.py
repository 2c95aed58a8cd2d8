"""Reuse-aware static memory allocation (ShortcutFusion Sec. IV-A/B, eqs. 1–9, Algorithm 1).

A reuse *policy* gives every block (:mod:`.blocks`) a weight-reuse mode:

* ROW — the layer's weights are preloaded into buffer 1 (eq. 2) and input rows stream from
  DRAM through the row buffer; a row-mode group's feature maps live in DRAM (small channel
  vectors — SE pooling and FC results — may stay on chip, Fig. 13c).
* FRAME — feature maps stay on chip and weight blocks stream from DRAM exactly once; the
  input frame is re-read once per output-channel block, so it must be on chip.

Which tensors stay on chip (:func:`classify`): a tensor written by a frame-mode group and read
only by frame-mode groups (or any channel vector), except graph inputs and outputs, concat
(route) destinations — the paper keeps route data off chip — and tensors that would be held on
chip while unrelated work runs (a long path). Everything else keeps its DRAM home from code
generation.

A frame-mode normal convolution with more than one output-channel block whose input is in DRAM
*stages* the input on chip and reads DRAM once: the controller, which takes the weights in
chunks of whole output blocks, copies the input into the staging area during the first chunk
and reads it there in the later ones (when there is one chunk it reads DRAM once anyway; the
allocation reserves the area whenever the paper's one-block-at-a-time schedule would need it).
The staging area is fixed by rule so that the instruction alone determines it
(:func:`staging`, :func:`sfnpu.limits.staging_buffer`): offset 0 of the lowest-numbered
buffer that holds neither the group's output nor its shortcut.

:func:`allocate` places on-chip tensors in buffers {0, 1, 2} greedily in group order (first fit
in the buffer that grows least), honouring liveness, one read port per buffer (a group's input
and shortcut are in different buffers), row-mode weights in buffer 1 and staging areas.
:func:`check_program` independently proves a placed program correct: every read finds the
tensor where it was written and no live tensor is overwritten. :func:`requirements` evaluates
eqs. 1–7 and :func:`traffic` counts DRAM bytes exactly from the instructions' locations, beside
the paper's eqs. 8–9.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from math import ceil
from typing import Mapping, Sequence

from sfnpu import isa, layout
from sfnpu.config import DEVICES, HwConfig, ROW_BUFFER_ROWS
from sfnpu.isa import ConvKind, Eltwise, Instruction, Location, MemSpace, Reuse, eltwise_reads_map
from sfnpu.limits import (HeldWeights, loads_whole_weights, overflows, prefetch_fits,
                          stages_input, staging_buffer, staging_location, weight_store_after,
                          weight_reads, with_held_weights)

from .blocks import Blocks, GroupGraph, detect_blocks, operands
from .codegen import Program
from .groups import Group
from .ir import Graph, channel_views

__all__ = [
    "AllocationError", "Policy", "Allocation", "classify", "long_path_tensors", "allocate",
    "staging", "needs_staging", "frame_weights", "row_weights", "place", "apply_policy",
    "check_program", "store_overflows",
    "CheckReport", "Requirements", "requirements", "dense_requirements", "instruction_needs",
    "Budget", "Violation", "GroupTraffic", "Traffic", "traffic", "accesses", "bram18k_eq7",
    "WEIGHT_BUFFER", "PSUM_BYTES",
]

#: The buffer that holds a row-mode group's weights (eq. 2).
WEIGHT_BUFFER = 1
#: Bytes per partial sum (eq. 4).
PSUM_BYTES = 4


@lru_cache(maxsize=1 << 16)
def accesses(instr: Instruction, config: HwConfig, window: layout.Geometry | None = None
             ) -> tuple[layout.Access, ...]:
    """:func:`sfnpu.layout.accesses`, memoised (policy searches place the same instruction
    many times); ``window``: a windowed instruction's pitches (:meth:`Program.window`)."""
    return tuple(layout.accesses(instr, config, geo=window))


class AllocationError(ValueError):
    """An allocation that cannot be made or that the checker refutes; names group and tensor."""


def _buf(loc: Location | None) -> int | None:
    """Buffer index of an on-chip location, None for DRAM or no location."""
    if loc is None or loc.space == MemSpace.DRAM:
        return None
    return loc.space.value - MemSpace.BUF0.value


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


# --------------------------------------------------------------------------------------------
# Policy
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Policy:
    """Data reuse policy L: one weight-reuse mode per block (``cuts``: the cut-point of each
    segment, when the policy comes from a cut-point enumeration). ``hold_long_paths``: keep
    long-path tensors (:func:`classify`) on chip too, trading buffer space for DRAM traffic."""
    modes: tuple[Reuse, ...]
    label: str = ""
    cuts: tuple[int, ...] = ()
    hold_long_paths: bool = False

    def group_modes(self, blocks: Blocks) -> tuple[Reuse, ...]:
        if len(self.modes) != len(blocks):
            raise ValueError(f"policy has {len(self.modes)} modes for {len(blocks)} blocks")
        return tuple(self.modes[b] for b in blocks.block_of)

    @staticmethod
    def uniform(blocks: Blocks, mode: Reuse) -> "Policy":
        return Policy((mode,) * len(blocks), f"all {mode.name.lower()}")

    @property
    def frame_blocks(self) -> int:
        return sum(m == Reuse.FRAME for m in self.modes)


# --------------------------------------------------------------------------------------------
# Fixed reservations derived from one instruction
# --------------------------------------------------------------------------------------------

def _input_bytes(instr: Instruction, config: HwConfig) -> int:
    return layout.tensor_bytes(instr.in_c, instr.in_h, instr.in_w, config.lanes)


def needs_staging(instr: Instruction, config: HwConfig) -> bool:
    """Whether the allocation reserves a staging area for a frame-mode group's DRAM input.

    A normal convolution with several output-channel blocks runs over its input once per
    chunk of blocks whose weights the store holds (:func:`sfnpu.limits.stages_input`).
    DRAM delivers the input once either way: staged on chip when the weights take several
    chunks, or read once when the store holds the whole weights (one chunk). The allocation
    takes the cheaper: the staging area when the weights are larger than the input, else the
    whole weights in the weight store (:func:`frame_weights`, counted in eq. 1) — and
    :func:`check_program` refuses a program whose store is too small for the latter."""
    return _stages(instr, instr.reuse, instr.input, config)


def _reads_input_per_block(instr: Instruction, mode: Reuse, input_: Location,
                           config: HwConfig) -> bool:
    return (mode == Reuse.FRAME and input_.space == MemSpace.DRAM
            and instr.conv == ConvKind.NORMAL
            and layout.channel_blocks(instr.out_c, config.to) > 1)


def _stages(instr: Instruction, mode: Reuse, input_: Location, config: HwConfig) -> bool:
    return (_reads_input_per_block(instr, mode, input_, config)
            and layout.weight_bytes(instr, config) > _input_bytes(instr, config))


def frame_weights(instr: Instruction, config: HwConfig) -> int:
    """Bytes of weights a frame-mode group needs whole in the weight store: those of a
    normal convolution that reads its DRAM input once without staging it (one chunk)."""
    if _reads_input_per_block(instr, instr.reuse, instr.input, config) \
            and not needs_staging(instr, config):
        return layout.weight_bytes(instr, config)
    return 0


def staging(instr: Instruction, config: HwConfig) -> tuple[Location, int] | None:
    """(location, bytes) where a frame-mode group stages its DRAM input, or None."""
    if not needs_staging(instr, config):
        return None
    return staging_location(instr), _input_bytes(instr, config)


def row_weights(instr: Instruction, config: HwConfig) -> tuple[Location, int] | None:
    """(location, bytes) of a row-mode group's preloaded weights (buffer 1, eq. 2), or None."""
    if instr.reuse != Reuse.ROW or instr.conv == ConvKind.NONE:
        return None
    return isa.buffer(WEIGHT_BUFFER, 0), layout.weight_bytes(instr, config)


# --------------------------------------------------------------------------------------------
# Which tensors stay on chip
# --------------------------------------------------------------------------------------------

def _related(gg: GroupGraph, blocks: Blocks, g: int, producer: int,
             readers: Sequence[int]) -> bool:
    """Whether group ``g``, running while a tensor is held, works towards that tensor's use."""
    if g in readers:
        return True
    mine = {blocks.block_of[producer], *(blocks.block_of[r] for r in readers)}
    if blocks.block_of[g] in mine:
        return True
    return gg.is_ancestor(producer, g) and any(gg.is_ancestor(g, r) for r in readers)


def _long_path(gg: GroupGraph, blocks: Blocks, groups: Sequence[Group], producer: int,
               readers: Sequence[int]) -> str:
    """Why a tensor is a long path (the first unrelated group held across), or ""."""
    for g in range(producer + 1, max(readers)):
        if not _related(gg, blocks, g, producer, readers):
            return f"long path: held while unrelated group {g} ({groups[g].name}) runs"
    return ""


def long_path_tensors(graph: Graph, groups: Sequence[Group], blocks: Blocks) -> set[str]:
    """Tensors that ``hold_long_paths`` can bring on chip (long paths, concat destinations):
    those of the all-frame policy, since row reuse only sends more tensors to DRAM."""
    off = classify(graph, groups, blocks, (Reuse.FRAME,) * len(groups))
    on = classify(graph, groups, blocks, (Reuse.FRAME,) * len(groups), hold_long_paths=True)
    return {t for t, why in off.items() if why and not on[t]}


def tiled_tensors(groups: Sequence[Group]) -> set[str]:
    """Operands of the tiles of groups too large for the stores (:mod:`.tiling`): they stay
    in DRAM, where the tiles read and write windows of them."""
    return {t for g in groups if g.part for t in (g.input, g.written, g.shortcut)
            if t is not None}


def classify(graph: Graph, groups: Sequence[Group], blocks: Blocks,
             modes: Sequence[Reuse], hold_long_paths: bool = False) -> dict[str, str]:
    """Every tensor a group writes → "" if it stays on chip, else why it stays in DRAM.

    A long path is a tensor held while some group runs that neither reads it, nor belongs to
    its producer's or a reader's block, nor lies on a path from its producer to a reader — e.g.
    the backbone feature maps an FPN reads much later, or a branch kept while an interleaved
    sibling branch runs. By default such long-lifetime data stays off chip, and so do concat
    (route) destinations, as Sec. IV-A keeps long-path concat data; ``hold_long_paths`` keeps
    both on chip — the allocator then holds them from their first writer to their last reader
    beside the unrelated work, which costs buffer space and saves their DRAM writes and reads.
    """
    gg = blocks.graph
    dests = {g.dest for g in groups if g.dest is not None}
    tiled = tiled_tensors(groups)
    viewed = {source for source, _ in channel_views(graph).values()}
    verdict: dict[str, str] = {}
    for t, writers in gg.writers.items():
        readers = gg.readers.get(t, ())
        p = writers[-1]
        vector = graph.tensors[t].shape[1:] == (1, 1)
        if t in gg.graph_outputs:
            why = "network output"
        elif t in tiled:
            why = "an operand of a tiled group (tiles read and write DRAM windows)"
        elif t in viewed:
            why = "read through channel views (Split, Slice: windows of it in DRAM)"
        elif t in dests and not hold_long_paths:
            why = "concat destination (route data stays off chip)"
        elif any(modes[w] == Reuse.ROW for w in writers) and not vector:
            why = "written by a row-mode group"
        elif not readers:
            why = "never read"
        elif not vector and any(modes[r] == Reuse.ROW for r in readers):
            why = f"read by row-mode group {next(r for r in readers if modes[r] == Reuse.ROW)}"
        elif any(groups[r].input == t and groups[r].shortcut == t for r in readers):
            why = "read twice by one group (one read port per buffer)"
        else:
            why = "" if hold_long_paths else _long_path(gg, blocks, groups, p, readers)
        verdict[t] = why
    return verdict


# --------------------------------------------------------------------------------------------
# Allocation
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Item:
    buf: int
    lo: int
    hi: int
    t0: int          # first group during which the range is in use
    t1: int          # last group
    what: str


@dataclass(frozen=True)
class Allocation:
    """Where every tensor of the program lives under one policy."""
    modes: tuple[Reuse, ...]                 # per group
    locations: Mapping[str, Location]        # every tensor a group reads or writes
    off_chip: Mapping[str, str]              # frame-group tensors left in DRAM → reason
    extents: tuple[int, int, int]            # bytes used per buffer (weights, staging included)

    @property
    def on_chip(self) -> frozenset[str]:
        return frozenset(t for t, loc in self.locations.items()
                         if loc.space != MemSpace.DRAM)


class _StagingConflict(Exception):
    """Group ``i``'s staging area (buffer ``buf``, ``size`` bytes at offset 0) is taken."""

    def __init__(self, i: int, buf: int, size: int, message: str):
        super().__init__(message)
        self.i, self.buf, self.size = i, buf, size


class _Allocator:
    """Greedy placement in group order. A group's staging area is fixed by rule (offset 0 of
    a buffer the instruction determines), so a tensor placed earlier may sit there: the
    allocation is then redone with that area reserved from the start (:meth:`allocate`)."""

    def __init__(self, graph: Graph, groups: Sequence[Group], program: Program,
                 blocks: Blocks, modes: Sequence[Reuse], capacity,
                 reserved: Mapping[tuple[int, int], int] = {}, hold_long_paths: bool = False):
        self.graph, self.groups, self.program = graph, groups, program
        self.config = program.config
        self.blocks, self.modes = blocks, tuple(modes)
        self.hold_long_paths = hold_long_paths
        self.capacity = capacity
        self.items: list[_Item] = []
        self.extent = [0, 0, 0]
        self.loc: dict[str, Location] = {}
        self.align = self.config.lanes
        self.reserved = dict(reserved)       # (group, buffer) → staging bytes held from start
        self.used: set[tuple[int, int]] = set()
        for (i, b), size in self.reserved.items():
            self.items.append(_Item(b, 0, size, i, i, f"staging of group {i}"))

    def size(self, t: str) -> int:
        return layout.tensor_bytes(*self.graph.tensors[t].shape, self.config.lanes)

    def fits(self, buf: int, lo: int, hi: int, t0: int, t1: int, own: str = "") -> bool:
        """Whether [lo, hi) of ``buf`` is free from group t0 to t1 (``own``: an item that
        does not count, a group's own reserved staging area)."""
        if self.capacity is not None and hi > self.capacity[buf]:
            return False
        return not any(it.buf == buf and it.lo < hi and lo < it.hi and it.t0 <= t1
                       and t0 <= it.t1 and it.what != own for it in self.items)

    def first_fit(self, buf: int, size: int, t0: int, t1: int) -> int | None:
        busy = sorted((it.lo, it.hi) for it in self.items
                      if it.buf == buf and it.t0 <= t1 and t0 <= it.t1)
        off = 0
        for lo, hi in busy:
            if off + size <= lo:
                break
            off = max(off, _align(hi, self.align))
        if self.capacity is not None and off + size > self.capacity[buf]:
            return None
        return off

    def add(self, item: _Item):
        self.items.append(item)
        self.extent[item.buf] = max(self.extent[item.buf], item.hi)

    def location(self, t: str | None) -> Location | None:
        return None if t is None else self.loc[t]

    def run(self) -> Allocation:
        gg, cfg = self.blocks.graph, self.config
        verdict = classify(self.graph, self.groups, self.blocks, self.modes,
                           self.hold_long_paths)
        self.loc = dict(self.program.locations)
        drafts = self.program.instructions
        for i, instr in enumerate(drafts):
            if self.modes[i] == Reuse.ROW and instr.conv != ConvKind.NONE:
                self.add(_Item(WEIGHT_BUFFER, 0, layout.weight_bytes(instr, cfg), i, i,
                               f"weights of group {i}"))
        placed: set[str] = set()
        for i, grp in enumerate(self.groups):
            stage = _stages(drafts[i], self.modes[i], self.loc[grp.input], cfg)
            in_bytes = _input_bytes(drafts[i], cfg) if stage else 0
            # A concat destination is placed whole by its first writer; the others write
            # their parts into it at their channel offsets.
            if verdict[grp.written] == "" and grp.written not in placed:
                self.place_output(i, grp, in_bytes)
                placed.add(grp.written)
            if stage:
                self.stage(i, grp, in_bytes)
        off_chip = {t: why for t, why in verdict.items()
                    if why and self.modes[gg.writers[t][-1]] == Reuse.FRAME}
        # Extents without reserved staging areas the final placement no longer uses.
        extent = [0, 0, 0]
        for it in self.items:
            if it.what.startswith("staging of group ") and (it.t0, it.buf) in self.reserved \
                    and (it.t0, it.buf) not in self.used:
                continue
            extent[it.buf] = max(extent[it.buf], it.hi)
        return Allocation(self.modes, dict(self.loc), off_chip, tuple(extent))

    def stage(self, i: int, grp: Group, in_bytes: int):
        """Reserve the staging area the rule of :func:`staging` gives group ``i``."""
        s = staging_buffer(self.loc[grp.written], self.location(grp.shortcut))
        self.used.add((i, s))
        if (i, s) in self.reserved:
            self.extent[s] = max(self.extent[s], in_bytes)
            return
        if not self.fits(s, 0, in_bytes, i, i):
            raise _StagingConflict(
                i, s, in_bytes,
                f"group {i} ({grp.name}): staging its DRAM input ({in_bytes} B) at buffer {s} "
                "offset 0 would overwrite live data or exceed the buffer")
        self.add(_Item(s, 0, in_bytes, i, i, f"staging of group {i}"))

    def read_port_conflicts(self, t: str) -> set[int]:
        """Buffers holding the other operand of a group that will read ``t``."""
        found = set()
        for r in self.blocks.graph.readers[t]:
            for other in operands(self.groups[r]):
                if other != t and _buf(self.loc[other]) is not None:
                    found.add(_buf(self.loc[other]))
        return found

    def place_output(self, i: int, grp: Group, stage_bytes: int):
        """First fit of group ``i``'s output in the buffer that grows least (ties: offset 0,
        not the input's buffer, lowest index), leaving room for its input staging."""
        t = grp.written
        size = self.size(t)
        t1 = max(self.blocks.graph.readers[t])
        forbidden = self.read_port_conflicts(t)
        in_buf = _buf(self.loc[grp.input])
        sc = self.location(grp.shortcut)
        best = None
        for b in range(3):
            off = None if b in forbidden else self.first_fit(b, size, i, t1)
            if off is None:
                continue
            if stage_bytes and not self.fits(staging_buffer(isa.buffer(b), sc), 0,
                                             stage_bytes, i, i, f"staging of group {i}"):
                continue
            key = (max(0, off + size - self.extent[b]), off > 0, b == in_buf, b)
            if best is None or key < best[0]:
                best = (key, b, off)
        if best is None:
            cap = "unlimited" if self.capacity is None else "/".join(map(str, self.capacity))
            ports = f"; buffers {sorted(forbidden)} hold the other operand of a reader" \
                if forbidden else ""
            raise AllocationError(
                f"group {i} ({grp.name}): no buffer can hold {t!r} ({size} B, live until "
                f"group {t1}) beside the live data (capacities {cap} B{ports})")
        _, b, off = best
        self.add(_Item(b, off, off + size, i, t1, t))
        self.loc[t] = isa.buffer(b, off)


def allocate(graph: Graph, groups: Sequence[Group], program: Program, blocks: Blocks,
             policy: Policy, capacity: Sequence[int] | None = None) -> Allocation:
    """Static allocation of every frame-mode tensor (Algorithm 1 step 1, Fig. 13).

    ``capacity``: bytes per buffer (None: unlimited, to measure the requirement).
    """
    # Tiles run in row reuse (isa.validate: windowed groups do).
    modes = tuple(Reuse.ROW if groups[i].part else mode
                  for i, mode in enumerate(policy.group_modes(blocks)))
    capacity = None if capacity is None else tuple(capacity)
    reserved: dict[tuple[int, int], int] = {}
    while True:
        try:
            return _Allocator(graph, groups, program, blocks, modes, capacity, reserved,
                              policy.hold_long_paths).run()
        except _StagingConflict as e:
            # Redo the placement with this staging area held from the start; each retry adds
            # a (group, buffer) pair, so there are at most three per staging group.
            if (e.i, e.buf) in reserved or (capacity is not None
                                             and e.size > capacity[e.buf]):
                raise AllocationError(str(e)) from None
            reserved[(e.i, e.buf)] = e.size


def place(program: Program, groups: Sequence[Group], alloc: Allocation) -> list[Instruction]:
    """The program's instructions with the allocation's reuse modes and locations."""
    out = []
    for i, (grp, instr) in enumerate(zip(groups, program.instructions)):
        changes = dict(grp.locate(alloc.locations), reuse=alloc.modes[i])
        out.append(instr.replace(**changes))
    return with_held_weights(out, program.config)


@lru_cache(maxsize=1 << 16)
def _overflows(instr: Instruction, config: HwConfig, buffers: bool) -> tuple[str, ...]:
    return tuple(overflows(instr, config, buffers=buffers))


def store_overflows(instructions: Sequence[Instruction], groups: Sequence[Group],
                    config: HwConfig, *, buffers: bool = True) -> list[str]:
    """Every placed instruction the controller would stop with ``BUFFER_OVERFLOW`` (e.g.
    frame reuse of a layer one of whose output blocks' weights exceed the weight store), by
    group; memoised, as the candidates of a search share most of their instructions.
    ``buffers=False``: without the buffers {0, 1, 2}, which a budget checks itself."""
    return [f"group {n} ({grp.name}): {problem}"
            for n, (grp, instr) in enumerate(zip(groups, instructions))
            for problem in _overflows(instr, config, buffers)]


def weights_read_again(instructions: Sequence[Instruction],
                       config: HwConfig) -> list["Violation"]:
    """Constraint 10 (weights read from DRAM exactly once) for every placed group: row reuse
    past the weight store streams the weights once per conv output row."""
    return [Violation(WEIGHT_READS, reads, 1, n) for n, instr in enumerate(instructions)
            if (reads := weight_reads(instr, config)) > 1]


def apply_policy(compiled, policy: Policy, blocks: Blocks | None = None) -> Program:
    """A copy of ``compiled.program`` running ``policy``: reuse modes and locations rewritten,
    nothing re-packed (DRAM scratch of tensors now on chip stays allocated, unused).

    The allocation and eqs. 1–5 must fit the configuration's buffers (else
    :class:`AllocationError` lists what does not fit); the result is proven by
    :func:`check_program` and every instruction passes :func:`sfnpu.isa.validate`.
    """
    program = compiled.program
    if blocks is None:
        blocks = detect_blocks(compiled.graph, compiled.groups)
    alloc = allocate(compiled.graph, compiled.groups, program, blocks, policy,
                     program.config.buffer_bytes)
    instructions = place(program, compiled.groups, alloc)
    req = requirements(instructions, program.config, alloc.extents)
    over = dataclasses.replace(Budget.of(program.config), bram18k=None).violations(req)
    over += store_overflows(instructions, compiled.groups, program.config)
    if over:
        raise AllocationError(f"policy {policy.label or policy.modes} does not fit "
                              f"{program.config.name!r}: " + "; ".join(map(str, over)))
    for n, instr in enumerate(instructions):
        try:
            isa.validate(instr)
        except isa.InstructionError as e:
            raise AllocationError(f"instruction {n}: {e}") from None
    check_program(compiled.graph, compiled.groups, instructions, program.config,
                  program.config.buffer_bytes)
    return dataclasses.replace(program, instructions=instructions,
                               locations=dict(alloc.locations))


# --------------------------------------------------------------------------------------------
# Checker
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CheckReport:
    extents: tuple[int, int, int]     # highest byte used per buffer (weights, staging included)
    on_chip_tensors: int
    frame_groups: int


@dataclass
class _Live:
    tensor: str
    buf: int
    lo: int
    hi: int
    until: int        # last group reading it


def _row_operands(instr: Instruction) -> list[tuple[str, Location, tuple[int, int]]]:
    """(role, location, spatial size) of a group's feature-map operands."""
    ops = [("input", instr.input, (instr.in_h, instr.in_w)),
           ("output", instr.output, (instr.out_h, instr.out_w))]
    if eltwise_reads_map(instr.eltwise):
        ops.append(("shortcut", instr.shortcut, layout.conv_output_hw(instr)))
    elif instr.eltwise == Eltwise.CHANNEL_SCALE:
        ops.append(("shortcut", instr.shortcut, (1, 1)))
    return ops


def _stored_at(graph: Graph, views: Mapping[str, tuple[str, int]], tensor: str,
               loc: Location, window: int, lanes: int) -> tuple[str, tuple[MemSpace, int]]:
    """The tensor an operand location addresses, and where that tensor starts: a tile's
    window offset and a view's offset in its source taken off."""
    offset = loc.offset - window
    if tensor in views:
        tensor, start = views[tensor]
        h, w = graph.tensors[tensor].shape[1:]
        offset -= layout.tensor_bytes(start, h, w, lanes)
    return tensor, (loc.space, offset)


def check_program(graph: Graph, groups: Sequence[Group], instructions: Sequence[Instruction],
                  config: HwConfig, capacity: Sequence[int] | None = None) -> CheckReport:
    """Prove that a placed program never loses data; raise :class:`AllocationError` otherwise.

    Walks the groups in order and checks: every read finds the tensor at the location its
    writer used; every instruction passes :func:`sfnpu.isa.validate` (a group's input and
    shortcut in different buffers among its rules: one read port each); a group with
    ``weights_held`` finds its weights in the weight store (the last load was of the same
    weights, whole, or the group before prefetched them); a prefetch fits the store; the
    controller stages an input only where the allocation reserved the area; row-mode groups keep every feature map in DRAM (channel vectors may stay
    on chip); no write, row-mode weight load or input staging overlaps a tensor that is still
    to be read (liveness runs to its last reader, so a group's output may not overlap its own
    operands); on-chip ranges stay inside ``capacity``; network outputs end in DRAM.
    """
    if len(instructions) != len(groups):
        raise AllocationError(f"{len(instructions)} instructions for {len(groups)} groups")
    last_read: dict[str, int] = {}
    for g in groups:
        for t in operands(g):
            last_read[t] = g.index
    home: dict[str, tuple[MemSpace, int]] = {}
    live: list[_Live] = []
    extent = [0, 0, 0]
    on_chip = set()
    lanes = config.lanes
    views = channel_views(graph)

    def fail(i: int, msg: str):
        raise AllocationError(f"group {i} ({groups[i].name}): {msg}")

    def clobber(i: int, buf: int, lo: int, hi: int, what: str, tensor: str | None = None):
        if capacity is not None and hi > capacity[buf]:
            fail(i, f"{what} [{lo:#x}, {hi:#x}) exceeds buffer {buf} ({capacity[buf]:#x} B)")
        extent[buf] = max(extent[buf], hi)
        for v in live:
            if v.buf == buf and v.lo < hi and lo < v.hi and v.until >= i and v.tensor != tensor:
                fail(i, f"{what} [{lo:#x}, {hi:#x}) in buffer {buf} overwrites {v.tensor!r} "
                        f"[{v.lo:#x}, {v.hi:#x}), which group {v.until} still reads")

    held = None
    for i, (grp, instr) in enumerate(zip(groups, instructions)):
        if instr.weights_held and not (held == HeldWeights.of(instr)
                                       and loads_whole_weights(instr, config)):
            fail(i, f"weights_held is set, but the weight store holds "
                    f"{'nothing whole' if held is None else held} instead of this group's "
                    f"weights (DRAM {instr.weights.offset:#x})")
        held = weight_store_after(held, instr, config)
        if instr.prefetch:
            nxt = instructions[i + 1] if i + 1 < len(instructions) else None
            if nxt is None or not prefetch_fits(instr, nxt, config):
                fail(i, "prefetch is set, but " + (
                    "no group follows" if nxt is None else
                    f"the next group's weights are not a normal convolution's that fit the "
                    f"{config.buffer_bytes[1]} B weight store beside this group's"))
            held = HeldWeights.of(nxt)
        if stages_input(instr, config) and staging(instr, config) is None:
            fail(i, f"the controller stages the DRAM input (its weights, "
                    f"{layout.weight_bytes(instr, config)} B, take several chunks of the "
                    f"{config.buffer_bytes[1]} B weight store), but the allocation reserves no "
                    "staging area: it counted on the store holding the whole weights")
        reads = [(grp.input, instr.input, "input", grp.window[0])]
        if grp.shortcut is not None:
            reads.append((grp.shortcut, instr.shortcut, "shortcut", grp.window[2]))
        for t, loc, role, window in reads:
            t, at = _stored_at(graph, views, t, loc, window, lanes)
            if t in graph.inputs and t not in home:
                if loc.space != MemSpace.DRAM:
                    fail(i, f"{role} {t!r} is a network input and lives in DRAM, not "
                            f"{loc.space.name}")
                continue
            if t not in home:
                fail(i, f"{role} {t!r} is read before any group writes it")
            if home[t] != at:
                fail(i, f"{role} {t!r} is read from {loc.space.name}+{at[1]:#x} but was "
                        f"written to {home[t][0].name}+{home[t][1]:#x}")
        try:        # the ISA's rules, one read port per buffer among them
            isa.validate(instr)
        except isa.InstructionError as error:
            fail(i, str(error))
        if instr.reuse == Reuse.ROW:
            for role, loc, hw in _row_operands(instr):
                if _buf(loc) is not None and hw != (1, 1):
                    fail(i, f"row-mode {role} is a {hw[0]}x{hw[1]} feature map on chip; row "
                            "reuse streams feature maps from DRAM (only channel vectors may "
                            "stay on chip, Fig. 13c)")
        for res, what in ((row_weights(instr, config), "row-mode weights"),
                          (staging(instr, config), "staged input")):
            if res is not None:
                loc, nbytes = res
                clobber(i, _buf(loc), loc.offset, loc.offset + nbytes, what)
        t, where = _stored_at(graph, views, grp.written, instr.output, grp.window[1], lanes)
        if t in home and home[t] != where:
            fail(i, f"writes {t!r} to {where[0].name}+{where[1]:#x}, but it already lives at "
                    f"{home[t][0].name}+{home[t][1]:#x}")
        home[t] = where
        b = _buf(instr.output)
        if b is not None:
            if t in graph.outputs:
                fail(i, f"network output {t!r} must be written to DRAM")
            if last_read.get(t, -1) <= i:
                fail(i, f"writes {t!r} on chip, but no later group reads it")
            acc = next(a for a in accesses(instr, config) if a.operand == "output")
            clobber(i, b, acc.start, acc.end, f"output {t!r}", tensor=t)
            full = layout.tensor_bytes(*graph.tensors[t].shape, lanes)
            if not any(v.tensor == t for v in live):
                live.append(_Live(t, b, instr.output.offset, instr.output.offset + full,
                                  last_read[t]))
            on_chip.add(t)
        live = [v for v in live if v.until > i]
    frames = sum(instr.reuse == Reuse.FRAME for instr in instructions)
    return CheckReport(tuple(extent), len(on_chip), frames)


# --------------------------------------------------------------------------------------------
# Buffer requirements (eqs. 1–7)
# --------------------------------------------------------------------------------------------

def bram18k_eq7(nbytes: int, width_bits: int) -> int:
    """Eq. 7: ⌈depth / 1024⌉ · ⌈width / 18⌉ for a memory ``width_bits`` wide."""
    if nbytes <= 0:
        return 0
    depth = ceil(nbytes * 8 / width_bits)
    return ceil(depth / 1024) * ceil(width_bits / 18)


@dataclass(frozen=True)
class Requirements:
    """On-chip memory a placed program needs, in bytes (our layouts: channel-blocked tensors
    padded to ``lanes`` channels, weights padded to To×Ti blocks)."""
    buffers: tuple[int, int, int]     # allocated extents; buffer 1 includes weight_buff (eq. 2)
    algorithm1: tuple[int, int, int]  # Algorithm 1: largest tensor per buffer, offsets ignored
    weight_buff: int                  # eq. 1
    row_buff: int                     # eq. 3
    out_buff: int                     # eq. 4 (32-bit partial sums)
    write_buff: int                   # eq. 5
    drivers: Mapping[str, int]        # requirement → the group that sets it
    lanes: int
    to: int
    #: The feature maps' (and staged inputs') extents in buffers {0, 1, 2}, without the
    #: weights eq. 2 puts in buffer 1 (ours; None for the dense accounting)
    extents: tuple[int, int, int] | None = None

    @property
    def sram(self) -> int:
        """Eq. 6."""
        return sum(self.buffers) + self.row_buff + self.out_buff + self.write_buff

    @property
    def hardware_sram(self) -> int:
        """Eq. 6 as the RTL stores it: the weights in the controller's weight store, apart
        from buffer 1's feature maps (eq. 2 shares buffer 1 between them)."""
        if self.extents is None:
            raise ValueError("the dense accounting has no feature-map extents")
        return (sum(self.extents) + self.weight_buff + self.row_buff + self.out_buff
                + self.write_buff)

    @property
    def sram_algorithm1(self) -> int:
        return sum(self.algorithm1) + self.row_buff + self.out_buff + self.write_buff

    @property
    def bram18k(self) -> int:
        """Eq. 7 summed over the six buffers."""
        fm = [*self.buffers, self.row_buff]
        return (sum(bram18k_eq7(b, 8 * self.lanes) for b in fm)
                + bram18k_eq7(self.out_buff, 32 * self.to)
                + bram18k_eq7(self.write_buff, 8 * self.to))

    def sizes(self) -> dict[str, int]:
        return {"buffer 0": self.buffers[0], "buffer 1": self.buffers[1],
                "buffer 2": self.buffers[2], "row buffer": self.row_buff,
                "partial-sum buffer": self.out_buff, "write buffer": self.write_buff}


def instruction_needs(instr: Instruction, config: HwConfig) -> dict[str, int]:
    """One placed group's terms of eqs. 1, 3, 4 and 5 (bytes) on sfnpu's controller (the
    paper's frame-wide partial-sum and write buffers: :func:`dense_requirements`)."""
    lanes, to = config.lanes, config.to
    row = instr.reuse == Reuse.ROW
    need: dict[str, int] = {}
    if instr.conv != ConvKind.NONE:
        if row:
            need["weight_buff"] = layout.weight_bytes(instr, config)               # eq. 1
        elif weights := frame_weights(instr, config):
            need["weight_buff"] = weights
        need["row_buff"] = (ROW_BUFFER_ROWS * instr.in_w                           # eq. 3
                            * layout.channel_blocks(instr.in_c, lanes) * lanes)
        # Eq. 4 for our controller: it sums the input-channel blocks of one output row at a
        # time in both modes (frame reuse runs whole output-block chunks over the frame), so
        # one row of To partial sums suffices; the paper's frame-wide buffer is in
        # dense_requirements.
        need["out_buff"] = layout.conv_output_hw(instr)[1] * to * PSUM_BYTES        # eq. 4
    if row or instr.output.space == MemSpace.DRAM:
        # Eq. 5 for our controller: its writer drains the write buffer in chunks of a row
        # segment in both modes, so a frame-mode group writing to DRAM needs one row too.
        need["write_buff"] = instr.out_w * to                                      # eq. 5
    return need


def requirements(instructions: Sequence[Instruction], config: HwConfig,
                 extents: Sequence[int] | None = None) -> Requirements:
    """Eqs. 1–7 for a placed program. ``extents``: allocated bytes per buffer (from
    :class:`Allocation`); measured from the instructions when omitted."""
    lanes, to = config.lanes, config.to
    drivers: dict[str, int] = {}
    best: dict[str, int] = {}

    def at_least(name: str, value: int, i: int):
        if value > best.get(name, 0):
            best[name], drivers[name] = value, i

    alg1 = [0, 0, 0]
    for i, instr in enumerate(instructions):
        for name, value in instruction_needs(instr, config).items():
            at_least(name, value, i)
        if instr.reuse == Reuse.ROW:
            continue
        # Algorithm 1 (steps 2–4): the largest tensor each buffer ever holds.
        stage = staging(instr, config)
        in_buf = _buf(stage[0]) if stage else _buf(instr.input)
        if in_buf is not None:
            alg1[in_buf] = max(alg1[in_buf], _input_bytes(instr, config))
        for acc in accesses(instr, config):
            b = _buf(getattr(instr, acc.operand)) if acc.operand in ("output", "shortcut") \
                else None
            if b is not None:
                alg1[b] = max(alg1[b], acc.end - acc.start)
    alg1[WEIGHT_BUFFER] = max(alg1[WEIGHT_BUFFER], best.get("weight_buff", 0))
    if extents is None:
        extents = _extents(instructions, config)
    buffers = list(extents)
    buffers[WEIGHT_BUFFER] = max(buffers[WEIGHT_BUFFER], best.get("weight_buff", 0))
    for b in range(3):
        drivers.setdefault(f"buffer {b}", -1)
    return Requirements(tuple(buffers), tuple(alg1), best.get("weight_buff", 0),
                        best.get("row_buff", 0), best.get("out_buff", 0),
                        best.get("write_buff", 0), drivers, lanes, to,
                        _extents(instructions, config, with_weights=False))


def _extents(instructions: Sequence[Instruction], config: HwConfig,
             with_weights: bool = True) -> tuple[int, int, int]:
    """Bytes used per buffer: feature maps, staged inputs and (``with_weights``) the row-mode
    weights eq. 2 puts in buffer 1 — which the RTL holds in its weight store instead."""
    ext = [0, 0, 0]
    for instr in instructions:
        # A windowed group's operands are all in DRAM (isa.validate).
        for acc in () if instr.windowed else accesses(instr, config):
            b = _buf(getattr(instr, acc.operand))
            if b is not None:
                ext[b] = max(ext[b], acc.end)
        for res in (row_weights(instr, config) if with_weights else None,
                    staging(instr, config)):
            if res is not None:
                ext[_buf(res[0])] = max(ext[_buf(res[0])], res[0].offset + res[1])
    return tuple(ext)


def dense_requirements(instructions: Sequence[Instruction], config: HwConfig) -> Requirements:
    """Eqs. 1–6 and Algorithm 1 as the paper writes them, for comparison with its tables: dense
    C·H·W feature maps and O·I·kh·kw weights (no lane padding), each buffer sized by the
    largest tensor it ever holds (Algorithm 1, offsets ignored), partial sums for frame-mode
    layers only (eq. 4). Buffer assignment, staging and reuse modes are the placed program's."""
    to = config.to
    best: dict[str, int] = {}
    drivers: dict[str, int] = {}

    def at_least(name: str, value: int, i: int):
        if value > best.get(name, 0):
            best[name], drivers[name] = value, i

    alg1 = [0, 0, 0]
    for i, instr in enumerate(instructions):
        row = instr.reuse == Reuse.ROW
        if instr.conv != ConvKind.NONE:
            if row or frame_weights(instr, config):
                at_least("weight_buff", _dense_bytes(instr, "weights"), i)          # eq. 1
            at_least("row_buff", ROW_BUFFER_ROWS * instr.in_w * instr.in_c, i)      # eq. 3
            if not row:
                h, w = layout.conv_output_hw(instr)
                at_least("out_buff", h * w * to * PSUM_BYTES, i)                    # eq. 4
        if row:
            at_least("write_buff", instr.out_w * to, i)                              # eq. 5
            continue
        if instr.output.space == MemSpace.DRAM:
            at_least("write_buff", instr.out_w * instr.out_h * to, i)
        stage = staging(instr, config)
        in_buf = _buf(stage[0]) if stage else _buf(instr.input)
        if in_buf is not None:
            alg1[in_buf] = max(alg1[in_buf], _dense_bytes(instr, "input"))
        for operand in ("output", "shortcut"):
            b = _buf(getattr(instr, operand)) if operand == "output" or \
                instr.eltwise != Eltwise.NONE else None
            if b is not None:
                alg1[b] = max(alg1[b], _dense_bytes(instr, operand))
    alg1[WEIGHT_BUFFER] = max(alg1[WEIGHT_BUFFER], best.get("weight_buff", 0))     # eq. 2
    for b in range(3):
        drivers.setdefault(f"buffer {b}", -1)
    for name in ("weight_buff", "row_buff", "out_buff", "write_buff"):
        drivers.setdefault(name, -1)
    return Requirements(tuple(alg1), tuple(alg1), best.get("weight_buff", 0),
                        best.get("row_buff", 0), best.get("out_buff", 0),
                        best.get("write_buff", 0), drivers, config.lanes, to)


# --------------------------------------------------------------------------------------------
# Budgets
# --------------------------------------------------------------------------------------------

#: The resource of a :class:`Violation` of constraint 10's "weights read once".
WEIGHT_READS = "weight reads"


@dataclass(frozen=True)
class Violation:
    resource: str
    need: int
    have: int
    group: int        # the group that sets the requirement (-1: the allocation as a whole)

    def __str__(self) -> str:
        unit = {"BRAM18K": "BRAM18K", WEIGHT_READS: "passes over the weights"}.get(
            self.resource, "B")
        who = f" (group {self.group})" if self.group >= 0 else ""
        return f"{self.resource} needs {self.need} {unit}{who} > {self.have} {unit}"


@dataclass(frozen=True)
class Budget:
    """On-chip memory available; None means unlimited."""
    buffers: tuple[int, int, int] | None
    row_buff: int | None
    out_buff: int | None
    write_buff: int | None
    bram18k: int | None

    @staticmethod
    def of(config: HwConfig) -> "Budget":
        """The configuration's buffers and its FPGA's block RAMs."""
        bram = DEVICES[config.device].bram18k if config.device else None
        return Budget(tuple(config.buffer_bytes), config.row_buffer_bytes,
                      config.psum_buffer_bytes, config.write_buffer_bytes, bram)

    @staticmethod
    def unlimited(bram18k: int | None = None) -> "Budget":
        return Budget(None, None, None, None, bram18k)

    def violations(self, req: Requirements) -> list[Violation]:
        found = []
        if self.buffers is not None:
            for b in range(3):
                if req.buffers[b] > self.buffers[b]:
                    g = req.drivers["weight_buff"] if b == WEIGHT_BUFFER and \
                        req.buffers[b] == req.weight_buff else -1
                    found.append(Violation(f"buffer {b}", req.buffers[b], self.buffers[b], g))
        for name in ("row_buff", "out_buff", "write_buff"):
            have = getattr(self, name)
            if have is not None and getattr(req, name) > have:
                found.append(Violation(name, getattr(req, name), have, req.drivers[name]))
        if self.bram18k is not None and req.bram18k > self.bram18k:
            found.append(Violation("BRAM18K", req.bram18k, self.bram18k, -1))
        return found


# --------------------------------------------------------------------------------------------
# DRAM traffic (eqs. 8–9 and exact bytes)
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GroupTraffic:
    """DRAM bytes one group moves, from its instruction's locations (each access once).

    ``fm_dense``/``weights_dense``: the same accesses counted with dense C·H·W feature maps and
    unpadded O·I·kh·kw weights (the paper's byte counts), for side-by-side comparison.
    """
    fm_read: int
    fm_write: int
    weights: int
    params: int
    fm_dense: int = 0
    weights_dense: int = 0

    @property
    def total(self) -> int:
        return self.fm_read + self.fm_write + self.weights + self.params


@dataclass(frozen=True)
class Traffic:
    groups: tuple[GroupTraffic, ...]
    eq8_fm: int           # paper eq. 8 (feature maps), our tensor layouts
    eq8_fm_dense: int     # eq. 8 with dense C·H·W bytes (no lane padding), as in the paper

    @property
    def fm(self) -> int:
        return sum(g.fm_read + g.fm_write for g in self.groups)

    @property
    def weights(self) -> int:
        return sum(g.weights for g in self.groups)

    @property
    def fm_dense(self) -> int:
        """Feature-map bytes of the same accesses, dense C·H·W (no lane padding)."""
        return sum(g.fm_dense for g in self.groups)

    @property
    def weights_dense(self) -> int:
        return sum(g.weights_dense for g in self.groups)

    @property
    def params(self) -> int:
        return sum(g.params for g in self.groups)

    @property
    def total(self) -> int:
        return self.fm + self.weights + self.params

    @property
    def eq9(self) -> int:
        """Eq. 9: eq. 8 plus every weight once."""
        return self.eq8_fm + self.weights


def traffic(instructions: Sequence[Instruction], config: HwConfig,
            groups: Sequence[Group] | None = None, graph: Graph | None = None) -> Traffic:
    """Exact DRAM bytes per group, plus eq. 8 (``groups``/``graph`` give the concat parts and
    the dense sizes; without them the dense figure is 0). A group's bytes are the ones that
    cross the bus while it runs: a prefetching group's include the next group's weights.
    A tile (a windowed group) moves its windows' bytes, halo columns included: the whole
    tensors' pitches change its addresses, not its sizes."""
    per = []
    eq8 = eq8_dense = 0
    for i, instr in enumerate(instructions):
        got = {"input": 0, "shortcut": 0, "output": 0, "weights": 0, "params": 0}
        dense = dict.fromkeys(got, 0)
        own = layout.Geometry.dense(instr, config.lanes) if instr.windowed else None
        for acc in accesses(instr, config, own):
            if acc.space == MemSpace.DRAM:
                # A row-mode layer past the weight store streams its weights once per row.
                times = weight_reads(instr, config) if acc.operand == "weights" else 1
                got[acc.operand] += times * (acc.end - acc.start)
                dense[acc.operand] += times * _dense_bytes(instr, acc.operand)
        if instr.prefetch:
            # The next group's weights cross the bus while this group computes.
            nxt = instructions[i + 1]
            got["weights"] += layout.weight_bytes(nxt, config)
            dense["weights"] += _dense_bytes(nxt, "weights")
        per.append(GroupTraffic(got["input"] + got["shortcut"], got["output"],
                                got["weights"], got["params"],
                                dense["input"] + dense["shortcut"] + dense["output"],
                                dense["weights"]))
        a, d = _eq8_terms(instr, config, None if groups is None else groups[i], graph)
        eq8 += a
        eq8_dense += d
    return Traffic(tuple(per), eq8, eq8_dense)


def _dense_bytes(instr: Instruction, operand: str) -> int:
    """Dense bytes of one operand: C·H·W feature maps, O·I·kh·kw weights (no padding)."""
    if operand == "input":
        return instr.in_c * instr.in_h * instr.in_w
    if operand == "output":
        return instr.out_c * instr.out_h * instr.out_w
    if operand == "shortcut":
        if instr.eltwise == Eltwise.CHANNEL_SCALE:
            return instr.out_c
        h, w = layout.conv_output_hw(instr)
        return instr.out_c * h * w
    if operand == "weights":
        shape = layout.weight_shape(instr)
        return 0 if not shape else shape[0] * shape[1] * shape[2] * shape[3]
    return 0


def _eq8_terms(instr: Instruction, config: HwConfig, grp: Group | None,
               graph: Graph | None) -> tuple[int, int]:
    """One group's eq. 8 terms (layout bytes, dense bytes)."""
    lanes = config.lanes

    def both(c, h, w):
        return layout.tensor_bytes(c, h, w, lanes), c * h * w

    terms = []
    if instr.reuse == Reuse.ROW:
        if instr.conv != ConvKind.NONE:
            terms += [both(instr.in_c, instr.in_h, instr.in_w),
                      both(instr.out_c, instr.out_h, instr.out_w)]
        if eltwise_reads_map(instr.eltwise):
            terms.append(both(instr.out_c, *layout.conv_output_hw(instr)))
    elif grp is not None and grp.dest is not None:
        c, h, w = instr.out_c, instr.out_h, instr.out_w
        terms += [both(c, h, w)] * 2       # a route part: written once, read once
    return sum(t[0] for t in terms), sum(t[1] for t in terms)
