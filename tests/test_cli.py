"""The `sfnpu` command line: sim, image, docs, configs, and its error paths."""

import subprocess
import sys

import pytest

from sfnpu import cli
from sfnpu.config import get_config
from examples import sample_image


def run(capsys, *argv):
    code = cli.main(list(argv))
    return code, " ".join(capsys.readouterr().out.split())  # independent of line wrapping


@pytest.mark.parametrize("config", ["tiny", "kcu1500"])
def test_sim_runs_every_available_stage(capsys, config):
    code, out = run(capsys, "sim", "--config", config)
    assert code == 0, out
    assert "PASS" in out and "not built yet" not in out
    assert "100.0000% identical" in out and "top-1 8/8" in out
    assert "cycle model" in out and "ms at" in out
    if config == "tiny":        # the trained model on the Verilated accelerator
        assert "RTL on Verilator" in out and "DRAM identical to the golden model" in out
        # and its group log against the cycle model (table cells may wrap)
        cells = " ".join(t for t in out.split() if t not in ("│", "┃"))
        assert "cycle model vs RTL" in cells and "bytes identical in 38/38 groups" in cells
    else:
        assert "not simulated by default: kcu1500's 4096 MACs" in out and "--rtl" in out


def test_sim_with_a_builder_and_a_bad_model(capsys):
    code, out = run(capsys, "sim", "--model", "mobilenet_v2")
    assert code == 0 and "PASS" in out, out
    assert "DRAM identical to the golden model" in out
    code, out = run(capsys, "sim", "--model", "no_such_net")
    assert code == 2 and "not a file, a builder" in out


def test_image_command(capsys, tmp_path):
    path = tmp_path / "sample.img"
    path.write_bytes(sample_image(get_config("tiny")).blob)
    code, out = run(capsys, "image", str(path), "--config", "tiny")
    assert code == 0 and "matches 'tiny'" in out and "global_avg" in out
    code, out = run(capsys, "image", str(path), "--config", "ecp5")
    assert code == 2 and "error:" in out and "recompile for this configuration" in out
    code, out = run(capsys, "image", str(tmp_path / "missing.img"))
    assert code == 2 and "cannot read" in out


def test_configs(capsys):
    code, out = run(capsys, "configs")
    assert code == 0 and "kcu1500" in out and "4096 MAC/cycle" in out
    # the resource estimate against each part: ecp5-ulx3s fits, ecp5 does not
    from sfnpu.config import get_config
    from sfnpu.resources import estimate

    fits, too_big = estimate(get_config("ecp5-ulx3s")), estimate(get_config("ecp5"))
    assert f"{fits.multipliers} multipliers (MULT18X18D), {fits.bram18k} 18K block RAMs" in out
    kcu = estimate(get_config("kcu1500"))
    assert f"{kcu.multipliers} multipliers (DSP48E2)" in out
    assert f"needs {kcu.luts} LUT6, XCKU115 has 663360" in out
    assert "on LFE5U-85F: fits" in out
    assert f"needs {too_big.bram18k} 18K block RAMs, LFE5U-85F has 208" in out


def test_bitstream_options_are_checked(capsys, tmp_path):
    code, out = run(capsys, "bitstream", "--board", "kcu105", "--synth-only")
    assert code == 2 and "apply to ulx3s-85f" in out
    code, out = run(capsys, "bitstream", "--memory-kib", "32")
    assert code == 2 and "--memory bram" in out
    code, out = run(capsys, "bitstream", "--board", "kcu105", "--seed", "3")
    assert code == 2 and "--seed and --router apply to ulx3s-85f" in out
    code, out = run(capsys, "bitstream", "--seed", "1,1", "--out", str(tmp_path))
    assert code == 2 and "give one or more different seeds" in out
    assert not any(tmp_path.iterdir()), "refused before anything is built"
    with pytest.raises(SystemExit) as exited:
        cli.main(["bitstream", "--seed", "1,x"])
    assert exited.value.code == 2 and "comma-separated" in capsys.readouterr().err


def test_firmware_builds_the_host_program(capsys, tmp_path):
    code, out = run(capsys, "firmware", "--out", str(tmp_path))
    assert code == 0 and (tmp_path / "sfnpu-run").exists()


def test_docs_check(capsys):
    code, out = run(capsys, "docs", "--check")
    assert code == 0 and "up to date" in out


