"""Groups → instructions, parameter data and a DRAM image.

Every tensor a group writes gets a DRAM home (graph outputs in OUTPUT sections, the rest in
SCRATCH); on-chip placement and frame reuse come from the memory optimizer when it runs. The
parameter section holds, per group, the packed weights and the parameter block of
:func:`sfnpu.layout.param_sections`; identical blobs are stored once, so groups sharing a
weight tensor read the same bytes, and a group whose weights the weight store still holds
from the group before gets ``weights_held`` (:func:`sfnpu.limits.with_held_weights`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from typing import Mapping

import numpy as np

from sfnpu import image, isa, layout, numeric
from sfnpu.config import HwConfig
from sfnpu.isa import (Activation, ActOrder, ConvKind, Eltwise, Instruction, Pool, Reuse,
                       eltwise_reads_map)
from sfnpu.limits import overflows, with_held_weights

from . import tiling
from .groups import Group
from .ir import Graph, IRError, QType, channel_views, spatial_views

__all__ = ["Program", "generate", "CodegenError"]


class CodegenError(IRError):
    """A group the instruction set or the stores cannot take; names the group, and in
    :attr:`nodes` the IR nodes a partition can leave to the host instead, each with its
    reason."""

    def __init__(self, message: str, nodes: Mapping[str, str] | None = None):
        super().__init__(message)
        self.nodes = dict(nodes or {})


@dataclass
class Program:
    """A compiled program: instructions plus everything needed to (re)build its image."""
    config: HwConfig
    graph: Graph
    groups: list[Group]
    instructions: list[Instruction]
    params: bytes
    layout: image.ImageLayout
    inputs: list[str]                   # IR tensor per INPUT section
    outputs: list[str]                  # IR tensor per OUTPUT section
    locations: dict[str, isa.Location] = field(default_factory=dict)
    #: Window records read so far, by parameter-block offset (:meth:`window`).
    _windows: dict[int, layout.Geometry] = field(default_factory=dict, init=False, repr=False,
                                                 compare=False)

    def pack(self, inputs: list[np.ndarray]) -> bytes:
        """The DRAM image for these quantised ``(C, H, W)`` inputs."""
        return image.pack(self.layout, self.config, self.instructions, self.params, inputs)

    def window(self, instr: Instruction) -> layout.Geometry | None:
        """A windowed instruction's operand pitches, from the window record of its parameter
        block; None for an instruction on dense tensors. ``instr`` may be placed by any
        policy: placement moves operands, never parameter blocks."""
        if not instr.windowed:
            return None
        if (geo := self._windows.get(instr.params.offset)) is None:
            start = instr.params.offset - self.layout.base(image.SectionKind.PARAMS)
            block = self.params[start:start + layout.param_bytes(instr, self.config)]
            geo = self._windows[instr.params.offset] = layout.geometry(instr, self.config,
                                                                       block)
        return geo


def _tensor_desc(graph: Graph, name: str) -> image.TensorDesc:
    t = graph.tensors[name]
    return image.TensorDesc(*t.shape, signed=t.qtype.signed, zero_point=t.qtype.zero_point,
                            scale=t.qtype.scale)


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def _stage_names(group: Group) -> list[str]:
    """Each node's stage in layout.STAGES order."""
    names, seen_eltwise = [], False
    for n in group.nodes:
        if n.op == "channel_table":
            names.append("in_transform")
        elif n.op == "conv":
            names.append("conv")
        elif n.op == "table":
            names.append("act_after" if seen_eltwise else "act")
        elif n.op in ("add", "mul"):
            names.append("eltwise")
            seen_eltwise = True
        elif n.op in ("maxpool", "avgpool", "globalavgpool"):
            names.append("pool")
        else:
            names.append(n.op)
    return names


_POOLS = ("maxpool", "avgpool", "globalavgpool")


def _taken_apart(group: Group) -> tuple[Group, Group] | None:
    """A group as two where a stage that no tile can split stops it from being tiled: the
    input tables before a convolution (the tables alone can be sliced, which costs less than
    running the convolution in input-channel shares), or a pool after it (column strips
    cannot split a global or padded pool; the pool alone can be sliced by channel). None: nothing to take apart. The
    tensor between the two is the graph's own, with its quantisation, so both halves compute
    the same codes; the shortcut goes with the half holding the element-wise stage."""
    ops = [n.op for n in group.nodes]
    pools = [k for k, op in enumerate(ops) if op in _POOLS and k]
    if pools:
        k = pools[0]
    elif ops and ops[0] == "channel_table" and len(ops) > 1:
        k = 1
    else:
        return None
    between = group.nodes[k - 1].output

    def shortcut(ops_of_half):
        return group.shortcut if {"add", "mul"} & set(ops_of_half) else None

    return (replace(group, nodes=group.nodes[:k], output=between, dest=None, channel_offset=0,
                    origin=None, shortcut=shortcut(ops[:k])),
            replace(group, nodes=group.nodes[k:], input=between, shortcut=shortcut(ops[k:])))


