"""The compiler's intermediate representation: a quantised dataflow graph.

Every tensor is an 8-bit feature map ``(C, H, W)`` (batch 1) with one :class:`QType`. Every node
is one quantised operator in onnxruntime's sense — its inputs are dequantised, it computes, and
its output is quantised again — so the IR carries exactly the information the numeric contract
(:mod:`sfnpu.numeric`) needs. Nodes and graphs are frozen; passes build new ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

__all__ = ["QType", "Tensor", "Node", "Graph", "IRError", "OPS", "check", "space_to_depth_conv",
           "is_space_to_depth_conv", "InputTaps"]


class IRError(ValueError):
    """A graph that breaks an IR invariant; names the node or tensor."""


@dataclass(frozen=True)
class QType:
    """Quantisation of an 8-bit tensor: ``real = scale · (q − zero_point)``."""
    scale: float          # a float32 value
    zero_point: int
    signed: bool

    def __post_init__(self):
        object.__setattr__(self, "scale", float(np.float32(self.scale)))
        lo, hi = self.range
        if not lo <= self.zero_point <= hi:
            raise IRError(f"zero point {self.zero_point} outside {lo}..{hi}")
        if not self.scale > 0:
            raise IRError(f"scale {self.scale} must be positive")

    @property
    def range(self) -> tuple[int, int]:
        return (-128, 127) if self.signed else (0, 255)

    @property
    def dtype(self):
        return np.int8 if self.signed else np.uint8


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, int, int]       # (C, H, W)
    qtype: QType

    @property
    def channels(self) -> int:
        return self.shape[0]


def _freeze(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


#: Operators of the IR and the attributes and constants each carries.
#:   conv         attrs: stride (sh, sw), pads (t, l, b, r), depthwise (bool)
#:                consts: weight int8 (O, I, kh, kw), weight_scale f32 (O,),
#:                        weight_zp int8 (O,), bias int32 (O,)
#:   maxpool      attrs: kernel, stride, pads (t, l, b, r)          (output qtype = input)
#:   avgpool      attrs: kernel, stride, pads, count_include_pad
#:   globalavgpool
#:   add, mul     two inputs; mul's second input is a (C, 1, 1) channel vector
#:   concat       n inputs along channels; attrs: offsets (optional) — each part's first
#:                channel in the result when gaps keep parts on lane blocks
#:   slice        attrs: start — channels [start, start + C_out) of the input (Split, Slice):
#:                a view of the input in DRAM, or a one-hot 1x1 convolution
#:                (passes.channel_views_or_copies decides per configuration)
#:   resize       attrs: scale (2)                                   (nearest)
#:   table        consts: table uint8/int8 (256,) — an exact 8-bit → 8-bit unary op
#:   channel_table consts: table uint8/int8 (C, 256) — one per channel (BatchNorm in QDQ)
#:   crop         attrs: origin (r0, c0) — rows [r0, r0 + H_out) and columns [c0, c0 + W_out)
#:                of the input: a view read in place through windowed addressing
#:   stitch       n inputs; attrs: origins ((r0, c0), …) — each input is the tile of the
#:                output at its origin (a spatial concat): tiles are written in place
OPS = ("conv", "maxpool", "avgpool", "globalavgpool", "add", "mul", "concat", "resize", "table",
       "channel_table", "slice", "crop", "stitch")


@dataclass(frozen=True)
class Node:
    name: str                 # the ONNX node it came from (for messages)
    op: str
    inputs: tuple[str, ...]
    output: str
    attrs: Mapping[str, Any] = field(default_factory=dict)
    consts: Mapping[str, np.ndarray] = field(default_factory=dict, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "attrs", _freeze(self.attrs))
        object.__setattr__(self, "consts", _freeze(self.consts))

    def replace(self, **changes) -> "Node":
        return replace(self, **changes)


@dataclass(frozen=True)
class Graph:
    tensors: Mapping[str, Tensor]
    nodes: tuple[Node, ...]           # topological order
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def __post_init__(self):
        object.__setattr__(self, "tensors", _freeze(self.tensors))
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))

    def producer(self, tensor: str) -> Node | None:
        return next((n for n in self.nodes if n.output == tensor), None)

    def consumers(self, tensor: str) -> list[Node]:
        return [n for n in self.nodes if tensor in n.inputs]

    def replace(self, **changes) -> "Graph":
        return replace(self, **changes)


def check(graph: Graph) -> Graph:
    """Verify the invariants every pass must keep; returns the graph for chaining."""
    defined = set(graph.inputs)
    for name in graph.inputs:
        if name not in graph.tensors:
            raise IRError(f"graph input {name!r} has no tensor")
    for node in graph.nodes:
        if node.op not in OPS:
            raise IRError(f"node {node.name!r}: unknown IR op {node.op!r}")
        for name in node.inputs:
            if name not in defined:
                raise IRError(f"node {node.name!r} ({node.op}) reads {name!r} before it is "
                              "produced")
        if node.output in defined:
            raise IRError(f"node {node.name!r} ({node.op}) writes {node.output!r} again")
        if node.output not in graph.tensors:
            raise IRError(f"node {node.name!r} ({node.op}) output {node.output!r} has no "
                          "tensor")
        defined.add(node.output)
    for name in graph.outputs:
        if name not in defined:
            raise IRError(f"graph output {name!r} is never produced")
    return graph


def is_space_to_depth_conv(node: Node) -> bool:
    """Whether ``node`` is exactly :func:`space_to_depth_conv` of its input (a pure
    rearrangement when its output is quantised as its input)."""
    if node.op != "conv" or node.attrs.get("depthwise") or node.attrs.get("stride") != (2, 2) \
            or node.attrs.get("pads") != (0, 0, 0, 0):
        return False
    weight = node.consts.get("weight")
    if weight is None or weight.ndim != 4 or weight.shape[2:] != (2, 2) \
            or weight.shape[0] != 4 * weight.shape[1]:
        return False
    ref = space_to_depth_conv(node.name, node.inputs[0], node.output, weight.shape[1])
    return set(node.consts) == set(ref.consts) and all(
        np.array_equal(node.consts[k], v) for k, v in ref.consts.items())


@dataclass(frozen=True)
class InputTaps:
    """The window taps of a convolution over a network input, laid out as channels (im2col):
    channel ``(ty·kw + tx)·C + c`` of output pixel ``(i, j)`` is
    ``x[c, sh·i + ty − top, sw·j + tx − left]``, the input's zero point where that falls in
    the padding. A convolution whose whole kernel the taps cover is then a 1×1 convolution
    over them with the same products; one whose rows they cover (kernel ``(1, kw)``, the
    convolution's horizontal stride and padding) a ``kh×1`` convolution with its vertical
    stride and padding (:meth:`weights`)."""
    source: str                        # the network input it is taken of
    shape: tuple[int, int, int]        # the source's (C, H, W)
    kernel: tuple[int, int]            # (kh, kw)
    stride: tuple[int, int]
    pads: tuple[int, int, int, int]    # (top, left, bottom, right)
    qtype: QType                       # the source's (its zero point pads)

    @property
    def name(self) -> str:
        """The network input the taps become."""
        return f"{self.source}.taps"

    @property
    def out_hw(self) -> tuple[int, int]:
        _, h, w = self.shape
        (kh, kw), (sh, sw), (top, left, bottom, right) = self.kernel, self.stride, self.pads
        return (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1

    @property
    def out_shape(self) -> tuple[int, int, int]:
        kh, kw = self.kernel
        return (kh * kw * self.shape[0], *self.out_hw)

    def weights(self, weight: np.ndarray) -> np.ndarray:
        """The weights over the taps of a ``(O, C, kh, kw)`` kernel: ``(O, kh·kw·C, 1, 1)``
        when the taps cover the whole kernel, ``(O, kw·C, kh, 1)`` when they cover its rows."""
        o, c, kh, kw = weight.shape
        per_pixel = weight.transpose(0, 2, 3, 1)                        # (O, kh, kw, C)
        if self.kernel == (kh, kw):
            return np.ascontiguousarray(per_pixel.reshape(o, kh * kw * c, 1, 1))
        if self.kernel != (1, kw):
            raise ValueError(f"taps {self.kernel} cover neither the {kh}×{kw} kernel nor "
                             "its rows")
        return np.ascontiguousarray(per_pixel.reshape(o, kh, kw * c).transpose(0, 2, 1)
                                    [..., None])

    def windows(self) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """Each tap's (start, end) rows and columns in the padded input, in channel order;
        rows step by ``sh``, columns by ``sw``."""
        (kh, kw), (sh, sw) = self.kernel, self.stride
        oh, ow = self.out_hw
        return [((ty, ty + sh * (oh - 1) + 1), (tx, tx + sw * (ow - 1) + 1))
                for ty in range(kh) for tx in range(kw)]

    def apply(self, x: np.ndarray) -> np.ndarray:
        """The taps of ``x`` (C, H, W) as numpy computes them — the reference the host's
        onnxruntime prologue is tested against."""
        (sh, sw), (top, left, bottom, right) = self.stride, self.pads
        padded = np.pad(x, ((0, 0), (top, bottom), (left, right)),
                        constant_values=self.qtype.zero_point)
        return np.concatenate([padded[:, y0:y1:sh, x0:x1:sw]
                               for (y0, y1), (x0, x1) in self.windows()])


def copy_conv(name: str, source: str, output: str, weight: np.ndarray,
              stride: tuple[int, int] = (1, 1)) -> Node:
    """A convolution with one-hot ``weight`` that copies codes: with the output quantised as
    the input, the requantisation is by exactly 1.0 (an output channel without weights gives
    the zero point)."""
    out = weight.shape[0]
    return Node(name, "conv", (source,), output,
                attrs=dict(stride=stride, pads=(0, 0, 0, 0), depthwise=False),
                consts=dict(weight=weight, weight_scale=np.ones(out, np.float32),
                            weight_zp=np.zeros(out, np.int8), bias=np.zeros(out, np.int32)))


def channel_pad_conv(name: str, source: str, output: str, channels: int, before: int,
                     after: int) -> Node:
    """Zero channels before and after a map as a 1×1 convolution with one-hot weights: output
    channel ``before + c`` copies ``x[c]``, the others give the zero point."""
    weight = np.zeros((before + channels + after, channels, 1, 1), np.int8)
    weight[before + np.arange(channels), np.arange(channels), 0, 0] = 1
    return copy_conv(name, source, output, weight)


def channel_select_conv(name: str, source: str, output: str, channels: int, start: int,
                        count: int) -> Node:
    """Channels ``[start, start + count)`` of a ``channels``-channel map as a 1×1 convolution
    with one-hot weights (a channel window that is no view on this configuration)."""
    weight = np.zeros((count, channels, 1, 1), np.int8)
    weight[np.arange(count), start + np.arange(count), 0, 0] = 1
    return copy_conv(name, source, output, weight)


def channel_views(graph: Graph) -> dict[str, tuple[str, int]]:
    """Each view — a ``slice`` output, or a ``crop`` (a spatial window, at channel 0) — → (the
    tensor it is a window of, its first channel there), through views of views to a tensor
    that is no view. Every reader of a view reads that tensor in place."""
    views: dict[str, tuple[str, int]] = {}
    for node in graph.nodes:
        if node.op in ("slice", "crop"):
            source, start = views.get(node.inputs[0], (node.inputs[0], 0))
            views[node.output] = (source, start + node.attrs.get("start", 0))
    return views


def spatial_views(graph: Graph) -> dict[str, tuple[str, int, int]]:
    """Each ``crop`` output → (the tensor whose rows and columns it windows, the window's
    first row and column there), through crops of crops; that tensor may be a channel view,
    which has its source's rows and columns."""
    views: dict[str, tuple[str, int, int]] = {}
    for node in graph.nodes:
        if node.op == "crop":
            r0, c0 = node.attrs["origin"]
            source, sr, sc = views.get(node.inputs[0], (node.inputs[0], 0, 0))
            views[node.output] = (source, sr + r0, sc + c0)
    return views


def space_to_depth_conv(name: str, source: str, output: str, channels: int) -> Node:
    """SpaceToDepth with block 2 as a 2×2 stride-2 convolution with one-hot weights: output
    channel ``(dy·2 + dx)·C + c`` copies ``x[c, 2i + dy, 2j + dx]``."""
    weight = np.zeros((4 * channels, channels, 2, 2), np.int8)
    for dy in range(2):
        for dx in range(2):
            weight[(dy * 2 + dx) * channels + np.arange(channels), np.arange(channels), dy, dx] = 1
    return copy_conv(name, source, output, weight, stride=(2, 2))