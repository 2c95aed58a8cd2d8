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
