"""The ONNX model builders: validity, shapes, published parameter counts, exporter-style
structure, and an onnxruntime run of every network.

Published parameter counts (checked exactly; every source gives the exact integer):

* torchvision model docs, ``num_params`` of the ImageNet/COCO weights
  (https://pytorch.org/vision/stable/models/generated/torchvision.models.<name>.html):
  resnet18 11689512, resnet50 25557032, resnet152 60192808, vgg16 138357544,
  mobilenet_v2 3504872, efficientnet_b1 7794184, inception_v3 27161264,
  squeezenet1_1 1235496, densenet121 7978856 (also ``"num_params": 7978856`` in
  torchvision/models/densenet.py), retinanet_resnet50_fpn 34014999
  (.../torchvision.models.detection.retinanet_resnet50_fpn.html, COCO_V1, 91 classes).
  torchvision counts ``model.parameters()``: conv/linear weights and biases and BN weight+bias,
  not BN running statistics. RetinaNet's backbone uses FrozenBatchNorm2d, whose weight and bias
  are buffers, so none of its BN tensors count.
* Inception-V3: torchvision's 27161264 includes the training-only AuxLogits branch, which the
  exported (eval-mode) graph does not contain; we compare against 27161264 minus AuxLogits
  (computed below from torchvision's InceptionAux definition) = 23834568.
* YOLO, Darknet convention (every float of the ``.weights`` file, i.e. BN running mean and
  variance included), COCO 80 classes: yolov2.weights is 203 934 260 bytes and yolov3.weights
  248 007 048 bytes (AlexeyAB/darknet issue #1910); minus the 16-byte (v0.1) resp. 20-byte
  (v0.2, 64-bit ``seen``) header that is 50983561 and 62001757 floats. The same totals appear in
  the YAD2K Keras conversion of yolov2 ("Total params: 50,983,561, Trainable params:
  50,962,889") and Keras conversions of yolov3 ("Total params: 62001757, Trainable params:
  61949149"); ultralytics' PyTorch yolov3 prints "Model Summary: 333 layers, 61949149
  parameters". Trainable (torchvision convention) counts: 50962889 and 61949149.
  YOLOv2 has 5 anchors per cell (425 output channels), YOLOv3 3 per scale (255).
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from sfnpu.models import builders as B

NAMES = ["resnet18", "resnet50", "resnet152", "vgg16", "mobilenet_v2", "efficientnet_b1",
         "inception_v3", "squeezenet1_1", "densenet121", "yolov2", "yolov3", "retinanet"]


def _inception_aux_params() -> int:
    # torchvision InceptionAux(768, 1000): BasicConv2d(768, 128, 1), BasicConv2d(128, 768, 5),
    # Linear(768, 1000); BasicConv2d = conv without bias + BN (weight, bias).
    return (768 * 128 + 2 * 128) + (128 * 768 * 25 + 2 * 768) + (768 * 1000 + 1000)


PUBLISHED = {  # name: torchvision-convention count
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "resnet152": 60_192_808,
    "vgg16": 138_357_544,
    "mobilenet_v2": 3_504_872,
    "efficientnet_b1": 7_794_184,
    "inception_v3": 27_161_264 - _inception_aux_params(),
    "squeezenet1_1": 1_235_496,
    "densenet121": 7_978_856,
    "yolov2": 50_962_889,
    "yolov3": 61_949_149,
    "retinanet": 34_014_999,
}
PUBLISHED_DARKNET = {"yolov2": (203_934_260 - 16) // 4, "yolov3": (248_007_048 - 20) // 4}

# Input sizes for the onnxruntime runs (small; Inception-V3 needs at least 75).
RUN_SIZE = {name: 64 for name in NAMES} | {"inception_v3": 128, "retinanet": 128}


def expected_outputs(name: str, size: int, num_classes: int | None = None) -> dict:
    if name in ("yolov2", "yolov3", "retinanet"):
        nc = num_classes or (91 if name == "retinanet" else 80)
    else:
        return {"logits": (1, num_classes or 1000)}
    if name == "yolov2":
        return {"output": (1, 5 * (5 + nc), size // 32, size // 32)}
    if name == "yolov3":
        return {f"output_stride{s}": (1, 3 * (5 + nc), size // s, size // s) for s in (32, 16, 8)}
    p = {"p3": size // 8, "p4": size // 16, "p5": size // 32}
    p["p6"] = -(-p["p5"] // 2)
    p["p7"] = -(-p["p6"] // 2)
    out = {f"cls_{k}": (1, 9 * nc, v, v) for k, v in p.items()}
    out |= {f"box_{k}": (1, 36, v, v) for k, v in p.items()}
    return out


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same graph with the large initializers turned into typed graph inputs: shape
    inference on VGG-16's 553 MB of weights would take seconds, its structure milliseconds."""
    s = onnx.ModelProto()
    s.ir_version = model.ir_version
    s.opset_import.extend(model.opset_import)
    g = s.graph
    g.name = model.graph.name
    g.node.extend(model.graph.node)
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    for t in model.graph.initializer:
        if int(np.prod(t.dims)) <= 16:  # Clip bounds, Resize scales: values matter
            g.initializer.append(t)
        else:
            g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return s


