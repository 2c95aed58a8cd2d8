"""Compiler passes and group fusion on tiny hand-built graphs: structure plus numerical
equivalence with onnxruntime (through the golden model)."""

import numpy as np
import onnx
import pytest
from hypothesis import given, strategies as st

from sfnpu.compiler import ir
from sfnpu.compiler.groups import fuse
from sfnpu.compiler.importer import import_model
from sfnpu import numeric
from sfnpu.compiler.passes import (drop_dead_nodes, fold_silu, requantize_concat_inputs,
                                   run_passes, space_to_depth_form, split_shared_wide_convs)
from sfnpu.compiler.pipeline import PipelineConfig, compile_model, run_onnxruntime
from sfnpu.compiler.quantize import CalibrationSource, quantize_model
from sfnpu.config import get_config
from sfnpu.sim.cycle import CycleModel
from sfnpu.sim.golden import GoldenModel
from netbuild import Net

TINY = get_config("tiny")


def qdq(tmp_path, net, outputs, name, signed=False):
    path = tmp_path / f"{name}.onnx"
    quantize_model(net.model(outputs), path, CalibrationSource.arrays(net.samples(16)),
                   activation_signed=signed)
    return path


def identical(path, net, config=TINY, pipeline=PipelineConfig()):
    compiled = compile_model(path, config, pipeline)
    x = net.samples(1, seed=11, scale=1.2)
    want = run_onnxruntime(onnx.load(str(path)), {"x": x})
    got = compiled.run({"x": x}, GoldenModel(config).outputs)
    return compiled, all((want[k] == got[k]).all() for k in want)


def ops(graph):
    return [n.op for n in graph.nodes]


def test_batchnorm_folds_into_the_producer(tmp_path):
    n = Net((4, 8, 8), name="bn")
    c = n.conv("x", 4, 8, 3, bias=False)
    bn = n.op("BatchNormalization", [c, n.const(n.rng.uniform(0.5, 2, 8)),
                                     n.const(n.rng.standard_normal(8)),
                                     n.const(n.rng.standard_normal(8)),
                                     n.const(n.rng.uniform(0.5, 2, 8))])
    path = qdq(tmp_path, n, [n.op("Relu", [bn])], "bn")
    assert "BatchNormalization" not in {x.op_type for x in onnx.load(str(path)).graph.node}
    compiled, same = identical(path, n)
    assert ops(compiled.graph) == ["conv"] and same


def test_preactivation_batchnorm_becomes_an_input_table(tmp_path):
    n = Net((6, 8, 8), name="preact")
    x = n.op("Relu", [n.conv("x", 6, 8, 3)])   # ReLU between conv and BN: BN cannot fold
    bn = n.op("BatchNormalization", [x, n.const(n.rng.uniform(0.5, 2, 8)),
                                     n.const(n.rng.standard_normal(8)),
                                     n.const(n.rng.standard_normal(8)),
                                     n.const(n.rng.uniform(0.5, 2, 8))])
    y = n.conv(n.op("Relu", [bn]), 8, 4, 3)
    path = qdq(tmp_path, n, [y], "preact")
    compiled, same = identical(path, n)
    assert same
    assert ops(compiled.graph) == ["conv", "channel_table", "conv"]
    assert [[m.op for m in g.nodes] for g in compiled.groups] == [["conv"],
                                                                   ["channel_table", "conv"]]


def test_silu_folds_into_one_table(tmp_path):
    n = Net((4, 8, 8), name="silu")
    c = n.conv("x", 4, 8, 3)
    y = n.conv(n.op("Mul", [c, n.op("Sigmoid", [c])]), 8, 4, 1)
    path = qdq(tmp_path, n, [y], "silu")
    graph = import_model(path).graph
    assert ops(graph) == ["conv", "table", "mul", "conv"]
    folded, changed = fold_silu(graph)
    assert changed and ops(folded) == ["conv", "table", "table", "conv"]
    pruned, changed = drop_dead_nodes(folded)
    assert changed and ops(pruned) == ["conv", "table", "conv"]
    assert fold_silu(pruned) == (pruned, False)
    compiled, same = identical(path, n)
    assert same and [[m.op for m in g.nodes] for g in compiled.groups] == [["conv", "table"],
                                                                           ["conv"]]


