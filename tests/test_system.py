"""The whole accelerator on Verilator: compiled images against the golden model, bit for bit.

Each run goes through :class:`sfnpu.tb.system.SystemHarness`, that is cocotb's runner and the
testbench of :mod:`sfnpu.tb.cocotb_system`: the image is loaded through the DRAM model's
backdoor, the testbench programs the CSRs over AXI4-Lite and waits for the interrupt, and the
scoreboard (:class:`sfnpu.tb.system.Scoreboard`) compares the whole DRAM with the golden
model's DRAM after the same image — outputs and every intermediate tensor — and the per-group
log (cycles, DRAM bytes) with the cycle model's. Error runs check
the error code, the failing group and that the core returns to idle (no hang).
"""

import dataclasses
import functools
import math
import os
import struct

import numpy as np
import onnx
import pytest

from netbuild import Net, Slice
from sfnpu import image, isa, layout
from sfnpu.models import builders
from sfnpu.compiler.pipeline import compile_model, run_onnxruntime
from sfnpu.compiler.quantize import CalibrationSource, quantize_model
from sfnpu.config import get_config
from sfnpu.limits import (StoreSizes, overflows, prefetch_fits, stages_input, streams_weights,
                          with_held_weights)
from sfnpu.compiler.blocks import detect_blocks
from sfnpu.compiler.memory import Policy, apply_policy, staging
from sfnpu.isa import Activation, ConvKind, InputTransform, MemSpace, Reuse
from sfnpu.regmap import ErrorCode
from sfnpu.sim.cycle import CycleModel, compare
from sfnpu.sim.golden import GoldenModel
from sfnpu.tb.system import SYSTEM_BUILDS, Scoreboard, SystemHarness

BUILD = SYSTEM_BUILDS          # shared with `sfnpu sim` (one build per config)
CONFIGS = ("tiny", "ecp5")


@pytest.fixture(scope="module", params=CONFIGS)
def harness(request):
    return system_harness(request.param)


@functools.cache
def system_harness(config_name):
    """One harness per configuration and process (elaborating it to Verilog takes seconds
    even when the Verilator build is cached)."""
    return SystemHarness(get_config(config_name), BUILD / config_name)


def compiled_image(tmp_path, net, outputs, config, seed=0):
    path = tmp_path / f"{net.name}.qdq.onnx"
    quantize_model(net.model(outputs, opset=14), path, CalibrationSource.synthetic(4, seed=1),
                   activation_signed=getattr(net, "signed", False))
    compiled = compile_model(path, config)
    return compiled, compiled.program.pack(compiled.quantise_inputs({"x": net.samples(1,
                                                                                  seed=seed)}))


def conv_stack(name="stack", seed=3):
    """3×3 conv + ReLU (in_c 3), depthwise 3×3 stride 2 + ReLU, 1×1 conv with two input-channel
    blocks (partial sums) and 12 outputs (a padded channel block)."""
    net = Net((3, 12, 12), seed=seed, name=name)
    x = net.op("Relu", [net.conv("x", 3, 16, 3)])
    x = net.op("Relu", [net.conv(x, 16, 16, 3, stride=2, group=16)])
    return net, [net.conv(x, 16, 12, 1, pads=[0, 0, 0, 0])]


def table_net():
    """A 256-entry activation table (HardSwish), a 5×5 depthwise with stride 2, a 7×7 conv with
    asymmetric padding, a non-square input."""
    net = Net((8, 10, 14), seed=5, name="tables")
    x = net.op("HardSwish", [net.conv("x", 8, 16, 1, pads=[0, 0, 0, 0])])
    x = net.op("Sigmoid", [net.conv(x, 16, 16, 5, stride=2, group=16)])
    return net, [net.conv(x, 16, 8, 3, pads=[0, 1, 2, 1])]


def concat_net():
    """Concat by redirection (the second producer writes at channel offset 8), a stand-alone
    activation-table group (conv NONE) over both channel blocks."""
    net = Net((3, 8, 8), seed=4, name="concat")
    a = net.op("Relu", [net.conv("x", 3, 8, 3)])
    b = net.conv("x", 3, 8, 1, pads=[0, 0, 0, 0])
    s = net.op("Sigmoid", [net.op("Concat", [a, b], axis=1)])
    return net, [net.conv(s, 16, 8, 3)]


def preact_net():
    """Pre-activation BN → ReLU on the graph input (nothing to fold it into): the consumer
    convolution's per-channel input tables, with the transformed zero point as padding."""
    net = Net((16, 6, 6), seed=6, name="preact")
    c = 16
    bn = net.op("BatchNormalization", [
        "x", net.const(net.rng.uniform(0.5, 2, c)), net.const(net.rng.standard_normal(c)),
        net.const(net.rng.standard_normal(c) * 0.1), net.const(net.rng.uniform(0.5, 2, c))])
    return net, [net.conv(net.op("Relu", [bn]), 16, 8, 3, stride=2)]


def wide_net():
    """A 3×3 convolution with 128 → 64 channels (72 KiB of weights, more than the tiny and ecp5
    weight stores): its weights stream from DRAM for every output row."""
    net = Net((16, 4, 5), seed=7, name="wide")
    x = net.op("Relu", [net.conv("x", 16, 128, 1, pads=[0, 0, 0, 0])])
    return net, [net.conv(x, 128, 64, 3)]


def head_stream_net():
    """PP-LCNet's head in small: a global average pool, then a 1×1 convolution with 128 → 640
    channels (80 KiB of weights, more than the tiny and ecp5 weight stores) over the one
    pixel, whose weights stream a word per set: each set leaves its bank for the weight
    buffer's output register before the array takes it."""
    net = Net((16, 4, 4), seed=16, name="headstream")
    x = net.op("Relu", [net.conv("x", 16, 128, 1, pads=[0, 0, 0, 0])])
    x = net.op("GlobalAveragePool", [x])
    return net, [net.conv(x, 128, 640, 1, pads=[0, 0, 0, 0])]


def add_stream_net():
    """MobileNetV2's last inverted residual in small: 160 → 960 → 160 channels by 1×1
    convolutions over one pixel, both streaming their weights (150 KiB each), the second
    adding the block's input: each output block is written as its last pass ends, once its
    shortcut words are in."""
    net = Net((16, 1, 1), seed=5, name="addstream")
    a = net.conv("x", 16, 160, 1, pads=[0, 0, 0, 0])
    b = net.op("Relu", [net.conv(a, 160, 960, 1, pads=[0, 0, 0, 0])])
    return net, [net.op("Add", [net.conv(b, 960, 160, 1, pads=[0, 0, 0, 0]), a])]


def add_rows_net():
    """ResNet-50's layer3 expansion with its residual add in small: two 1×1 convolutions with
    128 → 1024 channels over a 4×7 map (128 KiB of weights each, more than the ecp5 weight
    store: both stream), the second adding the first's output. On ecp5 a conv row's shortcut
    words (7 × 128 blocks) exceed the shortcut FIFO (512 words), so the reader commands the
    row's later segments as the ADD takes the earlier ones; the weight stream takes the bus
    first, the shortcut falls behind the results, and the datapath holds on a full result
    FIFO until the ADD has taken them."""
    net = Net((128, 4, 7), seed=17, name="addrows")
    a = net.conv("x", 128, 1024, 1, pads=[0, 0, 0, 0])
    b = net.conv("x", 128, 1024, 1, pads=[0, 0, 0, 0])
    return net, [net.op("Add", [b, a])]


