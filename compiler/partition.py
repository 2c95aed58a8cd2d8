"""Partitioned execution: the accelerator runs every node it can, wherever it is in the graph;
onnxruntime runs the rest on the host.

The tolerant import (:func:`~.importer.classify_nodes`) marks each compute node of the QDQ model
as accelerated or left to the host (with the reason). A node's *level* counts the host → 
accelerator crossings before it: accelerated nodes at level ``k`` form accelerator segment
``k``; host nodes at level ``k`` run after it and before accelerator segment ``k + 1`` (level
-1: before the first). Each segment is a sub-model of the QDQ model; the Quantize/Dequantize
and Constant nodes go with the nodes that use them, so every tensor that crosses from an
accelerator segment to another segment is a tensor of 8-bit codes (the output of its
QuantizeLinear), handed over through the segment images' output and input regions unchanged.
Accelerator segments compile with :func:`~.pipeline.compile_model` like any model (their code
inputs need no quantisation); host segments run on onnxruntime. The result equals
onnxruntime's on the whole QDQ model, bit for bit: every segment computes exactly the nodes
onnxruntime would, on the same codes.

A model the accelerator runs in one piece (host work only before its inputs' quantisation and
after its outputs, none of it convolution or pooling) compiles as it always did: one segment,
:class:`~.pipeline.Compiled`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import onnx

from sfnpu.config import HwConfig

from .codegen import CodegenError
from .importer import _ALIASES, _MUST_ACCELERATE, Classification, ModelError, classify_nodes
from .pipeline import (Compiled, PipelineConfig, _session, check_inputs, compile_model,
                       run_onnxruntime)

__all__ = ["AcceleratorSegment", "HostNode", "HostSegment", "Partitioned", "SideProfile",
           "compile_partitioned", "profile"]

_GLUE = {"QuantizeLinear", "DequantizeLinear", "Constant"}
ACC, HOST = 0, 1


@dataclass(frozen=True)
class HostNode:
    name: str
    op: str
    reason: str
    macs: int


@dataclass(frozen=True)
class HostSegment:
    """Nodes onnxruntime runs between two accelerator segments."""
    level: int
    model: onnx.ModelProto
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: tuple[HostNode, ...]

    def run(self, values: Mapping[str, np.ndarray], accelerator) -> dict:
        return run_onnxruntime(self.model, {n: values[n] for n in self.inputs})


@dataclass(frozen=True)
class AcceleratorSegment:
    """A sub-model the accelerator runs: one program, one DRAM image."""
    level: int
    compiled: Compiled
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    macs: int

    def run(self, values: Mapping[str, np.ndarray], accelerator) -> dict:
        return self.compiled.run({n: values[n] for n in self.inputs}, accelerator)


@dataclass(frozen=True)
class Partitioned:
    """A model as accelerator and host segments, run in order."""
    segments: tuple[AcceleratorSegment | HostSegment, ...]
    outputs: tuple[str, ...]
    onnx_nodes: int
    model_inputs: tuple[onnx.ValueInfoProto, ...]

    @property
    def input_names(self) -> list[str]:
        """The model inputs :meth:`run` takes."""
        return [i.name for i in self.model_inputs]

    @property
    def accelerated(self) -> tuple[AcceleratorSegment, ...]:
        return tuple(s for s in self.segments if isinstance(s, AcceleratorSegment))

    @property
    def host_nodes(self) -> tuple[HostNode, ...]:
        return tuple(n for s in self.segments if isinstance(s, HostSegment) for n in s.nodes)

    @property
    def mac_share(self) -> float:
        """The share of the model's convolution MACs the accelerator computes."""
        acc = sum(s.macs for s in self.accelerated)
        total = acc + sum(n.macs for n in self.host_nodes)
        return acc / total if total else 1.0

    def run(self, feeds: Mapping[str, np.ndarray],
            accelerator: Callable[[bytes], list[np.ndarray]]) -> dict:
        """The model's outputs: each segment in order, the accelerator segments' images run by
        ``accelerator`` (image bytes → output arrays)."""
        check_inputs(self.model_inputs, feeds)
        values = dict(feeds)
        for segment in self.segments:
            values.update(segment.run(values, accelerator))
        return {name: values[name] for name in self.outputs}


