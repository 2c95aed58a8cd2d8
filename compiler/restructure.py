"""Dataflow restructuring for peak activation memory (Cipolletta & Calimera, seeds/002).

A schedule of the IR graph (its node order) keeps a set of feature maps alive at every step;
their total is the step's working memory and the largest total is the *peak* a memory pool must
hold (:func:`memory_profile`). The restructuring lowers the peak in three steps:

1. **criticality** — each node is labelled with the working memory of its own step;
2. **explore** (:func:`explore`) — the nodes at the peak seed a *critical set*, which grows over
   producers, then consumers, of its frontier while their criticality is at least ``α · peak``
   (a small α takes a large sub-graph); the set is closed so that no path leaves and re-enters it;
3. **split** (:func:`split`) — every tensor leaving the set (a *join*) is cut into
   ``n_h × n_w`` spatial tiles; for each tile a *branch* copies the set's nodes, and the region
   each copy computes is propagated backwards from the tiles through the operators' windows: a
   stencil (convolution, pooling) needs its receptive field — the *halo* — and its padding
   becomes asymmetric at interior edges. Branches run one after another, each reading its
   window of the set's inputs (*forks*) in place and writing its tiles straight into the join
   tensors (the spatial concatenation), so one branch's intermediate maps are alive at a time.

The new schedule runs the branches as one block placed where the set stood (a stable topological
order), and :class:`Restructured` carries the peak, the operation count (the halos are computed
by several branches) and the profile before and after. Equivalence with the original graph is
checked on the golden model by :mod:`sfnpu.studies.restructuring_check`.

Modelling choices (the paper leaves them open): fork windows are read in place and join tiles
written in place — the accelerator addresses rows by offset and concatenates by writing at an
offset — instead of copying through split and concat operators; a tensor is one byte per value;
a tensor is alive from the step that writes it to the last step that reads it, graph inputs
from the first step and graph outputs to the last.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from math import prod
from typing import Mapping, Sequence

from .ir import Graph, IRError, Node, Tensor, check

__all__ = [
    "RestructureError", "Region", "Profile", "SliceNode", "Restructured", "SPLITTABLE_OPS",
    "memory_profile", "liveness", "node_ops", "graph_ops", "splittable", "explore", "split",
    "split_blocks", "SplitBlock", "block_order", "hardware_pads",
    "restructure", "one_graph",
]


class RestructureError(IRError):
    """A restructuring that cannot be made; names the node or parameter."""


#: Operators whose output rows/columns depend on a bounded window of their inputs' rows and
#: columns. Global average pooling reduces the whole map and ends every critical set.
SPLITTABLE_OPS = frozenset({"conv", "maxpool", "avgpool", "add", "mul", "concat", "resize",
                            "table", "channel_table"})


# --------------------------------------------------------------------------------------------
# Regions
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Region:
    """Rows ``r0..r1`` and columns ``c0..c1`` (half-open) of a feature map."""
    r0: int
    r1: int
    c0: int
    c1: int

    @staticmethod
    def whole(shape: Sequence[int]) -> "Region":
        return Region(0, shape[1], 0, shape[2])

    @property
    def empty(self) -> bool:
        return self.r1 <= self.r0 or self.c1 <= self.c0

    @property
    def hw(self) -> tuple[int, int]:
        return (self.r1 - self.r0, self.c1 - self.c0)

    def union(self, other: "Region | None") -> "Region":
        if other is None or other.empty:
            return self
        if self.empty:
            return other
        return Region(min(self.r0, other.r0), max(self.r1, other.r1),
                      min(self.c0, other.c0), max(self.c1, other.c1))

    def within(self, outer: "Region") -> "Region":
        """This region in the coordinates of ``outer`` (which contains it)."""
        return Region(self.r0 - outer.r0, self.r1 - outer.r0, self.c0 - outer.c0,
                      self.c1 - outer.c0)

    def crop(self, codes):
        """The region of a ``(C, H, W)`` array."""
        return codes[:, self.r0:self.r1, self.c0:self.c1]


def _bounds(n: int, parts: int) -> list[int]:
    return [i * n // parts for i in range(parts + 1)]


# --------------------------------------------------------------------------------------------
# Liveness and the memory profile
# --------------------------------------------------------------------------------------------

Step = tuple[tuple[str, ...], tuple[str, ...]]     # (tensors read, tensors written)


def liveness(steps: Sequence[Step], sizes: Mapping[str, int], inputs: Sequence[str],
             outputs: Sequence[str]) -> list[int]:
    """Working memory of every step: the sizes of the tensors alive at it. A tensor lives from
    the step writing it (graph inputs: the first step) to the last step reading it (graph
    outputs: the last step)."""
    birth = {t: 0 for t in inputs}
    death = dict(birth)
    for k, (reads, writes) in enumerate(steps):
        for t in reads:
            if t not in birth:
                raise RestructureError(f"step {k} reads {t!r} before any step writes it")
            death[t] = k
        for t in writes:
            birth.setdefault(t, k)
            death[t] = max(death.get(t, k), k)
    for t in outputs:
        death[t] = len(steps) - 1
    delta = [0] * (len(steps) + 1)
    for t, b in birth.items():
        delta[b] += sizes[t]
        delta[death[t] + 1] -= sizes[t]
    profile, live = [], 0
    for d in delta[:-1]:
        live += d
        profile.append(live)
    return profile


@dataclass(frozen=True)
class Profile:
    """Working memory per step of the graph's schedule (bytes) and each node's criticality."""
    memory: tuple[int, ...]           # one entry per node, in schedule order

    @property
    def peak(self) -> int:
        return max(self.memory)

    @property
    def peak_step(self) -> int:
        return self.memory.index(self.peak)


def _size(graph: Graph, name: str) -> int:
    return prod(graph.tensors[name].shape)


def memory_profile(graph: Graph) -> Profile:
    """The liveness profile of ``graph.nodes`` in their order; node ``k``'s criticality is
    ``memory[k]``."""
    steps = [(n.inputs, (n.output,)) for n in graph.nodes]
    sizes = {t: _size(graph, t) for t in graph.tensors}
    return Profile(tuple(liveness(steps, sizes, graph.inputs, graph.outputs)))


# --------------------------------------------------------------------------------------------
# Operations
# --------------------------------------------------------------------------------------------

def node_ops(graph: Graph, node: Node, out_hw: tuple[int, int] | None = None) -> int:
    """Operations of one node over ``out_hw`` output positions (default: its whole output):
    multiply-accumulates of a convolution, window reads of a pooling, one per output value of
    an element-wise operator, none for a concatenation (data placement)."""
    c, h, w = graph.tensors[node.output].shape
    positions = (h * w) if out_hw is None else out_hw[0] * out_hw[1]
    if node.op == "conv":
        _, cin, kh, kw = node.consts["weight"].shape
        return positions * c * cin * kh * kw
    if node.op in ("maxpool", "avgpool"):
        kh, kw = node.attrs["kernel"]
        return positions * c * kh * kw
    if node.op == "globalavgpool":
        return prod(graph.tensors[node.inputs[0]].shape)
    if node.op == "concat":
        return 0
    return positions * c


def graph_ops(graph: Graph) -> int:
    return sum(node_ops(graph, n) for n in graph.nodes)


# --------------------------------------------------------------------------------------------
# Explore: the critical sub-graph
# --------------------------------------------------------------------------------------------

def splittable(graph: Graph, node: Node, hardware: bool = False) -> bool:
    """Whether ``node`` can be copied per spatial tile: a windowed or element-wise operator on
    a feature map larger than one value (a channel vector has nothing to split).

    ``hardware``: only copies the accelerator can encode — it pools with one padding on every
    side, so a padded pooling whose copies would need padding on some sides only is excluded."""
    if node.op not in SPLITTABLE_OPS or graph.tensors[node.output].shape[1:] == (1, 1):
        return False
    if hardware and node.op in ("maxpool", "avgpool") and any(node.attrs["pads"]):
        return False
    if node.op == "mul":
        return graph.tensors[node.inputs[1]].shape[1:] == (1, 1)
    return True


def _links(graph: Graph) -> tuple[list[set[int]], list[set[int]]]:
    index = {n.output: k for k, n in enumerate(graph.nodes)}
    preds = [{index[t] for t in n.inputs if t in index} for n in graph.nodes]
    succs: list[set[int]] = [set() for _ in graph.nodes]
    for k, ps in enumerate(preds):
        for p in ps:
            succs[p].add(k)
    return preds, succs


def _reach(start: set[int], links: list[set[int]]) -> set[int]:
    seen, todo = set(), list(start)
    while todo:
        for m in links[todo.pop()]:
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def explore(graph: Graph, alpha: float, profile: Profile | None = None,
            hardware: bool = False, light: bool = False) -> frozenset[int]:
    """Indices of the nodes of the critical sub-graph for ``alpha`` (empty when nothing can be
    split). Seeds: the nodes at the peak (or, when none of them can be split, the splittable
    nodes of highest criticality); growth: producers of the set's frontier, then consumers,
    while their criticality is ≥ ``alpha · peak``; closure: nodes on a path from the set back
    into it (otherwise a branch would wait for the join it feeds). ``hardware``: see
    :func:`splittable`; ``light``: see :func:`_lighten`."""
    if not 0 < alpha <= 1:
        raise RestructureError(f"alpha {alpha}: must be in (0, 1]")
    profile = memory_profile(graph) if profile is None else profile
    crit = profile.memory
    ok = [splittable(graph, n, hardware) for n in graph.nodes]
    if not any(ok):
        return frozenset()
    top = max(m for m, can in zip(crit, ok) if can)
    seeds = {k for k, m in enumerate(crit) if m == top and ok[k]}
    return _grow(graph, seeds, crit, alpha * profile.peak, ok, light)


def _grow(graph: Graph, seeds: set[int], crit: Sequence[int], limit: float,
          ok: Sequence[bool], light: bool = False) -> frozenset[int]:
    """EXPLORE's growth from ``seeds`` over nodes with ``ok`` and criticality ≥ ``limit``,
    then (``light``) :func:`_lighten`, then the convex closure (empty when the closure needs a
    node without ``ok``)."""
    preds, succs = _links(graph)
    chosen = set(seeds)
    for links in (preds, succs):
        while True:
            grow = {m for k in chosen for m in links[k]
                    if m not in chosen and ok[m] and crit[m] >= limit}
            if not grow:
                break
            chosen |= grow
    if light:
        _lighten(graph, chosen, ok, preds, succs)
    while True:
        inner = (_reach(chosen, succs) & _reach(chosen, preds)) - chosen
        if not inner:
            return frozenset(chosen)
        if not all(ok[k] for k in inner):
            return frozenset()       # a path leaves through a node that cannot be split
        chosen |= inner


def _lighten(graph: Graph, chosen: set[int], ok: Sequence[bool], preds: list[set[int]],
             succs: list[set[int]]) -> None:
    """Move the set's fork and join points to lighter tensors (an extension of the paper):
    take in the producer of a fork read only inside the set when the inputs it would add are
    smaller (an input the set reads already adds nothing), and the sole consumer of a join when its output is smaller. Forks and joins stay
    whole while every branch runs, so their size is a floor under the new peak."""
    size = [_size(graph, n.output) for n in graph.nodes]
    index = {n.output: k for k, n in enumerate(graph.nodes)}
    outputs = set(graph.outputs)
    changed = True
    while changed:
        changed = False
        for k in sorted(chosen):
            for p in preds[k]:
                if p in chosen or not ok[p] or not succs[p] <= chosen:
                    continue
                if graph.nodes[p].output in outputs:
                    continue
                forks = {t for m in chosen for t in graph.nodes[m].inputs}
                fresh = sum(_size(graph, t) for t in set(graph.nodes[p].inputs)
                            if index.get(t) not in chosen and t not in forks)
                if fresh < size[p]:
                    chosen.add(p)
                    changed = True
            users = succs[k]
            if len(users) != 1 or graph.nodes[k].output in outputs:
                continue
            (c,) = users
            if c not in chosen and ok[c] and size[c] < size[k] and preds[c] <= chosen:
                chosen.add(c)
                changed = True


# --------------------------------------------------------------------------------------------
# Split: branches with halos
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SliceNode:
    """One copy of a node in one branch: the output region it computes, the region of each
    input it reads and, for a windowed operator, its padding (top, left, bottom, right)."""
    node: Node
    region: Region
    inputs: tuple[Region, ...]
    pads: tuple[int, int, int, int] | None


def _window(size: int, lo: int, hi: int, k: int, s: int, pad: int, halo_error: int
            ) -> tuple[int, int, int, int]:
    """Input span and paddings for output positions ``lo..hi`` of a window ``k`` stride ``s``."""
    first, last = lo * s - pad, (hi - 1) * s - pad + k
    a, b = max(0, first), min(size, last)
    if halo_error and a > 0 and k > s:   # test hook: drop halo rows, pad instead
        a = min(a + min(halo_error, k - s), b)
    return a, b, a - first, last - b


def _input_regions(graph: Graph, node: Node, out: Region, halo_error: int
                   ) -> tuple[tuple[Region, ...], tuple[int, int, int, int] | None]:
    if node.op in ("conv", "maxpool", "avgpool"):
        _, h, w = graph.tensors[node.inputs[0]].shape
        kh, kw = (node.consts["weight"].shape[2:] if node.op == "conv" else node.attrs["kernel"])
        sh, sw = node.attrs["stride"]
        pt, pl, _, _ = node.attrs["pads"]
        e = halo_error if node.op == "conv" else 0
        a, b, top, bottom = _window(h, out.r0, out.r1, kh, sh, pt, e)
        c, d, left, right = _window(w, out.c0, out.c1, kw, sw, pl, e)
        return (Region(a, b, c, d),), (top, left, bottom, right)
    if node.op == "resize":
        return (Region(out.r0 // 2, (out.r1 + 1) // 2, out.c0 // 2, (out.c1 + 1) // 2),), None
    if node.op == "mul":              # the channel vector is read whole by every branch
        return (out, Region.whole(graph.tensors[node.inputs[1]].shape)), None
    return tuple(out for _ in node.inputs), None


def hardware_pads(node: Node, pads: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """A copy's padding as the accelerator encodes it. It pools with one padding on every side
    and takes the output size from the instruction; for max pooling, padding below and right
    that is no larger than above and left only adds −∞ windows no output reads, so it widens."""
    t, l, b, r = pads
    if node.op == "maxpool" and t == l and b <= t and r <= t:
        return (t, t, t, t)
    return pads


def _align(graph: Graph, node: Node, need: Region) -> Region:
    """The region a copy of ``node`` computes to cover ``need``: a 2× upsample produces rows
    in pairs, so its region starts and ends on even rows and columns."""
    if node.op != "resize":
        return need
    _, h, w = graph.tensors[node.output].shape
    return Region(need.r0 // 2 * 2, min(h, -(-need.r1 // 2) * 2), need.c0 // 2 * 2,
                  min(w, -(-need.c1 // 2) * 2))


def _tiles(graph: Graph, joins: Sequence[str], n_h: int, n_w: int) -> list[dict[str, Region]]:
    tiles: list[dict[str, Region]] = [{} for _ in range(n_h * n_w)]
    for t in joins:
        _, h, w = graph.tensors[t].shape
        rows, cols = _bounds(h, n_h), _bounds(w, n_w)
        for i in range(n_h):
            for j in range(n_w):
                tiles[i * n_w + j][t] = Region(rows[i], rows[i + 1], cols[j], cols[j + 1])
    return tiles


def _branch(graph: Graph, nodes: Sequence[Node], tiles: Mapping[str, Region],
            halo_error: int) -> tuple[SliceNode, ...]:
    """One branch, propagated backwards from its tiles: each copy computes the union of what
    its consumers read (aligned for an upsample)."""
    need: dict[str, Region] = {t: r for t, r in tiles.items() if not r.empty}
    copies: list[SliceNode] = []
    for node in reversed(nodes):
        wanted = need.get(node.output)
        if wanted is None or wanted.empty:
            continue
        region = _align(graph, node, wanted)
        ins, pads = _input_regions(graph, node, region, halo_error)
        for t, r in zip(node.inputs, ins):
            need[t] = r.union(need.get(t))
        copies.append(SliceNode(node, region, ins, pads))
    copies.reverse()
    return tuple(copies)


@dataclass(frozen=True)
class SplitBlock:
    """One critical sub-graph split into branches."""
    critical: tuple[int, ...]                   # node indices, in schedule order
    forks: tuple[str, ...]                      # tensors it reads from outside
    joins: tuple[str, ...]                      # tensors it hands on
    tiles: tuple[Mapping[str, Region], ...]     # per branch: join → the tile it writes
    branches: tuple[tuple[SliceNode, ...], ...]

    def key(self, tensor: str, branch: int) -> str:
        """The tensor a branch's copy writes: the join itself when the copy computes exactly
        its tile, otherwise a private map (its region includes halo rows other copies read)."""
        sn = next((s for s in self.branches[branch] if s.node.output == tensor), None)
        tile = self.tiles[branch].get(tensor)
        if sn is not None and tile is not None and sn.region == tile:
            return tensor
        return f"{tensor}@{branch}"


def _split_block(graph: Graph, critical: frozenset[int], n_h: int, n_w: int,
                 halo_error: int) -> SplitBlock:
    nodes = [graph.nodes[k] for k in sorted(critical)]
    made = {n.output for n in nodes}
    forks = tuple(dict.fromkeys(t for n in nodes for t in n.inputs if t not in made))
    read_outside = {t for k, n in enumerate(graph.nodes) if k not in critical
                    for t in n.inputs} | set(graph.outputs)
    joins = tuple(n.output for n in nodes if n.output in read_outside)
    tiles = _tiles(graph, joins, n_h, n_w)
    return SplitBlock(tuple(sorted(critical)), forks, joins, tuple(tiles),
                      tuple(_branch(graph, nodes, t, halo_error) for t in tiles))


def block_order(graph: Graph, blocks: Sequence[frozenset[int]]) -> list[int]:
    """Stable topological order of the nodes outside the blocks (their index) and the blocks
    (``-1 - j``), each block placed as early as its inputs allow at the rank of its first
    node; every other node keeps its relative order."""
    preds, _ = _links(graph)
    item = list(range(len(graph.nodes)))
    for j, blk in enumerate(blocks):
        for k in blk:
            item[k] = -1 - j
    deps: dict[int, set[int]] = {}
    prio: dict[int, int] = {}
    for k in range(len(graph.nodes)):
        deps.setdefault(item[k], set()).update(item[p] for p in preds[k] if item[p] != item[k])
        prio[item[k]] = min(prio.get(item[k], k), k)
    users: dict[int, set[int]] = {}
    for i, ds in deps.items():
        for d in ds:
            users.setdefault(d, set()).add(i)
    waiting = {i: len(ds) for i, ds in deps.items()}
    ready = [(prio[i], i) for i, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, (prio[u], u))
    if len(order) != len(deps):
        raise RestructureError("a critical set is not convex: a path leaves it and comes "
                               "back; use explore() to choose the sets")
    return order


@dataclass(frozen=True)
class Restructured:
    """A graph with one or more critical sub-graphs split into ``n_h × n_w`` branches each."""
    graph: Graph
    alpha: float | None
    n_slices: tuple[int, int]                   # (n_h, n_w)
    blocks: tuple[SplitBlock, ...]
    before: Profile
    after: tuple[int, ...]                      # working memory per step of the new schedule
    where: tuple[tuple[int, int], ...]          # per step: (node index, branch or -1)
    ops_before: int
    ops_after: int

    @property
    def critical(self) -> tuple[int, ...]:
        return tuple(sorted(k for b in self.blocks for k in b.critical))

    @property
    def peak_before(self) -> int:
        return self.before.peak

    @property
    def peak_after(self) -> int:
        return max(self.after)

    @property
    def saving(self) -> float:
        """Relative peak-memory saving (the paper's "memory savings")."""
        return 1 - self.peak_after / self.peak_before

    @property
    def overhead(self) -> float:
        """Extra operations relative to the whole original graph."""
        return self.ops_after / self.ops_before - 1


def split_blocks(graph: Graph, critical_sets: Sequence[Sequence[int] | frozenset[int]],
                 n_slices: tuple[int, int], alpha: float | None = None,
                 halo_error: int = 0) -> Restructured:
    """Split every (disjoint, convex) critical set into ``n_h × n_w`` branches and schedule
    the result: outside the blocks the original order, each block's branches one after
    another."""
    n_h, n_w = n_slices
    if n_h < 1 or n_w < 1:
        raise RestructureError(f"n_slices {n_slices}: both counts must be ≥ 1")
    sets = [frozenset(c) for c in critical_sets]
    seen: set[int] = set()
    for crit in sets:
        if not crit:
            raise RestructureError("empty critical set: nothing to split")
        if crit & seen:
            raise RestructureError(f"critical sets overlap at nodes {sorted(crit & seen)}")
        seen |= crit
        for k in crit:
            if not splittable(graph, graph.nodes[k]):
                n = graph.nodes[k]
                raise RestructureError(
                    f"node {n.name!r} ({n.op}) cannot be split spatially; splittable: "
                    f"{', '.join(sorted(SPLITTABLE_OPS))} on maps larger than 1×1")
    blocks = tuple(_split_block(graph, c, n_h, n_w, halo_error) for c in sets)
    sizes = {t: _size(graph, t) for t in graph.tensors}
    steps: list[Step] = []
    where: list[tuple[int, int]] = []
    for i in block_order(graph, sets):
        if i >= 0:
            n = graph.nodes[i]
            steps.append((n.inputs, (n.output,)))
            where.append((i, -1))
            continue
        blk = blocks[-1 - i]
        index = {graph.nodes[k].output: k for k in blk.critical}
        for b, copies in enumerate(blk.branches):
            for sn in copies:
                reads = tuple(t if t in blk.forks else blk.key(t, b) for t in sn.node.inputs)
                out = blk.key(sn.node.output, b)
                if out != sn.node.output:
                    sizes[out] = graph.tensors[sn.node.output].shape[0] * prod(sn.region.hw)
                # a join is allocated by the first copy that writes a tile of it
                store = (sn.node.output,) if sn.node.output in blk.joins and \
                    out != sn.node.output else ()
                steps.append((reads, (out, *store)))
                where.append((index[sn.node.output], b))
    after = liveness(steps, sizes, graph.inputs, graph.outputs)
    ops_before = graph_ops(graph)
    ops = ops_before + sum(
        node_ops(graph, sn.node, sn.region.hw) for blk in blocks for copies in blk.branches
        for sn in copies) - sum(node_ops(graph, graph.nodes[k]) for k in seen)
    return Restructured(graph, alpha, (n_h, n_w), blocks, memory_profile(graph), tuple(after),
                        tuple(where), ops_before, ops)


def split(graph: Graph, critical: Sequence[int] | frozenset[int], n_slices: tuple[int, int],
          alpha: float | None = None, halo_error: int = 0) -> Restructured:
    """Split the sub-graph of the ``critical`` node indices into ``n_h × n_w`` branches.

    ``halo_error`` > 0 deliberately drops up to that many halo rows and columns of every
    convolution at interior tile edges (replacing them by padding); it exists to show that the
    equivalence check fails."""
    return split_blocks(graph, [critical], n_slices, alpha, halo_error)


def restructure(graph: Graph, alpha: float, n_slices: tuple[int, int],
                profile: Profile | None = None, hardware: bool = False,
                rounds: int = 1, light: bool = False) -> Restructured | None:
    """Algorithm 1 of the paper: explore with ``alpha``, then split into ``n_slices``; None
    when no critical sub-graph can be split. ``hardware``: see :func:`splittable`.

    ``rounds`` > 1 repeats it (an extension of the paper): while the new peak is at a node
    outside every block, explore again from that node on the new schedule's criticality
    (excluding the blocks' nodes) and split that set too, as long as the peak keeps falling.
    ``light`` moves fork and join points to lighter tensors (:func:`_lighten`)."""
    profile = memory_profile(graph) if profile is None else profile
    critical = explore(graph, alpha, profile, hardware, light)
    if not critical:
        return None
    sets = [critical]
    best = split_blocks(graph, sets, n_slices, alpha)
    ok = [splittable(graph, n, hardware) for n in graph.nodes]
    for _ in range(rounds - 1):
        peak = best.peak_after
        node, branch = best.where[best.after.index(peak)]
        taken = set(best.critical)
        allowed = [can and k not in taken for k, can in enumerate(ok)]
        if branch >= 0 or not allowed[node]:
            break                    # the peak is inside a block or cannot be split
        crit = [0] * len(graph.nodes)
        for step, (k, b) in enumerate(best.where):
            if b < 0:
                crit[k] = best.after[step]
        new = _grow(graph, {node}, crit, alpha * peak, allowed, light)
        if not new:
            break
        try:
            candidate = split_blocks(graph, sets + [new], n_slices, alpha)
        except RestructureError:
            break                    # the new set would make the blocks depend on each other
        if candidate.peak_after >= peak:
            break
        sets.append(new)
        best = candidate
    return best


# --------------------------------------------------------------------------------------------
# One program
# --------------------------------------------------------------------------------------------

def one_graph(r: Restructured) -> Graph:
    """The restructured network as one IR graph, in the new schedule, for one program.

    Each copy of a branch writes a private map of its region (``t@b``); a copy reads its window
    of a fork, or of an earlier copy's map computed larger, through a ``crop`` view (read in
    place: windowed addressing); each join is the ``stitch`` of its branches' tiles, written in
    place into the join. Copies keep their node's name with ``@b`` appended. Raises
    :class:`RestructureError` for a copy the accelerator cannot encode (a pool padded
    unequally, :func:`hardware_pads`)."""
    graph = r.graph
    critical = {graph.nodes[k].output for blk in r.blocks for k in blk.critical}
    tensors = {n: t for n, t in graph.tensors.items()
               if n not in critical or any(n in blk.joins for blk in r.blocks)}
    nodes: list[Node] = []

    def window(name: str, have: Region, need: Region) -> str:
        """``need`` of the map ``name`` that holds ``have`` of its IR tensor."""
        if need == have:
            return name
        crop = f"{name}[{need.r0}:{need.r1},{need.c0}:{need.c1}]"
        if crop not in tensors:
            t = tensors[name]
            tensors[crop] = Tensor(crop, (t.shape[0], *need.hw), t.qtype)
            nodes.append(Node(f"{crop}.crop", "crop", (name,), crop,
                              attrs=dict(origin=(need.r0 - have.r0, need.c0 - have.c0))))
        return crop

    for i in block_order(graph, [frozenset(b.critical) for b in r.blocks]):
        if i >= 0:
            nodes.append(graph.nodes[i])
            continue
        blk = r.blocks[-1 - i]
        made: list[dict[str, tuple[str, Region]]] = []
        for b, copies in enumerate(blk.branches):
            have = {t: (t, Region.whole(graph.tensors[t].shape)) for t in blk.forks}
            for sn in copies:
                ins = tuple(window(*have[t], need) for t, need in zip(sn.node.inputs, sn.inputs))
                attrs = dict(sn.node.attrs)
                if sn.pads is not None:
                    pads = hardware_pads(sn.node, sn.pads)
                    if sn.node.op in ("maxpool", "avgpool") and len(set(pads)) != 1:
                        raise RestructureError(
                            f"branch {b}: the copy of {sn.node.name!r} ({sn.node.op}) pads "
                            f"{pads}; the accelerator pools with one padding on every side")
                    attrs["pads"] = pads
                t = graph.tensors[sn.node.output]
                # one branch over the whole map: the copy is the node (no window, no stitch)
                whole = len(blk.branches) == 1 and sn.region == Region.whole(t.shape)
                out = sn.node.output if whole else f"{sn.node.output}@{b}"
                tensors[out] = Tensor(out, (t.shape[0], *sn.region.hw), t.qtype)
                nodes.append(sn.node.replace(name=f"{sn.node.name}@{b}", inputs=ins, output=out,
                                             attrs=attrs))
                have[sn.node.output] = (out, sn.region)
            made.append(have)
        for t in blk.joins:
            if made[0][t][0] == t:
                continue                            # written whole by its only copy
            parts = [(window(*made[b][t], tiles[t]), (tiles[t].r0, tiles[t].c0))
                     for b, tiles in enumerate(blk.tiles) if not tiles[t].empty]
            nodes.append(Node(f"{t}.stitch", "stitch", tuple(p for p, _ in parts), t,
                              attrs=dict(origins=tuple(o for _, o in parts))))
    return check(Graph(tensors, tuple(nodes), graph.inputs, graph.outputs))