def chunked_net():
    """A 3×3 convolution with 128 → 128 channels (144 KiB of weights) between two 1×1 ones: in
    frame reuse with its maps on chip it takes its weights in double-buffered chunks of three
    output blocks (half of a 1024-word store), each loaded while the one before computes."""
    net = Net((16, 4, 5), seed=15, name="chunked")
    x = net.op("Relu", [net.conv("x", 16, 128, 1, pads=[0, 0, 0, 0])])
    x = net.op("Relu", [net.conv(x, 128, 128, 3)])
    return net, [net.conv(x, 128, 8, 1, pads=[0, 0, 0, 0])]


def chunked_residual_net():
    """A 3×3 convolution with 128 → 128 channels plus a shortcut (QLinearAdd): in frame reuse
    its weights come in chunks of output blocks, and each chunk's shortcut words start at
    its first block (the sequencer's chunk offset, ob_base · sc_plane)."""
    net = Net((16, 4, 5), seed=21, name="chunkres")
    x = net.op("Relu", [net.conv("x", 16, 128, 1, pads=[0, 0, 0, 0])])
    y = net.op("Relu", [net.op("Add", [net.conv(x, 128, 128, 3), x])])
    return net, [net.conv(y, 128, 8, 1, pads=[0, 0, 0, 0])]


def residual_net():
    """ResNet basic block: the second convolution's output plus the shortcut (QLinearAdd), then
    ReLU; a pre-activation BN → ReLU behind the add becomes the next convolution's input
    tables."""
    net = Net((16, 6, 7), seed=8, name="residual")
    y = net.op("Relu", [net.conv("x", 16, 16, 3)])
    s = net.op("Relu", [net.op("Add", [net.conv(y, 16, 16, 3), "x"])])
    c = 16
    bn = net.op("BatchNormalization", [
        s, net.const(net.rng.uniform(0.5, 2, c)), net.const(net.rng.standard_normal(c)),
        net.const(net.rng.standard_normal(c) * 0.1), net.const(net.rng.uniform(0.5, 2, c))])
    return net, [net.conv(net.op("Relu", [bn]), 16, 8, 3, stride=2)]


def se_net():
    """Squeeze-and-excitation: depthwise 3×3 + HardSwish, global average pool, two 1×1
    convolutions, HardSigmoid, channel scale (QLinearMul), a classifier-style head."""
    net = Net((24, 5, 6), seed=9, name="se")
    x = net.op("HardSwish", [net.conv("x", 24, 24, 3, group=24)])
    g = net.op("GlobalAveragePool", [x])
    g = net.op("Relu", [net.conv(g, 24, 8, 1, pads=[0, 0, 0, 0])])
    g = net.op("HardSigmoid", [net.conv(g, 8, 24, 1, pads=[0, 0, 0, 0])])
    y = net.conv(net.op("Mul", [x, g]), 24, 16, 1, pads=[0, 0, 0, 0])
    return net, [net.op("GlobalAveragePool", [net.op("HardSwish", [y])])]


def gate_net():
    """Products of two maps (Eltwise.MUL): a spatial-attention gate ``x · Sigmoid(conv(x))``
    on two channel blocks, and the product of two convolutions of it."""
    net = Net((8, 6, 7), seed=12, name="gates")
    x = net.op("Relu", [net.conv("x", 8, 16, 3)])
    x = net.op("Mul", [x, net.op("Sigmoid", [net.conv(x, 16, 16, 1, pads=[0, 0, 0, 0])])])
    y = net.op("Mul", [net.conv(x, 16, 16, 3), net.conv(x, 16, 16, 1, pads=[0, 0, 0, 0])])
    return net, [net.conv(y, 16, 8, 1, pads=[0, 0, 0, 0])]


def pool_up_net():
    """Max pools 3×3/2 (padding 1) and 2×2/2, a 2× nearest upsample, with several channel
    blocks per row."""
    net = Net((8, 9, 10), seed=10, name="poolup")
    x = net.op("Relu", [net.conv("x", 8, 24, 3)])
    x = net.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    x = net.op("Relu", [net.conv(x, 24, 16, 1, pads=[0, 0, 0, 0])])
    u = net.op("Resize", [x, "", net.const(np.array([1, 1, 2, 2], np.float32))],
               mode="nearest", coordinate_transformation_mode="asymmetric",
               nearest_mode="floor")
    y = net.op("MaxPool", [net.conv(u, 16, 16, 3)], kernel_shape=[2, 2], strides=[2, 2])
    return net, [y]


def avg_pool_net():
    """Average pools: 3×3 stride 1 with padding not counted, 2×2 stride 2; an ADD whose
    activation table follows it (HardSwish after the residual add)."""
    net = Net((16, 7, 8), seed=11, name="avgpool")
    x = net.op("Relu", [net.conv("x", 16, 16, 3)])
    x = net.op("AveragePool", [x], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
               count_include_pad=0)
    y = net.op("HardSwish", [net.op("Add", [net.conv(x, 16, 16, 1, pads=[0, 0, 0, 0]), x])])
    y = net.op("AveragePool", [net.conv(y, 16, 8, 3)], kernel_shape=[2, 2], strides=[2, 2])
    return net, [y]


def _max_pool_3x3_s1(net, x):
    return net.op("MaxPool", [x], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])


def max_pool_s1_net():
    """Stride-1 max pools with padding (overlapping windows): a 1×1 convolution + ReLU + MaxPool
    3×3/1 padding 1 on a 6×7 map with two channel blocks, then two more such pools, each a
    group of its own (a copy): the pool takes a pixel per cycle, plus a cycle per segment for
    the second window that ends at its last pixel, so with a result per cycle from the array
    the pool sets the pace."""
    net = Net((8, 6, 7), seed=15, name="maxpools1")
    x = _max_pool_3x3_s1(net, net.op("Relu", [net.conv("x", 8, 16, 1, pads=[0, 0, 0, 0])]))
    x = _max_pool_3x3_s1(net, _max_pool_3x3_s1(net, x))
    return net, [net.conv(x, 16, 8, 1, pads=[0, 0, 0, 0])]


def sppf_net():
    """YOLO's SPPF in small: its 5×5/1 max pools (padding 2) as two 3×3/1 pools each, in
    series, and the concat of the input and both pooled maps (written at their channel
    offsets) into a 1×1 convolution."""
    net = Net((8, 8, 9), seed=16, name="sppf")
    x = net.op("Relu", [net.conv("x", 8, 8, 1, pads=[0, 0, 0, 0])])
    p1 = _max_pool_3x3_s1(net, _max_pool_3x3_s1(net, x))
    p2 = _max_pool_3x3_s1(net, _max_pool_3x3_s1(net, p1))
    y = net.op("Concat", [x, p1, p2], axis=1)
    return net, [net.op("Relu", [net.conv(y, 24, 16, 1, pads=[0, 0, 0, 0])])]


def coverage_net():
    """What the other networks leave out (tb/coverage.py): int8 activations, 20×20 maps,
    a 7×7 convolution from 3 to 12 channels (a partly filled block), HardSwish
    before a residual add whose shortcut has a non-zero zero point, an average pool that
    counts its padding, a 2×2 (even) kernel down to 4 channels."""
    net = Net((3, 20, 20), seed=12, name="coverage")
    net.signed = True
    a = net.conv("x", 3, 12, 7, pads=[3, 3, 3, 3])
    b = net.op("HardSwish", [net.conv(a, 12, 12, 1, pads=[0, 0, 0, 0])])
    s = net.op("AveragePool", [net.op("Add", [b, a])], kernel_shape=[3, 3], strides=[2, 2],
               pads=[1, 1, 1, 1], count_include_pad=1)
    return net, [net.conv(s, 12, 4, 2, pads=[0, 0, 1, 1])]


