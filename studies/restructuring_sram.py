"""Spatial splitting for the memory optimizer: Table II's minimum SRAM when the front of a network
runs tile by tile instead of streaming whole maps from DRAM.

The minimum SRAM of ShortcutFusion's Table II balances row reuse (weights on chip, maps streamed
from DRAM) before the cut-point against frame reuse (maps on chip) after it: large early maps
cannot stay on chip, so the layers that hold them run in row mode, and the largest row-mode
weights set buffer 1. Splitting the first ``j`` nodes into ``n_h × n_w`` spatial tiles
(:func:`.restructure.split`) shrinks those maps, so their groups can run in frame mode on tile-sized
buffers, and the row-mode weights that remain are smaller.

The restructured network runs as **one program** (:func:`one_program`,
:func:`.restructure.one_graph`): every copy of the front is a group of its own; a copy reads its
window of a fork — or of a map its branch computed larger, as a residual's identity path does —
in place, and writes its tile straight into the join tensor (windowed instructions: the operands'
row and channel-block pitches in the parameter block's window record). The branches run one
after another, so only one branch's own maps are alive at a time; those are ordinary tensors the
unmodified optimizer (:func:`.networks.minimum_sram`) may keep on chip, while the windowed groups
run in row reuse with their operands in DRAM. Halo rows are read by several tiles and the front's
weights once per tile, which constraint (10) of the paper forbids; the report shows that price
beside the saving.

For comparison the same split also runs as a sequence of *pieces* (:func:`piece_graphs`), each
an ordinary IR graph with its own minimum-SRAM policy, meeting in DRAM: the SRAM the sequence
needs is the largest piece's, its DRAM traffic the sum of theirs. Pieces may run a tile's first
layer in frame reuse, which a windowed group cannot; the one program is what the accelerator
executes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Mapping, Sequence

from sfnpu.compiler.blocks import detect_blocks
from sfnpu.compiler.codegen import generate
from sfnpu.compiler.groups import fuse
from sfnpu.compiler.importer import import_model
from sfnpu.compiler.ir import Graph, Node, Tensor, check
from sfnpu.compiler.passes import on_lane_blocks, run_passes
from sfnpu.compiler.restructure import (Region, Restructured, RestructureError, block_order,
                                        hardware_pads, one_graph, split, splittable)
from sfnpu.config import HwConfig, get_config

from .networks import minimum_sram, study_model

__all__ = ["Piece", "piece_graphs", "PiecesResult", "evaluate_pieces", "one_program",
           "evaluate_one_program", "front_split",
           "FrontSweep", "sweep_front", "sweep_front_graph", "TABLE_II_SPLIT_STUDIES"]

#: Table II rows the front split is studied on: (builder, input size, VGG-CONV only).
TABLE_II_SPLIT_STUDIES = (("vgg16", 224, True), ("yolov2", 416, False))


@dataclass(frozen=True)
class Piece:
    """One program of the sequence. ``windows``: each input → (stored map, the window of its
    IR tensor it reads); ``regions``: each output → the window of its IR tensor it holds;
    ``assemble``: join tensors put together from tiles after this piece."""
    name: str
    graph: Graph
    windows: Mapping[str, tuple[str, Region]]
    regions: Mapping[str, Region]
    assemble: tuple[tuple[str, tuple[tuple[str, Region], ...]], ...] = ()


class _Pieces:
    """Accumulates pieces; tensors cross pieces through DRAM, read whole or as a window."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.pieces: list[tuple] = []
        self.assembles: dict[int, list] = {}      # piece number → joins assembled after it
        whole = {t: Region.whole(graph.tensors[t].shape) for t in graph.inputs}
        self.stored: dict[str, tuple[str, Region]] = {t: (t, r) for t, r in whole.items()}
        self.source: dict[str, str] = {t: t for t in graph.inputs}   # key → IR tensor
        self.open("network")

    def open(self, name: str):
        self.name, self.nodes, self.tensors = name, [], {}
        self.windows: dict[str, tuple[str, Region]] = {}
        self.made: dict[str, Region] = {}                 # key → region, this piece

    def close(self, then: str = "network"):
        if self.nodes:
            for key, region in self.made.items():
                self.stored[key] = (self.source[key], region)
            self.pieces.append((self.name, self.nodes, self.tensors, self.windows, self.made))
        self.open(then)

    def read(self, key: str, need: Region) -> str:
        """The piece-local name of ``need`` of stored tensor ``key``."""
        if key in self.made:
            if self.made[key] == need:
                return key
            self.close(then=self.name + "'")      # a window of a map made here: cut
        if key not in self.stored:
            raise RestructureError(f"piece {self.name}: {key!r} is read before it is made")
        tensor, region = self.stored[key]
        local = key if region == need else \
            f"{key}[{need.r0}:{need.r1},{need.c0}:{need.c1}]"
        if local not in self.tensors:
            t = self.graph.tensors[tensor]
            self.tensors[local] = Tensor(local, (t.shape[0], *need.hw), t.qtype)
            self.windows[local] = (key, need)
        return local

    def add(self, node: Node, key: str, inputs: Sequence[str], region: Region, pads=None):
        t = self.graph.tensors[node.output]
        attrs = dict(node.attrs)
        if pads is not None:
            attrs["pads"] = hardware_pads(node, pads)
        self.nodes.append(node.replace(inputs=tuple(inputs), output=key, attrs=attrs))
        self.tensors[key] = Tensor(key, (t.shape[0], *region.hw), t.qtype)
        self.made[key] = region
        self.source[key] = node.output