def test_concat_parts_are_requantised_and_redirected(tmp_path):
    n = Net((4, 8, 8), name="cat")
    a = n.op("Relu", [n.conv("x", 4, 3, 1)])
    b = n.op("Relu", [n.conv("x", 4, 5, 3)])
    y = n.conv(n.op("Concat", [a, b], axis=1), 8, 4, 1)
    path = qdq(tmp_path, n, [y], "cat")
    graph = import_model(path).graph
    requantised, changed = requantize_concat_inputs(graph)
    parts = requantised.producer(next(x.output for x in requantised.nodes
                                      if x.op == "concat")).inputs
    dest = requantised.tensors[requantised.nodes[-2].output].qtype
    assert all(requantised.tensors[p].qtype == dest for p in parts)
    assert changed == any(graph.tensors[p].qtype != dest
                          for p in graph.producer(requantised.nodes[-2].output).inputs)
    compiled, same = identical(path, n)
    assert same
    redirected = [g for g in compiled.groups if g.dest]
    assert [(g.channel_offset, g.dest) for g in redirected] == \
        [(0, redirected[0].dest), (TINY.lanes, redirected[0].dest)]   # on a block boundary
    assert all(g.nodes for g in compiled.groups)  # no copy groups needed


def test_residual_add_streams_either_operand(tmp_path):
    n = Net((8, 8, 8), name="res")
    x = n.op("Relu", [n.conv("x", 8, 8, 3)])
    y = n.conv(x, 8, 8, 3)
    out = n.op("Relu", [n.op("Add", [x, y])])   # the conv output is the second operand
    path = qdq(tmp_path, n, [out], "res")
    compiled, same = identical(path, n)
    assert same
    assert [[m.op for m in g.nodes] for g in compiled.groups] == [["conv"], ["conv", "add"]]
    assert compiled.program.instructions[1].eltwise.name == "ADD"


def test_squeeze_excitation_scale_is_its_own_group(tmp_path):
    n = Net((8, 8, 8), name="se")
    x = n.op("Relu", [n.conv("x", 8, 8, 3, group=8)])
    s = n.op("GlobalAveragePool", [x])
    s = n.op("Sigmoid", [n.conv(n.op("Relu", [n.conv(s, 8, 4, 1)]), 4, 8, 1)])
    y = n.conv(n.op("Mul", [x, s]), 8, 6, 1)
    path = qdq(tmp_path, n, [y], "se")
    compiled, same = identical(path, n)
    assert same
    kinds = [[m.op for m in g.nodes] for g in compiled.groups]
    assert ["mul"] in kinds and kinds[-1] == ["conv"]


def test_upsample_and_pool_fuse_behind_a_conv(tmp_path):
    n = Net((4, 8, 8), name="fpn")
    c = n.conv("x", 4, 8, 3)
    p = n.op("MaxPool", [c], kernel_shape=[2, 2], strides=[2, 2])
    up = n.op("Resize", [n.conv(p, 8, 8, 1), "", n.const([1, 1, 2, 2])], mode="nearest")
    y = n.conv(n.op("Concat", [up, c], axis=1), 16, 4, 3)
    path = qdq(tmp_path, n, [y], "fpn")
    compiled, same = identical(path, n)
    assert same
    kinds = [[m.op for m in g.nodes] for g in compiled.groups]
    assert ["conv", "resize"] in kinds or ["conv", "table", "resize"] in kinds


def test_checker_rejects_broken_graphs():
    q = ir.QType(0.1, 0, False)
    t = {name: ir.Tensor(name, (1, 1, 1), q) for name in ("a", "b", "c")}
    node = ir.Node("n", "table", ("a",), "b", consts=dict(table=np.zeros(256, np.uint8)))
    ir.check(ir.Graph(t, (node,), ("a",), ("b",)))
    with pytest.raises(ir.IRError, match="reads 'c' before it is produced"):
        ir.check(ir.Graph(t, (node.replace(inputs=("c",)),), ("a",), ("b",)))
    with pytest.raises(ir.IRError, match="writes 'b' again"):
        ir.check(ir.Graph(t, (node, node), ("a",), ("b",)))
    with pytest.raises(ir.IRError, match="unknown IR op 'softmax'"):
        ir.check(ir.Graph(t, (node.replace(op="softmax"),), ("a",), ("b",)))
    with pytest.raises(ir.IRError, match="graph output 'c' is never produced"):
        ir.check(ir.Graph(t, (node,), ("a",), ("c",)))
    with pytest.raises(ir.IRError, match="zero point 300"):
        ir.QType(0.1, 300, False)