@dataclass(frozen=True)
class SideProfile:
    """What one side (accelerator or host) of a partitioned model does."""
    segments: int
    macs: int
    seconds: float      # accelerator: the cycle model's; host: onnxruntime measured here
    dram_bytes: int     # accelerator: the cycle model's reads + writes; host: the codes it
    #                     reads from and writes to the images' regions


def profile(partitioned: Partitioned, config: HwConfig) -> dict[str, SideProfile]:
    """The accelerator's and the host's share of the work: MACs; time, from the cycle model
    (accelerator segments, data-independent) or measured once on onnxruntime with zero inputs,
    its session made beforehand (host segments); DRAM bytes."""
    import time

    from sfnpu.sim.cycle import CycleModel

    acc = [CycleModel(config).run(s.compiled.zero_image()) for s in partitioned.accelerated]
    sides = {"accelerator": SideProfile(len(acc), sum(s.macs for s in partitioned.accelerated),
                                        sum(r.seconds for r in acc),
                                        sum(r.read_bytes + r.write_bytes for r in acc))}
    hosts = [s for s in partitioned.segments if isinstance(s, HostSegment)]
    seconds = dram = 0
    for segment in hosts:
        g = segment.model.graph
        feeds = {i.name: np.zeros([d.dim_value for d in i.type.tensor_type.shape.dim],
                                  onnx.helper.tensor_dtype_to_np_dtype(
                                      i.type.tensor_type.elem_type)) for i in g.input}
        session = _session(segment.model)      # its creation is set-up, not run time
        t0 = time.perf_counter()
        out = dict(zip((o.name for o in session.get_outputs()), session.run(None, feeds)))
        seconds += time.perf_counter() - t0
        dram += sum(v.nbytes for v in feeds.values()) + sum(v.nbytes for v in out.values())
    sides["host"] = SideProfile(len(hosts), sum(n.macs for n in partitioned.host_nodes),
                                seconds, dram)
    return sides


def compile_partitioned(src, config: HwConfig, pipeline: PipelineConfig = PipelineConfig()
                        ) -> Compiled | Partitioned:
    """The model as one :class:`Compiled` where the accelerator runs it in one piece, else as
    :class:`Partitioned` segments. A node the import accepts but code generation cannot
    express (a pooling window the instruction set lacks, say) goes to the host and the
    model is partitioned again; so does a group too large for the configuration's stores,
    until the compiler tiles it."""
    cls = classify_nodes(src)
    refused: dict[str, str] = {}
    while True:
        plan = _Plan(cls, refused)
        try:
            if plan.in_one_piece():
                try:
                    return compile_model(src, config, pipeline)
                except ModelError:
                    pass    # a node after the accelerated part that the whole-model import
                    #         refuses (a Split of a reshaped head): the host segment runs it
            return plan.build(config, pipeline)
        except CodegenError as e:
            new = {plan.onnx_name(n): why for n, why in e.nodes.items()}
            new = {n: why for n, why in new.items() if n and n not in refused}
            if not new:
                raise
            refused.update(new)


def macs(node: onnx.NodeProto, shapes: Mapping[str, tuple[int, ...]]) -> int:
    """Multiply-accumulates of a convolution or matrix product (0 for other nodes)."""
    out = shapes.get(node.output[0]) if node.output else None
    if out is None or node.op_type not in ("Conv", "ConvTranspose", "Gemm", "MatMul"):
        return 0
    weight = shapes.get(node.input[1])
    if weight is None:
        return 0
    if node.op_type == "Conv":
        return int(np.prod(out)) * int(np.prod(weight[1:]))
    if node.op_type == "ConvTranspose":
        return int(np.prod(shapes.get(node.input[0], (0,)))) * int(np.prod(weight[1:]))
    return int(np.prod(out)) * int(weight[0] if node.op_type == "MatMul" or not any(
        a.name == "transB" and a.i for a in node.attribute) else weight[1])