class _Builder:
    def __init__(self, graph: Graph, config: HwConfig):
        self.graph, self.config = graph, config
        self.params = bytearray()
        self.blobs: dict[bytes, int] = {}
        self.spatial = spatial_views(graph)

    def add_params(self, blob: bytes) -> int:
        """The blob's offset in the parameter section; identical blobs (weights shared by
        several groups) are stored once."""
        if blob not in self.blobs:
            self.blobs[blob] = len(self.params)
            self.params += blob + bytes(-len(blob) % layout.param_align(self.config))
        return self.blobs[blob]

    def fail(self, group: Group, reason: str, node=None):
        """Refuse ``group``: because of ``node`` alone, or of the whole group."""
        message = f"group {group.index} ({group.name}): {reason}"
        raise CodegenError(message, {n.name: message for n in ([node] if node else group.nodes)})

    def instruction(self, group: Group) -> tuple[Instruction, dict, np.ndarray | None]:
        """The group's whole instruction (locations unset), its parameter arrays by section
        and its ONNX-shaped weights (None without a convolution)."""
        g = self.graph
        x = g.tensors[group.input]
        y = g.tensors[group.output]
        if group.channel_offset % self.config.lanes:
            concat = g.producer(group.dest)
            self.fail(group, f"concat {concat.name!r}: a part starts at channel "
                      f"{group.channel_offset}, inside a block of {self.config.lanes} lanes "
                      "(the accelerator writes whole blocks: run passes.on_lane_blocks "
                      "before fusion, which moves parts onto block boundaries)",
                      concat)
        f = dict(in_c=x.shape[0], in_h=x.shape[1], in_w=x.shape[2],
                 in_zp=x.qtype.zero_point, in_signed=int(x.qtype.signed),
                 out_c=y.shape[0], out_h=y.shape[1], out_w=y.shape[2],
                 out_zp=y.qtype.zero_point, out_signed=int(y.qtype.signed),
                 out_c_offset=group.channel_offset, reuse=Reuse.ROW)
        post = np.zeros(1, layout.POST_RECORD)
        arrays: dict[str, np.ndarray] = {}
        weights = None
        stage_in = x.qtype
        for node, stage in zip(group.nodes, _stage_names(group)):
            out_q = g.tensors[node.output].qtype
            if stage in layout.STAGES:
                k = layout.STAGES.index(stage)
                post["zp"][0, k] = out_q.zero_point
                post["signed"][0, k] = int(out_q.signed)
            if node.op == "channel_table":
                f["in_transform"] = isa.InputTransform.CHANNEL_TABLE
                arrays["channel_table"] = layout.pack_channel_tables(
                    node.consts["table"].view(np.uint8), self.config.lanes)
            elif node.op == "conv":
                weights = self.conv_fields(group, node, stage_in, out_q, f, arrays)
            elif node.op == "table":
                f["act"] = Activation.TABLE
                arrays["act_table"] = node.consts["table"].view(np.uint8)
            elif node.op in ("add", "mul"):
                b = g.tensors[group.shortcut]
                f["sc_zp"], f["sc_signed"] = b.qtype.zero_point, int(b.qtype.signed)
                if node.op == "add":
                    f["eltwise"] = Eltwise.ADD
                    # onnxruntime's operand A is ONNX input 0, whichever the group streams.
                    swap = node.inputs[0] == group.shortcut
                    qa, qb = (b.qtype, stage_in) if swap else (stage_in, b.qtype)
                    post["eltwise_const"][0] = numeric.qlinear_add_params(
                        qa.scale, qa.zero_point, qb.scale, qb.zero_point, out_q.scale,
                        out_q.zero_point)
                    post["eltwise_swap"][0] = int(swap)
                else:
                    streamed = g.tensors[node.inputs[0] if node.inputs[1] == group.shortcut
                                         else node.inputs[1]].shape
                    if b.shape[1:] == (1, 1):
                        f["eltwise"] = Eltwise.CHANNEL_SCALE
                    elif b.shape == streamed:
                        f["eltwise"] = Eltwise.MUL
                    else:
                        self.fail(group, f"node {node.name!r}: a product with a "
                                  f"{'×'.join(map(str, b.shape))} operand; the accelerator "
                                  "multiplies by a per-channel vector or by a map of the same "
                                  f"shape ({'×'.join(map(str, streamed))})", node)
                    post["eltwise_const"][0] = (numeric.qlinear_mul_multiplier(
                        stage_in.scale, b.qtype.scale, out_q.scale), 0, 0)
            elif node.op in ("maxpool", "avgpool", "globalavgpool"):
                self.pool_fields(group, node, f)
                x_hw = g.tensors[node.inputs[0]].shape[1:]
                if f["pool"] == Pool.GLOBAL_AVG:
                    post["pool_const"][0] = (numeric.global_avg_pool_multiplier(
                        stage_in.scale, out_q.scale, x_hw[0] * x_hw[1]), 0)
                elif f["pool"] == Pool.AVG:
                    post["pool_const"][0] = (stage_in.scale, out_q.scale)
            elif node.op == "resize":
                f["upsample"] = 1
            else:
                self.fail(group, f"node {node.name!r}: op {node.op} cannot join a group", node)
            stage_in = out_q
        stages = _stage_names(group)
        if "act" in stages and "eltwise" in stages:
            f["act_order"] = ActOrder.BEFORE_ELTWISE
        f.setdefault("conv", ConvKind.NONE)
        arrays["post"] = post
        return Instruction(**f), arrays, weights

    def tiles(self, group: Group) -> list[tuple[Group, Instruction, dict[str, int]]]:
        """The group's instruction — or its tiles' (compiler.tiling), each a group of its own
        reading and writing windows of the whole tensors — with DRAM locations still
        relative, and the parameter-section offsets of their weights and parameter blocks."""
        instr, arrays, weights = self.instruction(group)
        geometry, at = self.windows(group, instr)
        parts = _taken_apart(group)
        try:
            # Taking the group apart is cheaper than running it in input-channel shares.
            tiles = tiling.plan(instr, arrays, weights, self.config, geometry,
                                shares=parts is None)
        except tiling.TileError as e:
            if parts:
                return [t for part in parts for t in self.tiles(part)]
            self.fail(group, f"does not fit the on-chip stores of config {self.config.name!r} "
                      f"(nodes {', '.join(repr(n.name) for n in group.nodes)}): {e}. Use a "
                      "configuration with larger stores or a smaller input; the accelerator "
                      "would stop this layer with BUFFER_OVERFLOW")
        out = []
        for t in tiles:
            window = (at[0] + t.input_offset, at[1] + t.output_offset,
                      at[2] + t.shortcut_offset)
            label = t.label if t.count > 1 else "window" if t.instr.windowed else ""
            part = replace(group, part=label, window=window) if label else group
            arr = dict(t.arrays)
            if t.instr.windowed:
                arr["window"] = t.geometry.record()
            offsets = {}
            if t.weights is not None:
                offsets["weights"] = self.add_params(layout.pack_weights(t.weights, t.instr,
                                                                         self.config))
            offsets["params"] = self.add_params(layout.pack_params(t.instr, self.config,
                                                                   **arr))
            out.append((part, t.instr, offsets))
        return out

    def windows(self, group: Group, instr: Instruction
                ) -> tuple[layout.Geometry | None, tuple[int, int, int]]:
        """The pitches of the group's operands and the byte offsets of their windows when they
        are windows of larger tensors — an input or shortcut that is a spatial view, an output
        that is a stitched tile —; (None, zeros) for dense operands."""
        g, L, spatial = self.graph, self.config.lanes, self.spatial
        pitches, at = {}, [0, 0, 0]

        def window(tensor, r0, c0, role, k):
            _, h, w = g.tensors[tensor].shape
            pitches[f"{role}_row"], pitches[f"{role}_plane"] = w * L, h * w * L
            at[k] = r0 * w * L + c0 * L

        if group.input in spatial:
            window(*spatial[group.input], "in", 0)
        if group.origin is not None:
            window(group.dest, *group.origin, "out", 1)
        if group.shortcut in spatial:
            if not eltwise_reads_map(instr.eltwise):
                self.fail(group, f"reads the vector {group.shortcut!r} as a spatial window")
            window(*spatial[group.shortcut], "sc", 2)
        if not pitches:
            return None, (0, 0, 0)
        return replace(layout.Geometry.dense(instr, L), **pitches), tuple(at)

    def conv_fields(self, group, node, x_q: QType, y_q: QType, f, arrays) -> np.ndarray:
        w = node.consts["weight"]
        depthwise = node.attrs["depthwise"]
        f["conv"] = ConvKind.DEPTHWISE if depthwise else ConvKind.NORMAL
        f["kh"], f["kw"] = w.shape[2], w.shape[3]
        f["sh"], f["sw"] = node.attrs["stride"]
        (f["pad_top"], f["pad_left"], f["pad_bottom"], f["pad_right"]) = node.attrs["pads"]
        arrays["bias"] = node.consts["bias"]
        arrays["multiplier"] = numeric.requant_multiplier(x_q.scale, node.consts["weight_scale"],
                                                          y_q.scale)
        arrays["weight_zp"] = node.consts["weight_zp"]
        return w

    def pool_fields(self, group, node, f):
        if node.op == "globalavgpool":
            f["pool"] = Pool.GLOBAL_AVG
            return
        (kh, kw), (sh, sw), pads = node.attrs["kernel"], node.attrs["stride"], node.attrs["pads"]
        if node.op == "avgpool" and (kh, kw) == self.graph.tensors[node.inputs[0]].shape[1:] \
                and not any(pads):
            f["pool"] = Pool.GLOBAL_AVG  # onnxruntime takes the global-pool path here too
            return
        if kh != kw or sh != sw or len(set(pads)) != 1:
            self.fail(group, f"pooling {kh}x{kw} stride {sh}x{sw} pads {pads}: the accelerator "
                      "pools with square windows and equal padding on every side", node)
        f["pool"] = Pool.MAX if node.op == "maxpool" else Pool.AVG
        f["pool_size"], f["pool_stride"], f["pool_pad"] = kh, sh, pads[0]
        if node.op == "avgpool":
            f["pool_count_pad"] = node.attrs["count_include_pad"] if pads[0] else 0


