"""Front end and golden model against onnxruntime on quantised test networks.

Each network is built in float, quantised with sfnpu's quantiser (onnxruntime's quantize_static),
compiled, and run through host prologue → golden model (reading only the DRAM image) → host
epilogue. The outputs must equal onnxruntime's on the whole QDQ model, value for value.
"""

import numpy as np
import onnx
import pytest

from sfnpu.compiler import importer
from sfnpu.compiler.codegen import CodegenError
from sfnpu.compiler.importer import ModelError, import_model
from sfnpu.compiler.pipeline import compile_model, run_onnxruntime
from sfnpu.compiler.quantize import CalibrationSource, quantize_model
from sfnpu.config import get_config
from sfnpu.sim.golden import GoldenModel
from netbuild import Net

TINY = get_config("tiny")


def quantised(tmp_path, net: Net, outputs, signed: bool):
    path = tmp_path / f"{net.name}_{'s8' if signed else 'u8'}.onnx"
    quantize_model(net.model(outputs), path, CalibrationSource.arrays(net.samples(16)),
                   activation_signed=signed, reduce_range=True)
    return path


def assert_matches_onnxruntime(path, net: Net, config=TINY, seeds=(5, 6)):
    compiled = compile_model(path, config)
    golden = GoldenModel(config)
    reference = onnx.load(str(path))
    for seed in seeds:
        x = net.samples(1, seed=seed, scale=1.3)
        want = run_onnxruntime(reference, {"x": x})
        got = compiled.run({"x": x}, golden.outputs)
        assert want.keys() == got.keys()
        for name in want:
            assert want[name].shape == got[name].shape, name
            diff = want[name] != got[name]
            assert not diff.any(), (f"{name}: {diff.mean():.2%} of values differ, largest "
                                    f"{np.abs(want[name] - got[name]).max()}")
    return compiled


def conv_stack():
    n = Net((3, 20, 18), name="conv_stack")
    x = n.op("Relu", [n.conv("x", 3, 16, 3)])
    x = n.op("Relu", [n.conv(x, 16, 16, 3, stride=2, pads=[1, 0, 1, 1], group=16)])
    x = n.conv(x, 16, 8, 1)
    return n, [n.conv(x, 8, 5, 5, stride=(2, 1))]


@pytest.mark.parametrize("signed", [False, True], ids=["uint8", "int8"])
def test_conv_stack(tmp_path, signed):
    n, outs = conv_stack()
    compiled = assert_matches_onnxruntime(quantised(tmp_path, n, outs, signed), n)
    kinds = [[node.op for node in g.nodes] for g in compiled.groups]
    assert kinds == [["conv"]] * 4   # ReLU is absorbed into each conv's output range
    assert compiled.imported.host.epilogue_ops == ("DequantizeLinear",)


# -- importer errors -------------------------------------------------------------------------

def test_float_model_is_refused(tmp_path):
    n, outs = conv_stack()
    path = tmp_path / "float.onnx"
    onnx.save(n.model(outs), str(path))
    with pytest.raises(ModelError, match="no quantised tensor|not dequantised"):
        import_model(path)


def test_missing_and_garbage_files(tmp_path):
    with pytest.raises(ModelError, match="no such model file"):
        import_model(tmp_path / "nope.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00not a protobuf at all" * 10)
    with pytest.raises(ModelError, match="not a readable ONNX model|not valid ONNX"):
        import_model(bad)