def stem_net():
    """A ResNet-style stem over 2 channels: 7×7 conv stride 2 (the compiler runs it as a 4×4
    stride-1 conv with pads 2 before and 1 after over the SpaceToDepth of the input, which the
    host prologue hands over: 8 channels at 12×12), ReLU, 3×3 max pool stride 2, then a 3×3
    conv."""
    net = Net((2, 24, 24), seed=14, name="stem")
    x = net.op("Relu", [net.conv("x", 2, 16, 7, stride=2, pads=[3, 3, 3, 3])])
    x = net.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    return net, [net.conv(x, 16, 8, 3)]


def taps_net():
    """A stem whose taps the host lays out as channels: a 2×2 conv over 2 channels with SAME
    padding (8 taps, one of `tiny`'s lane blocks) runs 1×1 over the taps, 8 channels at
    16×16, then ReLU and a 3×3 conv."""
    net = Net((2, 16, 16), seed=15, name="taps")
    x = net.op("Relu", [net.conv("x", 2, 16, 2, pads=[0, 0, 1, 1])])
    return net, [net.conv(x, 16, 8, 3)]


def wide_depthwise_net():
    """A 7×7 depthwise conv (two-part column fetches): on `tiny` and `ecp5` its 13 steps per
    pixel are fewer than the 14 cycles of a row's first window, the case every depthwise
    layer of a wide array is in (kcu1500: one step); then a 1×1 conv."""
    net = Net((16, 10, 10), seed=19, name="wide_depthwise")
    x = net.conv("x", 16, 16, 7, group=16, pads=[3, 3, 3, 3])
    return net, [net.conv(x, 16, 8, 1, pads=[0, 0, 0, 0])]


def row_taps_net():
    """A stem whose rows' taps the host lays out as channels: a 3×3 conv over 2 channels (18
    taps, more than `tiny`'s 8 lanes; a row's 6 fit) runs 3×1 over 6 channels at 16×16,
    then ReLU, a 2×2 max pool and a 3×3 conv."""
    net = Net((2, 16, 16), seed=16, name="row_taps")
    x = net.op("Relu", [net.conv("x", 2, 16, 3)])
    x = net.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    return net, [net.conv(x, 16, 8, 3)]


def dense_block():
    """DenseNet-121's dense block 1 and transition 1, cut from the builder's graph at a 32×32
    input (8×8 maps): six composite layers BN → ReLU → 1×1 conv → BN → ReLU → 3×3 conv, each
    concatenating every earlier map (64 → 256 channels, the hardware's limit for per-channel
    tables), then BN → ReLU → 1×1 conv → 2×2 average pool. The BN behind each 1×1 conv folds
    into it; the pre-activation BN → ReLU behind each concat becomes the next convolution's
    per-channel input tables."""
    net = Slice(builders.densenet121(32), "features.pool0", ["features.transition1.pool"],
                "densenet121_block1")
    return net, net.outputs


def shared_head_net():
    """RetinaNet's head pattern: two 3×3 convolutions whose weights are shared by two pyramid
    levels (8×8 and 4×4), built level by level; the compiler runs each shared layer over both
    levels back to back, and the second one finds the weights in the store (weights_held)."""
    net = Net((16, 8, 8), seed=13, name="sharedhead")
    p3 = net.op("Relu", [net.conv("x", 16, 16, 3)])
    p4 = net.op("Relu", [net.conv(p3, 16, 16, 3, stride=2)])
    layers = [(net.const(net.rng.standard_normal((16, 16, 3, 3)) * np.sqrt(2 / 144), "w"),
               net.const(net.rng.standard_normal(16) * 0.1, "b")) for _ in range(2)]
    outputs = []
    for y in (p3, p4):
        for w, b in layers:
            y = net.op("Relu", [net.op("Conv", [y, w, b], kernel_shape=[3, 3], strides=[1, 1],
                                       pads=[1, 1, 1, 1])])
        outputs.append(y)
    return net, outputs


def shared_wide_net():
    """RetinaNet's class predictor in small: a 3×3 convolution shared by two levels whose
    weights (128 → 96 channels, 108 KiB) exceed the tiny and ecp5 weight stores; the compiler
    splits it into two 48-channel slices that each fit, concatenated into the output, so every
    slice's weights are held from the first level to the second."""
    net = Net((16, 6, 6), seed=14, name="sharedwide")
    p3 = net.op("Relu", [net.conv("x", 16, 128, 3)])
    p4 = net.op("Relu", [net.conv(p3, 128, 128, 1, stride=2, pads=[0, 0, 0, 0])])
    w = net.const(net.rng.standard_normal((96, 128, 3, 3)) * np.sqrt(2 / 1152), "w")
    b = net.const(net.rng.standard_normal(96) * 0.1, "b")
    return net, [net.op("Conv", [y, w, b], kernel_shape=[3, 3], strides=[1, 1],
                        pads=[1, 1, 1, 1]) for y in (p3, p4)]


def pre_activations(model):
    """Outputs of the BNs that no convolution produces (so none can absorb them) and of the
    ReLUs behind them."""
    producer = {o: n.op_type for n in model.graph.node for o in n.output}
    bns = {n.output[0] for n in model.graph.node
           if n.op_type == "BatchNormalization" and producer.get(n.input[0]) != "Conv"}
    return bns | {n.output[0] for n in model.graph.node
                  if n.op_type == "Relu" and n.input[0] in bns}


#: The regression networks the system tests run on the RTL as compiled (row reuse), and those
#: also run under the all-frame policy with their buffers renamed; tb/coverage.py measures
#: exactly these programs (:func:`regression_programs`).
REGRESSION = (conv_stack, table_net, concat_net, preact_net, wide_net, residual_net, se_net,
              pool_up_net, avg_pool_net, coverage_net, dense_block, shared_head_net, stem_net,
              chunked_net, chunked_residual_net, taps_net, row_taps_net, head_stream_net,
              add_stream_net, max_pool_s1_net, sppf_net, gate_net)
FRAME_REGRESSION = (residual_net, se_net, conv_stack, wide_net, shared_head_net, stem_net,
                    chunked_net, chunked_residual_net, max_pool_s1_net, sppf_net, gate_net)


def clamped(program):
    """The program with an explicit CLAMP on its first two groups, one end at the type's
    limit and the other narrowed (the compiler folds Relu/Clip into the quantiser's range,
    so only a hand-set instruction reaches these fields)."""
    def clamp(instr, narrow_low):
        lo, hi = (-128, 127) if instr.out_signed else (0, 255)
        lo, hi = (lo + 30, hi) if narrow_low else (lo, hi - 40)
        return instr.replace(act=Activation.CLAMP, clamp_lo=lo, clamp_hi=hi)
    first, second, *rest = program.instructions
    return dataclasses.replace(program, instructions=[clamp(first, True), clamp(second, False),
                                                      *rest])


def rotated_buffers(program, steps=1):
    """The program with on-chip buffer k renamed k + steps (mod 3): the three buffers are
    interchangeable, so the result must not change (and each operand visits every buffer)."""
    def move(loc):
        if loc.space == MemSpace.DRAM:
            return loc
        return isa.buffer((loc.space.value - MemSpace.BUF0.value + steps) % 3, loc.offset)
    return dataclasses.replace(program, instructions=[
        i.replace(input=move(i.input), output=move(i.output), shortcut=move(i.shortcut))
        for i in program.instructions])


