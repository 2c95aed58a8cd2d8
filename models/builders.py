"""Architecture-faithful float ONNX models of the networks the ShortcutFusion paper evaluates.

Every builder returns an ``onnx.ModelProto`` (opset 13, batch 1, NCHW, float32) with random but
deterministic weights (one ``numpy`` generator per model, seeded by ``seed``). The graphs look
like what ``torch.onnx.export`` produces for the reference implementations, so the compiler's
passes meet the same patterns they will meet on real models:

* convolutions without bias, each followed by its own ``BatchNormalization`` node (the
  BN-folding pass has work to do); activations are separate nodes: ``Relu``, ``Clip(0, 6)``
  (ReLU6), ``Sigmoid`` + ``Mul`` (SiLU/Swish), ``LeakyRelu(0.1)`` (Darknet);
* squeeze-and-excitation as GlobalAveragePool → Conv1×1 → act → Conv1×1 → Sigmoid → Mul;
* DenseNet's pre-activation BN → Relu → Conv; nearest ``Resize`` ×2 for upsampling; ``Concat``;
  ``MaxPool``/``AveragePool``; classifier heads GlobalAveragePool → Flatten → Gemm.

The reference implementations are torchvision's (classifiers, RetinaNet) and Darknet's ``.cfg``
files (YOLOv2, YOLOv3). Parameter counts match the published ones; see :func:`parameter_count`
for the counting conventions and ``tests/test_builders.py`` for the sources.

Inference-only parts are left out exactly as an exporter leaves them out: Dropout, stochastic
depth, Inception-V3's auxiliary classifier, the detectors' pre-processing (normalise/resize),
anchor decoding and NMS. Detectors return their raw head feature maps.

Weights are He-scaled uniform so activations stay finite through 150+ layers; BN statistics are
near identity, and the last BN of every residual branch has a smaller gamma (like
``zero_init_residual``, but non-zero) so residual sums do not grow as 2^depth.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

__all__ = [
    "BUILDERS",
    "DEFAULT_INPUT_SIZE",
    "build",
    "parameter_count",
    "resnet18",
    "resnet50",
    "resnet152",
    "vgg16",
    "mobilenet_v2",
    "efficientnet_b1",
    "inception_v3",
    "squeezenet1_1",
    "densenet121",
    "yolov2",
    "yolov3",
    "retinanet",
]

OPSET = 13
IR_VERSION = 7  # ONNX 1.8 shipped IR 7 with opset 13; every onnxruntime since 1.6 loads it

# metadata_props keys written by the builders (read back by parameter_count).
META_ARCH = "sfnpu.arch"
META_FROZEN_BN = "sfnpu.frozen_bn"

Size = int | tuple[int, int]


def _fill_tensor(t: onnx.TensorProto, name: str, array: np.ndarray) -> None:
    """Fill ``t`` (already inside the graph) as a float32 tensor with raw little-endian data.
    Building in place avoids the copies numpy_helper.from_array + make_graph + make_model
    would make: VGG-16 carries 553 MB of weights."""
    if array.dtype != np.float32:
        raise TypeError(f"{name}: expected float32, got {array.dtype}")
    t.name = name
    t.data_type = TensorProto.FLOAT
    t.dims.extend(array.shape)
    t.raw_data = np.ascontiguousarray(array, dtype="<f4").tobytes()


# ---------------------------------------------------------------------------------------------
# Graph construction helper
# ---------------------------------------------------------------------------------------------


class _Net:
    """Accumulates nodes and initializers and tracks every tensor's static NCHW shape."""

    def __init__(self, arch: str, seed: int, input_size: Size, input_name: str = "input"):
        h, w = (input_size, input_size) if isinstance(input_size, int) else tuple(input_size)
        if h < 1 or w < 1:
            raise ValueError(f"{arch}: input size must be positive, got {input_size!r}")
        self.arch = arch
        self.rng = np.random.default_rng(seed)
        self.proto = onnx.ModelProto()  # initializers are written straight into it
        self.nodes: list[onnx.NodeProto] = []
        self.inits: set[str] = set()
        self.init_shapes: dict[str, tuple[int, ...]] = {}
        self.shapes: dict[str, tuple[int, ...]] = {input_name: (1, 3, h, w)}
        self.node_names: set[str] = set()
        self.input_name = input_name
        self._relu6_bounds: tuple[str, str] | None = None

    # -- bookkeeping ------------------------------------------------------------------------

    def _node(self, op: str, inputs: Sequence[str], name: str, shape: tuple[int, ...],
              **attrs) -> str:
        if name in self.node_names or name in self.shapes:
            raise ValueError(f"{self.arch}: duplicate node/tensor name {name!r}")
        if any(d < 1 for d in shape):
            h, w = self.shapes[self.input_name][2:]
            raise ValueError(f"{self.arch}: input size {h}x{w} is too small "
                             f"(node {name!r} would have shape {shape})")
        self.node_names.add(name)
        self.nodes.append(helper.make_node(op, list(inputs), [name], name=name, **attrs))
        self.shapes[name] = tuple(shape)
        return name

    def _const(self, name: str, array: np.ndarray) -> str:
        if name in self.inits:
            raise ValueError(f"{self.arch}: duplicate initializer {name!r}")
        self.inits.add(name)
        _fill_tensor(self.proto.graph.initializer.add(), name, array)
        self.init_shapes[name] = tuple(array.shape)
        return name

    def _uniform(self, shape: tuple[int, ...], bound: float) -> np.ndarray:
        a = self.rng.random(shape, dtype=np.float32)
        a *= np.float32(2.0 * bound)
        a -= np.float32(bound)
        return a

    def _weight(self, name: str, shape: tuple[int, ...], fan_in: int, gain: float) -> str:
        # He/Kaiming uniform: Var = gain / fan_in.
        return self._const(name, self._uniform(shape, math.sqrt(3.0 * gain / fan_in)))

    def c(self, x: str) -> int:
        return self.shapes[x][1]

    # -- layers -----------------------------------------------------------------------------

    def conv(self, x: str, cout: int, k: int | tuple[int, int], name: str, s: int = 1,
             p: int | tuple[int, int] | None = None, groups: int = 1, bias: bool = False,
             params: str | None = None, gain: float = 2.0) -> str:
        """Conv2d. ``params`` names the weights (default: the node name); passing the name of
        an existing parameter set shares it (RetinaNet's head runs on every pyramid level)."""
        n, cin, h, w = self.shapes[x]
        kh, kw = (k, k) if isinstance(k, int) else k
        if p is None:
            ph, pw = (kh - 1) // 2, (kw - 1) // 2
        else:
            ph, pw = (p, p) if isinstance(p, int) else p
        if cin % groups or cout % groups:
            raise ValueError(f"{self.arch}: {name}: channels {cin}->{cout} not divisible "
                             f"by groups={groups}")
        prefix = params or name
        wname, bname = f"{prefix}.weight", f"{prefix}.bias"
        wshape = (cout, cin // groups, kh, kw)
        if wname in self.inits:  # shared parameters
            if self.init_shapes[wname] != wshape:
                raise ValueError(f"{self.arch}: {name}: cannot share {wname} "
                                 f"{self.init_shapes[wname]} as {wshape}")
            if bias != (bname in self.inits):
                raise ValueError(f"{self.arch}: {name}: bias mismatch sharing {prefix}")
        else:
            self._weight(wname, wshape, (cin // groups) * kh * kw, gain)
            if bias:
                self._const(bname, self._uniform((cout,), 0.1))
        inputs = [x, wname] + ([bname] if bias else [])
        ho = (h + 2 * ph - kh) // s + 1
        wo = (w + 2 * pw - kw) // s + 1
        return self._node("Conv", inputs, name, (n, cout, ho, wo), kernel_shape=[kh, kw],
                          strides=[s, s], pads=[ph, pw, ph, pw], dilations=[1, 1], group=groups)

    def bn(self, x: str, name: str, eps: float = 1e-5, gamma: tuple[float, float] = (0.8, 1.2)
           ) -> str:
        c = self.c(x)
        g = self.rng.uniform(*gamma, size=c).astype(np.float32)
        b = self.rng.uniform(-0.1, 0.1, size=c).astype(np.float32)
        m = self.rng.uniform(-0.1, 0.1, size=c).astype(np.float32)
        v = self.rng.uniform(0.8, 1.2, size=c).astype(np.float32)
        ins = [x] + [self._const(f"{name}.{t}", a) for t, a in
                     (("weight", g), ("bias", b), ("running_mean", m), ("running_var", v))]
        return self._node("BatchNormalization", ins, name, self.shapes[x], epsilon=float(eps),
                          momentum=0.9)

    def relu(self, x: str, name: str) -> str:
        return self._node("Relu", [x], name, self.shapes[x])

    def relu6(self, x: str, name: str) -> str:
        if self._relu6_bounds is None:
            self._relu6_bounds = (self._const("relu6.min", np.array(0.0, np.float32)),
                                  self._const("relu6.max", np.array(6.0, np.float32)))
        return self._node("Clip", [x, *self._relu6_bounds], name, self.shapes[x])

    def leaky(self, x: str, name: str, alpha: float = 0.1) -> str:
        return self._node("LeakyRelu", [x], name, self.shapes[x], alpha=alpha)

    def sigmoid(self, x: str, name: str) -> str:
        return self._node("Sigmoid", [x], name, self.shapes[x])

    def silu(self, x: str, name: str) -> str:
        s = self.sigmoid(x, f"{name}.sigmoid")
        return self.mul(x, s, name)

    def act(self, x: str, kind: str | None, name: str) -> str:
        if kind is None:
            return x
        return {"relu": self.relu, "relu6": self.relu6, "leaky": self.leaky,
                "silu": self.silu, "sigmoid": self.sigmoid}[kind](x, name)

    def add(self, a: str, b: str, name: str) -> str:
        if self.shapes[a] != self.shapes[b]:
            raise ValueError(f"{self.arch}: {name}: Add of {self.shapes[a]} and {self.shapes[b]}")
        return self._node("Add", [a, b], name, self.shapes[a])

    def mul(self, a: str, b: str, name: str) -> str:
        sa, sb = self.shapes[a], self.shapes[b]
        shape = tuple(max(i, j) for i, j in zip(sa, sb))  # broadcasting (SE gate is N×C×1×1)
        return self._node("Mul", [a, b], name, shape)

    def concat(self, xs: Sequence[str], name: str) -> str:
        n, _, h, w = self.shapes[xs[0]]
        for x in xs:
            if self.shapes[x][2:] != (h, w):
                raise ValueError(f"{self.arch}: {name}: Concat of mismatched spatial shapes "
                                 f"{[self.shapes[t] for t in xs]}")
        return self._node("Concat", list(xs), name, (n, sum(self.c(x) for x in xs), h, w),
                          axis=1)

    def _pool(self, op: str, x: str, k: int, s: int, p: int, ceil: bool, name: str,
              **extra) -> str:
        n, c, h, w = self.shapes[x]
        rnd = math.ceil if ceil else math.floor

        def out(d: int) -> int:
            o = int(rnd((d + 2 * p - k) / s)) + 1
            if ceil and (o - 1) * s >= d + p:  # the last window must start inside the input
                o -= 1
            return o

        return self._node(op, [x], name, (n, c, out(h), out(w)), kernel_shape=[k, k],
                          strides=[s, s], pads=[p, p, p, p], ceil_mode=int(ceil), **extra)

    def maxpool(self, x: str, k: int, s: int, name: str, p: int = 0, ceil: bool = False) -> str:
        return self._pool("MaxPool", x, k, s, p, ceil, name)

    def avgpool(self, x: str, k: int, s: int, name: str, p: int = 0, ceil: bool = False) -> str:
        # PyTorch's default count_include_pad=True, as torch.onnx exports it.
        return self._pool("AveragePool", x, k, s, p, ceil, name, count_include_pad=1)

    def gap(self, x: str, name: str) -> str:
        n, c, _, _ = self.shapes[x]
        return self._node("GlobalAveragePool", [x], name, (n, c, 1, 1))

    def flatten(self, x: str, name: str) -> str:
        shape = self.shapes[x]
        return self._node("Flatten", [x], name, (shape[0], int(np.prod(shape[1:]))), axis=1)

    def gemm(self, x: str, out: int, name: str, gain: float = 1.0) -> str:
        n, fin = self.shapes[x]
        w = self._weight(f"{name}.weight", (out, fin), fin, gain)  # PyTorch layout, transB=1
        b = self._const(f"{name}.bias", self._uniform((out,), 0.1))
        return self._node("Gemm", [x, w, b], name, (n, out), alpha=1.0, beta=1.0, transB=1)

    def resize2x(self, x: str, name: str) -> str:
        n, c, h, w = self.shapes[x]
        scales = self._const(f"{name}.scales", np.array([1, 1, 2, 2], np.float32))
        # What torch.onnx exports for nn.Upsample(scale_factor=2, mode="nearest").
        return self._node("Resize", [x, "", scales], name, (n, c, 2 * h, 2 * w), mode="nearest",
                          coordinate_transformation_mode="asymmetric", nearest_mode="floor")

    def space_to_depth(self, x: str, block: int, name: str) -> str:
        n, c, h, w = self.shapes[x]
        if h % block or w % block:
            raise ValueError(f"{self.arch}: {name}: {h}x{w} not divisible by {block}")
        return self._node("SpaceToDepth", [x], name, (n, c * block * block, h // block,
                                                      w // block), blocksize=block)

    # -- composites -------------------------------------------------------------------------

    def cba(self, x: str, cout: int, k: int | tuple[int, int], prefix: str, act: str | None,
            s: int = 1, p: int | tuple[int, int] | None = None, groups: int = 1,
            names: tuple[str, str, str] = ("conv", "bn", "relu"), eps: float = 1e-5,
            gamma: tuple[float, float] = (0.8, 1.2)) -> str:
        """Conv (no bias) → BatchNormalization → activation, named ``prefix.<names[i]>``."""
        sep = "." if prefix else ""
        cn, bn, an = (f"{prefix}{sep}{n}" for n in names)
        y = self.conv(x, cout, k, cn, s=s, p=p, groups=groups)
        y = self.bn(y, bn, eps=eps, gamma=gamma)
        return self.act(y, act, an)

    def classifier_head(self, x: str, num_classes: int, fc: str, pool: str = "avgpool") -> str:
        y = self.gap(x, pool)
        y = self.flatten(y, "flatten")
        return self.gemm(y, num_classes, fc)

    # -- output -----------------------------------------------------------------------------

    def model(self, outputs: Sequence[str] | dict[str, str], doc: str,
              meta: dict[str, str] | None = None) -> onnx.ModelProto:
        """Finish the graph. ``outputs`` maps public output names to internal tensors (or
        lists tensors to expose under their own names). The producing node's output tensor is
        renamed (its node name stays), as an exporter names graph outputs; a tensor that is
        also consumed inside the graph is exposed through an Identity instead."""
        if not isinstance(outputs, dict):
            outputs = {t: t for t in outputs}
        nodes = list(self.nodes)
        consumed = {i for n in nodes for i in n.input}
        rename = {t: p for p, t in outputs.items() if p != t and t not in consumed}
        for n in nodes:
            if n.output[0] in rename:
                n.output[0] = rename[n.output[0]]
        out_infos = []
        for public, tensor in outputs.items():
            if public in self.shapes or public in self.node_names:
                raise ValueError(f"{self.arch}: output name {public!r} is already used")
            if public != tensor and tensor in consumed:
                nodes.append(helper.make_node("Identity", [tensor], [public],
                                              name=f"{public}.identity"))
            out_infos.append(helper.make_tensor_value_info(public, TensorProto.FLOAT,
                                                           list(self.shapes[tensor])))
        m = self.proto
        g = m.graph
        g.name = self.arch
        g.node.extend(nodes)
        g.input.append(helper.make_tensor_value_info(self.input_name, TensorProto.FLOAT,
                                                     list(self.shapes[self.input_name])))
        g.output.extend(out_infos)
        m.ir_version = IR_VERSION
        m.opset_import.append(helper.make_opsetid("", OPSET))
        m.producer_name = "sfnpu.models.builders"
        m.producer_version = "1"
        m.doc_string = doc
        props = {META_ARCH: self.arch, **(meta or {})}
        for k, v in props.items():
            m.metadata_props.append(onnx.StringStringEntryProto(key=k, value=str(v)))
        return m


def _need_multiple(arch: str, size: Size, m: int) -> None:
    h, w = (size, size) if isinstance(size, int) else size
    if h % m or w % m:
        raise ValueError(f"{arch}: input size must be a multiple of {m}, got {h}x{w}")


# Gamma range for the last BN of a residual branch (see module docstring).
_RES_GAMMA = (0.2, 0.4)


# ---------------------------------------------------------------------------------------------
# ResNet (torchvision, v1.5: stride on the 3×3 of the bottleneck)
# ---------------------------------------------------------------------------------------------


def _resnet_body(net: _Net, x: str, block: str, layers: Sequence[int], prefix: str = ""
                 ) -> list[str]:
    """Stem + four stages; returns the outputs of layer1..layer4 (C2..C5)."""
    p = f"{prefix}." if prefix else ""
    y = net.cba(x, 64, 7, "", "relu", s=2, p=3, names=(f"{p}conv1", f"{p}bn1", f"{p}relu"))
    y = net.maxpool(y, 3, 2, f"{p}maxpool", p=1)
    expansion = 1 if block == "basic" else 4
    outs = []
    for li, (planes, n) in enumerate(zip((64, 128, 256, 512), layers), start=1):
        for bi in range(n):
            s = 2 if (bi == 0 and li > 1) else 1
            b = f"{p}layer{li}.{bi}"
            identity = y
            if block == "basic":
                z = net.cba(y, planes, 3, b, "relu", s=s, names=("conv1", "bn1", "relu1"))
                z = net.cba(z, planes, 3, b, None, names=("conv2", "bn2", ""), gamma=_RES_GAMMA)
            else:
                z = net.cba(y, planes, 1, b, "relu", names=("conv1", "bn1", "relu1"))
                z = net.cba(z, planes, 3, b, "relu", s=s, names=("conv2", "bn2", "relu2"))
                z = net.cba(z, planes * 4, 1, b, None, names=("conv3", "bn3", ""),
                            gamma=_RES_GAMMA)
            if s != 1 or net.c(y) != planes * expansion:
                identity = net.cba(y, planes * expansion, 1, b, None, s=s,
                                   names=("downsample.0", "downsample.1", ""))
            y = net.add(z, identity, f"{b}.add")
            y = net.relu(y, f"{b}.relu")
        outs.append(y)
    return outs


def _resnet(arch: str, block: str, layers: Sequence[int], input_size: Size, seed: int,
            num_classes: int) -> onnx.ModelProto:
    net = _Net(arch, seed, input_size)
    c5 = _resnet_body(net, net.input_name, block, layers)[-1]
    y = net.classifier_head(c5, num_classes, "fc")
    return net.model({"logits": y}, f"{arch} (torchvision layout), random weights")


def resnet18(input_size: Size = 224, seed: int = 0, num_classes: int = 1000) -> onnx.ModelProto:
    return _resnet("resnet18", "basic", (2, 2, 2, 2), input_size, seed, num_classes)


def resnet50(input_size: Size = 224, seed: int = 0, num_classes: int = 1000) -> onnx.ModelProto:
    return _resnet("resnet50", "bottleneck", (3, 4, 6, 3), input_size, seed, num_classes)


def resnet152(input_size: Size = 224, seed: int = 0, num_classes: int = 1000) -> onnx.ModelProto:
    return _resnet("resnet152", "bottleneck", (3, 8, 36, 3), input_size, seed, num_classes)


# ---------------------------------------------------------------------------------------------
# VGG-16 (torchvision, no BN: convolutions carry biases)
# ---------------------------------------------------------------------------------------------


def vgg16(input_size: Size = 224, seed: int = 0, num_classes: int = 1000) -> onnx.ModelProto:
    """VGG-16 (configuration D). torchvision's AdaptiveAvgPool2d((7, 7)) is exported as an
    AveragePool when the 5th-stage map is a multiple of 7 larger than 7 and vanishes at 7×7;
    for other input sizes the classifier flattens whatever map there is (the first Gemm then
    has 512·h·w inputs instead of 25088)."""
    net = _Net("vgg16", seed, input_size)
    y, idx = net.input_name, 0
    for cout in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                 512, 512, 512, "M"):
        if cout == "M":
            y = net.maxpool(y, 2, 2, f"features.{idx}")
            idx += 1
        else:
            y = net.conv(y, cout, 3, f"features.{idx}", bias=True)
            y = net.relu(y, f"features.{idx + 1}")
            idx += 2
    h, w = net.shapes[y][2:]
    if h == w and h > 7 and h % 7 == 0:
        y = net.avgpool(y, h // 7, h // 7, "avgpool")
    y = net.flatten(y, "flatten")
    y = net.relu(net.gemm(y, 4096, "classifier.0", gain=2.0), "classifier.1")
    y = net.relu(net.gemm(y, 4096, "classifier.3", gain=2.0), "classifier.4")
    y = net.gemm(y, num_classes, "classifier.6")
    return net.model({"logits": y}, "VGG-16 (torchvision layout), random weights")


# ---------------------------------------------------------------------------------------------
# MobileNetV2 (torchvision)
# ---------------------------------------------------------------------------------------------


def mobilenet_v2(input_size: Size = 224, seed: int = 0, num_classes: int = 1000
                 ) -> onnx.ModelProto:
    net = _Net("mobilenet_v2", seed, input_size)
    y = net.cba(net.input_name, 32, 3, "features.0", "relu6", s=2, names=("0", "1", "2"))
    idx = 1
    for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                       (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)):
        for i in range(n):
            stride = s if i == 0 else 1
            p = f"features.{idx}"
            inp = net.c(y)
            hidden = int(round(inp * t))
            z = y
            if t != 1:
                z = net.cba(z, hidden, 1, f"{p}.expand", "relu6")
            z = net.cba(z, hidden, 3, f"{p}.dw", "relu6", s=stride, groups=hidden)
            z = net.cba(z, c, 1, f"{p}.project", None,
                        gamma=_RES_GAMMA if (stride == 1 and inp == c) else (0.8, 1.2))
            y = net.add(y, z, f"{p}.add") if (stride == 1 and inp == c) else z
            idx += 1
    y = net.cba(y, 1280, 1, f"features.{idx}", "relu6", names=("0", "1", "2"))
    y = net.classifier_head(y, num_classes, "classifier.1")
    return net.model({"logits": y}, "MobileNetV2 (torchvision layout), random weights")


# ---------------------------------------------------------------------------------------------
# EfficientNet-B1 (torchvision: width 1.0, depth 1.1)
# ---------------------------------------------------------------------------------------------


def efficientnet_b1(input_size: Size = 240, seed: int = 0, num_classes: int = 1000
                    ) -> onnx.ModelProto:
    net = _Net("efficientnet_b1", seed, input_size)
    eps = 1e-3
    y = net.cba(net.input_name, 32, 3, "features.0", "silu", s=2, names=("0", "1", "2"),
                eps=eps)
    depth_mult = 1.1
    # (expand ratio, kernel, stride, out channels, layers) of EfficientNet-B0.
    stages = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
              (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))
    for si, (e, k, s, c, n) in enumerate(stages, start=1):
        for i in range(int(math.ceil(n * depth_mult))):
            stride = s if i == 0 else 1
            p = f"features.{si}.{i}"
            inp = net.c(y)
            hidden = inp * e
            residual = stride == 1 and inp == c
            z = y
            if e != 1:
                z = net.cba(z, hidden, 1, f"{p}.expand", "silu", names=("conv", "bn", "silu"),
                            eps=eps)
            z = net.cba(z, hidden, k, f"{p}.dw", "silu", s=stride, groups=hidden,
                        names=("conv", "bn", "silu"), eps=eps)
            # Squeeze-and-excitation on the expanded features, squeeze = block input // 4.
            sq = max(1, inp // 4)
            g = net.gap(z, f"{p}.se.avgpool")
            g = net.conv(g, sq, 1, f"{p}.se.fc1", bias=True)
            g = net.silu(g, f"{p}.se.silu")
            g = net.conv(g, hidden, 1, f"{p}.se.fc2", bias=True, gain=1.0)
            g = net.sigmoid(g, f"{p}.se.sigmoid")
            z = net.mul(z, g, f"{p}.se.scale")
            z = net.cba(z, c, 1, f"{p}.project", None, names=("conv", "bn", ""), eps=eps,
                        gamma=_RES_GAMMA if residual else (0.8, 1.2))
            # Stochastic depth is the identity at inference.
            y = net.add(z, y, f"{p}.add") if residual else z
    y = net.cba(y, 4 * net.c(y), 1, "features.8", "silu", names=("0", "1", "2"), eps=eps)
    y = net.classifier_head(y, num_classes, "classifier.1")
    return net.model({"logits": y}, "EfficientNet-B1 (torchvision layout), random weights")


# ---------------------------------------------------------------------------------------------
# Inception-V3 (torchvision, without the training-only auxiliary classifier)
# ---------------------------------------------------------------------------------------------


def inception_v3(input_size: Size = 299, seed: int = 0, num_classes: int = 1000
                 ) -> onnx.ModelProto:
    net = _Net("inception_v3", seed, input_size)

    def bc(x, cout, k, name, s=1, p=0):
        # torchvision BasicConv2d: conv (no bias) → BN(eps=1e-3) → ReLU.
        return net.cba(x, cout, k, name, "relu", s=s, p=p, eps=1e-3)

    def pool_branch(x, cout, name):
        y = net.avgpool(x, 3, 1, f"{name}.avgpool", p=1)
        return bc(y, cout, 1, name)

    def inc_a(x, pool_features, m):
        b1 = bc(x, 64, 1, f"{m}.branch1x1")
        b5 = bc(bc(x, 48, 1, f"{m}.branch5x5_1"), 64, 5, f"{m}.branch5x5_2", p=2)
        b3 = bc(x, 64, 1, f"{m}.branch3x3dbl_1")
        b3 = bc(b3, 96, 3, f"{m}.branch3x3dbl_2", p=1)
        b3 = bc(b3, 96, 3, f"{m}.branch3x3dbl_3", p=1)
        bp = pool_branch(x, pool_features, f"{m}.branch_pool")
        return net.concat([b1, b5, b3, bp], f"{m}.concat")

    def inc_b(x, m):
        b3 = bc(x, 384, 3, f"{m}.branch3x3", s=2)
        bd = bc(x, 64, 1, f"{m}.branch3x3dbl_1")
        bd = bc(bd, 96, 3, f"{m}.branch3x3dbl_2", p=1)
        bd = bc(bd, 96, 3, f"{m}.branch3x3dbl_3", s=2)
        bp = net.maxpool(x, 3, 2, f"{m}.branch_pool")
        return net.concat([b3, bd, bp], f"{m}.concat")

    def inc_c(x, c7, m):
        b1 = bc(x, 192, 1, f"{m}.branch1x1")
        b7 = bc(x, c7, 1, f"{m}.branch7x7_1")
        b7 = bc(b7, c7, (1, 7), f"{m}.branch7x7_2", p=(0, 3))
        b7 = bc(b7, 192, (7, 1), f"{m}.branch7x7_3", p=(3, 0))
        bd = bc(x, c7, 1, f"{m}.branch7x7dbl_1")
        bd = bc(bd, c7, (7, 1), f"{m}.branch7x7dbl_2", p=(3, 0))
        bd = bc(bd, c7, (1, 7), f"{m}.branch7x7dbl_3", p=(0, 3))
        bd = bc(bd, c7, (7, 1), f"{m}.branch7x7dbl_4", p=(3, 0))
        bd = bc(bd, 192, (1, 7), f"{m}.branch7x7dbl_5", p=(0, 3))
        bp = pool_branch(x, 192, f"{m}.branch_pool")
        return net.concat([b1, b7, bd, bp], f"{m}.concat")

    def inc_d(x, m):
        b3 = bc(bc(x, 192, 1, f"{m}.branch3x3_1"), 320, 3, f"{m}.branch3x3_2", s=2)
        b7 = bc(x, 192, 1, f"{m}.branch7x7x3_1")
        b7 = bc(b7, 192, (1, 7), f"{m}.branch7x7x3_2", p=(0, 3))
        b7 = bc(b7, 192, (7, 1), f"{m}.branch7x7x3_3", p=(3, 0))
        b7 = bc(b7, 192, 3, f"{m}.branch7x7x3_4", s=2)
        bp = net.maxpool(x, 3, 2, f"{m}.branch_pool")
        return net.concat([b3, b7, bp], f"{m}.concat")

    def inc_e(x, m):
        b1 = bc(x, 320, 1, f"{m}.branch1x1")
        b3 = bc(x, 384, 1, f"{m}.branch3x3_1")
        b3 = net.concat([bc(b3, 384, (1, 3), f"{m}.branch3x3_2a", p=(0, 1)),
                         bc(b3, 384, (3, 1), f"{m}.branch3x3_2b", p=(1, 0))],
                        f"{m}.branch3x3.concat")
        bd = bc(x, 448, 1, f"{m}.branch3x3dbl_1")
        bd = bc(bd, 384, 3, f"{m}.branch3x3dbl_2", p=1)
        bd = net.concat([bc(bd, 384, (1, 3), f"{m}.branch3x3dbl_3a", p=(0, 1)),
                         bc(bd, 384, (3, 1), f"{m}.branch3x3dbl_3b", p=(1, 0))],
                        f"{m}.branch3x3dbl.concat")
        bp = pool_branch(x, 192, f"{m}.branch_pool")
        return net.concat([b1, b3, bd, bp], f"{m}.concat")

    y = bc(net.input_name, 32, 3, "Conv2d_1a_3x3", s=2)
    y = bc(y, 32, 3, "Conv2d_2a_3x3")
    y = bc(y, 64, 3, "Conv2d_2b_3x3", p=1)
    y = net.maxpool(y, 3, 2, "maxpool1")
    y = bc(y, 80, 1, "Conv2d_3b_1x1")
    y = bc(y, 192, 3, "Conv2d_4a_3x3")
    y = net.maxpool(y, 3, 2, "maxpool2")
    y = inc_a(y, 32, "Mixed_5b")
    y = inc_a(y, 64, "Mixed_5c")
    y = inc_a(y, 64, "Mixed_5d")
    y = inc_b(y, "Mixed_6a")
    for m, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)):
        y = inc_c(y, c7, m)
    y = inc_d(y, "Mixed_7a")
    y = inc_e(y, "Mixed_7b")
    y = inc_e(y, "Mixed_7c")
    y = net.classifier_head(y, num_classes, "fc")
    return net.model({"logits": y}, "Inception-V3 (torchvision layout, no AuxLogits), "
                     "random weights")


# ---------------------------------------------------------------------------------------------
# SqueezeNet 1.1 (torchvision; no BN, convolutions carry biases)
# ---------------------------------------------------------------------------------------------


def squeezenet1_1(input_size: Size = 224, seed: int = 0, num_classes: int = 1000
                  ) -> onnx.ModelProto:
    """SqueezeNet 1.1. Its classifier is a 1×1 conv + ReLU + global average pool (no Gemm)."""
    net = _Net("squeezenet1_1", seed, input_size)

    def fire(x, sq, e1, e3, p):
        s = net.relu(net.conv(x, sq, 1, f"{p}.squeeze", bias=True), f"{p}.squeeze_activation")
        a = net.relu(net.conv(s, e1, 1, f"{p}.expand1x1", bias=True),
                     f"{p}.expand1x1_activation")
        b = net.relu(net.conv(s, e3, 3, f"{p}.expand3x3", bias=True),
                     f"{p}.expand3x3_activation")
        return net.concat([a, b], f"{p}.concat")

    y = net.conv(net.input_name, 64, 3, "features.0", s=2, p=0, bias=True)
    y = net.relu(y, "features.1")
    y = net.maxpool(y, 3, 2, "features.2", ceil=True)
    y = fire(y, 16, 64, 64, "features.3")
    y = fire(y, 16, 64, 64, "features.4")
    y = net.maxpool(y, 3, 2, "features.5", ceil=True)
    y = fire(y, 32, 128, 128, "features.6")
    y = fire(y, 32, 128, 128, "features.7")
    y = net.maxpool(y, 3, 2, "features.8", ceil=True)
    for i, (sq, e) in enumerate(((48, 192), (48, 192), (64, 256), (64, 256)), start=9):
        y = fire(y, sq, e, e, f"features.{i}")
    y = net.conv(y, num_classes, 1, "classifier.1", bias=True, gain=1.0)
    y = net.relu(y, "classifier.2")
    y = net.gap(y, "classifier.3")
    y = net.flatten(y, "flatten")
    return net.model({"logits": y}, "SqueezeNet 1.1 (torchvision layout), random weights")


# ---------------------------------------------------------------------------------------------
# DenseNet-121 (torchvision)
# ---------------------------------------------------------------------------------------------


def densenet121(input_size: Size = 224, seed: int = 0, num_classes: int = 1000
                ) -> onnx.ModelProto:
    """DenseNet-121 (growth 32, bn_size 4, blocks 6/12/24/16). As in the exported torchvision
    model, every dense layer concatenates all earlier feature maps of its block itself, so a
    block of n layers has n Concat nodes (the last one is the block output)."""
    net = _Net("densenet121", seed, input_size)
    growth, bn_size = 32, 4

    def pre_act_conv(x, cout, k, norm, relu, conv):
        # DenseNet's pre-activation: BN → ReLU → Conv (no bias; 3×3 padded by 1).
        return net.conv(net.relu(net.bn(x, norm), relu), cout, k, conv)

    y = net.cba(net.input_name, 64, 7, "features", "relu", s=2, p=3,
                names=("conv0", "norm0", "relu0"))
    y = net.maxpool(y, 3, 2, "features.pool0", p=1)
    for bi, n in enumerate((6, 12, 24, 16), start=1):
        feats = [y]
        for li in range(1, n + 1):
            p = f"features.denseblock{bi}.denselayer{li}"
            x = feats[0] if len(feats) == 1 else net.concat(feats, f"{p}.concat")
            z = pre_act_conv(x, bn_size * growth, 1, f"{p}.norm1", f"{p}.relu1", f"{p}.conv1")
            z = pre_act_conv(z, growth, 3, f"{p}.norm2", f"{p}.relu2", f"{p}.conv2")
            feats.append(z)
        y = net.concat(feats, f"features.denseblock{bi}.concat")
        if bi != 4:
            t = f"features.transition{bi}"
            y = pre_act_conv(y, net.c(y) // 2, 1, f"{t}.norm", f"{t}.relu", f"{t}.conv")
            y = net.avgpool(y, 2, 2, f"{t}.pool")
    y = net.relu(net.bn(y, "features.norm5"), "features.relu5")
    y = net.classifier_head(y, num_classes, "classifier")
    return net.model({"logits": y}, "DenseNet-121 (torchvision layout), random weights")


# ---------------------------------------------------------------------------------------------
# YOLOv2 and YOLOv3 (Darknet .cfg; names follow the cfg layer indices)
# ---------------------------------------------------------------------------------------------


# COCO anchors from the Darknet cfg files, recorded in the model metadata for decoders.
# yolov2.cfg: (w, h) in 13×13-grid cells; yolov3.cfg: pixels, masks 6-8 / 3-5 / 0-2 belong to
# the stride-32 / 16 / 8 outputs.
YOLOV2_ANCHORS = "0.57273,0.677385, 1.87446,2.06253, 3.33843,5.47434, 7.88282,3.52778, " \
                 "9.77052,9.16828"
YOLOV3_ANCHORS = "10,13, 16,30, 33,23, 30,61, 62,45, 59,119, 116,90, 156,198, 373,326"


def _dn_conv(net: _Net, x: str, cout: int, k: int, i: int, s: int = 1,
             gamma: tuple[float, float] = (0.8, 1.2)) -> str:
    """Darknet [convolutional] with batch_normalize=1 and leaky activation, layer ``i``."""
    return net.cba(x, cout, k, f"layer{i}", "leaky", s=s, names=("conv", "bn", "leaky"),
                   gamma=gamma)


def _dn_detect(net: _Net, x: str, cout: int, i: int) -> str:
    """Darknet [convolutional] 1×1, linear activation, with bias (the detection layer)."""
    return net.conv(x, cout, 1, f"layer{i}.conv", bias=True, gain=1.0)


def yolov2(input_size: Size = 416, seed: int = 0, num_classes: int = 80) -> onnx.ModelProto:
    """YOLOv2 (Darknet ``yolov2.cfg``): Darknet-19 backbone, passthrough (reorg) from the
    26×26 map, 5 anchors → 5·(5+num_classes) output channels (425 for COCO's 80 classes).
    The reorg layer is exported as SpaceToDepth(2); Darknet's reorg orders the 4·C channels
    differently, which only permutes the next conv's input channels."""
    _need_multiple("yolov2", input_size, 32)
    net = _Net("yolov2", seed, input_size)
    y, i = net.input_name, 0
    route16 = None
    for item in (32, "M", 64, "M", (128, 3), (64, 1), (128, 3), "M", (256, 3), (128, 1),
                 (256, 3), "M", (512, 3), (256, 1), (512, 3), (256, 1), (512, 3), "M",
                 (1024, 3), (512, 1), (1024, 3), (512, 1), (1024, 3), (1024, 3), (1024, 3)):
        if item == "M":
            y = net.maxpool(y, 2, 2, f"layer{i}.maxpool")
        else:
            c, k = (item, 3) if isinstance(item, int) else item
            y = _dn_conv(net, y, c, k, i)
        if i == 16:
            route16 = y
        i += 1
    # 25: route 16; 26: conv 64 1×1; 27: reorg /2; 28: route 27, 24.
    p = _dn_conv(net, route16, 64, 1, 26)
    p = net.space_to_depth(p, 2, "layer27.reorg")
    y = net.concat([p, y], "layer28.route")
    y = _dn_conv(net, y, 1024, 3, 29)
    y = _dn_detect(net, y, 5 * (5 + num_classes), 30)
    return net.model({"output": y}, f"YOLOv2 (Darknet yolov2.cfg, {num_classes} classes, "
                     "5 anchors), random weights",
                     {"sfnpu.num_classes": str(num_classes), "sfnpu.anchors": YOLOV2_ANCHORS})


def yolov3(input_size: Size = 416, seed: int = 0, num_classes: int = 80) -> onnx.ModelProto:
    """YOLOv3 (Darknet ``yolov3.cfg``): Darknet-53 (52 conv + 23 residual shortcuts) and a
    3-scale head with two nearest ×2 upsamples and route concats; 3 anchors per scale →
    3·(5+num_classes) channels per output (255 for COCO). 75 convolutions in all."""
    _need_multiple("yolov3", input_size, 32)
    net = _Net("yolov3", seed, input_size)
    routes: dict[int, str] = {}
    i = 0

    def conv(x, c, k, s=1, gamma=(0.8, 1.2)):
        nonlocal i
        y = _dn_conv(net, x, c, k, i, s=s, gamma=gamma)
        routes[i] = y
        i += 1
        return y

    y = conv(net.input_name, 32, 3)
    for c, n in ((64, 1), (128, 2), (256, 8), (512, 8), (1024, 4)):
        y = conv(y, c, 3, s=2)
        for _ in range(n):
            z = conv(y, c // 2, 1)
            z = conv(z, c, 3, gamma=_RES_GAMMA)
            y = net.add(y, z, f"layer{i}.shortcut")
            routes[i] = y
            i += 1
    assert i == 75 and net.c(routes[36]) == 256 and net.c(routes[61]) == 512
    outs = {}
    for scale, (c, skip) in enumerate(((512, None), (256, 61), (128, 36))):
        if skip is not None:
            src = routes[i - 4]  # [route] -4: the 5th conv (1x1) of the previous scale
            i += 1
            y = conv(src, c, 1)
            y = net.resize2x(y, f"layer{i}.upsample")
            i += 1
            y = net.concat([y, routes[skip]], f"layer{i}.route")  # [route] -1, skip
            i += 1
        for _ in range(3):
            y = conv(y, c, 1)
            y = conv(y, 2 * c, 3)
        outs[f"output_stride{32 >> scale}"] = _dn_detect(net, y, 3 * (5 + num_classes), i)
        i += 2  # the detection conv and the [yolo] layer
    assert i == 107
    return net.model(outs, f"YOLOv3 (Darknet yolov3.cfg, {num_classes} classes, 3 anchors per "
                     "scale), random weights",
                     {"sfnpu.num_classes": str(num_classes), "sfnpu.anchors": YOLOV3_ANCHORS})


# ---------------------------------------------------------------------------------------------
# RetinaNet (torchvision retinanet_resnet50_fpn, v1)
# ---------------------------------------------------------------------------------------------


def retinanet(input_size: Size = 512, seed: int = 0, num_classes: int = 91) -> onnx.ModelProto:
    """RetinaNet: ResNet-50 backbone (frozen BN in torchvision: BN weight/bias are buffers, not
    parameters), FPN on C3–C5 with P6 = conv(P5), P7 = conv(relu(P6)), and the class and box
    subnets (4 × [3×3 conv 256 + ReLU] + 3×3 predictor), whose weights are shared across
    P3–P7. 9 anchors per location; 91 classes (torchvision's COCO convention). Outputs are the
    raw per-level head maps (torchvision's permute/reshape/concat and decoding are left out)."""
    _need_multiple("retinanet", input_size, 32)
    net = _Net("retinanet", seed, input_size)
    anchors = 9
    _, c3, c4, c5 = _resnet_body(net, net.input_name, "bottleneck", (3, 4, 6, 3),
                                  prefix="backbone.body")
    fpn = "backbone.fpn"
    laterals = [net.conv(c, 256, 1, f"{fpn}.inner_blocks.{k}", bias=True)
                for k, c in enumerate((c3, c4, c5))]
    last = laterals[2]
    results = [net.conv(last, 256, 3, f"{fpn}.layer_blocks.2", bias=True)]
    for k in (1, 0):
        up = net.resize2x(last, f"{fpn}.upsample.{k}")
        last = net.add(laterals[k], up, f"{fpn}.add.{k}")
        results.insert(0, net.conv(last, 256, 3, f"{fpn}.layer_blocks.{k}", bias=True))
    p6 = net.conv(results[2], 256, 3, f"{fpn}.extra_blocks.p6", s=2, bias=True)
    p7 = net.conv(net.relu(p6, f"{fpn}.extra_blocks.relu"), 256, 3, f"{fpn}.extra_blocks.p7",
                  s=2, bias=True)
    levels = dict(zip(("p3", "p4", "p5", "p6", "p7"), [*results, p6, p7]))
    outs = {}
    for head, pred, cout in (("classification_head", "cls_logits", anchors * num_classes),
                             ("regression_head", "bbox_reg", anchors * 4)):
        h = f"head.{head}"
        for lvl, x in levels.items():
            y = x
            for j in range(4):
                y = net.conv(y, 256, 3, f"{h}.conv.{j}.{lvl}", bias=True, params=f"{h}.conv.{j}")
                y = net.relu(y, f"{h}.relu.{j}.{lvl}")
            y = net.conv(y, cout, 3, f"{h}.{pred}.{lvl}", bias=True, params=f"{h}.{pred}",
                         gain=1.0)
            outs[f"{'cls' if pred == 'cls_logits' else 'box'}_{lvl}"] = y
    return net.model(outs, f"RetinaNet ResNet-50-FPN (torchvision v1 layout, {num_classes} "
                     f"classes, {anchors} anchors), random weights",
                     {META_FROZEN_BN: "1", "sfnpu.num_classes": str(num_classes)})


# ---------------------------------------------------------------------------------------------
# Registry and parameter counting
# ---------------------------------------------------------------------------------------------

BUILDERS: dict[str, Callable[..., onnx.ModelProto]] = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "resnet152": resnet152,
    "vgg16": vgg16,
    "mobilenet_v2": mobilenet_v2,
    "efficientnet_b1": efficientnet_b1,
    "inception_v3": inception_v3,
    "squeezenet1_1": squeezenet1_1,
    "densenet121": densenet121,
    "yolov2": yolov2,
    "yolov3": yolov3,
    "retinanet": retinanet,
}

DEFAULT_INPUT_SIZE: dict[str, int] = {
    "resnet18": 224, "resnet50": 224, "resnet152": 224, "vgg16": 224, "mobilenet_v2": 224,
    "efficientnet_b1": 240, "inception_v3": 299, "squeezenet1_1": 224, "densenet121": 224,
    "yolov2": 416, "yolov3": 416, "retinanet": 512,
}


def build(name: str, input_size: Size | None = None, seed: int = 0,
          num_classes: int | None = None) -> onnx.ModelProto:
    """Build the named network. ``input_size`` is an int (square) or (H, W); ``None`` picks
    the network's customary size (see ``DEFAULT_INPUT_SIZE``); ``num_classes=None`` keeps the
    published head (1000 ImageNet classes, 80 COCO classes for YOLO, 91 for RetinaNet)."""
    try:
        fn = BUILDERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown network {name!r}; supported: {', '.join(BUILDERS)}") from None
    kwargs: dict = {"seed": seed}
    kwargs["input_size"] = DEFAULT_INPUT_SIZE[name] if input_size is None else input_size
    if num_classes is not None:
        kwargs["num_classes"] = num_classes
    return fn(**kwargs)


def _meta(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def parameter_count(model: onnx.ModelProto, convention: str = "torchvision") -> int:
    """Count learnable parameters the way the published numbers count them.

    ``"torchvision"`` (PyTorch's ``sum(p.numel() for p in model.parameters())``, also Keras'
    "trainable params"): Conv/ConvTranspose/Gemm/MatMul weights and biases plus BN scale and
    bias; BN running mean/variance are buffers and not counted. Models whose BN is frozen
    (metadata ``sfnpu.frozen_bn``; torchvision's FrozenBatchNorm2d in RetinaNet) count no BN
    tensors at all.

    ``"darknet"``: every float in a Darknet ``.weights`` file, i.e. additionally the BN running
    mean and variance (for every BN, frozen or not).

    Shared initializers count once. Weights behind a DequantizeLinear (QDQ models) are
    followed back to their initializer.
    """
    if convention not in ("torchvision", "darknet"):
        raise ValueError(f"unknown convention {convention!r}; use 'torchvision' or 'darknet'")
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    dq = {n.output[0]: n.input[0] for n in g.node if n.op_type == "DequantizeLinear"}
    frozen = _meta(model).get(META_FROZEN_BN, "0") not in ("", "0", "false", "False")

    def resolve(name: str) -> str:
        return dq.get(name, name)

    counted: set[str] = set()
    for n in g.node:
        if n.op_type in ("Conv", "ConvTranspose", "Gemm"):
            idx: Sequence[int] = (1, 2)
        elif n.op_type == "MatMul":
            idx = (0, 1)
        elif n.op_type == "BatchNormalization":
            if convention == "darknet":
                idx = (1, 2, 3, 4)
            else:
                idx = () if frozen else (1, 2)
        else:
            continue
        for k in idx:
            if k < len(n.input) and resolve(n.input[k]) in inits:
                counted.add(resolve(n.input[k]))
    return int(sum(int(np.prod(inits[t].dims, dtype=np.int64)) for t in counted))