def test_run_passes_reports_what_changed(tmp_path):
    n = Net((4, 8, 8), name="plain")
    path = qdq(tmp_path, n, [n.conv("x", 4, 4, 3)], "plain")
    graph = import_model(path).graph
    assert run_passes(graph) == (graph, [])
    assert len(fuse(graph)) == 1


def test_shared_wide_convolution_splits_into_slices_that_fit(tmp_path):
    """One 3×3 weight tensor (128 → 96 channels: 12 output blocks of 16 × 9 weight words, 1728
    words against tiny's 1024-word store) applied to two maps becomes two 48-channel slices
    per use, concatenated into the original tensors; the program equals onnxruntime. A store
    that holds the whole layer leaves it whole, and slices that fit are not split again."""
    net = Net((16, 6, 6), seed=21, name="shared_wide")
    a = net.op("Relu", [net.conv("x", 16, 128, 3)])
    b = net.op("Relu", [net.conv(a, 128, 128, 1, stride=2, pads=[0, 0, 0, 0])])
    w = net.const(net.rng.standard_normal((96, 128, 3, 3)) * np.sqrt(2 / 1152), "w")
    bias = net.const(net.rng.standard_normal(96) * 0.1, "b")
    outs = [net.op("Conv", [y, w, bias], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
            for y in (a, b)]
    path = qdq(tmp_path, net, outs, "shared_wide")
    compiled, same = identical(path, net)
    assert same
    slices = [n for n in compiled.graph.nodes if ".slice" in n.name]
    assert [n.consts["weight"].shape[0] for n in slices] == [48, 48, 48, 48]
    assert ops(compiled.graph).count("concat") == 2
    # Slice by slice across the two maps: each slice's weights are held for the second map.
    assert sum(i.weights_held for i in compiled.program.instructions) == 2
    # A store that holds the whole layer: nothing to split.
    big = TINY.replace(name="big-store", buffer_bytes=(256 * 1024,) * 3)
    assert not any(".slice" in n.name for n in compile_model(path, big).graph.nodes)
    assert split_shared_wide_convs(compiled.graph, TINY) == (compiled.graph, False)


def random_conv_operands(seed, c, h, w, kh, kw, o=3):
    """Random int8 weights, weight zero points, bias, a uint8 input and its zero point."""
    rng = np.random.default_rng(seed)
    return (rng.integers(-128, 128, (o, c, kh, kw), dtype=np.int8),
            rng.integers(-128, 128, o, dtype=np.int8),
            rng.integers(-1000, 1000, o, dtype=np.int32),
            rng.integers(0, 256, (c, h, w), dtype=np.uint8), int(rng.integers(0, 256)))


# -- SpaceToDepth for stride-2 stems -------------------------------------------------------------

@given(st.integers(1, 4), st.integers(1, 6), st.integers(1, 6), st.integers(1, 7),
       st.integers(1, 7), st.tuples(*[st.integers(0, 6)] * 4), st.integers(0, 2**32 - 1))
def test_space_to_depth_form_computes_the_same_accumulators(c, half_h, half_w, kh, kw, pads,
                                                            seed):
    """Any stride-2 convolution the instruction set encodes (kernel ≤ 7, pads below it): where
    the rewrite exists, SpaceToDepth then the stride-1 form gives the int32 accumulators of the
    original, bit for bit — with random weight and input zero points."""
    top, left, bottom, right = pads
    if not (top < kh and bottom < kh and left < kw and right < kw):
        return
    h, w = 2 * half_h, 2 * half_w
    if h + top + bottom < kh or w + left + right < kw:
        return
    weight, w_zp, bias, x, x_zp = random_conv_operands(seed, c, h, w, kh, kw)
    conv = ir.Node("stem", "conv", ("x",), "y", attrs=dict(stride=(2, 2), pads=pads,
                                                            depthwise=False),
                   consts=dict(weight=weight, weight_zp=w_zp, bias=bias))
    form = space_to_depth_form(conv, (c, h, w))
    if form is None:                        # a new pad would reach the new kernel side
        return
    new_weight, new_pads = form
    assert all(p < k for p, k in zip(new_pads, new_weight.shape[2:] * 2))
    s2d = ir.space_to_depth_conv("s2d", "x", "x2", c)
    x2 = numeric.conv_accumulate(x, x_zp, s2d.consts["weight"], 0, None, (2, 2)) + x_zp
    want = numeric.conv_accumulate(x, x_zp, weight, w_zp, bias, (2, 2), pads)
    got = numeric.conv_accumulate(x2.astype(np.uint8), x_zp, new_weight, w_zp, bias, (1, 1),
                                  new_pads)
    assert np.array_equal(want, got)


@pytest.mark.parametrize("shared", [False, True], ids=["on-host", "on-chip"])
@pytest.mark.parametrize("config, c, k, pads", [
    ("kcu1500", 3, 7, [3, 3, 3, 3]),     # ResNet's stem
    ("tiny", 2, 7, [3, 3, 3, 3]),
    ("tiny", 1, 7, [2, 3, 3, 2]),
    ("tiny", 2, 5, [2, 2, 2, 2]),
    ("tiny", 2, 5, [1, 1, 2, 2]),        # TensorFlow's SAME padding
    ("tiny", 1, 5, [0, 0, 0, 0]),
])
def test_stride_two_stem_runs_as_space_to_depth(tmp_path, config, c, k, pads, shared):
    """A stride-2 convolution over fewer channels than the array's lanes becomes SpaceToDepth
    and a stride-1 convolution; the program still equals onnxruntime's model, and the cycle
    model's run is shorter than without the rewrite. When only the stem reads the network
    input the host prologue rearranges it and the accelerator's input is the SpaceToDepth
    (``shared``: a 1×1 convolution reads the input too, and the SpaceToDepth is a group)."""
    config = get_config(config)
    net = Net((c, 12, 12), seed=5, name="stem")
    y = net.op("Relu", [net.conv("x", c, 8, k, stride=2, pads=pads)])
    outputs = [net.conv(y, 8, 8, 3)] + ([net.conv("x", c, 4, 1, pads=[0, 0, 0, 0])]
                                        if shared else [])
    path = qdq(tmp_path, net, outputs, f"stem{c}{k}{int(shared)}")
    compiled, same = identical(path, net, config, PipelineConfig(fold_input_taps=False))
    assert same
    moved = [n for n in compiled.graph.nodes if n.name.endswith(".space_to_depth")]
    rearranged = moved[0].output if moved else compiled.program.inputs[0]
    stems = [n for n in compiled.graph.nodes if n.inputs == (rearranged,)]
    assert len(stems) == 1 and stems[0].attrs["stride"] == (1, 1)
    assert stems[0].consts["weight"].shape[1] == 4 * c
    plain = compile_model(path, config, PipelineConfig(space_to_depth=False,
                                                       fold_input_taps=False))
    added = len(compiled.program.instructions) - len(plain.program.instructions)
    x = compiled.graph.tensors[compiled.program.inputs[0]]
    if shared:
        assert len(moved) == 1 and added == 1 and x.shape == (c, 12, 12)
        assert "space_to_depth_on_host" not in compiled.rewrites
    else:
        assert not moved and added == 0 and x.shape == (4 * c, 6, 6)
        assert "space_to_depth_on_host" in compiled.rewrites
    model = CycleModel(config)
    assert (model.run(compiled.program.instructions).cycles
            < model.run(plain.program.instructions).cycles)


def test_space_to_depth_only_where_it_saves_cycles(tmp_path):
    """On ``tiny``: a 3×3 stem over 3 channels (12 channels are two of its 8-lane blocks: 8
    steps against 9), 8 channels that fill its lanes already, and an odd input side all stay
    as they are. On ``kcu1500`` the 3×3 stem over 3 channels (EfficientNet's, MobileNet's)
    pays when the host rearranges the input (4 taps against 9), not when the SpaceToDepth
    would be a group of its own (4 + 4)."""
    for c, size, k in ((3, 12, 3), (8, 12, 7), (2, 13, 7)):
        net = Net((c, size, size), seed=6, name="nostem")
        path = qdq(tmp_path, net, [net.conv("x", c, 8, k, stride=2)], f"nostem{c}{k}")
        compiled, same = identical(path, net)
        assert same and ops(compiled.graph) == ["conv"]
        assert compiled.graph.nodes[0].attrs["stride"] == (2, 2)
    kcu = get_config("kcu1500")
    for shared in (False, True):
        net = Net((3, 12, 12), seed=6, name="stem3")
        outputs = [net.conv("x", 3, 8, 3, stride=2)] + (
            [net.conv("x", 3, 4, 1, pads=[0, 0, 0, 0])] if shared else [])
        path = qdq(tmp_path, net, outputs, f"stem3{int(shared)}")
        compiled, same = identical(path, net, kcu, PipelineConfig(fold_input_taps=False))
        strides = [n.attrs["stride"] for n in compiled.graph.nodes if n.op == "conv"]
        assert same and strides == ([(2, 2), (1, 1)] if shared else [(1, 1)])


# -- A network input's taps as channels (the host's im2col) ------------------------------------

@given(st.integers(1, 4), st.integers(1, 9), st.integers(1, 9), st.integers(1, 7),
       st.integers(1, 7), st.tuples(st.integers(1, 2), st.integers(1, 2)),
       st.tuples(*[st.integers(0, 6)] * 4), st.integers(0, 2**32 - 1))
def test_input_taps_compute_the_same_accumulators(c, h, w, kh, kw, stride, pads, seed):
    """Any convolution the instruction set encodes: the 1×1 convolution over its taps, and the
    kh×1 one over its rows' taps, give the int32 accumulators of the original, bit for bit,
    with random weight and input zero points — and with onnxruntime's u8s8 pair saturation,
    whose pairs run along the same (ky, kx, c) order in all three."""
    top, left, bottom, right = pads
    if not (top < kh and bottom < kh and left < kw and right < kw) \
            or h + top + bottom < kh or w + left + right < kw:
        return
    weight, w_zp, bias, x, x_zp = random_conv_operands(seed, c, h, w, kh, kw)
    q = ir.QType(1.0, x_zp, False)
    (sh, sw) = stride
    forms = [  # (taps, the stride and pads of the convolution over them)
        (ir.InputTaps("x", (c, h, w), (kh, kw), stride, pads, q), (1, 1), (0, 0, 0, 0)),
        (ir.InputTaps("x", (c, h, w), (1, kw), (1, sw), (0, left, 0, right), q), (sh, 1),
         (top, 0, bottom, 0)),
    ]
    for taps, conv_stride, conv_pads in forms:
        columns = taps.apply(x)
        assert columns.shape == taps.out_shape and columns.dtype == np.uint8
        for saturation in (False, True):
            want = numeric.conv_accumulate(x, x_zp, weight, w_zp, bias, stride, pads,
                                           u8s8_pair_saturation=saturation)
            got = numeric.conv_accumulate(columns, x_zp, taps.weights(weight), w_zp, bias,
                                          conv_stride, conv_pads,
                                          u8s8_pair_saturation=saturation)
            assert np.array_equal(want, got)


@pytest.mark.parametrize("config, c, k, stride, pads, signed, rows", [
    ("kcu1500", 3, 3, 1, [1, 1, 1, 1], False, False),   # YOLO's and VGG's stem
    ("kcu1500", 3, 3, 1, [1, 1, 1, 1], True, False),    # int8 codes: the prologue pads with int8
    ("kcu1500", 3, 3, 2, [1, 1, 1, 1], False, False),   # EfficientNet's and MobileNet's
    ("kcu1500", 3, 3, 2, [0, 0, 1, 1], False, False),   # TensorFlow's SAME padding
    ("kcu1500", 3, 7, 2, [3, 3, 3, 3], False, True),    # ResNet's: rows after SpaceToDepth
    ("tiny", 2, 2, 1, [0, 0, 1, 1], False, False),
    ("tiny", 2, 2, 2, [0, 0, 0, 0], True, False),
    ("tiny", 1, 2, 1, [1, 1, 1, 1], False, False),
    ("tiny", 2, 3, 1, [1, 1, 1, 1], False, True),       # 18 taps; a row's 6 fit 8 lanes
    ("tiny", 1, 3, 1, [1, 0, 1, 2], True, True),
])
def test_stem_taps_come_from_the_host(tmp_path, config, c, k, stride, pads, signed, rows):
    """A convolution over a network input whose taps fit one lane block runs 1×1 over the
    taps, which the host prologue lays out as channels; a stride-1 one whose kernel rows fit
    (after SpaceToDepth, for a stride-2 stem) runs kh×1 over the rows' taps. The program
    still equals onnxruntime's model, the prologue's taps are :meth:`~ir.InputTaps.apply`'s
    of the quantised input as the accelerator would read it otherwise (the image, or its
    SpaceToDepth for the rows of a stride-2 stem), and the cycle model's
    run is shorter than without the fold and no longer than with SpaceToDepth alone (a 2×2
    stride-2 kernel's SpaceToDepth form is the 1×1 convolution)."""
    config = get_config(config)
    net = Net((c, 12, 12), seed=5, name="taps")
    y = net.op("Relu", [net.conv("x", c, 8, k, stride=stride, pads=pads)])
    path = qdq(tmp_path, net, [net.conv(y, 8, 8, 3)], f"taps{c}{k}{stride}{rows}", signed)
    compiled, same = identical(path, net, config)
    assert same and "fold_input_taps" in compiled.rewrites
    unfolded = compile_model(path, config, PipelineConfig(fold_input_taps=False))
    plain = compile_model(path, config, PipelineConfig(fold_input_taps=False,
                                                       space_to_depth=False))
    # Whole kernels fold before SpaceToDepth, rows after it.
    reference = unfolded if rows else plain
    source = reference.graph.tensors[reference.program.inputs[0]]
    assert source.qtype.signed == signed and source.qtype.zero_point != 0
    was = reference.graph.consumers(source.name)[0]
    new = compiled.graph.consumers(compiled.program.inputs[0])[0]
    o, _, kh, kw = was.consts["weight"].shape
    (sh, sw), (top, left, bottom, right) = was.attrs["stride"], was.attrs["pads"]
    if rows:
        taps = ir.InputTaps(source.name, source.shape, (1, kw), (1, 1), (0, left, 0, right),
                            source.qtype)
        assert new.consts["weight"].shape == (o, kw * source.shape[0], kh, 1)
        assert (new.attrs["stride"], new.attrs["pads"]) == ((1, 1), (top, 0, bottom, 0))
    else:
        taps = ir.InputTaps(source.name, source.shape, (kh, kw), (sh, sw),
                            (top, left, bottom, right), source.qtype)
        assert new.consts["weight"].shape == (o, kh * kw * source.shape[0], 1, 1)
        assert (new.attrs["stride"], new.attrs["pads"]) == ((1, 1), (0, 0, 0, 0))
    assert compiled.graph.tensors[compiled.program.inputs[0]].shape == taps.out_shape
    feeds = {"x": net.samples(1, seed=3)}
    assert np.array_equal(compiled.quantise_inputs(feeds)[0],
                          taps.apply(reference.quantise_inputs(feeds)[0]))
    model = CycleModel(config)
    cycles = model.run(compiled.program.instructions).cycles
    assert cycles <= model.run(unfolded.program.instructions).cycles
    assert cycles < model.run(plain.program.instructions).cycles


def test_stem_taps_only_where_they_fit_and_pay(tmp_path):
    """Taps whose rows would fill more than one lane block (a 5×5 over 3 channels on
    `tiny`'s 8 lanes), a stride-2 stem that SpaceToDepth leaves as it is (3×3 over 3
    channels on `tiny`), an input another node reads too, and a 1×1 convolution all stay as
    they are."""
    kcu = get_config("kcu1500")
    cases = [(TINY, 3, 5, 1, False), (TINY, 3, 3, 2, False), (kcu, 3, 3, 1, True),
             (TINY, 2, 1, 1, False)]
    for n, (config, c, k, stride, shared) in enumerate(cases):
        net = Net((c, 12, 12), seed=6, name="notaps")
        outputs = [net.conv("x", c, 8, k, stride=stride)] + (
            [net.conv("x", c, 4, 1, pads=[0, 0, 0, 0])] if shared else [])
        path = qdq(tmp_path, net, outputs, f"notaps{n}")
        compiled, same = identical(path, net, config)
        assert same and "fold_input_taps" not in compiled.rewrites
        assert not compiled.imported.host.input_taps
