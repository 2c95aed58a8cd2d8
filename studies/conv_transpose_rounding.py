"""Why a QDQ ConvTranspose stays on the host: onnxruntime computes it in float32.

onnxruntime fuses a QDQ Conv into QLinearConv (exact int32 sums, then one float requantisation
the golden model reproduces), but it has no integer kernel for ConvTranspose: it runs
DequantizeLinear, a float32 ConvTranspose (sgemm and col2im) and QuantizeLinear. Exact integer
sums requantised like a convolution's — what the accelerator would compute for a stride-2
ConvTranspose run as phase convolutions — then differ from onnxruntime wherever the float32
rounding of the sum moves the value across a rounding boundary.

This study measures how often, on the ConvTranspose layers of PP-OCRv4's detector head
(quantised from rendered inputs like the test suite's), for random input codes around the
input's zero point::

    python -m sfnpu.studies.conv_transpose_rounding [--inputs 30]

On this project's reference machine: 13 of 4 608 000 outputs of the first layer (24 → 24
channels, 40×40 → 80×80) differ by one code; none of the second's 192 000.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from sfnpu.numeric import requant_multiplier, requantize


def _layers(model: onnx.ModelProto):
    """(name, x scale, x zero point, int8 weight, weight scales, y scale, y zero point) of each
    stride-2, kernel-2 ConvTranspose between DequantizeLinear and QuantizeLinear."""
    g = model.graph
    init = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    for ct in (n for n in g.node if n.op_type == "ConvTranspose"):
        x_dq, w_dq = producer[ct.input[0]], producer[ct.input[1]]
        q = consumers[ct.output[0]][0]
        attrs = {a.name: helper.get_attribute_value(a) for a in ct.attribute}
        if list(attrs.get("kernel_shape", [])) != [2, 2] or \
                list(attrs.get("strides", [])) != [2, 2]:
            continue
        yield (ct.name, init[x_dq.input[1]], init[x_dq.input[2]], init[w_dq.input[0]],
               init[w_dq.input[1]], init[q.input[1]], init[q.input[2]])


def mismatches(x_scale, x_zp, weight, w_scale, y_scale, y_zp, inputs: int, size: int = 40):
    """(outputs that differ, outputs) between onnxruntime's QDQ ConvTranspose and exact
    integer sums requantised as the accelerator requantises a convolution."""
    import onnxruntime as ort

    cin, cout = weight.shape[:2]
    consts = dict(xs=x_scale, xz=x_zp, w=weight, ws=w_scale, wz=np.zeros(cout, np.int8),
                  ys=y_scale, yz=y_zp)
    nodes = [helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=1),
             helper.make_node("ConvTranspose", ["xf", "wf"], ["yf"], kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("QuantizeLinear", ["yf", "ys", "yz"], ["y"])]
    graph = helper.make_graph(
        nodes, "conv_transpose",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, cin, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    multiplier = requant_multiplier(x_scale, w_scale, y_scale)
    differ = total = 0
    for seed in range(inputs):
        rng = np.random.default_rng(seed)
        mean, spread = int(x_zp) + rng.integers(-5, 40), rng.integers(2, 60)
        x = np.clip(rng.normal(mean, spread, (1, cin, size, size)), 0, 255).astype(np.uint8)
        want = session.run(None, {"x": x})[0][0]
        sums = np.einsum("chw,coab->ohawb", x[0].astype(np.int64) - int(x_zp),
                         weight.astype(np.int64)).reshape(cout, 2 * size, 2 * size)
        got = requantize(sums, multiplier, int(y_zp), 0, 255)
        differ += int(np.count_nonzero(got.astype(np.int64) != want))
        total += want.size
    return differ, total


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=30, help="random inputs per layer")
    args = parser.parse_args(argv)
    from sfnpu.compiler.quantize import CalibrationSource, quantize_model
    from sfnpu.models import real_models

    name = "ppocr_v4_det"
    x, _ = real_models.rendered_inputs(name, 16, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.qdq.onnx"
        quantize_model(real_models.real_model_path(name), path,
                       CalibrationSource.arrays(x, label="rendered images"))
        model = onnx.load(str(path))
    for layer, *params in _layers(model):
        differ, total = mismatches(*params, inputs=args.inputs)
        print(f"{layer}: {differ} of {total} outputs differ from onnxruntime")


if __name__ == "__main__":
    main()
