"""Generated Verilog (hw/verilog.py) passes ``verilator --lint-only -Wall`` with the waivers of
:data:`sfnpu.hw.verilog.LINT_WAIVERS` and nothing else; a warning outside them fails the lint."""

import os

import pytest

from sfnpu.hw.verilog import BLOCKS, LINT_WAIVERS, lint, write_verilog

# kcu1500 (Ti = To = 64: 17 MB of Verilog) takes about 3 CPU minutes to convert and lint, so
# only the full regression (`make regress`) runs it.
CONFIGS = ["tiny", "ecp5", pytest.param("kcu1500", marks=pytest.mark.skipif(
    not os.environ.get("SFNPU_REGRESS"), reason="kcu1500 lint runs in `make regress`"))]


@pytest.mark.parametrize("config", CONFIGS)
def test_generated_verilog_lints_clean(config, tmp_path):
    paths = write_verilog(tmp_path, (config,))
    assert sorted(p.stem for p in paths) == sorted(BLOCKS)
    for path in paths:
        result = lint(path, path.stem)
        assert result.returncode == 0, f"{path.name}:\n{result.stderr[-4000:]}"


def test_warnings_outside_the_waivers_fail(tmp_path):
    """A truncation that is not Yosys' `!value` idiom is not waived."""
    path = tmp_path / "truncating.v"
    path.write_text("module truncating(input [7:0] a, output [3:0] y);\n"
                    "  assign y = a;\nendmodule\n")
    result = lint(path, "truncating")
    assert result.returncode != 0 and "WIDTHTRUNC" in result.stderr


def test_every_waiver_has_a_reason():
    for rule, match, reason in LINT_WAIVERS:
        assert rule.isupper() and len(reason) > 30, rule
