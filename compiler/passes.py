"""IR passes. Each is ``(graph) -> (graph, changed)`` and keeps every value bit-exact with
onnxruntime's execution of the QDQ model; :func:`run_passes` checks the graph after each one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Callable

import numpy as np

from sfnpu import numeric
from sfnpu.config import HwConfig
from sfnpu.hw.conv_array import row_cycles
from sfnpu.limits import StoreSizes

from .groups import weight_key
from .ir import (Graph, InputTaps, Node, QType, Tensor, channel_select_conv, channel_views,
                 check, copy_conv, is_space_to_depth_conv, space_to_depth_conv)

__all__ = ["PASSES", "run_passes", "fold_silu", "requantize_concat_inputs",
           "drop_dead_nodes", "split_shared_wide_convs", "space_to_depth_strided_convs",
           "space_to_depth_form", "fold_input_taps", "channel_views_or_copies",
           "concat_parts_on_lane_blocks", "on_lane_blocks"]


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


def channel_views_or_copies(graph: Graph, config: HwConfig) -> tuple[Graph, bool]:
    """A channel window (``slice``: Split, Slice) is read in place when its lane blocks are
    whole blocks of its source — it starts on a block boundary and ends on one or at the
    source's last channel — and it is no network output: its readers address the source in
    DRAM at that block's offset (:func:`~.ir.channel_views`), the reverse of concat by
    redirection. Any other window becomes a one-hot 1x1 convolution that copies its
    channels. Windows of windows become windows of the source."""
    lanes = config.lanes
    views = channel_views(graph)
    nodes, changed = [], False
    for node in graph.nodes:
        if node.op == "slice":
            source, start = views[node.output]
            channels = graph.tensors[source].channels
            count = graph.tensors[node.output].channels
            whole_blocks = start % lanes == 0 and (count % lanes == 0
                                                   or start + count == channels)
            if whole_blocks and node.output not in graph.outputs:
                if node.inputs[0] != source:
                    node = node.replace(inputs=(source,), attrs=dict(start=start))
                    changed = True
            else:
                node = channel_select_conv(node.name, source, node.output, channels, start,
                                           count)
                changed = True
        nodes.append(node)
    return (graph.replace(nodes=nodes), True) if changed else (graph, False)


def concat_parts_on_lane_blocks(graph: Graph, config: HwConfig) -> tuple[Graph, bool]:
    """The accelerator writes whole lane blocks, so every concat part must start on a block
    boundary. Where one would not (parts of 4 channels on 8 lanes, say), each part starts
    at the next boundary instead and the result gains gap channels (``offsets`` on the
    concat node). When every reader of the result is a normal convolution, their weights
    gain zero rows for the gaps, so the gaps' contents never count; otherwise a one-hot 1x1
    convolution packs the result's channels together again for its readers."""
    lanes = config.lanes
    tensors, nodes, spread = dict(graph.tensors), [], {}
    changed = False
    for node in graph.nodes:
        if node.op == "conv" and node.inputs[0] in spread:
            w = node.consts["weight"]
            wide = np.zeros((w.shape[0], tensors[node.inputs[0]].channels, *w.shape[2:]),
                            w.dtype)
            wide[:, spread[node.inputs[0]]] = w
            node = node.replace(consts={**node.consts, "weight": wide})
        nodes.append(node)
        if node.op != "concat" or "offsets" in node.attrs:
            continue
        sizes = [graph.tensors[p].channels for p in node.inputs]
        if not any(sum(sizes[:k]) % lanes for k in range(len(sizes))):
            continue
        changed = True
        offsets = [sum(-(-c // lanes) * lanes for c in sizes[:k]) for k in range(len(sizes))]
        where = np.concatenate([o + np.arange(c) for o, c in zip(offsets, sizes)])
        t = tensors[node.output]
        readers = graph.consumers(node.output)
        gapped = Tensor(t.name, (offsets[-1] + sizes[-1], *t.shape[1:]), t.qtype)
        if (readers and node.output not in graph.outputs
                and all(r.op == "conv" and not r.attrs["depthwise"]
                        and r.inputs == (node.output,) for r in readers)):
            spread[node.output] = where
            tensors[node.output] = gapped
            nodes[-1] = node.replace(attrs=dict(offsets=tuple(offsets)))
            continue
        blocks = f"{node.output}.blocks"
        tensors[blocks] = replace(gapped, name=blocks)
        nodes[-1] = node.replace(output=blocks, attrs=dict(offsets=tuple(offsets)))
        weight = np.zeros((t.channels, gapped.channels, 1, 1), np.int8)
        weight[np.arange(t.channels), where, 0, 0] = 1
        nodes.append(copy_conv(f"{node.name}.pack", blocks, node.output, weight))
    if not changed:
        return graph, False
    return graph.replace(nodes=nodes, tensors=tensors), True


def on_lane_blocks(graph: Graph, config: HwConfig) -> tuple[Graph, bool]:
    """The channel layout of ``config``'s lane blocks, before fusion: channel windows as
    views or copies, concat parts on block boundaries."""
    graph, views = channel_views_or_copies(graph, config)
    graph, concats = concat_parts_on_lane_blocks(graph, config)
    return check(graph), views or concats


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


def space_to_depth_strided_convs(graph: Graph, config: HwConfig) -> tuple[Graph, bool]:
    """A stride-2 normal convolution over few channels (a stem: ResNet's 7×7 over 3 channels)
    leaves most of the ``Ti`` input lanes of the array idle for ``kh·kw`` cycles per pixel. Rewritten as SpaceToDepth(2) (:func:`~.ir.space_to_depth_conv`) followed by a
    stride-1 convolution over ``4·C`` channels with a ``⌈(k + e)/2⌉`` kernel, it takes about a
    quarter of the taps. The rewrite is applied where :func:`~sfnpu.hw.conv_array.row_cycles`
    says the two take at most three quarters of the array cycles of the one on ``config`` —
    the margin pays for the added group's control and its feature map's traffic (a 3×3 stem
    over 3 channels, 9 → 4 + 4 taps, stays as it is).

    Exact: tap ``t`` of the original reads ``x[2o + t − p]``; with ``e = 2⌈p/2⌉ − p`` the new
    kernel's tap ``2a + b`` is the old tap ``2a + b − e`` and reads phase ``b`` of the
    SpaceToDepth pixel ``o + a − ⌈p/2⌉``. Every product of the original is computed once, the
    added taps weigh ``w − w_zp = 0``, and padding is the input zero point in both, so the int32
    accumulators — and everything after them — are identical.

    A network input that only the stem reads is rearranged by the host instead
    (:func:`space_to_depth_on_host`), so there the SpaceToDepth costs the array nothing and a
    3×3 stem over 3 channels pays too."""
    nodes, tensors, changed = [], dict(graph.tensors), False
    for node in graph.nodes:
        plan = _space_to_depth_plan(node, graph, config) if node.op == "conv" else None
        if plan is None:
            nodes.append(node)
            continue
        x = graph.tensors[node.inputs[0]]
        c, h, w = x.shape
        name = f"{node.output}.space_to_depth"
        tensors[name] = Tensor(name, (4 * c, h // 2, w // 2), x.qtype)
        nodes.append(space_to_depth_conv(f"{node.name}.space_to_depth", x.name, name, c))
        weight, pads = plan
        nodes.append(node.replace(inputs=(name,), attrs=dict(node.attrs, stride=(1, 1),
                                                             pads=pads),
                                  consts=dict(node.consts, weight=weight)))
        changed = True
    return (graph.replace(nodes=nodes, tensors=tensors), True) if changed else (graph, False)


def _host_rearranges(graph: Graph, tensor: str) -> bool:
    """Whether a rearrangement of ``tensor`` (its SpaceToDepth or a convolution's taps) can
    run in the host prologue instead of ``tensor``: a network input that one node reads and
    that is not itself an output."""
    return (tensor in graph.inputs and tensor not in graph.outputs
            and len(graph.consumers(tensor)) == 1)


def fold_input_taps(graph: Graph, config: HwConfig) -> tuple[Graph, tuple[InputTaps, ...]]:
    """A convolution over a network input with few channels (a stem: 3×3 over RGB) keeps ``C``
    of the array's ``Ti`` input lanes busy for ``kh·kw`` cycles per pixel. The host prologue
    hands the accelerator the window's taps as channels instead (:class:`~.ir.InputTaps`,
    im2col of the 8-bit codes, beside the input's quantisation):

    - where the whole kernel's taps fit one lane block (``kh·kw·C ≤ Ti``), the convolution
      becomes 1×1, stride 1, unpadded: one cycle per output pixel and block of output
      channels;
    - else, for a stride-1 convolution whose kernel rows fit (``kw·C ≤ Ti``: ResNet's 7×7 stem
      after SpaceToDepth, 4×4 over 12 channels), it becomes ``kh×1`` over the rows' taps:
      ``kh`` cycles instead of ``kh·kw``.

    Either way its input is one lane block per pixel it reads, at most as many as the input
    had, so the accelerator reads no more DRAM bytes. Exact: the same (code, weight) products
    in the same int32 sum, the padding the input zero point in both. Applies where it takes
    fewer array cycles, to a network input that only the convolution reads (run after the
    SpaceToDepth on the host as well). Returns the graph and the taps, each a new network
    input (:attr:`~.ir.InputTaps.name`)."""
    folded: list[InputTaps] = []
    nodes, tensors, inputs = [], dict(graph.tensors), list(graph.inputs)
    for node in graph.nodes:
        plan = _input_taps_plan(node, graph, config)
        if plan is None:
            nodes.append(node)
            continue
        taps, stride, pads = plan
        name = taps.name
        tensors[name] = Tensor(name, taps.out_shape, taps.qtype)
        del tensors[taps.source]
        inputs[inputs.index(taps.source)] = name
        nodes.append(node.replace(
            inputs=(name,), attrs=dict(node.attrs, stride=stride, pads=pads),
            consts=dict(node.consts, weight=taps.weights(node.consts["weight"]))))
        folded.append(taps)
    if not folded:
        return graph, ()
    return graph.replace(nodes=nodes, tensors=tensors, inputs=inputs), tuple(folded)


def _input_taps_plan(conv: Node, graph: Graph, config: HwConfig):
    """:func:`fold_input_taps`'s taps of ``conv`` and the stride and pads of the convolution
    over them, where the fold applies and pays."""
    if conv.op != "conv" or conv.attrs["depthwise"] or not _host_rearranges(graph,
                                                                            conv.inputs[0]):
        return None
    x = graph.tensors[conv.inputs[0]]
    o, c, kh, kw = conv.consts["weight"].shape
    (sh, sw), (top, left, bottom, right) = conv.attrs["stride"], conv.attrs["pads"]
    if kh * kw == 1:
        return None
    if kh * kw * c <= config.ti:
        taps = InputTaps(x.name, x.shape, (kh, kw), (sh, sw), conv.attrs["pads"], x.qtype)
        rows, stride, pads = 1, (1, 1), (0, 0, 0, 0)
    elif kw > 1 and kw * c <= config.ti and (sh, sw) == (1, 1):
        taps = InputTaps(x.name, x.shape, (1, kw), (1, 1), (0, left, 0, right), x.qtype)
        rows, stride, pads = kh, (1, 1), (top, 0, bottom, 0)
    else:
        return None
    _, out_w = taps.out_hw
    before = row_cycles(False, kh, kw, sw, out_w, c, o, config)
    after = row_cycles(False, rows, 1, 1, out_w, taps.out_shape[0], o, config)
    return (taps, stride, pads) if after < before else None


def space_to_depth_on_host(graph: Graph) -> tuple[Graph, dict[str, str]]:
    """A SpaceToDepth (:func:`~.ir.is_space_to_depth_conv`, quantised as its input) of a
    network input that nothing else reads moves into the host prologue, beside the input's
    quantisation: it is a pure rearrangement of the codes, and the accelerator's input becomes
    the rearranged tensor (a quarter of the pixels, four times the channels, the same bytes),
    so the group goes. Returns the graph and {new network input: the input it rearranges}."""
    moved: dict[str, str] = {}
    nodes, tensors, inputs = [], dict(graph.tensors), list(graph.inputs)
    for node in graph.nodes:
        x = node.inputs[0] if node.inputs else None
        if (node.op == "conv" and x is not None and _host_rearranges(graph, x)
                and is_space_to_depth_conv(node)
                and graph.tensors[node.output].qtype == graph.tensors[x].qtype):
            inputs[inputs.index(x)] = node.output
            del tensors[x]
            moved[node.output] = x
        else:
            nodes.append(node)
    if not moved:
        return graph, moved
    return graph.replace(nodes=nodes, tensors=tensors, inputs=inputs), moved


def _space_to_depth_axis(size: int, k: int, pad_a: int, pad_b: int
                         ) -> tuple[int, int, int, int] | None:
    """(shift e, new kernel K, new pads before/after) of one axis, or None when a pad is not
    below the kernel side, as :func:`sfnpu.isa.validate` requires."""
    out = (size + pad_a + pad_b - k) // 2 + 1
    before = -(-pad_a // 2)
    e = 2 * before - pad_a
    kernel = -(-(k + e) // 2)
    after = out - size // 2 - before + kernel - 1
    if not (0 <= after < kernel and before < kernel):
        return None
    return e, kernel, before, after


def space_to_depth_form(conv: Node, in_shape: tuple[int, int, int]):
    """The stride-1 convolution that computes ``conv`` (stride 2, normal) from the
    SpaceToDepth(2) of its input: (weights ``(O, 4·C, K, K')``, pads), or None when the input
    has an odd side or a new pad would not be below the new kernel side."""
    c, h, w = in_shape
    old = conv.consts["weight"]
    o, _, kh, kw = old.shape
    top, left, bottom, right = conv.attrs["pads"]
    rows, cols = _space_to_depth_axis(h, kh, top, bottom), _space_to_depth_axis(w, kw, left, right)
    if h % 2 or w % 2 or rows is None or cols is None:
        return None
    (ey, ky, top2, bottom2), (ex, kx, left2, right2) = rows, cols
    zero_points = np.asarray(conv.consts["weight_zp"], np.int8).reshape(-1, 1, 1, 1)
    weight = np.broadcast_to(zero_points, (o, 4 * c, ky, kx)).copy()   # added taps weigh 0
    for dy in range(2):
        for dx in range(2):
            phase = weight[:, (dy * 2 + dx) * c:(dy * 2 + dx + 1) * c]
            ty, tx = np.arange(ky) * 2 + dy - ey, np.arange(kx) * 2 + dx - ex
            ay, ax = (ty >= 0) & (ty < kh), (tx >= 0) & (tx < kw)
            phase[:, :, np.flatnonzero(ay)[:, None], np.flatnonzero(ax)[None, :]] = \
                old[:, :, ty[ay][:, None], tx[ax][None, :]]
    return weight, (top2, left2, bottom2, right2)


def _space_to_depth_plan(conv: Node, graph: Graph, config: HwConfig):
    """:func:`space_to_depth_form` of ``conv`` when the rewrite applies and saves a quarter of
    the array cycles on ``config``."""
    if conv.attrs["depthwise"] or conv.attrs["stride"] != (2, 2):
        return None
    shape = graph.tensors[conv.inputs[0]].shape
    form = space_to_depth_form(conv, shape)
    if form is None:
        return None
    c, h, w = shape
    o, _, kh, kw = conv.consts["weight"].shape
    _, _, ky, kx = form[0].shape
    _, out_h, out_w = graph.tensors[conv.output].shape
    before = out_h * row_cycles(False, kh, kw, 2, out_w, c, o, config)
    rearrange = 0 if _host_rearranges(graph, conv.inputs[0]) else \
        h // 2 * row_cycles(False, 2, 2, 2, w // 2, c, 4 * c, config)
    after = rearrange + out_h * row_cycles(False, ky, kx, 1, out_w, 4 * c, o, config)
    return form if 4 * after <= 3 * before else None
