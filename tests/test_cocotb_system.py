"""The cocotb system testbench's build: only what the testbench touches is public, one build
per design shared by every test and worker, the elaborated Verilog cached by fingerprint.

The system regression itself (tests/test_system.py, test_random_networks.py, the real models'
first groups, the partitioned programs) runs through :class:`sfnpu.tb.system.SystemHarness`,
that is through cocotb's runner and :mod:`sfnpu.tb.cocotb_system`.
"""

import dataclasses
import re

import pytest

from sfnpu.config import get_config
from sfnpu.tb.cocotb_build import CocotbBuild, public_control_file
from sfnpu.tb.elaborate import system_fingerprint, system_verilog
from sfnpu.tb.system import BENCH, TOP, Scoreboard, bench_verilog, system_ports
from test_system import compiled_image, residual_net, system_harness


def test_control_file_names_each_signal():
    text = public_control_file("top", ["clk", "csr__aw__valid"])
    assert text.splitlines() == ["`verilator_config",
                                 'public_flat_rw -module "top" -var "clk"',
                                 'public_flat_rw -module "top" -var "csr__aw__valid"']


def test_system_ports_are_the_signature():
    ports = system_ports(get_config("tiny"), 1 << 20)
    assert ports[:2] == ["clk", "rst"]
    bench = bench_verilog(get_config("tiny"), 1 << 20)
    assert all(f".{name}({name})" in bench for name in ports[2:])
    assert ".clk(clk)" in bench and ".rst(rst_sync)" in bench
    assert {"irq", "backdoor_dump", "backdoor_rdata", "csr__aw__payload", "csr__r__valid"} \
        <= set(ports)
    assert len(ports) == len(set(ports))


def test_fingerprint_follows_the_design():
    tiny = get_config("tiny")
    base = system_fingerprint(tiny, 1 << 22, TOP)
    assert system_fingerprint(tiny, 1 << 22, TOP) == base
    assert system_fingerprint(tiny, 1 << 23, TOP) != base
    assert system_fingerprint(dataclasses.replace(tiny, psum_buffer_bytes=tiny.psum_buffer_bytes * 2),
                              1 << 22, TOP) != base
    assert system_fingerprint(get_config("ecp5"), 1 << 22, TOP) != base


def test_only_the_ports_are_public():
    """Verilator registers a VPI variable for each public signal: with the runner's
    --public-flat-rw undone, only the top-level ports (in the top scope and the module's
    own) may appear, not one of the accelerator's internal signals."""
    harness = system_harness("tiny")
    syms = "".join(p.read_text() for p in harness.build_dir.glob("Vtop__Syms*.cpp"))
    public = set(re.findall(r'varInsert\("([^"]+)"', syms))
    ports = set(system_ports(harness.config, harness.dram_bytes))
    assert ports <= public, ports - public
    assert public <= ports, sorted(public - ports)[:10]


def test_build_and_verilog_are_reused():
    """A second harness of the same design elaborates nothing and builds nothing."""
    harness = system_harness("tiny")
    verilog = system_verilog(harness.config, harness.dram_bytes, TOP)
    assert verilog in harness.build.sources
    executable = harness.build_dir / BENCH
    built = executable.stat().st_mtime_ns
    again = CocotbBuild(harness.build.sources, BENCH,
                        system_ports(harness.config, harness.dram_bytes),
                        harness.build_dir).ensure()
    assert again.seconds == 0
    assert executable.stat().st_mtime_ns == built


def test_scoreboard_reports_a_corrupted_dram(tmp_path):
    """The scoreboard can fail: one flipped output byte and one group's cycle count off."""
    harness = system_harness("tiny")
    net, outputs = residual_net()
    _, blob = compiled_image(tmp_path, net, outputs, harness.config)
    result = harness.run(blob)
    board = Scoreboard(harness.config)
    assert board.problems(blob, result) == []
    dram = bytearray(result.dram)
    dram[len(blob) + 3] ^= 0x10
    late = list(result.group_cycles)
    late[0] += 1000
    broken = dataclasses.replace(result, dram=bytes(dram), group_cycles=late)
    found = board.problems(blob, broken)
    assert any("DRAM bytes differ" in p for p in found), found
    assert len(found) >= 2, found


def test_a_failing_testbench_quotes_its_log(tmp_path, monkeypatch):
    """A run the testbench cannot finish is an error naming the configuration, quoting the
    simulator's log: here the ID register does not read the magic the testbench expects."""
    from sfnpu import regmap
    import sfnpu.tb.system as system

    harness = system_harness("tiny")
    net, outputs = residual_net()
    _, blob = compiled_image(tmp_path, net, outputs, harness.config)
    table = regmap.offsets_and_masks()
    monkeypatch.setattr(system.regmap, "offsets_and_masks",
                        lambda: {**table, "magic": table["magic"] ^ 1})
    with pytest.raises(RuntimeError, match="(?s)failed on tiny.*ID register reads"):
        harness.run(blob)
