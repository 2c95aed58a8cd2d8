"""IR passes. Each is ``(graph) -> (graph, changed)`` and keeps every value bit-exact with
onnxruntime's execution of the QDQ model; :func:`run_passes` checks the graph after each one.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import numpy as np

from sfnpu import numeric
from sfnpu.config import HwConfig
from sfnpu.hw.limits import StoreSizes

from .groups import weight_key
from .ir import Graph, Node, QType, Tensor, check

__all__ = ["PASSES", "run_passes", "fold_silu", "requantize_concat_inputs",
           "drop_dead_nodes", "split_shared_wide_convs"]


def _codes(q: QType) -> np.ndarray:
    return np.arange(256, dtype=np.uint8).view(q.dtype).astype(np.int32)


def fold_silu(graph: Graph) -> tuple[Graph, bool]:
    """``Mul(x, T(x))`` with ``T`` a table (SiLU / Swish exported as ``x · Sigmoid(x)``) is a
    function of the code of ``x`` alone: one 256-entry table, exact by construction
    (onnxruntime runs QLinearSigmoid then QLinearMul; :func:`sfnpu.numeric.qlinear_mul`)."""
    nodes, changed = list(graph.nodes), False
    for k, node in enumerate(nodes):
        if node.op != "mul":
            continue
        a, b = node.inputs
        for x, t in ((a, b), (b, a)):
            producer = graph.producer(t)
            if producer is None or producer.op != "table" or producer.inputs[0] != x:
                continue
            qx, qt, qy = (graph.tensors[n].qtype for n in (x, t, node.output))
            codes = _codes(qx)
            sig = numeric.apply_table(codes, producer.consts["table"], qx.signed)
            if x == a:
                table = numeric.qlinear_mul(codes, qx.scale, qx.zero_point, sig, qt.scale,
                                            qt.zero_point, qy.scale, qy.zero_point, qy.signed)
            else:
                table = numeric.qlinear_mul(sig, qt.scale, qt.zero_point, codes, qx.scale,
                                            qx.zero_point, qy.scale, qy.zero_point, qy.signed)
            nodes[k] = Node(node.name, "table", (x,), node.output,
                            consts=dict(table=table.astype(qy.dtype)))
            changed = True
            break
    return (graph.replace(nodes=nodes), True) if changed else (graph, False)


def requantize_concat_inputs(graph: Graph) -> tuple[Graph, bool]:
    """A concat part quantised differently from the result goes through its own requantisation
    table first (onnxruntime's QLinearConcat, :func:`sfnpu.numeric.requant_table`), so that
    every part can be written into the destination as it is. The table is placed right after
    the part's producer, where fusion can append it to the producing group."""
    tensors = dict(graph.tensors)
    after: dict[str, list[Node]] = {}     # part → tables to insert after its producer
    rewired = {}
    for node in graph.nodes:
        if node.op != "concat":
            continue
        dest = graph.tensors[node.output].qtype
        parts = []
        for k, part in enumerate(node.inputs):
            t = graph.tensors[part]
            if t.qtype != dest:
                name = f"{part}.requant:{node.output}"
                table = numeric.requant_table(t.qtype.scale, t.qtype.zero_point, dest.scale,
                                              dest.zero_point, t.qtype.signed, dest.signed)
                tensors[name] = Tensor(name, t.shape, dest)
                after.setdefault(part, []).append(
                    Node(f"{node.name}.requant{k}", "table", (part,), name,
                         consts=dict(table=table.astype(dest.dtype))))
                part = name
            parts.append(part)
        rewired[node.output] = tuple(parts)
    if not after:
        return graph, False
    nodes = [t for name in graph.inputs for t in after.get(name, [])]
    for node in graph.nodes:
        if node.output in rewired:
            node = node.replace(inputs=rewired[node.output])
        nodes.append(node)
        nodes += after.get(node.output, [])
    return graph.replace(nodes=nodes, tensors=tensors), True


def drop_dead_nodes(graph: Graph) -> tuple[Graph, bool]:
    """Remove nodes whose output nobody reads (e.g. a sigmoid folded into a SiLU table)."""
    live = set(graph.outputs)
    kept = []
    for node in reversed(graph.nodes):
        if node.output in live:
            kept.append(node)
            live.update(node.inputs)
    if len(kept) == len(graph.nodes):
        return graph, False
    kept.reverse()
    used = {n.output for n in kept} | set(graph.inputs)
    tensors = {k: v for k, v in graph.tensors.items() if k in used}
    return graph.replace(nodes=kept, tensors=tensors), True


#: The pass pipeline, in order, by name.
PASSES: list[tuple[str, Callable[[Graph], tuple[Graph, bool]]]] = [
    ("fold_silu", fold_silu),
    ("drop_dead_nodes", drop_dead_nodes),
    ("requantize_concat_inputs", requantize_concat_inputs),
]


def run_passes(graph: Graph, passes=PASSES) -> tuple[Graph, list[str]]:
    """Run each pass once, checking the IR after every change; returns the names that
    changed the graph."""
    applied = []
    for name, fn in passes:
        graph, changed = fn(graph)
        if changed:
            check(graph)
            applied.append(name)
    return graph, applied


def split_shared_wide_convs(graph: Graph, config: HwConfig) -> tuple[Graph, bool]:
    """A normal convolution whose weights several nodes share (RetinaNet's class predictor on
    every pyramid level) and exceed the weight store of ``config`` becomes convolutions over
    slices of its output channels, each within the store, concatenated into the original
    tensor: every slice's weights are then shared and held in the store across the nodes
    (``weights_held``), so they cross the bus once instead of once per node. Slices start at
    channel-block boundaries; each is requantised exactly as the whole was (same scales), so
    the result is bit-exact."""
    z = StoreSizes.of(config)
    keys = {n.output: weight_key(n) for n in graph.nodes       # outputs are unique
            if n.op == "conv" and not n.attrs["depthwise"]}
    uses = Counter(keys.values())
    nodes, tensors, changed = [], dict(graph.tensors), False
    for node in graph.nodes:
        shared = node.output in keys and uses[keys[node.output]] > 1
        parts = _slices(node, z) if shared else None
        if not parts:
            nodes.append(node)
            continue
        y = graph.tensors[node.output]
        names = []
        for p, (lo, hi) in enumerate(parts):
            name = f"{node.output}.slice{p}"
            tensors[name] = Tensor(name, (hi - lo, *y.shape[1:]), y.qtype)
            nodes.append(node.replace(name=f"{node.name}.slice{p}", output=name, consts={
                k: v[lo:hi] for k, v in node.consts.items()}))
            names.append(name)
        nodes.append(Node(node.name, "concat", tuple(names), node.output))
        changed = True
    return (graph.replace(nodes=nodes, tensors=tensors), True) if changed else (graph, False)


def _slices(conv: Node, z: StoreSizes) -> list[tuple[int, int]] | None:
    """Output-channel ranges of whole channel blocks whose weights each fit the store, as even
    as possible; None when the weights fit whole or one block alone does not."""
    o, i, kh, kw = conv.consts["weight"].shape
    per_block = -(-i // z.lanes) * kh * kw              # weight words of one output block
    blocks = -(-o // z.lanes)
    fit = z.weight_words // per_block
    if blocks * per_block <= z.weight_words or fit == 0:
        return None
    n = -(-blocks // fit)
    size = -(-blocks // n) * z.lanes
    return [(lo, min(lo + size, o)) for lo in range(0, o, size)]
