# amaranth: UnusedElaboratable=no
"""Vivado projects from Amaranth's Xilinx platform (no Vivado here): the files, the part, the
out-of-context flow, the AXI top-level ports; the board configurations the controller accepts."""

import re

import pytest

from sfnpu.config import get_config
from sfnpu.hw.controller import GroupController
from sfnpu.hw.xilinx import XILINX_BOARDS, write_vivado_project, xilinx_config

# The controllers built here only show that a configuration is accepted or refused; they are
# never elaborated, which Amaranth would otherwise warn about when they are collected.
pytestmark = pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")


@pytest.mark.parametrize("board", sorted(XILINX_BOARDS))
def test_board_configuration_is_accepted_by_the_controller(board):
    config = xilinx_config(board)
    GroupController(config)         # raises if the controller cannot be built for it
    assert config.dram_bus_bytes == config.lanes and config.ti == config.to
    if board == "kcu1500":
        assert config == get_config("kcu1500") and config.macs == 4096


def test_a_bus_wider_than_the_word_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="bus that divides the 8-byte word"):
        GroupController(get_config("tiny").replace(dram_bus_bits=128))


def test_vivado_project(tmp_path):
    # A small configuration keeps the test short; the boards' own differ only in size.
    config = get_config("ecp5-ulx3s")
    files = write_vivado_project("kcu1500", tmp_path, config=config, log=lambda _: None)
    name = "sfnpu_kcu1500"
    assert {f"{name}.tcl", f"{name}.xdc", f"{name}.v", f"build_{name}.sh"} <= set(files)
    tcl = (tmp_path / f"{name}.tcl").read_text()
    assert f"create_project -force -name {name} -part xcku115-flvb2104-2-e" in tcl
    assert f"synth_design -top {name} -mode out_of_context" in tcl
    assert tcl.index(f"write_checkpoint -force {name}_route.dcp") < tcl.index("quit")
    xdc = (tmp_path / f"{name}.xdc").read_text()
    assert f"create_clock -name aclk -period {1000 / config.clock_mhz:.3f} [get_ports aclk]" in xdc
    verilog = (tmp_path / f"{name}.v").read_text()
    header = verilog[verilog.index(f"module {name}("):]
    header = header[:header.index("endmodule")]
    ports = dict((n, (d, w or "")) for d, w, n in
                 re.findall(r"^\s+(input|output)\s+(\[\d+:0\]\s+)?(\w+);", header, re.M))
    bus = config.dram_bus_bits
    expected = {
        "aclk": ("input", ""), "aresetn": ("input", ""), "irq": ("output", ""),
        "m_axi_araddr": ("output", "[31:0] "), "m_axi_arlen": ("output", "[7:0] "),
        "m_axi_arvalid": ("output", ""), "m_axi_arready": ("input", ""),
        "m_axi_rdata": ("input", f"[{bus - 1}:0] "), "m_axi_rlast": ("input", ""),
        "m_axi_wdata": ("output", f"[{bus - 1}:0] "), "m_axi_wstrb": ("output",
                                                                      f"[{bus // 8 - 1}:0] "),
        "m_axi_bresp": ("input", "[1:0] "), "m_axi_bready": ("output", ""),
        "m_axi_awcache": ("output", "[3:0] "),
        "s_axil_awaddr": ("input", "[11:0] "), "s_axil_wdata": ("input", "[31:0] "),
        "s_axil_awready": ("output", ""), "s_axil_rdata": ("output", "[31:0] "),
        "s_axil_rvalid": ("output", ""), "s_axil_rready": ("input", ""),
        "s_axil_bresp": ("output", "[1:0] "),
    }
    for port, want in expected.items():
        assert ports.get(port) == want, port
    assert "Vivado" in (tmp_path / "README.md").read_text()
