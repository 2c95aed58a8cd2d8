"""Top level: the accelerator (CSR block + group controller) and its simulation system.

:class:`Accelerator` is what an SoC instantiates: an AXI4 master for DRAM, an AXI4-Lite slave
for the registers of :mod:`sfnpu.regmap`, and a level interrupt. :class:`SimSystem` adds the
simulation-only DRAM model (:class:`~sfnpu.hw.axi_mem.AxiMemory`, the timing the cycle model
uses) with its backdoor port, for the Verilator system harness (:mod:`sfnpu.tb.system`).
"""

from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from sfnpu.config import HwConfig

from .axi import Axi4Signature, AxiLiteSignature
from .axi_mem import AxiMemory
from .controller import GroupController
from .csr import CsrBlock

__all__ = ["Accelerator", "SimSystem", "CSR_ADDR_WIDTH"]

#: AXI4-Lite address bits of the register file (a 4 KiB page).
CSR_ADDR_WIDTH = 12


class Accelerator(wiring.Component):
    """The sfnpu accelerator for one hardware configuration.

    Signature
    ---------
    csr : In(AxiLiteSignature(CSR_ADDR_WIDTH))
        Register access (:mod:`sfnpu.regmap`).
    bus : Out(Axi4Signature(addr_width, config.dram_bus_bits))
        DRAM master: instructions, parameters, weights, feature maps.
    irq : Out(1)
        CONTROL.irq_enable and (STATUS.done or STATUS.error).
    """

    def __init__(self, config: HwConfig, *, addr_width: int = 32, group_log_depth: int = 256):
        self.config = config
        self.addr_width = addr_width
        self.group_log_depth = group_log_depth
        super().__init__({
            "csr": In(AxiLiteSignature(CSR_ADDR_WIDTH)),
            "bus": Out(Axi4Signature(addr_width, config.dram_bus_bits)),
            "irq": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.csr = csr = CsrBlock(self.config, addr_width=CSR_ADDR_WIDTH,
                                          group_log_depth=self.group_log_depth)
        m.submodules.core = core = GroupController(self.config, addr_width=self.addr_width)
        wiring.connect(m, wiring.flipped(self.csr), csr.bus)
        wiring.connect(m, csr.control, core.control)
        wiring.connect(m, core.bus, wiring.flipped(self.bus))
        m.d.comb += self.irq.eq(csr.irq)
        return m


class SimSystem(wiring.Component):
    """Accelerator + timed DRAM model with a backdoor (simulation only).

    Signature
    ---------
    csr : In(AxiLiteSignature(CSR_ADDR_WIDTH))
    irq : Out(1)
    backdoor_addr, backdoor_wdata, backdoor_we, backdoor_rdata, backdoor_dump :
        The DRAM model's word port and file dump (see :class:`~sfnpu.hw.axi_mem.AxiMemory`).
    """

    def __init__(self, config: HwConfig, *, dram_bytes: int, addr_width: int = 32):
        self.config = config
        self.dram_bytes = dram_bytes
        self.addr_width = addr_width
        words = dram_bytes // config.dram_bus_bytes
        super().__init__({
            "csr": In(AxiLiteSignature(CSR_ADDR_WIDTH)),
            "irq": Out(1),
            "backdoor_addr": In(range(words)),
            "backdoor_wdata": In(config.dram_bus_bits),
            "backdoor_we": In(1),
            "backdoor_rdata": Out(config.dram_bus_bits),
            "backdoor_dump": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.accel = accel = Accelerator(self.config, addr_width=self.addr_width)
        m.submodules.dram = dram = AxiMemory.from_config(
            self.config, size=self.dram_bytes, addr_width=self.addr_width, backdoor=True)
        wiring.connect(m, wiring.flipped(self.csr), accel.csr)
        wiring.connect(m, accel.bus, dram.bus)
        m.d.comb += [
            self.irq.eq(accel.irq),
            dram.backdoor_addr.eq(self.backdoor_addr),
            dram.backdoor_wdata.eq(self.backdoor_wdata),
            dram.backdoor_we.eq(self.backdoor_we),
            self.backdoor_rdata.eq(dram.backdoor_rdata),
            dram.backdoor_dump.eq(self.backdoor_dump),
        ]
        return m
