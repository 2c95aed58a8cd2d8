"""A tiny float-ONNX graph builder for tests: layers by name, random weights from a seed."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class Net:
    def __init__(self, shape, seed=0, name="net"):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits = [], []
        self.shape = tuple(shape)          # (C, H, W) of the input
        self.name = name
        self.count = 0

    def _fresh(self, prefix):
        self.count += 1
        return f"{prefix}{self.count}"

    def _init(self, array, prefix):
        name = self._fresh(prefix)
        self.inits.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def op(self, op_type, inputs, **attrs):
        out = self._fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def conv(self, x, cin, cout, k, stride=1, pads=None, group=1, bias=True):
        fan_in = cin // group * k * k
        w = self.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2 / fan_in)
        ins = [x, self._init(w, "w")]
        if bias:
            ins.append(self._init(self.rng.standard_normal(cout) * 0.1, "b"))
        pads = [k // 2] * 4 if pads is None else pads
        stride = [stride, stride] if isinstance(stride, int) else list(stride)
        return self.op("Conv", ins, kernel_shape=[k, k], strides=stride, pads=pads, group=group)

    def gemm(self, x, cin, cout):
        w = self.rng.standard_normal((cout, cin)) * np.sqrt(1 / cin)
        return self.op("Gemm", [x, self._init(w, "fc"),
                                self._init(self.rng.standard_normal(cout) * 0.1, "fcb")],
                       transB=1)

    def const(self, array, prefix="c"):
        return self._init(np.asarray(array), prefix)

    def const_int(self, values, prefix="i"):
        name = self._fresh(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
        return name

    def model(self, outputs, opset=13):
        graph = helper.make_graph(
            self.nodes, self.name,
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, *self.shape])],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
            self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        # Output shapes from shape inference, so the model passes the ONNX checker.
        done = onnx.shape_inference.infer_shapes(model).graph
        inferred = {vi.name: vi for vi in [*done.value_info, *done.output]}
        for out in model.graph.output:
            if out.name in inferred:
                out.type.CopyFrom(inferred[out.name].type)
        return model

    def samples(self, n, seed=1, scale=1.0):
        """``n`` random inputs, N×C×H×W."""
        rng = np.random.default_rng(seed)
        return (rng.standard_normal((n, *self.shape)) * scale).astype(np.float32)


class Slice:
    """A piece of a float ONNX model (one block of a builder's network, say) between a tensor
    and some outputs, with :class:`Net`'s interface: the input is renamed ``x``."""

    def __init__(self, model, start, stops, name, seed=0):
        inferred = onnx.shape_inference.infer_shapes(model)
        self.piece = onnx.utils.Extractor(inferred).extract_model([start], list(stops))
        graph = self.piece.graph
        for node in graph.node:
            node.input[:] = ["x" if i == start else i for i in node.input]
        graph.input[0].name = "x"
        self.shape = tuple(d.dim_value for d in graph.input[0].type.tensor_type.shape.dim[1:])
        self.name = name
        self.outputs = list(stops)

    def model(self, outputs, opset=None):
        """The piece (its own opset; ``outputs`` must be the ones it was cut at)."""
        assert list(outputs) == self.outputs, (outputs, self.outputs)
        return self.piece

    def bypassed(self, keep, name):
        """The piece without the nodes ``keep(node)`` rejects: each one's readers read its
        (first) input instead."""
        other = Slice.__new__(Slice)
        other.piece = onnx.ModelProto.FromString(self.piece.SerializeToString())
        other.shape, other.name, other.outputs = self.shape, name, self.outputs
        graph, renamed, nodes = other.piece.graph, {}, []
        for node in graph.node:
            node.input[:] = [renamed.get(i, i) for i in node.input]
            if keep(node):
                nodes.append(node)
            else:
                renamed[node.output[0]] = node.input[0]
        del graph.node[:]
        graph.node.extend(nodes)
        used = {i for n in nodes for i in n.input}
        kept_inits = [t for t in graph.initializer if t.name in used]
        del graph.initializer[:]
        graph.initializer.extend(kept_inits)
        kept_info = [v for v in graph.value_info if v.name not in renamed]
        del graph.value_info[:]
        graph.value_info.extend(kept_info)
        return other

    samples = Net.samples
