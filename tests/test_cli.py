"""The `sfnpu` command line: sim, image, docs, configs, and its error paths."""

import subprocess
import sys

import pytest

from sfnpu import cli
from sfnpu.config import get_config
from sfnpu.examples import sample_image


def run(capsys, *argv):
    code = cli.main(list(argv))
    return code, " ".join(capsys.readouterr().out.split())  # independent of line wrapping


@pytest.mark.parametrize("config", ["tiny", "ecp5", "kcu1500"])
def test_sim_runs_every_available_stage(capsys, config):
    code, out = run(capsys, "sim", "--config", config)
    assert code == 0
    assert "PASS" in out and "not built yet" in out
    assert "sample program" in out and "INSTRUCTIONS" in out


def test_sim_with_a_model_says_what_is_missing(capsys):
    code, out = run(capsys, "sim", "--model", "resnet18")
    assert code == 2 and "ONNX front end is not built yet" in out


def test_image_command(capsys, tmp_path):
    path = tmp_path / "sample.img"
    path.write_bytes(sample_image(get_config("tiny")).blob)
    code, out = run(capsys, "image", str(path), "--config", "tiny")
    assert code == 0 and "matches 'tiny'" in out and "global_avg" in out
    code, out = run(capsys, "image", str(path), "--config", "ecp5")
    assert code == 2 and "error:" in out and "recompile for this configuration" in out
    code, out = run(capsys, "image", str(tmp_path / "missing.img"))
    assert code == 2 and "cannot read" in out


def test_configs_and_not_built_commands(capsys):
    code, out = run(capsys, "configs")
    assert code == 0 and "kcu1500" in out and "4096 MAC/cycle" in out
    for command in ("bench", "verilog", "bitstream", "firmware"):
        code, out = run(capsys, command)
        assert code == 2 and "not built yet" in out


def test_docs_check(capsys):
    code, out = run(capsys, "docs", "--check")
    assert code == 0 and "up to date" in out


def test_entry_point_is_installed():
    result = subprocess.run([sys.executable, "-m", "sfnpu.cli", "configs"],
                            capture_output=True, text=True)
    assert result.returncode == 0 and "tiny" in result.stdout