def piece_graphs(r: Restructured) -> list[Piece]:
    """The restructured network as pieces in execution order (see the module documentation)."""
    graph = r.graph
    p = _Pieces(graph)
    for i in block_order(graph, [frozenset(b.critical) for b in r.blocks]):
        if i >= 0:
            node = graph.nodes[i]
            ins = [p.read(t, Region.whole(graph.tensors[t].shape)) for t in node.inputs]
            p.add(node, node.output, ins, Region.whole(graph.tensors[node.output].shape))
            continue
        blk = r.blocks[-1 - i]
        for b, copies in enumerate(blk.branches):
            p.close(then=f"tile {b}")
            for sn in copies:
                ins = [p.read(t if t in blk.forks else f"{t}@{b}", need)
                       for t, need in zip(sn.node.inputs, sn.inputs)]
                p.add(sn.node, f"{sn.node.output}@{b}", ins, sn.region, sn.pads)
        p.close()
        p.assembles[len(p.pieces) - 1] = [
            (t, tuple((f"{t}@{b}", tiles[t]) for b, tiles in enumerate(blk.tiles)
                      if not tiles[t].empty)) for t in blk.joins]
        for t in blk.joins:                       # the tiles assembled in DRAM
            p.stored[t] = (t, Region.whole(graph.tensors[t].shape))
            p.source[t] = t
    p.close()
    joins = {t for b in r.blocks for t in b.joins}
    read_later: set[str] = set()
    out: list[Piece] = []
    for k in reversed(range(len(p.pieces))):
        name, nodes, tensors, windows, made = p.pieces[k]
        # kept: what later pieces read, the network's outputs and every tile of a join
        keep = [n.output for n in nodes if n.output in read_later
                or p.source[n.output] in graph.outputs or p.source[n.output] in joins]
        read_later.update(key for key, _ in windows.values())
        g = check(Graph(tensors, tuple(nodes), tuple(windows), tuple(keep or [nodes[-1].output])))
        out.append(Piece(name, g, dict(windows), {t: made[t] for t in g.outputs},
                         tuple(p.assembles.get(k, ()))))
    out.reverse()
    return out


@dataclass(frozen=True)
class PiecesResult:
    sram: int                      # eq. 6, the largest piece's minimum
    traffic: int                   # DRAM bytes of every piece's chosen policy
    per_piece: tuple[tuple[str, int, int, str], ...]   # (name, sram, traffic, policy)
    seconds: float

    @property
    def driver(self) -> str:
        return max(self.per_piece, key=lambda x: x[1])[0]


def _compiled(graph: Graph, config: HwConfig, share_weights: bool = True):
    graph, _ = on_lane_blocks(graph, config)
    program = generate(graph, fuse(graph, share_weights), config)
    return SimpleNamespace(graph=graph, groups=program.groups, program=program)


def one_program(r: Restructured, config: HwConfig) -> SimpleNamespace:
    """The restructured network compiled as one program (:func:`.restructure.one_graph`):
    the branches run one after another, their groups reading windows of the forks and writing
    their tiles of the joins in place (windowed instructions, in DRAM); the copies' own maps
    are ordinary tensors the optimizer may keep on chip."""
    return _compiled(one_graph(r), config, share_weights=False)