def frame_program(compiled):
    blocks = detect_blocks(compiled.graph, compiled.groups)
    return apply_policy(compiled, Policy.uniform(blocks, Reuse.FRAME), blocks)


def regression_programs(config, tmp_path):
    """Every program the system tests run without an error, in order."""
    for build in REGRESSION:
        net, outputs = build()
        compiled, _ = compiled_image(tmp_path, net, outputs, config)
        yield compiled.program
        if build is conv_stack:
            yield clamped(compiled.program)
        if build in FRAME_REGRESSION:
            yield frame_program(compiled)
            for steps in (1, 2):
                yield rotated_buffers(frame_program(compiled), steps)
    for build, widths in STRIPS:
        yield stripped(tmp_path, build, widths, config)[1].program
    yield compiled_image(tmp_path, *deep_input_net(), config)[0].program   # partial sums


def random_image(program, seed):
    """``program``'s DRAM image with random codes for its inputs."""
    rng = np.random.default_rng(seed)
    inputs = []
    for name in program.inputs:
        tensor = program.graph.tensors[name]
        info = np.iinfo(np.int8 if tensor.qtype.signed else np.uint8)
        inputs.append(rng.integers(info.min, info.max, tensor.shape, dtype=info.dtype,
                                   endpoint=True))
    return program.pack(inputs)


@pytest.mark.skipif(not os.environ.get("SFNPU_REGRESS"), reason=(
    "kcu1500's RTL (4096 MACs) takes about 20 minutes to elaborate and build: make regress"))
def test_kcu1500_runs_the_system_regression(tmp_path):
    """The paper's configuration itself — Ti = To = 64, a 512-bit bus, 3 × 1.5 MiB buffers —
    runs every program of the regression bit-exact and cycle-exact."""
    harness = system_harness("kcu1500")
    programs = list(regression_programs(harness.config, tmp_path))
    assert len(programs) > 50
    for k, program in enumerate(programs):
        run_and_compare(harness, random_image(program, k))


def run_and_compare(harness, blob):
    result = harness.run(blob, max_cycles=2_000_000)
    problems = Scoreboard(harness.config).problems(blob, result)
    assert not problems, "\n".join(problems)
    return result


@pytest.mark.parametrize("build, kinds", [
    (conv_stack, {ConvKind.NORMAL, ConvKind.DEPTHWISE}),
    (table_net, {ConvKind.NORMAL, ConvKind.DEPTHWISE}),
    (concat_net, {ConvKind.NORMAL, ConvKind.NONE}),
    (preact_net, {ConvKind.NORMAL}),
    (wide_net, {ConvKind.NORMAL}),
    (residual_net, {ConvKind.NORMAL}),
    (se_net, {ConvKind.NORMAL, ConvKind.DEPTHWISE, ConvKind.NONE}),
    (pool_up_net, {ConvKind.NORMAL}),
    (avg_pool_net, {ConvKind.NORMAL}),
    (coverage_net, {ConvKind.NORMAL}),
    (shared_head_net, {ConvKind.NORMAL}),
    (stem_net, {ConvKind.NORMAL}),
    (chunked_net, {ConvKind.NORMAL}),
    (chunked_residual_net, {ConvKind.NORMAL}),
    (taps_net, {ConvKind.NORMAL}),
    (row_taps_net, {ConvKind.NORMAL}),
    (wide_depthwise_net, {ConvKind.NORMAL, ConvKind.DEPTHWISE}),
    (head_stream_net, {ConvKind.NORMAL}),
    (add_stream_net, {ConvKind.NORMAL}),
    (max_pool_s1_net, {ConvKind.NORMAL, ConvKind.NONE}),
    (sppf_net, {ConvKind.NORMAL, ConvKind.NONE}),
    (gate_net, {ConvKind.NORMAL}),
])
def test_image_matches_golden(harness, tmp_path, build, kinds):
    net, outputs = build()
    compiled, blob = compiled_image(tmp_path, net, outputs, harness.config)
    assert {i.conv for i in compiled.program.instructions} == kinds
    assert ("fold_input_taps" in compiled.rewrites) == (build in (taps_net, row_taps_net))
    result = run_and_compare(harness, blob)
    groups = len(compiled.program.instructions)
    assert result.counters["CYCLES"] > 0 and len(result.group_cycles) == groups
    # Every group's cycles are logged, and the log adds up to the run (the last group's entry
    # ends in the cycle the run ends).
    assert sum(result.group_cycles) == result.counters["CYCLES"]
    assert result.counters["DRAM_WRITE_BYTES"] == sum(
        a.end - a.start for i in compiled.program.instructions
        for a in layout.accesses(i, harness.config) if a.write)


def test_explicit_clamp(harness, tmp_path):
    net, outputs = conv_stack()
    compiled, _ = compiled_image(tmp_path, net, outputs, harness.config)
    program = clamped(compiled.program)
    run_and_compare(harness, program.pack(compiled.quantise_inputs({"x": net.samples(1)})))


@pytest.mark.parametrize("build", FRAME_REGRESSION)
def test_frame_reuse_with_on_chip_buffers(harness, tmp_path, build):
    """The memory optimizer's all-frame policy: intermediate feature maps, residual operands and
    SE vectors live in the on-chip buffers {0, 1, 2}; the whole DRAM still matches."""
    net, outputs = build()
    compiled, _ = compiled_image(tmp_path, net, outputs, harness.config)
    program = frame_program(compiled)
    spaces = {loc.space for i in program.instructions
              for loc in (i.input, i.output, i.shortcut)}
    assert spaces - {MemSpace.DRAM}, "the policy put nothing on chip"
    assert all(i.reuse == Reuse.FRAME for i in program.instructions)
    for variant in (program, rotated_buffers(program, 1), rotated_buffers(program, 2)):
        blob = variant.pack(compiled.quantise_inputs({"x": net.samples(1)}))
        result = run_and_compare(harness, blob)
        assert len(result.group_cycles) == len(program.instructions)


def test_concat_destination_on_chip(harness, tmp_path):
    """The held long-path policy keeps a concat destination on chip: both producers write
    their parts into one buffer at their channel offsets and the reader takes it from there;
    the whole DRAM still matches."""
    net, outputs = concat_net()
    compiled, _ = compiled_image(tmp_path, net, outputs, harness.config)
    blocks = detect_blocks(compiled.graph, compiled.groups)
    policy = Policy(Policy.uniform(blocks, Reuse.FRAME).modes, hold_long_paths=True)
    program = apply_policy(compiled, policy, blocks)
    dest = next(g.dest for g in compiled.groups if g.dest)
    writers = [i for g, i in zip(compiled.groups, program.instructions) if g.dest == dest]
    assert len(writers) == 2 and {i.output for i in writers} == {writers[0].output}
    assert writers[0].output.space != MemSpace.DRAM
    run_and_compare(harness, program.pack(compiled.quantise_inputs({"x": net.samples(1)})))


