"""Differential testing on random networks: the RTL against the golden model (the whole DRAM)
and against the cycle model (DRAM bytes per group exactly, cycles within its tolerance).

Hypothesis draws small CNNs (some with rows wider than the row buffer, which the compiler
tiles) — a chain of convolutions (1×1/3×3/5×5, stride 1 or 2, normal or
depthwise), activations (Relu, HardSwish, Sigmoid), max/average pools (2×2/2, and 3×3/1
with padding 1 for max), residual adds and 2× upsamples, "twins" (one weight tensor
applied twice in a row, which the second group finds in the weight store: ``weights_held``),
YOLOv8's C2f blocks (a channel Split, a residual conv on the second part, a Concat of
the parts and its result: parts on or off lane blocks, views or copies) and gates (a Mul of
two maps of the same shape: ``x · Sigmoid(conv(x))``, or ``conv(x) · x``) and deep layers
(a k×k convolution over 1368 channels, which runs in input-channel shares carrying partial
sums),
each run as compiled and in the all-frame
policy (maps on chip, weights prefetched) — as a plain tuple (:func:`networks`), so a failing example shrinks to a minimal
network whose tuple goes into :data:`EXAMPLES`, rerun on every test. ``make test`` draws a few
networks on ``tiny``; ``make regress`` (SFNPU_REGRESS=1) many on both configurations.
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from onnx import helper

import onnx

from netbuild import Net
from sfnpu.compiler.codegen import CodegenError
from sfnpu.compiler.importer import ModelError
from sfnpu.compiler.memory import AllocationError
from sfnpu.compiler.pipeline import run_onnxruntime
from sfnpu.config import ROW_BUFFER_ROWS, get_config
from sfnpu.sim.cycle import CycleModel
from sfnpu.sim.golden import GoldenModel
from test_system import compiled_image, frame_program, run_and_compare, system_harness

REGRESS = bool(os.environ.get("SFNPU_REGRESS"))
CONFIGS = ("tiny", "ecp5") if REGRESS else ("tiny",)

#: (input channels, height, width, seed, layers); a layer is (kind, argument).
LAYERS = st.one_of(
    st.tuples(st.just("conv"), st.tuples(st.sampled_from([1, 3, 5]), st.sampled_from([1, 2]),
                                         st.sampled_from([4, 8, 12, 16, 24]))),
    st.tuples(st.just("dw"), st.tuples(st.sampled_from([3, 5]), st.sampled_from([1, 2]))),
    st.tuples(st.just("act"), st.sampled_from(["Relu", "HardSwish", "Sigmoid"])),
    st.tuples(st.just("pool"), st.sampled_from(["max", "avg", "max3"])),
    st.tuples(st.just("add"), st.just(None)),
    st.tuples(st.just("up"), st.just(None)),
    st.tuples(st.just("twin"), st.sampled_from([1, 3])),
    st.tuples(st.just("split"), st.sampled_from([4, 8, "half"])),
    st.tuples(st.just("gate"), st.sampled_from(["sigmoid", "conv"])),
    st.tuples(st.just("deep"), st.sampled_from([3, 5])),
)


#: Widths of the networks drawn: small maps, and rows wider than ``tiny``'s row buffer once
#: a layer has 24 channels (3 blocks × 180 pixels > 512 words), which the compiler tiles.
WIDTHS = st.one_of(st.integers(6, 14), st.just(180))


@st.composite
def networks(draw):
    return (draw(st.sampled_from([1, 2, 3, 8, 16])), draw(st.integers(6, 14)),
            draw(WIDTHS), draw(st.integers(0, 1 << 16)),
            tuple(draw(st.lists(LAYERS, min_size=1, max_size=4))))


#: Specs rerun on every test: hand-picked ones (a residual add feeding a table, an upsample
#: feeding an average pool) and the shrunk failures of past runs.
EXAMPLES = [
    (8, 6, 6, 0, (("conv", (3, 1, 8)), ("add", None), ("act", "HardSwish"))),
    (3, 9, 7, 1, (("conv", (5, 2, 12)), ("dw", (3, 1)), ("up", None), ("pool", "avg"))),
    (8, 7, 9, 2, (("twin", 3), ("pool", "max"), ("twin", 1))),
    # Residual adds whose input and shortcut reads cross a 4 KiB boundary (burst splits).
    (3, 14, 14, 0, (("twin", 1), ("pool", "max"), ("add", None), ("add", None))),
    # A max pool that leaves the conv row's last column out: its last word precedes the row's.
    (3, 8, 9, 0, (("pool", "max"), ("add", None))),
    # An ADD in front of the upsampler: a word waiting out a replay freezes the ADD's pipeline.
    (3, 8, 8, 0, (("conv", (1, 1, 24)), ("add", None), ("up", None))),
    # Stems over the host's taps (2×2 over two channels; the rows of a 3×3 over one), then
    # a strided conv and a pool.
    (2, 9, 8, 3, (("conv", (3, 2, 8)), ("pool", "max"))),
    (1, 8, 9, 5, (("conv", (3, 2, 8)), ("pool", "avg"))),
    # Stride-1 3×3 max pools (overlapping windows, padding 1): one behind the opening conv
    # and one on its own (a copy group); one of two channel blocks feeding the upsampler.
    (8, 6, 7, 6, (("pool", "max3"), ("pool", "max3"))),
    (8, 7, 9, 7, (("conv", (1, 1, 16)), ("pool", "max3"), ("up", None))),
    # Rows of 24 channels wider than tiny's row buffer, run as tiles: column strips reading
    # their neighbours' columns as halo (a 3×3 conv; a residual add and a max pool in the
    # strips), channel slices (a depthwise conv reads only its own blocks).
    (8, 5, 180, 8, (("conv", (3, 1, 24)), ("conv", (3, 1, 8)))),
    (8, 6, 176, 9, (("conv", (1, 1, 24)), ("add", None), ("pool", "max"))),
    (8, 5, 180, 10, (("conv", (1, 1, 24)), ("dw", (3, 2)), ("act", "HardSwish"))),
    # C2f blocks: 16 channels split 8 + 8 on 8 lanes (views), 8 split 4 + 4 (one-hot copies
    # and a concat with a gap channel block), 12 split 4 + 8 (a view ending the source).
    (8, 6, 6, 12, (("conv", (1, 1, 16)), ("split", 8))),
    (8, 6, 7, 13, (("split", "half"), ("act", "HardSwish"))),
    (8, 7, 6, 14, (("conv", (1, 1, 12)), ("split", 4), ("pool", "max"))),
    # Gates (Eltwise.MUL): one feeding the upsampler (its replays freeze the scaler's
    # pipeline), one in column strips of rows wider than the row buffer.
    (8, 6, 7, 15, (("conv", (1, 1, 16)), ("gate", "sigmoid"), ("up", None))),
    (8, 5, 180, 16, (("conv", (1, 1, 24)), ("gate", "conv"), ("pool", "max"))),
    # A k×k convolution over 1368 channels: even one output column's input rows exceed the
    # row buffer, so each output row runs in input-channel shares carrying partial sums;
    # one behind a residual add, one with a pool taken apart behind it.
    (8, 5, 7, 17, (("deep", 3), ("add", None))),
    (8, 6, 6, 18, (("deep", 5), ("pool", "max"))),
]
#: Specs rerun on ecp5 as well (``make test`` draws on tiny only): a residual add whose input,
#: shortcut and output all cross ecp5's narrow DRAM bus, so its reads and writes contend; an
#: average pool feeding the upsampler in one group (the pool's words, not the array's, pace
#: the upsampler's first copy).
ECP5_EXAMPLES = [
    (3, 6, 9, 0, (("add", None),)),
    (3, 6, 6, 0, (("pool", "avg"), ("up", None))),
    # A stride-2 1×1 convolution: its input's last row, under no window, is read all the same.
    (3, 6, 9, 0, (("conv", (1, 2, 4)),)),
    # Pooled rows of three channel blocks (a max pool, then an average pool alone): each
    # block's writes are commanded as its own pooled words are out.
    (3, 9, 9, 0, (("up", None), ("conv", (1, 1, 24)), ("pool", "max"), ("pool", "avg"))),
    (1, 7, 10, 4, (("add", None), ("up", None))),
    # Rows of 16 channels wider than ecp5's 256-word row banks: strips of a 3×3 conv and of
    # a residual add over ecp5's narrow bus.
    (8, 5, 180, 11, (("conv", (3, 1, 16)), ("add", None))),
]


def build(spec):
    """The float network of a spec between an opening 3×3 and a closing 1×1 convolution;
    layers that cannot apply (a map too small to pool) are skipped, so every spec builds."""
    c, h, w, seed, layers = spec
    net = Net((c, h, w), seed=seed, name=f"random{seed}")
    # An opening convolution: a Resize of the graph input stays in float in onnxruntime's
    # QDQ model, and the importer then finds nothing quantised to run. The host lays out
    # its taps as channels (`fold_input_taps`) over two channels, where it is 2×2 with SAME
    # padding (8 taps: one of `tiny`'s and `ecp5`'s 8-lane blocks, a 1×1 convolution), and
    # over one, where it is 3×3 (its rows' 3 taps: a 3×1 convolution).
    x = net.conv("x", c, 8, 2, pads=[0, 0, 1, 1]) if c == 2 else net.conv("x", c, 8, 3)
    c = 8
    previous = "conv"
    for kind, arg in layers:
        # Chains the compiler refuses with a clear error (an activation right after another
        # or after a Resize: onnxruntime requantises between them) are left out.
        if kind == "act" and previous in ("act", "up"):
            continue
        previous = kind
        if kind == "conv":
            k, stride, out = arg
            if min(h, w) < k:
                continue
            x = net.conv(x, c, out, k, stride=stride)
            c, h, w = out, (h - 1) // stride + 1, (w - 1) // stride + 1
        elif kind == "dw":
            k, stride = arg
            if min(h, w) < k:
                continue
            x = net.conv(x, c, c, k, stride=stride, group=c)
            h, w = (h - 1) // stride + 1, (w - 1) // stride + 1
        elif kind == "act":
            x = net.op(arg, [x])
        elif kind == "pool" and arg == "max3":
            # a stride-1 3×3 max pool with padding 1 (overlapping windows; the size stays)
            x = net.op("MaxPool", [x], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
        elif kind == "pool" and min(h, w) >= 4:
            attrs = dict(kernel_shape=[2, 2], strides=[2, 2])
            x = net.op("MaxPool" if arg == "max" else "AveragePool", [x], **attrs)
            h, w = h // 2, w // 2
        elif kind == "add":
            x = net.op("Add", [net.conv(x, c, c, 1, pads=[0, 0, 0, 0]), x])
        elif kind == "twin" and min(h, w) >= arg:
            weight = net.const(net.rng.standard_normal((c, c, arg, arg))
                               * np.sqrt(2 / (c * arg * arg)), "w")
            bias = net.const(net.rng.standard_normal(c) * 0.1, "b")
            for _ in range(2):
                x = net.op("Conv", [x, weight, bias], kernel_shape=[arg, arg], strides=[1, 1],
                           pads=[arg // 2] * 4)
        elif kind == "split" and c >= 2:
            first = c // 2 if arg == "half" else min(arg, c - 1)
            second = c - first
            parts = [net._fresh("part") for _ in range(2)]
            net.nodes.append(helper.make_node("Split", [x, net.const_int([first, second])],
                                              parts, axis=1, name=net._fresh("split")))
            y = net.op("Add", [net.conv(parts[1], second, second, 3), parts[1]])
            x = net.op("Concat", [*parts, y], axis=1)
            c += second
        elif kind == "deep" and min(h, w) >= arg:
            wide = net.op("Relu", [net.conv(x, c, 1368, 1, pads=[0, 0, 0, 0])])
            x = net.conv(wide, 1368, c, arg)
        elif kind == "gate":
            gate = net.conv(x, c, c, 1, pads=[0, 0, 0, 0])
            x = net.op("Mul", [x, net.op("Sigmoid", [gate])] if arg == "sigmoid" else [gate, x])
        elif kind == "up" and max(h, w) <= 16:
            x = net.op("Resize", [x, "", net.const([1, 1, 2, 2])], mode="nearest",
                       coordinate_transformation_mode="asymmetric", nearest_mode="floor")
            h, w = 2 * h, 2 * w
    # A closing 1×1 convolution: every network has a group to run (a lone Resize or Relu
    # of the input is refused as nothing for the accelerator to compute).
    return net, [net.conv(x, c, 8, 1, pads=[0, 0, 0, 0])]


def check(spec, config_name, tmp_path, refused=None):
    """The compiled program, then the memory optimizer's all-frame policy where its maps fit
    the buffers (maps on chip: groups prefetch the next group's weights)."""
    harness = system_harness(config_name)
    net, outputs = build(spec)
    try:
        compiled, blob = compiled_image(tmp_path, net, outputs, harness.config)
    except ModelError:
        if refused is None:
            raise
        refused()                             # a clear refusal is not what is tested here
        return
    assert ("fold_input_taps" in compiled.rewrites) == (spec[0] <= 2)
    run_and_compare(harness, blob)            # golden model and cycle model
    try:
        frame = frame_program(compiled)
    except AllocationError:
        return
    run_and_compare(harness, frame.pack(compiled.quantise_inputs({"x": net.samples(1)})))


@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("spec", EXAMPLES, ids=lambda s: f"seed{s[3]}")
def test_example_networks(spec, config_name, tmp_path):
    check(spec, config_name, tmp_path)


@pytest.mark.parametrize("spec", ECP5_EXAMPLES, ids=lambda s: f"seed{s[3]}")
def test_example_networks_ecp5(spec, tmp_path):
    check(spec, "ecp5", tmp_path)


@pytest.mark.parametrize("config_name", CONFIGS)
@settings(max_examples=40 if REGRESS else 3, deadline=None, derandomize=not REGRESS,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(spec=networks())
def test_random_networks(spec, config_name, tmp_path):
    check(spec, config_name, tmp_path, refused=reject)


#: ``tiny`` with stores drawn as small as a few of the drawn layers need (row buffer words,
#: partial-sum words, parameter stores, input-table channels, pooling line stores), so that
#: the compiler's tiling is drawn with the networks: channel slices, column strips, stages
#: taken apart and input-channel shares, alone and together.
SMALL_STORES = st.fixed_dictionaries({
    "row_words": st.sampled_from([8, 16, 32, 512]),
    "psum_words": st.sampled_from([16, 64, 1024]),
    "max_channels": st.sampled_from([8, 16, 2048]),
    "max_table_channels": st.sampled_from([8, 256]),
    "pool_row_pixels": st.sampled_from([16, 64, 2048]),
})


def small_stores(stores: dict):
    tiny = get_config("tiny")
    L = tiny.lanes
    return tiny.replace(
        name="tiny-stores", row_buffer_bytes=stores["row_words"] * L * ROW_BUFFER_ROWS,
        psum_buffer_bytes=stores["psum_words"] * 4 * tiny.to,
        max_channels=stores["max_channels"], max_table_channels=stores["max_table_channels"],
        pool_row_pixels=stores["pool_row_pixels"])


@settings(max_examples=200 if REGRESS else 8, deadline=None, derandomize=not REGRESS,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much])
@given(spec=networks(), stores=SMALL_STORES)
def test_random_networks_on_small_stores(spec, stores, tmp_path):
    """Drawn networks on drawn small stores: every tile fits (code generation asserts it),
    the program equals onnxruntime on the golden model and the cycle model times it. (The
    RTL runs the tiles on the reference configurations above.)"""
    config = small_stores(stores)
    net, outputs = build(spec)
    try:
        compiled, blob = compiled_image(tmp_path, net, outputs, config)
    except (ModelError, CodegenError):
        reject()                              # no tiling fits: a clear refusal
    x = net.samples(1)
    want = run_onnxruntime(onnx.load(str(tmp_path / f"{net.name}.qdq.onnx")), {"x": x})
    got = compiled.run({"x": x}, GoldenModel(config).outputs)
    for name in want:
        assert np.array_equal(want[name], got[name]), name
    assert CycleModel(config).run(blob).cycles > 0