def evaluate_one_program(r: Restructured, config: HwConfig) -> PiecesResult:
    """:func:`one_program` given its minimum-SRAM policy by the unmodified optimizer, with one
    cut-point (row reuse before it, frame reuse after): the branches' maps rise back to the
    joins' size, which the block detector would take for a network cut and search in
    O(N²) candidates."""
    t0 = time.perf_counter()
    compiled = one_program(r, config)
    blocks = detect_blocks(compiled.graph, compiled.groups)
    best = minimum_sram(compiled, blocks, segments=(len(blocks),)).best
    return PiecesResult(best.sram, best.traffic.total,
                        (("program", best.sram, best.traffic.total, best.policy.label),),
                        time.perf_counter() - t0)


def evaluate_pieces(pieces: Sequence[Piece], config: HwConfig) -> PiecesResult:
    """Each piece compiled and given its minimum-SRAM policy by the unmodified optimizer."""
    t0 = time.perf_counter()
    rows = []
    for piece in pieces:
        best = minimum_sram(_compiled(piece.graph, config)).best
        rows.append((piece.name, best.sram, best.traffic.total, best.policy.label))
    return PiecesResult(max(r[1] for r in rows), sum(r[2] for r in rows), tuple(rows),
                        time.perf_counter() - t0)


def front_split(graph: Graph, upto: int, n_slices: tuple[int, int]) -> Restructured:
    """Split nodes ``0..upto`` (every one of them splittable on the accelerator)."""
    for k in range(upto + 1):
        if not splittable(graph, graph.nodes[k], hardware=True):
            n = graph.nodes[k]
            raise RestructureError(f"node {k} {n.name!r} ({n.op}) cannot be split on the "
                                   "accelerator; the front ends before it")
    return split(graph, range(upto + 1), n_slices)


@dataclass
class FrontSweep:
    network: str
    input_size: int
    whole: PiecesResult                       # the unsplit network (Table II as reported)
    #: (upto, n_slices, the split network as one program); the program is what runs
    points: list[tuple[int, tuple[int, int], PiecesResult]]
    node_names: tuple[str, ...]
    seconds: float
    #: The same splits run as pieces, each optimized on its own (meeting in DRAM), by point.
    pieces: list[PiecesResult] = field(default_factory=list)

    def best(self) -> tuple[int, tuple[int, int], PiecesResult]:
        return min(self.points, key=lambda p: (p[2].sram, p[2].traffic))


def _front_ends(graph: Graph) -> list[int]:
    """Candidate last nodes of the front: every node up to the first one that cannot be split,
    whose output is read only by the next node or by nothing past it (a clean cut)."""
    ends = []
    for k, node in enumerate(graph.nodes):
        if not splittable(graph, node, hardware=True):
            break
        later = {t for n in graph.nodes[k + 1:] for t in n.inputs}
        made = {n.output for n in graph.nodes[:k + 1]}
        if len(later & made) == 1:
            ends.append(k)
    return ends


def sweep_front(network: str, input_size: int, conv_only: bool, cache: Path,
                config: HwConfig | str = "kcu1500",
                slices: Sequence[tuple[int, int]] = ((1, 1), (2, 2), (4, 4)),
                progress=None) -> FrontSweep:
    """Table II's minimum SRAM for every front end × ``slices`` (``(1, 1)``: the same pieces
    without tiling, separating the effect of cutting the program from that of splitting)."""
    path = study_model(SimpleNamespace(network=network, input_size=input_size,
                                       conv_only=conv_only), cache)
    graph, _ = run_passes(import_model(path).graph)
    return sweep_front_graph(graph, network + ("_conv" if conv_only else ""), input_size,
                             config, slices, progress)


def sweep_front_graph(graph: Graph, network: str, input_size: int,
                      config: HwConfig | str = "kcu1500",
                      slices: Sequence[tuple[int, int]] = ((1, 1), (2, 2), (4, 4)),
                      progress=None) -> FrontSweep:
    """:func:`sweep_front` of an IR graph."""
    t0 = time.perf_counter()
    config = get_config(config) if isinstance(config, str) else config
    whole = evaluate_pieces([Piece("network", graph, {}, {})], config)
    ends = _front_ends(graph)
    task = None if progress is None else progress.add_task(
        f"{network}@{input_size}: SRAM with split fronts", total=len(ends) * len(slices))
    points, pieces = [], []
    for upto in ends:
        for n in slices:
            r = front_split(graph, upto, n)
            points.append((upto, n, evaluate_one_program(r, config)))
            pieces.append(evaluate_pieces(piece_graphs(r), config))
            if progress is not None:
                progress.advance(task)
    return FrontSweep(network, input_size, whole, points,
                      tuple(n.name for n in graph.nodes), time.perf_counter() - t0, pieces)