def test_frame_reuse_reads_weights_once(tiny_harness, tmp_path):
    """The 72 KiB layer of `wide_net` does not fit the weight store: in row reuse its weights
    cross the bus once per output row, in frame reuse once (chunks of output-channel blocks
    computed over the whole frame, which stays on chip)."""
    config = tiny_harness.config
    net, outputs = wide_net()
    compiled, row_blob = compiled_image(tmp_path, net, outputs, config)
    blocks = detect_blocks(compiled.graph, compiled.groups)
    program = apply_policy(compiled, Policy.uniform(blocks, Reuse.FRAME), blocks)
    frame_blob = program.pack(compiled.quantise_inputs({"x": net.samples(1)}))
    # Everything a group must read once: weights, parameters, DRAM feature maps; plus the
    # header, section table and instructions, and a bus word of slack per command.
    once = sum(layout.weight_bytes(i, config) + layout.param_bytes(i, config)
               + sum(a.end - a.start + 2 * config.dram_bus_bytes * i.in_h * 8
                     for a in layout.accesses(i, config)
                     if not a.write and a.space == MemSpace.DRAM
                     and a.operand in ("input", "shortcut"))
               for i in program.instructions) + 4096
    frame = run_and_compare(tiny_harness, frame_blob).counters["DRAM_READ_BYTES"]
    row = run_and_compare(tiny_harness, row_blob).counters["DRAM_READ_BYTES"]
    assert frame <= once < row


def test_staged_input_crosses_the_bus_once(harness, tmp_path):
    """`wide_net`'s 72 KiB layer in frame reuse with its input in DRAM (the layer before it in
    row reuse): the controller takes the weights in two output-channel chunks and copies the
    input into the staging buffer during the first, so DRAM delivers the input once."""
    config = harness.config
    net, outputs = wide_net()
    compiled, _ = compiled_image(tmp_path, net, outputs, config)
    blocks = detect_blocks(compiled.graph, compiled.groups)
    program = apply_policy(compiled, Policy((Reuse.ROW, Reuse.FRAME)), blocks)
    assert [stages_input(i, config) for i in program.instructions] == [False, True]
    assert staging(program.instructions[1], config) is not None   # the allocation's reserve
    instr = program.instructions[1]
    result = run_and_compare(harness, program.pack(compiled.quantise_inputs(
        {"x": net.samples(1)})))
    once = (layout.weight_bytes(instr, config) + layout.param_bytes(instr, config)
            + layout.tensor_bytes(instr.in_c, instr.in_h, instr.in_w, config.lanes))
    # The instruction fetch and bus-word rounding: far less than a second input read.
    assert once <= result.group_read_bytes[1] <= once + 256


def test_streamed_add_row_exceeds_the_shortcut_fifo(tmp_path):
    """`add_rows_net` on ecp5: both groups stream their weights and the ADD's conv rows hold
    more shortcut words than its FIFO. The RTL computes the golden model's DRAM bit for bit,
    and the cycle model its cycles and bytes group by group (the shortcut commanded as the
    ADD takes words, the datapath's holds on the result FIFO)."""
    config = get_config("ecp5")
    net, outputs = add_rows_net()
    compiled, blob = compiled_image(tmp_path, net, outputs, config)
    conv, add = compiled.program.instructions
    assert add.eltwise == isa.Eltwise.ADD and add.reuse == Reuse.ROW
    assert all(i.space == MemSpace.DRAM for i in (add.input, add.output, add.shortcut))
    assert streams_weights(conv, config) and streams_weights(add, config)
    assert add.out_w * add.out_c // config.lanes > StoreSizes.of(config).psum_words
    result = run_and_compare(system_harness("ecp5"), blob)
    assert len(result.group_cycles) == 2


@pytest.mark.parametrize("frame", [False, True], ids=["row", "frame"])
@pytest.mark.parametrize("build, slices", [(shared_head_net, 0), (shared_wide_net, 2)])
def test_shared_weights_cross_the_bus_once(tiny_harness, tmp_path, frame, build, slices):
    """Groups sharing a weight tensor run back to back and the later ones set weights_held
    (a shared layer too wide for the store is split into slices that fit): the run reads
    exactly those weights' bytes less than the same program with every flag cleared, and both
    match the golden model bit for bit."""
    config = tiny_harness.config
    net, outputs = build()
    compiled, _ = compiled_image(tmp_path, net, outputs, config)
    assert sum(".slice" in g.name for g in compiled.groups) == 2 * slices
    program = frame_program(compiled) if frame else compiled.program
    held = [i for i in program.instructions if i.weights_held]
    assert len(held) == 2
    names = [g.name for g in compiled.groups]
    assert all(i.weights == program.instructions[k - 1].weights
               for k, i in enumerate(program.instructions) if i.weights_held), names
    cleared = dataclasses.replace(program, instructions=[
        i.replace(weights_held=0) for i in program.instructions])
    feeds = compiled.quantise_inputs({"x": net.samples(1)})
    once = run_and_compare(tiny_harness, program.pack(feeds)).counters["DRAM_READ_BYTES"]
    again = run_and_compare(tiny_harness, cleared.pack(feeds)).counters["DRAM_READ_BYTES"]
    assert again - once == sum(layout.weight_bytes(i, config) for i in held)


def test_dense_block_pre_activation_costs_no_sweep(tiny_harness, tmp_path):
    """BN fission-n-fusion for inference on a real DenseNet-121 dense block: the block and the
    same block without its pre-activation BN → ReLU pairs both run on the RTL, bit-exact with
    the golden model. The pre-activations add no group and no pass over a feature map: group
    by group, the bytes written are equal, and the bytes read differ only by the parameters —
    for each convolution behind a pre-activation exactly its tables, 256 bytes per input
    channel, whatever the map size."""
    config = tiny_harness.config
    net, outputs = dense_block()
    drop = pre_activations(net.piece)
    assert len(drop) == 2 * 7           # six composite layers and the transition
    plain = net.bypassed(lambda node: node.output[0] not in drop, "densenet121_block1_plain")
    runs = []
    for variant in (net, plain):
        compiled, blob = compiled_image(tmp_path, variant, outputs, config)
        runs.append((compiled.program.instructions, run_and_compare(tiny_harness, blob)))
    (with_bn, bn_run), (without, plain_run) = runs
    # Every BN folded or fused: 7 groups open with the per-channel tables (the six BNs behind
    # a 1×1 conv folded into it), and no group does anything else for a BN.
    tables = [i for i in with_bn if i.in_transform == InputTransform.CHANNEL_TABLE]
    assert [i.in_c for i in tables] == [64, 96, 128, 160, 192, 224, 256]
    assert all(i.conv == ConvKind.NORMAL for i in tables)
    assert len(with_bn) == len(without)
    assert [(i.conv, i.in_c, i.out_c, i.kh) for i in with_bn] == \
        [(i.conv, i.in_c, i.out_c, i.kh) for i in without]
    assert bn_run.group_write_bytes == plain_run.group_write_bytes
    for a, b, read_a, read_b in zip(with_bn, without, bn_run.group_read_bytes,
                                    plain_run.group_read_bytes):
        params_a, params_b = layout.param_bytes(a, config), layout.param_bytes(b, config)
        assert read_a - params_a == read_b - params_b
        if a.in_transform == InputTransform.CHANNEL_TABLE:
            assert params_a - params_b == 256 * a.in_c


def test_activation_tables_are_used(tmp_path):
    net, outputs = table_net()
    compiled, _ = compiled_image(tmp_path, net, outputs, get_config("tiny"))
    assert sum(i.act == Activation.TABLE for i in compiled.program.instructions) >= 2


# -- windowed groups: column strips that read and write windows of whole tensors in place -------

def strip_net():
    """A 3×3 convolution over a 16-channel 8×20 input, to be split into column strips."""
    net = Net((16, 8, 20), seed=11, name="strips")
    return net, [net.op("Relu", [net.conv("x", 16, 16, 3)])]


