"""Vivado projects for UltraScale boards, written by Amaranth's Xilinx platform without Vivado.

:class:`AxiAccelerator` is the accelerator with the port names Vivado's IP integrator
recognises as interfaces: ``aclk``, ``aresetn``, an AXI4 master ``m_axi_*`` (DRAM, e.g. to a
MIG, the PS's HP port or a PCIe DMA bridge's slave) and an AXI4-Lite slave ``s_axil_*`` (the
registers of :mod:`sfnpu.regmap`, e.g. from a PCIe bridge's BAR or the PS's GP port), plus
``irq``. Signals sfnpu does not use are tied off (ID 0, normal non-cacheable, unprivileged).

:func:`write_vivado_project` builds it through Amaranth's ``XilinxPlatform`` with
``do_build=False``. The platform normally only has pins as top-level ports; here the AXI ports
are the top level (:class:`_AxiTopPlatform`), synthesised *out of context*: the generated TCL
synthesises, places and routes the accelerator alone against the clock constraint and writes
a checkpoint and reports, but no bitstream (that needs the surrounding block design).
"""

from __future__ import annotations

import time
from pathlib import Path

from amaranth.hdl import ClockDomain, ClockSignal, Fragment, Module, ResetSignal
from amaranth.hdl._ir import PortDirection
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.vendor import XilinxPlatform

from sfnpu.config import HwConfig, get_config

from .accelerator import Accelerator

__all__ = ["AxiAccelerator", "XILINX_BOARDS", "xilinx_config", "write_vivado_project"]

#: Board → (part: device, package, speed grade), and a description for the README/report.
XILINX_BOARDS = {
    "kcu105": (("xcku040", "ffva1156", "2-e"), "Kintex UltraScale KCU105 (XCKU040)"),
    "kcu1500": (("xcku115", "flvb2104", "2-e"), "Kintex UltraScale KCU1500 (XCKU115)"),
}

def xilinx_config(board: str) -> HwConfig:
    """The configuration built for ``board``: the paper's ``kcu1500`` itself on the KCU1500
    (Ti = To = 64, 512-bit bus); half of its parallelism on the smaller KCU105, whose bus is
    one 32-lane word (256 bits: the controller takes a bus that divides the word)."""
    base = get_config("kcu1500")
    if board != "kcu105":
        return base
    KiB, bus = 1024, 256
    peak = bus / 8 * base.clock_mhz / 1000
    return base.replace(name="kcu105", ti=32, to=32, dram_bus_bits=bus,
                        dram_bandwidth_gbps=min(base.dram_bandwidth_gbps, peak),
                        buffer_bytes=(512 * KiB,) * 3, row_buffer_bytes=96 * KiB,
                        psum_buffer_bytes=128 * KiB, write_buffer_bytes=16 * KiB, device=None)


def _axi_names(prefix: str, signature) -> dict:
    """AXI port name (``m_axi_arvalid``, ``m_axi_araddr``…) → member path, for an Amaranth
    AXI signature of :mod:`sfnpu.hw.axi`."""
    names = {}
    for channel in ("ar", "aw", "w", "r", "b"):
        names[f"{prefix}{channel}valid"] = (channel, "valid")
        names[f"{prefix}{channel}ready"] = (channel, "ready")
        for fname in signature.members[channel].signature.members["payload"].shape.members:
            names[f"{prefix}{channel}{fname}"] = (channel, "payload", fname)
    return names


def _member(bus, path):
    value = bus
    for step in path:
        value = getattr(value, step)
    return value.as_value() if hasattr(value, "as_value") else value


class AxiAccelerator(wiring.Component):
    """:class:`~sfnpu.hw.accelerator.Accelerator` with AXI-convention top-level ports (see the
    module docstring)."""

    def __init__(self, config: HwConfig, *, addr_width: int = 32):
        self.config = config
        self.addr_width = addr_width
        inner = Accelerator(config, addr_width=addr_width)
        self._inner = inner
        members = {"aclk": In(1), "aresetn": In(1), "irq": Out(1)}
        self._map = {}
        for prefix, bus, flow in (("m_axi_", inner.bus, Out), ("s_axil_", inner.csr, In)):
            for name, path in _axi_names(prefix, bus.signature).items():
                value = _member(bus, path)
                # The master drives AR, AW and W (valid and payload); READY goes the other way.
                member_flow = wiring.Out if (path[0] in ("ar", "aw", "w")) == (flow is Out) \
                    else wiring.In
                if path[-1] == "ready":
                    member_flow = wiring.In if member_flow is wiring.Out else wiring.Out
                members[name] = member_flow(len(value))
                self._map[name] = path
        # Tied-off AXI4 master signals sfnpu does not drive otherwise.
        self._ties = {"m_axi_arid": 0, "m_axi_awid": 0, "m_axi_arcache": 0b0011,
                      "m_axi_awcache": 0b0011, "m_axi_arprot": 0, "m_axi_awprot": 0,
                      "m_axi_arlock": 0, "m_axi_awlock": 0, "m_axi_arqos": 0, "m_axi_awqos": 0}
        widths = {"id": 1, "cache": 4, "prot": 3, "lock": 1, "qos": 4}
        for name in self._ties:
            members[name] = Out(widths[name.split("_")[-1][2:]])
        for name in ("s_axil_awprot", "s_axil_arprot"):
            members[name] = In(3)           # accepted and ignored
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.accel = inner = self._inner
        m.domains.sync = ClockDomain("sync")
        m.d.comb += [ClockSignal("sync").eq(self.aclk), ResetSignal("sync").eq(~self.aresetn)]
        for name, path in self._map.items():
            value = _member(inner.bus if name.startswith("m_axi_") else inner.csr, path)
            port = getattr(self, name)
            # Outputs of the accelerator drive our ports; our ports drive its inputs.
            if self.signature.members[name].flow == wiring.Out:
                m.d.comb += port.eq(value)
            else:
                m.d.comb += value.eq(port)
        for name, tie in self._ties.items():
            m.d.comb += getattr(self, name).eq(tie)
        m.d.comb += self.irq.eq(inner.irq)
        return m