def test_entry_point_is_installed():
    result = subprocess.run([sys.executable, "-m", "sfnpu.cli", "configs"],
                            capture_output=True, text=True)
    assert result.returncode == 0 and "tiny" in result.stdout


def test_compile_run_compare_on_a_float_model(capsys, tmp_path):
    """The user path: float ONNX → (synthetic calibration) → compile → run on the golden model
    and on onnxruntime → compare: identical."""
    import numpy as np
    import onnx

    from netbuild import Net

    n = Net((3, 12, 12), name="cli_net")
    y = n.conv(n.op("Relu", [n.conv("x", 3, 8, 3)]), 8, 4, 3, stride=2)
    model_path = tmp_path / "net.onnx"
    onnx.save(n.model([y]), str(model_path))
    np.save(tmp_path / "x.npy", n.samples(1, seed=9))

    code, out = run(capsys, "compile", str(model_path), "-o", str(tmp_path / "out"))
    assert code == 0, out
    assert "SYNTHETIC" in out and "groups (instructions): 2" in out
    assert (tmp_path / "out" / "image.bin").stat().st_size > 0
    code, out = run(capsys, "image", str(tmp_path / "out" / "image.bin"), "--config", "tiny")
    assert code == 0, out

    for backend in ("golden", "onnxruntime"):
        code, out = run(capsys, "run", str(model_path), "--input", str(tmp_path / "x.npy"),
                        "--backend", backend, "-o", str(tmp_path / f"{backend}.npy"))
        assert code == 0, out
    code, out = run(capsys, "compare", str(tmp_path / "golden.npy"),
                    str(tmp_path / "onnxruntime.npy"))
    assert code == 0 and "100.0000% identical, largest difference 0" in out


def test_run_reports_bad_input(capsys, tmp_path):
    code, out = run(capsys, "run", str(tmp_path / "missing.onnx"), "--input", "x.npy",
                    "-o", str(tmp_path / "y.npy"))
    assert code == 2 and "no such model file" in out


@pytest.mark.parametrize("k, step, host, stem_input", [
    (7, "space_to_depth", "then SpaceToDepth(2) into", ("| 8x8x8 |", "| 2x16x16 |")),
    (2, "fold_input_taps", "then the stem's taps as channels into",
     ("| 8x16x16 |", "| 2x16x16 |")),
])
def test_stem_rewrite_switches(capsys, tmp_path, k, step, host, stem_input):
    """A 7×7 stride-2 stem over 2 channels compiles with the pipeline step `space_to_depth`
    by default (a 4×4 stride-1 stem over the host's SpaceToDepth of the input: 8 input
    channels), a 2×2 stride-1 one with `fold_input_taps` (1×1 over the host's 8 taps);
    each without its step under its `--no-…` switch; every program gives onnxruntime's
    outputs on the golden model."""
    import numpy as np
    import onnx

    from netbuild import Net

    n = Net((2, 16, 16), name="cli_stem")
    stride, pads = (2, None) if k == 7 else (1, [0, 0, 1, 1])
    y = n.conv(n.op("Relu", [n.conv("x", 2, 8, k, stride=stride, pads=pads)]), 8, 4, 3)
    model_path = tmp_path / "stem.onnx"
    onnx.save(n.model([y]), str(model_path))
    np.save(tmp_path / "x.npy", n.samples(1, seed=4))
    switch = "--no-" + step.replace("_", "-")
    for flags, on in (([], True), ([switch], False)):
        code, out = run(capsys, "compile", str(model_path), *flags, "-o", str(tmp_path / "c"))
        assert code == 0, out
        assert "groups (instructions): 2" in out
        report = (tmp_path / "c" / "report.md").read_text()
        assert (step in report.split("pipeline steps:")[1].splitlines()[0]) == on
        assert (host in report) == on
        assert stem_input[0 if on else 1] in report     # the stem's input
        outputs = []
        for backend, extra in (("onnxruntime", []), ("golden", flags)):
            target = tmp_path / f"{backend}.npy"
            code, out = run(capsys, "run", str(model_path), *extra, "--input",
                            str(tmp_path / "x.npy"), "--backend", backend, "-o", str(target))
            assert code == 0, out
            outputs.append(np.load(target))
        assert np.array_equal(*outputs)