def strip_add_net():
    """Two 3×3 convolutions and a residual ADD of the input, to be split into strips: the
    second's strips read windows of the first's output and of the shortcut."""
    net = Net((16, 8, 20), seed=12, name="stripadd")
    y = net.op("Relu", [net.conv("x", 16, 16, 3)])
    return net, [net.op("Relu", [net.op("Add", [net.conv(y, 16, 16, 3), "x"])])]


def column_strips(compiled, widths):
    """``compiled`` with group k split into column strips of output widths ``widths[k]``, left
    to right: windowed groups that read and write windows of the whole tensors in place (a
    location is the window's first pixel, the window record holds the whole tensors'
    pitches), an inner strip's input overlapping its neighbours' by the kernel's halo and
    padded only at the tensor's edges. Each strip has its parameter block (the group's
    sections and the record); consecutive strips share their weights (weights_held)."""
    program = compiled.program
    config, L, old = program.config, program.config.lanes, program.layout
    params_base = old.base(image.SectionKind.PARAMS)
    params = bytearray(program.params)
    drafts = []
    for instr, strip_widths in zip(program.instructions, widths):
        assert instr.pool == isa.Pool.NONE and not instr.upsample
        assert sum(strip_widths) == instr.out_w
        start = instr.params.offset - params_base
        sections = layout.unpack_params(
            program.params[start:start + layout.param_bytes(instr, config)], instr, config)
        record = layout.Geometry.dense(instr, L).record()    # the whole tensors' pitches
        x0 = 0
        for w in strip_widths:
            first = x0 * instr.sw - instr.pad_left       # the window's input columns
            end = (x0 + w - 1) * instr.sw - instr.pad_left + instr.kw
            in_x0, in_x1 = max(first, 0), min(end, instr.in_w)
            strip = instr.replace(
                windowed=1, in_w=in_x1 - in_x0, out_w=w,
                pad_left=in_x0 - first, pad_right=end - in_x1,
                input=isa.dram(instr.input.offset + in_x0 * L),
                output=isa.dram(instr.output.offset + x0 * L),
                weights_held=0, prefetch=0, last=0)
            if instr.eltwise != isa.Eltwise.NONE:
                strip = strip.replace(shortcut=isa.dram(instr.shortcut.offset + x0 * L))
            drafts.append((strip, len(params)))
            params += layout.pack_params(strip, config, **sections, window=record)
            x0 += w
    plan = image.plan(len(drafts), len(params),
                      [s.tensor for s in old.of_kind(image.SectionKind.INPUT)],
                      [s.tensor for s in old.of_kind(image.SectionKind.OUTPUT)],
                      old.section(image.SectionKind.SCRATCH).size, L)

    def moved(loc):
        """The same place of its section in the new image."""
        s = next(s for s in old.sections if s.offset <= loc.offset < s.offset + max(s.size, 1))
        return isa.dram(plan.base(s.kind, s.index) + loc.offset - s.offset)

    strips = []
    for strip, offset in drafts:
        changes = dict(input=moved(strip.input), output=moved(strip.output),
                       weights=moved(strip.weights),
                       params=isa.dram(plan.base(image.SectionKind.PARAMS) + offset))
        if strip.eltwise != isa.Eltwise.NONE:
            changes["shortcut"] = moved(strip.shortcut)
        strips.append(strip.replace(**changes))
    strips = with_held_weights(strips[:-1] + [strips[-1].replace(last=1)], config)
    for strip in strips:
        isa.validate(strip)
    return dataclasses.replace(compiled, program=dataclasses.replace(
        program, instructions=strips, params=bytes(params), layout=plan))


#: Programs split into column strips: (network, strip widths per group; None: every group one
#: windowed strip, its record the dense pitches).
STRIPS = [(conv_stack, None), (strip_net, [[7, 7, 6]]), (strip_add_net, [[10, 10], [6, 8, 6]])]


def stripped(tmp_path, build, widths, config):
    """The network compiled and split as :data:`STRIPS` says, and its quantised input."""
    net, outputs = build()
    compiled, _ = compiled_image(tmp_path, net, outputs, config)
    widths = widths or [[i.out_w] for i in compiled.program.instructions]
    return net, column_strips(compiled, widths)


@pytest.mark.parametrize("build, widths", STRIPS, ids=["dense", "strips", "add-strips"])
def test_column_strips(harness, tmp_path, build, widths):
    """Windowed groups on the RTL: the split program computes the unsplit network (golden
    model against onnxruntime), the RTL the golden model's DRAM bit for bit and the cycle
    model's cycles and bytes group by group."""
    config = harness.config
    net, split = stripped(tmp_path, build, widths, config)
    assert all(i.windowed for i in split.program.instructions)
    x = net.samples(1, seed=0)
    want = run_onnxruntime(onnx.load(str(tmp_path / f"{net.name}.qdq.onnx")), {"x": x})
    got = split.run({"x": x}, GoldenModel(config).outputs)
    assert want.keys() == got.keys()
    for name in want:
        assert np.array_equal(want[name], got[name]), name
    blob = split.program.pack(split.quantise_inputs({"x": x}))
    result = run_and_compare(harness, blob)
    assert len(result.group_cycles) == len(split.program.instructions)


def test_windowed_program_needs_its_geometries(tmp_path):
    """The cycle model takes a windowed group's pitches from the image, or from the caller."""
    config = get_config("tiny")
    _, split = stripped(tmp_path, strip_net, [[7, 7, 6]], config)
    model = CycleModel(config)
    with pytest.raises(ValueError, match="group 0 is windowed"):
        model.run(split.program.instructions)
    blob = split.program.pack([np.zeros((16, 8, 20), np.uint8)])
    img = image.unpack(blob, config)
    geometries = {k: layout.geometry(i, config, img.dram[i.params.offset:][:layout.param_bytes(
        i, config)]) for k, i in enumerate(img.program)}
    assert geometries[1].in_row == 20 * config.lanes       # the whole input's row
    offset = img.layout.of_kind(image.SectionKind.INSTRUCTIONS)[0].offset
    assert model.run(split.program.instructions, geometries=geometries,
                     instructions_offset=offset,
                     section_count=len(img.layout.sections)).groups == model.run(blob).groups


# -- errors: the run stops with the right code and the core returns to idle -----------------------

def instruction_offset(blob, config, index):
    section = image.unpack(blob, config).layout.of_kind(image.SectionKind.INSTRUCTIONS)[0]
    return section.offset + index * isa.WORDS * 4


def patch_instruction(blob, config, index, **changes):
    """The image with instruction ``index`` re-encoded with ``changes`` (no validation: the
    hardware's decoder is under test); CRCs are left alone — the hardware does not check them."""
    return patch_instructions(blob, config, {index: changes})


def patch_instructions(blob, config, changes_by_index):
    """:func:`patch_instruction` for several instructions at once."""
    fields = isa.field_table()
    patched = bytearray(blob)
    for index, changes in changes_by_index.items():
        at = instruction_offset(blob, config, index)
        words = list(struct.unpack_from(f"<{isa.WORDS}I", blob, at))
        value = int.from_bytes(struct.pack(f"<{isa.WORDS}I", *words), "little")
        for name, raw in changes.items():
            field = next(f for f in fields if f.name == name)
            bit = field.word * 32 + field.lsb
            value = value & ~(((1 << field.width) - 1) << bit) | (raw << bit)
        patched[at:at + isa.WORDS * 4] = value.to_bytes(isa.WORDS * 4, "little")
    return bytes(patched)


@pytest.fixture(scope="module")
def stack_blob(tmp_path_factory):
    net, outputs = conv_stack()
    _, blob = compiled_image(tmp_path_factory.mktemp("stack"), net, outputs, get_config("tiny"))
    return blob