def shapes_of(values) -> dict:
    return {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in values}


def ops(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def producers(model):
    return {o: n for n in model.graph.node for o in n.output}


def consumers(model):
    out: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            out.setdefault(i, []).append(n)
    return out


def run(model: onnx.ModelProto, size: int) -> dict[str, np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((1, 3, size, size)).astype(np.float32)
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, {"input": x})))


# --- registry -----------------------------------------------------------------------------


def test_registry_names_and_defaults():
    assert list(B.BUILDERS) == NAMES
    assert set(B.DEFAULT_INPUT_SIZE) == set(NAMES)
    assert B.DEFAULT_INPUT_SIZE["inception_v3"] == 299
    assert B.DEFAULT_INPUT_SIZE["yolov2"] == B.DEFAULT_INPUT_SIZE["yolov3"] == 416
    assert B.DEFAULT_INPUT_SIZE["retinanet"] == 512
    assert B.DEFAULT_INPUT_SIZE["efficientnet_b1"] == 240


@pytest.mark.parametrize("bad", ["resnet", "ResNet50", "", "yolov5"])
def test_unknown_name_lists_supported(bad):
    with pytest.raises(ValueError) as e:
        B.build(bad)
    msg = str(e.value)
    assert repr(bad) in msg
    assert all(n in msg for n in NAMES)


# --- every network at its default size: counts, shapes, export style ---------------------


@pytest.mark.parametrize("name", NAMES)
def test_default_size_model(name):
    t = time.perf_counter()
    m = B.build(name)
    assert time.perf_counter() - t < 10  # VGG-16 (138 M weights) takes ~3 s here
    size = B.DEFAULT_INPUT_SIZE[name]

    # Published parameter count, exactly.
    assert B.parameter_count(m) == PUBLISHED[name]
    if name in PUBLISHED_DARKNET:
        assert B.parameter_count(m, "darknet") == PUBLISHED_DARKNET[name]

    # Declared and inferred output shapes.
    want = expected_outputs(name, size)
    assert shapes_of(m.graph.output) == want
    assert shapes_of(m.graph.input) == {"input": (1, 3, size, size)}
    sk = skeleton(m)
    onnx.checker.check_model(sk)
    inferred = onnx.shape_inference.infer_shapes(sk, strict_mode=True)
    assert shapes_of(inferred.graph.output) == want

    # Exporter conventions.
    assert m.opset_import[0].version == 13 and m.opset_import[0].domain == ""
    names = [n.name for n in m.graph.node]
    assert all(names) and len(set(names)) == len(names)
    outs = [o for n in m.graph.node for o in n.output]
    assert len(set(outs)) == len(outs)
    inits = [i.name for i in m.graph.initializer]
    assert len(set(inits)) == len(inits)
    assert all(i.data_type == TensorProto.FLOAT for i in m.graph.initializer)
    prod, cons = producers(m), consumers(m)
    for n in m.graph.node:
        if n.op_type == "BatchNormalization":
            src = prod.get(n.input[0])
            if name == "densenet121" and src.op_type != "Conv":
                continue  # pre-activation BN after Concat / pooling
            assert src.op_type == "Conv", n.name
            assert len(src.input) == 2, f"{src.name}: conv before BN must have no bias"
            assert len(cons[src.output[0]]) == 1
        elif n.op_type == "Clip":  # ReLU6
            vals = [float(numpy_helper.to_array(i)) for i in m.graph.initializer
                    if i.name in n.input[1:]]
            assert vals == [0.0, 6.0]
        elif n.op_type == "LeakyRelu":
            assert n.attribute[0].f == pytest.approx(0.1)
        elif n.op_type == "Resize":
            attrs = {a.name: a for a in n.attribute}
            assert attrs["mode"].s == b"nearest"
    assert {"Dropout", "Identity"}.isdisjoint(ops(m))