class _Plan:
    """Levels and segment membership of every node of a classified model."""

    def __init__(self, cls: Classification, refused: Mapping[str, str] = {}):
        self.cls = cls
        g = cls.model.graph
        self.nodes = list(g.node)
        self.names = {n.name: k for k, n in enumerate(self.nodes) if n.name}
        self.producer = {o: k for k, n in enumerate(self.nodes) for o in n.output}
        self.consumers: dict[str, list[int]] = {}
        for k, n in enumerate(self.nodes):
            for i in n.input:
                self.consumers.setdefault(i, []).append(k)
        self.graph_outputs = {o.name for o in g.output}
        self.infos = {vi.name: vi for vi in [*g.input, *g.value_info, *g.output]}
        self.shapes = {name: tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
                       for name, vi in self.infos.items()}
        for t in g.initializer:
            self.shapes[t.name] = tuple(t.dims)
        self.accelerated = set(cls.accelerated)
        self.host_reasons = dict(cls.host_reasons)
        for name, reason in refused.items():
            self.accelerated.discard(self.names[name])
            self.host_reasons[self.names[name]] = reason
        self.level = self._levels()
        while self._drop_empty_levels():
            self.level = self._levels()
        self.members = self._members()

    def is_accelerated(self, k: int) -> bool:
        return k in self.accelerated

    def onnx_name(self, ir_name: str) -> str | None:
        """The ONNX node an IR node came from (a pass names what it adds
        ``<onnx name>.<suffix>``)."""
        while ir_name not in self.names and "." in ir_name:
            ir_name = ir_name.rsplit(".", 1)[0]
        return ir_name if ir_name in self.names else None

    def _drop_empty_levels(self) -> bool:
        """An accelerator level of reshapes only computes nothing: its nodes go to the host
        (where they cost nothing either). True if any did."""
        by_level: dict[int, list[int]] = {}
        for k, lv in self.level.items():
            if self.is_accelerated(k):
                by_level.setdefault(lv, []).append(k)
        dropped = False
        for nodes in by_level.values():
            if all(self.nodes[k].op_type in _ALIASES for k in nodes):
                for k in nodes:
                    self.accelerated.discard(k)
                    self.host_reasons[k] = ("a reshape with nothing for the accelerator to "
                                            "compute beside it")
                dropped = True
        # A reshape of a host result that no accelerator node reads would be an output of
        # its segment that the segment does not compute (only renames an input).
        for k in sorted(self.accelerated):
            if self.nodes[k].op_type in _ALIASES and not any(
                    self.is_accelerated(p) for p in self.compute_producers(k)) and not any(
                    self.is_accelerated(c) for c in self.compute_consumers(k)):
                self.accelerated.discard(k)
                self.host_reasons[k] = "a reshape of a host result that the host reads"
                dropped = True
        return dropped

    def compute_consumers(self, k: int) -> set[int]:
        """The compute nodes that read node ``k``'s results, through Q/DQ nodes."""
        found, stack = set(), list(self.nodes[k].output)
        while stack:
            for c in self.consumers.get(stack.pop(), ()):
                if self.nodes[c].op_type in _GLUE:
                    stack.extend(self.nodes[c].output)
                else:
                    found.add(c)
        return found

    def compute_producers(self, k: int) -> set[int]:
        """The compute nodes whose results node ``k`` reads, through Q/DQ nodes."""
        found, stack = set(), [i for i in self.nodes[k].input if i]
        while stack:
            p = self.producer.get(stack.pop())
            if p is None or self.nodes[p].op_type == "Constant":
                continue
            if self.nodes[p].op_type in _GLUE:
                stack.extend(i for i in self.nodes[p].input[:1] if i)
            else:
                found.add(p)
        return found

    def _levels(self) -> dict[int, int]:
        level = {}
        for k, node in enumerate(self.nodes):
            if node.op_type in _GLUE:
                continue
            acc = self.is_accelerated(k)
            lv = 0 if acc else -1
            for p in self.compute_producers(k):
                crossing = acc and not self.is_accelerated(p)
                lv = max(lv, level[p] + crossing)
            level[k] = lv
        return level

    def key(self, k: int) -> tuple[int, int]:
        return (self.level[k], ACC if self.is_accelerated(k) else HOST)

    def _members(self) -> dict[int, set[tuple[int, int]]]:
        """The segments each node belongs to: compute nodes and the QuantizeLinear of their
        output to their own; Dequantize, Constant and input Quantize nodes to every segment
        that reads them (they are pure, so running them twice costs nothing)."""
        members: dict[int, set[tuple[int, int]]] = {}
        for k, node in enumerate(self.nodes):
            if node.op_type not in _GLUE:
                members[k] = {self.key(k)}
            elif node.op_type == "QuantizeLinear":
                producers = self.compute_producers(k)
                if producers:
                    members[k] = {self.key(max(producers))}
        for k in reversed(range(len(self.nodes))):
            if k in members:
                continue
            found = set()
            for out in self.nodes[k].output:
                for c in self.consumers.get(out, []):
                    found |= members.get(c, set())
                if out in self.graph_outputs:
                    producers = self.compute_producers(k)
                    found.add((self.level[max(producers)], HOST) if producers else (-1, HOST))
            members[k] = found
        return members

    def in_one_piece(self) -> bool:
        """Today's single program: no host compute before the accelerator, one accelerator
        level, and no convolution or pooling left to the host."""
        for k, lv in self.level.items():
            if self.is_accelerated(k):
                if lv > 0:
                    return False
            elif lv < 0 or self.nodes[k].op_type in _MUST_ACCELERATE:
                return False
        return any(self.is_accelerated(k) for k in self.level)

    def build(self, config: HwConfig, pipeline: PipelineConfig) -> Partitioned:
        keys = sorted({key for ks in self.members.values() for key in ks})
        produced_by = {key: {o for k, ks in self.members.items() if key in ks
                             for o in self.nodes[k].output} for key in keys}
        segments = []
        for key in keys:
            indices = sorted(k for k, ks in self.members.items() if key in ks)
            inputs, outputs = self._boundary(key, indices, produced_by)
            model = self._submodel(indices, inputs, outputs, f"segment{len(segments)}")
            computes = [k for k in indices if k in self.level]
            if key[1] == ACC:
                try:
                    compiled = compile_model(model, config, pipeline)
                except ModelError as e:
                    raise ModelError(f"accelerator segment {len(segments)} (level {key[0]}): "
                                     f"{e}") from None
                segments.append(AcceleratorSegment(
                    key[0], compiled, inputs, outputs,
                    sum(macs(self.nodes[k], self.shapes) for k in computes)))
            else:
                segments.append(HostSegment(key[0], model, inputs, outputs, tuple(
                    HostNode(self.nodes[k].name or self.nodes[k].output[0],
                             self.nodes[k].op_type, self.host_reasons.get(
                                 k, "follows a node the host runs"),
                             macs(self.nodes[k], self.shapes)) for k in computes)))
        g = self.cls.model.graph
        initializers = {t.name for t in g.initializer}
        return Partitioned(tuple(segments), tuple(o.name for o in g.output), len(self.nodes),
                           tuple(i for i in g.input if i.name not in initializers))

    def _boundary(self, key, indices, produced_by) -> tuple[tuple[str, ...], tuple[str, ...]]:
        initializers = {t.name for t in self.cls.model.graph.initializer}
        mine = produced_by[key]
        reads = {i for k in indices for i in self.nodes[k].input if i}
        inputs = sorted(reads - mine - initializers)
        outputs = set()
        for other, theirs in produced_by.items():
            if other == key:
                continue
            for k, ks in self.members.items():
                if other in ks:
                    outputs |= {i for i in self.nodes[k].input if i in mine and i not in theirs}
        outputs |= mine & self.graph_outputs
        return tuple(inputs), tuple(sorted(outputs))

    def _submodel(self, indices, inputs, outputs, name) -> onnx.ModelProto:
        model = self.cls.model
        nodes = [self.nodes[k] for k in indices]
        needed = {i for n in nodes for i in n.input}
        initializers = [t for t in model.graph.initializer if t.name in needed]

        def info(tensor: str) -> onnx.ValueInfoProto:
            if tensor not in self.infos:
                raise ModelError(f"tensor {tensor!r} crosses between the accelerator and the "
                                 "host but its type is unknown after shape inference")
            return self.infos[tensor]

        graph = onnx.helper.make_graph(nodes, f"{model.graph.name}_{name}",
                                       [info(t) for t in inputs], [info(t) for t in outputs],
                                       initializers)
        sub = onnx.helper.make_model(graph, opset_imports=model.opset_import)
        sub.ir_version = model.ir_version
        return sub