@pytest.fixture(scope="module")
def tiny_harness():
    return system_harness("tiny")


@pytest.mark.parametrize("index, changes, code", [
    (1, {"opcode": 0x5}, ErrorCode.ILLEGAL_OPCODE),
    # partial sums: a normal convolution in row reuse, one output row, held by the last group
    (1, {"psum_hold": 1}, ErrorCode.ILLEGAL_FIELD),    # depthwise
    (0, {"psum_hold": 1}, ErrorCode.ILLEGAL_FIELD),    # 12 output rows
    (2, {"psum_hold": 1, "reuse": 1, "in_h": 1, "out_h": 1}, ErrorCode.ILLEGAL_FIELD),
    (2, {"psum_keep": 1, "in_h": 1, "out_h": 1}, ErrorCode.ILLEGAL_FIELD),  # nothing held
    (2, {"psum_hold": 1, "in_h": 1, "out_h": 1, "out_c": 2048},   # 256 blocks × 6 > 1024
     ErrorCode.BUFFER_OVERFLOW),
    (2, {"conv": 3}, ErrorCode.ILLEGAL_FIELD),
    (1, {"out_w": 5}, ErrorCode.ILLEGAL_FIELD),
    (2, {"weights.space": 1}, ErrorCode.UNSUPPORTED),  # weights from a buffer: not built
    (2, {"pool": 1}, ErrorCode.ILLEGAL_FIELD),         # MAX with a zero window
    (2, {"pool": 2}, ErrorCode.ILLEGAL_FIELD),         # AVG with a zero window
    (2, {"out_c_offset": 4}, ErrorCode.UNSUPPORTED),   # concat offset inside a word
    (0, {"weights_held": 1}, ErrorCode.WEIGHTS_NOT_HELD),  # nothing loaded yet in this run
    (2, {"weights_held": 1}, ErrorCode.WEIGHTS_NOT_HELD),  # the store holds group 1's
    (2, {"prefetch": 1}, ErrorCode.ILLEGAL_FIELD),     # the last group: nothing to prefetch
    # input and shortcut in one buffer: one read port per buffer; a shortcut buffer without
    # an element-wise stage
    (2, {"eltwise": 1, "input.space": 2, "shortcut.space": 2}, ErrorCode.ILLEGAL_FIELD),
    (2, {"input.space": 2, "shortcut.space": 2}, ErrorCode.ILLEGAL_FIELD),
    (0, {"prefetch": 1}, ErrorCode.UNSUPPORTED),       # the next group is depthwise
    # windowed: row reuse, feature maps in DRAM only (no window record needed to refuse)
    (1, {"windowed": 1, "reuse": 1}, ErrorCode.UNSUPPORTED),
    (2, {"windowed": 1, "input.space": 2}, ErrorCode.UNSUPPORTED),
    (0, {"windowed": 1, "output.space": 1}, ErrorCode.UNSUPPORTED),
    (1, {"windowed": 1, "eltwise": 1, "shortcut.space": 3}, ErrorCode.UNSUPPORTED),
])
def test_decode_errors(tiny_harness, stack_blob, index, changes, code):
    blob = patch_instruction(stack_blob, tiny_harness.config, index, **changes)
    assert_stops_at(tiny_harness.run(blob, max_cycles=200_000), index, code)


def assert_stops_at(result, index, code):
    assert not result.timeout
    assert result.error and result.done
    assert result.error_code == code
    assert result.error_group == index
    assert len(result.group_cycles) == index        # the groups before it completed