class _AxiTopPlatform(XilinxPlatform):
    """A Xilinx platform whose top-level ports are a component's signature members instead of
    pins (for out-of-context synthesis of an IP block)."""
    resources = []
    connectors = []

    device = property(lambda self: self._sfnpu_part[0])
    package = property(lambda self: self._sfnpu_part[1])
    speed = property(lambda self: self._sfnpu_part[2])

    def __init__(self, part: tuple[str, str, str]):
        self._sfnpu_part = part
        super().__init__(toolchain="Vivado")

    @property
    def file_templates(self):
        return {k: v for k, v in super().file_templates.items() if not k.endswith(".debug.v")}

    def prepare(self, elaboratable, name="top", **kwargs):
        ports = []
        for member_name, member in elaboratable.signature.members.items():
            direction = PortDirection.Input if member.flow == wiring.In else \
                PortDirection.Output
            ports.append((member_name, getattr(elaboratable, member_name), direction))
        fragment = Fragment.get(elaboratable, self)
        self._design = fragment.prepare(ports=ports, hierarchy=(name,))
        return self.toolchain_prepare(self._design, name, **kwargs)

    def iter_port_constraints_bits(self):
        return iter(())         # no pins: out of context


def write_vivado_project(board: str, out_dir, *, config: HwConfig | None = None, log=print):
    """Write the Vivado project for ``board`` into ``out_dir``; returns the file list."""
    from .toolchain import ensure_yosys

    ensure_yosys()          # Amaranth writes the project's Verilog with Yosys
    part, description = XILINX_BOARDS[board]
    config = config or xilinx_config(board)
    name = f"sfnpu_{board}"
    period_ns = 1000 / config.clock_mhz
    log(f"elaborating {config.summary()} for {description}")
    t0 = time.perf_counter()
    plan = _AxiTopPlatform(part).build(
        AxiAccelerator(config), name=name, do_build=False,
        synth_design_opts="-mode out_of_context -flatten_hierarchy rebuilt",
        add_constraints=f"create_clock -name aclk -period {period_ns:.3f} [get_ports aclk]",
        # Out of context there are no pins and no bitstream: stop after routing with a
        # checkpoint and the timing and utilisation reports.
        script_after_route="\n".join([
            f"write_checkpoint -force {name}_route.dcp",
            f"report_utilization -file {name}_utilization_route.rpt",
            f"report_timing_summary -datasheet -max_paths 10 -file {name}_timing.rpt",
            "quit"]))
    out = Path(out_dir)
    plan.extract(out)
    seconds = time.perf_counter() - t0
    files = sorted(p.name for p in out.iterdir())
    (out / "README.md").write_text(_project_readme(board, description, part, config, name,
                                                   seconds))
    return files


def _project_readme(board, description, part, config, name, seconds) -> str:
    return "\n".join([
        f"# {description}: Vivado project for the sfnpu accelerator",
        "",
        f"Generated by `sfnpu bitstream --board {board}` (Amaranth's Xilinx platform, "
        f"`do_build=False`, {seconds:.0f} s) — no Vivado was run.",
        "",
        f"- part `{'-'.join(part)}`; configuration `{config.summary()}`",
        f"- `{name}.v`: the accelerator as module `{name}` with `aclk`, `aresetn`, an AXI4 "
        f"master `m_axi_*` ({config.dram_bus_bits}-bit data, 32-bit addresses) and an AXI4-Lite "
        "slave `s_axil_*` (32-bit, 12-bit addresses: the register map), and `irq`",
        f"- `{name}.xdc`: the {config.clock_mhz:g} MHz clock on `aclk`",
        f"- `{name}.tcl`, `build_{name}.sh`: out-of-context synthesis, placement and routing, "
        f"then `{name}_route.dcp`, `{name}_utilization_route.rpt` and `{name}_timing.rpt`",
        "",
        "Run `sh build_" + name + ".sh` with Vivado on PATH. To use the accelerator in a "
        "system, add `" + name + ".v` to a block design as an RTL module (the `m_axi_`/"
        "`s_axil_` prefixes are inferred as AXI interfaces): connect `m_axi` to the memory "
        "(a MIG DDR4 controller, the Zynq PS's HP port, or the slave port of the PCIe DMA "
        "bridge's memory), `s_axil` to the host (the PCIe bridge's AXI-Lite BAR or the PS's GP "
        "master), `irq` to the interrupt controller (or the bridge's user IRQ), and set the DMA "
        "window registers to the memory the accelerator may use.",
        "",
    ])
