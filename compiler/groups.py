"""Fusion of IR nodes into accelerator groups (one instruction each).

A group follows the hardware's post-processing order::

    [channel table] → [conv] → [table] → [add | mul] → [table] → [pool] → [resize]
        → write (at a channel offset)

Nodes are taken in topological order; a node joins the open group when it reads that group's
current output, nobody else reads that output, and its stage comes later in the chain. Concat
costs nothing when every part is written by a group straight into the destination at its
channel offset (output redirection); a part that cannot be redirected is copied by a group of
its own.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Mapping

from .ir import Graph, IRError, Node, channel_views

if TYPE_CHECKING:
    from sfnpu.isa import Location

__all__ = ["Group", "fuse", "shared_weights_back_to_back", "weight_key", "STAGE_ORDER"]

#: Stage ranks in hardware order; a node may join a group only after its last stage.
STAGE_ORDER = {"in_transform": -1, "conv": 0, "table": 1, "eltwise": 2, "table_after": 3,
               "pool": 4, "resize": 5}
_STAGE_OF = {"channel_table": "in_transform", "conv": "conv", "add": "eltwise", "mul": "eltwise", "maxpool": "pool",
             "avgpool": "pool", "globalavgpool": "pool", "resize": "resize"}


@dataclass(frozen=True)
class Group:
    """One instruction's worth of work."""
    index: int
    nodes: tuple[Node, ...]          # in hardware order
    input: str                       # tensor the group streams in
    output: str                      # tensor produced by the last node
    shortcut: str | None = None      # second operand of add / mul
    dest: str | None = None          # concat destination written at ``channel_offset``
    channel_offset: int = 0
    #: A stitch destination: the output is its tile at this (row, column) (windowed writes).
    origin: tuple[int, int] | None = None
    #: A tile of a group too large for the stores (compiler.tiling): its label, and the byte
    #: offsets of its input, output and shortcut windows inside the whole DRAM tensors.
    part: str = ""
    window: tuple[int, int, int] = (0, 0, 0)

    @property
    def name(self) -> str:
        name = self.nodes[0].name if self.nodes else f"copy:{self.output}"
        return f"{name} [{self.part}]" if self.part else name

    def locate(self, locations: Mapping[str, "Location"]) -> dict[str, "Location"]:
        """The instruction's ``input``, ``output`` and ``shortcut`` at ``locations`` of the
        whole tensors, moved to this tile's windows (tiles' operands are in DRAM)."""
        found = {}
        for role, tensor, offset in zip(("input", "output", "shortcut"),
                                        (self.input, self.written, self.shortcut), self.window):
            if tensor is not None:
                loc = locations[tensor]
                found[role] = loc.replace(offset=loc.offset + offset) if offset else loc
        return found

    def node(self, op: str) -> Node | None:
        return next((n for n in self.nodes if n.op == op), None)

    @property
    def written(self) -> str:
        """The tensor this group's instruction writes (the concat destination if any)."""
        return self.dest or self.output


@dataclass
class _Open:
    nodes: list = field(default_factory=list)
    input: str = ""
    output: str = ""
    stages: list = field(default_factory=list)
    shortcut: str | None = None


def _stage(node: Node, open_: _Open) -> str:
    if node.op == "table":
        return "table_after" if "eltwise" in open_.stages else "table"
    return _STAGE_OF[node.op]


def _same_shape(graph: Graph, names) -> bool:
    return len({graph.tensors[n].shape for n in names}) == 1


def fuse(graph: Graph, share_weights: bool = True) -> list[Group]:
    """Group the graph's nodes; raises IRError if a node cannot be placed. ``share_weights``:
    groups applying the same weights run back to back (:func:`shared_weights_back_to_back`);
    off, the graph's order stays (a restructured network's branches run one after another)."""
    producer_group: dict[str, int] = {name: -1 for name in graph.inputs}
    readers = {name: len(graph.consumers(name)) for name in graph.tensors}
    for name in graph.outputs:
        readers[name] = readers.get(name, 0) + 1
    closed: list[_Open] = []
    current: _Open | None = None

    def close():
        nonlocal current
        if current is not None:
            closed.append(current)
            for n in current.nodes:
                producer_group[n.output] = len(closed) - 1
        current = None

    concats = [n for n in graph.nodes if n.op in ("concat", "stitch")]
    views = channel_views(graph)
    for node in graph.nodes:
        if node.op in ("concat", "slice", "crop", "stitch"):
            continue  # resolved after fusion; views are read in place
        stage = _stage(node, current) if current else None
        # An add, or a product of two maps, may stream either operand; the other one is read
        # as the shortcut (a per-channel vector always is).
        stream = node.inputs[0]
        if current is not None and node.inputs[1:] == (current.output,) and (
                node.op == "add" or (node.op == "mul" and _same_shape(graph, node.inputs))):
            stream = node.inputs[1]
        opens = node.op in ("conv", "channel_table") and not (
            node.op == "conv" and current is not None and current.stages == ["in_transform"])
        joins = (current is not None and not opens
                 and stream == current.output and readers[current.output] == 1
                 and STAGE_ORDER[stage] > max(STAGE_ORDER[s] for s in current.stages))
        if joins and node.op == "table":
            joins = not any(s.startswith("table") for s in current.stages)  # one table each
        if joins and node.op in ("add", "mul"):
            # The second operand must exist before this group starts.
            other = node.inputs[1] if stream == node.inputs[0] else node.inputs[0]
            other = views.get(other, (other,))[0]
            joins = producer_group.get(other, len(closed)) < len(closed)
        if not joins:
            close()
            stream = node.inputs[0]
            current = _Open(input=stream)
            stage = _stage(node, current)
        current.nodes.append(node)
        current.stages.append(stage)
        current.output = node.output
        if node.op in ("add", "mul"):
            current.shortcut = node.inputs[1] if stream == node.inputs[0] else node.inputs[0]
    close()

    groups = [Group(i, tuple(g.nodes), g.input, g.output, g.shortcut)
              for i, g in enumerate(closed)]
    groups = _redirect_concats(graph, groups, concats)
    return shared_weights_back_to_back(groups, views) if share_weights else groups


