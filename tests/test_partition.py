"""Partitioned execution: what the accelerator cannot run goes to onnxruntime anywhere in the
graph, the rest to the accelerator, and the whole model gives onnxruntime's bits — on the
golden model, and segment by segment on the RTL (bit-exact, cycle-exact)."""

import os

import numpy as np
import onnx
import pytest

from netbuild import Net
from sfnpu import image
from sfnpu.cli import main
from sfnpu.compiler.partition import (AcceleratorSegment, Partitioned, compile_partitioned,
                                     profile)
from sfnpu.compiler.pipeline import Compiled, run_onnxruntime
from sfnpu.compiler.quantize import CalibrationSource, quantize_model
from sfnpu.config import get_config
from sfnpu.sim.golden import GoldenModel
from sfnpu.isa import Eltwise

TINY = get_config("tiny")


def pad_net():
    """A reflect Pad between two convolutions (the accelerator pads with the zero point
    only): accelerator, host, accelerator."""
    net = Net((8, 12, 12), seed=1, name="padmid")
    a = net.op("Relu", [net.conv("x", 8, 16, 3)])
    b = net.op("Pad", [a, net.const_int([0, 0, 1, 1, 0, 0, 1, 1])], mode="reflect")
    c = net.op("Relu", [net.conv(b, 16, 16, 3, pads=[0, 0, 0, 0])])
    return net, [net.conv(c, 16, 8, 1, pads=[0, 0, 0, 0])]


def residual_pad_net():
    """The host's Pad on one branch of a residual block: the block's input crosses from the
    first accelerator segment to the second as 8-bit codes, beside the host's result."""
    net = Net((8, 10, 10), seed=2, name="residualpad")
    a = net.op("Relu", [net.conv("x", 8, 16, 3)])
    b = net.op("Pad", [a, net.const_int([0, 0, 1, 1, 0, 0, 1, 1])], mode="edge")
    c = net.conv(b, 16, 16, 3, pads=[0, 0, 0, 0])
    return net, [net.conv(net.op("Add", [c, a]), 16, 8, 1, pads=[0, 0, 0, 0])]


def focus_net():
    """YOLOv5's "Focus": a space-to-depth of the input by four strided Slices and a Concat,
    on the host before the first convolution."""
    net = Net((3, 16, 16), seed=3, name="focus")
    taps = [net.op("Slice", ["x", net.const_int([dy, dx]), net.const_int([10**6, 10**6]),
                             net.const_int([2, 3]), net.const_int([2, 2])])
            for dy, dx in ((0, 0), (1, 0), (0, 1), (1, 1))]
    x = net.op("Relu", [net.conv(net.op("Concat", taps, axis=1), 12, 16, 3)])
    return net, [net.conv(x, 16, 8, 1, pads=[0, 0, 0, 0])]


def dilated_net():
    """A dilated convolution (the accelerator's are not) between two it runs: the host
    computes that convolution, so the accelerator's share of the MACs is below one."""
    net = Net((8, 12, 12), seed=4, name="dilated")
    a = net.op("Relu", [net.conv("x", 8, 16, 3)])
    w = net.const(net.rng.standard_normal((16, 16, 3, 3)) * 0.2)
    b = net.op("Relu", [net.op("Conv", [a, w], kernel_shape=[3, 3], pads=[2, 2, 2, 2],
                               dilations=[2, 2])])
    return net, [net.conv(b, 16, 8, 1, pads=[0, 0, 0, 0])]


NETS = {build.__name__: build for build in (pad_net, residual_pad_net, focus_net, dilated_net)}


@pytest.fixture(scope="module")
def quantised(tmp_path_factory):
    folder = tmp_path_factory.mktemp("partition")
    models = {}
    for name, build in NETS.items():
        net, outputs = build()
        path = folder / f"{name}.qdq.onnx"
        quantize_model(net.model(outputs, opset=13), path, CalibrationSource.synthetic(4, seed=1))
        models[name] = (net, path)
    return models


def _kinds(p: Partitioned) -> list[tuple[str, int]]:
    return [("acc" if isinstance(s, AcceleratorSegment) else "host", s.level)
            for s in p.segments]


