"""`sfnpu dse`: the spec, one point, the Pareto sets, the resource estimate, and a small sweep on
a local Ray (cached re-run, resumed sweep, infeasible points)."""

import csv
import os

import pytest

from sfnpu import cli, resources
from sfnpu.config import CONFIGS, DEVICES, get_config
from sfnpu.tools import dse
from sfnpu.tools.dse_report import pareto, paper_point

#: A network that compiles and searches in a second or two.
SMALL = dse.NetworkSpec("squeezenet1_1", 32)

SPEC = {
    "name": "test",
    "networks": [{"model": "squeezenet1_1", "sizes": [32]}],
    "space": [
        # a fitting point, and one whose array exceeds the part's multipliers
        {"base": "ecp5-ulx3s", "mac_array": [{"ti": 4, "to": 4}, {"ti": 16, "to": 16}]},
        # an impossible configuration: recorded, not fatal
        {"base": "tiny", "ti": [3]},
    ],
}


def test_spec_points_and_axes():
    spec = dse.Spec.parse({**SPEC, "space": [
        {"base": "ecp5", "buffer_bytes": [16384, [8192, 16384, 8192]],
         "mac_array": [{"ti": 4, "to": 4}, {"ti": 8, "to": 8}]},
        {"base": "ecp5", "buffer_bytes": [16384]}]})
    points = spec.points()
    # 2 × 2 configurations; the second space's one repeats the first's (Ti = To = 8)
    assert [p.config_id for p in points] == ["c0000", "c0001", "c0002", "c0003"]
    assert points[0].fields["buffer_bytes"] == [16384] * 3
    assert points[2].fields["buffer_bytes"] == [8192, 16384, 8192]
    assert (points[1].fields["ti"], points[1].fields["to"]) == (8, 8)
    assert points[0].fields["device"] == "LFE5U-85F"
    assert points[0].key("m", "v") != points[1].key("m", "v")
    assert points[0].key("m", "v") != points[0].key("m", "w")   # the compiler's version


@pytest.mark.parametrize("change, message", [
    ({"space": [{"base": "nope"}]}, "base='nope': name a reference configuration"),
    ({"space": [{"base": "tiny", "tii": [4]}]}, "tii: not a configuration field"),
    ({"space": [{"base": "tiny", "ti": 4}]}, "ti: an axis is a non-empty list"),
    ({"space": [{"base": "tiny", "array": [{"tx": 4}]}]}, "tx not configuration field"),
    ({"networks": []}, "no [[networks]]"),
    ({"networks": [{"model": "x", "sizes": [0]}]}, "sizes=[0]"),
    ({"spaces": []}, "unknown key(s) spaces"),
])
def test_spec_errors_name_the_field(change, message):
    with pytest.raises(dse.SpecError, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)").replace("]", r"\]")):
        dse.Spec.parse({**SPEC, **change})


