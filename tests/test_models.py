"""Whole networks through the golden model, value for value against onnxruntime: the paper's
architectures (random weights, small inputs) and the two trained models shipped in wheels."""

import numpy as np
import onnx
import pytest

from sfnpu.models import builders
from sfnpu.models import real_models
from sfnpu.compiler.pipeline import compile_model, run_onnxruntime
from sfnpu.compiler.quantize import CalibrationSource, quantize_model
from sfnpu.config import get_config
from sfnpu.sim.golden import GoldenModel

#: The reference configuration the system tests run: layers wider than its stores (rows,
#: VGG's 4096-channel classifier, DenseNet's 1024-channel input tables) run as tiles.
NUMERICS = get_config("tiny")
#: Small inputs keep the suite fast; the graphs are the full networks.
SIZES = {"inception_v3": 96, "yolov2": 96, "yolov3": 96, "retinanet": 128, "densenet121": 32}


def golden_vs_onnxruntime(qdq_path, inputs):
    compiled = compile_model(qdq_path, NUMERICS)
    golden = GoldenModel(NUMERICS)
    reference = onnx.load(str(qdq_path))
    name = reference.graph.input[0].name
    same = total = top1 = 0
    for x in inputs:
        want = run_onnxruntime(reference, {name: x[None]})
        got = compiled.run({name: x[None]}, golden.outputs)
        for key in want:
            same += int((want[key] == got[key]).sum())
            total += want[key].size
        first = next(iter(want))
        top1 += int(want[first].argmax() == got[first].argmax())
    return compiled, same / total, top1 / len(inputs)


@pytest.mark.parametrize("name", list(builders.BUILDERS))
def test_architecture(tmp_path, name):
    size = SIZES.get(name, 64)
    model = builders.build(name, input_size=size)
    path = tmp_path / f"{name}.qdq.onnx"
    quantize_model(model, path, CalibrationSource.synthetic(4, seed=1))
    x = np.random.default_rng(2).uniform(0, 1, (1, 3, size, size)).astype(np.float32)
    compiled, identical, _ = golden_vs_onnxruntime(path, x)
    assert identical == 1.0, f"{name}: {identical:.4%} identical"
    # Every convolution and pooling runs on the accelerator; the host only dequantises.
    assert set(compiled.imported.host.epilogue_ops) <= {"DequantizeLinear", "Softmax",
                                                        "QuantizeLinear", "Reshape", "Flatten"}


@pytest.mark.parametrize("name", sorted(n for n, m in real_models.REAL_MODELS.items()
                                        if m.kind == "classifier"))
def test_real_model(tmp_path, name):
    x, _labels = real_models.rendered_inputs(name, 28, seed=0)
    path = tmp_path / f"{name}.qdq.onnx"
    quantize_model(real_models.real_model_path(name), path,
                   CalibrationSource.arrays(x[:20], label="rendered images"))
    compiled, identical, top1 = golden_vs_onnxruntime(path, x[20:])
    assert identical == 1.0 and top1 == 1.0
    convs = sum(n.op_type == "Conv" for n in onnx.load(str(path)).graph.node)
    assert sum(n.op == "conv" for n in compiled.graph.nodes) >= convs