def test_prefetch_beside_dram_traffic_and_past_the_store(tiny_harness, stack_blob):
    """A hand-set prefetch in a row-reuse group, whose input, output and weights share the bus
    with it: the next group computes from the prefetched weights and the DRAM is the same as
    without it, with every byte read once. Next weights that do not fit beside the group's
    own stop the prefetching group with BUFFER_OVERFLOW, as :func:`prefetch_fits` predicts."""
    config = tiny_harness.config
    program = image.unpack(stack_blob, config).program
    assert not any(i.prefetch for i in program) and prefetch_fits(program[1], program[2], config)
    plain = tiny_harness.run(stack_blob, max_cycles=200_000)
    result = tiny_harness.run(patch_instructions(stack_blob, config, {
        1: {"prefetch": 1}, 2: {"weights_held": 1}}), max_cycles=200_000)
    assert result.done and not result.error
    code = image.unpack(stack_blob, config).layout.of_kind(image.SectionKind.INSTRUCTIONS)[0]
    outside = slice(code.end, len(plain.dram))      # everything but the patched instructions
    assert result.dram[outside] == plain.dram[outside]
    assert result.dram[:code.offset] == plain.dram[:code.offset]
    # every byte once; the prefetch also reads the next instruction
    fetch = CycleModel(config).beats(instruction_offset(stack_blob, config, 2), isa.WORDS * 4)
    assert sum(result.group_read_bytes) == sum(plain.group_read_bytes) + \
        fetch * config.dram_bus_bytes
    assert result.group_read_bytes[2] < plain.group_read_bytes[2]

    nxt = program[2]
    blocks = math.isqrt(StoreSizes.of(config).weight_words // (nxt.kh * nxt.kw)) + 1
    big = dict(in_c=blocks * config.lanes, out_c=blocks * config.lanes)
    assert not prefetch_fits(program[1], nxt.replace(**big), config)
    blob = patch_instructions(stack_blob, config, {1: {"prefetch": 1}, 2: big})
    assert_stops_at(tiny_harness.run(blob, max_cycles=200_000), 1, ErrorCode.BUFFER_OVERFLOW)


@pytest.mark.parametrize("index, changes, store", [
    (1, {"input.offset": 1 << 16, "input.space": 1}, "passes the buffer's end"),
    (2, {"in_c": 1000}, "the row buffer holds"),
    (2, {"in_c": 300, "in_transform": 1}, "the table store holds"),
    (2, {"out_c": 2100}, "parameter stores"),
    (1, {"output.offset": 64 * 1024 - 256, "output.space": 2}, "passes the buffer's end"),
], ids=["input-buffer", "row", "table", "channels", "output-buffer"])
def test_store_overflows(tiny_harness, stack_blob, index, changes, store):
    """The compiler's capacity check (:func:`sfnpu.limits.overflows`) names exactly the
    layers the controller stops with BUFFER_OVERFLOW."""
    config = tiny_harness.config
    program = image.unpack(stack_blob, config).program
    assert all(not overflows(instr, config) for instr in program)
    at = instruction_offset(stack_blob, config, index)
    blob = patch_instruction(stack_blob, config, index, **changes)
    patched = isa.decode(struct.unpack_from(f"<{isa.WORDS}I", blob, at))
    assert any(store in problem for problem in overflows(patched, config))
    assert_stops_at(tiny_harness.run(blob, max_cycles=200_000), index,
                    ErrorCode.BUFFER_OVERFLOW)


def test_dma_window_violation(tiny_harness, stack_blob):
    config = tiny_harness.config
    img = image.unpack(stack_blob, config)
    limit = img.layout.of_kind(image.SectionKind.OUTPUT)[0].offset
    # The window ends where the output section starts: the first group that writes at or
    # beyond it (scratch lies after the output) stops the run, at its first refused command.
    failing = next(k for k, instr in enumerate(img.program)
                   if any(a.write and a.end > limit for a in layout.accesses(instr, config)))
    write = next(a for a in layout.accesses(img.program[failing], config) if a.write)
    result = tiny_harness.run(stack_blob, window=(0, limit), max_cycles=200_000)
    assert not result.timeout and result.error
    assert result.error_code == ErrorCode.DMA_WINDOW
    assert result.error_group == failing
    assert write.start <= result.error_addr < write.end


def test_image_mismatch(tiny_harness, stack_blob):
    wrong = bytearray(stack_blob)
    wrong[image.field_offset(image.HEADER_FIELDS, "fingerprint")] ^= 1
    result = tiny_harness.run(bytes(wrong), max_cycles=100_000)
    assert result.error and result.error_code == ErrorCode.IMAGE_MISMATCH
    result = tiny_harness.run(stack_blob, base=32, max_cycles=100_000)   # misaligned base
    assert result.error and result.error_code == ErrorCode.IMAGE_MISMATCH


def test_soft_reset_then_rerun(tiny_harness, stack_blob):
    result = tiny_harness.run(stack_blob, abort_after=1500)
    assert result.aborted and not result.error
    # A clean run after an abort in the same simulation is covered by the next run of the
    # harness (fresh process); here the core must have gone idle (the driver waits for it).
    assert not (result.status & 1)
    run_and_compare(tiny_harness, stack_blob)


def test_image_at_nonzero_base(tiny_harness, stack_blob):
    """An image off any 4 KiB boundary (a multiple of SECTION_ALIGN): the same bytes, and the
    cycle model follows the bursts the new boundaries split."""
    base = 0x10000 + 25 * image.SECTION_ALIGN
    result = tiny_harness.run(stack_blob, base=base, window=(base, base + len(stack_blob) + 8192))
    assert result.done and not result.error
    golden = bytes(GoldenModel(tiny_harness.config).run(stack_blob).dram)
    assert result.dram[base:base + len(golden)] == golden

    def model(image_base):
        return compare(CycleModel(tiny_harness.config).run(stack_blob, image_base=image_base),
                       result.group_cycles, result.group_read_bytes, result.group_write_bytes)
    # Exact at the image's base; at base 0 the second group's reads split elsewhere.
    assert model(base).exact == len(result.group_cycles)
    assert model(0).exact < len(result.group_cycles)


@pytest.mark.parametrize("output_page_offset", [384, 640])
def test_full_write_buffer_holds_the_writes_back(tiny_harness, tmp_path, output_page_offset):
    """A 1×1 convolution over 5×180 pixels (row reuse, DRAM operands): reads and writes share
    the bus, the write buffer fills and the writer commands a row's later chunks only once the
    words before have left it; meanwhile the next input row's read takes the command port.
    With the input 3712 bytes into a 4 KiB page and the output at 384 or 640, the model
    without that rule was 20 or 4 cycles late (RTL 1990 then; 1996 with the DMA's pending
    command stage; 2004 with its decode stage; 2006 with the requantiser's seventh stage)."""
    config = tiny_harness.config
    net = Net((8, 5, 180), seed=8, name="full_write_buffer")
    compiled, _ = compiled_image(tmp_path, net, [net.conv("x", 8, 8, 1, pads=[0, 0, 0, 0])],
                                 config)
    program = compiled.program
    first = program.instructions[0]
    base = (3712 - first.input.offset) % 4096                 # the input 3712 into its page
    end = first.input.offset + layout.tensor_bytes(8, 5, 180, config.lanes)
    out = end + (output_page_offset - base - end) % 4096      # the output past it, placed
    out_size = -(-program.layout.section(image.SectionKind.OUTPUT).size
                 // image.SECTION_ALIGN) * image.SECTION_ALIGN
    sections = tuple(
        dataclasses.replace(s, offset=out) if s.kind == image.SectionKind.OUTPUT
        else dataclasses.replace(s, offset=out + out_size) if s.kind == image.SectionKind.SCRATCH
        else s for s in program.layout.sections)
    placed = dataclasses.replace(
        program, layout=dataclasses.replace(program.layout, sections=sections,
                                            image_bytes=out + out_size),
        instructions=[first.replace(output=isa.dram(out))])
    blob = placed.pack(compiled.quantise_inputs({"x": net.samples(1, seed=0)}))
    result = tiny_harness.run(blob, base=base)
    assert result.done and not result.error
    golden = bytes(GoldenModel(config).run(blob).dram)
    assert result.dram[base:base + len(golden)] == golden
    comparison = compare(CycleModel(config).run(blob, image_base=base), result.group_cycles,
                         result.group_read_bytes, result.group_write_bytes)
    assert not comparison.problems(), "\n".join(comparison.problems())
    assert result.group_cycles == [2006]


def test_waves(tmp_path):
    """`make sim WAVES=1`: the traced build writes the run's waves (FST with lz4, else VCD)."""
    from sfnpu.tb.system import wave_format

    kind, _ = wave_format()
    config = get_config("tiny")
    harness = SystemHarness(config, BUILD / f"tiny-waves-{kind}", waves=kind)
    net, outputs = conv_stack()
    _, blob = compiled_image(tmp_path, net, outputs, config)
    waves = tmp_path / f"run.{kind}"
    result = harness.run(blob, waves_file=waves)
    assert result.done and not result.error
    data = waves.read_bytes()
    assert len(data) > 10_000
    if kind == "vcd":
        assert b" clk $end" in data[:1 << 16] and b"$enddefinitions" in data
        assert data.count(b"\n#") > 2 * result.counters["CYCLES"]     # time steps of the run


def deep_input_net():
    """A 3×3 convolution over 1368 channels (171 blocks): even one output column's three input
    columns exceed tiny's 512-word row buffer (and ecp5's 256), so it runs row by row in
    shares of its input channels with the partial sums carried between them — its residual
    add read as a row window by every share."""
    net = Net((8, 4, 6), seed=11, name="deep")
    h = net.op("Relu", [net.conv("x", 8, 1368, 1, pads=[0, 0, 0, 0])])
    y = net.conv(h, 1368, 16, 3)
    return net, [net.op("Add", [y, net.conv("x", 8, 16, 1, pads=[0, 0, 0, 0])])]


def test_input_channel_split(harness, tmp_path):
    """Partial sums carried from group to group (psum_hold → psum_keep): the program equals
    onnxruntime (golden model), the RTL the golden model's DRAM and the cycle model's cycles
    and bytes in every group; without the carry the output is wrong."""
    config = harness.config
    net, outputs = deep_input_net()
    compiled, blob = compiled_image(tmp_path, net, outputs, config)
    program = compiled.program.instructions
    carried = [i for i in program if i.psum_keep or i.psum_hold]
    assert carried and all(i.windowed and i.reuse == Reuse.ROW for i in carried)
    shares = sum(1 for i in carried if not i.psum_keep)       # one chain per output row
    assert shares == 4 and any(i.psum_keep and i.psum_hold for i in carried) == (
        len(carried) > 2 * shares)
    x = net.samples(1, seed=0)
    want = run_onnxruntime(onnx.load(str(tmp_path / f"{net.name}.qdq.onnx")), {"x": x})
    got = compiled.run({"x": x}, GoldenModel(config).outputs)
    assert all(np.array_equal(want[k], got[k]) for k in want)
    dropped = dataclasses.replace(compiled.program, instructions=[
        i.replace(psum_keep=0, psum_hold=0) for i in program])
    lost = compiled.finish(GoldenModel(config).outputs(
        dropped.pack(compiled.quantise_inputs({"x": x}))))
    assert not all(np.array_equal(want[k], lost[k]) for k in want)
    run_and_compare(harness, blob)