def test_bad_spec_file_is_a_clear_cli_error(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("name = 'x'\n[[space]]\nbase = 'tiny'\nti = 4\n")
    assert cli.main(["dse", str(bad), "-o", str(tmp_path / "out")]) == 2
    out = " ".join(capsys.readouterr().out.split())     # independent of line wrapping
    assert "ti: an axis is a non-empty list" in out


def test_bundled_model_takes_no_size(tmp_path):
    with pytest.raises(dse.SpecError, match="has its own input size"):
        dse.prepare_model(dse.NetworkSpec("pplcnet_orientation", 64), tmp_path)


def test_pareto_on_a_hand_checked_example():
    rows = [dict(n=n, x=x, y=y) for n, x, y in [
        ("a", 1, 9), ("b", 2, 5), ("c", 2, 7), ("d", 3, 5), ("e", 4, 2), ("f", 5, 3),
        ("g", 4, 2), ("h", 6, 1)]]
    # c is dominated by b, d by b (equal y, larger x), f by e, g repeats e
    assert [r["n"] for r in pareto(rows, "x", "y")] == ["a", "b", "e", "h"]
    assert pareto([], "x", "y") == []


def test_paper_point_is_the_kcu1500_configuration():
    row = dse._row(dse.Point("c0", "kcu1500", CONFIGS["kcu1500"].to_dict(), SMALL), "k", {})
    assert paper_point(row)
    other = dse._row(dse.Point("c1", "kcu1500", CONFIGS["kcu1500"].replace(
        dram_latency=32).to_dict(), SMALL), "k", {})
    assert not paper_point(other)


@pytest.mark.parametrize("cal", resources.CALIBRATION + resources.XILINX_CALIBRATION,
                         ids=lambda c: f"{c.family}-{c.base}{'+' if c.changes else ''}")
def test_resource_estimate_within_ten_percent_of_yosys(cal):
    need = resources.estimate(cal.config(), cal.family)
    for name, got, want in (("multipliers", need.multipliers, cal.multipliers),
                            ("bram18k", need.bram18k, cal.bram18k),
                            ("luts", need.luts, cal.luts)):
        assert abs(got - want) <= 0.10 * want, f"{name}: estimate {got}, Yosys {want}"


@pytest.mark.skipif(not os.environ.get("SFNPU_REGRESS"),
                    reason="synthesising the accelerator (4 min) runs in `make regress`")
def test_resource_estimate_within_ten_percent_of_yosys_now(tmp_path):
    """The estimate against Yosys on the RTL as it is now (``sfnpu configs --yosys``), not
    against the recorded :data:`~sfnpu.resources.CALIBRATION`."""
    from sfnpu.tools.resource_check import errors, synthesize

    measured = synthesize(get_config("ecp5-ulx3s"), tmp_path)
    got = measured.calibration("ecp5-ulx3s", {})
    assert got.multipliers > 0 and got.bram18k > 0 and got.lut4 > 0
    for name, (got, want, error) in errors(measured).items():
        assert abs(error) <= 0.10, f"{name}: estimate {got}, Yosys {want}"


def test_resource_check_needs_a_job(capsys):
    from sfnpu.tools.resource_check import main

    with pytest.raises(SystemExit):
        main(["--jobs", "0"])
    assert "--jobs must be at least 1" in capsys.readouterr().err


def test_resource_estimate_finds_what_does_not_fit():
    ecp5 = DEVICES["LFE5U-85F"]
    assert resources.shortfalls(resources.estimate(get_config("ecp5-ulx3s")), ecp5) == []
    # the ecp5 configuration (8×8, 64 KiB buffers) does not fit its part: its multipliers do
    # since the requantisers keep one each (Yosys: 148 of 156), its block RAMs (298 of 208)
    # and LUTs (94 572 of 83 640) do not
    short = resources.shortfalls(resources.estimate(CONFIGS["ecp5"]), ecp5)
    assert not any("MULT18X18D" in s for s in short)
    assert any("block RAMs" in s for s in short) and any("LUT4" in s for s in short)


def test_ultrascale_estimate_counts_dsp48e2_and_lut6():
    """kcu1500 is estimated with UltraScale's terms (6 DSP48E2 per lane, not ECP5's 7
    MULT18X18D) and its LUTs are checked: the RTL as it stands does not fit the XCKU115."""
    kcu = CONFIGS["kcu1500"]
    need = resources.estimate(kcu)
    assert need.family == "ultrascale" and need.lut_name == "LUT6"
    assert need.multipliers == kcu.macs // 2 + 6 * kcu.lanes + 27
    assert resources.estimate(kcu, "ecp5").multipliers == kcu.macs // 2 + 7 * kcu.lanes + 28
    short = resources.shortfalls(need, DEVICES["XCKU115"])
    assert any("LUT6, XCKU115 has 663360" in s for s in short)
    assert not any("DSP48E2" in s for s in short)       # 2 459 of 5 520


def test_rtl_problems_name_what_the_controller_cannot_build():
    from sfnpu.limits import rtl_problems

    assert rtl_problems(get_config("tiny")) == [] and rtl_problems(get_config("ecp5")) == []
    # the paper's 512-bit port is accepted; a 4-byte word on a 64-bit bus is not; Ti != To;
    # unequal buffers
    assert rtl_problems(get_config("kcu1500")) == []
    assert "divides the 4-byte word (bus: 8 bytes)" in \
        rtl_problems(get_config("tiny").replace(ti=4, to=4))[0]
    assert rtl_problems(get_config("tiny").replace(ti=4, to=8)) == [
        "the group controller needs Ti == To"]
    assert "of one size" in rtl_problems(get_config("tiny").replace(
        buffer_bytes=(16384, 32768, 16384)))[0]


def test_hardware_the_rtl_cannot_generate_is_infeasible(tmp_path):
    model = dse.prepare_model(SMALL, tmp_path)
    # tiny at Ti = To = 4: a 4-byte word on its 64-bit bus
    row = dse.evaluate_point({**get_config("tiny").to_dict(), "ti": 4, "to": 4}, SMALL, model)
    assert row["feasible"] == 0 and "the RTL cannot be generated" in row["reason"]
    assert "error" not in row


def test_one_point_measures_the_cycle_model(tmp_path):
    model = dse.prepare_model(SMALL, tmp_path)
    row = dse.evaluate_point(get_config("tiny").to_dict(), SMALL, model)
    assert row["feasible"] == 1 and row["reason"] == ""
    assert row["latency_cycles"] > 0 and 0 < row["mac_efficiency"] <= 1
    assert row["latency_ms"] == pytest.approx(row["latency_cycles"] / 100e3)
    assert row["dram_B"] >= row["dram_weights_B"] > 0
    assert row["multipliers"] == resources.estimate(get_config("tiny")).multipliers
    # an invalid configuration is a reason, not an exception
    bad = dse.evaluate_point({**get_config("tiny").to_dict(), "ti": 3}, SMALL, model)
    assert bad["feasible"] == 0 and "ti=3" in bad["reason"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("dse")
    spec = dse.Spec.parse(SPEC)
    first = dse.run_sweep(spec, out, dse.RayRunner(num_cpus=2))
    return spec, out, first


def test_sweep_on_local_ray_records_every_point(sweep):
    spec, out, first = sweep
    assert first.runner == "ray" and first.computed == 3 and not first.errors
    rows = {r["point"]: r for r in csv.DictReader((out / "points.csv").open())}
    assert set(rows) == {"c0000:squeezenet1_1@32", "c0001:squeezenet1_1@32",
                         "c0002:squeezenet1_1@32"}
    fits, big, bad = (rows[f"c000{k}:squeezenet1_1@32"] for k in range(3))
    assert fits["feasible"] == "1" and int(fits["latency_cycles"]) > 0
    # 16×16 on the LFE5U-85F: measured, but infeasible, with the part's figures
    assert big["feasible"] == "0" and "multipliers, LFE5U-85F has 156" in big["reason"]
    assert int(big["latency_cycles"]) < int(fits["latency_cycles"])
    assert bad["feasible"] == "0" and "ti=3" in bad["reason"]
    assert (out / "pareto_squeezenet1_1_32.png").stat().st_size > 10_000
    summary = (out / "summary.md").read_text()
    assert "| LFE5U-85F | squeezenet1_1@32 | c0000 |" in summary
    assert "The paper's design point is not in this sweep." in summary


def test_sweep_rerun_computes_nothing_and_resumes(sweep):
    spec, out, first = sweep
    again = dse.run_sweep(spec, out, dse.SerialRunner())
    assert again.computed == 0 and again.rows == first.rows
    # a sweep killed after two points: the third is computed, the others come from the cache
    (out / "cache" / f"{first.rows[2]['key']}.json").unlink()
    resumed = dse.run_sweep(spec, out, dse.SerialRunner())
    assert resumed.computed == 1
    assert [r["feasible"] for r in resumed.rows] == [r["feasible"] for r in first.rows]


def test_ray_and_serial_agree(sweep):
    spec, out, first = sweep
    serial = dse.SerialRunner()
    model = dse.prepare_model(SMALL, out / "models")
    import hashlib

    digest = hashlib.sha256(model).hexdigest()
    point = spec.points()[0]
    (key, row), = serial.run([("k", point.fields, point.network, digest)], {digest: model})
    ray_row = first.rows[0]
    for name in ("latency_cycles", "dram_B", "multipliers", "bram18k", "policy"):
        assert row[name] == ray_row[name]
