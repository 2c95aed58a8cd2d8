"""Block detection for block-wise data reuse (ShortcutFusion Sec. IV, Fig. 10–15).

A *block* is the unit the reuse policy switches on: a residual block (from the block's input to
the group whose element-wise add closes the shortcut — basic, bottleneck, MBConv with or without
squeeze-and-excitation) or a single group that belongs to no residual block. Every group of a
block runs with the same weight-reuse mode.

Blocks are found on the group graph, not on the group order alone: the compiler's group order
may interleave independent branches (a lateral FPN convolution in the middle of a backbone
block), so a block is a *set* of groups, ordered by its first group. A residual block is
accepted only when it is closed: its groups read nothing but the block input and each other's
results, nothing inside it escapes except the add's output, and it contains no other residual
add.

The *segments* (Fig. 11, 12) split the block order where the feature-map scale turns; each
segment gets one cut-point. Their number is the number of monotone scale runs along the most
winding path from the input to an output (channel vectors ignored): one for a classifier or
YOLOv2, two for an FPN or encoder–decoder (YOLOv3, RetinaNet), three for PANet, 2r + 1 for r
repeated BiFPN layers. The boundaries follow the paper's *network cut* (Fig. 14), generalised:
a falling segment runs to the first block that reaches the smallest scale still to come and ends
before the next larger block; a rising segment runs to the first block at the largest scale
still to come and ends before the next smaller one. Networks whose outputs are no larger than
their smallest feature map have a single segment.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

from .groups import Group
from .ir import Graph, channel_views

__all__ = ["BlockKind", "Block", "Blocks", "GroupGraph", "detect_blocks", "BlockError"]


class BlockError(ValueError):
    """Block detection found an inconsistent group list; names the group."""


class BlockKind(enum.Enum):
    RESIDUAL = "residual"
    SINGLE = "single"


@dataclass(frozen=True)
class GroupGraph:
    """Dataflow between groups: who writes and who reads each tensor, transitive ancestors.

    ``ancestors[g]`` is a bit set (bit ``k`` = group ``k``) of every group ``g`` depends on.
    """
    groups: tuple[Group, ...]
    writers: dict[str, tuple[int, ...]]       # tensor → groups writing it (concat: several)
    readers: dict[str, tuple[int, ...]]       # tensor → groups reading it (input or shortcut;
                                              # a channel view's readers read its source)
    ancestors: tuple[int, ...]
    graph_inputs: frozenset[str]
    graph_outputs: frozenset[str]

    @staticmethod
    def build(graph: Graph, groups: Sequence[Group]) -> "GroupGraph":
        writers: dict[str, list[int]] = {}
        readers: dict[str, list[int]] = {}
        ancestors: list[int] = []
        views = channel_views(graph)
        for g in groups:
            if g.index != len(ancestors):
                raise BlockError(f"group {g.name!r} has index {g.index}, expected "
                                 f"{len(ancestors)}: groups must be numbered in order")
            anc = 0
            for name in operands(g):
                name = views.get(name, (name,))[0]
                readers.setdefault(name, []).append(g.index)
                for w in writers.get(name, ()):
                    anc |= (1 << w) | ancestors[w]
                if name not in writers and name not in graph.inputs:
                    raise BlockError(f"group {g.index} ({g.name}) reads {name!r} before any "
                                     "group writes it")
            writers.setdefault(g.written, []).append(g.index)
            ancestors.append(anc)
        return GroupGraph(tuple(groups), {k: tuple(v) for k, v in writers.items()},
                          {k: tuple(v) for k, v in readers.items()}, tuple(ancestors),
                          frozenset(graph.inputs), frozenset(graph.outputs))

    def producer(self, tensor: str) -> int:
        """The group writing ``tensor`` last (-1 for a graph input)."""
        w = self.writers.get(tensor)
        return w[-1] if w else -1

    def is_ancestor(self, a: int, b: int) -> bool:
        """Whether group ``b`` depends on group ``a``."""
        return a >= 0 and bool(self.ancestors[b] >> a & 1)


def operands(group: Group) -> tuple[str, ...]:
    """Tensors a group reads: its input and, if any, its shortcut operand."""
    return (group.input,) if group.shortcut is None else (group.input, group.shortcut)


@dataclass(frozen=True)
class Block:
    index: int
    kind: BlockKind
    groups: tuple[int, ...]      # ascending group indices (not necessarily contiguous)
    entry: str                   # the block input (for a single group: its input)
    exit: str                    # the tensor the block hands on (the add's output)
    scale: tuple[int, int]       # (H, W) of ``exit``
    vector: bool                 # works on channel vectors (global pooling, SE FCs, classifier)
    squeeze_excite: bool         # contains a channel scale (Fig. 13 c–d)
    name: str

    @property
    def first(self) -> int:
        return self.groups[0]

    @property
    def last(self) -> int:
        return self.groups[-1]


@dataclass(frozen=True)
class Blocks:
    blocks: tuple[Block, ...]
    block_of: tuple[int, ...]    # group index → block index
    bounds: tuple[int, ...]      # segment boundaries: the block index where each new one starts
    graph: GroupGraph

    def __len__(self) -> int:
        return len(self.blocks)

    def __iter__(self):
        return iter(self.blocks)

    def __getitem__(self, i: int) -> Block:
        return self.blocks[i]

    @property
    def residual(self) -> tuple[Block, ...]:
        return tuple(b for b in self.blocks if b.kind == BlockKind.RESIDUAL)

    @property
    def cut(self) -> int | None:
        """The network cut (Fig. 14): blocks[:cut] run down to the smallest scale; None when
        the network has a single segment."""
        return self.bounds[0] if self.bounds else None

    @property
    def segments(self) -> tuple[int, ...]:
        """Block counts of the sub-networks that each get one cut-point (Fig. 11, 12, 15)."""
        edges = (0, *self.bounds, len(self.blocks))
        return tuple(b - a for a, b in zip(edges, edges[1:]))

    def summary(self) -> str:
        kinds = {k: sum(b.kind == k for b in self.blocks) for k in BlockKind}
        se = sum(b.squeeze_excite for b in self.residual)
        cut = "none (single cut-point)" if not self.bounds else \
            ", ".join(f"before block {b} ({self.blocks[b].name})" for b in self.bounds)
        return (f"{len(self.blocks)} blocks ({kinds[BlockKind.RESIDUAL]} residual"
                f"{f', {se} with SE' if se else ''}, {kinds[BlockKind.SINGLE]} single) over "
                f"{len(self.graph.groups)} groups; {len(self.segments)} segment(s), "
                f"boundaries: {cut}")


# --------------------------------------------------------------------------------------------
# Residual blocks
# --------------------------------------------------------------------------------------------

def _has_op(group: Group, op: str) -> bool:
    return any(n.op == op for n in group.nodes)


def _closed_members(gg: GroupGraph, entry: str, add: int) -> tuple[int, ...] | None:
    """The groups from ``entry`` to the add group, if they form a closed block."""
    start = gg.producer(entry)
    members: list[int] = []
    inside: set[int] = set()
    for g in range(start + 1, add + 1):
        grp = gg.groups[g]
        fed = any(t == entry or gg.producer(t) in inside for t in operands(grp))
        if fed and (g == add or gg.is_ancestor(g, add)):
            members.append(g)
            inside.add(g)
    if not members or members[-1] != add:
        return None
    produced = {gg.groups[m].written for m in members}
    for m in members:
        grp = gg.groups[m]
        if any(t != entry and t not in produced for t in operands(grp)):
            return None          # reads something from outside the block
        if m == add:
            continue
        if grp.dest is not None or grp.written in gg.graph_outputs:
            return None          # part of a concat or a network output: escapes
        if any(r not in inside for r in gg.readers.get(grp.written, ())):
            return None          # an inner result is used after the block
        if _has_op(grp, "add"):
            return None          # nested residual: the inner add is its own block
    return tuple(members)


def _residual_members(gg: GroupGraph, add: int) -> tuple[str, tuple[int, ...]] | None:
    """(block input, member groups) of the residual block closed by group ``add``."""
    grp = gg.groups[add]
    a, b = gg.producer(grp.input), gg.producer(grp.shortcut)
    # Candidate entries: tensors both operands depend on (or are), latest producer first.
    cands = set()
    for t, writers in gg.writers.items():
        p = writers[-1]
        if len(writers) != 1:
            continue
        on_a = a >= 0 and (p == a or gg.is_ancestor(p, a))
        on_b = b >= 0 and (p == b or gg.is_ancestor(p, b))
        if on_a and on_b:
            cands.add((p, t))
    for t in gg.graph_inputs:
        cands.add((-1, t))
    for _, entry in sorted(cands, reverse=True):
        members = _closed_members(gg, entry, add)
        if members is not None and len(members) > 1:
            return entry, members
    return None


# --------------------------------------------------------------------------------------------
# Detection
# --------------------------------------------------------------------------------------------

def _is_vector(graph: Graph, gg: GroupGraph, members: Sequence[int]) -> bool:
    """Whether a block hands on a channel vector made by global pooling or from one (GAP,
    squeeze-and-excitation FCs, the classifier) rather than a feature map."""
    last = gg.groups[members[-1]]
    if graph.tensors[last.written].shape[1:] != (1, 1):
        return False
    return any(_has_op(gg.groups[m], "globalavgpool")
               or graph.tensors[gg.groups[m].input].shape[1:] == (1, 1) for m in members)


def _make_block(graph: Graph, gg: GroupGraph, kind: BlockKind, members: tuple[int, ...],
                entry: str) -> Block:
    last = gg.groups[members[-1]]
    exit_ = last.written
    return Block(index=-1, kind=kind, groups=members, entry=entry, exit=exit_,
                 scale=tuple(graph.tensors[exit_].shape[1:]),
                 vector=_is_vector(graph, gg, members),
                 squeeze_excite=any(_has_op(gg.groups[m], "mul") for m in members),
                 name=gg.groups[members[0]].name if kind == BlockKind.SINGLE else
                 f"{gg.groups[members[0]].name}..{last.name}")


def _area(block: Block) -> int:
    return block.scale[0] * block.scale[1]


def scale_runs(gg: GroupGraph, blocks: Sequence[Block], block_of: Sequence[int],
               input_area: int) -> int:
    """Monotone scale runs along the most winding input-to-output path of the block graph.

    A path starts falling at the input's scale; every reversal (a larger block while falling,
    a smaller one while rising) starts a new run. Channel-vector blocks are transparent.
    """
    preds: list[set[int]] = [set() for _ in blocks]
    for b in blocks:
        for g in b.groups:
            for t in operands(gg.groups[g]):
                for w in gg.writers.get(t, ()):
                    if block_of[w] != b.index:
                        preds[b.index].add(block_of[w])
    # state: (falling, last area) → runs; blocks in order of their last group (topological:
    # a block reads another's exit only after that block's last group).
    states: list[dict[tuple[bool, int], int]] = [{} for _ in blocks]
    best = 1
    for b in sorted(blocks, key=lambda x: x.last):
        incoming: dict[tuple[bool, int], int] = {}
        sources = [states[p] for p in preds[b.index]] or [{(True, input_area): 1}]
        for src in sources:
            for key, runs in src.items():
                incoming[key] = max(incoming.get(key, 0), runs)
        if b.vector:
            states[b.index] = incoming
            continue
        area = _area(b)
        out: dict[tuple[bool, int], int] = {}
        for (falling, last), runs in incoming.items():
            turn = area > last if falling else area < last
            key = (falling != turn, area)
            out[key] = max(out.get(key, 0), runs + turn)
        states[b.index] = out
        best = max(best, *out.values())
    return best


def _segment_bounds(graph: Graph, gg: GroupGraph, blocks: Sequence[Block],
                    block_of: Sequence[int]) -> tuple[int, ...]:
    """Segment boundaries (block indices), see the module documentation."""
    maps = [(i, _area(b)) for i, b in enumerate(blocks) if not b.vector]
    if not maps:
        return ()
    largest_output = max(graph.tensors[t].shape[1] * graph.tensors[t].shape[2]
                         for t in graph.outputs)
    if largest_output <= min(a for _, a in maps):
        return ()
    inp = next(iter(graph.inputs))
    runs = scale_runs(gg, blocks, block_of,
                      graph.tensors[inp].shape[1] * graph.tensors[inp].shape[2])
    bounds: list[int] = []
    start = 0
    for j in range(runs - 1):
        falling = j % 2 == 0
        rest = [(i, a) for i, a in maps if i >= start]
        target = (min if falling else max)(a for _, a in rest)
        first = next(i for i, a in rest if a == target)
        nxt = next((i for i, a in rest
                    if i > first and (a > target if falling else a < target)), None)
        if nxt is None:
            break
        bounds.append(nxt)
        start = nxt
    return tuple(bounds)


def detect_blocks(graph: Graph, groups: Sequence[Group]) -> Blocks:
    """Residual blocks, single-group blocks and the network cut of a compiled group list."""
    gg = GroupGraph.build(graph, groups)
    claimed: dict[int, int] = {}
    found: list[Block] = []
    for grp in groups:
        if not _has_op(grp, "add") or grp.shortcut is None:
            continue
        res = _residual_members(gg, grp.index)
        if res is None:
            continue
        entry, members = res
        if any(m in claimed for m in members):
            continue
        for m in members:
            claimed[m] = len(found)
        found.append(_make_block(graph, gg, BlockKind.RESIDUAL, members, entry))
    for grp in groups:
        if grp.index not in claimed:
            found.append(_make_block(graph, gg, BlockKind.SINGLE, (grp.index,), grp.input))
    found.sort(key=lambda b: b.first)
    blocks = tuple(Block(i, b.kind, b.groups, b.entry, b.exit, b.scale, b.vector,
                         b.squeeze_excite, b.name) for i, b in enumerate(found))
    block_of = [0] * len(groups)
    for b in blocks:
        for m in b.groups:
            block_of[m] = b.index
    return Blocks(blocks, tuple(block_of), _segment_bounds(graph, gg, blocks, block_of), gg)