def test_external_data_outside_the_folder_is_refused(tmp_path):
    n, outs = conv_stack()
    model = n.model(outs)
    (tmp_path / "m").mkdir()
    onnx.save(model, str(tmp_path / "m" / "model.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    m = onnx.load(str(tmp_path / "m" / "model.onnx"), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../../etc/passwd"
    onnx.save(m, str(tmp_path / "m" / "evil.onnx"))
    with pytest.raises(ModelError, match="outside the model's folder"):
        importer.load_model(tmp_path / "m" / "evil.onnx")


@pytest.mark.parametrize("build, message", [
    (lambda n: n.conv("x", 4, 8, 3, group=2), r"grouped convolution \(group=2\)"),
    (lambda n: n.op("Conv", ["x", n.const(np.ones((4, 4, 3, 3)))], dilations=[2, 2],
                    pads=[2, 2, 2, 2]), "dilation"),
    (lambda n: n.conv(n.op("LRN", [n.conv("x", 4, 4, 1)], size=3), 4, 4, 3),
     r"'lrn\d+' \(LRN\): not executable on the accelerator, and 1 compute node\(s\) after "
     r"it \(Conv\) would have to run on the host"),
])
def test_unsupported_operators_name_the_node(tmp_path, build, message):
    n = Net((4, 8, 8), name="bad")
    out = build(n)
    path = tmp_path / "bad.onnx"
    quantize_model(n.model([out]), path, CalibrationSource.arrays(n.samples(4)),
                   reduce_range=True)
    with pytest.raises(ModelError, match=message) as e:
        import_model(path)
    assert "ONNX node" in str(e.value)


def _wide_layers(n: Net, shape, kind: str) -> list[str]:
    x = n.conv("x", shape[0], 16, 3)
    if kind == "conv":
        return [x]
    if kind == "residual":       # a strip reads its window of the shortcut too
        y = n.op("Relu", [n.conv(x, 16, 16, 3)])
        return [n.op("Add", [x, y])]
    if kind == "pool":           # a pool without padding is recomputed over the halo
        return [n.op("MaxPool", [n.op("Relu", [x])], kernel_shape=[3, 3], strides=[2, 2])]
    if kind == "depthwise":      # channel slices of a depthwise layer read their blocks only
        return [n.conv(n.op("Relu", [x]), 16, 16, 5, pads=[2, 2, 2, 2], group=16)]
    return [n.op("GlobalAveragePool", [x])]     # the pool is taken apart from the conv


@pytest.mark.parametrize("shape, kind", [
    ((16, 4, 260), "conv"),           # rows wider than the row buffer (520 > 512 words)
    ((3, 4, 1030), "conv"),           # conv rows wider than the partial-sum buffer (1024)
    ((16, 5, 300), "residual"),
    ((16, 7, 301), "pool"),
    ((8, 6, 400), "depthwise"),
    ((32, 3, 300), "gap"),
    # one output column of a 3×3 conv over 2048 channels needs 3 × 256 words of a row: each
    # output row in shares of the input channels, partial sums carried from share to share
    ((2048, 3, 4), "conv"),
    # … and where one channel block of a whole row (520 words) exceeds it too, the shares
    # run in column strips
    ((1368, 3, 520), "conv"),
])
def test_layer_beyond_the_stores_is_tiled(tmp_path, shape, kind):
    """A layer the accelerator would stop with BUFFER_OVERFLOW runs as tiles that each fit
    (column strips reading windows with halos, channel slices, input-channel shares) and gives
    onnxruntime's bits."""
    n = Net(shape, name=f"wide_{kind}")
    path = quantised(tmp_path, n, _wide_layers(n, shape, kind), signed=False)
    program = compile_model(path, TINY).program
    tiles = [g for g in program.groups if g.part]
    assert tiles, "the layer should not fit the stores untiled"
    assert any(i.windowed for i in program.instructions) == (kind != "depthwise")
    assert any(i.psum_keep for i in program.instructions) == (shape[0] > 1024)
    assert_matches_onnxruntime(path, n)


@pytest.mark.parametrize("shape, layers, message", [
    # a padded pool cannot be split in columns (its padding is the same on every side),
    # and one channel block of its rows is wider than the row buffer
    ((8, 6, 600), lambda n: [n.op("MaxPool", [n.conv("x", 8, 8, 3)], kernel_shape=[3, 3],
                                  strides=[2, 2], pads=[1, 1, 1, 1])],
     "its pool pads every side alike"),
])
def test_layer_no_tiling_fits_is_refused(tmp_path, shape, layers, message):
    """What no tiling can fix is refused at compile time, by ONNX node, instead of becoming a
    program that fails on the hardware."""
    n = Net(shape, name="untileable")
    path = quantised(tmp_path, n, layers(n), signed=False)
    with pytest.raises(CodegenError, match=message) as e:
        compile_model(path, TINY)
    assert "(nodes '" in str(e.value) and "config 'tiny'" in str(e.value)
    assert "BUFFER_OVERFLOW" in str(e.value)
