"""Functional coverage: the regression the system tests run reaches every ISA bin.

The report of the last run is written to build/coverage/isa.md.
"""

from sfnpu import isa
from sfnpu.config import get_config
from sfnpu.tb.coverage import field_bins, measure
from sfnpu.tb.verilator import REPO_ROOT
from test_system import regression_programs


def test_every_field_has_bins():
    names = {f.name for f in isa.field_table() if f.kind != "reserved"}
    assert set(field_bins()) == names


def test_regression_reaches_every_bin(tmp_path):
    config = get_config("tiny")
    cov = measure((p.instructions for p in regression_programs(config, tmp_path)), config)
    out = REPO_ROOT / "build" / "coverage"
    out.mkdir(parents=True, exist_ok=True)
    (out / "isa.md").write_text(cov.markdown("ISA functional coverage of the RTL regression "
                                             "(tests/test_system.py)"))
    assert cov.missing() == {}, cov.missing()
    assert cov.reached == cov.total


def test_missing_bins_are_reported():
    config = get_config("tiny")
    cov = measure([[isa.Instruction(in_c=8, out_c=8, in_h=4, in_w=4, out_h=4, out_w=4)]],
                  config)
    missing = cov.missing()
    assert "DEPTHWISE" in missing["conv"] and "NORMAL" in missing["conv"]
    assert cov.reached < cov.total and "missing" in cov.markdown()