def _places(graph: Graph, concat: Node) -> list[tuple[int, tuple[int, int] | None]]:
    """Where each part of a concat (channel offset) or a stitch (origin) goes."""
    if concat.op == "stitch":
        return [(0, tuple(origin)) for origin in concat.attrs["origins"]]
    sizes = [graph.tensors[part].channels for part in concat.inputs]
    offsets = concat.attrs.get("offsets") or [sum(sizes[:k]) for k in range(len(sizes))]
    return [(offset, None) for offset in offsets]


def _redirect_concats(graph: Graph, groups: list[Group], concats: list[Node]) -> list[Group]:
    """Point each concat (or stitch) part's producing group at the destination — at the
    part's channel offset, or its tile's origin —; copy the rest."""
    by_output = {g.output: g for g in groups}
    views = channel_views(graph)
    result = list(groups)
    copies: dict[int, list[Group]] = {}   # insert copies after the group that makes the part
    for concat in concats:
        dest = graph.tensors[concat.output]
        for part, (offset, origin) in zip(concat.inputs, _places(graph, concat)):
            t = graph.tensors[part]
            owner = by_output.get(part)
            sole_reader = len(graph.consumers(part)) == 1 and part not in graph.outputs
            if owner is not None and sole_reader and owner.dest is None \
                    and t.qtype == dest.qtype:
                redirected = replace(owner, dest=concat.output, channel_offset=offset,
                                     origin=origin)
                result[owner.index] = redirected
                by_output[part] = redirected
            else:
                if t.qtype != dest.qtype:
                    raise IRError(f"concat {concat.name!r}: part {part!r} is quantised "
                                  f"differently from the result ({t.qtype} vs {dest.qtype}); "
                                  "requantising copies are not supported yet")
                # After the last group or copy that writes the part (a concat result is
                # written by several; a stitched tile may be one) or the tensor it is a view
                # of; graph inputs are ready from the start.
                source = views.get(part, (part,))[0]
                after = max([r.index for r in result if r.written == source]
                            + [k for k, cs in copies.items() for c in cs if c.written == source],
                            default=-1)
                copies.setdefault(after, []).append(
                    Group(-1, (), part, part, dest=concat.output, channel_offset=offset,
                          origin=origin))
    # Rebuild the order: every copy right after the group producing its part.
    ordered = copies.get(-1, [])
    for g in result:
        ordered.append(g)
        ordered += copies.get(g.index, [])
    return [replace(g, index=i) for i, g in enumerate(ordered)]


def weight_key(conv: Node) -> tuple:
    """Identity of a convolution's weights (kind, shape and values): equal keys, one tensor."""
    w = conv.consts["weight"]
    return conv.attrs["depthwise"], w.shape, hashlib.sha1(w.tobytes()).digest()


def _weight_key(group: Group) -> tuple | None:
    conv = group.node("conv")
    return None if conv is None else weight_key(conv)


def shared_weights_back_to_back(groups: list[Group],
                                views: Mapping[str, tuple[str, int]] = {}) -> list[Group]:
    """Re-order the groups so that groups applying the same weights run one after another —
    a detection head shared by the pyramid levels runs layer by layer over all levels — so the
    weight store keeps the weights and DRAM delivers them once (``weights_held``).

    The order is kept until the earliest remaining group has weights that other groups share;
    then every group those groups need runs first (in the original order), followed by the
    sharing groups back to back (one that needs another's result waits for a later batch)."""
    keys = [_weight_key(g) for g in groups]
    shared = {k for k in keys if k is not None and keys.count(k) > 1}
    if not shared:
        return groups
    writers: dict[str, list[int]] = {}
    for g in groups:
        writers.setdefault(g.written, []).append(g.index)
    deps = [{w for t in (g.input, g.shortcut) if t is not None
             for w in writers.get(views.get(t, (t,))[0], ()) if w != g.index} for g in groups]
    ancestors: list[set[int]] = []
    for g in groups:                 # groups are in topological order
        ancestors.append(set().union(*({d} | ancestors[d] for d in deps[g.index])))
    remaining, order = list(range(len(groups))), []
    while remaining:
        first = remaining[0]
        batch = [first]
        if keys[first] in shared:
            batch = [j for j in remaining if keys[j] == keys[first]]
            batch = [j for j in batch if not ancestors[j] & set(batch)]
        needed = set().union(*(ancestors[j] for j in batch)) - set(order)
        for j in sorted(needed) + batch:
            remaining.remove(j)
            order.append(j)
    return [replace(groups[j], index=i) for i, j in enumerate(order)]