def generate(graph: Graph, groups: list[Group], config: HwConfig) -> Program:
    """Emit one instruction per group and plan the DRAM image."""
    b = _Builder(graph, config)
    drafts, refused = [], []
    for gr in groups:
        try:
            drafts += b.tiles(gr)
        except CodegenError as e:
            refused.append(e)
    if refused:     # every such group at once, for a partition to leave them all to the host
        more = f" (and {len(refused) - 1} more groups)" if len(refused) > 1 else ""
        raise CodegenError(str(refused[0]) + more,
                           {n: why for e in refused for n, why in e.nodes.items()})
    groups = [replace(gr, index=k) for k, (gr, _, _) in enumerate(drafts)]
    drafts = [(instr, offsets) for _, instr, offsets in drafts]

    lanes = config.lanes
    inputs, outputs = list(graph.inputs), list(graph.outputs)
    scratch, scratch_bytes = {}, 0
    for gr in groups:
        name = gr.written
        if name in outputs or name in scratch:
            continue
        scratch[name] = scratch_bytes
        t = graph.tensors[name]
        scratch_bytes = _align(scratch_bytes + layout.tensor_bytes(*t.shape, lanes),
                               image.SECTION_ALIGN)
    plan = image.plan(len(groups), len(b.params), [_tensor_desc(graph, n) for n in inputs],
                      [_tensor_desc(graph, n) for n in outputs], scratch_bytes, lanes)

    locations = {}
    for i, name in enumerate(inputs):
        locations[name] = isa.dram(plan.base(image.SectionKind.INPUT, i))
    for i, name in enumerate(outputs):
        locations[name] = isa.dram(plan.base(image.SectionKind.OUTPUT, i))
    for name, offset in scratch.items():
        locations[name] = isa.dram(plan.base(image.SectionKind.SCRATCH) + offset)
    for view, (source, start) in channel_views(graph).items():
        if source in locations:     # channel blocks are whole planes: a view is an offset
            h, w = graph.tensors[source].shape[1:]
            offset = layout.tensor_bytes(start, h, w, lanes)
            locations[view] = locations[source].replace(
                offset=locations[source].offset + offset)

    params_base = plan.base(image.SectionKind.PARAMS)
    program = []
    for n, (gr, (instr, offsets)) in enumerate(zip(groups, drafts)):
        for name in (gr.input, gr.shortcut):
            if name is not None and name not in locations:
                b.fail(gr, f"reads {name!r}, which no earlier group writes")
        changes = dict(gr.locate(locations), params=isa.dram(params_base + offsets["params"]),
                       last=int(n == len(groups) - 1))
        if "weights" in offsets:
            changes["weights"] = isa.dram(params_base + offsets["weights"])
        program.append(instr.replace(**changes))
    program = with_held_weights(program, config)
    for gr, instr in zip(groups, program):
        try:
            isa.validate(instr)
        except isa.InstructionError as e:
            b.fail(gr, str(e))
        if problems := overflows(instr, config):    # tiling.plan makes every tile fit
            raise AssertionError(f"group {gr.index} ({gr.name}): {'; '.join(problems)}")
    return Program(config, graph, list(groups), program, bytes(b.params), plan, inputs,
                   outputs, locations)