# --- every network runs in onnxruntime at a small size ------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_runs_in_onnxruntime(name):
    size = RUN_SIZE[name]
    m = B.build(name, size)
    onnx.checker.check_model(m, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    want = expected_outputs(name, size)
    assert shapes_of(inferred.graph.output) == want
    outs = run(m, size)
    assert {k: v.shape for k, v in outs.items()} == want
    for k, v in outs.items():
        assert np.isfinite(v).all(), k
        assert 1e-4 < float(np.abs(v).max()) < 1e4, (k, float(np.abs(v).max()))


# --- structure spot checks ----------------------------------------------------------------


@pytest.fixture(scope="module")
def small():
    cache: dict[str, onnx.ModelProto] = {}

    def get(name):
        if name not in cache:
            cache[name] = B.build(name, RUN_SIZE[name])
        return cache[name]

    return get


def test_resnet_structure(small):
    c18, c50, c152 = (ops(small(n)) for n in ("resnet18", "resnet50", "resnet152"))
    assert (c18["Conv"], c18["Add"], c18["Gemm"]) == (20, 8, 1)  # 17 + 3 downsample
    assert (c50["Conv"], c50["Add"], c50["Gemm"]) == (53, 16, 1)  # 49 + 4 downsample
    assert (c152["Conv"], c152["Add"], c152["Gemm"]) == (155, 50, 1)
    assert c50["BatchNormalization"] == 53 and c50["Relu"] == 49
    m = small("resnet50")
    names = {n.name for n in m.graph.node}
    assert {"conv1", "bn1", "layer1.0.conv1", "layer1.0.downsample.0", "layer4.2.conv3",
            "fc"} <= names
    w = {i.name: tuple(i.dims) for i in m.graph.initializer}
    assert w["layer2.0.conv2.weight"] == (128, 128, 3, 3)  # v1.5: stride on the 3×3
    strides = {n.name: list(n.attribute[[a.name for a in n.attribute].index("strides")].ints)
               for n in m.graph.node if n.op_type == "Conv"}
    assert strides["layer2.0.conv2"] == [2, 2] and strides["layer2.0.conv1"] == [1, 1]


def test_vgg16_structure(small):
    m = small("vgg16")
    c = ops(m)
    assert (c["Conv"], c["Gemm"], c["MaxPool"], c["Relu"]) == (13, 3, 5, 15)
    assert c["BatchNormalization"] == 0  # torchvision vgg16 has no BN; convs carry biases
    assert all(len(n.input) == 3 for n in m.graph.node if n.op_type == "Conv")
    w = {i.name: tuple(i.dims) for i in m.graph.initializer}
    # 64×64 input: the 2×2×512 map is flattened as it is (see the vgg16 docstring).
    assert w["classifier.0.weight"] == (4096, 512 * 2 * 2)
    assert w["classifier.6.weight"] == (1000, 4096)


def _group(n):
    return next((a.i for a in n.attribute if a.name == "group"), 1)


def test_mobilenet_v2_structure(small):
    m = small("mobilenet_v2")
    c = ops(m)
    dw = [n for n in m.graph.node if n.op_type == "Conv" and _group(n) > 1]
    assert len(dw) == 17  # one depthwise conv per inverted residual block
    assert c["Add"] == 10  # residual blocks: stride 1 and in == out
    assert c["Clip"] == 35  # ReLU6: stem + 16 expand + 17 depthwise + last conv
    assert c["Conv"] == 52 and c["Gemm"] == 1
    assert c["Relu"] == 0


def test_efficientnet_b1_structure(small):
    m = small("efficientnet_b1")
    prod, cons = producers(m), consumers(m)
    dw = [n for n in m.graph.node if n.op_type == "Conv" and _group(n) > 1]
    assert len(dw) == 23
    assert sorted({tuple(i.dims)[2] for i in m.graph.initializer
                   if i.name.endswith("dw.conv.weight")}) == [3, 5]
    # SE: GlobalAveragePool → Conv(bias) → SiLU(Sigmoid, Mul) → Conv(bias) → Sigmoid → Mul.
    se = 0
    for g in (n for n in m.graph.node if n.op_type == "GlobalAveragePool"):
        fc1 = cons.get(g.output[0], [None])[0]
        if fc1 is None or fc1.op_type != "Conv":
            continue
        assert len(fc1.input) == 3
        act = sorted(n.op_type for n in cons[fc1.output[0]])
        assert act == ["Mul", "Sigmoid"]  # SiLU
        silu = next(n for n in cons[fc1.output[0]] if n.op_type == "Mul")
        (fc2,) = cons[silu.output[0]]
        (gate,) = cons[fc2.output[0]]
        (scale,) = cons[gate.output[0]]
        assert (fc2.op_type, gate.op_type, scale.op_type) == ("Conv", "Sigmoid", "Mul")
        assert prod[scale.input[0]].op_type == "Mul"  # the depthwise conv's SiLU
        se += 1
    assert se == 23
    assert ops(m)["Add"] == 16  # 23 blocks minus the first block of each of 7 stages
    bn_eps = [a.f for n in m.graph.node if n.op_type == "BatchNormalization"
              for a in n.attribute if a.name == "epsilon"]
    assert len(bn_eps) == 1 + 2 * 2 + 21 * 3 + 1 and all(abs(e - 1e-3) < 1e-9 for e in bn_eps)


def test_inception_v3_structure(small):
    m = small("inception_v3")
    c = ops(m)
    assert c["Conv"] == 94 and c["BatchNormalization"] == 94 and c["Gemm"] == 1
    assert c["Concat"] == 15  # A×3, B, C×4, D (one each) + E×2 (three each)
    assert c["AveragePool"] == 9 and c["MaxPool"] == 4
    kernels = {tuple(i.dims[2:]) for i in m.graph.initializer if i.name.endswith("conv.weight")}
    assert {(1, 7), (7, 1), (1, 3), (3, 1), (5, 5)} <= kernels
    assert not any("Aux" in n.name for n in m.graph.node)


def test_squeezenet_structure(small):
    m = small("squeezenet1_1")
    c = ops(m)
    assert (c["Conv"], c["Concat"], c["MaxPool"], c["Gemm"]) == (26, 8, 3, 0)
    assert all(a.i == 1 for n in m.graph.node if n.op_type == "MaxPool"
               for a in n.attribute if a.name == "ceil_mode")


def test_densenet121_structure(small):
    m = small("densenet121")
    prod, cons = producers(m), consumers(m)
    c = ops(m)
    assert c["Conv"] == 120 and c["BatchNormalization"] == 121 and c["Gemm"] == 1
    layers = {n.name.rsplit(".", 1)[0] for n in m.graph.node if ".denselayer" in n.name}
    assert len(layers) == 6 + 12 + 24 + 16 == 58
    # Pre-activation BN → Relu → Conv: 2 per dense layer + 3 transitions.
    pre = 0
    for n in m.graph.node:
        if n.op_type == "BatchNormalization":
            (r,) = cons[n.output[0]]
            assert r.op_type == "Relu"
            if [x.op_type for x in cons[r.output[0]]] == ["Conv"]:
                pre += 1
                assert len(cons[r.output[0]][0].input) == 2  # conv without bias
    assert pre == 2 * 58 + 3  # norm0 is post-activation (conv0 → norm0), norm5 feeds the pool
    assert prod[m.graph.node[1].input[0]].name == "features.conv0"
    assert c["AveragePool"] == 3
    assert c["Concat"] == 58  # (n-1) per block for the layer inputs + 1 block output each


def test_yolov2_structure(small):
    m = small("yolov2")
    c = ops(m)
    assert (c["Conv"], c["LeakyRelu"], c["MaxPool"], c["SpaceToDepth"], c["Concat"]) == \
        (23, 22, 5, 1, 1)
    detect = producers(m)["output"]
    assert len(detect.input) == 3  # the detection conv has a bias and no BN/activation
    meta = {p.key: p.value for p in m.metadata_props}
    assert len(meta["sfnpu.anchors"].split(",")) == 10


def test_yolov3_structure(small):
    m = small("yolov3")
    c = ops(m)
    assert (c["Conv"], c["LeakyRelu"], c["Resize"], c["Add"], c["Concat"]) == \
        (75, 72, 2, 23, 2)
    prod = producers(m)
    for cat in (n for n in m.graph.node if n.op_type == "Concat"):
        assert prod[cat.input[0]].op_type == "Resize"
        assert prod[cat.input[1]].op_type == "Add"  # Darknet-53 shortcuts 36 and 61
    assert sorted(n.name for n in m.graph.node if n.op_type == "Concat") == \
        ["layer86.route", "layer98.route"]
    meta = {p.key: p.value for p in m.metadata_props}
    assert len(meta["sfnpu.anchors"].split(",")) == 18


def test_retinanet_structure(small):
    m = small("retinanet")
    c = ops(m)
    assert c["Conv"] == 53 + 8 + 5 * 10  # backbone + FPN (3 lateral, 3 output, P6, P7) + heads
    assert c["Resize"] == 2
    # The head weights are shared across P3–P7: 10 parameter sets for 50 conv nodes.
    head_w = {n.input[1] for n in m.graph.node
              if n.op_type == "Conv" and n.name.startswith("head.")}
    assert len(head_w) == 10
    # Frozen BN (metadata): the torchvision convention counts none of the 53 BNs' tensors.
    assert {p.key: p.value for p in m.metadata_props}[B.META_FROZEN_BN] == "1"
    assert c["BatchNormalization"] == 53
    bn_affine = sum(int(np.prod(i.dims)) for i in m.graph.initializer
                    if i.name.startswith("backbone.body.")
                    and i.name.endswith((".weight", ".bias"))
                    and (".bn" in i.name or "downsample.1" in i.name))
    assert bn_affine == 53_120
    assert B.parameter_count(m) == PUBLISHED["retinanet"]  # weights do not depend on size
    assert B.parameter_count(m, "darknet") == PUBLISHED["retinanet"] + 2 * bn_affine


# --- options, validation, determinism -----------------------------------------------------


@pytest.mark.parametrize("name,nc", [("resnet50", 10), ("squeezenet1_1", 7), ("yolov3", 20),
                                     ("yolov2", 20), ("retinanet", 2)])
def test_num_classes(name, nc):
    size = RUN_SIZE[name]
    m = B.build(name, size, num_classes=nc)
    assert shapes_of(m.graph.output) == expected_outputs(name, size, nc)


def test_non_square_input():
    m = B.build("resnet50", (96, 160))
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    assert shapes_of(inferred.graph.input) == {"input": (1, 3, 96, 160)}
    assert shapes_of(inferred.graph.output) == {"logits": (1, 1000)}


@pytest.mark.parametrize("name,size", [("yolov3", 100), ("yolov2", 400), ("retinanet", 500)])
def test_detectors_need_multiple_of_32(name, size):
    with pytest.raises(ValueError, match="multiple of 32"):
        B.build(name, size)


@pytest.mark.parametrize("name,size", [("inception_v3", 64), ("squeezenet1_1", 8)])
def test_too_small_input_is_a_clear_error(name, size):
    with pytest.raises(ValueError, match="too small"):
        B.build(name, size)


def test_deterministic_per_seed():
    a = B.build("mobilenet_v2", 32, seed=3).SerializeToString()
    b = B.build("mobilenet_v2", 32, seed=3).SerializeToString()
    c = B.build("mobilenet_v2", 32, seed=4).SerializeToString()
    assert a == b and a != c


def test_vgg16_large_input_pools_to_7x7():
    # torchvision's AdaptiveAvgPool2d((7, 7)) on a 14×14 map: an AveragePool 2/2, and the
    # classifier keeps its published shape. Build the graph without the 553 MB check twice.
    m = B.build("vgg16", 448)
    pools = [n for n in m.graph.node if n.op_type == "AveragePool"]
    assert len(pools) == 1 and pools[0].name == "avgpool"
    assert B.parameter_count(m) == PUBLISHED["vgg16"]


# --- parameter_count conventions ----------------------------------------------------------


def test_parameter_count_conventions_and_qdq():
    w = np.ones((4, 3, 3, 3), np.float32)
    nodes = [
        helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_zp"], ["w_dq"], name="dq"),
        helper.make_node("Conv", ["x", "w_dq", "b"], ["y"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["y", "g", "be", "mu", "var"], ["z"], name="bn"),
        helper.make_node("Clip", ["z", "lo", "hi"], ["out"], name="clip"),
    ]
    inits = [numpy_helper.from_array(w.astype(np.int8), "w_q"),
             numpy_helper.from_array(np.float32(0.1), "w_s"),
             numpy_helper.from_array(np.int8(0), "w_zp"),
             numpy_helper.from_array(np.zeros(4, np.float32), "b")]
    inits += [numpy_helper.from_array(np.ones(4, np.float32), n) for n in ("g", "be", "mu", "var")]
    inits += [numpy_helper.from_array(np.float32(v), n) for n, v in (("lo", 0), ("hi", 6))]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", 1, [1, 3, 4, 4])],
                          [helper.make_tensor_value_info("out", 1, [1, 4, 4, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    assert B.parameter_count(m) == 108 + 4 + 8
    assert B.parameter_count(m, "darknet") == 108 + 4 + 16
    m.metadata_props.append(onnx.StringStringEntryProto(key=B.META_FROZEN_BN, value="1"))
    assert B.parameter_count(m) == 108 + 4
    assert B.parameter_count(m, "darknet") == 108 + 4 + 16
    with pytest.raises(ValueError, match="convention"):
        B.parameter_count(m, "keras")