@pytest.mark.parametrize("name, kinds, host_ops", [
    ("pad_net", [("acc", 0), ("host", 0), ("acc", 1), ("host", 1)], ["Pad"]),
    ("residual_pad_net", [("acc", 0), ("host", 0), ("acc", 1), ("host", 1)], ["Pad"]),
    ("focus_net", [("host", -1), ("acc", 0), ("host", 0)], None),
    ("dilated_net", [("acc", 0), ("host", 0), ("acc", 1), ("host", 1)], ["Conv"]),
])
def test_segments_and_golden_model_match_onnxruntime(quantised, name, kinds, host_ops):
    net, path = quantised[name]
    program = compile_partitioned(path, TINY)
    assert isinstance(program, Partitioned)
    assert _kinds(program) == kinds
    if host_ops is not None:
        assert [n.op for n in program.host_nodes] == host_ops
    assert all(n.reason for n in program.host_nodes)
    golden = GoldenModel(TINY)
    reference = onnx.load(str(path))
    for seed in (1, 2):
        x = net.samples(1, seed=seed)
        want = run_onnxruntime(reference, {"x": x})
        got = program.run({"x": x}, golden.outputs)
        assert want.keys() == got.keys()
        for key in want:
            assert want[key].dtype == got[key].dtype
            assert np.array_equal(want[key], got[key]), key


def test_host_reasons_and_mac_share(quantised):
    program = compile_partitioned(quantised["dilated_net"][1], TINY)
    (conv,) = program.host_nodes
    assert "dilation" in conv.reason
    # 8→16 3x3 and 16→8 1x1 on the accelerator, 16→16 3x3 on the host, all 12x12.
    acc, host = 144 * (16 * 8 * 9 + 8 * 16), 144 * 16 * 16 * 9
    assert conv.macs == host
    assert program.mac_share == acc / (acc + host)
    pad = compile_partitioned(quantised["pad_net"][1], TINY)
    assert pad.mac_share == 1.0
    assert "Pad mode 'reflect'; the accelerator pads with zeros only" in pad.host_nodes[0].reason


def test_codes_cross_between_segments(quantised):
    """Every tensor an accelerator segment hands on is a tensor of 8-bit codes."""
    program = compile_partitioned(quantised["residual_pad_net"][1], TINY)
    first, host, second = program.segments[:3]
    crossing = set(first.outputs)
    assert crossing & set(host.inputs) and crossing & set(second.inputs)
    infos = {vi.name: vi for vi in [*first.compiled.imported.host.epilogue.graph.output]}
    for name in first.outputs:
        assert infos[name].type.tensor_type.elem_type in (onnx.TensorProto.UINT8,
                                                          onnx.TensorProto.INT8)


def test_a_model_in_one_piece_is_not_partitioned(tmp_path):
    net = Net((8, 8, 8), seed=5, name="plain")
    path = tmp_path / "plain.qdq.onnx"
    quantize_model(net.model([net.conv(net.op("Relu", [net.conv("x", 8, 16, 3)]), 16, 8, 1)]),
                   path, CalibrationSource.synthetic(2, seed=1))
    assert isinstance(compile_partitioned(path, TINY), Compiled)


