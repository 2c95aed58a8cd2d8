"""ONNX QDQ model → IR.

The input is an int8 QDQ model as written by ``onnxruntime.quantization.quantize_static``: every
float operator sits between ``DequantizeLinear`` nodes (its activation inputs and its constant
weights) and one ``QuantizeLinear`` (its output). Each such operator becomes one IR node that
maps 8-bit tensors to an 8-bit tensor. What is not quantised — the ``QuantizeLinear`` of the
graph inputs, and whatever follows the last quantised tensors (``DequantizeLinear``, Softmax,
…) — stays on the host as ONNX sub-graphs run by onnxruntime (:class:`HostPlan`).

Malformed or unsupported input raises :class:`ModelError` naming the ONNX node, its op type and
what sfnpu supports.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference

from .ir import (Graph, InputTaps, Node, QType, Tensor, channel_pad_conv, check,
                 space_to_depth_conv)

__all__ = ["ModelError", "HostPlan", "Imported", "Classification", "load_model", "import_model",
           "classify_nodes", "prepared_model", "SUPPORTED_OPS"]

#: ONNX operators the accelerator executes (between QuantizeLinear/DequantizeLinear).
SUPPORTED_OPS = {
    "Conv": "normal and depthwise, kernel ≤ 7, stride 1/2, any padding, dilation 1",
    "Gemm": "constant weights (runs as a 1x1 or HxW convolution; a (T, K) sequence as a 1x1 "
            "convolution over T pixels)",
    "MatMul": "constant second operand (runs as a 1x1 convolution, a sequence's rows as "
              "pixels)",
    "MaxPool": "kernel 2/3, stride 1/2; k×k stride 1 'same' (SPP, SPPF) as a cascade of 3×3",
    "AveragePool": "kernel 2/3, stride 1/2",
    "GlobalAveragePool": "",
    "Add": "two feature maps of the same shape; a scalar or per-channel constant (a table)",
    "Sub": "a scalar or per-channel constant, either side (a table)",
    "Div": "by a scalar or per-channel constant (a table)",
    "Mul": "a feature map times a per-channel vector (squeeze-and-excitation); by a scalar or "
           "per-channel constant (a table)",
    "Concat": "along channels",
    "Split": "along channels, each part quantised as the input (a channel window read in "
             "place where lane blocks allow, else a one-hot 1x1 convolution)",
    "Slice": "along channels with step 1, quantised as the input (as Split)",
    "Resize": "nearest, scale 2, 4 or 8",
    "Upsample": "nearest, scale 2, 4 or 8",
    "Relu": "", "Clip": "", "LeakyRelu": "", "HardSigmoid": "", "HardSwish": "",
    "Sigmoid": "", "Tanh": "",
    "SpaceToDepth": "block size 2 (runs as a one-hot 2x2 stride-2 convolution)",
    "BatchNormalization": "not folded (pre-activation): one table per channel on the input "
                          "side of the next group",
    "PRelu": "per-channel or scalar slope: one table per channel on the input side of the "
             "next group",
    "Pad": "zeros: channels (a one-hot 1x1 convolution), or height and width read only by "
           "convolutions (folded into their padding)",
}
_UNARY = {"Relu", "Clip", "LeakyRelu", "HardSigmoid", "HardSwish", "Sigmoid", "Tanh"}
_ALIASES = {"Flatten", "Reshape", "Squeeze", "Unsqueeze", "Identity"}
#: Operators that must not be left to the host behind an unsupported node.
_MUST_ACCELERATE = {"Conv", "Gemm", "MatMul", "MaxPool", "AveragePool", "GlobalAveragePool"}
#: Operators the host runs for a reason beyond "not implemented".
_HOST_ONLY = {
    "ConvTranspose": "onnxruntime has no integer kernel for a QDQ ConvTranspose: it runs "
                     "DequantizeLinear, a float32 ConvTranspose and QuantizeLinear, whose "
                     "rounding exact integer sums miss in a few codes per million (measured: "
                     "13 of 4.6 million outputs of PP-OCRv4's detector head differ by one); "
                     "the host runs it to keep onnxruntime's bits",
}


class ModelError(ValueError):
    """An ONNX model sfnpu cannot import; the message names the node and what to do."""


def _where(node: onnx.NodeProto) -> str:
    name = node.name or f"→{node.output[0]}" if node.output else node.name
    return f"ONNX node {name!r} ({node.op_type})"


def all_tensors(graph: onnx.GraphProto):
    """Every TensorProto of a graph: initializers and attribute tensors, subgraphs included."""
    yield from graph.initializer
    for n in graph.node:
        for a in n.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from all_tensors(a.g)
            for sub in a.graphs:
                yield from all_tensors(sub)


def check_external_data(model: onnx.ModelProto, base_dir: Path, what: str) -> bool:
    """Refuse external-data locations that leave ``base_dir``; True if the model has any."""
    base = base_dir.resolve()
    found = False
    for t in all_tensors(model.graph):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        found = True
        loc = {e.key: e.value for e in t.external_data}.get("location", "")
        target = (base / loc).resolve()
        if not loc or Path(loc).is_absolute() or not target.is_relative_to(base):
            raise ModelError(f"{what}: tensor {t.name!r} stores its data at {loc!r}, outside "
                             f"the model's folder {base}; refusing to read it (copy the data "
                             "next to the model)")
        if not target.is_file():
            raise ModelError(f"{what}: external data file {loc!r} of tensor {t.name!r} is "
                             "missing")
    return found


def load_model(src) -> onnx.ModelProto:
    """Read a model from a path (external data only from the model's own folder) or take a
    ModelProto as is."""
    if isinstance(src, onnx.ModelProto):
        return src
    path = Path(src)
    if not path.is_file():
        raise ModelError(f"{path}: no such model file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf raises several unrelated types
        raise ModelError(f"{path}: not a readable ONNX model ({e})") from None
    if check_external_data(model, path.parent, str(path)):
        onnx.load_external_data_for_model(model, str(path.parent))
    return model


@dataclass(frozen=True)
class HostPlan:
    """The parts of the model that run on the host with onnxruntime."""
    prologue: onnx.ModelProto     # graph inputs → quantised accelerator inputs
    epilogue: onnx.ModelProto     # quantised accelerator outputs → graph outputs
    epilogue_ops: tuple[str, ...]  # op types the host runs after the accelerator
    #: epilogue input name → (IR tensor it receives, ONNX shape to give it)
    epilogue_feeds: dict
    #: accelerator inputs the prologue hands over as SpaceToDepth(2) of the quantised input
    space_to_depth: tuple[str, ...] = ()
    #: the convolution taps of quantised inputs the prologue hands over
    #: (:class:`~.ir.InputTaps`, each an accelerator input)
    input_taps: tuple[InputTaps, ...] = ()

    def with_space_to_depth(self, moved: dict[str, tuple[str, tuple[int, int, int]]]
                            ) -> "HostPlan":
        """The plan whose prologue also rearranges quantised inputs: ``moved`` maps each new
        accelerator input to (the input it is the SpaceToDepth(2) of, that input's
        ``(C, H, W)``). The prologue hands out the new input instead, in
        :func:`~.ir.space_to_depth_conv`'s channel order ``(dy·2 + dx)·C + c`` (ONNX
        SpaceToDepth's), built from Reshape and Transpose, which onnxruntime runs on 8-bit
        codes."""
        def rearrange(new: str, old: str, shape: tuple[int, int, int]):
            c, h, w = shape
            split = numpy_helper.from_array(np.array([1, c, h // 2, 2, w // 2, 2], np.int64),
                                            f"{new}.split_shape")
            merged = numpy_helper.from_array(np.array([1, 4 * c, h // 2, w // 2], np.int64),
                                             f"{new}.shape")
            return [split, merged], [
                onnx.helper.make_node("Reshape", [old, split.name], [f"{new}.blocks"]),
                onnx.helper.make_node("Transpose", [f"{new}.blocks"], [f"{new}.phases"],
                                      perm=[0, 3, 5, 1, 2, 4]),
                onnx.helper.make_node("Reshape", [f"{new}.phases", merged.name], [new]),
            ], (4 * c, h // 2, w // 2)
        return replace(self, prologue=self._rearranged(
            {new: rearrange(new, old, shape) for new, (old, shape) in moved.items()},
            {new: old for new, (old, _) in moved.items()}),
            space_to_depth=self.space_to_depth + tuple(moved))

    def with_input_taps(self, folded: Sequence[InputTaps]) -> "HostPlan":
        """The plan whose prologue also hands out convolution taps, each as the accelerator
        input :attr:`~.ir.InputTaps.name` in place of its source. Built from Pad (with the
        zero point's code), one strided Slice per tap (:meth:`~.ir.InputTaps.windows`) and a
        Concat, which onnxruntime runs on 8-bit codes."""
        def im2col(new: str, taps: InputTaps):
            top, left, bottom, right = taps.pads
            pads = numpy_helper.from_array(
                np.array([0, 0, top, left, 0, 0, bottom, right], np.int64), f"{new}.pads")
            zero = numpy_helper.from_array(np.array(taps.qtype.zero_point, taps.qtype.dtype),
                                           f"{new}.zero_point")
            consts, nodes = [pads, zero], [onnx.helper.make_node(
                "Pad", [taps.source, pads.name, zero.name], [f"{new}.padded"])]
            tap_names = []
            for k, ((y0, y1), (x0, x1)) in enumerate(taps.windows()):
                tap = f"{new}.tap{k}"
                bounds = [numpy_helper.from_array(np.array(v, np.int64), f"{tap}.{what}")
                          for what, v in (("starts", [y0, x0]), ("ends", [y1, x1]),
                                          ("axes", [2, 3]), ("steps", list(taps.stride)))]
                consts += bounds
                nodes.append(onnx.helper.make_node(
                    "Slice", [f"{new}.padded", *(b.name for b in bounds)], [tap]))
                tap_names.append(tap)
            nodes.append(onnx.helper.make_node("Concat", tap_names, [new], axis=1))
            return consts, nodes, taps.out_shape
        return replace(self, prologue=self._rearranged(
            {taps.name: im2col(taps.name, taps) for taps in folded},
            {taps.name: taps.source for taps in folded}),
            input_taps=self.input_taps + tuple(folded))

    def _rearranged(self, added: dict[str, tuple[list, list, tuple[int, int, int]]],
                    sources: dict[str, str]) -> onnx.ModelProto:
        """A copy of the prologue with ``added`` (new output → its initializers, nodes and
        ``(C, H, W)``) appended, each new output handed out in place of its source in
        ``sources``."""
        prologue = onnx.ModelProto()
        prologue.CopyFrom(self.prologue)
        g = prologue.graph
        for new, (consts, nodes, shape) in added.items():
            g.initializer.extend(consts)
            g.node.extend(nodes)
            output = next(o for o in g.output if o.name == sources[new])
            output.name = new
            dims = output.type.tensor_type.shape.dim
            del dims[:]
            for d in (1, *shape):
                dims.add().dim_value = d
        return prologue


@dataclass(frozen=True)
class Imported:
    graph: Graph
    host: HostPlan
    onnx_nodes: int               # nodes of the source model (for the node → group count)


class _Model:
    """Index of one ONNX graph: constants, producers, consumers, quantisation parameters."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        g = model.graph
        self.consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        for node in g.node:
            if node.op_type == "Constant":
                attr = {a.name: a for a in node.attribute}
                if "value" not in attr:
                    raise ModelError(f"{_where(node)}: only tensor-valued Constant nodes are "
                                     "supported")
                self.consts[node.output[0]] = numpy_helper.to_array(attr["value"].t)
        self.producer = {o: n for n in g.node for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in g.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.shapes = {}
        for vi in [*g.input, *g.value_info, *g.output]:
            dims = vi.type.tensor_type.shape.dim
            if all(d.HasField("dim_value") for d in dims):
                self.shapes[vi.name] = tuple(d.dim_value for d in dims)

    def const(self, name: str, node: onnx.NodeProto, what: str) -> np.ndarray:
        if name not in self.consts:
            raise ModelError(f"{_where(node)}: {what} {name!r} must be a constant "
                             "(initializer or Constant node)")
        return self.consts[name]

    def qparams(self, node: onnx.NodeProto) -> tuple[np.ndarray, np.ndarray, int]:
        """scale, zero point and axis of a QuantizeLinear/DequantizeLinear node."""
        scale = self.const(node.input[1], node, "scale").astype(np.float32)
        if len(node.input) > 2 and node.input[2]:
            zp = self.const(node.input[2], node, "zero point")
        else:
            zp = np.zeros((), np.uint8)
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        return scale, zp, axis


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _chw(shape: tuple[int, ...], node: onnx.NodeProto, name: str) -> tuple[int, int, int]:
    if shape is None:
        raise ModelError(f"{_where(node)}: shape of {name!r} is unknown after shape inference; "
                         "give the model static input shapes")
    if shape[0] != 1:
        raise ModelError(f"{_where(node)}: batch size {shape[0]} of {name!r}; sfnpu runs "
                         "batch 1")
    rest = shape[1:]
    if len(rest) == 3:
        return tuple(rest)
    if len(rest) == 1:
        return (rest[0], 1, 1)
    raise ModelError(f"{_where(node)}: tensor {name!r} of shape {shape} is neither NCHW nor "
                     "(N, C)")


def _pads(node: onnx.NodeProto, in_hw, kernel, stride) -> tuple[int, int, int, int]:
    auto = _attr(node, "auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("NOTSET", ""):
        p = list(_attr(node, "pads", [0, 0, 0, 0]))
        return (p[0], p[1], p[2], p[3])
    if auto == "VALID":
        return (0, 0, 0, 0)
    pads = []
    for size, k, s in zip(in_hw, kernel, stride):
        out = -(-size // s)
        total = max((out - 1) * s + k - size, 0)
        small, big = total // 2, total - total // 2
        pads.append((small, big) if auto == "SAME_UPPER" else (big, small))
    return (pads[0][0], pads[1][0], pads[0][1], pads[1][1])


def import_model(src) -> Imported:
    """Import an int8 QDQ model (a path or ModelProto) into the IR."""
    return _Importer(_Model(prepared_model(src))).run()


@dataclass(frozen=True)
class Classification:
    """Which node of a QDQ model runs where (:func:`classify_nodes`), by index in
    ``model.graph.node``."""
    model: onnx.ModelProto            # checked, shapes inferred
    accelerated: frozenset[int]       # compute nodes and the Q/DQ nodes they consume
    host_reasons: dict[int, str]      # compute nodes the host runs → why


def classify_nodes(src) -> Classification:
    """Every node the accelerator can run, wherever it is: the tolerant import (of the model
    with its row products as convolutions over pixels, :mod:`.row_products`)."""
    from .row_products import rows_as_pixels     # it builds on this module's graph index

    model, rewritten = rows_as_pixels(prepared_model(src))
    if rewritten:
        model = shape_inference.infer_shapes(model, strict_mode=True)
    importer = _Importer(_Model(model), tolerant=True)
    importer.walk()
    g = model.graph
    index = {id(n): k for k, n in enumerate(g.node)}
    return Classification(model, frozenset(index[i] for i in importer.accelerated),
                          {index[i]: why for i, why in importer.host_reasons.items()})


def prepared_model(src) -> onnx.ModelProto:
    """The model, checked (ONNX checker, opset) and with every shape inferred."""
    model = load_model(src)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise ModelError(f"the model is not valid ONNX: {str(e).splitlines()[0]}") from None
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if not 11 <= opset <= 21:
        raise ModelError(f"ONNX opset {opset}; sfnpu supports opsets 11 to 21")
    try:
        model = shape_inference.infer_shapes(model, strict_mode=True)
    except Exception as e:
        raise ModelError(f"shape inference failed: {str(e).splitlines()[0]}") from None
    return model


class _Importer:
    """The walk over the ONNX nodes. Strict (``tolerant=False``, :func:`import_model`): a
    node the accelerator cannot run ends the accelerated part, and a heavy node behind it is
    an error. Tolerant (:func:`classify_nodes`): such a node is left to the host with the
    reason, and the quantised tensors the host produces become accelerator inputs, so that
    the accelerator takes every node it can run wherever it is in the graph."""

    def __init__(self, m: _Model, tolerant: bool = False):
        self.m = m
        self.tolerant = tolerant
        self.host_reasons: dict[int, str] = {}  # id() of an ONNX node → why the host runs it
        #: A zero Pad's quantised output → (top, left, bottom, right): the convolution that
        #: reads it pads by that much more (:meth:`pad_node`).
        self.spatial_pads: dict[str, tuple[int, int, int, int]] = {}
        self.tensors: dict[str, Tensor] = {}
        self.nodes: list[Node] = []
        self.alias: dict[str, str] = {}        # quantised tensor → the IR tensor it equals
        self.deq: dict[str, str] = {}          # float name → quantised tensor it dequantises
        self.accelerated: set[int] = set()     # id() of ONNX nodes consumed into the IR
        self.inputs: list[str] = []

    # -- quantised tensors -------------------------------------------------------------------

    def qtensor_of(self, float_name: str, node: onnx.NodeProto) -> str:
        """The IR tensor behind a float activation input of ``node``."""
        if float_name in self.deq:
            return self.alias.get(self.deq[float_name], self.deq[float_name])
        raise ModelError(f"{_where(node)}: input {float_name!r} is not dequantised from an "
                         "8-bit tensor; sfnpu needs an int8 QDQ model (quantise the float "
                         "model with `sfnpu compile --calib`)")

    def quantised_output(self, node: onnx.NodeProto, index: int = 0
                         ) -> tuple[str, QType] | None:
        """The QuantizeLinear that follows ``node``'s output ``index``, if every consumer is
        one."""
        out = node.output[index]
        users = self.m.consumers.get(out, [])
        if len(users) == 1 and users[0].op_type == "MaxPool" and node.op_type != "MaxPool":
            # op → MaxPool → Q without a Q in between: quantisation is monotonic, so it
            # commutes with the maximum; the op's output takes the MaxPool's quantisation.
            after = self.quantised_output_params(users[0])
            if after is not None:
                self.deq[out] = out
                return out, after
        if not users or any(u.op_type != "QuantizeLinear" for u in users):
            return None
        q = users[0]
        scale, zp, _ = self.m.qparams(q)
        if scale.size != 1:
            raise ModelError(f"{_where(q)}: per-channel activation quantisation is not "
                             "supported")
        qtype = QType(float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0]),
                      zp.dtype == np.int8)
        for other in users[1:]:
            self.alias[other.output[0]] = q.output[0]
        self.accelerated.update(id(u) for u in users)
        return q.output[0], qtype

    def quantised_output_params(self, node: onnx.NodeProto) -> QType | None:
        users = self.m.consumers.get(node.output[0], [])
        if not users or any(u.op_type != "QuantizeLinear" for u in users):
            return None
        scale, zp, _ = self.m.qparams(users[0])
        return QType(float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0]), zp.dtype == np.int8)

    def add_tensor(self, name: str, shape, qtype: QType):
        self.tensors[name] = Tensor(name, tuple(shape), qtype)

    # -- walk --------------------------------------------------------------------------------

    def run(self) -> Imported:
        self.walk()
        outputs = self.graph_outputs()
        graph = check(Graph(self.tensors, self.nodes, self.inputs, outputs))
        host = self.host_plan(outputs)
        return Imported(graph, host, len(self.m.model.graph.node))

    def walk(self):
        """Every node in order: the accelerator takes what it can run."""
        g = self.m.model.graph
        graph_inputs = {i.name for i in g.input} - set(self.m.consts)
        for node in g.node:
            if node.op_type == "Constant":
                continue
            if node.op_type == "QuantizeLinear":
                if node.input[0] in graph_inputs:
                    self.quantise_graph_input(node)
                continue
            if node.op_type == "DequantizeLinear":
                src = node.input[0]
                src = self.alias.get(src, src)
                if src not in self.tensors and self.is_code_input(src):
                    try:
                        self.code_input(node)
                    except ModelError:
                        if not self.tolerant:   # tolerant: codes the accelerator cannot
                            raise               # take stay on the host with their readers
                if src in self.tensors:
                    self.deq[node.output[0]] = src
                continue
            if self.tolerant:
                self.tolerant_node(node)
            else:
                self.compute_node(node)
        self.claim_dequantizers()

    def quantise_graph_input(self, q: onnx.NodeProto):
        scale, zp, _ = self.m.qparams(q)
        shape = _chw(self.m.shapes.get(q.input[0]), q, q.input[0])
        self.add_tensor(q.output[0], shape,
                        QType(float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0]),
                              zp.dtype == np.int8))
        self.inputs.append(q.output[0])

    def is_code_input(self, name: str) -> bool:
        """An 8-bit tensor the accelerator takes as it is: a graph input of quantised codes,
        or (tolerant) the output of a QuantizeLinear the host runs."""
        if name in self.m.consts:
            return False
        producer = self.m.producer.get(name)
        if producer is None:
            return name in {i.name for i in self.m.model.graph.input}
        return self.tolerant and producer.op_type == "QuantizeLinear" and \
            id(producer) not in self.accelerated

    def code_input(self, dq: onnx.NodeProto):
        """An accelerator input of 8-bit codes, with the quantisation its DequantizeLinear
        gives them; the host hands the codes over unchanged."""
        scale, zp, _ = self.m.qparams(dq)
        if scale.size != 1:
            raise ModelError(f"{_where(dq)}: per-channel activation quantisation is not "
                             "supported")
        name = dq.input[0]
        self.add_tensor(name, _chw(self.m.shapes.get(name), dq, name),
                        QType(float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0]),
                              zp.dtype == np.int8))
        self.inputs.append(name)

    def tolerant_node(self, node: onnx.NodeProto):
        """:meth:`compute_node`, leaving a node the accelerator cannot run to the host with
        the reason (and undoing what its import had begun)."""
        saved = (dict(self.tensors), len(self.nodes), dict(self.alias), dict(self.deq),
                 set(self.accelerated))
        try:
            self.compute_node(node)
        except ModelError as e:
            self.tensors, self.alias, self.deq, self.accelerated = \
                saved[0], saved[2], saved[3], saved[4]
            del self.nodes[saved[1]:]
            self.host_reasons[id(node)] = str(e)
            return
        if id(node) not in self.accelerated:
            self.host_reasons.setdefault(id(node), self.host_reason(node))

    def host_reason(self, node: onnx.NodeProto) -> str:
        op = node.op_type
        if op in _HOST_ONLY:
            return _HOST_ONLY[op]
        if op not in SUPPORTED_OPS and op not in _ALIASES:
            return f"{op} is not an accelerator operator"
        inputs = [i for i in node.input if i and i not in self.m.consts
                  and not self.is_const_dq(i)]
        if not all(i in self.deq for i in inputs):
            return "reads a float tensor the host computes (no QuantizeLinear before it)"
        return "its output is not quantised (no QuantizeLinear after it)"

    def compute_node(self, node: onnx.NodeProto):
        op = node.op_type
        activation_inputs = [i for i in node.input if i and i not in self.m.consts
                             and not self.is_const_dq(i)]
        if not activation_inputs or not all(i in self.deq for i in activation_inputs):
            return  # host side (before the accelerator or after it)
        if op not in SUPPORTED_OPS and op not in _ALIASES:
            # The host runs it, and everything after it; host_plan refuses that when
            # convolutions or pooling would follow.
            return
        if op == "Split":
            self.split_node(node)
            return
        if sum(bool(o) for o in node.output) > 1:
            raise ModelError(f"{_where(node)}: {len(node.output)} outputs "
                             f"({', '.join(node.output)}); the accelerator produces one")
        quantised = self.quantised_output(node)
        if quantised is None:
            return  # its output leaves the quantised domain: host epilogue
        out, qtype = quantised
        self.accelerated.add(id(node))
        if op in _ALIASES:
            self.alias_node(node, out, qtype)
        elif op in ("Conv", "Gemm", "MatMul"):
            self.conv_node(node, out, qtype)
        elif op in ("MaxPool", "AveragePool", "GlobalAveragePool"):
            self.pool_node(node, out, qtype)
        elif op in ("Add", "Mul", "Sub", "Div") and len(activation_inputs) == 1:
            self.constant_operand_node(node, out, qtype)
        elif op in ("Add", "Mul"):
            self.binary_node(node, out, qtype)
        elif op in ("Sub", "Div"):
            raise ModelError(f"{_where(node)}: {op} of two feature maps is not supported")
        elif op == "Concat":
            self.concat_node(node, out, qtype)
        elif op in ("Resize", "Upsample"):
            self.resize_node(node, out, qtype)
        elif op in _UNARY:
            self.unary_node(node, out, qtype)
        elif op == "SpaceToDepth":
            self.space_to_depth_node(node, out, qtype)
        elif op in ("BatchNormalization", "PRelu"):
            self.channel_function_node(node, out, qtype)
        elif op == "Pad":
            self.pad_node(node, out, qtype)
        elif op == "Slice":
            self.slice_node(node, out, qtype)

    def is_const_dq(self, name: str) -> bool:
        p = self.m.producer.get(name)
        return p is not None and p.op_type == "DequantizeLinear" and p.input[0] in self.m.consts

    def const_dq(self, name: str, node: onnx.NodeProto, what: str):
        """(integer values, scale, zero point, axis) of a dequantised constant input."""
        p = self.m.producer.get(name)
        if p is None or p.op_type != "DequantizeLinear" or p.input[0] not in self.m.consts:
            raise ModelError(f"{_where(node)}: {what} {name!r} must be a dequantised constant "
                             "(QDQ weights)")
        self.accelerated.add(id(p))
        scale, zp, axis = self.m.qparams(p)
        return self.m.consts[p.input[0]], scale, zp, axis

    def input_tensor(self, node: onnx.NodeProto, index: int = 0) -> Tensor:
        return self.tensors[self.qtensor_of(node.input[index], node)]

    # -- operators ---------------------------------------------------------------------------

    def alias_node(self, node, out, qtype):
        src = self.input_tensor(node)
        if qtype != src.qtype:
            raise ModelError(f"{_where(node)}: a reshape that also requantises "
                             f"({src.qtype} → {qtype}) is not supported")
        self.alias[out] = src.name

    def conv_node(self, node, out, qtype):
        x = self.input_tensor(node)
        c, h, w = x.shape
        if node.op_type == "Conv":
            weight, w_scale, w_zp, axis = self.const_dq(node.input[1], node, "weight")
            group = _attr(node, "group", 1)
            if any(d != 1 for d in _attr(node, "dilations", [1, 1])):
                raise ModelError(f"{_where(node)}: dilation {_attr(node, 'dilations')} is not "
                                 "supported (dilation 1 only)")
            kh, kw = weight.shape[2:]
            stride = tuple(_attr(node, "strides", [1, 1]))
            extra = self.folded_pads(node.input[0])
            pads = _pads(node, (h + extra[0] + extra[2], w + extra[1] + extra[3]), (kh, kw),
                         stride)
            pads = tuple(p + e for p, e in zip(pads, extra))
            if group == 1:
                depthwise = False
            elif group == c and weight.shape[0] == c and weight.shape[1] == 1:
                depthwise = True
            else:
                raise ModelError(f"{_where(node)}: grouped convolution (group={group}) is not "
                                 "supported; normal (group=1) and depthwise (group=C) are")
            bias_name = node.input[2] if len(node.input) > 2 and node.input[2] else None
        else:
            weight, w_scale, w_zp, axis = self.const_dq(node.input[1], node, "weight")
            a_shape = self.m.shapes.get(node.input[0])
            if weight.ndim != 2 or a_shape is None or len(a_shape) != 2:
                raise ModelError(f"{_where(node)}: {node.op_type} of a {a_shape} input and a "
                                 f"{weight.shape} constant; sfnpu runs (1, K) x (K, N) as a "
                                 "convolution")
            trans_b = _attr(node, "transB", 0) if node.op_type == "Gemm" else 0
            if node.op_type == "Gemm" and (_attr(node, "transA", 0) or
                                           _attr(node, "alpha", 1.0) != 1.0 or
                                           _attr(node, "beta", 1.0) != 1.0):
                raise ModelError(f"{_where(node)}: Gemm with transA, alpha or beta ≠ 1 is not "
                                 "supported")
            if not trans_b:
                weight = weight.T
                axis = 0 if axis == 1 else 1
            # A fully connected layer on a flattened C×H×W map is an H×W convolution.
            if weight.shape[1] != c * h * w:
                raise ModelError(f"{_where(node)}: {node.op_type} over {weight.shape[1]} "
                                 f"features of a {c}×{h}×{w} map ({a_shape}); sfnpu runs a "
                                 "matrix product over a whole flattened map")
            weight = weight.reshape(weight.shape[0], c, h, w)
            kh, kw, stride, pads, depthwise = h, w, (1, 1), (0, 0, 0, 0), False
            bias_name = node.input[2] if node.op_type == "Gemm" and len(node.input) > 2 else None
        if weight.dtype != np.int8:
            raise ModelError(f"{_where(node)}: weights are {weight.dtype}; sfnpu needs int8 "
                             "weights")
        o = weight.shape[0]
        w_scale = np.broadcast_to(w_scale.reshape(-1), (o,)).astype(np.float32)
        w_zp = np.broadcast_to(w_zp.reshape(-1), (o,)).astype(np.int8)
        if w_scale.size != o or (np.size(w_scale) > 1 and axis not in (0, -4)):
            raise ModelError(f"{_where(node)}: weight quantisation axis {axis}; per output "
                             "channel (axis 0) or per tensor is supported")
        if bias_name:
            bias, b_scale, b_zp, _ = self.const_dq(bias_name, node, "bias")
            if bias.dtype != np.int32 or np.any(b_zp != 0):
                raise ModelError(f"{_where(node)}: bias must be int32 with zero point 0")
            expected = (np.float32(x.qtype.scale) * w_scale).astype(np.float32)
            if not np.allclose(np.broadcast_to(b_scale.reshape(-1), (o,)), expected,
                               rtol=1e-6, atol=0):
                raise ModelError(f"{_where(node)}: bias scale is not input scale × weight "
                                 "scale; requantise the bias")
            bias = np.broadcast_to(bias.reshape(-1), (o,)).astype(np.int32)
        else:
            bias = np.zeros(o, np.int32)
        if kh > 7 or kw > 7:
            raise ModelError(f"{_where(node)}: kernel {kh}x{kw} is larger than 7x7")
        if any(s not in (1, 2) for s in stride):
            raise ModelError(f"{_where(node)}: stride {stride}; 1 and 2 are supported")
        oh = (h + pads[0] + pads[2] - kh) // stride[0] + 1
        ow = (w + pads[1] + pads[3] - kw) // stride[1] + 1
        self.add_tensor(out, (o, oh, ow), qtype)
        self.nodes.append(Node(node.name, "conv", (x.name,), out,
                               attrs=dict(stride=stride, pads=pads, depthwise=depthwise),
                               consts=dict(weight=np.ascontiguousarray(weight),
                                           weight_scale=w_scale, weight_zp=w_zp, bias=bias)))

    def pool_node(self, node, out, qtype):
        x = self.input_tensor(node)
        c, h, w = x.shape
        if node.op_type == "GlobalAveragePool":
            self.add_tensor(out, (c, 1, 1), qtype)
            self.nodes.append(Node(node.name, "globalavgpool", (x.name,), out))
            return
        kernel = tuple(_attr(node, "kernel_shape"))
        stride = tuple(_attr(node, "strides", [1, 1]))
        pads = _pads(node, (h, w), kernel, stride)
        ceil = _attr(node, "ceil_mode", 0)
        if any(d != 1 for d in _attr(node, "dilations", [1, 1])):
            raise ModelError(f"{_where(node)}: pooling dilation is not supported")

        def size(n, pa, pb, k, s):
            span = n + pa + pb - k
            return (-(-span // s) if ceil else span // s) + 1
        oh = size(h, pads[0], pads[2], kernel[0], stride[0])
        ow = size(w, pads[1], pads[3], kernel[1], stride[1])
        attrs = dict(kernel=kernel, stride=stride, pads=pads)
        if node.op_type == "MaxPool":
            if qtype != x.qtype:
                raise ModelError(f"{_where(node)}: MaxPool changes the quantisation "
                                 f"({x.qtype} → {qtype}); sfnpu expects it unchanged")
            if self.max_pool_cascade(node, x, out, qtype, kernel, stride, pads):
                return
            op = "maxpool"
        else:
            op = "avgpool"
            attrs["count_include_pad"] = int(_attr(node, "count_include_pad", 0))
        self.add_tensor(out, (c, oh, ow), qtype)
        self.nodes.append(Node(node.name, op, (x.name,), out, attrs=attrs))

    def max_pool_cascade(self, node, x, out, qtype, kernel, stride, pads) -> bool:
        """SPP/SPPF's "same" max pools (k×k, stride 1, padding k // 2, k = 5, 7, 9, …) as
        (k − 1) / 2 max pools of 3×3: each output's k×k window is the 3×3 window of 3×3
        windows, and padding never wins a maximum (exact on the codes). False if the pool is
        not one of them."""
        k = kernel[0]
        if not (k > 3 and k % 2 and kernel == (k, k) and stride == (1, 1)
                and pads == (k // 2,) * 4):
            return False
        src, steps = x.name, k // 2
        for n in range(steps):
            name = out if n == steps - 1 else f"{out}.pool{n}"
            self.add_tensor(name, x.shape, qtype)
            self.nodes.append(Node(node.name if n == 0 else f"{node.name}.pool{n}", "maxpool",
                                   (src,), name, attrs=dict(kernel=(3, 3), stride=(1, 1),
                                                            pads=(1, 1, 1, 1))))
            src = name
        return True

    def pad_node(self, node, out, qtype):
        """A Pad with zeros that keeps the quantisation writes the zero point's code. Zero
        channels (a residual branch widened to the block's width) run as a one-hot 1×1
        convolution (:func:`~.ir.channel_pad_conv`). Zero rows and columns read only by
        convolutions are no work of their own: the convolutions pad by that much more."""
        x = self.input_tensor(node)
        mode = _attr(node, "mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if mode != "constant":
            raise ModelError(f"{_where(node)}: Pad mode {mode!r}; the accelerator pads with "
                             "zeros only")
        if len(node.input) > 3 and node.input[3]:
            raise ModelError(f"{_where(node)}: Pad with axes is not supported")
        pads = (self.m.const(node.input[1], node, "pads") if len(node.input) > 1
                and node.input[1] else np.asarray(_attr(node, "pads", [])))
        value = (self.m.const(node.input[2], node, "constant value") if len(node.input) > 2
                 and node.input[2] else np.zeros(()))
        pads = [int(v) for v in np.asarray(pads).reshape(-1)]
        if len(pads) != 8 or pads[0] or pads[4] or min(pads) < 0:
            raise ModelError(f"{_where(node)}: Pad {pads}; the accelerator pads channels, "
                             "height and width, not the batch, and does not crop")
        if np.any(np.asarray(value, np.float64) != 0) or qtype != x.qtype:
            raise ModelError(f"{_where(node)}: Pad with value {value} and quantisation "
                             f"{qtype} (input {x.qtype}); the accelerator pads only with "
                             "zeros that keep the quantisation")
        spatial = (pads[2], pads[3], pads[6], pads[7])
        if pads[1] or pads[5]:      # zero channels (a residual branch widened): one-hot 1×1
            if any(spatial):
                raise ModelError(f"{_where(node)}: Pad {pads} pads channels and height or "
                                 "width at once; the accelerator does one or the other")
            c, h, w = x.shape
            self.add_tensor(out, (pads[1] + c + pads[5], h, w), qtype)
            self.nodes.append(channel_pad_conv(node.name, x.name, out, c, pads[1], pads[5]))
            return
        readers = [r for dq in self.m.consumers.get(out, []) if dq.op_type == "DequantizeLinear"
                   for r in self.m.consumers.get(dq.output[0], [])]
        others = {dq.op_type for dq in self.m.consumers.get(out, [])} - {"DequantizeLinear"}
        if others or not readers or any(r.op_type != "Conv" for r in readers):
            raise ModelError(f"{_where(node)}: the accelerator folds a Pad into the "
                             "convolutions that read it; this one is read by "
                             f"{sorted({r.op_type for r in readers} | others)}")
        self.alias[out] = x.name
        self.spatial_pads[out] = spatial

    def folded_pads(self, float_name: str) -> tuple[int, int, int, int]:
        """The zero padding folded into a convolution reading ``float_name``."""
        p = self.m.producer.get(float_name)
        if p is None or p.op_type != "DequantizeLinear":
            return (0, 0, 0, 0)
        return self.spatial_pads.get(p.input[0], (0, 0, 0, 0))

    def binary_node(self, node, out, qtype):
        a, b = self.input_tensor(node, 0), self.input_tensor(node, 1)
        if node.op_type == "Add":
            if a.shape != b.shape:
                raise ModelError(f"{_where(node)}: Add of shapes {a.shape} and {b.shape}; "
                                 "sfnpu adds feature maps of the same shape")
            shape, op = a.shape, "add"
        else:
            if b.shape[1:] != (1, 1) and a.shape[1:] == (1, 1):
                a, b = b, a
            # Same shapes: two maps (Eltwise.MUL), or x · Sigmoid(x) (SiLU), which a later pass
            # folds into one table.
            if b.shape != (a.shape[0], 1, 1) and b.shape != a.shape:
                raise ModelError(f"{_where(node)}: Mul of shapes {a.shape} and {b.shape}; "
                                 "sfnpu multiplies a feature map by a per-channel vector or "
                                 "by a map of the same shape")
            shape, op = a.shape, "mul"
        self.add_tensor(out, shape, qtype)
        self.nodes.append(Node(node.name, op, (a.name, b.name), out))

    def nchw_input(self, node) -> Tensor:
        """Input 0 of ``node``, which must be the 1×C×H×W map itself, not a reshape of it."""
        x = self.input_tensor(node)
        shape = self.m.shapes.get(node.input[0])
        if shape is None or tuple(shape) != (1, *x.shape):
            raise ModelError(f"{_where(node)}: input {node.input[0]!r} has shape {shape}; "
                             f"the accelerator takes channels of a 1×C×H×W map "
                             f"(1×{'×'.join(map(str, x.shape))} here)")
        return x

    def channel_window(self, node, x: Tensor, start: int, count: int, out: str,
                       qtype: QType):
        """``count`` channels of ``x`` from ``start``: an IR ``slice`` (a view or a one-hot
        convolution, chosen per configuration by
        :func:`~.passes.channel_views_or_copies`)."""
        if qtype != x.qtype:
            raise ModelError(f"{_where(node)}: output {out!r} is quantised as {qtype}, its "
                             f"input as {x.qtype}; the accelerator takes channels out "
                             "without requantising them")
        self.add_tensor(out, (count, *x.shape[1:]), qtype)
        self.nodes.append(Node(node.name, "slice", (x.name,), out,
                               attrs=dict(start=start)))

    def split_node(self, node):
        """Split along channels: every part a channel window of the input."""
        x = self.nchw_input(node)
        c = x.shape[0]
        axis = _attr(node, "axis", 0)
        if axis not in (1, -3):
            raise ModelError(f"{_where(node)}: Split along axis {axis}; channels (1) only")
        n = len(node.output)
        if len(node.input) > 1 and node.input[1]:
            sizes = [int(v) for v in self.m.const(node.input[1], node, "split").reshape(-1)]
        elif _attr(node, "split") is not None:
            sizes = [int(v) for v in _attr(node, "split")]
        else:   # equal parts; with opset 18's num_outputs the last may be smaller
            chunk = -(-c // n)
            sizes = [min(chunk, c - k * chunk) for k in range(n)]
        if len(sizes) != n or sum(sizes) != c or min(sizes) <= 0:
            raise ModelError(f"{_where(node)}: Split of {c} channels into {sizes}")
        start = 0
        for k, size in enumerate(sizes):
            if node.output[k] and self.m.consumers.get(node.output[k]):
                quantised = self.quantised_output(node, k)
                if quantised is None:
                    raise ModelError(f"{_where(node)}: output {node.output[k]!r} is not "
                                     "quantised (no QuantizeLinear after it)")
                self.channel_window(node, x, start, size, *quantised)
            start += size
        self.accelerated.add(id(node))

    def slice_node(self, node, out, qtype):
        """Slice along channels with step 1 (opset 10+: starts, ends, axes, steps inputs)."""
        x = self.nchw_input(node)
        c = x.shape[0]

        def operand(k, what, default):
            if len(node.input) > k and node.input[k]:
                return [int(v) for v in self.m.const(node.input[k], node, what).reshape(-1)]
            return default
        starts, ends = operand(1, "starts", None), operand(2, "ends", None)
        if starts is None or ends is None:
            raise ModelError(f"{_where(node)}: Slice needs constant starts and ends")
        axes = operand(3, "axes", list(range(len(starts))))
        steps = operand(4, "steps", [1] * len(starts))
        window = {a % 4: (s, e, st) for a, s, e, st in zip(axes, starts, ends, steps)}
        if set(window) != {1} or window[1][2] != 1:
            raise ModelError(f"{_where(node)}: Slice over axes {axes} with steps {steps}; "
                             "the accelerator slices channels (axis 1) with step 1")
        s, e, _ = window[1]
        s, e = (max(0, min(c, v + c if v < 0 else v)) for v in (s, e))
        if e <= s:
            raise ModelError(f"{_where(node)}: Slice of channels [{s}, {e}) is empty")
        self.channel_window(node, x, s, e - s, out, qtype)

    def concat_node(self, node, out, qtype):
        parts = [self.input_tensor(node, i) for i in range(len(node.input))]
        axis = _attr(node, "axis")
        if axis not in (1, -3):
            raise ModelError(f"{_where(node)}: Concat along axis {axis}; channels (1) only")
        hw = {p.shape[1:] for p in parts}
        if len(hw) != 1:
            raise ModelError(f"{_where(node)}: Concat of different spatial sizes {hw}")
        self.add_tensor(out, (sum(p.shape[0] for p in parts), *hw.pop()), qtype)
        self.nodes.append(Node(node.name, "concat", tuple(p.name for p in parts), out))

    #: (coordinate_transformation_mode, nearest_mode) pairs for which a nearest ×2 resize
    #: reads input o // 2 — what the accelerator does (measured against onnxruntime).
    _RESIZE_OK = {(c, n) for c in ("half_pixel", "pytorch_half_pixel", "align_corners")
                  for n in ("round_prefer_floor", "round_prefer_ceil")} | {
        ("asymmetric", "floor"), ("asymmetric", "round_prefer_floor"),
        ("tf_half_pixel_for_nn", "floor")}

    #: Modes whose nearest pixel is ``o // f`` for every integer factor ``f`` (no ties:
    #: half-pixel centres fall strictly inside a source pixel), not only for 2.
    _RESIZE_ANY_FACTOR = {("asymmetric", "floor"), ("tf_half_pixel_for_nn", "floor")} | {
        (c, n) for c in ("half_pixel", "pytorch_half_pixel")
        for n in ("round_prefer_floor", "round_prefer_ceil")}
    #: Nearest upsampling factors the accelerator runs: one 2x upsampler per group, cascaded.
    RESIZE_FACTORS = (2, 4, 8)

    def resize_node(self, node, out, qtype):
        x = self.input_tensor(node)

        def text(name, default):
            v = _attr(node, name, default)
            return v.decode() if isinstance(v, bytes) else v
        mode = text("mode", "nearest")
        if node.op_type == "Upsample":
            coords, nearest = "asymmetric", "floor"   # Upsample's definition
        else:
            coords = text("coordinate_transformation_mode", "half_pixel")
            nearest = text("nearest_mode", "round_prefer_floor")
        out_shape = self.m.shapes.get(node.output[0])
        c, h, w = x.shape
        factor = next((f for f in self.RESIZE_FACTORS
                       if out_shape is not None and tuple(out_shape[1:]) == (c, f * h, f * w)),
                      None)
        if mode != "nearest" or factor is None:
            raise ModelError(f"{_where(node)}: only nearest-neighbour upsampling by "
                             f"{', '.join(map(str, self.RESIZE_FACTORS))} in both axes is "
                             f"supported (mode {mode!r}, output {out_shape})")
        allowed = self._RESIZE_OK if factor == 2 else self._RESIZE_ANY_FACTOR
        if (coords, nearest) not in allowed:
            raise ModelError(f"{_where(node)}: coordinate_transformation_mode={coords!r} with "
                             f"nearest_mode={nearest!r} does not read input pixel o // "
                             f"{factor}; supported: {sorted(allowed)}")
        if qtype != x.qtype:
            raise ModelError(f"{_where(node)}: Resize changes the quantisation")
        # Upsampling by 2ⁿ is n upsamplings by 2: pixel o // 2 of pixel o // 2 … is o // 2ⁿ.
        src, steps = x.name, factor.bit_length() - 1
        for k in range(steps):
            name = out if k == steps - 1 else f"{out}.up{2 << k}"
            self.add_tensor(name, (c, (2 << k) * h, (2 << k) * w), qtype)
            self.nodes.append(Node(node.name if k == 0 else f"{node.name}.up{2 << k}",
                                   "resize", (src,), name, attrs=dict(scale=2)))
            src = name

    def space_to_depth_node(self, node, out, qtype):
        """SpaceToDepth (YOLOv2's reorg): :func:`~.ir.space_to_depth_conv` (onnxruntime copies
        the codes; the one-hot convolution does too when the quantisation is unchanged)."""
        x = self.input_tensor(node)
        c, h, w = x.shape
        if _attr(node, "blocksize") != 2 or qtype != x.qtype or h % 2 or w % 2:
            raise ModelError(f"{_where(node)}: SpaceToDepth with block size 2, even sizes and "
                             "unchanged quantisation only")
        self.add_tensor(out, (4 * c, h // 2, w // 2), qtype)
        self.nodes.append(space_to_depth_conv(node.name, x.name, out, c))

    def constant_operand_node(self, node, out, qtype):
        """An arithmetic op between a feature map and a scalar constant (``x · c``, ``x + c``,
        e.g. inside an exported HardSwish) is a function of the code of ``x``: one table, built
        by onnxruntime from the same DequantizeLinear of the constant as in the model."""
        from onnx import helper, numpy_helper
        from sfnpu import numeric

        x_name = next(i for i in node.input if i in self.deq)
        x = self.tensors[self.qtensor_of(x_name, node)]
        const_name = next(i for i in node.input if i != x_name)
        producer = self.m.producer.get(const_name)
        if producer is not None and producer.op_type == "DequantizeLinear":
            values, scale, zp, axis = self.const_dq(const_name, node, "constant operand")
            const_nodes = lambda: ([helper.make_node("DequantizeLinear", ["c_q", "c_s", "c_z"],
                                                     ["c_f"], axis=axis)],
                                   [numpy_helper.from_array(values, "c_q"),
                                    numpy_helper.from_array(scale, "c_s"),
                                    numpy_helper.from_array(zp, "c_z")])
        else:
            values = self.m.const(const_name, node, "constant operand")
            const_nodes = lambda: ([], [numpy_helper.from_array(values, "c_f")])
        if np.size(values) != 1:
            c = x.shape[0]
            if (np.shape(values) in ((c, 1, 1), (1, c, 1, 1))
                    and self.m.shapes.get(x_name) == (1, *x.shape)):
                # one constant per channel (a folded bias, a normalisation): per-channel tables
                self.channel_function_node(node, out, qtype)
                return
            raise ModelError(f"{_where(node)}: {node.op_type} with a constant of shape "
                             f"{np.shape(values)} is not supported: the accelerator takes a "
                             f"scalar or one value per channel ({c}×1×1) of a "
                             f"1×{'×'.join(map(str, x.shape))} map")
        first = node.input[0] == x_name

        def build(inp, res):
            nodes, inits = const_nodes()
            operands = [inp, "c_f"] if first else ["c_f", inp]
            return nodes + [helper.make_node(node.op_type, operands, [res])], inits
        opset = next(o.version for o in self.m.model.opset_import if o.domain in ("", "ai.onnx"))
        table = numeric.activation_table(build, x.qtype.scale, x.qtype.zero_point, x.qtype.signed,
                                         qtype.scale, qtype.zero_point, qtype.signed,
                                         opset=max(opset, 13))
        self.add_tensor(out, x.shape, qtype)
        self.nodes.append(Node(node.name, "table", (x.name,), out,
                               consts=dict(table=table.astype(qtype.dtype))))

    def replay_constants(self, node: onnx.NodeProto):
        """Nodes and initializers that recreate ``node``'s constant inputs exactly as the model
        holds them (a DequantizeLinear of the stored integers, or the float value), and the
        input names to use — so onnxruntime computes a table with the model's own kernels."""
        from onnx import helper, numpy_helper

        nodes, inits, names = [], [], []
        for k, name in enumerate(node.input):
            if not name or name in self.deq:
                names.append(name)
                continue
            fresh = f"c{k}"
            producer = self.m.producer.get(name)
            if producer is not None and producer.op_type == "DequantizeLinear":
                values, scale, zp, axis = self.const_dq(name, node, "constant input")
                nodes.append(helper.make_node("DequantizeLinear", [f"{fresh}_q", f"{fresh}_s",
                                                                   f"{fresh}_z"], [fresh],
                                              axis=axis))
                inits += [numpy_helper.from_array(values, f"{fresh}_q"),
                          numpy_helper.from_array(scale, f"{fresh}_s"),
                          numpy_helper.from_array(zp, f"{fresh}_z")]
            else:
                inits.append(numpy_helper.from_array(self.m.const(name, node, "input"), fresh))
            names.append(fresh)
        return nodes, inits, names

    def channel_function_node(self, node, out, qtype):
        """A BatchNormalization left in the quantised graph (pre-activation, DenseNet-style),
        a PRelu, or an arithmetic op with one constant per channel maps each channel's codes
        through its own function: C exact tables from onnxruntime, applied on the input side
        of the consuming group."""
        from onnx import helper
        from sfnpu import numeric

        x_name = next(i for i in node.input if i in self.deq)   # the one map it reads
        x = self.tensors[self.qtensor_of(x_name, node)]
        nodes, inits, names = self.replay_constants(node)
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}

        def build(inp, res):
            operands = [inp if n == x_name else n for n in names]
            return nodes + [helper.make_node(node.op_type, operands, [res], **attrs)], inits
        opset = next(o.version for o in self.m.model.opset_import if o.domain in ("", "ai.onnx"))
        tables = numeric.activation_table(build, x.qtype.scale, x.qtype.zero_point,
                                          x.qtype.signed, qtype.scale, qtype.zero_point,
                                          qtype.signed, channels=x.shape[0],
                                          opset=max(opset, 13))
        self.add_tensor(out, x.shape, qtype)
        self.nodes.append(Node(node.name, "channel_table", (x.name,), out,
                               consts=dict(table=tables.astype(qtype.dtype))))

    def unary_node(self, node, out, qtype):
        from sfnpu import numeric

        x = self.input_tensor(node)
        consts = []
        for name in node.input[1:]:
            if not name:
                consts.append(None)
            elif name in self.m.consts:
                consts.append(self.m.consts[name].astype(np.float32))
            else:
                raise ModelError(f"{_where(node)}: input {name!r} must be a constant")
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        opset = next(o.version for o in self.m.model.opset_import
                     if o.domain in ("", "ai.onnx"))
        table = numeric.activation_table(
            numeric.onnx_op(node.op_type, *consts, **attrs), x.qtype.scale, x.qtype.zero_point,
            x.qtype.signed, qtype.scale, qtype.zero_point, qtype.signed, opset=max(opset, 13))
        self.add_tensor(out, x.shape, qtype)
        self.nodes.append(Node(node.name, "table", (x.name,), out,
                               consts=dict(table=table.astype(qtype.dtype))))

    # -- outputs and host parts --------------------------------------------------------------

    def claim_dequantizers(self):
        """A DequantizeLinear of a quantised tensor runs on the accelerator (as nothing) when
        only accelerated nodes read it; otherwise the host needs it."""
        graph_outputs = {o.name for o in self.m.model.graph.output}
        for node in self.m.model.graph.node:
            if node.op_type == "DequantizeLinear" and node.output[0] in self.deq:
                users = self.m.consumers.get(node.output[0], [])
                if users and node.output[0] not in graph_outputs and \
                        all(id(u) in self.accelerated for u in users):
                    self.accelerated.add(id(node))

    def graph_outputs(self) -> list[str]:
        """Quantised tensors read by anything outside the accelerator."""
        outs = []
        for node in self.m.model.graph.node:
            if id(node) in self.accelerated or node.op_type == "Constant":
                continue
            for name in node.input:
                name = self.alias.get(name, name)
                if name in self.tensors and name not in outs and name not in self.inputs:
                    outs.append(name)
        for output in self.m.model.graph.output:     # 8-bit codes the model itself returns
            name = self.alias.get(output.name, output.name)
            if name in self.tensors and name not in outs and name not in self.inputs:
                outs.append(name)
        if not outs:
            raise ModelError("no quantised tensor reaches the model outputs: nothing for the "
                             "accelerator to compute")
        return outs

    def host_plan(self, outputs: list[str]) -> HostPlan:
        g = self.m.model.graph
        model = self.m.model
        q_inputs = [n for n in g.node if n.op_type == "QuantizeLinear"
                    and n.output[0] in self.inputs]
        accelerated = self.accelerated | {id(n) for n in q_inputs}
        rest = [n for n in g.node if id(n) not in accelerated]

        def value_info(name):
            t = self.tensors[name]
            return onnx.helper.make_tensor_value_info(
                name, onnx.TensorProto.INT8 if t.qtype.signed else onnx.TensorProto.UINT8,
                None)

        def submodel(nodes, inputs, outputs, tag):
            needed = {i for n in nodes for i in n.input}
            inits = [t for t in g.initializer if t.name in needed]
            graph = onnx.helper.make_graph(list(nodes), f"{g.name}_{tag}", inputs, outputs,
                                           inits)
            sub = onnx.helper.make_model(graph, opset_imports=model.opset_import)
            sub.ir_version = model.ir_version
            return sub

        # The epilogue reads accelerator outputs under the ONNX names (and shapes) its nodes
        # use; several names may carry one IR tensor (reshapes are aliases).
        epilogue_nodes = [n for n in rest if not (n.op_type == "Constant" and all(
            id(u) in accelerated for u in self.m.consumers.get(n.output[0], [])))]
        feeds = {}
        for n in epilogue_nodes:
            for i in n.input:
                ir_name = self.alias.get(i, i)
                if ir_name in outputs and i not in feeds:
                    feeds[i] = (ir_name, self.m.shapes.get(i))
        for output in g.output:            # codes the model returns as they are
            ir_name = self.alias.get(output.name, output.name)
            if ir_name in outputs and output.name not in feeds:
                feeds[output.name] = (ir_name, self.m.shapes.get(output.name))
        patched = epilogue_nodes
        prologue = submodel(q_inputs, [i for i in g.input if i.name not in self.m.consts],
                            [value_info(n) for n in self.inputs], "prologue")
        heavy = [n for n in patched if n.op_type in _MUST_ACCELERATE]
        if heavy:
            culprit = next(n for n in patched if n.op_type not in
                           ("QuantizeLinear", "DequantizeLinear", "Constant"))
            raise ModelError(
                f"{_where(culprit)}: not executable on the accelerator, and {len(heavy)} "
                f"compute node(s) after it ({', '.join(sorted({n.op_type for n in heavy}))}) "
                f"would have to run on the host; supported: {', '.join(sorted(SUPPORTED_OPS))}")
        available = set(feeds) | {o for n in patched for o in n.output}
        missing = [o.name for o in g.output if o.name not in available]
        if missing:
            raise ModelError(f"model outputs {missing} are produced by nothing the host or the "
                             "accelerator runs")
        epilogue_inputs = []
        for name, (ir_name, _) in feeds.items():
            vi = value_info(ir_name)
            vi.name = name
            epilogue_inputs.append(vi)
        epilogue = submodel(patched, epilogue_inputs, list(g.output), "epilogue")
        ops = tuple(n.op_type for n in patched if n.op_type != "Constant")
        return HostPlan(prologue, epilogue, ops, feeds)