def test_cli_runs_and_reports_a_partitioned_model(quantised, tmp_path):
    net, path = quantised["dilated_net"]
    assert main(["compile", str(path), "-o", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert "(partitioned)" in report and "dilation" in report
    program = compile_partitioned(path, TINY)
    sides = profile(program, TINY)
    assert sides["host"].macs == sum(n.macs for n in program.host_nodes) > 0
    assert sides["accelerator"].macs == sum(s.macs for s in program.accelerated)
    assert sides["accelerator"].seconds > 0 and sides["host"].dram_bytes > 0
    share = sides["accelerator"].macs / (sides["accelerator"].macs + sides["host"].macs)
    assert f"| accelerator | 2 | {sides['accelerator'].macs} ({share:.1%}) |" in report
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "host1.onnx", "host3.onnx", "image0.bin", "image2.bin", "report.md"]
    np.save(tmp_path / "x.npy", net.samples(1, seed=7))
    for backend in ("onnxruntime", "golden"):
        assert main(["run", str(path), "--input", str(tmp_path / "x.npy"), "--backend",
                     backend, "-o", str(tmp_path / f"{backend}.npy")]) == 0
    assert main(["compare", str(tmp_path / "onnxruntime.npy"),
                 str(tmp_path / "golden.npy")]) == 0


@pytest.mark.parametrize("compiled_whole", [True, False])
def test_a_wrong_input_shape_is_named(quantised, tmp_path, capsys, compiled_whole):
    """`sfnpu run` with an input of the wrong shape: an sfnpu error naming the input, the
    shape the model takes and the one given (not an onnxruntime traceback)."""
    net, path = quantised["pad_net"]
    if compiled_whole:
        tiny = Net((8, 12, 12), seed=1, name="whole")
        path = tmp_path / "whole.qdq.onnx"
        quantize_model(tiny.model([tiny.conv("x", 8, 8, 3)]), path,
                       CalibrationSource.synthetic(2, seed=1))
    np.save(tmp_path / "x.npy", np.zeros((1, 8, 12, 10), np.float32))
    assert main(["run", str(path), "--input", str(tmp_path / "x.npy"),
                 "-o", str(tmp_path / "y.npy")]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "input 'x': shape (1, 8, 12, 10); the model takes (1, 8, 12, 12)" in out


@pytest.mark.parametrize("name", ["residual_pad_net", "focus_net"])
def test_segments_on_the_rtl(quantised, name, harness_tiny):
    """Each accelerator segment's image on the RTL: the whole DRAM equals the golden model's
    and every group's cycles and DRAM bytes the cycle model's."""
    net, path = quantised[name]
    program = compile_partitioned(path, TINY)
    golden = GoldenModel(TINY)
    blobs = []

    def accelerator(blob):
        blobs.append(blob)
        return golden.outputs(blob)

    want = run_onnxruntime(onnx.load(str(path)), {"x": net.samples(1, seed=3)})
    got = program.run({"x": net.samples(1, seed=3)}, accelerator)
    assert all(np.array_equal(want[k], got[k]) for k in want)
    assert len(blobs) == len(program.accelerated)
    for blob in blobs:
        assert image.unpack(blob, TINY).program
        rtl_matches(harness_tiny, blob)


def runs_like_onnxruntime_on_the_rtl(program, path, x, harness):
    """The whole model on the golden model equals onnxruntime, and each image it gave the
    accelerator runs on the RTL as :func:`rtl_matches` checks."""
    blobs, golden = [], GoldenModel(TINY)
    got = program.run({"x": x}, lambda blob: blobs.append(blob) or golden.outputs(blob))
    want = run_onnxruntime(onnx.load(str(path)), {"x": x})
    assert all(np.array_equal(want[k], got[k]) for k in want)
    for blob in blobs:
        rtl_matches(harness, blob)


def rtl_matches(harness, blob: bytes):
    """The image on the RTL: no error, the whole DRAM the golden model's, and every group's
    cycles and DRAM bytes the cycle model's."""
    from sfnpu.tb.system import Scoreboard

    problems = Scoreboard(harness.config).problems(blob, harness.run(blob))
    assert not problems, problems


@pytest.fixture(scope="module")
def harness_tiny():
    from test_system import system_harness

    return system_harness("tiny")


@pytest.fixture(scope="module")
def real_quantised(tmp_path_factory):
    """The trained models, quantised with onnxruntime from rendered inputs (16 to calibrate,
    2 held out)."""
    from sfnpu.models import real_models

    folder = tmp_path_factory.mktemp("real")
    cache = {}

    def get(name):
        if name not in cache:
            x, _ = real_models.rendered_inputs(name, 18, seed=0)
            path = folder / f"{name}.qdq.onnx"
            quantize_model(real_models.real_model_path(name), path,
                           CalibrationSource.arrays(x[:16], label="rendered images"))
            cache[name] = (path, x[16:])
        return cache[name]
    return get


@pytest.mark.parametrize("name, config, min_share", [
    ("pplcnet_orientation", "tiny", 1.0),
    ("ppocr_mobile_cls", "kcu1500", 1.0),
    ("ppocr_v4_det", "tiny", 0.95),
    ("ppocr_v4_rec", "kcu1500", 0.95),
    # layers wider than these configurations' stores run as tiles (compiler.tiling)
    ("ppocr_v4_rec", "tiny", 0.95),
    ("ppocr_mobile_cls", "tiny", 1.0),
    ("pplcnet_orientation", "ecp5", 1.0),
    # TFLite, from the mediapipe wheel through tflite2onnx: BlazeFace runs in one piece
    # (the head's Transposes, Reshapes and Concats in the host's epilogue)
    ("blazeface_short_range", "tiny", 1.0),
    # The palm detector: its 26 PReLUs as channel tables; the head's bilinear Resize, its
    # Transposes and the Reshapes of their results on the host (6 segments)
    ("blazepalm_lite", "tiny", 1.0),
    # PyTorch, from the nudenet wheel: YOLOv8n's C2f Splits read in place on tiny's 8 lanes,
    # copied by one-hot convolutions on kcu1500's 64 (the decoupled head on the host)
    ("yolov8n_nudenet", "tiny", 1.0),
    ("yolov8n_nudenet", "kcu1500", 1.0),
])
def test_real_models_end_to_end(real_quantised, name, config, min_share):
    """Each trained model runs whole, partitioned where need be, identical to onnxruntime.
    The share of its MACs on the accelerator is recorded against a floor (PP-OCRv4's
    recogniser leaves its attention's matrix products to the host)."""
    path, inputs = real_quantised(name)
    hw = get_config(config)
    program = compile_partitioned(path, hw)
    assert program.mac_share >= min_share
    reference = onnx.load(str(path))
    input_name = reference.graph.input[0].name
    golden = GoldenModel(hw)
    for x in inputs:
        want = run_onnxruntime(reference, {input_name: x[None]})
        got = program.run({input_name: x[None]}, golden.outputs)
        for key in want:
            assert np.array_equal(want[key], got[key]), (name, key)


@pytest.mark.skipif(os.environ.get("SFNPU_REGRESS") != "1",
                    reason="every trained model on every configuration runs in `make regress`")
@pytest.mark.parametrize("config", ["tiny", "ecp5", "ecp5-ulx3s", "kcu1500"])
def test_the_whole_corpus_on_every_configuration(real_quantised, config):
    """Every trained model on every configuration (tiles where the stores are small): the
    golden model identical to onnxruntime, at least 95 % of the MACs on the accelerator."""
    from sfnpu.models import real_models

    for name in real_models.REAL_MODELS:
        test_real_models_end_to_end(real_quantised, name, config, 0.95)


@pytest.mark.parametrize("factor, coords, nearest", [
    (4, "asymmetric", "floor"), (8, "half_pixel", "round_prefer_floor"),
    (4, "tf_half_pixel_for_nn", "floor")])
def test_nearest_resize_by_4_and_8_on_the_rtl(tmp_path, harness_tiny, factor, coords, nearest):
    """FPN heads' nearest Resize by 4 or 8 runs as a cascade of the 2x upsampler, one group
    each, bit-exact with onnxruntime on the golden model and the RTL (cycle-exact)."""
    net = Net((8, 3, 4), seed=factor, name=f"resize{factor}")
    a = net.op("Relu", [net.conv("x", 8, 16, 3)])
    r = net.op("Resize", [a, "", net.const(np.array([1, 1, factor, factor], np.float32))],
               mode="nearest", coordinate_transformation_mode=coords, nearest_mode=nearest)
    path = tmp_path / "resize.qdq.onnx"
    quantize_model(net.model([net.conv(r, 16, 8, 1, pads=[0, 0, 0, 0])], opset=13), path,
                   CalibrationSource.synthetic(4, seed=1))
    program = compile_partitioned(path, TINY)
    assert isinstance(program, Compiled)
    assert sum(i.upsample for i in program.program.instructions) == factor.bit_length() - 1
    runs_like_onnxruntime_on_the_rtl(program, path, net.samples(1, seed=2), harness_tiny)


def test_resize_with_rounding_off_by_one_stays_on_the_host(tmp_path):
    """asymmetric + round_prefer_floor reads pixel round(o / 4), not o // 4: the host runs it,
    with the reason."""
    net = Net((8, 3, 4), seed=9, name="resizeround")
    a = net.op("Relu", [net.conv("x", 8, 16, 3)])
    r = net.op("Resize", [a, "", net.const(np.array([1, 1, 4, 4], np.float32))],
               mode="nearest", coordinate_transformation_mode="asymmetric",
               nearest_mode="round_prefer_floor")
    path = tmp_path / "resize.qdq.onnx"
    quantize_model(net.model([net.conv(r, 16, 8, 1, pads=[0, 0, 0, 0])], opset=13), path,
                   CalibrationSource.synthetic(4, seed=1))
    program = compile_partitioned(path, TINY)
    (resize,) = program.host_nodes
    assert resize.op == "Resize" and "o // 4" in resize.reason
    x = net.samples(1, seed=2)
    want = run_onnxruntime(onnx.load(str(path)), {"x": x})
    got = program.run({"x": x}, GoldenModel(TINY).outputs)
    assert all(np.array_equal(want[k], got[k]) for k in want)



def test_zero_pad_folds_into_the_convolution(tmp_path):
    """A QDQ model quantised without onnxruntime's pre-processing keeps a zero Pad before a
    convolution (DequantizeLinear → Pad → QuantizeLinear): the convolution pads by that much
    more, in one piece and bit-exact."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self, xs):
            self.feeds = iter([{"x": x[None]} for x in xs])

        def get_next(self):
            return next(self.feeds, None)

    net = Net((8, 8, 9), seed=1, name="zeropad")
    a = net.op("Relu", [net.conv("x", 8, 16, 3)])
    b = net.op("Pad", [a, net.const_int([0, 0, 1, 2, 0, 0, 0, 1])], mode="constant")
    c = net.op("Relu", [net.conv(b, 16, 16, 3, pads=[0, 0, 0, 0])])
    onnx.save(net.model([net.conv(c, 16, 8, 1, pads=[0, 0, 0, 0])], opset=13),
              tmp_path / "float.onnx")
    path = tmp_path / "zeropad.qdq.onnx"
    quantize_static(str(tmp_path / "float.onnx"), str(path), Reader(net.samples(4)),
                    quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, per_channel=True,
                    # 7-bit weights, as quantize_model's default: onnxruntime's U8S8 kernel
                    # on AVX2 without VNNI saturates pair sums of 8-bit weights and is then
                    # not the exact convolution (sfnpu.numeric)
                    reduce_range=True)
    assert "Pad" in {n.op_type for n in onnx.load(str(path)).graph.node}
    program = compile_partitioned(path, TINY)
    assert isinstance(program, Compiled)
    assert [n.attrs["pads"] for n in program.graph.nodes if n.op == "conv"][1] == (1, 2, 0, 1)
    x = net.samples(1, seed=2)
    want = run_onnxruntime(onnx.load(str(path)), {"x": x})
    got = program.run({"x": x}, GoldenModel(TINY).outputs)
    assert all(np.array_equal(want[k], got[k]) for k in want)


def test_channel_zero_padding_on_the_rtl(tmp_path, harness_tiny):
    """A residual block whose shortcut is widened by zero channels (Paddle's and ResNet
    option A's downsampling): the Pad runs as a one-hot 1×1 convolution, the model in one
    piece, bit-exact with onnxruntime on the golden model and the RTL (cycle-exact)."""
    net = Net((8, 8, 8), seed=3, name="chpad")
    a = net.op("Relu", [net.conv("x", 8, 8, 3)])
    shortcut = net.op("AveragePool", [a], kernel_shape=[2, 2], strides=[2, 2])
    shortcut = net.op("Pad", [shortcut, net.const_int([0, 4, 0, 0, 0, 4, 0, 0])],
                      mode="constant")
    b = net.conv(net.op("Relu", [net.conv(a, 8, 16, 3, stride=2)]), 16, 16, 3)
    out = net.op("Relu", [net.op("Add", [b, shortcut])])
    path = tmp_path / "chpad.qdq.onnx"
    quantize_model(net.model([net.conv(out, 16, 8, 1, pads=[0, 0, 0, 0])], opset=13), path,
                   CalibrationSource.synthetic(4, seed=1))
    program = compile_partitioned(path, TINY)
    assert isinstance(program, Compiled)
    pad = next(n for n in program.graph.nodes if n.name.startswith("pad"))
    assert pad.op == "conv" and pad.consts["weight"].shape == (16, 8, 1, 1)
    runs_like_onnxruntime_on_the_rtl(program, path, net.samples(1, seed=2), harness_tiny)


def c2f_net(sizes):
    """YOLOv8's C2f block: a 1x1 convolution split along channels, a bottleneck on the
    second part with that part as its shortcut, and a Concat of both parts and the result;
    then a channel Slice of the first convolution read by another convolution."""
    from onnx import helper

    net = Net((8, 8, 8), seed=6, name="c2f")

    def silu(t):
        return net.op("Mul", [t, net.op("Sigmoid", [t])])
    a = silu(net.conv("x", 8, 24, 1, pads=[0, 0, 0, 0]))
    parts = [f"part{k}" for k in range(len(sizes))]
    net.nodes.append(helper.make_node("Split", [a, net.const_int(sizes)], parts, axis=1,
                                      name="split"))
    b = silu(net.conv(silu(net.conv(parts[-1], sizes[-1], 16, 3)), 16, sizes[-1], 3))
    c = net.op("Add", [parts[-1], b])
    d = silu(net.conv(net.op("Concat", [*parts, c], axis=1), 24 + sizes[-1], 8, 1,
                      pads=[0, 0, 0, 0]))
    s = net.op("Slice", [a, net.const_int([4]), net.const_int([2**62]), net.const_int([1])])
    e = silu(net.conv(s, 20, 8, 3))
    return net, [net.conv(net.op("Add", [d, e]), 8, 8, 1, pads=[0, 0, 0, 0])]


@pytest.mark.parametrize("sizes, views", [([8, 16], 2), ([4, 20], 0)],
                         ids=["whole-blocks", "partial-blocks"])
def test_channel_split_on_the_rtl(tmp_path, harness_tiny, sizes, views):
    """Split and Slice along channels run on the accelerator: parts made of whole lane blocks
    are read in place (views of the split tensor in DRAM, no group of their own); others,
    and the Slice from channel 4, are one-hot 1x1 convolutions. Bit-exact with onnxruntime
    on the golden model and the RTL (cycle-exact), the model in one piece."""
    net, outputs = c2f_net(sizes)
    path = tmp_path / "c2f.qdq.onnx"
    quantize_model(net.model(outputs, opset=13), path, CalibrationSource.synthetic(4, seed=1))
    program = compile_partitioned(path, TINY)
    assert isinstance(program, Compiled)
    assert sum(n.op == "slice" for n in program.graph.nodes) == views
    copies = [n for n in program.graph.nodes if n.op == "conv"
              and (n.name == "split" or n.name.startswith("slice"))]
    assert len(copies) == 3 - views
    runs_like_onnxruntime_on_the_rtl(program, path, net.samples(1, seed=2), harness_tiny)


def test_concat_off_lane_blocks_on_the_rtl(tmp_path, harness_tiny):
    """Concat parts of 4 and 12 channels on tiny's 8 lanes: the parts start on block
    boundaries (a gap after the first), and since a max pool reads the result, a one-hot
    1x1 convolution packs it again. Bit-exact and cycle-exact on the RTL."""
    net = Net((8, 8, 8), seed=8, name="catpool")
    a = net.op("Relu", [net.conv("x", 8, 4, 3)])
    b = net.op("Relu", [net.conv("x", 8, 12, 1, pads=[0, 0, 0, 0])])
    pooled = net.op("MaxPool", [net.op("Concat", [a, b], axis=1)], kernel_shape=[2, 2],
                    strides=[2, 2])
    path = tmp_path / "catpool.qdq.onnx"
    quantize_model(net.model([net.conv(pooled, 16, 8, 3)], opset=13), path,
                   CalibrationSource.synthetic(4, seed=1))
    program = compile_partitioned(path, TINY)
    assert isinstance(program, Compiled)
    (concat,) = [n for n in program.graph.nodes if n.op == "concat"]
    assert concat.attrs["offsets"] == (0, 8)
    assert any(n.name.endswith(".pack") for n in program.graph.nodes)
    runs_like_onnxruntime_on_the_rtl(program, path, net.samples(1, seed=2), harness_tiny)


def test_split_of_a_reshaped_tensor_stays_on_the_host(tmp_path):
    """A Split of a tensor the graph reshaped (a detection head's 1×C×N) is no channel window
    of a feature map: the host runs it, with the reason."""
    from onnx import helper

    net = Net((8, 4, 4), seed=7, name="splitreshape")
    a = net.op("Reshape", [net.op("Relu", [net.conv("x", 8, 16, 3)]),
                           net.const_int([1, 16, 16])])
    net.nodes.append(helper.make_node("Split", [a, net.const_int([8, 8])], ["p", "q"],
                                      axis=1, name="split"))
    path = tmp_path / "splitreshape.qdq.onnx"
    quantize_model(net.model(["p", "q"], opset=13), path, CalibrationSource.synthetic(4, seed=1))
    program = compile_partitioned(path, TINY)
    split = next(n for n in program.host_nodes if n.op == "Split")
    assert "shape (1, 16, 16)" in split.reason and "1×C×H×W" in split.reason
    x = net.samples(1, seed=2)
    want = run_onnxruntime(onnx.load(str(path)), {"x": x})
    got = program.run({"x": x}, GoldenModel(TINY).outputs)
    assert all(np.array_equal(want[k], got[k]) for k in want)


@pytest.mark.parametrize("kernel", [5, 9])
def test_sppf_max_pools_on_the_rtl(tmp_path, harness_tiny, kernel):
    """YOLOv5's SPPF (three 5×5 stride-1 max pools in a chain, concatenated) and SPP's 9×9:
    each pool runs as a cascade of 3×3 max pools, bit-exact on the golden model and the RTL
    (cycle-exact)."""
    net = Net((8, 6, 7), seed=kernel, name=f"sppf{kernel}")
    a = net.op("Relu", [net.conv("x", 8, 8, 1, pads=[0, 0, 0, 0])])
    pools = [a]
    for _ in range(3 if kernel == 5 else 1):
        pools.append(net.op("MaxPool", [pools[-1]], kernel_shape=[kernel, kernel],
                            strides=[1, 1], pads=[kernel // 2] * 4))
    x = net.op("Concat", pools, axis=1)
    path = tmp_path / "sppf.qdq.onnx"
    quantize_model(net.model([net.conv(x, 8 * len(pools), 8, 1, pads=[0, 0, 0, 0])], opset=13),
                   path, CalibrationSource.synthetic(4, seed=1))
    program = compile_partitioned(path, TINY)
    assert isinstance(program, Compiled)
    assert sum(n.op == "maxpool" for n in program.graph.nodes) == (len(pools) - 1) * (kernel // 2)
    runs_like_onnxruntime_on_the_rtl(program, path, net.samples(1, seed=2), harness_tiny)


@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "scalar"])
def test_prelu_runs_as_channel_tables_on_the_rtl(tmp_path, harness_tiny, per_channel):
    """PRelu (TFLite detectors put one after every residual add) runs as one table per
    channel on the input side of the group that reads it, bit-exact with onnxruntime on the
    golden model and the RTL (cycle-exact), whether its slope is per channel or a scalar; its
    result also feeds a later Add as the shortcut."""
    net = Net((8, 6, 6), seed=11 + per_channel, name="prelu")
    rng = np.random.default_rng(3)
    slope = rng.uniform(-0.5, 0.9, (16, 1, 1) if per_channel else (1,)).astype(np.float32)
    a = net.op("PRelu", [net.conv("x", 8, 16, 3), net.const(slope)])
    b = net.op("Add", [net.conv(a, 16, 16, 3), a])
    c = net.op("PRelu", [b, net.const(slope)])
    path = tmp_path / "prelu.qdq.onnx"
    quantize_model(net.model([net.conv(c, 16, 8, 1, pads=[0, 0, 0, 0])], opset=13), path,
                   CalibrationSource.synthetic(4, seed=1))
    program = compile_partitioned(path, TINY)
    assert isinstance(program, Compiled), "PRelu left to the host"
    runs_like_onnxruntime_on_the_rtl(program, path, net.samples(1, seed=2), harness_tiny)


def test_per_channel_constant_arithmetic_on_the_rtl(tmp_path, harness_tiny):
    """Add, Sub (the constant first), Mul and Div by one constant per channel (the PP-OCRv4
    detector's folded bias) run as tables per channel, like PRelu: bit-exact with
    onnxruntime on the golden model and the RTL (cycle-exact), the model in one piece."""
    net = Net((8, 6, 6), seed=13, name="chconst")
    rng = np.random.default_rng(4)

    def vector(shape):
        return net.const(rng.uniform(0.5, 1.5, shape).astype(np.float32))
    # (after a Relu: onnxruntime's pre-processing folds a constant right after a Conv into it)
    a = net.op("Add", [net.op("Relu", [net.conv("x", 8, 16, 3)]), vector((1, 16, 1, 1))])
    b = net.op("Sub", [vector((16, 1, 1)), a])
    c = net.op("Mul", [net.op("Relu", [net.conv(b, 16, 16, 3)]), vector((1, 16, 1, 1))])
    d = net.op("Div", [c, vector((16, 1, 1))])
    path = tmp_path / "chconst.qdq.onnx"
    quantize_model(net.model([net.conv(d, 16, 8, 1, pads=[0, 0, 0, 0])], opset=13), path,
                   CalibrationSource.synthetic(4, seed=1))
    program = compile_partitioned(path, TINY)
    assert isinstance(program, Compiled), "a per-channel constant left to the host"
    assert sum(n.op == "channel_table" for n in program.graph.nodes) == 4
    runs_like_onnxruntime_on_the_rtl(program, path, net.samples(1, seed=2), harness_tiny)


@pytest.mark.parametrize("upsample", [False, True], ids=["plain", "upsampled"])
def test_product_of_two_maps_on_the_rtl(tmp_path, harness_tiny, upsample):
    """Mul of two feature maps of the same shape (a gate: ``x · Sigmoid(conv(x))``, and the
    product of two convolutions) runs on the accelerator as Eltwise.MUL: the channel scaler
    takes the other map's code with every pixel. Bit-exact with onnxruntime on the golden
    model and the RTL (cycle-exact), the model in one piece; the gate also feeds an upsample,
    whose replays freeze the scaler's pipeline."""
    net = Net((8, 6, 7), seed=17 + upsample, name="gates")
    a = net.op("Relu", [net.conv("x", 8, 16, 3)])
    gate = net.op("Sigmoid", [net.conv(a, 16, 16, 3)])
    b = net.op("Mul", [a, gate])                     # spatial attention
    c = net.op("Mul", [net.conv(b, 16, 16, 1, pads=[0, 0, 0, 0]), net.conv(a, 16, 16, 3)])
    if upsample:
        c = net.op("Resize", [c, "", net.const(np.array([1, 1, 2, 2], np.float32))],
                   mode="nearest")
    path = tmp_path / "gates.qdq.onnx"
    quantize_model(net.model([net.conv(c, 16, 8, 1, pads=[0, 0, 0, 0])], opset=13), path,
                   CalibrationSource.synthetic(4, seed=1))
    program = compile_partitioned(path, TINY)
    assert isinstance(program, Compiled), "a product of two maps left to the host"
    kinds = [i.eltwise for i in program.program.instructions]
    assert kinds.count(Eltwise.MUL) == 2, kinds
    runs_like_onnxruntime_on_the_rtl(program, path, net.samples(1, seed=2), harness_tiny)


def test_row_products_run_as_convolutions_on_the_rtl(tmp_path, harness_tiny):
    """A sequence's matrix products (``Gemm``/``MatMul`` of a (T, K) activation by constant
    weights, as in SVTR's blocks and CTC head) run on the accelerator as 1×1 convolutions
    over T pixels, the host moving codes between the layouts: bit-exact with onnxruntime on
    the golden model and the RTL (cycle-exact), every MAC on the accelerator."""
    net = Net((8, 2, 6), seed=5, name="rows")
    a = net.op("Relu", [net.conv("x", 8, 16, 3)])
    rows = net.op("Transpose", [net.op("Reshape", [a, net.const_int([16, 12])])], perm=[1, 0])
    h = net.op("Sigmoid", [net.gemm(rows, 16, 24)])                  # (12, 24), transB
    w = net.const(np.random.default_rng(3).standard_normal((24, 10)) * 0.2)
    out = net.op("MatMul", [h, w])                                   # (12, 10), (K, N) weight
    path = tmp_path / "rows.qdq.onnx"
    quantize_model(net.model([out], opset=13), path, CalibrationSource.synthetic(4, seed=1))
    program = compile_partitioned(path, TINY)
    assert isinstance(program, Partitioned)
    assert program.mac_share == 1.0, program.host_nodes
    # the host moves codes between the layouts (and runs the Sigmoid between the layouts)
    assert {n.op for n in program.host_nodes} == {"Transpose", "Reshape", "Sigmoid"}
    assert sum(len(s.compiled.program.instructions) for s in program.accelerated) == 3
    runs_like_onnxruntime_on_the_rtl(program, path, net.samples(1, seed=2), harness_tiny)


def test_conv_transpose_stays_on_the_host_with_the_reason(tmp_path):
    """onnxruntime runs a QDQ ConvTranspose in float32, which exact integer sums cannot
    reproduce bit for bit (studies/conv_transpose_rounding.py): the host runs it, saying so,
    and the convolutions around it stay on the accelerator."""
    net = Net((8, 4, 4), seed=4, name="deconv")
    a = net.op("Relu", [net.conv("x", 8, 16, 3)])
    w = net.const(np.random.default_rng(1).standard_normal((16, 8, 2, 2)) * 0.3)
    up = net.op("ConvTranspose", [a, w], kernel_shape=[2, 2], strides=[2, 2])
    path = tmp_path / "deconv.qdq.onnx"
    quantize_model(net.model([net.conv(net.op("Relu", [up]), 8, 8, 3)], opset=13), path,
                   CalibrationSource.synthetic(4, seed=1))
    program = compile_partitioned(path, TINY)
    (deconv,) = [n for n in program.host_nodes if n.macs]
    assert deconv.op == "ConvTranspose" and "float32 ConvTranspose" in deconv.reason
    assert len(program.accelerated) == 2
    x = net.samples(1, seed=2)
    want = run_onnxruntime(onnx.load(str(path)), {"x": x})
    got = program.run({"x": x}, GoldenModel(TINY).outputs)
    assert all(np.array_equal(want[k], got[k]) for k in want)


#: Groups of each trained model's first accelerator image run on the RTL.
SLICE_GROUPS = 6


@pytest.mark.parametrize("name", ["pplcnet_orientation", "ppocr_mobile_cls", "ppocr_v4_det",
                                  "ppocr_v4_rec", "blazeface_short_range", "blazepalm_lite",
                                  "yolov8n_nudenet"])
def test_real_model_first_groups_on_the_rtl(real_quantised, harness_tiny, name):
    """The first groups of each trained model's first accelerator image (its stem and first
    blocks, on real weights and a rendered input) on the tiny RTL: DRAM identical to the
    golden model, every group cycle-exact and byte-exact against the cycle model."""
    path, inputs = real_quantised(name)
    program = compile_partitioned(path, TINY)
    blobs, golden = [], GoldenModel(TINY)
    program.run({onnx.load(str(path)).graph.input[0].name: inputs[0][None]},
                lambda blob: blobs.append(blob) or golden.outputs(blob))
    groups = len(image.unpack(blobs[0], TINY).program)
    sliced = image.first_groups(blobs[0], TINY, min(SLICE_GROUPS, groups))
    assert len(image.unpack(sliced, TINY).program) == min(SLICE_GROUPS, groups)
    rtl_matches(harness_tiny, sliced)
